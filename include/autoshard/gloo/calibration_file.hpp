#pragma once
/// The calibration file: comm's calibration_result as JSON (what `autoshard calibrate`
/// writes and `autoshard plan --calibration` reads).
///   autoshard::save_calibration(autoshard::calibrate(mc), "links.json");
///   device_mesh m{2, 4};  autoshard::apply_calibration(m, autoshard::load_calibration("links.json"));
///   autoshard::load_calibration("links.json").mesh;   // the mesh measured on, with its links
/// It lives beside the Gloo backend, not in comm/, because comm/ needs nothing but the
/// standard library and this file needs nlohmann-json (through the io area).
#include <cstdint>  // std::int64_t
#include <string>   // std::string
#include <vector>   // std::vector

#include <nlohmann/json.hpp>  // nlohmann::json

#include "../comm/calibrate.hpp"     // calibration_result
#include "../core/error.hpp"         // io_error
#include "../core/mesh.hpp"          // max_mesh_rank
#include "../core/redistribute.hpp"  // collective, to_string
#include "../io/atomic_file.hpp"     // write_file_atomically
#include "../io/json.hpp"            // json_in, parse_json_text, read_regular_file
#include "../io/mesh_json.hpp"       // mesh_to_json, mesh_from_json, link_from_json

namespace autoshard {

/// The calibration file format this build writes (version 3: the mesh measured on, with its
/// fitted links and axis names, in the one mesh spelling of io/mesh_json.hpp). It reads
/// version 2 too (the mesh as a list of sizes, each axis's link beside its samples).
inline constexpr int calibration_format_version = 3;

/// The result as JSON (what save_calibration writes).
inline nlohmann::json calibration_to_json(const calibration_result& r) {
  nlohmann::json j;
  j["format"] = "autoshard-calibration";
  j["version"] = calibration_format_version;
  j["backend"] = r.backend;
  j["mesh"] = mesh_to_json(r.mesh);
  j["axes"] = nlohmann::json::array();
  for (const auto& a : r.axes) {
    nlohmann::json ja{{"axis", a.axis},
                      {"group_size", a.group_size},
                      {"measured", a.measured},
                      {"holdout_bytes", a.holdout_bytes},
                      {"holdout_relative_error", a.holdout_relative_error}};
    ja["samples"] = nlohmann::json::array();
    for (const auto& s : a.samples)
      ja["samples"].push_back(
          {{"kind", std::string(to_string(s.kind))}, {"bytes", s.bytes}, {"seconds", s.seconds}, {"held_out", s.held_out}});
    j["axes"].push_back(ja);
  }
  return j;
}

namespace detail {

/// The collectives a calibration samples (the communicating ones).
inline constexpr collective sampled_collectives[] = {collective::all_reduce, collective::all_gather,
                                                     collective::reduce_scatter, collective::all_to_all};

/// One axis's fit as calibration_to_json wrote it (its link is the mesh's).
inline axis_calibration axis_calibration_from_json(const json_in& ja, std::size_t axes) {
  axis_calibration a;
  a.axis = ja["axis"].small_integer(0, static_cast<int>(axes) - 1);
  a.group_size = ja["group_size"].small_integer(1, 1 << 20);
  a.measured = ja["measured"].boolean();
  if (auto h = ja.find("holdout_bytes")) a.holdout_bytes = h->number(0.0);
  // A mean of |predicted - measured| / measured: 0 and up, at most what calibrate writes.
  if (auto h = ja.find("holdout_relative_error")) a.holdout_relative_error = h->number(0.0, max_holdout_relative_error);
  if (auto samples = ja.find("samples")) {
    // Counted before any is taken: a fit takes at most max_calibration_samples.
    if (samples->size() > max_calibration_samples)
      samples->fail("has " + std::to_string(samples->size()) + " samples, but a fit takes at most " +
                    std::to_string(max_calibration_samples) + " (max_calibration_samples; calibrate writes at most 44 an axis)");
    for (const json_in& js : samples->elements()) {
      calibration_sample s;
      s.kind = enum_value(js["kind"], sampled_collectives);
      s.bytes = js["bytes"].number(0.0);
      s.seconds = js["seconds"].number(0.0);
      if (auto h = js.find("held_out")) s.held_out = h->boolean();
      a.samples.push_back(s);
    }
  }
  return a;
}

/// A version-2 file's mesh: a list of sizes, and each axis's link beside its fit.
inline device_mesh calibration_mesh_v2(const json_in& j) {
  std::vector<int> shape;
  for (std::int64_t s : j["mesh"].integers(1, 1 << 20, max_mesh_rank)) shape.push_back(static_cast<int>(s));
  try {
    check_mesh_size(shape, "the mesh");
  } catch (const spec_error& e) {
    j["mesh"].fail(std::string(e.message()));
  }
  device_mesh m(shape);
  const json_in axes = j["axes"];
  if (axes.size() != shape.size())
    axes.fail("has " + std::to_string(axes.size()) + " axes for a mesh of " + std::to_string(shape.size()));
  for (std::size_t a = 0; a < shape.size(); ++a) m.set_link(a, link_from_json(axes[a]));
  return m;
}

}  // namespace detail

/// Reads what calibration_to_json wrote (or a version-2 file); io_error naming the file and
/// the JSON path otherwise.
inline calibration_result calibration_from_json(const nlohmann::json& doc, const std::string& what = "calibration") {
  const json_in j(doc, what);
  calibration_result r;
  j["format"].one_of({"autoshard-calibration"});
  const std::int64_t v = j["version"].integer(0, 1 << 30);
  if (v != 2 && v != calibration_format_version)
    j["version"].fail("is " + std::to_string(v) + "; this build reads versions 2 and " + std::to_string(calibration_format_version) +
                      (v == 1 ? " (version 1 spelled the links alpha_s/beta_bytes_per_s): run autoshard calibrate again" : ""));
  // What the plan prices it as (calibration_result::backend_family): refused here, with the
  // file's name, not later as an unnamed communications_backend. Every file calibrate wrote
  // has one; a file without was read as backend "?", which plan then refused unnamed and
  // which, written back, did not read (found by fuzz_readers).
  r.backend = j["backend"].string();
  if (r.backend_family() != "gloo" && r.backend_family() != "nccl")
    j["backend"].fail("is " + quoted_text(r.backend) + ", not a backend autoshard prices (its family, before any \"-\", must be \"gloo\" or \"nccl\")");
  r.mesh = v == 2 ? detail::calibration_mesh_v2(j) : mesh_from_json(j["mesh"]);
  const json_in axes = j["axes"];
  if (axes.size() != r.mesh.ndim())
    axes.fail("has " + std::to_string(axes.size()) + " axes for a mesh of " + std::to_string(r.mesh.ndim()));
  // One fit per mesh axis, in mesh order, over that axis's ranks (as calibrate writes them): a
  // hand-edited axes[1].axis of 0, or a group of 2 on an axis of 4 ranks, was read and shown as
  // a fit of another axis or group than the links it stands beside.
  for (const json_in& ja : axes.elements()) {
    const std::size_t k = r.axes.size();
    r.axes.push_back(detail::axis_calibration_from_json(ja, r.mesh.ndim()));
    if (r.axes.back().axis != static_cast<int>(k))
      ja["axis"].fail_expected(std::to_string(k) + ": the fits are listed in the mesh's axis order");
    if (r.axes.back().group_size != r.mesh.size(k))
      ja["group_size"].fail_expected(std::to_string(r.mesh.size(k)) + ", the ranks of mesh axis " + std::to_string(k) + " in " +
                                     to_string(r.mesh));
  }
  return r;
}

/// Writes a calibration file (atomically: never a half file).
inline void save_calibration(const calibration_result& r, const std::string& path) {
  write_file_atomically(path, calibration_to_json(r).dump(2) + "\n");
}

/// The largest calibration file read: max_calibration_samples samples on each of max_mesh_rank
/// axes take about 0.6 MiB as calibrate writes them (130 bytes a sample); the rest is room for
/// white space. Refused from its size before it is read: a file of 2 million samples (171 MB)
/// took 5.4 s and 1.4 GB to parse before its samples could be counted.
inline constexpr std::uint64_t max_calibration_file_bytes = std::uint64_t{4} << 20;

inline calibration_result load_calibration(const std::string& path) {
  const std::string name = "calibration file " + quoted_path(path);
  return calibration_from_json(parse_json_text(read_regular_file(path, "calibration file", max_calibration_file_bytes), name), name);
}

}  // namespace autoshard
