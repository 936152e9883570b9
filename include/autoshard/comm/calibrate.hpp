#pragma once
/// Measuring each mesh axis's link on the real backend: a few message sizes per
/// collective, a least-squares fit of the model core/cost.hpp prices with (alpha per collective, hop per
/// ring step, beta),
/// and a held-out size to report how well the fit predicts.
///   auto cal = autoshard::calibrate(mc);                 // collective over the mesh
///   cal.mesh;                                            // the mesh measured on, with the fitted links
///   device_mesh m{2, 4};  autoshard::apply_calibration(m, cal);
/// Backend-free (any mesh_communicator_like); the JSON file that `autoshard calibrate` writes
/// is read and written by gloo/calibration_file.hpp.
/// Time of one collective is the slowest rank's median over the repeats; B is the byte
/// count of core's formulas (gathered size for all-gather, input size for reduce-scatter).
#include <algorithm>  // std::sort, std::max
#include <chrono>     // std::chrono::steady_clock
#include <cmath>      // std::abs
#include <utility>    // std::swap
#include <cstddef>    // std::size_t
#include <cstdio>     // std::snprintf
#include <string>     // std::string
#include <vector>     // std::vector

#include "../core/cost.hpp"          // collective_time
#include "../core/error.hpp"         // comm_error, spec_error
#include "../core/mesh.hpp"          // device_mesh, link_model
#include "../core/redistribute.hpp"  // collective
#include "communicator.hpp"          // communicator
#include "mesh_communicator.hpp"     // mesh_communicator_like

namespace autoshard {

/// The most samples one axis's fit takes: calibration_options' sizes and held-out size for each
/// of its kinds, and a calibration file's `axes[k].samples`. `autoshard calibrate` takes at most
/// 44 (4 KiB to 1 GiB by fours, ten sizes and the held-out one, for each of the four sampled
/// collectives); a fit of three numbers gains nothing from thousands, and a file of 2 million
/// took 5.4 s and 1.4 GB to read before anything looked at it.
inline constexpr std::size_t max_calibration_samples = 1024;

/// The largest `holdout_relative_error` (the mean over kinds of |predicted - measured| /
/// measured at the held-out size) a calibration may report: a prediction too small is off by
/// less than 1, and one 100 times too large (an error of 99) is already no model of the link.
/// Above it calibrate refuses its fit (a stalled or overloaded run), and the file's reader the
/// number (an edit: 1e300 was read and shown as a held-out error of 1e302 %).
inline constexpr double max_holdout_relative_error = 100;

struct calibration_options {
  /// Message sizes B (bytes) the fit uses.
  std::vector<double> sizes{4096, 32768, 262144, 1048576, 4194304};
  /// A size left out of the fit, to report the prediction error on.
  double holdout = 2097152;
  std::vector<collective> kinds{collective::all_reduce, collective::all_gather, collective::reduce_scatter};
  int warmup = 2;
  int repeats = 7;
};

/// One measurement.
struct calibration_sample {
  collective kind = collective::all_reduce;
  double bytes = 0;    ///< B as core's formulas define it
  double seconds = 0;  ///< median over repeats, slowest rank
  bool held_out = false;
};

/// The fit of one mesh axis (its fitted link is the calibration's mesh.link(axis)).
struct axis_calibration {
  int axis = 0;
  int group_size = 1;
  bool measured = false;  ///< false for size-1 axes: they never communicate
  double holdout_bytes = 0;
  double holdout_relative_error = 0;  ///< mean over kinds of |predicted - measured| / measured
  std::vector<calibration_sample> samples;
};

struct calibration_result {
  /// The mesh measured on: its sizes and axis names, and on every measured axis the fitted
  /// link (an axis of size 1 never communicates and keeps the link it had).
  device_mesh mesh;
  std::string backend = "gloo-tcp";  ///< what was measured; its family ("gloo") is before the '-'
  std::vector<axis_calibration> axes;

  /// The backend family a plan's --backend names: "gloo" for "gloo-tcp".
  std::string backend_family() const { return backend.substr(0, backend.find('-')); }
  /// Whether it was measured on a mesh of `m`'s shape (axis names are labels: not compared).
  bool measured_on(const device_mesh& m) const { return mesh.shape() == m.shape(); }
  /// Throws spec_error when this calibration was measured on another mesh shape than
  /// `wanted`'s or another backend family than the plan asks for, unless `force` (then the
  /// caller says so).
  void check_fits(const device_mesh& wanted, const std::string& backend_family_wanted, bool force) const {
    if (force) return;
    if (!measured_on(wanted))
      throw spec_error("the calibration was measured on mesh " + shape_text(mesh) + ", not " + shape_text(wanted) +
                       " (--force uses it anyway)");
    if (backend_family_wanted != backend_family())
      throw spec_error("the calibration was measured on " + backend + ", not " + backend_family_wanted +
                       " (--force uses it anyway)");
  }
};

namespace detail {

/// Weighted least squares (weights 1/t^2: relative error) of t ~ alpha + steps*hop + v/beta,
/// the formula collective_time prices with; `fit_hop` false keeps hop at 0.
inline bool fit_link_ls(const std::vector<calibration_sample>& s, int k, bool fit_hop, double out[3]) {
  const int n = fit_hop ? 3 : 2;
  double a[3][4] = {};
  int used = 0;
  for (const auto& x : s) {
    if (x.held_out || x.seconds <= 0) continue;
    const double c[3] = {collective_time(x.kind, link_model{1.0, 1e300, 0.0}, k, x.bytes),   // of alpha
                         collective_time(x.kind, link_model{0.0, 1.0, 0.0}, k, x.bytes),     // of 1/beta
                         collective_time(x.kind, link_model{0.0, 1e300, 1.0}, k, x.bytes)};  // of hop
    const double w = 1.0 / (x.seconds * x.seconds);
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) a[i][j] += w * c[i] * c[j];
      a[i][3] += w * c[i] * x.seconds;
    }
    ++used;
  }
  if (used < n) return false;
  for (int col = 0; col < n; ++col) {  // Gauss-Jordan with partial pivoting on an n x n system
    int piv = col;
    for (int r = col + 1; r < n; ++r)
      if (std::abs(a[r][col]) > std::abs(a[piv][col])) piv = r;
    if (!(std::abs(a[piv][col]) > 1e-12 * std::abs(a[0][0]))) return false;  // collinear: hop is not identifiable
    for (int j = 0; j < 4; ++j) std::swap(a[col][j], a[piv][j]);
    for (int r = 0; r < n; ++r) {
      if (r == col) continue;
      const double f = a[r][col] / a[col][col];
      for (int j = 0; j < 4; ++j) a[r][j] -= f * a[col][j];
    }
  }
  for (int i = 0; i < 3; ++i) out[i] = i < n ? a[i][3] / a[i][i] : 0.0;
  return true;
}

/// Fits alpha >= 0, hop >= 0 and beta > 0. The hop is identifiable when the samples mix
/// collectives with different step counts (an all-reduce has twice an all-gather's); where
/// it is not, or comes out negative, it is 0 and alpha and beta are refitted alone.
inline link_model fit_alpha_beta(const std::vector<calibration_sample>& s, int k) {
  int used = 0;
  for (const auto& x : s) used += !x.held_out && x.seconds > 0;
  if (used < 2) throw comm_error("calibration needs at least two measured sizes, got " + std::to_string(used));
  double p[3] = {0, 0, 0};
  if (!fit_link_ls(s, k, true, p) || p[2] < 0 || p[0] < 0 || p[1] <= 0) {
    p[2] = 0;
    if (!fit_link_ls(s, k, false, p)) p[0] = p[1] = 0;
  }
  double alpha = p[0], inv_beta = p[1];
  if (alpha < 0) {  // refit with alpha = 0: t ~ v/beta
    double sbb = 0, sbt = 0;
    for (const auto& x : s) {
      if (x.held_out || x.seconds <= 0) continue;
      const double b = collective_time(x.kind, link_model{0.0, 1.0, 0.0}, k, x.bytes), w = 1.0 / (x.seconds * x.seconds);
      sbb += w * b * b;
      sbt += w * b * x.seconds;
    }
    alpha = 0;
    inv_beta = sbb > 0 ? sbt / sbb : 0;
  }
  if (inv_beta <= 0) {  // no visible bandwidth cost: alpha only
    double saa = 0, sat = 0;
    for (const auto& x : s) {
      if (x.held_out || x.seconds <= 0) continue;
      const double w = 1.0 / (x.seconds * x.seconds);
      saa += w;
      sat += w * x.seconds;
    }
    inv_beta = 1e-15;
    alpha = saa > 0 ? sat / saa : 0;
    p[2] = 0;
  }
  link_model fit{alpha, 1.0 / inv_beta, p[2]};
  // The fit must be a link a plan prices and a calibration file holds (core/mesh.hpp's
  // ranges): a slope of 1e-20 s a byte, noise on a fast link, was a bandwidth of 1e20 B/s,
  // and calibrate wrote a file whose reader refused it. Bytes cheaper than the samples show
  // cost what the fastest link's do; a link slower than the ranges is no link to plan on.
  if (!(fit.beta <= max_link_bandwidth)) fit.beta = max_link_bandwidth;
  if (!(fit.beta >= min_link_bandwidth && fit.alpha <= max_link_latency_s && fit.hop <= max_link_hop_s)) {
    char text[320];
    std::snprintf(text, sizeof text,
                  "the measurements fit a link of latency %g s, per-step latency %g s and bandwidth %g bytes/s, outside what a plan "
                  "prices (latency in [0, %g] s, per step in [0, %g] s, bandwidth in [%g, %g] bytes/s): a stalled or overloaded run?",
                  fit.alpha, fit.hop, fit.beta, max_link_latency_s, max_link_hop_s, min_link_bandwidth, max_link_bandwidth);
    throw comm_error(text);
  }
  return fit;
}

template <communicator C>
double time_collective(C& c, collective kind, double bytes, int warmup, int repeats) {
  const int k = c.size();
  // f32 elements; B is rounded to a multiple of 4*k bytes so every rank's piece is whole.
  const auto per_rank = static_cast<std::size_t>(std::max(1.0, bytes / (4.0 * k)));
  const std::size_t total = per_rank * static_cast<std::size_t>(k);
  std::vector<float> a(total, 1.0f), b(total, 0.0f);
  auto once = [&] {
    switch (kind) {
      case collective::all_reduce: c.all_reduce(a.data(), total, dtype::f32, reduce_op::sum); break;
      case collective::all_gather: c.all_gather(a.data(), b.data(), per_rank, dtype::f32); break;
      case collective::reduce_scatter: c.reduce_scatter(a.data(), b.data(), per_rank, dtype::f32, reduce_op::sum); break;
      case collective::all_to_all: c.all_to_all(a.data(), b.data(), per_rank, dtype::f32); break;
      default: break;
    }
  };
  for (int i = 0; i < warmup; ++i) once();
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    c.barrier();
    const auto s = std::chrono::steady_clock::now();
    once();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count());
  }
  std::sort(t.begin(), t.end());
  double med = t[t.size() / 2];
  c.all_reduce(&med, 1, dtype::f64, reduce_op::max);  // every rank agrees: the slowest one
  return med;
}

}  // namespace detail

/// Measures every mesh axis (all groups of an axis at once, as a plan would run them) and
/// fits its link model. Collective over the mesh; every rank returns the same result.
template <mesh_communicator_like M>
calibration_result calibrate(M& mc, const calibration_options& opts = {}) {
  const device_mesh& mesh = mc.mesh();
  // Bounded before anything is measured (each sample is warmup + repeats collectives).
  const std::size_t per_kind = opts.sizes.size() + (opts.holdout > 0 ? 1 : 0), kinds = opts.kinds.size();
  if (kinds != 0 && per_kind > max_calibration_samples / kinds)  // per_kind x kinds > the limit, without overflow
    throw spec_error("calibration_options: " + std::to_string(kinds) + " kinds x " + std::to_string(per_kind) + " sizes (" +
                     std::to_string(opts.sizes.size()) + (opts.holdout > 0 ? " and the held-out one" : "") +
                     ") are more samples an axis than a fit takes: at most " + std::to_string(max_calibration_samples) +
                     " (max_calibration_samples)");
  calibration_result out;
  out.mesh = mesh;
  for (std::size_t a = 0; a < mesh.ndim(); ++a) {
    axis_calibration ax;
    ax.axis = static_cast<int>(a);
    ax.group_size = mesh.size(a);
    if (ax.group_size > 1) {
      auto& c = mc.axis(a);
      // The slowest rank of the whole mesh: max over the axis group, then over the other axes.
      auto measure = [&](collective kind, double b) {
        double t = detail::time_collective(c, kind, b, opts.warmup, opts.repeats);
        for (std::size_t o = 0; o < mesh.ndim(); ++o)
          if (o != a && mesh.size(o) > 1) mc.axis(o).all_reduce(&t, 1, dtype::f64, reduce_op::max);
        return t;
      };
      for (collective kind : opts.kinds) {
        for (double b : opts.sizes) ax.samples.push_back({kind, b, measure(kind, b), false});
        if (opts.holdout > 0) ax.samples.push_back({kind, opts.holdout, measure(kind, opts.holdout), true});
      }
      // B as priced: the bytes actually moved after rounding to whole f32 pieces per rank.
      for (auto& s : ax.samples)
        s.bytes = std::max(1.0, static_cast<double>(static_cast<std::size_t>(s.bytes / (4.0 * ax.group_size)))) * 4.0 *
                  ax.group_size;
      link_model fit;
      try {
        fit = detail::fit_alpha_beta(ax.samples, ax.group_size);
      } catch (const comm_error& e) {
        throw comm_error("calibrating mesh axis " + std::to_string(a) + ": " + std::string(e.message()));
      }
      out.mesh.set_link(a, fit);
      ax.measured = true;
      double err = 0;
      int n = 0;
      for (const auto& s : ax.samples)
        if (s.held_out) {
          ax.holdout_bytes = s.bytes;
          err += std::abs(collective_time(s.kind, fit, ax.group_size, s.bytes) - s.seconds) / s.seconds;
          ++n;
        }
      ax.holdout_relative_error = n ? err / n : 0.0;
      if (!(ax.holdout_relative_error <= max_holdout_relative_error)) {
        char text[320];
        std::snprintf(text, sizeof text,
                      "calibrating mesh axis %zu: the fit predicts the held-out size (%g bytes) off by %g times the measured "
                      "time on average, more than %g (max_holdout_relative_error): a stalled or overloaded run?",
                      a, ax.holdout_bytes, ax.holdout_relative_error, max_holdout_relative_error);
        throw comm_error(text);
      }
    }
    out.axes.push_back(ax);
  }
  return out;
}

/// Sets the measured axes' link models on `m`, whose shape must be the calibration's
/// (check_fits). `force` takes the links of the axes both meshes have even when the shapes
/// differ (the caller says so to the user).
inline device_mesh& apply_calibration(device_mesh& m, const calibration_result& r, bool force = false) {
  r.check_fits(m, r.backend_family(), force);
  for (const auto& a : r.axes)
    if (a.measured && static_cast<std::size_t>(a.axis) < m.ndim())
      m.set_link(static_cast<std::size_t>(a.axis), r.mesh.link(static_cast<std::size_t>(a.axis)));
  return m;
}

}  // namespace autoshard
