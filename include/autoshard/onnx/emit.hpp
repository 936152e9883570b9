#pragma once
/// The vertices: each needed node (or fused pattern) mapped to an operator kind, or to an
/// opaque vertex with the reason; build() emits them in order and validates the graph.
#include "attention.hpp"

namespace autoshard::detail::onnx_in {

// ---- emitting vertices ----
/// The name node k's vertices are named from: its module-path name (scoped_names), its own
/// name, its first output's, or its op type.
inline std::string reader::vertex_base(int k) const {
  if (!scoped[static_cast<std::size_t>(k)].empty()) return scoped[static_cast<std::size_t>(k)];
  const onnx::NodeProto& n = nd(k);
  return n.name().empty() ? (n.output_size() ? n.output(0) : n.op_type()) : n.name();
}

/// A vertex name: torch.onnx.export's node names are module paths ("/transformer/h.0/attn/
/// c_attn/MatMul"), written with dots as the module and its parameters are
/// ("transformer.h.0.attn.c_attn.MatMul"), so that repeated layers are recognised as such.
inline std::string reader::unique_name(std::string base) {
  if (!base.empty() && base[0] == '/' && base.size() > 1) {
    base.erase(0, 1);
    std::replace(base.begin(), base.end(), '/', '.');
  }
  if (base.empty()) base = "node";
  std::string n = base;
  for (int i = 2; used_names.count(n); ++i) n = base + "#" + std::to_string(i);
  used_names.insert(n);
  return n;
}

inline const value_info& reader::known(const std::string& v, const std::string& who) const {
  auto it = values.find(v);
  if (it == values.end()) fail(who + ": value " + quoted_text(v) + " is not defined");
  if (!it->second.known) fail(who + ": " + (it->second.unknown_why.empty() ? "the type of " + quoted_text(v) + " is unknown" : it->second.unknown_why));
  return it->second;
}

/// The vertex of value `v`, creating the source vertex of an input, initializer or constant.
inline vertex_t reader::operand(const std::string& v, const std::string& who) {
  if (auto it = vertex_of.find(v); it != vertex_of.end()) return it->second;
  const value_info& vi = known(v, who);
  if (vi.producer >= 0 && !vi.init) {
    const int p = vi.producer;
    if (nd(p).op_type() == "Shape" && default_domain(nd(p))) return shape_value(p, v, who);
    // value_float, value_ints, ... of a Constant, or a value computed from constants alone
    // (mark_needed): an input below.
    if (!(nd(p).op_type() == "Constant" && default_domain(nd(p))) && !computed_from_constants.count(v))
      fail(who + ": value " + quoted_text(v) + " of " + node_label(nd(p), p) + " was not computed (an internal ordering error)");
  }
  vertex_t u;
  // A floating initializer is a weight, named as the file names it, or as the module that uses
  // it (weight_names); but not a constant the exporter lifted (lifted_constant: torch's dynamo
  // exporter writes the attention's scale and fills as val_196, ...), nor one it marks as a
  // buffer or a tensor constant (buffers: LLaMA's rotary inv_freq).
  if (vi.init && vi.producer < 0 && is_float(vi.type) && !lifted_constant(v, vi.shape.rank) && !buffers.count(v)) {
    const auto renamed = weight_names.find(v);
    u = add_parameter(out.graph, unique_name(renamed == weight_names.end() ? v : renamed->second), vi.shape, vi.type);
  } else if (kv_caches.count(v)) {  // a fused attention's key/value cache (its shape rewritten: fuse_attention)
    u = add_kv_cache(out.graph, unique_name(v), vi.shape, vi.type);
  } else if (vi.graph_input || !vi.init) {
    // Fed each step; or computed from constants alone (mark_constants), whose shape may be the
    // batch's and the sequence's (torch's dynamo export builds a [B, 1, S, S] mask from
    // positions): re-sized with them as a fed input is.
    u = add_input(out.graph, unique_name(v), vi.shape, vi.type);
  } else {
    u = add_held_input(out.graph, unique_name(v), vi.shape, vi.type);  // data the file holds: constants, buffers, integer tables
  }
  vertex_of[v] = u;
  return u;
}

/// A Shape node's output used as data: a constant input (its value is the inferred shape).
inline vertex_t reader::shape_value(int p, const std::string& v, const std::string& who) {
  const value_info& in = known(in_of(p, 0), who);
  const vertex_t u = add_held_input(out.graph, unique_name(v), tensor_shape{static_cast<std::int64_t>(in.shape.rank)}, dtype::i64);
  vertex_of[v] = u;
  return u;
}

/// Whether node k, which no kind maps, is an elementwise operator of the default domain whose
/// one output is its inputs broadcast (numpy): an opaque vertex that splits as add does.
/// Exporters write them around the kinds: torch.onnx's scaled_dot_product_attention guards its
/// softmax with Where(IsNaN(p), 0, p), its masks compare positions (LessOrEqual, And).
inline bool reader::elementwise(int k) const {
  static const std::set<std::string, std::less<>> ops{
      "Abs",   "Acos",      "Acosh",      "And",        "Asin",       "Asinh",   "Atan",     "Atanh",         "BitwiseAnd",
      "BitwiseNot", "BitwiseOr", "BitwiseXor", "Cast",   "Ceil",       "Celu",    "Clip",     "Cos",           "Cosh",
      "Elu",   "Equal",     "Erf",        "Floor",      "Greater",    "GreaterOrEqual", "HardSigmoid", "HardSwish", "IsInf",
      "IsNaN", "LeakyRelu", "Less",       "LessOrEqual", "Log",       "Max",     "Mean",     "Min",           "Mish",
      "Mod",   "Neg",       "Not",        "Or",         "Pow",        "Reciprocal", "Round", "Selu",          "Sigmoid",
      "Sign",  "Sin",       "Sinh",       "Softplus",   "Softsign",   "Sqrt",    "Sum",      "Tan",           "ThresholdedRelu",
      "Where", "Xor"};
  const onnx::NodeProto& n = nd(k);
  if (!default_domain(n) || !ops.count(n.op_type()) || n.output_size() != 1 || n.input_size() < 1) return false;
  std::vector<tensor_shape> in;
  for (const std::string& x : n.input()) {
    auto v = values.find(x);
    if (x.empty() || v == values.end() || !v->second.known) return false;
    in.push_back(v->second.shape);
  }
  auto o = values.find(n.output(0));
  if (o == values.end() || !o->second.known) return false;
  try {
    op_attrs a;
    a.elementwise = true;
    return infer_shape(op_kind::opaque, a, in) == o->second.shape;
  } catch (const graph_error&) {
    return false;
  }
}

inline void reader::opaque(int k, const std::string& why) {
  const onnx::NodeProto& n = nd(k);
  const std::string who = node_label(n, k);
  const bool each = elementwise(k);
  std::vector<vertex_t> ops;
  for (int i : data_inputs(n))  // every input of an elementwise operator
    if (i < n.input_size() && !n.input(i).empty()) ops.push_back(operand(n.input(i), who));
  if (ops.size() > 64) fail(who + " has " + std::to_string(ops.size()) + " inputs; an opaque operator takes at most 64");
  const std::string base = vertex_base(k);
  for (int i = 0; i < n.output_size(); ++i) {
    const std::string& o = n.output(i);
    if (o.empty() || !values.at(o).graph_output) {
      bool used = false;
      if (!o.empty())
        for (int c : values.at(o).consumers) used = used || needed[static_cast<std::size_t>(c)] || absorbed[static_cast<std::size_t>(c)];
      if (!used) continue;
    }
    const value_info& vi = known(o, who);
    op_attrs a;
    if (each) a.elementwise = true;
    else a.dims = vi.shape.to_vector();
    a.op_type = qualified(n);
    const std::string name = unique_name(n.output_size() > 1 ? base + ":" + std::to_string(i) : base);
    vertex_of[o] = add_op(out.graph, op_kind::opaque, name, ops, a, vi.type);
    out.opaque.push_back({name, a.op_type, why});
  }
}

/// Adds a vertex of kind `k` for output `o` of node `k_node` when the kind's shape rule
/// gives ONNX's shape; false (nothing added) when it does not.
inline bool reader::try_emit(op_kind kind, const std::string& name, const std::vector<std::string>& ins, op_attrs a,
              const std::string& o, const std::string& who, std::string& why) {
  const value_info& ov = known(o, who);
  std::vector<tensor_shape> shapes;
  for (const std::string& in : ins) shapes.push_back(known(in, who).shape);
  tensor_shape s;
  try {
    s = infer_shape(kind, a, shapes);
  } catch (const graph_error& e) {
    why = std::string(to_string(kind)) + " does not fit: " + std::string(e.message());
    return false;
  }
  if (!(s == ov.shape)) {
    why = std::string(to_string(kind)) + " would give " + to_string(s) + ", ONNX infers " + to_string(ov.shape);
    return false;
  }
  std::vector<vertex_t> ops;
  for (const std::string& in : ins) ops.push_back(operand(in, who));
  vertex_of[o] = add_op(out.graph, kind, unique_name(name), ops, std::move(a), ov.type);
  return true;
}

/// Node k as an operator kind, or an opaque vertex with the reason: a fused pattern ending at
/// k, a default-domain operator (emit_elementwise, emit_gemm, emit_normalisation,
/// emit_layout, emit_reduction, in that order: each maps its own op types), or Microsoft's
/// Gelu and FastGelu.
inline void reader::emit(int k) {
  const onnx::NodeProto& n = nd(k);
  const std::string who = node_label(n, k);
  // A Gemm, a LayerNormalization or a Gelu is the whole module it came from: named by the
  // module's path ("/0/Gemm" -> "0"), as the builders name linears and norms.
  const bool module_op = n.op_type() == "Gemm" || n.op_type() == "LayerNormalization" || n.op_type() == "Gelu";
  const bool named = !n.name().empty() || !scoped[static_cast<std::size_t>(k)].empty();
  const std::string name = module_op && named ? pattern_name(k) : vertex_base(k);
  std::string why = "no mapping";
  if (auto f = fused.find(k); f != fused.end()) {
    if (try_emit(f->second.kind, f->second.name, f->second.operands, f->second.attrs, f->second.output, who, why)) return;
    fail(who + ": the fused " + std::string(to_string(f->second.kind)) + " " + quoted_text(f->second.name) + " does not fit: " + why);
  }
  const std::string& t = n.op_type();
  if (default_domain(n)) {
    if (emit_elementwise(k, name, who, why) || emit_gemm(k, name, who, why) || emit_normalisation(k, name, who, why) ||
        emit_layout(k, name, who, why) || emit_reduction(k, name, who, why))
      return;
  } else if (n.domain() == "com.microsoft" && (t == "Gelu" || t == "FastGelu") && n.input_size() == 1) {
    // Gelu is the exact (erf) form, FastGelu the tanh approximation
    if (try_emit(t == "Gelu" ? op_kind::gelu_erf : op_kind::gelu, name, {in_of(k, 0)}, {}, out_of(k, 0), who, why)) return;
  }
  opaque(k, why);
}

/// Whether node k's outputs past the first are unused (a Dropout's mask, a LayerNormalization's statistics).
inline bool reader::single_output(int k) const {
  const onnx::NodeProto& n = nd(k);
  for (int i = 1; i < n.output_size(); ++i)
    if (!n.output(i).empty() && !values.at(n.output(i)).consumers.empty()) return false;
  return true;
}

/// Node k as no vertex: its output is its first input's vertex (an Identity, an eval-mode
/// Dropout, a view that changes nothing). Not for a graph output, which keeps a vertex of its
/// name: false then.
inline bool reader::pass_through(int k, const std::string& who) {
  if (known(out_of(k, 0), who).graph_output) return false;
  vertex_of[out_of(k, 0)] = operand(in_of(k, 0), who);
  return true;
}

/// Relu, Tanh, Exp, Identity, Gelu (opset 20), Dropout, Add/Sub/Mul/Div and MatMul: true when
/// emitted; false when k is none of them, or with `why` when it does not map. Identity, and a
/// Dropout not in training mode (opset 12 on: its training_mode input absent or a constant
/// false, ONNX's default, as torch exports a model in eval mode), give their input: no vertex.
inline bool reader::emit_elementwise(int k, const std::string& name, const std::string& who, std::string& why) {
  static const std::map<std::string, op_kind> unary{{"Relu", op_kind::relu}, {"Tanh", op_kind::tanh}, {"Exp", op_kind::exp}};
  static const std::map<std::string, op_kind> binary{{"Add", op_kind::add}, {"Sub", op_kind::sub}, {"Mul", op_kind::mul}, {"Div", op_kind::div}};
  const onnx::NodeProto& n = nd(k);
  const std::string& t = n.op_type();
  const std::string out0 = out_of(k, 0);
  if (auto u = unary.find(t); u != unary.end() && n.input_size() == 1) return try_emit(u->second, name, {in_of(k, 0)}, {}, out0, who, why);
  if (t == "Gelu" && n.input_size() == 1) {  // opset 20: approximate "none" (erf) or "tanh"
    const auto* ap = attr(n, "approximate");
    const std::string approx = ap ? ap->s() : "none";
    if (approx == "none" || approx == "tanh")
      return try_emit(approx == "tanh" ? op_kind::gelu : op_kind::gelu_erf, name, {in_of(k, 0)}, {}, out0, who, why);
    why = "approximate is " + quoted_text(approx);
    return false;
  }
  const bool eval_dropout = t == "Dropout" && out.opset >= 12 && (in_of(k, 2).empty() || scalar(in_of(k, 2)) == 0.0);
  if (((t == "Identity" && n.input_size() == 1) || (eval_dropout && single_output(k))) && pass_through(k, who)) return true;
  if ((t == "Dropout" || t == "Identity") && single_output(k)) return try_emit(op_kind::dropout, name, {in_of(k, 0)}, {}, out0, who, why);
  if (auto b = binary.find(t); b != binary.end() && n.input_size() == 2)
    return try_emit(b->second, name, {in_of(k, 0), in_of(k, 1)}, {}, out0, who, why);
  if (t == "MatMul" && n.input_size() == 2) return try_emit(op_kind::matmul, name, {in_of(k, 0), in_of(k, 1)}, {}, out0, who, why);
  return false;
}

/// Gemm as a linear: B a 2-D floating initializer, C (if any) its bias, alpha and beta 1, A not transposed.
inline bool reader::emit_gemm(int k, const std::string& name, const std::string& who, std::string& why) {
  if (nd(k).op_type() != "Gemm") return false;
  op_attrs a;
  std::vector<std::string> ops;
  why = gemm_as_linear(k, a, ops);
  return why.empty() && try_emit(op_kind::linear, name, ops, a, out_of(k, 0), who, why);
}

/// Softmax and LayerNormalization over the last dim.
inline bool reader::emit_normalisation(int k, const std::string& name, const std::string& who, std::string& why) {
  const onnx::NodeProto& n = nd(k);
  const std::string& t = n.op_type();
  const auto norm_axis = [](std::int64_t a, std::int64_t r) { return a < 0 ? a + r : a; };
  if (t == "Softmax" && n.input_size() == 1) {
    const std::int64_t r = known(in_of(k, 0), who).shape.rank;
    const std::int64_t ax = norm_axis(attr_int(n, "axis", out.opset >= 13 ? -1 : 1), r);
    if (out.opset < 13 && ax != r - 1) {
      why = "opset " + std::to_string(out.opset) + " Softmax flattens from axis " + std::to_string(ax);
      return false;
    }
    op_attrs a;
    a.axis = static_cast<int>(ax);
    return try_emit(op_kind::softmax, name, {in_of(k, 0)}, a, out_of(k, 0), who, why);
  }
  if (t == "LayerNormalization" && single_output(k)) {
    const std::int64_t r = known(in_of(k, 0), who).shape.rank;
    if (norm_axis(attr_int(n, "axis", -1), r) != r - 1) {
      why = "normalises more than the last dim";
      return false;
    }
    std::vector<std::string> ops{in_of(k, 0)};
    for (int i = 1; i < n.input_size() && i < 3; ++i)
      if (!in_of(k, i).empty()) ops.push_back(in_of(k, i));
    // Its epsilon attribute (a float; ONNX's default 1e-5), as_written; one autoshard does
    // not compute with (0, negative, above 1) is refused by the shape rule: opaque, with why.
    op_attrs a;
    const auto* eps = attr(n, "epsilon");
    a.epsilon = eps ? as_written(eps->f()) : default_norm_epsilon;
    return ops.size() == static_cast<std::size_t>(std::min(n.input_size(), 3)) &&
           try_emit(op_kind::layer_norm, name, ops, a, out_of(k, 0), who, why);
  }
  return false;
}

/// Reshape/Flatten/Squeeze/Unsqueeze and a floating Cast (reshape), Transpose, Gather of a
/// 2-D table (embedding), Concat, Split and Slice.
inline bool reader::emit_layout(int k, const std::string& name, const std::string& who, std::string& why) {
  const onnx::NodeProto& n = nd(k);
  const std::string& t = n.op_type();
  const std::string out0 = out_of(k, 0);
  op_attrs a;
  if (t == "Reshape" || t == "Flatten" || t == "Squeeze" || t == "Unsqueeze") {
    const value_info& o = known(out0, who);
    const value_info& src = known(in_of(k, 0), who);
    // A view to its input's own shape changes nothing (GPT-2's ids.view(-1, S), hidden.view(B, S, H)).
    if (o.shape == src.shape && o.type == src.type && pass_through(k, who)) return true;
    a.dims = o.shape.to_vector();
    return try_emit(op_kind::reshape, name, {in_of(k, 0)}, a, out0, who, why);
  }
  if (t == "Cast") {
    const value_info& src = known(in_of(k, 0), who);
    const value_info& dst = known(out0, who);
    if (!is_float(src.type) || !is_float(dst.type)) {
      why = "casts between " + std::string(to_string(src.type)) + " and " + std::string(to_string(dst.type));
      return false;
    }
    a.dims = dst.shape.to_vector();
    return try_emit(op_kind::reshape, name, {in_of(k, 0)}, a, out0, who, why);
  }
  if (t == "Transpose") {
    const std::int64_t r = known(in_of(k, 0), who).shape.rank;
    if (auto p = attr_ints(n, "perm")) a.dims = *p;
    else
      for (std::int64_t d = r - 1; d >= 0; --d) a.dims.push_back(d);
    return try_emit(op_kind::transpose, name, {in_of(k, 0)}, a, out0, who, why);
  }
  if (t == "Gather" && n.input_size() == 2) {
    const value_info& table = known(in_of(k, 0), who);
    const value_info& ids = known(in_of(k, 1), who);
    if (attr_int(n, "axis", 0) == 0 && table.shape.rank == 2 && is_float(table.type) && !is_float(ids.type)) {
      if (const std::int64_t first = positions_from(in_of(k, 1), table.shape[0]); first > 0) {
        // A decode step's learned positions P..P+S-1: the table's rows from P on, as the
        // builders' position_rows reads them (`<table>.past_offset`, a split).
        std::string base = in_of(k, 0);
        if (const auto w = weight_names.find(base); w != weight_names.end()) base = w->second;
        if (base.size() > 7 && base.compare(base.size() - 7, 7, ".weight") == 0) base.resize(base.size() - 7);
        op_attrs rows;
        rows.axis = 0;
        rows.start = first;
        rows.length = table.shape[0] - first;
        const vertex_t t = add_op(out.graph, op_kind::split, unique_name(base + ".past_offset"), {operand(in_of(k, 0), who)}, rows, table.type);
        vertex_of[out0] = add_op(out.graph, op_kind::embedding, unique_name(name), {operand(in_of(k, 1), who), t}, {}, known(out0, who).type);
        return true;
      }
      return try_emit(op_kind::embedding, name, {in_of(k, 1), in_of(k, 0)}, {}, out0, who, why);
    }
    why = "only a lookup of rows of a 2-D floating table maps (to embedding)";
    return false;
  }
  if (t == "Concat") {
    a.axis = static_cast<int>(attr_int(n, "axis", 0));
    std::vector<std::string> ops;
    for (const std::string& i : n.input())
      if (!i.empty()) ops.push_back(i);
    // ONNX 1.12's inference leaves a Concat of operands that disagree off its axis unknown
    // ("the shape is unknown"): named here, with the dims (a key/value cache of other heads).
    for (std::size_t i = 1; i < ops.size(); ++i) {
      auto x = values.find(ops[0]), y = values.find(ops[i]);
      if (x == values.end() || y == values.end() || !x->second.known || !y->second.known) continue;
      const tensor_shape &xs = x->second.shape, &ys = y->second.shape;
      const std::int64_t r = static_cast<std::int64_t>(xs.rank), ax = a.axis < 0 ? a.axis + r : a.axis;
      if (ys.rank != xs.rank || ax < 0 || ax >= r) continue;
      for (std::int64_t d = 0; d < r; ++d)
        if (d != ax && xs[static_cast<std::size_t>(d)] != ys[static_cast<std::size_t>(d)])
          fail(who + ": " + quoted_text(ops[0]) + " " + to_string(xs) + " and " + quoted_text(ops[i]) + " " + to_string(ys) +
               " differ in dim " + std::to_string(d) + " (" + std::to_string(xs[static_cast<std::size_t>(d)]) + " vs " +
               std::to_string(ys[static_cast<std::size_t>(d)]) + "), which a concatenation on axis " + std::to_string(ax) + " keeps" +
               (r == 4 && ax == 2 && x->second.graph_input
                    ? "; a key/value cache [batch, kv_heads, past, head_dim] has its new keys' batch, heads and head size"
                    : ""));
    }
    return try_emit(op_kind::concat, name, ops, a, out0, who, why);
  }
  if (t == "Split") return split(k, name, who, why);
  if (t == "Slice") {
    const std::optional<vertex_t> s = slice(k, who, why);
    if (s) vertex_of[out0] = *s;
    return s.has_value();
  }
  return false;
}

/// ReduceMean/ReduceSum, Where on floating values, Expand of floating values.
inline bool reader::emit_reduction(int k, const std::string& name, const std::string& who, std::string& why) {
  const onnx::NodeProto& n = nd(k);
  const std::string& t = n.op_type();
  const std::string out0 = out_of(k, 0);
  if ((t == "ReduceMean" || t == "ReduceSum") && n.input_size() >= 1 && n.output_size() == 1)
    return reduce(k, t == "ReduceMean" ? op_kind::reduce_mean : op_kind::reduce_sum, name, who, why);
  if (t == "Where" && n.input_size() == 3) {
    if (!is_float(known(in_of(k, 0), who).type) && is_float(known(in_of(k, 1), who).type) && is_float(known(in_of(k, 2), who).type))
      return try_emit(op_kind::where, name, {in_of(k, 0), in_of(k, 1), in_of(k, 2)}, {}, out0, who, why);
    why = "only a select of floating values by a boolean or integer condition maps";
    return false;
  }
  if (t == "Expand" && n.input_size() == 2) {
    if (!is_float(known(in_of(k, 0), who).type)) {
      why = "expands " + std::string(to_string(known(in_of(k, 0), who).type)) + " values";
      return false;
    }
    op_attrs a;
    a.dims = known(out0, who).shape.to_vector();
    return try_emit(op_kind::expand, name, {in_of(k, 0)}, a, out0, who, why);
  }
  return false;
}

/// In a decode step (a fused attention reads a key/value cache), the first position P > 0
/// where `ids`, computed from constants (torch's export of GPT-2's cache_position), holds
/// P..P+S-1 along its last dim in every row, P + S at most `rows`; 0 otherwise. Its input
/// then stands for the positions counted from P (0..S-1), which look up the table's rows P..
inline std::int64_t reader::positions_from(const std::string& ids, std::int64_t rows) const {
  if (kv_caches.empty() || !computed_from_constants.count(ids)) return 0;
  const std::optional<dense_value> d = evaluate(ids, constant_budget());
  if (!d || d->shape.rank < 1 || d->size() == 0) return 0;
  const std::int64_t s = d->shape[d->shape.rank - 1u];
  const double first = (*d)[0];
  if (!(first >= 1) || first + static_cast<double>(s) > static_cast<double>(rows)) return 0;
  for (std::size_t e = 0; e < d->size(); ++e)
    if ((*d)[e] != first + static_cast<double>(static_cast<std::int64_t>(e) % s)) return 0;
  return static_cast<std::int64_t>(first);
}

/// Split: one split vertex per used output, [start, start + length) from the inferred shapes.
inline bool reader::split(int k, const std::string& name, const std::string& who, std::string& why) {
  const onnx::NodeProto& n = nd(k);
  if (n.input_size() < 1) return why = "no input", false;
  const value_info& x = known(n.input(0), who);
  const auto r = static_cast<std::int64_t>(x.shape.rank);
  std::int64_t ax = attr_int(n, "axis", 0);
  ax = ax < 0 ? ax + r : ax;
  if (ax < 0 || ax >= r) return why = "axis " + std::to_string(ax) + " is outside " + to_string(x.shape), false;
  std::vector<op_attrs> parts;
  std::int64_t start = 0;
  for (int i = 0; i < n.output_size(); ++i) {
    const value_info& o = known(n.output(i), who);
    op_attrs a;
    a.axis = static_cast<int>(ax);
    a.start = start;
    a.length = o.shape.rank == x.shape.rank ? o.shape[static_cast<std::size_t>(ax)] : -1;
    try {
      if (!(infer_shape(op_kind::split, a, std::vector<tensor_shape>{x.shape}) == o.shape)) throw graph_error("output " + std::to_string(i) + " is " + to_string(o.shape));
    } catch (const graph_error& e) {
      return why = std::string(e.message()), false;
    }
    start += a.length;
    parts.push_back(std::move(a));
  }
  const vertex_t src = operand(n.input(0), who);
  for (int i = 0; i < n.output_size(); ++i) {
    const std::string& o = n.output(i);
    if (o.empty() || (values.at(o).consumers.empty() && !values.at(o).graph_output)) continue;
    vertex_of[o] = add_op(out.graph, op_kind::split, unique_name(name + ":" + std::to_string(i)), {src}, parts[static_cast<std::size_t>(i)],
                          values.at(o).type);
  }
  return true;
}

/// Slice with constant bounds and unit steps: one split vertex per sliced axis.
inline std::optional<vertex_t> reader::slice(int k, const std::string& who, std::string& why) {
  const onnx::NodeProto& n = nd(k);
  if (n.input_size() < 1 || n.output_size() != 1) return why = "not one input and one output", std::nullopt;
  const value_info& x = known(n.input(0), who);
  const value_info& o = known(n.output(0), who);
  const auto r = static_cast<std::int64_t>(x.shape.rank);
  std::vector<double> starts, ends, axes, steps;
  if (out.opset < 10) {
    auto s = attr_ints(n, "starts"), e = attr_ints(n, "ends"), a = attr_ints(n, "axes");
    if (!s || !e) return why = "starts or ends missing", std::nullopt;
    for (auto v : *s) starts.push_back(static_cast<double>(v));
    for (auto v : *e) ends.push_back(static_cast<double>(v));
    if (a) for (auto v : *a) axes.push_back(static_cast<double>(v));
  } else {
    auto s = n.input_size() > 1 ? constant(n.input(1)) : std::nullopt;
    auto e = n.input_size() > 2 ? constant(n.input(2)) : std::nullopt;
    if (!s || !e) return why = "starts and ends are not constants", std::nullopt;
    starts = *s, ends = *e;
    if (n.input_size() > 3 && !n.input(3).empty()) {
      auto a = constant(n.input(3));
      if (!a) return why = "axes are not constants", std::nullopt;
      axes = *a;
    }
    if (n.input_size() > 4 && !n.input(4).empty()) {
      auto st = constant(n.input(4));
      if (!st) return why = "steps are not constants", std::nullopt;
      steps = *st;
    }
  }
  if (axes.empty())
    for (std::size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<double>(i));
  if (starts.size() != ends.size() || starts.size() != axes.size() || (!steps.empty() && steps.size() != starts.size()))
    return why = "starts, ends, axes and steps differ in length", std::nullopt;
  for (double s : steps)
    if (s != 1.0) return why = "a step is not 1", std::nullopt;
  std::string cur = n.input(0);
  tensor_shape cur_shape = x.shape;
  std::optional<vertex_t> v;
  for (std::size_t i = 0; i < axes.size(); ++i) {
    std::int64_t ax = static_cast<std::int64_t>(axes[i]);
    ax = ax < 0 ? ax + r : ax;
    if (ax < 0 || ax >= r) return why = "axis outside the input", std::nullopt;
    const std::int64_t dim = cur_shape[static_cast<std::size_t>(ax)];
    auto clamp = [&](double b) {
      if (b < 0) b += static_cast<double>(dim);
      return static_cast<std::int64_t>(std::min(std::max(b, 0.0), static_cast<double>(dim)));
    };
    const std::int64_t s = clamp(starts[i]), e = std::max(clamp(ends[i]), s);
    if (s == 0 && e == dim) continue;
    op_attrs a;
    a.axis = static_cast<int>(ax);
    a.start = s;
    a.length = e - s;
    std::vector<tensor_shape> shapes{cur_shape};
    tensor_shape next;
    try {
      next = infer_shape(op_kind::split, a, shapes);
    } catch (const graph_error& err) {
      return why = std::string(err.message()), std::nullopt;
    }
    const vertex_t src = v ? *v : operand(cur, who);
    const std::string nm = vertex_base(k);
    v = add_op(out.graph, op_kind::split, unique_name(axes.size() > 1 ? nm + ":" + std::to_string(ax) : nm), {src}, a, o.type);
    cur_shape = next;
  }
  if (!(cur_shape == o.shape)) return why = "the slices give " + to_string(cur_shape) + ", ONNX infers " + to_string(o.shape), std::nullopt;
  if (!v) {  // slices nothing away: a view
    op_attrs a;
    a.dims = o.shape.to_vector();
    v = add_op(out.graph, op_kind::reshape, unique_name(vertex_base(k)), {operand(n.input(0), who)}, a, o.type);
  }
  return v;
}

/// ReduceMean / ReduceSum over constant axes; keepdims adds a reshape back to ONNX's shape.
inline bool reader::reduce(int k, op_kind kind, const std::string& name, const std::string& who, std::string& why) {
  const onnx::NodeProto& n = nd(k);
  const value_info& x = known(n.input(0), who);
  const value_info& o = known(n.output(0), who);
  const auto r = static_cast<std::int64_t>(x.shape.rank);
  std::optional<std::vector<std::int64_t>> axes = attr_ints(n, "axes");
  if (!axes && n.input_size() > 1 && !n.input(1).empty()) {
    auto c = constant(n.input(1));
    if (!c) return why = "axes are not constants", false;
    axes = std::vector<std::int64_t>();
    for (double d : *c) axes->push_back(static_cast<std::int64_t>(d));
  }
  if (!axes || axes->empty()) {
    if (attr_int(n, "noop_with_empty_axes", 0)) return why = "reduces nothing", false;
    axes = std::vector<std::int64_t>();
    for (std::int64_t d = 0; d < r; ++d) axes->push_back(d);
  }
  op_attrs a;
  for (std::int64_t d : *axes) a.dims.push_back(d < 0 ? d + r : d);
  std::sort(a.dims.begin(), a.dims.end());
  tensor_shape reduced;
  try {
    reduced = infer_shape(kind, a, std::vector<tensor_shape>{x.shape});
  } catch (const graph_error& e) {
    return why = std::string(e.message()), false;
  }
  if (reduced.numel() != o.shape.numel()) return why = "ONNX infers " + to_string(o.shape), false;
  const bool keep = !(reduced == o.shape);
  vertex_t v = add_op(out.graph, kind, unique_name(keep ? name + ":reduce" : name), {operand(n.input(0), who)}, a, o.type);
  if (keep) {
    op_attrs ra;
    ra.dims = o.shape.to_vector();
    v = add_op(out.graph, op_kind::reshape, unique_name(name), {v}, ra, o.type);
  }
  vertex_of[n.output(0)] = v;
  return true;
}

/// Names for the weights torch's dynamo exporter renamed: folding a Linear's weight.T, it stores
/// the transposed weight as a new initializer with a counter's name (val_166) and drops the
/// parameter's. Such an initializer (a name with no dot), read only as the weight of one linear
/// whose node has a module path (scoped_names), takes that module's weight name
/// ("model.layers.0.self_attn.v_proj.weight"), unless another value has it; it keeps its
/// [in, out] layout (the linear's transposed_weight).
inline void reader::name_lifted_weights() {
  std::set<std::string> taken;
  for (const auto& t : model.graph().initializer()) taken.insert(t.name());
  for (const auto& [k, f] : fused) {
    if (f.kind != op_kind::linear || f.operands.size() < 2) continue;
    const std::string& w = f.operands[1];
    auto it = values.find(w);
    if (it == values.end() || !it->second.init || w.find('.') != std::string::npos || it->second.consumers.size() != 1) continue;
    const int mm = it->second.consumers.front();
    const std::string& sc = scoped[static_cast<std::size_t>(mm)];
    const auto slash = sc.rfind('/');
    if (sc.empty() || slash == 0 || slash == std::string::npos) continue;
    const std::string name = sc.substr(1, slash - 1) + ".weight";
    if (taken.insert(name).second) weight_names[w] = name;
  }
}

inline void reader::build() {
  mark_needed();
  mark_constants();
  find_fusions();
  mark_needed();  // again: what the fusions and the constants leave
  name_lifted_weights();
  // The graph inputs first, in the model's order (as the builders add them: the memory
  // model's live ranges follow the vertex order); weights and constants come on first use.
  for (const auto& i : model.graph().input()) {
    const value_info& v = values.at(i.name());
    bool used = v.graph_output;
    for (int c : v.consumers) used = used || needed[static_cast<std::size_t>(c)];
    if (v.graph_input && used) operand(i.name(), "graph input " + quoted_text(i.name()));
  }
  bool any = false;
  for (std::size_t k = 0; k < nodes.size(); ++k) {
    if (!needed[k]) continue;
    if (absorbed[k] && !fused.count(static_cast<int>(k))) continue;
    const onnx::NodeProto& n = nd(static_cast<int>(k));
    if (default_domain(n) && (n.op_type() == "Constant" || n.op_type() == "Shape")) continue;  // sources, made on use
    emit(static_cast<int>(k));
    any = true;
  }
  // Every graph output but a key/value cache written back (onnx_import::cache_outputs).
  const std::set<std::string> written_back(out.cache_outputs.begin(), out.cache_outputs.end());
  for (const auto& o : model.graph().output())
    if (!written_back.count(o.name())) operand(o.name(), "graph output " + quoted_text(o.name()));
  if (!any) fail("the graph computes its outputs with no operator autoshard could place");
  validate(out.graph);
}

}  // namespace autoshard::detail::onnx_in
