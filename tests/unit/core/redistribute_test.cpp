// Redistribute plans, executed. A small simulator in this file gives every rank of a mesh
// its shard of a labelled tensor (value = flat global index), runs a plan's steps as data
// movement between the ranks (all-gather padded to ceil(n/k) then narrowed, all-reduce,
// reduce-scatter, all-to-all, local slice, local partial), and compares every rank with the
// target spec's shard cut straight from the global tensor. Shards are found by chunking
// index lists (core_test_util.hpp), never by the library's layout code, and the bytes the
// simulator really moves are priced with DESIGN.md's formulas, written out again here.
#include <doctest/doctest.h>

#include <autoshard/autoshard.hpp>

#include <array>     // std::array
#include <limits>    // std::numeric_limits
#include <map>       // std::map
#include <stdexcept> // std::logic_error
#include <sstream>   // std::ostringstream
#include <string>    // std::string
#include <utility>   // std::pair
#include <vector>    // std::vector

#include "core_test_util.hpp"

using namespace autoshard;
using namespace autoshard::literals;
namespace at = autoshard_test;

namespace {

// ---------------------------------------------------------------- dense local tensors
/// A shape or multi-index of rank <= 4, without allocating (the sweeps make millions).
struct index_t {
  std::array<std::int64_t, 4> a{};
  std::size_t n = 0;
  index_t() = default;
  index_t(std::size_t size, std::int64_t value) : n(size) {
    for (std::size_t i = 0; i < n; ++i) a[i] = value;
  }
  std::int64_t& operator[](std::size_t i) { return a[i]; }
  std::int64_t operator[](std::size_t i) const { return a[i]; }
  std::size_t size() const { return n; }
  void push_back(std::int64_t v) { a[n++] = v; }
  const std::int64_t* begin() const { return a.data(); }
  const std::int64_t* end() const { return a.data() + n; }
  friend bool operator==(const index_t&, const index_t&) = default;
};

/// The simulator's own sanity checks; cheaper than a doctest assertion per element.
void expect(bool ok, const char* what) {
  if (!ok) throw std::logic_error(std::string("simulator: ") + what);
}

struct dense {
  index_t shape;
  std::vector<double> v;
};

std::int64_t count(const index_t& shape) {
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

std::size_t flat(const index_t& shape, const index_t& idx) {
  std::int64_t f = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + idx[d];
  return static_cast<std::size_t>(f);
}

/// Calls f(idx) for every multi-index of `shape`, row-major.
template <class F>
void for_each_index(const index_t& shape, F&& f) {
  if (count(shape) == 0) return;
  index_t idx(shape.size(), 0);
  for (;;) {
    f(idx);
    std::size_t d = shape.size();
    while (d > 0 && ++idx[d - 1] == shape[d - 1]) idx[--d] = 0;
    if (d == 0) return;
  }
}

dense filled(const index_t& shape, double value) {
  return {shape, std::vector<double>(static_cast<std::size_t>(count(shape)), value)};
}

/// Row-major view of `shape` around dim d: [outer, shape[d], inner].
struct around {
  std::size_t outer = 1, inner = 1;
  around(const index_t& shape, std::size_t d) {
    for (std::size_t i = 0; i < d; ++i) outer *= static_cast<std::size_t>(shape[i]);
    for (std::size_t i = d + 1; i < shape.size(); ++i) inner *= static_cast<std::size_t>(shape[i]);
  }
};

/// Copies rows [from, from + len) of dim d of `src` to rows [to, to + len) of `dst`.
void copy_rows(const dense& src, std::size_t d, std::int64_t from, dense& dst, std::int64_t to, std::int64_t len) {
  const around v(src.shape, d);
  const auto ns = static_cast<std::size_t>(src.shape[d]), nd = static_cast<std::size_t>(dst.shape[d]);
  const auto l = static_cast<std::size_t>(len) * v.inner;
  for (std::size_t o = 0; o < v.outer; ++o) {
    const double* s = src.v.data() + (o * ns + static_cast<std::size_t>(from)) * v.inner;
    double* t = dst.v.data() + (o * nd + static_cast<std::size_t>(to)) * v.inner;
    for (std::size_t j = 0; j < l; ++j) t[j] = s[j];
  }
}

dense narrow(const dense& t, std::size_t d, std::int64_t start, std::int64_t len) {
  expect(start >= 0 && len >= 0 && start + len <= t.shape[d], "narrow out of range");
  index_t shape = t.shape;
  shape[d] = len;
  dense out = filled(shape, 0.0);
  copy_rows(t, d, start, out, 0, len);
  return out;
}

dense pad(const dense& t, std::size_t d, std::int64_t size, double fill) {
  expect(size >= t.shape[d], "padding to a smaller size");
  index_t shape = t.shape;
  shape[d] = size;
  dense out = filled(shape, fill);
  copy_rows(t, d, 0, out, 0, t.shape[d]);
  return out;
}

dense concat(const std::vector<dense>& ts, std::size_t d) {
  index_t shape = ts.front().shape;
  shape[d] = 0;
  for (const dense& t : ts) shape[d] += t.shape[d];
  dense out = filled(shape, 0.0);
  std::int64_t at_d = 0;
  for (const dense& t : ts) {
    expect(around(t.shape, d).outer == around(shape, d).outer && around(t.shape, d).inner == around(shape, d).inner,
           "concatenating shards of different shapes");
    copy_rows(t, d, 0, out, at_d, t.shape[d]);
    at_d += t.shape[d];
  }
  return out;
}

double reduce2(reduce_op op, double a, double b) {
  switch (op) {
    case reduce_op::sum: return a + b;
    case reduce_op::max: return a > b ? a : b;
    case reduce_op::min: return a < b ? a : b;
  }
  return 0;
}

double identity_of(reduce_op op) {
  switch (op) {
    case reduce_op::sum: return 0.0;
    case reduce_op::max: return -std::numeric_limits<double>::infinity();
    case reduce_op::min: return std::numeric_limits<double>::infinity();
  }
  return 0;
}

dense reduce_all(const std::vector<dense>& ts, reduce_op op) {
  dense out = ts.front();
  for (std::size_t i = 1; i < ts.size(); ++i) {
    expect(ts[i].shape == out.shape, "reducing shards of different shapes");
    for (std::size_t j = 0; j < out.v.size(); ++j) out.v[j] = reduce2(op, out.v[j], ts[i].v[j]);
  }
  return out;
}

std::int64_t ceil_div(std::int64_t n, std::int64_t k) {
  std::int64_t c = 0;
  while (c * k < n) ++c;
  return c;
}

/// Where piece i of n split k ways (torch.chunk) starts, and its length.
std::pair<std::int64_t, std::int64_t> chunk_of(std::int64_t n, int k, int i) {
  static std::map<std::pair<std::int64_t, int>, std::vector<std::pair<std::int64_t, std::int64_t>>> memo;
  auto& pieces = memo[{n, k}];
  if (pieces.empty())
    for (const auto& p : at::torch_chunk(at::iota_piece(n), k))
      pieces.emplace_back(p.offset(), static_cast<std::int64_t>(p.idx.size()));
  return pieces[static_cast<std::size_t>(i)];
}

constexpr double pad_value = -123456.5;  // what padding holds; it must never survive

struct box {
  index_t offset, shape;
};

// ---------------------------------------------------------------- the simulated mesh
struct sim_mesh {
  std::vector<int> sizes;
  std::vector<std::vector<int>> coords;  // by rank, found by counting
  std::map<std::vector<int>, int> rank_of;
  std::vector<std::vector<std::vector<int>>> axis_groups;
  mutable std::map<std::pair<std::uint64_t, std::uint64_t>, std::vector<box>> box_memo;
  mutable std::map<std::pair<std::uint64_t, std::uint64_t>, std::vector<dense>> label_memo;

  explicit sim_mesh(std::vector<int> s) : sizes(std::move(s)), coords(at::all_coordinates(sizes)) {
    for (std::size_t r = 0; r < coords.size(); ++r) rank_of[coords[r]] = static_cast<int>(r);
    for (std::size_t axis = 0; axis < sizes.size(); ++axis) {
      axis_groups.emplace_back();
      for (int r = 0; r < ranks(); ++r) {
        const auto& c = coords[static_cast<std::size_t>(r)];
        if (c[axis] != 0) continue;
        std::vector<int> g;
        auto cc = c;
        for (int i = 0; i < sizes[axis]; ++i) {
          cc[axis] = i;
          g.push_back(rank_of.at(cc));
        }
        axis_groups.back().push_back(g);
      }
    }
  }
  int ranks() const { return static_cast<int>(coords.size()); }
  /// The groups of `axis`: ranks sharing the other coordinates, ordered by coordinate `axis`.
  const std::vector<std::vector<int>>& groups(std::size_t axis) const { return axis_groups[axis]; }
};


std::uint64_t spec_key(const sharding_spec& s) {
  std::uint64_t k = s.tensor_rank;
  for (std::size_t i = 0; i < s.mesh_rank; ++i)
    k = k * 64 + static_cast<std::uint64_t>(s[i].kind) * 16 + static_cast<std::uint64_t>(s[i].dim + 1) * 4 +
        static_cast<std::uint64_t>(s[i].op);
  return k;
}

box brute_box_uncached(const sim_mesh& m, const sharding_spec& s, const tensor_shape& g, int rank) {
  box b;
  for (int d = 0; d < static_cast<int>(g.rank); ++d) {
    const auto p = at::brute_dim_piece(m.sizes, m.coords[static_cast<std::size_t>(rank)], s, d, g[static_cast<std::size_t>(d)]);
    b.offset.push_back(p.offset());
    b.shape.push_back(static_cast<std::int64_t>(p.idx.size()));
  }
  return b;
}

/// The brute-force box of every rank, memoised per spec: a sweep asks for the same few
/// hundred specs again and again.
const box& brute_box(const sim_mesh& m, const sharding_spec& s, const tensor_shape& g, int rank) {
  std::uint64_t gk = g.rank;
  for (auto x : g) gk = gk * 1024 + static_cast<std::uint64_t>(x);
  auto& boxes = m.box_memo[{gk, spec_key(s)}];
  if (boxes.empty())
    for (int r = 0; r < m.ranks(); ++r) boxes.push_back(brute_box_uncached(m, s, g, r));
  return boxes[static_cast<std::size_t>(rank)];
}

/// The labels of `rank`'s shard: value = flat index in the global tensor.
dense labels_uncached(const sim_mesh& m, const sharding_spec& s, const tensor_shape& g, int rank) {
  const box& b = brute_box(m, s, g, rank);
  index_t gshape;
  for (auto x : g) gshape.push_back(x);
  dense out = filled(b.shape, 0.0);
  for_each_index(b.shape, [&](const index_t& idx) {
    index_t gi = idx;
    for (std::size_t d = 0; d < gi.size(); ++d) gi[d] += b.offset[d];
    out.v[flat(b.shape, idx)] = static_cast<double>(flat(gshape, gi));
  });
  return out;
}

const dense& labels(const sim_mesh& m, const sharding_spec& s, const tensor_shape& g, int rank) {
  std::uint64_t gk = g.rank;
  for (auto x : g) gk = gk * 1024 + static_cast<std::uint64_t>(x);
  auto& all = m.label_memo[{gk, spec_key(s)}];
  if (all.empty())
    for (int r = 0; r < m.ranks(); ++r) all.push_back(labels_uncached(m, s, g, r));
  return all[static_cast<std::size_t>(rank)];
}

/// The source shards. On Partial axes the value v is split so that every rank's part differs:
///   part = f(sum-axis coords) - sum over max axes of G_a + sum over min axes of H_b,
/// with the f's summing to v and each G_a, H_b >= 0 and zero at exactly one coordinate.
/// Reducing those axes in any order gives v back, so the test does not depend on the
/// order a plan reduces mixed Partial axes in.
std::vector<dense> source_shards(const sim_mesh& m, const sharding_spec& s, const tensor_shape& g) {
  std::vector<dense> out;
  for (int r = 0; r < m.ranks(); ++r) {
    dense t = labels(m, s, g, r);  // a copy: the parts replace the labels
    const auto& c = m.coords[static_cast<std::size_t>(r)];
    int sum_ranks = 1, sum_index = 0;
    for (std::size_t i = 0; i < m.sizes.size(); ++i)
      if (s[i].is_partial() && s[i].op == reduce_op::sum) {
        sum_ranks *= m.sizes[i];
        sum_index = sum_index * m.sizes[i] + c[i];
      }
    for (double& x : t.v) {
      const auto gi = static_cast<std::int64_t>(x);
      double part = 0;
      if (sum_ranks == 1) {
        part = x;
      } else {
        double others = 0;
        for (int j = 0; j + 1 < sum_ranks; ++j) others += (j + 1) * 10 + static_cast<double>(gi % 7);
        part = sum_index + 1 < sum_ranks ? (sum_index + 1) * 10 + static_cast<double>(gi % 7) : x - others;
      }
      for (std::size_t i = 0; i < m.sizes.size(); ++i) {
        if (!s[i].is_partial() || s[i].op == reduce_op::sum) continue;
        const double bump = static_cast<double>((c[i] + gi) % m.sizes[i]) * 2;
        part += s[i].op == reduce_op::max ? -bump : bump;
      }
      x = part;
    }
    out.push_back(std::move(t));
  }
  return out;
}

std::string show(const std::vector<int>& sizes, const sharding_spec& a, const sharding_spec& b,
                 const tensor_shape& g) {
  std::ostringstream os;
  os << "mesh " << to_string(device_mesh(sizes)) << ", tensor " << g << ": " << a << " -> " << b;
  return os.str();
}

/// What the simulator moved in one step: the B of the cost formula, in elements.
struct moved {
  collective kind;
  int k = 1;
  std::int64_t elems = 0;
};

/// Runs one step over every group of its axis. Returns the largest buffer a collective used.
moved run_step(const sim_mesh& m, std::vector<dense>& st, const redist_step& step) {
  const std::size_t axis = step.mesh_axis;
  const int k = m.sizes[axis];
  moved mv{step.kind, k, 0};
  for (const auto& group : m.groups(axis)) {
    std::vector<dense> in;
    for (int r : group) in.push_back(st[static_cast<std::size_t>(r)]);
    std::vector<dense> out(in.size());
    switch (step.kind) {
      case collective::all_gather: {
        const auto d = static_cast<std::size_t>(step.from.dim);
        std::int64_t n = 0;
        for (const dense& t : in) n += t.shape[d];
        const std::int64_t c = ceil_div(n, k);
        std::vector<dense> padded;
        for (const dense& t : in) padded.push_back(pad(t, d, c, pad_value));
        const dense full = concat(padded, d);
        mv.elems = std::max(mv.elems, count(full.shape));
        for (dense& o : out) o = narrow(full, d, 0, n);
        break;
      }
      case collective::all_reduce: {
        const dense r = reduce_all(in, step.from.op);
        mv.elems = std::max(mv.elems, count(r.shape));
        for (dense& o : out) o = r;
        break;
      }
      case collective::reduce_scatter: {
        const auto d = static_cast<std::size_t>(step.to.dim);
        const dense r = reduce_all(in, step.from.op);
        const std::int64_t n = r.shape[d], c = ceil_div(n, k);
        const dense padded = pad(r, d, c * k, pad_value);
        mv.elems = std::max(mv.elems, count(padded.shape));
        for (int i = 0; i < k; ++i)
          out[static_cast<std::size_t>(i)] = narrow(narrow(padded, d, c * i, c), d, 0, chunk_of(n, k, i).second);
        break;
      }
      case collective::all_to_all: {
        const auto a = static_cast<std::size_t>(step.from.dim), b = static_cast<std::size_t>(step.to.dim);
        std::int64_t na = 0;
        for (const dense& t : in) na += t.shape[a];
        const std::int64_t nb = in.front().shape[b], ca = ceil_div(na, k), cb = ceil_div(nb, k);
        std::vector<dense> send;
        for (const dense& t : in) {
          expect(t.shape[b] == nb, "all-to-all over shards of different sizes");
          send.push_back(pad(pad(t, a, ca, pad_value), b, cb * k, pad_value));
          mv.elems = std::max(mv.elems, count(send.back().shape));
        }
        for (int j = 0; j < k; ++j) {
          std::vector<dense> recv;
          for (const dense& t : send) recv.push_back(narrow(t, b, cb * j, cb));
          const dense whole = concat(recv, a);
          out[static_cast<std::size_t>(j)] = narrow(narrow(whole, a, 0, na), b, 0, chunk_of(nb, k, j).second);
        }
        break;
      }
      case collective::local_slice: {
        const auto d = static_cast<std::size_t>(step.to.dim);
        for (int i = 0; i < k; ++i) {
          const dense& t = in[static_cast<std::size_t>(i)];
          const auto [off, len] = chunk_of(t.shape[d], k, i);
          out[static_cast<std::size_t>(i)] = narrow(t, d, off, len);
        }
        break;
      }
      case collective::local_partial: {
        out = in;
        for (int i = 1; i < k; ++i) out[static_cast<std::size_t>(i)] = filled(in[0].shape, identity_of(step.to.op));
        break;
      }
    }
    for (std::size_t i = 0; i < group.size(); ++i) st[static_cast<std::size_t>(group[i])] = std::move(out[i]);
  }
  return mv;
}

/// Every rank must hold the target's shard: directly, or after reducing its Partial axes
/// (in both axis orders, which must agree).
bool matches_target(const sim_mesh& m, const std::vector<dense>& st, const sharding_spec& dst,
                    const tensor_shape& g, std::string& why) {
  for (int r = 0; r < m.ranks(); ++r) {
    const box b = brute_box(m, dst, g, r);
    if (st[static_cast<std::size_t>(r)].shape != b.shape) {
      why = "rank " + std::to_string(r) + " has the wrong shape";
      return false;
    }
  }
  std::vector<std::size_t> partial_axes;
  for (std::size_t i = 0; i < m.sizes.size(); ++i)
    if (dst[i].is_partial()) partial_axes.push_back(i);
  for (int order = 0; order < (partial_axes.empty() ? 1 : 2); ++order) {
    std::vector<dense> cur = st;
    std::vector<bool> live(cur.size(), true);
    for (std::size_t j = 0; j < partial_axes.size(); ++j) {
      const std::size_t axis = order == 0 ? partial_axes[j] : partial_axes[partial_axes.size() - 1 - j];
      for (const auto& group : m.groups(axis)) {
        std::vector<dense> parts;
        for (int r : group) parts.push_back(cur[static_cast<std::size_t>(r)]);
        cur[static_cast<std::size_t>(group[0])] = reduce_all(parts, dst[axis].op);
        for (std::size_t i = 1; i < group.size(); ++i) live[static_cast<std::size_t>(group[i])] = false;
      }
    }
    for (int r = 0; r < m.ranks(); ++r) {
      if (!live[static_cast<std::size_t>(r)]) continue;
      const dense& want = labels(m, dst, g, r);
      if (cur[static_cast<std::size_t>(r)].v != want.v) {
        why = "rank " + std::to_string(r) + " holds the wrong values";
        return false;
      }
    }
  }
  return true;
}

/// DESIGN.md's cost table, written out independently of cost.hpp: alpha once per
/// collective, hop per ring step (k-1, or 2(k-1) for an all-reduce), volume over beta.
double design_seconds(collective kind, const link_model& l, int k, double bytes) {
  if (k == 1) return 0.0;
  const double f = (k - 1.0) / k;
  switch (kind) {
    case collective::all_gather:
    case collective::reduce_scatter:
    case collective::all_to_all: return l.alpha + (k - 1) * l.hop + f * bytes / l.beta;
    case collective::all_reduce: return l.alpha + 2 * (k - 1) * l.hop + 2 * f * bytes / l.beta;
    default: return 0.0;
  }
}

/// S->P and P(a)->P(b) on any axis make a pair impossible.
bool impossible(const sharding_spec& a, const sharding_spec& b) {
  for (std::size_t i = 0; i < a.mesh_rank; ++i) {
    if (a[i].is_shard() && b[i].is_partial()) return true;
    if (a[i].is_partial() && b[i].is_partial() && a[i].op != b[i].op) return true;
  }
  return false;
}

struct sweep_stats {
  int pairs = 0, rejected = 0, steps = 0;
};

/// Plans, executes and prices every pair of specs on one mesh and tensor shape.
void sweep(const std::vector<int>& sizes, const std::vector<tensor_shape>& shapes,
           const std::vector<reduce_op>& ops, sweep_stats& stats) {
  const sim_mesh sm(sizes);
  device_mesh m(sizes);
  for (std::size_t i = 0; i < sizes.size(); ++i)  // a different link on every axis
    m.set_link(i, {1e-6 * static_cast<double>(i + 2), 1e9 * static_cast<double>(3 * i + 5), 1e-7 * static_cast<double>(i + 1)});
  const dtype t = dtype::f32;
  for (const tensor_shape& g : shapes) {
    const auto specs = at::all_specs(static_cast<int>(sizes.size()), static_cast<int>(g.rank), ops);
    std::vector<std::vector<dense>> sources;
    for (const auto& s : specs) sources.push_back(source_shards(sm, s, g));
    for (std::size_t si = 0; si < specs.size(); ++si)
      for (const sharding_spec& dst : specs) {
        const sharding_spec& src = specs[si];
        ++stats.pairs;
        if (impossible(src, dst)) {
          ++stats.rejected;
          bool threw = false;
          try {
            (void)plan_redistribute(m, src, dst);
          } catch (const spec_error&) {
            threw = true;
          }
          if (!threw) FAIL_CHECK("accepted an impossible redistribution: " << show(sizes, src, dst, g));
          continue;
        }
        const redist_plan plan = plan_redistribute(m, src, dst);
        const plan_cost cost = price_plan(m, plan, g, t);
        std::vector<dense> st = sources[si];
        sharding_spec cur = src;
        std::string why;
        bool ok = plan.src == src && plan.dst == dst && cost.size() == plan.size();
        double total = 0;
        for (std::size_t j = 0; ok && j < plan.size(); ++j) {
          const redist_step& step = plan[j];
          const std::size_t ax = step.mesh_axis;
          // The step starts from the current spec (size-1 axes are relabelled silently).
          for (std::size_t i = 0; i < sizes.size(); ++i)
            if (sizes[i] > 1 && !(step.before[i] == cur[i])) ok = false, why = "step does not start where the last ended";
          if (!(step.from == step.before[ax]) || !(step.to == step.after[ax]) || sizes[ax] == 1 ||
              step.after.with(ax, step.from) != step.before) {
            ok = false, why = "malformed step";
            break;
          }
          cur = step.after;
          const moved mv = run_step(sm, st, step);
          ++stats.steps;
          // Bytes and seconds: what moved, priced by the design's formulas.
          const std::int64_t bytes = is_communication(step.kind) ? mv.elems * 4 : 0;
          const double secs = design_seconds(step.kind, m.link(ax), mv.k, static_cast<double>(bytes));
          total += secs;
          if (cost[j].bytes != bytes || cost[j].group_size != mv.k || cost[j].seconds != doctest::Approx(secs).epsilon(1e-12)) {
            ok = false;
            why = "step " + std::to_string(j) + " costs " + std::to_string(cost[j].bytes) + " bytes, moved " +
                  std::to_string(bytes);
          }
          // After every step each rank holds the shape its spec says.
          for (int r = 0; ok && r < sm.ranks(); ++r)
            if (st[static_cast<std::size_t>(r)].shape != brute_box(sm, step.after, g, r).shape)
              ok = false, why = "after step " + std::to_string(j) + " rank " + std::to_string(r) + " has the wrong shape";
        }
        for (std::size_t i = 0; ok && i < sizes.size(); ++i)
          if (sizes[i] > 1 && !(cur[i] == dst[i])) ok = false, why = "the plan stops short of the target";
        ok = ok && matches_target(sm, st, dst, g, why);
        ok = ok && cost.seconds == doctest::Approx(total).epsilon(1e-12);
        if (!ok) {
          std::ostringstream os;
          os << plan;
          FAIL_CHECK(show(sizes, src, dst, g) << ": " << why << "\n" << os.str());
        }
      }
  }
}

std::vector<std::pair<int, collective>> steps_of(const redist_plan& p) {
  std::vector<std::pair<int, collective>> out;
  for (const auto& s : p) out.emplace_back(s.mesh_axis, s.kind);
  return out;
}

std::string error_of(const sharding_spec& a, const sharding_spec& b) {
  try {
    (void)plan_redistribute(a, b);
  } catch (const spec_error& e) {
    return e.what();
  }
  return "";
}

const std::vector<reduce_op> all_ops{reduce_op::sum, reduce_op::max, reduce_op::min};
const std::vector<reduce_op> sum_max{reduce_op::sum, reduce_op::max};

}  // namespace

TEST_CASE("simulated plans: 1-D mesh of 4, even and uneven (5/4, 6/4, empty shards)") {
  sweep_stats s;
  sweep({4}, {{8, 4}, {5, 6}, {3, 2}}, all_ops, s);
  CHECK(s.pairs == 3 * 6 * 6);
  CHECK(s.rejected == 3 * (2 * 3 + 3 * 2));
  CHECK(s.steps > 0);
}

TEST_CASE("simulated plans: 2-D meshes 2x2 and 2x3") {
  sweep_stats s;
  sweep({2, 2}, {{8, 4}, {5, 3}}, all_ops, s);
  sweep({2, 3}, {{12, 6}, {5, 7}}, sum_max, s);
  CHECK(s.pairs == 2 * 36 * 36 + 2 * 25 * 25);
  CHECK(s.steps > 0);
}

TEST_CASE("simulated plans: 3-D mesh 2x2x2") {
  sweep_stats s;
  sweep({2, 2, 2}, {{5, 3}}, sum_max, s);
  sweep({2, 2, 2}, {{8, 8}}, {reduce_op::sum}, s);  // even: one Partial op keeps the run short
  CHECK(s.pairs == 125 * 125 + 64 * 64);
}

TEST_CASE("simulated plans: a rank-3 tensor, and meshes with size-1 axes") {
  sweep_stats s;
  sweep({2, 2}, {{4, 2, 6}, {3, 5, 2}}, sum_max, s);
  sweep({2, 1, 2}, {{5, 6}}, {reduce_op::sum}, s);
  sweep({1, 4}, {{5, 6}}, all_ops, s);
  CHECK(s.pairs == 2 * 36 * 36 + 64 * 64 + 36 * 36);
}

TEST_CASE("plans follow DTensor's order: undo inner axes last to first, then re-shard outward") {
  using C = collective;
  using V = std::vector<std::pair<int, collective>>;
  const device_mesh m22{2, 2}, m222{2, 2, 2};
  auto plan = [](const device_mesh& m, const char* a, const char* b) {
    const int n = static_cast<int>(m.ndim());
    return steps_of(plan_redistribute(m, parse_spec(a, n, 2), parse_spec(b, n, 2)));
  };
  // DTensor's own example: the nested S(0) is gathered inner first, then re-sliced.
  CHECK(plan(m22, "[S(0),S(0)]", "[R,S(0)]") == V{{1, C::all_gather}, {0, C::all_gather}, {1, C::local_slice}});
  CHECK(plan(m22, "[S(0),S(1)]", "[S(1),S(0)]") == V{{1, C::all_gather}, {0, C::all_to_all}, {1, C::local_slice}});
  CHECK(plan(m22, "[R,S(0)]", "[S(0),R]") == V{{1, C::all_gather}, {0, C::local_slice}});
  CHECK(plan(m22, "[S(0),R]", "[R,S(0)]") == V{{0, C::all_gather}, {1, C::local_slice}});
  CHECK(plan(m22, "[S(0),S(1)]", "[S(0),S(0)]") == V{{1, C::all_to_all}});
  // No shard in the source: one outward pass (a Partial over both axes is reduced
  // hierarchically: see the next test case).
  CHECK(plan(m22, "[P,R]", "[R,R]") == V{{0, C::all_reduce}});
  CHECK(plan(m22, "[P,R]", "[S(0),S(0)]") == V{{0, C::reduce_scatter}, {1, C::local_slice}});
  CHECK(plan(m22, "[R,R]", "[S(1),P]") == V{{0, C::local_slice}, {1, C::local_partial}});
  // A shard in the source: the inward pass runs first.
  CHECK(plan(m22, "[P,S(0)]", "[R,R]") == V{{1, C::all_gather}, {0, C::all_reduce}});
  CHECK(plan(m22, "[S(0),P]", "[R,R]") == V{{1, C::all_reduce}, {0, C::all_gather}});
  CHECK(plan(m22, "[S(0),P]", "[R,S(0)]") == V{{1, C::all_reduce}, {0, C::all_gather}, {1, C::local_slice}});
  CHECK(plan(m222, "[S(0),S(1),S(0)]", "[S(1),S(1),S(0)]") ==
        V{{2, C::all_gather}, {1, C::all_gather}, {0, C::all_to_all}, {1, C::local_slice}, {2, C::local_slice}});
  CHECK(plan(m222, "[S(0),S(0),S(0)]", "[S(0),S(0),R]") == V{{2, C::all_gather}});
  CHECK(plan(m222, "[S(0),S(0),S(0)]", "[R,S(0),S(0)]") ==
        V{{2, C::all_gather}, {1, C::all_gather}, {0, C::all_gather}, {1, C::local_slice}, {2, C::local_slice}});
  CHECK(plan(m22, "S0R", "S0R").empty());
  // Alpa spellings plan the same.
  CHECK(plan(m22, "S01R", "S1R") == plan(m22, "[S(0),S(0)]", "[R,S(0)]"));
}

TEST_CASE("a Partial over several axes is reduced hierarchically, fastest axis first") {
  using C = collective;
  using V = std::vector<std::pair<int, collective>>;
  const device_mesh m = make_mesh_2d(2, 4, 25e9, 300e9);  // axis 1 is the fast one
  const tensor_shape g{1024, 1024, 64};
  auto steps = [&](const device_mesh& mm, const char* a, const char* b, const tensor_shape& shape) {
    return plan_redistribute(mm, parse_spec(a, 2, static_cast<int>(shape.rank)), parse_spec(b, 2, static_cast<int>(shape.rank)), shape);
  };
  // [P,P] -> [R,R]: reduce-scatter inside the node, all-reduce a quarter across nodes, all-gather.
  const redist_plan pr = steps(m, "[P,P]", "[R,R]", g);
  CHECK(steps_of(pr) == V{{1, C::reduce_scatter}, {0, C::all_reduce}, {1, C::all_gather}});
  CHECK(pr[0].to == Shard(0));  // the dim with the most elements (ties: the first)
  // Its price is the hand formula of docs/autosharding.md, term by term.
  const double B = 1024.0 * 1024 * 64 * 2;
  const link_model a = m.link(0), b = m.link(1);
  const double hand = 2 * (b.alpha + 3 * b.hop + 0.75 * B / b.beta) + (a.alpha + 2 * a.hop + 2 * 0.5 * (B / 4) / a.beta);
  CHECK(price_plan(m, pr, g, dtype::bf16).seconds == doctest::Approx(hand).epsilon(1e-12));
  // ... about a third of two full-size all-reduces one axis after the other.
  const double flat = collective_time(C::all_reduce, a, 2, B) + collective_time(C::all_reduce, b, 4, B);
  CHECK(price_plan(m, pr, g, dtype::bf16).seconds < 0.4 * flat);
  // [P,P] -> S01: the fast axis scatters a dim the slow axis does not need, the slow axis
  // reduce-scatters its own, and an all-to-all inside the node puts dim 0 in place.
  const redist_plan ps = steps(m, "[P,P]", "S01RR", g);
  CHECK(steps_of(ps) == V{{1, C::reduce_scatter}, {0, C::reduce_scatter}, {1, C::all_to_all}});
  const double rs_fast = b.alpha + 3 * b.hop + 0.75 * B / b.beta, rs_slow = a.alpha + a.hop + 0.5 * (B / 4) / a.beta,
               a2a = b.alpha + 3 * b.hop + 0.75 * (B / 8) / b.beta;
  CHECK(price_plan(m, ps, g, dtype::bf16).seconds == doctest::Approx(rs_fast + rs_slow + a2a).epsilon(1e-12));
  // DTensor's order (slow axis first, at full size) costs almost three times as much.
  const double slow_first = (a.alpha + a.hop + 0.5 * B / a.beta) + (b.alpha + 3 * b.hop + 0.75 * (B / 2) / b.beta);
  CHECK(price_plan(m, ps, g, dtype::bf16).seconds < 0.4 * slow_first);
  // The target's own dim is scattered when the slow axis does not need it.
  CHECK(steps_of(steps(m, "[P,P]", "RS1R", g)) == V{{1, C::reduce_scatter}, {0, C::all_reduce}});
  // The links decide which axis is fast: swap them and the order swaps.
  device_mesh swapped{2, 4};
  swapped.set_link(0, b).set_link(1, a);
  CHECK(steps_of(steps(swapped, "[P,P]", "[R,R]", g)) == V{{0, C::reduce_scatter}, {1, C::all_reduce}, {0, C::all_gather}});
  // A dim smaller than the axis is never scattered (padding would outweigh the data), and a
  // scalar has no dim: both fall back to one all-reduce per axis.
  CHECK(steps_of(steps(m, "[P,P]", "[R,R]", {3})) == V{{0, C::all_reduce}, {1, C::all_reduce}});
  CHECK(steps_of(plan_redistribute(m, parse_spec("[P,P]", 2, 0), parse_spec("[R,R]", 2, 0))) ==
        V{{0, C::all_reduce}, {1, C::all_reduce}});
  // Without a shape the first free dim is scattered; the plan is still a constant.
  constexpr redist_plan cp = plan_redistribute(device_mesh{2, 2}, parse_spec("[P,P]", 2, 2), parse_spec("[R,R]", 2, 2));
  static_assert(cp.size() == 3 && cp[0].mesh_axis == 1 && cp[0].kind == collective::reduce_scatter &&
                cp[1].kind == collective::all_reduce && cp[2].kind == collective::all_gather);
}

TEST_CASE("size-1 mesh axes never communicate") {
  using C = collective;
  using V = std::vector<std::pair<int, collective>>;
  const device_mesh m14{1, 4}, m122{1, 2, 2};
  const auto a = parse_spec("[S(0),R]"), b = parse_spec("[R,S(0)]");
  CHECK(steps_of(plan_redistribute(m14, a, b)) == V{{1, C::local_slice}});
  CHECK(steps_of(plan_redistribute(a, b)) == V{{0, C::all_gather}, {1, C::local_slice}});  // sizes unknown
  // A Shard on a size-1 axis is not a sharded source (DTensor counts shards): one outward pass.
  const auto p = parse_spec("[S(0),P,P]"), r = parse_spec("[R,R,R]", 3, 1);
  CHECK(steps_of(plan_redistribute(m122, p, r)) == V{{2, C::reduce_scatter}, {1, C::all_reduce}, {2, C::all_gather}});
  CHECK(steps_of(plan_redistribute(device_mesh{2, 2, 2}, p, r)) ==
        V{{2, C::reduce_scatter}, {1, C::all_reduce}, {2, C::all_gather}, {0, C::all_gather}});
  const int sizes[] = {1, 4};
  CHECK(steps_of(plan_redistribute(a, b, sizes)) == V{{1, C::local_slice}});
  // Pricing a size-1 axis costs nothing, even in a plan made without the mesh.
  CHECK(collective_time(C::all_reduce, {}, 1, 1e9) == 0.0);
  const auto unsized = price_plan(m14, plan_redistribute(a, b), {8}, dtype::f32);
  REQUIRE(unsized.size() == 2);
  CHECK(unsized[0].bytes == 0);
  CHECK(unsized[0].seconds == 0.0);
  CHECK(unsized.seconds == 0.0);
}

TEST_CASE("impossible redistributions are spec_errors that name the axis") {
  CHECK(error_of(parse_spec("[S(0),R]"), parse_spec("[P,R]", 2, 1)) ==
        "spec error: cannot redistribute Shard to Partial on mesh axis 0 (a shard holds no partial "
        "value); go through Replicate explicitly");
  CHECK(error_of(parse_spec("[R,P]", 2, 1), parse_spec("[R,P(max)]", 2, 1)) ==
        "spec error: cannot redistribute Partial(op) into a different Partial on mesh axis 1; reduce "
        "to Replicate first");
  // Rejected whatever the order of steps would be, even next to a valid axis.
  CHECK_THROWS_AS(plan_redistribute(parse_spec("[P,S(0)]"), parse_spec("[R,P]", 2, 1)), spec_error);
  CHECK(error_of(parse_spec("[S(0)]"), parse_spec("[S(0),R]")).find("meshes of 1 and 2 axes") != std::string::npos);
  CHECK(error_of(parse_spec("[S(0)]"), parse_spec("[S(1)]")).find("tensors of rank 1 and 2") != std::string::npos);
  CHECK_THROWS_AS(plan_redistribute(device_mesh{4}, parse_spec("S0R", 2), parse_spec("RR", 2)), spec_error);
  // P -> P with the same op and S(d) -> S(d) are no-ops.
  CHECK(plan_redistribute(parse_spec("[P(max),S(1)]"), parse_spec("[P(max),S(1)]")).empty());
}

TEST_CASE("cost: worked numbers of the alpha-beta model") {
  // A [1024, 768] f32 weight on 2 nodes x 4 GPUs: gather S(0) over the 2 nodes.
  const device_mesh m = make_mesh_2d(2, 4, 25e9, 300e9);
  const auto plan = plan_redistribute(m, parse_spec("S0R", 2), parse_spec("RR", 2));
  const auto c = price_plan(m, plan, {1024, 768}, dtype::f32);
  REQUIRE(c.size() == 1);
  CHECK(c[0].bytes == 1024 * 768 * 4);
  CHECK(c[0].seconds == doctest::Approx(2e-5 + 0.5 * 1024 * 768 * 4 / 25e9).scale(1e-9));
  CHECK(c[0].sent_bytes == 1024 * 768 * 2);
  CHECK(redistribute_seconds(m, parse_spec("S0R", 2), parse_spec("RR", 2), {1024, 768}, dtype::f32) == c.seconds);
  // Uneven: 5 rows over 4 GPUs are padded to 2 each, so 8 rows are gathered.
  const auto u = price_plan(m, plan_redistribute(m, parse_spec("S1R", 2), parse_spec("RR", 2)), {5, 10}, dtype::bf16);
  CHECK(u[0].bytes == 8 * 10 * 2);
  CHECK(u[0].seconds == doctest::Approx(5e-6 + 0.75 * 160 / 300e9).scale(1e-9));
  // All-reduce: one latency (NCCL runs it as one kernel) and twice the volume.
  const auto ar = price_plan(m, plan_redistribute(m, parse_spec("RRP1", 2), parse_spec("RR", 2)), {6, 6}, dtype::f64);
  CHECK(ar[0].bytes == 36 * 8);
  CHECK(ar[0].seconds == doctest::Approx(5e-6 + 2 * 0.75 * 288 / 300e9).scale(1e-9));
  // Per-step latency: a ring all-reduce over 4 ranks has 6 steps, an all-gather 3.
  const link_model hop{5e-6, 300e9, 1e-6};
  CHECK(collective_time(collective::all_reduce, hop, 4, 288) == doctest::Approx(5e-6 + 6e-6 + 1.5 * 288 / 300e9).scale(1e-9));
  CHECK(collective_time(collective::all_gather, hop, 4, 288) == doctest::Approx(5e-6 + 3e-6 + 0.75 * 288 / 300e9).scale(1e-9));
  // A gradient bucket over both axes: reduce-scatter + all-gather on the fast axis, all-reduce of a quarter on the slow.
  CHECK(hierarchical_all_reduce_seconds(m, 0b11, 4e6) ==
        doctest::Approx(2 * (5e-6 + 0.75 * 4e6 / 300e9) + 2e-5 + 2 * 0.5 * 1e6 / 25e9).scale(1e-9));
  CHECK(hierarchical_all_reduce_seconds(m, 0b01, 4e6) == doctest::Approx(collective_time(collective::all_reduce, m.link(0), 2, 4e6)).scale(1e-9));
  CHECK(hierarchical_all_reduce_seconds(device_mesh{1, 4}, 0b01, 4e6) == 0.0);
  CHECK(ar[0].sent_bytes == 432);
  // Local steps are free.
  const auto sl = price_plan(m, plan_redistribute(m, parse_spec("RR", 2), parse_spec("S01R", 2)), {8, 8}, dtype::f32);
  CHECK(sl.size() == 2);
  CHECK(sl.seconds == 0.0);
  CHECK(collective_time(collective::local_slice, {}, 4, 1e9) == 0.0);
  CHECK(bytes_sent_per_rank(collective::all_to_all, 4, 400) == 300);
  // The typed front end prices with the link model it is given, on its own mesh sizes only.
  using W = sharded_tensor<float, mesh_extents<2, 4>, "S0R", 1024, 768>;
  CHECK(W::cost_to<"RR">(m).seconds == doctest::Approx(c.seconds).scale(1e-9));
  CHECK_THROWS_AS(W::cost_to<"RR">(device_mesh{4, 2}), shape_error);
  // Plans and steps print.
  std::ostringstream os;
  os << plan_redistribute(m, parse_spec("[S(0),S(0)]"), parse_spec("[R,S(0)]"));
  CHECK(os.str() ==
        "[S(0),S(0)] -> [R,S(0)]:\n  axis 1: all-gather S(0) -> R\n  axis 0: all-gather S(0) -> R\n"
        "  axis 1: local-slice R -> S(0)");
}
