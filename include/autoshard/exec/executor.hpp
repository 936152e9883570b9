#pragma once
/// Running a graph: unsharded on one host, or sharded by a plan on the ranks of a mesh.
///   std::vector<host_tensor> ref = autoshard::run_unsharded<double>(g, sources);
///   autoshard::run_sharded<double>(mc, g, plan, sources, [&](vertex_t v, const host_tensor& piece,
///                                                        const sharding_spec& spec) { ... });
/// In the sharded run each rank holds only its piece of every tensor. Before an operator
/// runs, each operand is redistributed from the spec its producer's strategy outputs to the
/// spec the operator's strategy takes (the plan's resharding collectives, on real
/// communicators); the kernel then computes the rank's piece of the output, which may be a
/// partial sum (a Partial placement) that a later redistribute reduces.
#include <chrono>      // std::chrono::steady_clock
#include <cstdint>     // std::uint64_t
#include <cstring>     // std::memcpy
#include <functional>  // std::function
#include <mutex>       // std::mutex, std::lock_guard
#include <random>      // std::mt19937_64, std::uniform_real_distribution
#include <string>      // std::string
#include <utility>     // std::pair
#include <vector>      // std::vector

#include "../comm/mesh_communicator.hpp"  // mesh_communicator_like
#include "../core/layout.hpp"        // local_box
#include "../graph/fused.hpp"        // fused_dims
#include "../graph/strategy.hpp"     // model_graph, strategy
#include "../graph/traffic.hpp"      // traffic_site
#include "../graph/validate.hpp"     // topological_order
#include "../tensor/slice.hpp"       // shard_of
#include "backward.hpp"              // backward_reads_operand
#include "schedule.hpp"              // liveness_schedule: when a value is freed
#include "kernels.hpp"               // run_kernel, local_context
#include "redistribute.hpp"          // redistribute (host tensors)
#include "traffic.hpp"               // detail::charge, traffic_site

namespace autoshard {

/// The dtype a run computes float tensors in.
template <class T>
constexpr dtype compute_dtype() {
  return std::is_same_v<T, float> ? dtype::f32 : dtype::f64;
}

namespace detail {
inline bool integer_node(const node& n) { return is_integer(n.type); }

/// The exclusive upper bound a consumer of integer source `u` puts on its values, and that
/// consumer: table rows for embedding ids, the vocabulary for labels (the smallest over its
/// consumers); 0 when none says.
inline std::pair<std::int64_t, vertex_t> integer_bound(const model_graph& g, vertex_t u) {
  std::pair<std::int64_t, vertex_t> bound{0, u};
  for (auto [e, end] = boost::out_edges(u, g); e != end; ++e) {
    const vertex_t v = boost::target(*e, g);
    const std::vector<vertex_t> ops = operands(g, v);
    std::int64_t range = 0;
    if (g[v].kind == op_kind::embedding && g[*e].operand == 0) range = g[ops[1]].shape[0];
    if (g[v].kind == op_kind::cross_entropy && g[*e].operand == 1) {
      const tensor_shape& l = g[ops[0]].shape;
      range = l[l.rank - 1u];
    }
    if (range > 0 && (bound.first == 0 || range < bound.first)) bound = {range, v};
  }
  return bound;
}

/// The exclusive upper bound of the integer values source `u` feeds: table rows for embedding
/// ids, the vocabulary for labels; 2 when no consumer says.
inline std::int64_t integer_range(const model_graph& g, vertex_t u) {
  const std::int64_t range = integer_bound(g, u).first;
  return range > 0 ? range : 2;
}

inline std::uint64_t name_seed(std::uint64_t seed, const std::string& name) {
  std::uint64_t h = 1469598103934665603ull ^ seed;  // FNV-1a over the name, keyed by the seed
  for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ull;
  return h;
}
}  // namespace detail

/// Throws exec_error when the positions make_source_values feeds overrun a table they index:
/// a graph input named position_ids counts 0 to S - 1 (S its last dim), and an embedding
/// whose table has fewer than S rows failed only on a rank once every rank ran (`verify --seq
/// 2048` of GPT-2's 1024 positions: "id 1024 outside the table of 1024 rows"). `what` comes
/// first in the message (a flag that set S).
inline void check_position_tables(const model_graph& g, const std::string& what = "") {
  for (vertex_t u = 0; u < boost::num_vertices(g); ++u) {
    const node& nd = g[u];
    if (!nd.is_input() || nd.name != "position_ids" || nd.shape.rank == 0) continue;
    const std::int64_t positions = nd.shape[nd.shape.rank - 1u];
    for (auto [e, end] = boost::out_edges(u, g); e != end; ++e) {
      const vertex_t v = boost::target(*e, g);
      if (g[v].kind != op_kind::embedding || g[*e].operand != 0) continue;
      const vertex_t table = operands(g, v)[1];
      const std::int64_t rows = g[table].shape[0];
      // A table read past its offset or a key/value cache's tokens (graph/builders.hpp position_rows):
      // the rows of the parameter that slice keeps.
      const bool sliced = g[table].kind == op_kind::split && g[table].attrs.axis == 0;
      if (positions > rows)
        throw exec_error((what.empty() ? std::string() : what + ": ") + "position_ids " + to_string(nd.shape) + " count positions 0 to " +
                         std::to_string(positions - 1) + ", but " + quoted_text(g[v].name) + " (embedding) looks them up in " +
                         quoted_text(g[table].name) + ", a table of " + std::to_string(rows) + " rows" +
                         (sliced ? " (rows " + std::to_string(g[table].attrs.start) + ".. of " + quoted_text(g[operands(g, table)[0]].name) +
                                       ", past its offset and the key/value cache's tokens)"
                                 : std::string()) +
                         ": a sequence is at most " + std::to_string(rows) + " positions, the model's position table");
    }
  }
}

/// The seeded value of source vertex `v` (an input or a parameter). Integer inputs get ids
/// inside the range their consumers accept (position_ids count 0 to S - 1); weight matrices are
/// uniform in +-sqrt(3/fan) (fan = their larger dim), norm weights near 1, other vectors small.
/// It depends on the seed and the vertex name only, not on vertex order.
template <class T>
host_tensor make_source_value(const model_graph& g, vertex_t v, std::uint64_t seed = 1) {
  const node& nd = g[v];
  std::mt19937_64 rng(detail::name_seed(seed, nd.name));
  if (detail::integer_node(nd)) {
    host_tensor t(dtype::i64, nd.shape);
    std::uniform_int_distribution<std::int64_t> u(0, detail::integer_range(g, v) - 1);
    std::int64_t* p = t.as<std::int64_t>();
    if (nd.name == "position_ids")  // positions count up, as a model feeds them
      for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = i % nd.shape[nd.shape.rank - 1u];
    else
      for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = u(rng);
    return t;
  }
  host_tensor t(compute_dtype<T>(), nd.shape);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  double scale = 1.0, base = 0.0;
  if (nd.is_parameter() && nd.shape.rank >= 2) {
    std::int64_t fan = 1;
    for (std::size_t d = 0; d < nd.shape.rank; ++d) fan = std::max(fan, nd.shape[d]);
    scale = std::sqrt(3.0 / static_cast<double>(fan));
  } else if (nd.is_parameter()) {
    const bool norm_weight = nd.name.size() >= 7 && nd.name.compare(nd.name.size() - 7, 7, ".weight") == 0;
    base = norm_weight ? 1.0 : 0.0;
    scale = 0.1;
  }
  T* p = t.as<T>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<T>(base + scale * u(rng));
  return t;
}

/// Seeded values for every source vertex (inputs and parameters; make_source_value), indexed
/// by vertex; operator entries stay empty.
template <class T>
std::vector<host_tensor> make_source_values(const model_graph& g, std::uint64_t seed = 1) {
  std::vector<host_tensor> out(boost::num_vertices(g));
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
    if (!g[v].is_operator()) out[v] = make_source_value<T>(g, v, seed);
  return out;
}

/// Throws exec_error unless `sources` holds a value of every source vertex of `g` (indexed by
/// vertex; operator entries ignored) that a run computing in `compute` can read: the vertex's
/// shape, i64 for an integer input and `compute` for the rest, and every id inside the range
/// its consumers accept (an embedding's table rows, the vocabulary of labels). Checked before
/// a rank starts: an id outside the table failed on a rank half-way through the run.
inline void check_source_values(const model_graph& g, const std::vector<host_tensor>& sources, dtype compute) {
  const std::size_t n = boost::num_vertices(g);
  if (sources.size() != n)
    throw exec_error(std::to_string(sources.size()) + " source values for a graph of " + std::to_string(n) + " vertices");
  for (vertex_t v = 0; v < n; ++v) {
    const node& nd = g[v];
    if (nd.is_operator()) continue;
    const host_tensor& t = sources[v];
    const dtype want = detail::integer_node(nd) ? dtype::i64 : compute;
    if (t.data() == nullptr && t.numel() > 0)
      throw exec_error("source " + quoted_text(nd.name) + " has no value");
    if (!(t.shape() == nd.shape) || t.type() != want)
      throw exec_error("source " + quoted_text(nd.name) + " is " + to_string(nd.shape) + " " + std::string(to_string(want)) +
                       " in the graph but its value is " + to_string(t.shape()) + " " + std::string(to_string(t.type())));
    if (want != dtype::i64) continue;
    const auto [range, by] = detail::integer_bound(g, v);
    if (range == 0) continue;
    const std::int64_t* p = t.as<std::int64_t>();
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      if (p[i] >= 0 && p[i] < range) continue;
      std::string at;
      for (std::int64_t k = i, d = static_cast<std::int64_t>(nd.shape.rank); d-- > 0;) {
        at = std::to_string(k % nd.shape[static_cast<std::size_t>(d)]) + (at.empty() ? "" : "," + at);
        k /= nd.shape[static_cast<std::size_t>(d)];
      }
      throw exec_error("source " + quoted_text(nd.name) + " holds " + std::to_string(p[i]) + " at [" + at + "], outside 0 to " +
                       std::to_string(range - 1) + ": " + quoted_text(g[by].name) +
                       (g[by].kind == op_kind::embedding ? " (embedding) looks it up in a table of " + std::to_string(range) + " rows"
                                                         : " (cross_entropy) has a vocabulary of " + std::to_string(range)));
    }
  }
}

/// Every vertex's value computed on one host, indexed by vertex. `sources` holds the value
/// of each input and parameter (make_source_values); operator entries are ignored.
template <class T>
std::vector<host_tensor> run_unsharded(const model_graph& g, const std::vector<host_tensor>& sources);

namespace detail {
/// Keeps only the shape of an operator's value (host_tensor::shape_only): its bytes are freed.
inline void keep_shape_only(host_tensor& t) {
  if (t.data() != nullptr) t = host_tensor::shape_only(t.type(), t.shape());
}

/// run_unsharded's loop: every operator's value, and with `copy_sources` a copy of every
/// source (else the sources' entries stay empty and the kernels read `sources` in place).
/// With a training `schedule` (liveness_schedule), a value is freed where it says (a
/// shape-only stand-in stays).
template <class T>
std::vector<host_tensor> forward_unsharded(const model_graph& g, const std::vector<host_tensor>& sources, bool copy_sources,
                                           const liveness_schedule* schedule = nullptr) {
  const std::size_t n = boost::num_vertices(g);
  if (sources.size() != n)
    throw exec_error("run_unsharded: " + std::to_string(sources.size()) + " source values for a graph of " +
                     std::to_string(n) + " vertices");
  std::vector<host_tensor> val(n);
  for (vertex_t v : topological_order(g)) {
    const node& nd = g[v];
    if (!nd.is_operator()) {
      if (!(sources[v].shape() == nd.shape))
        throw exec_error("source " + quoted_text(nd.name) + " is " + to_string(nd.shape) + " but its value is " + to_string(sources[v].shape()));
      if (copy_sources) val[v] = host_tensor::copy_of(sources[v]);
      continue;
    }
    std::vector<const host_tensor*> in;
    std::vector<tensor_shape> shapes;
    for (vertex_t u : operands(g, v)) {
      in.push_back(g[u].is_operator() ? &val[u] : &sources[u]);
      shapes.push_back(g[u].shape);
    }
    val[v] = run_kernel<T>(nd, in, whole_context(shapes, nd.shape));
    if (schedule == nullptr) continue;
    for (vertex_t u : schedule->forward_frees[v]) keep_shape_only(val[u]);
    if (schedule->forward_frees_itself[v]) keep_shape_only(val[v]);
  }
  return val;
}
}  // namespace detail

template <class T>
std::vector<host_tensor> run_unsharded(const model_graph& g, const std::vector<host_tensor>& sources) {
  return detail::forward_unsharded<T>(g, sources, true);
}

namespace detail {
/// `from` -> `to` on real ranks. Shard -> Partial goes through Replicate (a shard holds no
/// partial value): all-gather, then the local Partial conversion.
template <mesh_communicator_like M>
host_tensor reshard_plain(M& mc, const host_tensor& local, const tensor_shape& global, const sharding_spec& from,
                          const sharding_spec& to) {
  if (from == to) return host_tensor::copy_of(local);
  sharding_spec mid = to;
  bool via = false;
  for (std::size_t a = 0; a < to.mesh_rank; ++a)
    if (to[a].is_partial() && from[a].is_shard()) {
      mid[a] = Replicate();
      via = true;
    }
  if (!via) return redistribute(mc, local.view(), global, from, to);
  host_tensor r = redistribute(mc, local.view(), global, from, mid);
  return redistribute(mc, r.view(), global, mid, to);
}

/// reshard_plain for a tensor whose dim `fused` is fused parts (graph/fused.hpp): the same
/// plan on core's fused_view, where a per-part Shard is a plain one, so gathers, slices and
/// all-to-alls of the fused dim keep the per-part layout (the pieces are the same bytes).
template <mesh_communicator_like M>
host_tensor reshard(M& mc, const host_tensor& local, const tensor_shape& global, const sharding_spec& from,
                    const sharding_spec& to, fused_dim fused = {}) {
  if (!fused.any() || from == to) return reshard_plain(mc, local, global, from, to);
  host_tensor view(local.type(), fused_view(fused, local.shape()));  // the same bytes, one dim more
  if (local.nbytes() > 0) std::memcpy(view.data(), local.data(), local.nbytes());
  const host_tensor moved = reshard_plain(mc, view, fused_view(fused, global), fused_view(fused, from), fused_view(fused, to));
  tensor_shape back = moved.shape();  // the view's dims fused.dim and fused.dim + 1 merged again
  const auto d = static_cast<std::size_t>(fused.dim);
  back[d] *= back[d + 1];
  for (std::size_t i = d + 1; i + 1 < back.rank; ++i) back[i] = back[i + 1];
  back[--back.rank] = 0;
  host_tensor out(moved.type(), back);
  if (out.nbytes() > 0) std::memcpy(out.data(), moved.data(), out.nbytes());
  return out;
}
}  // namespace detail

/// Called with each vertex's local piece as soon as it is computed, and its spec.
using piece_callback = std::function<void(vertex_t, const host_tensor& piece, const sharding_spec& spec)>;

namespace detail {
/// A value an executor holds: its own tensor, or a read-only alias of one that outlives it
/// (a replicated source read in place instead of copied once per rank).
struct held_value {
  host_tensor own;
  const host_tensor* alias = nullptr;
  const host_tensor& get() const noexcept { return alias ? *alias : own; }
  void reset() noexcept {
    own = host_tensor();
    alias = nullptr;
  }
};

/// What an operator's forward saw on this rank, kept for its backward.
struct saved_forward {
  std::vector<host_tensor> own;        ///< operands this rank resharded (empty: read in place)
  std::vector<const host_tensor*> in;  ///< every operand piece (null: a resharded parameter, gathered again)
  local_context c;
};

inline bool whole_on_every_rank(const sharding_spec& s) {
  for (std::size_t a = 0; a < s.mesh_rank; ++a)
    if (!s[a].is_replicate()) return false;
  return true;
}
}  // namespace detail

/// The unsharded run computed on demand and forgotten as soon as it is no longer needed:
/// value(v) computes the graph in topological order up to v; a value is kept until every
/// consumer has run and release(v) has been called `watchers` times (once per rank that
/// compares with it). Sources are read in place. Thread-safe: ranks of one process share one.
template <class T>
class reference_stream {
 public:
  reference_stream(const model_graph& g, const std::vector<host_tensor>& sources, int watchers)
      : g_(g), sources_(sources), order_(topological_order(g)), val_(boost::num_vertices(g)),
        pending_(boost::num_vertices(g), 0), done_(boost::num_vertices(g), false) {
    const std::size_t n = boost::num_vertices(g);
    if (sources.size() != n)
      throw exec_error("the reference run: " + std::to_string(sources.size()) + " source values for a graph of " +
                       std::to_string(n) + " vertices");
    for (vertex_t v = 0; v < n; ++v) {
      pending_[v] = boost::out_degree(v, g) + (g[v].is_operator() ? static_cast<std::size_t>(watchers) : 0);
      if (!g[v].is_operator() && !(sources[v].shape() == g[v].shape))
        throw exec_error("source " + quoted_text(g[v].name) + " is " + to_string(g[v].shape) + " but its value is " +
                         to_string(sources[v].shape()));
    }
  }

  /// The unsharded value of v; valid until this caller's release(v).
  const host_tensor& value(vertex_t v) {
    std::lock_guard<std::mutex> lock(mu_);
    while (!done_[v]) step();
    return val_[v].get();
  }

  void release(vertex_t v) {
    std::lock_guard<std::mutex> lock(mu_);
    drop(v);
  }

  /// The most bytes the reference held at once so far.
  std::uint64_t peak_bytes() const noexcept { return peak_; }
  /// Seconds spent computing the reference so far.
  double seconds() const noexcept { return seconds_; }

 private:
  void drop(vertex_t v) {
    if (pending_[v] > 0 && --pending_[v] == 0 && g_[v].is_operator()) {
      held_ -= val_[v].get().nbytes();
      val_[v].reset();
    }
  }
  void step() {
    const auto t0 = std::chrono::steady_clock::now();
    const vertex_t v = order_[next_++];
    const node& nd = g_[v];
    if (!nd.is_operator()) {
      val_[v].alias = &sources_[v];
    } else {
      const std::vector<vertex_t> ops = operands(g_, v);
      std::vector<const host_tensor*> in;
      std::vector<tensor_shape> shapes;
      for (vertex_t u : ops) {
        in.push_back(&val_[u].get());
        shapes.push_back(g_[u].shape);
      }
      val_[v].own = run_kernel<T>(nd, in, whole_context(shapes, nd.shape));
      held_ += val_[v].own.nbytes();
      peak_ = std::max(peak_, held_);
      for (vertex_t u : ops) drop(u);
    }
    done_[v] = true;
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  const model_graph& g_;
  const std::vector<host_tensor>& sources_;
  std::vector<vertex_t> order_;
  std::vector<detail::held_value> val_;
  std::vector<std::size_t> pending_;
  std::vector<bool> done_;
  std::size_t next_ = 0;
  std::uint64_t held_ = 0, peak_ = 0;
  double seconds_ = 0.0;
  std::mutex mu_;
};

namespace detail {

/// Throws exec_error unless `plan` and `sources` have one entry per vertex of `g`.
inline void check_plan_size(const model_graph& g, const std::vector<strategy>& plan, const std::vector<host_tensor>& sources) {
  const std::size_t n = boost::num_vertices(g);
  if (plan.size() != n)
    throw exec_error("the plan has " + std::to_string(plan.size()) + " strategies for a graph of " + std::to_string(n) + " vertices");
  if (sources.size() != n)
    throw exec_error("run_sharded: " + std::to_string(sources.size()) + " source values for a graph of " +
                     std::to_string(n) + " vertices");
}

/// Source v's piece of `value` on this rank: read in place when every rank holds it whole.
inline void load_source(const model_graph& g, vertex_t v, const strategy& st, const host_tensor& value, const device_mesh& mesh,
                        int rank, const fused_dim& fused, held_value& out) {
  const node& nd = g[v];
  if (!(value.shape() == nd.shape))
    throw exec_error("source " + quoted_text(nd.name) + " is " + to_string(nd.shape) + " but its value is " + to_string(value.shape()));
  for (std::size_t a = 0; a < st.output.mesh_rank; ++a)
    if (st.output[a].is_partial()) throw exec_error("source " + quoted_text(nd.name) + " cannot start Partial (" + to_alpa_string(st.output) + ")");
  if (detail::whole_on_every_rank(st.output)) out.alias = &value;
  else out.own = shard_of(value, mesh, st.output, rank, split_rule::chunk, fused);
}

/// Operator v's kernel context on this rank: its operands' global shapes and this rank's
/// offsets in them, its output's, and (a vocabulary-parallel loss) how the row statistics
/// are combined over the mesh axes that split the vocabulary.
template <mesh_communicator_like M>
local_context operator_context(M& mc, const model_graph& g, vertex_t v, const std::vector<vertex_t>& ops, const strategy& st) {
  const device_mesh& mesh = mc.mesh();
  local_context c;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    c.global_in.push_back(g[ops[i]].shape);
    c.in_offset.push_back(local_box(mesh, st.inputs[i], g[ops[i]].shape, mc.rank()).offset);
  }
  c.global_out = g[v].shape;
  c.out_shape = local_box(mesh, st.output, g[v].shape, mc.rank()).shape;
  if (g[v].kind == op_kind::cross_entropy) {
    // The vocabulary dim is forced Replicate except in the vocab-parallel strategy: then the
    // row statistics are combined over every mesh axis that splits it.
    const int vdim = static_cast<int>(g[ops[0]].shape.rank) - 1;
    std::vector<std::size_t> axes;
    for (std::size_t a = 0; a < mesh.ndim(); ++a)
      if (st.inputs[0][a].is_shard(vdim)) axes.push_back(a);
    if (!axes.empty())
      c.vocab_reduce = [&mc, axes](void* p, std::size_t count, dtype t, reduce_op op) {
        for (std::size_t a : axes) mc.axis(a).all_reduce(p, count, t, op);
      };
  }
  return c;
}

/// Operator v's piece on this rank into val[v]: each operand redistributed to the spec v's
/// strategy takes it in (into `local[i]`; read in place when it already is), then the kernel.
/// `again`: the forward of a fully recomputed layer run again for its backward, where a weight
/// gathered is the one the backward would gather again (charged to its gradient's site).
template <class T, mesh_communicator_like M>
local_context run_operator(M& mc, const model_graph& g, const std::vector<strategy>& plan, vertex_t v,
                           const std::vector<fused_dim>& fused, std::vector<held_value>& val, std::vector<host_tensor>& local,
                           std::vector<const host_tensor*>& in, bool again = false) {
  const node& nd = g[v];
  const strategy& st = plan[v];
  const std::vector<vertex_t> ops = operands(g, v);
  if (st.inputs.size() != ops.size())
    throw exec_error("vertex " + quoted_text(nd.name) + ": strategy " + st.name + " has " + std::to_string(st.inputs.size()) +
                     " operand specs for " + std::to_string(ops.size()) + " operands");
  local.clear();
  local.resize(ops.size());
  in.clear();
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const vertex_t u = ops[i];
    if (plan[u].output == st.inputs[i]) {
      in.push_back(&val[u].get());  // already in the spec the operator takes: no copy
    } else {
      const auto site = detail::charge(mc, again && g[u].is_parameter() ? traffic_site::gradient(u) : traffic_site::edge(v, i));
      local[i] = detail::reshard(mc, val[u].get(), g[u].shape, plan[u].output, st.inputs[i], fused[u]);
      in.push_back(&local[i]);
    }
  }
  local_context c = operator_context(mc, g, v, ops, st);
  {
    const auto site = detail::charge(mc, traffic_site::op(v));
    val[v].own = run_kernel<T>(nd, in, c);
  }
  if (!(val[v].own.shape() == c.out_shape))
    throw exec_error("vertex " + quoted_text(nd.name) + " under " + st.name + ": rank " + std::to_string(mc.rank()) + " computed a piece of " +
                     to_string(val[v].own.shape()) + ", its output spec " + to_alpa_string(st.output) + " gives " +
                     to_string(c.out_shape));
  return c;
}

/// What operator v's backward needs of its forward on this rank: the operand pieces it
/// resharded (a resharded weight is not kept, the backward gathers it again, unless
/// `keep_weights`: a recomputed forward right before the backward; an operand the backward
/// reads only the shape of keeps only its shape), and the context.
inline void keep_for_backward(const model_graph& g, const std::vector<strategy>& plan, vertex_t v, std::vector<held_value>& val,
                              std::vector<host_tensor>&& local, local_context&& c, saved_forward& sv, bool keep_weights = false) {
  const std::vector<vertex_t> ops = operands(g, v);
  sv.own = std::move(local);
  sv.in.clear();
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (!keep_weights && sv.own[i].data() != nullptr && g[ops[i]].is_parameter()) {
      sv.own[i] = host_tensor();
      sv.in.push_back(nullptr);
      continue;
    }
    if (!backward_reads_operand(g[v].kind, i)) keep_shape_only(sv.own[i]);  // its shape is all the backward needs
    sv.in.push_back(sv.own[i].data() != nullptr || !(plan[ops[i]].output == plan[v].inputs[i]) ? &sv.own[i] : &val[ops[i]].get());
  }
  sv.c = std::move(c);
}

/// run_sharded's forward into `val`, freeing values where `schedule` says (an inference
/// schedule frees each at its last consumer; a training one keeps what a backward reads, and
/// leaves a shape-only stand-in). With `keep`, every operator's operand pieces and context
/// are kept there for the backward (but for a fully recomputed layer's: its forward runs
/// again before its backward). An input with a value in `batch_inputs` (one micro-step's
/// rows of the global batch) reads it instead of `sources`; one with a value in `received`
/// (a pipeline stage's activation from the stage before) takes it as this rank's piece.
template <class T, mesh_communicator_like M>
void forward_sharded(M& mc, const model_graph& g, const std::vector<strategy>& plan, const std::vector<host_tensor>& sources,
                     const piece_callback& on_piece, std::vector<held_value>& val, std::vector<saved_forward>* keep,
                     const liveness_schedule& schedule, const std::vector<host_tensor>* batch_inputs = nullptr,
                     const std::vector<host_tensor>* received = nullptr) {
  const std::size_t n = boost::num_vertices(g);
  const device_mesh& mesh = mc.mesh();
  check_plan_size(g, plan, sources);
  const std::vector<fused_dim> fused = fused_dims(g);  // tensors laid out per part when cut
  val.clear();
  val.resize(n);
  if (keep) {
    keep->clear();
    keep->resize(n);
  }
  const auto drop = [&](vertex_t u) { keep ? keep_shape_only(val[u].own) : val[u].reset(); };
  std::vector<host_tensor> local;
  std::vector<const host_tensor*> in;
  for (vertex_t v : schedule.order) {
    const node& nd = g[v];
    const strategy& st = plan[v];
    try {
      check_spec(st.output, mesh, nd.shape, "output of " + quoted_text(nd.name));
    } catch (const spec_error& e) {
      throw exec_error("vertex " + quoted_text(nd.name) + ": the plan's output spec does not fit: " + e.what());
    }
    if (received != nullptr && (*received)[v].data() != nullptr) {
      val[v].alias = &(*received)[v];
    } else if (!nd.is_operator()) {
      const bool batched = batch_inputs != nullptr && (*batch_inputs)[v].data() != nullptr;
      load_source(g, v, st, batched ? (*batch_inputs)[v] : sources[v], mesh, mc.rank(), fused[v], val[v]);
    } else {
      local_context c = run_operator<T>(mc, g, plan, v, fused, val, local, in);
      if (keep && !schedule.replayed[v]) keep_for_backward(g, plan, v, val, std::move(local), std::move(c), (*keep)[v]);
      else local.clear();  // the resharded operands: freed with the step (or run again before the backward)
      for (vertex_t u : schedule.forward_frees[v]) drop(u);
    }
    if (on_piece) on_piece(v, val[v].get(), st.output);
    if (schedule.forward_frees_itself[v]) drop(v);
  }
}
}  // namespace detail

/// Runs `g` sharded by `plan` (one strategy per vertex, index = vertex) on this rank of `mc`.
/// Every rank of the mesh calls it with the same graph, plan and sources (the global values
/// of inputs and parameters; each rank keeps only its own piece, as a loaded shard would be,
/// and reads a source it holds whole in place). `on_piece` sees every vertex's piece; a piece
/// is freed after its last consumer has run.
/// Throws exec_error for a plan that does not fit the graph, comm_error when a peer fails.
template <class T, mesh_communicator_like M>
void run_sharded(M& mc, const model_graph& g, const std::vector<strategy>& plan, const std::vector<host_tensor>& sources,
                 const piece_callback& on_piece = {}) {
  std::vector<detail::held_value> val;
  detail::check_plan_size(g, plan, sources);
  detail::forward_sharded<T>(mc, g, plan, sources, on_piece, val, nullptr, make_liveness_schedule(g, &plan, run_mode::inference));
}

}  // namespace autoshard
