#pragma once
/// Values computed from constants alone, and their evaluation. torch's dynamo exporter builds
/// an attention's mask at run time from positions (Range, Expand, GatherND, comparisons,
/// And), and the positions an embedding reads from a Range over the sequence: no graph input
/// and no weight reaches them, so they are constants of the planned shapes. Such values are
/// found in one pass over the sorted nodes (mark_constants); a value is evaluated
/// (evaluate) where a pattern needs its elements (is the mask causal?), within a byte budget
/// checked before each tensor is allocated; and a constant the graph still needs becomes a
/// constant input (emit.hpp), not a chain of operators that compute nothing of the data.
#include "../graph/elementwise.hpp"  // onnx_elementwise_function
#include "shapes.hpp"

namespace autoshard::detail::onnx_in {

/// The operators evaluate() knows: shape-only ones, the gathers and scans of torch's mask
/// builder, and ONNX's elementwise ones (onnx_elementwise_function: the arithmetic, comparisons
/// and logic of masks and positions). All are deterministic (no Random*, no Dropout), so a
/// value computed from constants with them is one constant.
inline bool evaluable(const onnx::NodeProto& n) {
  static const std::set<std::string, std::less<>> ops{
      "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Expand", "Cast", "Range", "Concat", "Slice",
      "Transpose", "Gather", "GatherND", "CumSum", "ConstantOfShape", "Shape", "Constant"};
  return reader::default_domain(n) && n.output_size() == 1 &&
         (ops.count(n.op_type()) || onnx_elementwise_function(n.op_type(), static_cast<std::size_t>(n.input_size())) != nullptr);
}

/// Whether value `name` is a constant the file holds: a Constant node's tensor, an integer
/// initializer or a scalar the exporter lifted; with `buffers_too`, also a buffer or tensor
/// constant (mark_buffers: LLaMA's rotary inv_freq, data the forward reads as the file holds
/// it). Never a graph input or a floating initializer that trains (a weight).
inline bool reader::holds_constant(const std::string& name, bool buffers_too) const {
  auto it = values.find(name);
  if (it == values.end() || !it->second.known || !it->second.init) return false;
  const value_info& v = it->second;
  return v.producer >= 0 || !is_float(v.type) || lifted_constant(name, v.shape.rank) || (buffers_too && buffers.count(name) > 0);
}

/// Both sets in one pass over the sorted nodes: computed_from_constants (what becomes a
/// constant input where the graph reads it), and computed_with_buffers, which also takes the
/// buffers for constants: a pattern may evaluate those (LLaMA's rotary cos/sin tables), but
/// unfused, a buffer stays the held input it is and what computes from it stays in the graph.
inline void reader::mark_constants() {
  computed_from_constants.clear();
  computed_with_buffers.clear();
  for (std::size_t k = 0; k < nodes.size(); ++k) {
    const onnx::NodeProto& n = *nodes[k];
    if (!evaluable(n) || n.output(0).empty()) continue;
    auto o = values.find(n.output(0));
    if (o == values.end() || !o->second.known || o->second.graph_output) continue;
    for (const bool buffers_too : {false, true}) {
      std::set<std::string>& set = buffers_too ? computed_with_buffers : computed_from_constants;
      bool all = n.input_size() > 0 || n.op_type() == "Constant";
      if (n.op_type() == "Shape") {  // its value is its input's inferred shape, whatever the input holds
        auto in = values.find(in_of(static_cast<int>(k), 0));
        all = in != values.end() && in->second.known;
      } else {
        for (const std::string& i : n.input()) {
          auto it = i.empty() ? values.end() : values.find(i);
          all = all && (i.empty() || (it != values.end() && it->second.known && (set.count(i) || holds_constant(i, buffers_too))));
        }
      }
      if (all) set.insert(n.output(0));
    }
  }
}

namespace constant_eval {

inline std::vector<std::int64_t> strides_of(const tensor_shape& s) {
  std::vector<std::int64_t> st(s.rank, 1);
  for (std::size_t d = s.rank; d-- > 1;) st[d - 1] = st[d] * s[d];
  return st;
}

/// The element offsets of a broadcasting operator's inputs (at most max_inputs) at one output element.
inline constexpr std::size_t max_inputs = 64;
using offsets = std::array<std::int64_t, max_inputs>;

/// Calls f(output flat index, input offsets) over `out`, each input broadcast to it (numpy:
/// aligned at the last dim, size 1 repeats). False when an input does not broadcast.
template <class F>
bool broadcast_loop(const tensor_shape& out, const std::vector<const tensor_shape*>& in, F&& f) {
  const std::size_t r = out.rank, k = in.size();
  if (k > max_inputs) return false;
  std::array<std::array<std::int64_t, max_tensor_rank>, max_inputs> st{};
  for (std::size_t i = 0; i < k; ++i) {
    const tensor_shape& s = *in[i];
    if (s.rank > r) return false;
    const std::vector<std::int64_t> own = strides_of(s);
    for (std::size_t d = 0; d < s.rank; ++d) {
      const std::size_t od = r - s.rank + d;
      if (s[d] == out[od]) st[i][od] = own[d];
      else if (s[d] != 1) return false;
    }
  }
  const std::int64_t n = out.numel();
  std::array<std::int64_t, max_tensor_rank> idx{};
  offsets off{};
  for (std::int64_t flat = 0; flat < n; ++flat) {
    f(flat, off);
    for (std::size_t d = r; d-- > 0;) {  // the next index, offsets carried along
      ++idx[d];
      for (std::size_t i = 0; i < k; ++i) off[i] += st[i][d];
      if (idx[d] < out[d]) break;
      for (std::size_t i = 0; i < k; ++i) off[i] -= st[i][d] * out[d];
      idx[d] = 0;
    }
  }
  return true;
}

inline double convert(double x, dtype t) {
  if (t == dtype::boolean) return x != 0.0 ? 1.0 : 0.0;
  if (!is_float(t)) return std::trunc(x);
  return x;
}

inline std::int64_t axis_of(std::int64_t a, std::size_t rank) { return a < 0 ? a + static_cast<std::int64_t>(rank) : a; }

/// x as an int64, saturated at its bounds (a Slice's end is often INT64_MAX, which a double
/// rounds to 2^63: converting that back is undefined); NaN as 0.
inline std::int64_t saturated(double x) {
  if (!(x == x)) return 0;
  if (x >= 9223372036854775807.0) return std::numeric_limits<std::int64_t>::max();
  if (x <= -9223372036854775808.0) return std::numeric_limits<std::int64_t>::min();
  return static_cast<std::int64_t>(x);
}

}  // namespace constant_eval

/// Evaluates node k's output from its inputs' values (`in`, one per input, null when the input
/// is absent); nullopt when the node's numbers are outside what the operator allows.
inline std::optional<dense_value> reader::evaluate_node(int k, const std::vector<const dense_value*>& in) const {
  using namespace constant_eval;
  const onnx::NodeProto& n = nd(k);
  const std::string& t = n.op_type();
  const value_info& ov = values.at(n.output(0));
  dense_value r;
  r.shape = ov.shape;
  r.type = ov.type;
  const std::int64_t count = r.shape.numel();
  const auto arg = [&](std::size_t i) -> const dense_value* { return i < in.size() ? in[i] : nullptr; };
  const auto ints = [&](std::size_t i) -> std::optional<std::vector<std::int64_t>> {
    const dense_value* a = arg(i);
    if (!a) return std::nullopt;
    std::vector<std::int64_t> v;
    for (std::size_t k = 0; k < a->size(); ++k) v.push_back(saturated((*a)[k]));
    return v;
  };
  if (t == "Constant") {
    auto c = constant(n.output(0), count);
    if (!c) return std::nullopt;
    for (double x : *c) r.push_back(x);
  } else if (t == "Shape") {
    const tensor_shape& s = values.at(in_of(k, 0)).shape;
    const auto rank = static_cast<std::int64_t>(s.rank);
    const auto clamp = [&](std::int64_t i) { return std::min(std::max(i < 0 ? i + rank : i, std::int64_t{0}), rank); };
    for (std::int64_t d = clamp(attr_int(n, "start", 0)); d < clamp(attr_int(n, "end", rank)); ++d)
      r.push_back(static_cast<double>(s[static_cast<std::size_t>(d)]));
  } else if (t == "Identity" || t == "Reshape" || t == "Squeeze" || t == "Unsqueeze" || t == "Flatten") {
    if (!arg(0) || arg(0)->shape.numel() != count) return std::nullopt;  // a view: the same elements in order
    r.append(*arg(0), 0, arg(0)->size());
  } else if (t == "Cast") {
    if (!arg(0)) return std::nullopt;
    for (std::size_t k = 0; k < arg(0)->size(); ++k) r.push_back(convert((*arg(0))[k], r.type));
  } else if (t == "ConstantOfShape") {
    double fill = 0;
    if (const auto* a = attr(n, "value"); a && a->has_t()) {
      auto c = elements(a->t(), 1);
      if (!c || c->size() != 1) return std::nullopt;
      fill = (*c)[0];
    }
    r.resize(static_cast<std::size_t>(count));
    for (std::int64_t k = 0; k < count; ++k) r.set(static_cast<std::size_t>(k), fill);
  } else if (t == "Range") {
    if (!arg(0) || !arg(1) || !arg(2) || arg(0)->size() != 1 || arg(1)->size() != 1 || arg(2)->size() != 1) return std::nullopt;
    const double start = (*arg(0))[0], limit = (*arg(1))[0], delta = (*arg(2))[0];
    if (delta == 0.0 || !std::isfinite(start) || !std::isfinite(limit) || !std::isfinite(delta)) return std::nullopt;
    const double len = std::max(std::ceil((limit - start) / delta), 0.0);
    if (len != static_cast<double>(count)) return std::nullopt;
    for (std::int64_t i = 0; i < count; ++i) r.push_back(start + static_cast<double>(i) * delta);
  } else if (t == "Expand") {
    if (!arg(0)) return std::nullopt;
    r.resize(static_cast<std::size_t>(count));
    if (!broadcast_loop(r.shape, {&arg(0)->shape}, [&](std::int64_t f, const offsets& o) {
          r.set(static_cast<std::size_t>(f), (*arg(0))[static_cast<std::size_t>(o[0])]);
        }))
      return std::nullopt;
  } else if (t == "Concat") {
    const std::int64_t axis = axis_of(attr_int(n, "axis", 0), r.shape.rank);
    if (axis < 0 || axis >= static_cast<std::int64_t>(r.shape.rank)) return std::nullopt;
    std::int64_t outer = 1, inner = 1;
    for (std::int64_t d = 0; d < axis; ++d) outer *= r.shape[static_cast<std::size_t>(d)];
    for (std::size_t d = static_cast<std::size_t>(axis) + 1; d < r.shape.rank; ++d) inner *= r.shape[d];
    std::int64_t total = 0;
    for (const dense_value* a : in) {
      if (!a || a->shape.rank != r.shape.rank) return std::nullopt;
      total += a->shape[static_cast<std::size_t>(axis)];
    }
    if (total != r.shape[static_cast<std::size_t>(axis)]) return std::nullopt;
    for (std::int64_t o = 0; o < outer; ++o)
      for (const dense_value* a : in) {
        const std::int64_t block = a->shape[static_cast<std::size_t>(axis)] * inner;
        if (a->shape.numel() != outer * block) return std::nullopt;
        r.append(*a, static_cast<std::size_t>(o * block), static_cast<std::size_t>(block));
      }
  } else if (t == "Slice") {
    const dense_value* a = arg(0);
    auto starts = ints(1), ends = ints(2), axes = ints(3), steps = ints(4);
    if (!a || !starts || !ends || starts->size() != ends->size() || a->shape.rank != r.shape.rank) return std::nullopt;
    const std::size_t rank = a->shape.rank;
    std::vector<std::int64_t> first(rank, 0), step(rank, 1);
    for (std::size_t i = 0; i < starts->size(); ++i) {
      const std::int64_t ax = axis_of(axes ? (i < axes->size() ? (*axes)[i] : -999) : static_cast<std::int64_t>(i), rank);
      const std::int64_t st = steps ? (i < steps->size() ? (*steps)[i] : 0) : 1;
      if (ax < 0 || ax >= static_cast<std::int64_t>(rank) || st == 0) return std::nullopt;
      const std::int64_t dim = a->shape[static_cast<std::size_t>(ax)];
      std::int64_t s = (*starts)[i];
      s = s < 0 ? s + dim : s;
      s = st > 0 ? std::min(std::max(s, std::int64_t{0}), dim) : std::min(std::max(s, std::int64_t{-1}), dim - 1);
      first[static_cast<std::size_t>(ax)] = s;
      step[static_cast<std::size_t>(ax)] = st;
    }
    // The output's dims are the inferred ones; every index they reach must lie inside the input.
    const std::vector<std::int64_t> ist = strides_of(a->shape);
    for (std::size_t d = 0; d < rank; ++d) {
      if (r.shape[d] == 0) continue;
      std::int64_t span = 0, last = 0;
      if (__builtin_mul_overflow(r.shape[d] - 1, step[d], &span) || __builtin_add_overflow(first[d], span, &last)) return std::nullopt;
      if (first[d] < 0 || first[d] >= a->shape[d] || last < 0 || last >= a->shape[d]) return std::nullopt;
    }
    std::vector<std::int64_t> idx(rank, 0);
    for (std::int64_t f = 0; f < count; ++f) {
      std::int64_t off = 0;
      for (std::size_t d = 0; d < rank; ++d) off += (first[d] + idx[d] * step[d]) * ist[d];
      r.push_back((*a)[static_cast<std::size_t>(off)]);
      for (std::size_t d = rank; d-- > 0;) {
        if (++idx[d] < r.shape[d]) break;
        idx[d] = 0;
      }
    }
  } else if (t == "Transpose") {
    const dense_value* a = arg(0);
    if (!a || a->shape.rank != r.shape.rank) return std::nullopt;
    const std::size_t rank = a->shape.rank;
    std::vector<std::int64_t> perm(rank);
    for (std::size_t d = 0; d < rank; ++d) perm[d] = static_cast<std::int64_t>(rank - 1 - d);
    if (auto p = attr_ints(n, "perm")) perm = *p;
    if (perm.size() != rank) return std::nullopt;
    std::vector<char> taken(rank, 0);  // a permutation: each dim once
    for (std::int64_t p : perm)
      if (p < 0 || p >= static_cast<std::int64_t>(rank) || taken[static_cast<std::size_t>(p)]++) return std::nullopt;
    const std::vector<std::int64_t> ist = strides_of(a->shape);
    std::vector<std::int64_t> st(rank);
    for (std::size_t d = 0; d < rank; ++d) {
      if (perm[d] < 0 || perm[d] >= static_cast<std::int64_t>(rank) || r.shape[d] != a->shape[static_cast<std::size_t>(perm[d])]) return std::nullopt;
      st[d] = ist[static_cast<std::size_t>(perm[d])];
    }
    std::vector<std::int64_t> idx(rank, 0);
    for (std::int64_t f = 0; f < count; ++f) {
      std::int64_t off = 0;
      for (std::size_t d = 0; d < rank; ++d) off += idx[d] * st[d];
      r.push_back((*a)[static_cast<std::size_t>(off)]);
      for (std::size_t d = rank; d-- > 0;) {
        if (++idx[d] < r.shape[d]) break;
        idx[d] = 0;
      }
    }
  } else if (t == "Gather") {
    const dense_value *a = arg(0), *ix = arg(1);
    if (!a || !ix || a->shape.rank == 0) return std::nullopt;
    const std::int64_t axis = axis_of(attr_int(n, "axis", 0), a->shape.rank);
    if (axis < 0 || axis >= static_cast<std::int64_t>(a->shape.rank)) return std::nullopt;
    const std::int64_t dim = a->shape[static_cast<std::size_t>(axis)];
    std::int64_t outer = 1, inner = 1;
    for (std::int64_t d = 0; d < axis; ++d) outer *= a->shape[static_cast<std::size_t>(d)];
    for (std::size_t d = static_cast<std::size_t>(axis) + 1; d < a->shape.rank; ++d) inner *= a->shape[d];
    if (outer * static_cast<std::int64_t>(ix->size()) * inner != count) return std::nullopt;
    for (std::int64_t o = 0; o < outer; ++o)
      for (std::size_t k = 0; k < ix->size(); ++k) {
        std::int64_t j = saturated((*ix)[k]);
        j = j < 0 ? j + dim : j;
        if (j < 0 || j >= dim) return std::nullopt;
        r.append(*a, static_cast<std::size_t>((o * dim + j) * inner), static_cast<std::size_t>(inner));
      }
  } else if (t == "GatherND") {
    const dense_value *a = arg(0), *ix = arg(1);
    const std::int64_t b = attr_int(n, "batch_dims", 0);
    if (!a || !ix || ix->shape.rank < 1 || b < 0 || b >= static_cast<std::int64_t>(ix->shape.rank) ||
        b >= static_cast<std::int64_t>(a->shape.rank))
      return std::nullopt;
    const std::int64_t depth = ix->shape[ix->shape.rank - 1u];
    if (depth < 1 || b + depth > static_cast<std::int64_t>(a->shape.rank)) return std::nullopt;
    std::int64_t batch = 1, inner = 1;
    for (std::int64_t d = 0; d < b; ++d) {
      if (a->shape[static_cast<std::size_t>(d)] != ix->shape[static_cast<std::size_t>(d)]) return std::nullopt;
      batch *= a->shape[static_cast<std::size_t>(d)];
    }
    for (std::size_t d = static_cast<std::size_t>(b + depth); d < a->shape.rank; ++d) inner *= a->shape[d];
    const std::vector<std::int64_t> ast = strides_of(a->shape);
    const std::int64_t per_batch_data = a->shape.numel() / std::max<std::int64_t>(batch, 1);
    const std::int64_t tuples = ix->shape.numel() / depth, per_batch_tuples = tuples / std::max<std::int64_t>(batch, 1);
    if (tuples * inner != count) return std::nullopt;
    for (std::int64_t q = 0; q < tuples; ++q) {
      std::int64_t off = (q / std::max<std::int64_t>(per_batch_tuples, 1)) * per_batch_data;
      for (std::int64_t c = 0; c < depth; ++c) {
        const std::int64_t dim = a->shape[static_cast<std::size_t>(b + c)];
        std::int64_t j = saturated((*ix)[static_cast<std::size_t>(q * depth + c)]);
        j = j < 0 ? j + dim : j;
        if (j < 0 || j >= dim) return std::nullopt;
        off += j * ast[static_cast<std::size_t>(b + c)];
      }
      r.append(*a, static_cast<std::size_t>(off), static_cast<std::size_t>(inner));
    }
  } else if (t == "CumSum") {
    const dense_value* a = arg(0);
    auto ax = ints(1);
    if (!a || !ax || ax->size() != 1 || !(a->shape == r.shape)) return std::nullopt;
    const std::int64_t axis = axis_of((*ax)[0], a->shape.rank);
    if (axis < 0 || axis >= static_cast<std::int64_t>(a->shape.rank)) return std::nullopt;
    const bool exclusive = attr_int(n, "exclusive", 0) != 0, reverse = attr_int(n, "reverse", 0) != 0;
    const std::int64_t dim = a->shape[static_cast<std::size_t>(axis)], inner = strides_of(a->shape)[static_cast<std::size_t>(axis)];
    r.resize(a->size());
    for (std::int64_t base = 0; base < count; base += dim * inner)
      for (std::int64_t i = 0; i < inner; ++i) {
        double sum = 0;
        for (std::int64_t s = 0; s < dim; ++s) {
          const std::int64_t j = reverse ? dim - 1 - s : s;
          const auto at = static_cast<std::size_t>(base + j * inner + i);
          const double x = (*a)[at];
          if (exclusive) r.set(at, convert(sum, r.type)), sum += x;
          else sum += x, r.set(at, convert(sum, r.type));
        }
      }
  } else {  // elementwise (onnx_elementwise_function), numpy broadcasting; comparisons and logic give booleans
    std::vector<const tensor_shape*> shapes;
    for (const dense_value* a : in) {
      if (!a) return std::nullopt;
      shapes.push_back(&a->shape);
    }
    const std::size_t arity = in.size();
    const elementwise_fn f = onnx_elementwise_function(t, arity);
    if (f == nullptr || arity > max_inputs) return std::nullopt;
    const bool integral = !is_float(r.type);
    r.resize(static_cast<std::size_t>(count));
    bool ok = true;
    std::array<double, max_inputs> x{};
    const bool looped = broadcast_loop(r.shape, shapes, [&](std::int64_t at, const offsets& o) {
      for (std::size_t i = 0; i < arity; ++i) x[i] = (*in[i])[static_cast<std::size_t>(o[i])];
      const double y = f(x.data(), arity);
      if (integral && !std::isfinite(y)) ok = false;  // an integer Div by 0
      r.set(static_cast<std::size_t>(at), convert(y, r.type));
    });
    if (!looped || !ok) return std::nullopt;
  }
  if (static_cast<std::int64_t>(r.size()) != count) return std::nullopt;
  return r;
}

/// The elements of `name`, a value computed from constants (mark_constants; with
/// `buffers_too`, from constants and buffers) or a constant; nullopt when it is none, when an
/// operator's numbers are outside what it allows, or when the tensors live at once would pass
/// `max_bytes` (8 bytes an element; checked before each is allocated). Each intermediate is
/// freed after its last use within the evaluation.
inline std::optional<dense_value> reader::evaluate(const std::string& name, std::uint64_t max_bytes, bool buffers_too) const {
  const auto element_bytes = [&](const std::string& v) -> std::optional<std::uint64_t> {
    auto it = values.find(v);
    if (it == values.end() || !it->second.known) return std::nullopt;
    const tensor_shape& s = it->second.shape;
    std::uint64_t n = dense_value::element_bytes(it->second.type);
    for (std::int64_t d : s)
      if (d < 0 || __builtin_mul_overflow(n, static_cast<std::uint64_t>(d), &n)) return std::nullopt;
    return n;
  };
  // The nodes computing `name`, in the sorted order, and how often each value is read there.
  std::set<int> cone;
  std::map<std::string, int> reads;
  std::vector<std::string> stack{name};
  std::set<std::string> seen{name};
  while (!stack.empty()) {
    const std::string v = stack.back();
    stack.pop_back();
    const int p = producer(v);
    const bool leaf = p < 0 || (nd(p).op_type() == "Constant" && default_domain(nd(p)));
    if (leaf) {
      if (!holds_constant(v, buffers_too)) return std::nullopt;  // a graph input, a weight, or nothing
      if (p >= 0) cone.insert(p);
      continue;
    }
    if (!(buffers_too ? computed_with_buffers : computed_from_constants).count(v)) return std::nullopt;
    if (cone.size() >= 4096) return std::nullopt;  // far more than a mask takes
    cone.insert(p);
    if (nd(p).op_type() == "Shape") continue;
    for (const std::string& i : nd(p).input()) {
      if (i.empty()) continue;
      ++reads[i];
      if (seen.insert(i).second) stack.push_back(i);
    }
  }
  // A tensor of the file (an initializer, a Constant's value), read as doubles first: that
  // copy, 8 bytes an element, counts against the budget beside what is live then.
  const auto read_source = [&](const std::string& v, std::uint64_t live_then) -> std::optional<dense_value> {
    auto it = values.find(v);
    if (it == values.end() || !it->second.known) return std::nullopt;
    const std::int64_t numel = it->second.shape.numel();
    const std::uint64_t copy = static_cast<std::uint64_t>(numel) * sizeof(double);
    if (live_then > max_bytes || copy > max_bytes - live_then) return std::nullopt;
    std::optional<std::vector<double>> c = constant(v, numel);
    if (!c) return std::nullopt;
    dense_value d;
    d.shape = it->second.shape;
    d.type = it->second.type;
    for (double x : *c) d.push_back(x);
    return d;
  };
  std::map<std::string, dense_value> live;
  std::uint64_t live_bytes = 0;
  const auto fetch = [&](const std::string& v) -> const dense_value* {
    auto it = live.find(v);
    return it == live.end() ? nullptr : &it->second;
  };
  for (int k : cone) {
    const onnx::NodeProto& n = nd(k);
    const std::string& o = n.output(0);
    const std::optional<std::uint64_t> bytes = element_bytes(o);
    if (!bytes || *bytes > max_bytes - std::min(max_bytes, live_bytes)) return std::nullopt;
    std::optional<dense_value> d;
    if (n.op_type() == "Constant") {
      d = read_source(o, live_bytes + *bytes);
      if (!d) return std::nullopt;
    } else if (n.op_type() == "Shape") {
      d = evaluate_node(k, {});  // its input's inferred shape; its elements are not read
      if (!d) return std::nullopt;
    } else {
      std::vector<const dense_value*> args;
      for (const std::string& i : n.input()) {
        if (i.empty()) {
          args.push_back(nullptr);
          continue;
        }
        if (!live.count(i)) {  // an initializer: read on first use
          const std::optional<std::uint64_t> ib = element_bytes(i);
          if (!ib || *ib > max_bytes - std::min(max_bytes, live_bytes)) return std::nullopt;
          std::optional<dense_value> c = read_source(i, live_bytes + *ib);
          if (!c) return std::nullopt;
          live_bytes += *ib;
          live[i] = std::move(*c);
        }
        args.push_back(fetch(i));
      }
      d = evaluate_node(k, args);
      if (!d) return std::nullopt;
      for (const std::string& i : n.input())
        if (!i.empty() && --reads[i] == 0) {
          live_bytes -= *element_bytes(i);
          live.erase(i);
        }
    }
    live_bytes += *bytes;
    live[o] = std::move(*d);
  }
  auto it = live.find(name);
  if (it == live.end()) return std::nullopt;
  return std::move(it->second);
}

/// The bytes evaluate() may hold at once for a pattern's constant: 1 GiB, or a quarter of
/// what this process can still allocate when that is less.
inline std::uint64_t reader::constant_budget() const {
  if (!budget_cache) budget_cache = std::min<std::uint64_t>(std::uint64_t{1} << 30, machine_limits::memory_here().memory() / 4);
  return *budget_cache;
}

}  // namespace autoshard::detail::onnx_in
