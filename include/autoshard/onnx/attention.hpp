#pragma once
/// The attention pattern: Softmax(QK^T / sqrt(hd) [+ causal mask]) V over heads split from
/// [B,S,H] by Reshape + Transpose and merged back, as exporters write scaled-dot-product
/// attention; its causal masks, constant or computed from positions and evaluated.
#include "fusions.hpp"

namespace autoshard::detail::onnx_in {

/// Transpose(Reshape(x [B,S,H] -> [B,S,heads,hd]), perm): x, heads; nullopt otherwise.
inline std::optional<std::pair<std::string, std::int64_t>> reader::heads_of(const std::string& v, const std::vector<std::int64_t>& perm) const {
  const int t = producer(v);
  if (!is_op(t, "Transpose") || !only_consumer(v) || attr_ints(nd(t), "perm") != perm) return std::nullopt;
  const int r = producer(in_of(t, 0));
  if (!is_op(r, "Reshape") || !only_consumer(in_of(t, 0))) return std::nullopt;
  const std::string x = in_of(r, 0);
  auto xi = values.find(x);
  auto ri = values.find(out_of(r, 0));
  if (xi == values.end() || ri == values.end() || !xi->second.known || !ri->second.known) return std::nullopt;
  const tensor_shape& a = xi->second.shape;
  const tensor_shape& b = ri->second.shape;
  if (a.rank != 3 || b.rank != 4 || b[0] != a[0] || b[1] != a[1] || times(b[2], b[3]) != a[2]) return std::nullopt;
  return std::pair{x, b[2]};
}

/// Whether `v` is a constant causal mask for scores whose last two dims are [S, S]: an
/// initializer [.., P, P] (or the top-left [0:S, 0:S] of it that Slices with zero starts
/// take, as exporters cut a buffer of max_positions to the sequence) holding, on and below
/// the diagonal / above it: with `additive`, 0 / at most -1e4 (added to the scores); else
/// true / false (Where's condition, GPT-2's bool `bias` buffer).
inline bool reader::causal_mask(const std::string& v, const tensor_shape& scores, bool additive, std::vector<int>& nodes_used) const {
  auto vi = values.find(v);
  if (vi == values.end() || !vi->second.known || vi->second.shape.rank < 2 || scores.rank < 2) return false;
  const tensor_shape& ms = vi->second.shape;  // the mask as the scores see it: [.., S, S] exactly
  if (ms[ms.rank - 1u] != scores[scores.rank - 1u] || ms[ms.rank - 2u] != scores[scores.rank - 2u] ||
      scores[scores.rank - 1u] != scores[scores.rank - 2u])
    return false;
  std::string src = v;
  std::vector<int> slices;
  for (int sl = producer(src); sl >= 0; sl = producer(src)) {
    if (!is_op(sl, "Slice") || !only_consumer(src) || nd(sl).input_size() < 3) return evaluates_causal(v, additive);
    auto st = constant(in_of(sl, 1));
    if (!st) return evaluates_causal(v, additive);
    for (double x : *st)
      if (x != 0) return evaluates_causal(v, additive);
    if (nd(sl).input_size() > 4 && !in_of(sl, 4).empty()) {
      auto steps = constant(in_of(sl, 4));
      if (!steps) return evaluates_causal(v, additive);
      for (double x : *steps)
        if (x != 1) return evaluates_causal(v, additive);
    }
    src = in_of(sl, 0);
    slices.push_back(sl);
  }
  auto it = values.find(src);
  if (it == values.end() || !it->second.init || !it->second.known || it->second.shape.rank < 2) return evaluates_causal(v, additive);
  nodes_used.insert(nodes_used.end(), slices.begin(), slices.end());
  const tensor_shape& s = it->second.shape;
  const std::int64_t n = s[s.rank - 1u];
  if (s[s.rank - 2u] != n || n > 8192 || s.numel() != n * n) return false;
  auto m = constant(src, n * n);
  if (!m) return false;
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      const double x = (*m)[static_cast<std::size_t>(i * n + j)];
      const bool ok = additive ? (j <= i ? x == 0.0 : x <= -1e4) : (j <= i ? x != 0.0 : x == 0.0);
      if (!ok) return false;
    }
  return true;
}

/// Whether `v`, a value computed from constants (mark_constants; torch's dynamo exporter
/// builds its masks from positions at run time), holds a causal mask on its last two dims for
/// every index of the others: with `additive`, 0 on and below the diagonal and at most -1e4
/// above it; else nonzero / zero. Evaluated within constant_budget(), once per value.
inline bool reader::evaluates_causal(const std::string& v, bool additive) const {
  const auto key = std::pair{v, additive};
  if (auto it = causal_memo.find(key); it != causal_memo.end()) return it->second;
  bool ok = false;
  if (computed_from_constants.count(v)) {
    if (const std::optional<dense_value> d = evaluate(v, constant_budget()); d && d->shape.rank >= 2) {
      const std::int64_t n = d->shape[d->shape.rank - 1u];
      ok = d->shape[d->shape.rank - 2u] == n && d->size() > 0;  // every dim >= 1: n x n <= its size
      for (std::size_t base = 0; ok && base < d->size(); base += static_cast<std::size_t>(n * n))
        for (std::int64_t i = 0; ok && i < n; ++i)
          for (std::int64_t j = 0; ok && j < n; ++j) {
            const double x = (*d)[base + static_cast<std::size_t>(i * n + j)];
            ok = additive ? (j <= i ? x == 0.0 : x <= -1e4) : (j <= i ? x != 0.0 : x == 0.0);
          }
    }
  }
  causal_memo[key] = ok;
  return ok;
}

/// The causal mask between the (scaled) scores and the Softmax: an Add of a constant
/// additive mask, or GPT-2's Where(causal, scores, very negative). With one, `z` becomes the
/// scores it masks and `p` their producer, its nodes join `used` and `causal` is set; false
/// when the pattern is not attention as the kind expresses it (no mask: true, nothing changed).
inline bool reader::strip_causal_mask(std::string& z, int& p, const tensor_shape& scores, bool& causal, std::vector<int>& used) const {
  if (is_op(p, "Add")) {  // a constant additive mask
    for (int side = 0; side < 2 && !causal; ++side) {
      std::vector<int> mask_nodes;
      const std::string m = in_of(p, 1 - side);
      const int w = producer(m);  // Where(causal, 0, -inf): torch's dynamo export of a boolean mask
      const std::optional<double> kept = scalar(in_of(w, 1)), fill = scalar(in_of(w, 2));
      const bool where_form = is_op(w, "Where") && nd(w).input_size() == 3 && kept && *kept == 0.0 && fill &&
                              *fill <= -1e4 && causal_mask(in_of(w, 0), scores, false, mask_nodes);
      if (where_form || causal_mask(m, scores, true, mask_nodes)) {
        causal = true;
        used.push_back(p);
        used.insert(used.end(), mask_nodes.begin(), mask_nodes.end());
        z = in_of(p, side);
      }
    }
    if (!causal) return false;
    if (!only_consumer(z)) return false;
    p = producer(z);
  } else if (is_op(p, "Where") && nd(p).input_size() == 3) {  // Where(causal, scores, very negative): GPT-2's export
    std::vector<int> mask_nodes;
    const std::optional<double> fill = scalar(in_of(p, 2));
    if (!fill || !(*fill <= -1e4) || !causal_mask(in_of(p, 0), scores, false, mask_nodes)) return false;
    causal = true;
    used.push_back(p);
    used.insert(used.end(), mask_nodes.begin(), mask_nodes.end());
    z = in_of(p, 1);
    if (!only_consumer(z)) return false;
    p = producer(z);
  }
  return true;
}

/// k^T in heads for the scores' MatMul, from [B,S,H]: Transpose(Reshape(k), [0,2,3,1]),
/// Transpose(kh, [0,1,3,2]) of kh = Transpose(Reshape(k), [0,2,1,3]), or torch's dynamo export
/// of that transpose over a 3-D view, Reshape(Transpose(Reshape(kh, [B*h,S,hd]), [0,2,1]),
/// [B,h,hd,S]). The value k, its heads, and the nodes beyond the heads' own Transpose and
/// Reshape (`extra`, the heads' Transpose last when it is one).
inline std::optional<std::pair<std::string, std::int64_t>> reader::keys_of(const std::string& kt, std::vector<int>& extra) const {
  if (auto k = heads_of(kt, {0, 2, 3, 1})) {
    extra.push_back(producer(kt));
    return k;
  }
  const int t = producer(kt);
  if (is_op(t, "Transpose") && only_consumer(kt) && attr_ints(nd(t), "perm") == std::vector<std::int64_t>{0, 1, 3, 2}) {
    auto k = heads_of(in_of(t, 0), {0, 2, 1, 3});
    if (k) extra.insert(extra.end(), {t, producer(in_of(t, 0))});
    return k;
  }
  const int r2 = producer(kt);
  if (!is_op(r2, "Reshape") || !only_consumer(kt)) return std::nullopt;
  const int t3 = producer(in_of(r2, 0));
  if (!is_op(t3, "Transpose") || !only_consumer(in_of(r2, 0)) || attr_ints(nd(t3), "perm") != std::vector<std::int64_t>{0, 2, 1})
    return std::nullopt;
  const int r1 = producer(in_of(t3, 0));
  if (!is_op(r1, "Reshape") || !only_consumer(in_of(t3, 0))) return std::nullopt;
  const std::string kh = in_of(r1, 0);
  const auto shape = [&](const std::string& v) -> const tensor_shape* {
    auto it = values.find(v);
    return it != values.end() && it->second.known ? &it->second.shape : nullptr;
  };
  const tensor_shape *h = shape(kh), *flat = shape(in_of(t3, 0)), *out = shape(kt);
  if (!h || !flat || !out || h->rank != 4 || flat->rank != 3 || out->rank != 4) return std::nullopt;
  const tensor_shape& a = *h;
  if (!(times(a[0], a[1]) == (*flat)[0] && (*flat)[1] == a[2] && (*flat)[2] == a[3]) ||
      !(*out == tensor_shape{a[0], a[1], a[3], a[2]}))
    return std::nullopt;
  auto k = heads_of(kh, {0, 2, 1, 3});
  if (k) extra.insert(extra.end(), {r2, t3, r1, producer(kh)});
  return k;
}

/// Softmax(QK^T / sqrt(hd) [+ causal mask]) V over heads split from [B,S,H] by
/// Reshape + Transpose, merged back by Transpose + Reshape -> attention(q, k, v). The scale may
/// follow the product (Div or Mul by a scalar) or be split over q and k^T before it (torch's
/// dynamo export multiplies each by sqrt(scale)); the probabilities may pass the exporter's
/// guard Where(IsNaN(p), 0, p), the identity on a softmax of finite scores, causal or unmasked
/// (a row always keeps its diagonal).
inline void reader::fuse_attention(int sm) {
  const auto& n = nd(sm);
  if (n.input_size() != 1 || n.output_size() != 1) return;
  auto in = values.find(n.input(0));
  if (in == values.end() || !in->second.known || in->second.shape.rank != 4 || !only_consumer(n.input(0))) return;
  if (attr_int(n, "axis", -1) != -1 && attr_int(n, "axis", -1) != 3) return;
  std::vector<int> used{sm};
  std::string z = n.input(0);
  const tensor_shape scores = in->second.shape;
  bool causal = false;
  int p = producer(z);
  if (!strip_causal_mask(z, p, scores, causal, used)) return;
  double scale = 1.0;
  if (is_op(p, "Div") || is_op(p, "Mul")) {
    auto c = scalar(in_of(p, 1));
    if (!c || *c == 0.0) return;
    scale = nd(p).op_type() == "Div" ? 1.0 / *c : *c;
    used.push_back(p);
    z = in_of(p, 0);
    if (!only_consumer(z)) return;
    p = producer(z);
  }
  if (!is_op(p, "MatMul")) return;
  used.push_back(p);
  std::string qh = in_of(p, 0), kt = in_of(p, 1);
  for (std::string* side : {&qh, &kt}) {  // Mul(q, sqrt(scale)) @ Mul(k^T, sqrt(scale))
    const int m = producer(*side);
    if (!is_op(m, "Mul") || nd(m).input_size() != 2 || !only_consumer(*side)) continue;
    for (int o = 0; o < 2; ++o)
      if (const std::optional<double> c = scalar(in_of(m, o)); c && *c != 0.0 && in_of(m, 1 - o) != *side) {
        scale *= *c;
        used.push_back(m);
        *side = in_of(m, 1 - o);
        break;
      }
  }
  auto q = heads_of(qh, {0, 2, 1, 3});
  std::vector<int> k_nodes;
  auto k = keys_of(kt, k_nodes);
  if (!q || !k || q->second != k->second) return;
  const std::int64_t heads = q->second;
  const std::int64_t hd = values.at(q->first).shape[2] / heads;
  if (std::abs(scale * std::sqrt(static_cast<double>(hd)) - 1.0) > 1e-3) return;  // the kind scales by 1/sqrt(hd)
  // probs [-> Where(IsNaN(probs), 0, probs)] @ vh, back to [B,S,H]
  std::string probs = n.output(0);
  auto pv = only_consumer(probs);
  if (!pv) {
    auto pi = values.find(probs);
    if (pi == values.end() || pi->second.graph_output || pi->second.consumers.size() != 2) return;
    int isnan = pi->second.consumers[0], guard = pi->second.consumers[1];
    if (is_op(guard, "IsNaN")) std::swap(isnan, guard);
    if (!is_op(isnan, "IsNaN") || !is_op(guard, "Where") || nd(guard).input_size() != 3 || in_of(isnan, 0) != probs ||
        only_consumer(out_of(isnan, 0)) != guard || in_of(guard, 0) != out_of(isnan, 0) || in_of(guard, 2) != probs)
      return;
    const std::optional<double> zero = scalar(in_of(guard, 1));
    if (!zero || *zero != 0.0) return;
    used.insert(used.end(), {isnan, guard});
    probs = out_of(guard, 0);
    pv = only_consumer(probs);
  }
  if (!pv || !is_op(*pv, "MatMul") || in_of(*pv, 0) != probs) return;
  auto v = heads_of(in_of(*pv, 1), {0, 2, 1, 3});
  if (!v || v->second != heads) return;
  auto tr = only_consumer(out_of(*pv, 0));
  if (!tr || !is_op(*tr, "Transpose") || attr_ints(nd(*tr), "perm") != std::vector<std::int64_t>{0, 2, 1, 3}) return;
  auto rs = only_consumer(out_of(*tr, 0));
  if (!rs || !is_op(*rs, "Reshape")) return;
  for (const std::string& x : {q->first, k->first, v->first})
    if (!values.at(x).known || values.at(x).shape.rank != 3) return;
  // Back to [B,S,H], or to another view of those elements (GPT-2's Conv1D reads [B*S,H]): the
  // attention then ends at the Transpose, whose value becomes the [B,S,H] the kind gives, and
  // the Reshape stays, reading it.
  const tensor_shape qs = values.at(q->first).shape;
  auto out_v = values.find(out_of(*rs, 0));
  if (out_v == values.end() || !out_v->second.known || !elements_of(qs) || elements_of(out_v->second.shape) != elements_of(qs)) return;
  const bool merged = out_v->second.shape == qs;
  for (const std::string& hv : {qh, in_of(*pv, 1)}) {  // the Transpose and Reshape of q and v
    const int t = producer(hv);
    used.push_back(t);
    used.push_back(producer(in_of(t, 0)));
  }
  used.insert(used.end(), k_nodes.begin(), k_nodes.end());
  used.push_back(producer(in_of(k_nodes.back(), 0)));  // the Reshape of k into heads
  used.push_back(*pv);
  used.push_back(*tr);
  for (int u : used) absorbed[static_cast<std::size_t>(u)] = 1;
  const int last = merged ? *rs : *tr;
  absorbed[static_cast<std::size_t>(last)] = 1;
  if (!merged) values.at(out_of(*tr, 0)).shape = qs;
  fusion f{op_kind::attention, {q->first, k->first, v->first}, {}, pattern_name(sm), out_of(last, 0)};
  f.attrs.heads = static_cast<int>(heads);
  f.attrs.kv_heads = static_cast<int>(heads);
  f.attrs.causal = causal;
  fused[last] = std::move(f);
}

}  // namespace autoshard::detail::onnx_in
