#pragma once
/// The attention pattern: Softmax(QK^T / sqrt(hd) [+ causal mask]) V over heads split from
/// [B,S,H] by Reshape + Transpose and merged back, as exporters write scaled-dot-product
/// attention; its causal masks, constant or computed from positions and evaluated; and what
/// Hugging Face's LLaMA family does to the heads on the way: rotary positions turned in the
/// heads' layout (rotate_half, its tables evaluated) and key/value heads repeated for the
/// query heads (repeat_kv: grouped-query attention).
#include <cmath>    // std::atan2, std::round
#include <numbers>  // std::numbers::pi

#include "fusions.hpp"

namespace autoshard::detail::onnx_in {

/// Transpose(Reshape(x [B,S,H] -> [B,S,heads,hd]), perm), read by `uses` nodes (a rotary's
/// three, otherwise one): x, heads; nullopt otherwise.
inline std::optional<std::pair<std::string, std::int64_t>> reader::heads_of(const std::string& v, const std::vector<std::int64_t>& perm,
                                                                           std::size_t uses) const {
  const int t = producer(v);
  auto vi = values.find(v);
  if (!is_op(t, "Transpose") || vi == values.end() || vi->second.graph_output || vi->second.consumers.size() != uses ||
      attr_ints(nd(t), "perm") != perm)
    return std::nullopt;
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
  const tensor_shape& ms = vi->second.shape;  // the mask as the scores see it: [.., S, P + S] exactly
  if (ms[ms.rank - 1u] != scores[scores.rank - 1u] || ms[ms.rank - 2u] != scores[scores.rank - 2u] ||
      scores[scores.rank - 1u] < scores[scores.rank - 2u])
    return false;
  // After a key/value cache of P tokens, query i sits at position P + i: evaluated.
  if (const std::int64_t past = scores[scores.rank - 1u] - scores[scores.rank - 2u]; past > 0)
    return evaluates_causal(v, additive, past);
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
/// builds its masks from positions at run time), holds a causal mask on its last two dims
/// [S, past + S] for every index of the others, query i at position past + i (a step after a
/// key/value cache of `past` tokens): with `additive`, 0 for the keys j <= past + i and at
/// most -1e4 for the later ones; else nonzero / zero. Evaluated within constant_budget(),
/// once per value and past.
inline bool reader::evaluates_causal(const std::string& v, bool additive, std::int64_t past) const {
  const auto key = std::tuple{v, additive, past};
  if (auto it = causal_memo.find(key); it != causal_memo.end()) return it->second;
  bool ok = false;
  if (computed_from_constants.count(v) && past >= 0) {
    if (const std::optional<dense_value> d = evaluate(v, constant_budget()); d && d->shape.rank >= 2) {
      const std::int64_t n = d->shape[d->shape.rank - 1u], rows = d->shape[d->shape.rank - 2u];
      ok = n - rows == past && rows >= 1 && d->size() > 0;  // every dim >= 1: rows x n <= its size
      for (std::size_t base = 0; ok && base < d->size(); base += static_cast<std::size_t>(rows * n))
        for (std::int64_t i = 0; ok && i < rows; ++i)
          for (std::int64_t j = 0; ok && j < n; ++j) {
            const double x = (*d)[base + static_cast<std::size_t>(i * n + j)];
            ok = additive ? (j <= past + i ? x == 0.0 : x <= -1e4) : (j <= past + i ? x != 0.0 : x == 0.0);
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

/// The bounds a Slice takes along the last dim of a value of `dim` columns, [start, end)
/// after ONNX's clamping; nullopt unless its starts, ends, axes and steps are constants of one
/// element, the axis is the last (of rank `rank`), and the step 1.
inline std::optional<std::pair<std::int64_t, std::int64_t>> reader::last_dim_slice(int k, std::int64_t rank, std::int64_t dim) const {
  if (!is_op(k, "Slice") || nd(k).input_size() < 3) return std::nullopt;
  const auto one = [&](int i) -> std::optional<double> {
    auto c = constant(in_of(k, i), 1);
    return c && c->size() == 1 ? std::optional<double>((*c)[0]) : std::nullopt;
  };
  const std::optional<double> st = one(1), en = one(2);
  if (!st || !en) return std::nullopt;
  if (nd(k).input_size() > 3 && !in_of(k, 3).empty()) {
    const std::optional<double> ax = one(3);
    if (!ax || (*ax != -1 && *ax != static_cast<double>(rank - 1))) return std::nullopt;
  } else if (rank != 1) {
    return std::nullopt;  // no axes: every axis from the first
  }
  if (nd(k).input_size() > 4 && !in_of(k, 4).empty() && one(4) != 1.0) return std::nullopt;
  const auto clamp = [dim](double x) {
    const std::int64_t v = constant_eval::saturated(x);
    return v < 0 ? std::max<std::int64_t>(0, v > std::numeric_limits<std::int64_t>::min() + dim ? v + dim : 0) : std::min(v, dim);
  };
  return std::pair{clamp(*st), clamp(*en)};
}

/// Hugging Face's rotary in the heads' layout [B,h,S,hd] (apply_rotary_pos_emb):
/// x_rot = Add(Mul(xh, C), Mul(Concat(Neg(Slice(xh, hd/2:)), Slice(xh, :hd/2)), S)), either
/// order of each operation's operands, where C and S are computed from constants and buffers
/// alone (the positions' Range, the inv_freq buffer: computed_with_buffers) and hold cos and
/// sin of position x f_i for column i and i + hd/2 (rotary_frequencies_of). Intermediates
/// are used only inside the pattern. A partial rotary (GPT-NeoX's and Phi-3's
/// apply_rotary_pos_emb: x[..., :R] turned, x[..., R:] passed through) is Concat(that turn of
/// Slice(xh, :R), Slice(xh, R:)) on the last dim, its tables of width R (pair i at
/// base^(-2i/R)): a rotary of R turned dims. Any other form stays as the file computes it.
inline std::optional<reader::rotary_match> reader::rotary_of(const std::string& v, std::int64_t first) const {
  if (const int cat = producer(v); is_op(cat, "Concat") && nd(cat).input_size() == 2) {
    auto vi = values.find(v);
    const std::int64_t axis = attr_int(nd(cat), "axis", 0);
    if (vi == values.end() || !vi->second.known || vi->second.shape.rank != 4 || (axis != -1 && axis != 3)) return std::nullopt;
    const std::int64_t hd = vi->second.shape[3];
    const std::string turned = in_of(cat, 0), pass = in_of(cat, 1);
    const int ps = producer(pass);
    if (!is_op(ps, "Slice") || !is_op(producer(turned), "Add") || !only_consumer(pass) || !only_consumer(turned)) return std::nullopt;
    std::optional<rotary_match> inner = rotary_of(turned, first);  // the turn of heads of R
    if (!inner) return std::nullopt;
    const std::string xh = in_of(ps, 0);
    const int rs = producer(inner->xh);
    auto ri = values.find(inner->xh);
    auto xi = values.find(xh);
    // x[..., :R]: read by the turn's Mul and two Slices alone.
    if (!is_op(rs, "Slice") || in_of(rs, 0) != xh || ri == values.end() || !ri->second.known || ri->second.consumers.size() != 3 ||
        ri->second.graph_output || xi == values.end() || !xi->second.known || !(xi->second.shape == vi->second.shape))
      return std::nullopt;
    const std::int64_t R = ri->second.shape[3];
    if (R < 2 || R >= hd || last_dim_slice(rs, 4, hd) != std::pair<std::int64_t, std::int64_t>{0, R} ||
        last_dim_slice(ps, 4, hd) != std::pair<std::int64_t, std::int64_t>{R, hd})
      return std::nullopt;
    inner->xh = xh;
    inner->dims = R;
    inner->nodes.insert(inner->nodes.end(), {rs, ps, cat});
    return inner;
  }
  const int add = producer(v);
  if (!is_op(add, "Add") || nd(add).input_size() != 2) return std::nullopt;
  auto vi = values.find(v);
  if (vi == values.end() || !vi->second.known || vi->second.shape.rank != 4 || !is_float(vi->second.type)) return std::nullopt;
  const tensor_shape xs = vi->second.shape;
  const std::int64_t seq = xs[2], hd = xs[3];
  if (hd < 2 || hd % 2 != 0) return std::nullopt;
  // A table broadcast to the operand: [.., S, hd], computed from constants.
  const auto table = [&](const std::string& t) {
    auto ti = values.find(t);
    if (ti == values.end() || !ti->second.known || !computed_with_buffers.count(t)) return false;
    const tensor_shape& ts = ti->second.shape;
    if (ts.rank < 2 || ts.rank > 4 || ts[ts.rank - 1u] != hd || ts[ts.rank - 2u] != seq) return false;
    for (std::size_t d = 0; d + 2 < ts.rank; ++d)
      if (ts[d] != 1 && ts[d] != xs[4 - ts.rank + d]) return false;
    return true;
  };
  for (int side = 0; side < 2; ++side) {
    const int mc = producer(in_of(add, side)), ms = producer(in_of(add, 1 - side));
    if (!is_op(mc, "Mul") || !is_op(ms, "Mul") || nd(mc).input_size() != 2 || nd(ms).input_size() != 2 ||
        !only_consumer(in_of(add, side)) || !only_consumer(in_of(add, 1 - side)))
      continue;
    for (int o = 0; o < 2; ++o) {
      const int cat = producer(in_of(ms, o));
      const std::string sin = in_of(ms, 1 - o);
      if (!is_op(cat, "Concat") || nd(cat).input_size() != 2 || !only_consumer(in_of(ms, o)) || !table(sin)) continue;
      if (const std::int64_t axis = attr_int(nd(cat), "axis", 0); axis != -1 && axis != 3) continue;
      const int neg = producer(in_of(cat, 0)), lo = producer(in_of(cat, 1));
      if (!is_op(neg, "Neg") || !only_consumer(in_of(cat, 0)) || !only_consumer(in_of(cat, 1))) continue;
      const int hi = producer(in_of(neg, 0));
      if (!only_consumer(in_of(neg, 0))) continue;
      const std::string xh = in_of(hi, 0);
      auto xi = values.find(xh);
      if (xh.empty() || in_of(lo, 0) != xh || xi == values.end() || !xi->second.known || !(xi->second.shape == xs)) continue;
      if (last_dim_slice(hi, 4, hd) != std::pair<std::int64_t, std::int64_t>{hd / 2, hd} ||
          last_dim_slice(lo, 4, hd) != std::pair<std::int64_t, std::int64_t>{0, hd / 2})
        continue;
      const std::optional<std::string> cos = other(mc, xh);
      if (!cos || !table(*cos)) continue;
      std::optional<rotary_turn> turn = rotary_frequencies_of(*cos, sin, seq, hd, first);
      if (!turn) continue;
      return rotary_match{xh, std::move(*turn), {mc, ms, cat, neg, hi, lo, add}};
    }
  }
  return std::nullopt;
}

/// The frequencies of rotary tables `cos` and `sin` ([.., S, hd], computed from constants)
/// of the S positions from `first` on (a step after a key/value cache of `first` tokens):
/// element [.., p, j] is cos / sin of (first + p) x f_i, i = j mod hd/2, at every index of the
/// leading dims, within 1e-4 + 1e-6 (first + p) (float32's rounding of the angles), for some
/// f_i > 0 per pair; nullopt otherwise (another layout, an attention factor scaling cos and
/// sin as YaRN's, other positions, a pair turning by more than pi a position). Each f_i is
/// read from the turn between the first two positions and refined at the last (its angle
/// there unwrapped by the first estimate). Where every f_i is base^(-2i/hd) (the base from
/// the last pair; 10000 where one position or one pair leaves it free) the answer is that base
/// alone, as the rotary op's default; otherwise (Llama-3's or a linear rope_scaling's
/// frequencies) the f_i themselves, with the base of pair 1 (which Llama-3's scaling keeps).
/// One position past 0 (a decode step's token) shows each pair's angle there only modulo
/// 2 pi: the base is read from the last pair, which turns slowest (its angle below pi), and
/// must fit every pair; explicit frequencies cannot be told apart there (nullopt).
/// Evaluated within constant_budget(), once a pair.
inline std::optional<reader::rotary_turn> reader::rotary_frequencies_of(const std::string& cos, const std::string& sin,
                                                                        std::int64_t seq, std::int64_t hd, std::int64_t first) const {
  const auto key = std::tuple{cos, sin, first};
  if (auto it = rotary_memo.find(key); it != rotary_memo.end()) return it->second;
  std::optional<rotary_turn> turn;
  const std::uint64_t budget = constant_budget();
  std::optional<dense_value> c = evaluate(cos, budget / 2, true);
  std::optional<dense_value> s = c ? evaluate(sin, budget / 2, true) : std::nullopt;
  const std::int64_t half = hd / 2;
  const auto at = [&](const dense_value& t, std::int64_t p, std::int64_t i) { return t[static_cast<std::size_t>(p * hd + i)]; };
  const auto position = [&](std::int64_t p) { return static_cast<double>(first + p); };
  // Every element of the tables is cos / sin of (first + p) x freq[j mod half], within the tolerance.
  const auto fits = [&](const std::vector<double>& freq) {
    const std::size_t n = c->size();
    for (std::size_t e = 0; e < n; ++e) {
      const std::int64_t j = static_cast<std::int64_t>(e % static_cast<std::size_t>(hd));
      const std::int64_t p = static_cast<std::int64_t>(e / static_cast<std::size_t>(hd)) % seq;
      const double angle = position(p) * freq[static_cast<std::size_t>(j % half)];
      const double tol = 1e-4 + 1e-6 * position(p);
      if (!(std::abs((*c)[e] - std::cos(angle)) <= tol) || !(std::abs((*s)[e] - std::sin(angle)) <= tol)) return false;
    }
    return true;
  };
  const auto powers = [&](double base) {
    std::vector<double> f(static_cast<std::size_t>(half));
    for (std::int64_t i = 0; i < half; ++i) f[static_cast<std::size_t>(i)] = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(hd));
    return f;
  };
  const auto base_from = [&](double fi, std::int64_t i) {  // the base whose power -2i/hd is fi
    const double b = std::pow(fi, -static_cast<double>(hd) / (2.0 * static_cast<double>(i)));
    return b > 1.0 && std::isfinite(b) ? std::optional<double>(b) : std::nullopt;
  };
  if (c && s && c->shape == s->shape && c->size() > 0 && seq >= 1 && half >= 1 && first >= 0) {
    if (seq < 2 && first == 0) {  // position 0 alone does not turn: any frequencies fit
      if (fits(powers(10000.0))) turn = rotary_turn{};
    } else if (seq < 2) {  // one position past 0: the slowest pair's angle gives the base
      const double a = std::atan2(at(*s, 0, half - 1), at(*c, 0, half - 1));
      const std::optional<double> base = half >= 2 ? (a > 0 ? base_from(a / position(0), half - 1) : std::nullopt)
                                                   : std::optional<double>(10000.0);
      if (base && fits(powers(*base))) turn = rotary_turn{*base, {}};
    } else {
      std::vector<double> f(static_cast<std::size_t>(half));
      bool positive = true;
      const double last = position(seq - 1), two_pi = 2 * std::numbers::pi;
      for (std::int64_t i = 0; i < half; ++i) {
        // the turn from the first position to the second: sin and cos of their angles' difference
        const double c0 = at(*c, 0, i), s0 = at(*s, 0, i), c1 = at(*c, 1, i), s1 = at(*s, 1, i);
        double fi = std::atan2(s1 * c0 - c1 * s0, c1 * c0 + s1 * s0);
        if (last > 1 && fi > 0) {  // the last position's angle, unwrapped near last x fi
          const double a = std::atan2(at(*s, seq - 1, i), at(*c, seq - 1, i));
          fi = (a + two_pi * std::round((last * fi - a) / two_pi)) / last;
        }
        positive = positive && fi > 0 && std::isfinite(fi);
        f[static_cast<std::size_t>(i)] = fi;
      }
      const auto base_of = [&](std::int64_t i) { return base_from(f[static_cast<std::size_t>(i)], i); };
      const std::optional<double> plain = half >= 2 ? base_of(half - 1) : std::optional<double>(10000.0);
      if (positive && plain && fits(powers(*plain))) turn = rotary_turn{*plain, {}};
      else if (positive && fits(f)) turn = rotary_turn{half >= 2 ? base_of(1).value_or(10000.0) : 10000.0, std::move(f)};
    }
  }
  rotary_memo[key] = turn;
  return turn;
}

/// An attention operand in heads [B,h,S,hd] (see heads_source): [GQA's repeat,
/// Reshape(Expand(Unsqueeze(kh) to [B,kv,1,S,hd], [B,kv,n,S,hd]), [B,kv*n,S,hd])] of
/// [a key/value cache: Concat(past, ., axis 2) of a graph input past [B,kv,P,hd] read by
/// nothing else, its output read by nothing else but as a graph output (present.<i>.key)] of
/// [a rotary in heads (rotary_of), turning from position `first` (-1: the cache's P, else 0)]
/// of Transpose(Reshape(x), [0,2,1,3]).
inline std::optional<reader::heads_source> reader::heads_source_of(const std::string& v, std::int64_t first) const {
  heads_source src;
  std::string h = v;
  std::int64_t repeat = 1;
  const auto shape = [&](const std::string& x) -> const tensor_shape* {
    auto it = values.find(x);
    return it != values.end() && it->second.known ? &it->second.shape : nullptr;
  };
  if (const int r = producer(h); is_op(r, "Reshape") && only_consumer(h)) {
    const int e = producer(in_of(r, 0));
    const int u = is_op(e, "Expand") && only_consumer(in_of(r, 0)) ? producer(in_of(e, 0)) : -1;
    if (is_op(u, "Unsqueeze") && only_consumer(in_of(e, 0))) {
      const tensor_shape *kh = shape(in_of(u, 0)), *us = shape(in_of(e, 0)), *es = shape(in_of(r, 0)), *rs = shape(h);
      if (kh && us && es && rs && kh->rank == 4 && us->rank == 5 && es->rank == 5 && rs->rank == 4) {
        const tensor_shape& a = *kh;
        const std::int64_t n = (*es)[2];
        if (*us == tensor_shape{a[0], a[1], 1, a[2], a[3]} && *es == tensor_shape{a[0], a[1], n, a[2], a[3]} && n >= 1 &&
            times(a[1], n) && *rs == tensor_shape{a[0], a[1] * n, a[2], a[3]}) {
          repeat = n;
          src.nodes.insert(src.nodes.end(), {r, e, u});
          h = in_of(u, 0);
        }
      }
    }
  }
  if (const int cat = producer(h); is_op(cat, "Concat") && nd(cat).input_size() == 2) {
    const std::int64_t axis = attr_int(nd(cat), "axis", 0);
    auto ci = values.find(h);
    auto pi = values.find(in_of(cat, 0));
    const tensor_shape *now = shape(in_of(cat, 1)), *all = shape(h);
    if ((axis == 2 || axis == -2) && ci != values.end() && ci->second.consumers.size() == 1 && pi != values.end() &&
        pi->second.graph_input && !pi->second.init && !pi->second.graph_output && pi->second.consumers.size() == 1 &&
        pi->second.known && pi->second.shape.rank == 4 && now && now->rank == 4 && all && all->rank == 4 &&
        only_consumer(in_of(cat, 1))) {
      src.past = in_of(cat, 0);
      src.present = h;
      src.past_len = pi->second.shape[2];
      src.nodes.push_back(cat);
      h = in_of(cat, 1);
    }
  }
  if (first < 0) first = src.past_len;
  std::size_t uses = 1;
  if (const std::optional<rotary_match> rot = only_consumer(h) ? rotary_of(h, first) : std::nullopt) {
    uses = rot->dims > 0 ? 2 : 3;  // the Mul by cos and the two Slices; a partial rotary's two Slices
    src.rotary_at = rot->nodes.back();
    src.nodes.insert(src.nodes.end(), rot->nodes.begin(), rot->nodes.end() - 1);
    h = rot->xh;
    src.rotary = fusion{op_kind::rotary, {}, {}, {}, out_of(src.rotary_at, 0)};  // named by fuse_attention
    src.rotary->attrs.rotary_half = true;
    src.rotary->attrs.rotary_base = rot->turn.base;
    src.rotary->attrs.rotary_frequencies = rot->turn.frequencies;
    src.rotary->attrs.rotary_dims = rot->dims;
    src.rotary->attrs.rotary_offset = first;  // the step's tokens come after the cached ones
  }
  const auto x = heads_of(h, {0, 2, 1, 3}, uses);
  if (!x) return std::nullopt;
  src.x = x->first;
  src.own = x->second;
  src.heads = x->second * repeat;
  const int t = producer(h);
  src.nodes.insert(src.nodes.end(), {t, producer(in_of(t, 0))});  // the heads' Transpose and Reshape
  if (src.rotary) {
    src.rotary->operands = {src.x};
    src.rotary->attrs.heads = static_cast<int>(src.own);
  }
  return src;
}

/// k^T in heads for the scores' MatMul: Transpose(Reshape(k), [0,2,3,1]),
/// Transpose(kh, [0,1,3,2]) of kh in heads (heads_source_of), or torch's dynamo export of that
/// transpose over a 3-D view, Reshape(Transpose(Reshape(kh, [B*h,S,hd]), [0,2,1]),
/// [B,h,hd,S]). Its source, the nodes beyond kh among its nodes.
inline std::optional<reader::heads_source> reader::keys_of(const std::string& kt) const {
  std::vector<int> extra;
  if (auto k = heads_of(kt, {0, 2, 3, 1})) {
    const int t = producer(kt);
    extra.insert(extra.end(), {t, producer(in_of(t, 0))});
    return heads_source{k->first, k->second, k->second, extra, std::nullopt, -1, {}, {}, 0};
  }
  const auto with_extra = [&](std::optional<heads_source> k) {
    if (k) k->nodes.insert(k->nodes.end(), extra.begin(), extra.end());
    return k;
  };
  const int t = producer(kt);
  if (is_op(t, "Transpose") && only_consumer(kt) && attr_ints(nd(t), "perm") == std::vector<std::int64_t>{0, 1, 3, 2}) {
    extra.push_back(t);
    return with_extra(heads_source_of(in_of(t, 0)));
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
  extra.insert(extra.end(), {r2, t3, r1});
  return with_extra(heads_source_of(kh));
}

/// Softmax(QK^T / sqrt(hd) [+ causal mask]) V over heads split from [B,S,H] by
/// Reshape + Transpose, merged back by Transpose + Reshape -> attention(q, k, v). The scale may
/// follow the product (Div or Mul by a scalar) or be split over q and k^T before it (torch's
/// dynamo export multiplies each by sqrt(scale)); the probabilities may pass the exporter's
/// guard Where(IsNaN(p), 0, p), the identity on a softmax of finite scores, causal or unmasked
/// (a row always keeps its diagonal). Each operand's heads may be traced further
/// (heads_source_of): q's and k's through a rotary in heads, which becomes a rotary of their
/// [B,S,H] value (its output value takes that shape), and k's and v's through a repeat of
/// their heads, which the kind's kv_heads says.
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
  // k first: a key/value cache in front of its new keys says where q's positions start.
  const std::optional<heads_source> k = keys_of(kt);
  const std::optional<heads_source> q = k ? heads_source_of(qh, k->past_len) : std::nullopt;
  if (!q || !k || q->heads != k->heads || !q->past.empty()) return;  // k's own heads divide them: heads = own x its repeat
  const std::int64_t heads = q->heads;
  if (q->own != heads) return;  // repeated query heads: no attention of the kind's
  const std::int64_t hd = values.at(q->x).shape[2] / heads;
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
  const std::optional<heads_source> v = heads_source_of(in_of(*pv, 1));
  if (!v || v->heads != heads || v->own != k->own || v->rotary || v->past.empty() != k->past.empty()) return;
  auto tr = only_consumer(out_of(*pv, 0));
  if (!tr || !is_op(*tr, "Transpose") || attr_ints(nd(*tr), "perm") != std::vector<std::int64_t>{0, 2, 1, 3}) return;
  auto rs = only_consumer(out_of(*tr, 0));
  if (!rs || !is_op(*rs, "Reshape")) return;
  for (const std::string& x : {q->x, k->x, v->x})
    if (!values.at(x).known || values.at(x).shape.rank != 3) return;
  // Back to [B,S,H], or to another view of those elements (GPT-2's Conv1D reads [B*S,H]): the
  // attention then ends at the Transpose, whose value becomes the [B,S,H] the kind gives, and
  // the Reshape stays, reading it.
  const tensor_shape qs = values.at(q->x).shape;
  auto out_v = values.find(out_of(*rs, 0));
  if (out_v == values.end() || !out_v->second.known || !elements_of(qs) || elements_of(out_v->second.shape) != elements_of(qs)) return;
  const bool merged = out_v->second.shape == qs;
  // A key/value cache: the kind's operands 3 and 4, [B, P, kv_heads*hd]; the queries at
  // positions P.. (the mask counted from there: scores [.., S, P + S]).
  const std::int64_t past = k->past_len;
  if (!k->past.empty()) {
    const tensor_shape ks = values.at(k->x).shape;
    const auto layout = [&](const heads_source& h) {
      return "[" + std::to_string(qs[0]) + ", " + std::to_string(h.own) + ", P, " + std::to_string(hd) + "]";
    };
    for (const heads_source* h : {&*k, &*v}) {
      const tensor_shape& ps = values.at(h->past).shape;
      if (ps[0] != qs[0] || ps[1] != h->own || ps[3] != hd || ps[2] != past)
        fail("graph input " + quoted_text(h->past) + " is " + to_string(ps) + ", concatenated in front of " +
             (h == &*k ? "the keys" : "the values") + " of the attention at " + quoted_text(pattern_name(sm)) +
             " as its key/value cache: it must be " + layout(*h) + " (batch, " + std::to_string(h->own) + " key/value heads of " +
             std::to_string(hd) + ", the past P of its keys' cache, " + std::to_string(past) + ")");
    }
    if (past < 1 || past > max_attention_window)
      fail("graph input " + quoted_text(k->past) + ": a key/value cache of " + std::to_string(past) + " tokens; autoshard takes 1.." +
           std::to_string(max_attention_window));
    if (scores[3] != past + ks[1] || (causal && ks[1] != qs[1])) return;
    // One query at position P sees every key, with or without a mask: causal is the same.
    if (!causal && qs[1] == 1) causal = true;
  } else if (scores[3] != scores[2] && causal) {
    return;  // a mask counted from a past the keys do not have
  }
  for (const heads_source* h : {&*q, &*k, &*v}) used.insert(used.end(), h->nodes.begin(), h->nodes.end());
  used.push_back(*pv);
  used.push_back(*tr);
  for (int u : used) absorbed[static_cast<std::size_t>(u)] = 1;
  const int last = merged ? *rs : *tr;
  absorbed[static_cast<std::size_t>(last)] = 1;
  if (!merged) values.at(out_of(*tr, 0)).shape = qs;
  for (const heads_source* h : {&*q, &*k}) {  // a rotary in the heads' layout: on [B,S,H] before them
    if (!h->rotary) continue;
    absorbed[static_cast<std::size_t>(h->rotary_at)] = 1;
    values.at(h->rotary->output).shape = values.at(h->x).shape;
    fused[h->rotary_at] = *h->rotary;
    fused[h->rotary_at].name = pattern_name(sm) + (h == &*q ? ".rotary_q" : ".rotary_k");  // as the builders name them
  }
  fusion f{op_kind::attention, {q->value(), k->value(), v->value()}, {}, pattern_name(sm), out_of(last, 0)};
  for (const heads_source* h : {&*k, &*v}) {  // the cache's inputs, in the kind's layout; present.<i>.* no output
    if (h->past.empty()) continue;
    values.at(h->past).shape = tensor_shape{qs[0], past, h->own * hd};
    kv_caches.insert(h->past);
    if (values.at(h->present).graph_output) out.cache_outputs.push_back(h->present);
    f.operands.push_back(h->past);
  }
  f.attrs.heads = static_cast<int>(heads);
  f.attrs.kv_heads = static_cast<int>(k->own);
  f.attrs.causal = causal;
  fused[last] = std::move(f);
}

}  // namespace autoshard::detail::onnx_in
