#pragma once
/// Patterns of several ONNX nodes that are one operator kind: layer and RMS norms, the erf
/// and tanh gelus, silu, and linear layers with their bias (attention: attention.hpp); and
/// find_fusions, which looks for each from the node it is recognised at.
#include "constants.hpp"

namespace autoshard::detail::onnx_in {

// ---- fusions: patterns of several nodes that are one kind ----
/// a x b, nullopt when it overflows int64 (a value's dims are each at most 2^40, their
/// products unbounded in a hostile file).
inline std::optional<std::int64_t> times(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
/// The elements of `s`, nullopt when their count overflows int64.
inline std::optional<std::int64_t> elements_of(const tensor_shape& s) {
  std::optional<std::int64_t> n = 1;
  for (std::int64_t d : s) n = n ? times(*n, d) : n;
  return n;
}

/// The single node consuming value `v`, when it has exactly one consumer and is no graph output.
inline std::optional<int> reader::only_consumer(const std::string& v) const {
  auto it = values.find(v);
  if (it == values.end() || it->second.graph_output || it->second.consumers.size() != 1) return std::nullopt;
  return it->second.consumers[0];
}

inline int reader::producer(const std::string& v) const {
  auto it = values.find(v);
  return it == values.end() ? -1 : it->second.producer;
}

inline bool reader::is_op(int k, std::string_view t) const { return k >= 0 && default_domain(*nodes[static_cast<std::size_t>(k)]) && nodes[static_cast<std::size_t>(k)]->op_type() == t && !absorbed[static_cast<std::size_t>(k)]; }

inline const onnx::NodeProto& reader::nd(int k) const { return *nodes[static_cast<std::size_t>(k)]; }

/// Input / output i of node k, or "" when it has fewer (a hostile node may have any count).
inline std::string reader::in_of(int k, int i) const { return k >= 0 && i < nd(k).input_size() ? nd(k).input(i) : std::string(); }

inline std::string reader::out_of(int k, int i) const { return k >= 0 && i < nd(k).output_size() ? nd(k).output(i) : std::string(); }

/// The operand of binary node k that is not `x` (nullopt when neither or both are).
inline std::optional<std::string> reader::other(int k, const std::string& x) const {
  const auto& n = nd(k);
  if (n.input_size() != 2) return std::nullopt;
  if (n.input(0) == x && n.input(1) != x) return n.input(1);
  if (n.input(1) == x && n.input(0) != x) return n.input(0);
  return std::nullopt;
}

inline bool reader::is_param_vector(const std::string& v, std::int64_t h) const {
  auto it = values.find(v);
  return it != values.end() && it->second.init && it->second.known && it->second.shape == tensor_shape{h} && is_float(it->second.type);
}

inline bool reader::reduces_last(int k, std::int64_t rank) const {
  const auto& n = nd(k);
  if (attr_int(n, "keepdims", 1) != 1) return false;
  std::optional<std::vector<std::int64_t>> axes = attr_ints(n, "axes");
  if (!axes && n.input_size() > 1) {
    auto c = constant(n.input(1));
    if (!c) return false;
    axes = std::vector<std::int64_t>();
    for (double d : *c) axes->push_back(static_cast<std::int64_t>(d));
  }
  return axes && axes->size() == 1 && ((*axes)[0] == -1 || (*axes)[0] == rank - 1);
}

inline std::string reader::pattern_name(int k) const {
  const std::string& n = scoped[static_cast<std::size_t>(k)].empty() ? nd(k).name() : scoped[static_cast<std::size_t>(k)];
  const auto slash = n.rfind('/');
  if (slash != std::string::npos && slash > 0) return n.substr(0, slash);
  return n.empty() ? out_of(k, 0) : n;
}

inline void reader::absorb(std::initializer_list<int> ks) {
  for (int k : ks) absorbed[static_cast<std::size_t>(k)] = 1;
}

/// mean = ReduceMean(x); d = Sub(x, mean); var = ReduceMean(Pow(d, 2)); s = Sqrt(Add(var, eps));
/// y = Div(d, s) [; Mul(y, gamma) [; Add(., beta)]] -> layer_norm(x [, gamma [, beta]]) with
/// epsilon eps (a scalar constant in (0, 1]: norm_epsilon; another leaves the nodes unfused).
inline void reader::fuse_layer_norm(int div) {
  const auto& dn = nd(div);
  if (dn.input_size() != 2) return;
  const int sub = producer(in_of(div, 0)), sqrt = producer(in_of(div, 1));
  if (!is_op(sub, "Sub") || !is_op(sqrt, "Sqrt")) return;
  const std::string x = in_of(sub, 0);
  const int mean = producer(in_of(sub, 1));
  auto xv = values.find(x);
  if (xv == values.end() || !xv->second.known || xv->second.shape.rank < 1) return;
  const std::int64_t rank = xv->second.shape.rank, h = xv->second.shape[xv->second.shape.rank - 1u];
  if (!is_op(mean, "ReduceMean") || in_of(mean, 0) != x || !reduces_last(mean, rank)) return;
  const int add = producer(in_of(sqrt, 0));
  if (!is_op(add, "Add") || nd(add).input_size() != 2) return;
  int var = producer(in_of(add, 0));
  std::string eps = in_of(add, 1);
  if (!is_op(var, "ReduceMean")) var = producer(in_of(add, 1)), eps = in_of(add, 0);
  const std::optional<double> epsilon = norm_epsilon(scalar(eps));
  if (!is_op(var, "ReduceMean") || !reduces_last(var, rank) || !epsilon) return;
  const int pow = producer(in_of(var, 0));
  if (!(is_op(pow, "Pow") && in_of(pow, 0) == in_of(div, 0) && near(scalar(in_of(pow, 1)), 2.0)) &&
      !(is_op(pow, "Mul") && nd(pow).input_size() == 2 && in_of(pow, 0) == in_of(div, 0) && in_of(pow, 1) == in_of(div, 0)))
    return;
  // Every intermediate is used only inside the pattern.
  const auto uses = [&](const std::string& v) { auto it = values.find(v); return it == values.end() || it->second.graph_output ? 99 : static_cast<int>(it->second.consumers.size()); };
  if (uses(out_of(mean, 0)) != 1 || uses(out_of(sub, 0)) != 2 || uses(out_of(pow, 0)) != 1 ||
      uses(out_of(var, 0)) != 1 || uses(out_of(add, 0)) != 1 || uses(out_of(sqrt, 0)) != 1)
    return;
  fusion f{op_kind::layer_norm, {x}, {}, pattern_name(div), out_of(div, 0)};
  f.attrs.epsilon = *epsilon;
  int last = div;
  std::vector<int> extra;
  if (auto mul = only_consumer(out_of(div, 0)); mul && is_op(*mul, "Mul")) {
    if (auto gamma = other(*mul, out_of(div, 0)); gamma && is_param_vector(*gamma, h)) {
      f.operands.push_back(*gamma);
      f.output = out_of(*mul, 0);
      last = *mul;
      extra.push_back(*mul);
      if (auto badd = only_consumer(f.output); badd && is_op(*badd, "Add")) {
        if (auto beta = other(*badd, f.output); beta && is_param_vector(*beta, h)) {
          f.operands.push_back(*beta);
          f.output = out_of(*badd, 0);
          last = *badd;
          extra.push_back(*badd);
        }
      }
    }
  }
  absorb({mean, sub, pow, var, add, sqrt, div});
  for (int e : extra) absorb({e});
  fused[last] = std::move(f);  // absorbed too: emitted through `fused`
}

/// The operand of Mul node k that is not the scalar constant `c` (either order); nullopt
/// when k is no such Mul.
inline std::optional<std::string> reader::scaled_by(int k, double c) const {
  if (!is_op(k, "Mul") || nd(k).input_size() != 2) return std::nullopt;
  if (near(scalar(in_of(k, 1)), c)) return in_of(k, 0);
  if (near(scalar(in_of(k, 0)), c)) return in_of(k, 1);
  return std::nullopt;
}

/// The end every GELU form shares: c = Add(f, 1) (node `add`, f the erf / tanh term) and
/// then Mul(Mul(x, c), 0.5) or Mul(Mul(x, 0.5), c). Marks the nodes (and `body`, the
/// term's own nodes) as one fused `kind` vertex of x.
inline bool reader::fuse_gelu_tail(op_kind kind, const std::string& x, const std::string& f, std::vector<int> body, const std::string& name) {
  auto add = only_consumer(f);
  if (!add || !is_op(*add, "Add")) return false;
  auto one = other(*add, f);
  if (!one || !near(scalar(*one), 1.0)) return false;
  const std::string c = out_of(*add, 0);
  auto m1 = only_consumer(c);
  if (!m1 || !is_op(*m1, "Mul")) return false;
  auto o1 = other(*m1, c);
  if (!o1) return false;
  int last = -1;
  body.push_back(*add);
  body.push_back(*m1);
  if (*o1 == x) {  // Mul(x, c) then Mul(., 0.5)
    auto m2 = only_consumer(out_of(*m1, 0));
    if (!m2 || !scaled_by(*m2, 0.5)) return false;
    last = *m2;
  } else if (const int h = producer(*o1); only_consumer(*o1) && scaled_by(h, 0.5) == x) {  // Mul(Mul(x, 0.5), c)
    body.push_back(h);
    last = *m1;
  } else {
    return false;
  }
  body.push_back(last);
  for (int k : body) absorbed[static_cast<std::size_t>(k)] = 1;
  fused[last] = fusion{kind, {x}, {}, name, out_of(last, 0)};
  return true;
}

/// e = Erf(Div(x, sqrt 2) | Mul(x, 1/sqrt 2)); then the GELU tail -> gelu_erf(x) (exact GELU).
inline void reader::fuse_erf_gelu(int erf) {
  const int scale = producer(in_of(erf, 0));
  std::string x;
  if (is_op(scale, "Div") && near(scalar(in_of(scale, 1)), std::sqrt(2.0))) x = in_of(scale, 0);
  else if (auto s = scaled_by(scale, 1.0 / std::sqrt(2.0))) x = *s;
  if (x.empty() || !only_consumer(out_of(scale, 0))) return;
  fuse_gelu_tail(op_kind::gelu_erf, x, out_of(erf, 0), {scale, erf}, pattern_name(erf));
}

/// t = Tanh(Mul(Add(x, Mul(Pow(x, 3), 0.044715)), sqrt(2/pi))) (x^3 also as Mul(Mul(x, x), x));
/// then the GELU tail -> gelu(x), GPT-2's gelu_new (the tanh approximation).
inline void reader::fuse_tanh_gelu(int tanh) {
  const int s = producer(in_of(tanh, 0));
  auto r = scaled_by(s, std::sqrt(2.0 / 3.141592653589793));
  if (!r || !only_consumer(out_of(s, 0)) || !only_consumer(*r)) return;
  const int add = producer(*r);
  if (!is_op(add, "Add") || nd(add).input_size() != 2) return;
  for (int side = 0; side < 2; ++side) {
    const std::string x = in_of(add, side), q = in_of(add, 1 - side);
    const int qk = producer(q);
    auto cube = scaled_by(qk, 0.044715);
    if (!cube || !only_consumer(q) || !only_consumer(*cube)) continue;
    const int pk = producer(*cube);
    std::vector<int> body{s, add, qk, pk, tanh};
    bool is_cube = false;
    if (is_op(pk, "Pow") && in_of(pk, 0) == x && near(scalar(in_of(pk, 1)), 3.0)) {
      is_cube = true;
    } else if (is_op(pk, "Mul") && nd(pk).input_size() == 2) {  // Mul(Mul(x, x), x), either order
      for (int o = 0; o < 2 && !is_cube; ++o) {
        const int sq = producer(in_of(pk, o));
        if (in_of(pk, 1 - o) == x && is_op(sq, "Mul") && in_of(sq, 0) == x && in_of(sq, 1) == x && only_consumer(in_of(pk, o))) {
          is_cube = true;
          body.push_back(sq);
        }
      }
    }
    if (is_cube && fuse_gelu_tail(op_kind::gelu, x, out_of(tanh, 0), body, pattern_name(tanh))) return;
  }
}

/// Mul(x, Sigmoid(x)) (either order), how torch exports SiLU (LLaMA's MLP gate) -> silu(x).
inline void reader::fuse_silu(int sig) {
  const std::string x = in_of(sig, 0), s = out_of(sig, 0);
  auto mul = only_consumer(s);
  if (x.empty() || !mul || !is_op(*mul, "Mul") || other(*mul, s) != x) return;
  absorbed[static_cast<std::size_t>(sig)] = 1;
  absorbed[static_cast<std::size_t>(*mul)] = 1;
  fused[*mul] = fusion{op_kind::silu, {x}, {}, pattern_name(sig), out_of(*mul, 0)};
}

/// LLaMA's RMSNorm as exported: ms = ReduceMean(Pow(x, 2) | Mul(x, x)); s = Sqrt(Add(ms, eps));
/// y = Mul(x, Reciprocal(s)) | Mul(x, Div(1, s)) | Div(x, s) [; Cast] [; Mul(w, .)] ->
/// rms_norm(x [, w]) (over the last dim) with epsilon eps (as the layer norm's).
inline void reader::fuse_rms_norm(int mean) {
  const int pow = producer(in_of(mean, 0));
  std::string x;
  if (is_op(pow, "Pow") && near(scalar(in_of(pow, 1)), 2.0)) x = in_of(pow, 0);
  else if (is_op(pow, "Mul") && nd(pow).input_size() == 2 && in_of(pow, 0) == in_of(pow, 1)) x = in_of(pow, 0);
  auto xv = values.find(x);
  if (x.empty() || xv == values.end() || !xv->second.known || xv->second.shape.rank < 1 || !is_float(xv->second.type)) return;
  const std::int64_t rank = xv->second.shape.rank, h = xv->second.shape[xv->second.shape.rank - 1u];
  if (!reduces_last(mean, rank) || !only_consumer(out_of(pow, 0)) || !only_consumer(out_of(mean, 0))) return;
  auto add = only_consumer(out_of(mean, 0));
  if (!add || !is_op(*add, "Add") || !other(*add, out_of(mean, 0))) return;
  const std::optional<double> epsilon = norm_epsilon(scalar(*other(*add, out_of(mean, 0))));
  if (!epsilon) return;
  auto sqrt = only_consumer(out_of(*add, 0));
  if (!sqrt || !is_op(*sqrt, "Sqrt")) return;
  auto inv = only_consumer(out_of(*sqrt, 0));
  if (!inv) return;
  std::vector<int> body{pow, mean, *add, *sqrt, *inv};
  int last = -1;
  if (is_op(*inv, "Div") && in_of(*inv, 0) == x && in_of(*inv, 1) == out_of(*sqrt, 0)) {
    last = *inv;
  } else {
    const bool recip = is_op(*inv, "Reciprocal") ||
                       (is_op(*inv, "Div") && in_of(*inv, 1) == out_of(*sqrt, 0) && near(scalar(in_of(*inv, 0)), 1.0));
    auto mul = recip ? only_consumer(out_of(*inv, 0)) : std::nullopt;
    if (!mul || !is_op(*mul, "Mul") || other(*mul, out_of(*inv, 0)) != x) return;
    last = *mul;
    body.push_back(last);
  }
  fusion f{op_kind::rms_norm, {x}, {}, pattern_name(*sqrt), out_of(last, 0)};
  f.attrs.epsilon = *epsilon;
  std::string y = f.output;
  auto next = only_consumer(y);
  if (next && is_op(*next, "Cast")) {  // back to the input dtype, before the weight
    auto cv = values.find(out_of(*next, 0));
    if (cv != values.end() && cv->second.known && is_float(cv->second.type) && only_consumer(out_of(*next, 0))) {
      auto wm = only_consumer(out_of(*next, 0));
      auto w = wm && is_op(*wm, "Mul") ? other(*wm, out_of(*next, 0)) : std::nullopt;
      if (w && is_param_vector(*w, h) && producer(*w) < 0) {
        body.push_back(*next);
        y = out_of(*next, 0);
        next = wm;
      }
    }
  }
  if (next && is_op(*next, "Mul")) {
    if (auto w = other(*next, y); w && is_param_vector(*w, h) && producer(*w) < 0) {
      f.operands.push_back(*w);
      f.output = out_of(*next, 0);
      last = *next;
      body.push_back(last);
    }
  }
  if (f.operands.size() == 1 && y != f.output) return;  // a Cast with no weight after it: left alone
  for (int k : body) absorbed[static_cast<std::size_t>(k)] = 1;
  absorbed[static_cast<std::size_t>(last)] = 1;
  fused[last] = std::move(f);
}

inline std::optional<reader::weight_ref> reader::weight_of(const std::string& v) const {
  auto it = values.find(v);
  if (it == values.end()) return std::nullopt;
  if (it->second.init && it->second.known && it->second.shape.rank == 2 && is_float(it->second.type) &&
      producer(v) < 0)
    return weight_ref{v, true};
  const int t = producer(v);
  if (is_op(t, "Transpose") && only_consumer(v)) {
    auto perm = attr_ints(nd(t), "perm");
    const std::string w = in_of(t, 0);
    auto wi = values.find(w);
    if (wi != values.end() && wi->second.init && producer(w) < 0 && wi->second.known && wi->second.shape.rank == 2 &&
        is_float(wi->second.type) && (!perm || *perm == std::vector<std::int64_t>{1, 0}))
      return weight_ref{w, false, t};
  }
  return std::nullopt;
}

/// MatMul(x, W) [+ Add(., b)] with W a 2-D initializer (or its transpose) -> linear.
inline void reader::fuse_linear(int mm) {
  const auto& n = nd(mm);
  if (n.input_size() != 2) return;
  auto w = weight_of(n.input(1));
  auto xv = values.find(n.input(0));
  if (!w || xv == values.end() || !xv->second.known || xv->second.shape.rank < 1) return;
  const tensor_shape ws = values.at(w->name).shape;
  const std::int64_t out_features = w->transposed_weight ? ws[1] : ws[0];
  fusion f{op_kind::linear, {n.input(0), w->name}, {}, pattern_name(mm), n.output(0)};
  f.attrs.transposed_weight = w->transposed_weight;
  int last = mm;
  if (auto add = only_consumer(n.output(0)); add && is_op(*add, "Add")) {
    if (auto b = other(*add, n.output(0)); b && is_param_vector(*b, out_features) && producer(*b) < 0) {
      f.operands.push_back(*b);
      f.output = out_of(*add, 0);
      absorb({mm});
      last = *add;
    }
  }
  if (w->transpose_node >= 0) absorb({w->transpose_node});
  absorbed[static_cast<std::size_t>(last)] = 1;
  fused[last] = std::move(f);
}

/// Why Gemm node k is no linear (alpha or beta not 1, transA, B no 2-D floating initializer,
/// C no 1-D one of B's outputs), or "" with its attrs and operands (x, B [, C]).
inline std::string reader::gemm_as_linear(int k, op_attrs& a, std::vector<std::string>& ops) const {
  const onnx::NodeProto& n = nd(k);
  if (n.input_size() < 2) return "it has fewer than 2 inputs";
  auto w = values.find(in_of(k, 1));
  const bool w_ok = w != values.end() && w->second.init && w->second.producer < 0 && w->second.known &&
                    w->second.shape.rank == 2 && is_float(w->second.type);
  const bool has_c = n.input_size() > 2 && !in_of(k, 2).empty();
  a = op_attrs{};
  a.transposed_weight = attr_int(n, "transB", 0) == 0;
  const std::int64_t nout = w_ok ? w->second.shape[a.transposed_weight ? 1u : 0u] : 0;
  if (attr(n, "alpha") && attr(n, "alpha")->f() != 1.0f) return "alpha is not 1";
  if (has_c && attr(n, "beta") && attr(n, "beta")->f() != 1.0f) return "beta is not 1";
  if (attr_int(n, "transA", 0) != 0) return "transA is set";
  if (!w_ok) return "B is not a 2-D floating initializer";
  if (has_c && !is_param_vector(in_of(k, 2), nout)) return "C is not a 1-D initializer of " + std::to_string(nout);
  ops = {in_of(k, 0), in_of(k, 1)};
  if (has_c) ops.push_back(in_of(k, 2));
  return {};
}

/// Reshape(Gemm(Reshape(x [..., H] -> [N, H]), W [, b]) -> [..., out]): a linear of x, as
/// GPT-2's Conv1D computes (x.view(-1, H), addmm, the view back) and the linear kind takes
/// [..., H] whole. The two views go: flattening the leading dims would tie a split of the
/// sequence to the batch's, which the program does not need.
inline void reader::fuse_flat_linear(int gemm) {
  op_attrs a;
  std::vector<std::string> ops;
  if (!gemm_as_linear(gemm, a, ops).empty()) return;
  const int r1 = producer(in_of(gemm, 0));
  const auto r2 = only_consumer(out_of(gemm, 0));
  if (!is_op(r1, "Reshape") || !only_consumer(in_of(gemm, 0)) || !r2 || !is_op(*r2, "Reshape")) return;
  const auto shape = [&](const std::string& v) -> const tensor_shape* {
    auto it = values.find(v);
    return it != values.end() && it->second.known ? &it->second.shape : nullptr;
  };
  const std::string x = in_of(r1, 0);
  const tensor_shape *xs = shape(x), *flat = shape(in_of(gemm, 0)), *ys = shape(out_of(gemm, 0)), *back = shape(out_of(*r2, 0));
  if (!xs || !flat || !ys || !back || xs->rank < 3 || flat->rank != 2 || ys->rank != 2 || back->rank != xs->rank) return;
  const std::int64_t h = (*xs)[xs->rank - 1u];
  tensor_shape lead = *xs;
  lead.dims[lead.rank - 1u] = 1;
  if ((*flat)[1] != h || elements_of(lead) != (*flat)[0]) return;  // [prod(leading), H]
  tensor_shape want = *xs;
  want.dims[want.rank - 1u] = (*ys)[1];
  if (!(*back == want)) return;  // back to the leading dims
  ops[0] = x;
  absorb({r1, gemm, *r2});
  const bool named = !nd(gemm).name().empty() || !scoped[static_cast<std::size_t>(gemm)].empty();
  fused[*r2] = fusion{op_kind::linear, std::move(ops), a, named ? pattern_name(gemm) : vertex_base(gemm), out_of(*r2, 0)};  // as emit names a Gemm
}

inline void reader::find_fusions() {
  absorbed.assign(nodes.size(), 0);
  // Each pattern from the node it is recognised at, in this order (a pattern's nodes, once
  // absorbed, are no longer offered to the next).
  using fuser = void (reader::*)(int);
  static constexpr std::pair<std::string_view, fuser> passes[] = {
      {"Div", &reader::fuse_layer_norm}, {"ReduceMean", &reader::fuse_rms_norm}, {"Erf", &reader::fuse_erf_gelu},
      {"Tanh", &reader::fuse_tanh_gelu}, {"Sigmoid", &reader::fuse_silu},      {"Softmax", &reader::fuse_attention},
      {"MatMul", &reader::fuse_linear},  {"Gemm", &reader::fuse_flat_linear}};  // after the attention: it may read its view
  for (const auto& [op, fuse] : passes)
    for (std::size_t k = 0; k < nodes.size(); ++k)
      if (needed[k] && is_op(static_cast<int>(k), op)) (this->*fuse)(static_cast<int>(k));
}

}  // namespace autoshard::detail::onnx_in
