// Backward kernels against central finite differences of the forward kernels, in f64, for
// every operator kind: the loss is sum(output * R) for a fixed random R, so its gradient is
// the backward kernel fed dy = R, and each operand element is nudged both ways.
#include <doctest/doctest.h>

#include <autoshard/exec/backward.hpp>

#include <cmath>
#include <random>
#include <set>

namespace {
using namespace autoshard;

struct bw_case {
  std::string what;
  op_kind kind;
  op_attrs attrs;
  std::vector<tensor_shape> shapes;
  std::vector<std::int64_t> int_range;  // > 0: operand i is integer ids/labels in [0, range)
  double lo = -1.0, hi = 1.0;           // float values, uniform
};

host_tensor bw_random(const tensor_shape& s, std::int64_t int_range, double lo, double hi, std::mt19937_64& rng) {
  if (int_range > 0) {
    host_tensor t(dtype::i64, s);
    std::uniform_int_distribution<std::int64_t> u(0, int_range - 1);
    for (std::int64_t i = 0; i < t.numel(); ++i) t.as<std::int64_t>()[i] = u(rng);
    return t;
  }
  host_tensor t(dtype::f64, s);
  std::uniform_real_distribution<double> u(lo, hi);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.as<double>()[i] = u(rng);
  return t;
}

double bw_loss(const node& nd, const std::vector<host_tensor>& x, const host_tensor& r, const local_context& c) {
  std::vector<const host_tensor*> in;
  for (const host_tensor& t : x) in.push_back(&t);
  const host_tensor y = run_kernel<double>(nd, in, c);
  double s = 0;
  for (std::int64_t i = 0; i < y.numel(); ++i) s += y.as<double>()[i] * r.as<double>()[i];
  return s;
}

// Largest |analytic - numeric| / max(1, |numeric|) over every float operand element.
double bw_check(const bw_case& k) {
  std::mt19937_64 rng(7);
  node nd{"op", k.kind, k.attrs, {}, dtype::f64};
  std::vector<host_tensor> x;
  for (std::size_t i = 0; i < k.shapes.size(); ++i)
    x.push_back(bw_random(k.shapes[i], i < k.int_range.size() ? k.int_range[i] : 0, k.lo, k.hi, rng));
  std::vector<tensor_shape> s2 = k.shapes;
  const tensor_shape out = infer_shape(k.kind, k.attrs, s2);
  const local_context c = whole_context(k.shapes, out);
  const host_tensor r = bw_random(out, 0, -1.0, 1.0, rng);
  std::vector<const host_tensor*> in;
  for (const host_tensor& t : x) in.push_back(&t);
  const std::vector<host_tensor> g = run_kernel_backward<double>(nd, in, r, c);
  REQUIRE(g.size() == x.size());
  double worst = 0.0;
  const double h = 1e-6;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (x[i].type() != dtype::f64) {
      CHECK(g[i].data() == nullptr);  // integer operands have no gradient
      continue;
    }
    REQUIRE(g[i].shape() == x[i].shape());
    for (std::int64_t e = 0; e < x[i].numel(); ++e) {
      double& v = x[i].as<double>()[e];
      const double keep = v;
      v = keep + h;
      const double up = bw_loss(nd, x, r, c);
      v = keep - h;
      const double down = bw_loss(nd, x, r, c);
      v = keep;
      const double numeric = (up - down) / (2 * h);
      worst = std::max(worst, std::abs(g[i].as<double>()[e] - numeric) / std::max(1.0, std::abs(numeric)));
    }
  }
  return worst;
}

std::vector<bw_case> bw_cases() {
  std::vector<bw_case> v;
  op_attrs none;
  op_attrs tw;
  tw.transposed_weight = true;
  v.push_back({"linear with bias", op_kind::linear, none, {{2, 3, 4}, {5, 4}, {5}}, {}});
  v.push_back({"linear, [in,out] weight", op_kind::linear, tw, {{3, 4}, {4, 5}}, {}});
  v.push_back({"batched matmul", op_kind::matmul, none, {{2, 3, 4}, {2, 4, 5}}, {}});
  v.push_back({"matmul with a shared right operand", op_kind::matmul, none, {{2, 3, 4}, {4, 5}}, {}});
  for (op_kind k : {op_kind::gelu, op_kind::gelu_erf, op_kind::silu, op_kind::tanh, op_kind::exp, op_kind::dropout})
    v.push_back({std::string(to_string(k)), k, none, {{2, 5}}, {}});
  v.push_back({"gelu_erf, wide range", op_kind::gelu_erf, none, {{3, 4}}, {}, -4.0, 4.0});
  v.push_back({"relu (away from 0)", op_kind::relu, none, {{2, 5}}, {}, 0.1, 1.0});
  v.push_back({"relu, negative side", op_kind::relu, none, {{2, 5}}, {}, -1.0, -0.1});
  op_attrs rot;
  rot.heads = 2;
  v.push_back({"rotary", op_kind::rotary, rot, {{1, 3, 8}}, {}});
  op_attrs rot_half = rot;
  rot_half.rotary_half = true;
  rot_half.rotary_base = 500000.0;
  v.push_back({"rotary, rotate_half pairs", op_kind::rotary, rot_half, {{1, 3, 8}}, {}});
  op_attrs rot_scaled = rot_half;
  rot_scaled.rotary_frequencies = {1.3, 0.07};
  v.push_back({"rotary, explicit frequencies", op_kind::rotary, rot_scaled, {{1, 3, 8}}, {}});
  op_attrs rot_yarn = rot_scaled;  // YaRN's attention_factor: cos and sin times it, so the gradient too
  rot_yarn.scale = 1.25;
  v.push_back({"rotary, scaled (YaRN's attention_factor)", op_kind::rotary, rot_yarn, {{1, 3, 8}}, {}});
  op_attrs rot_offset = rot_yarn;  // after a key/value cache of 7: positions 7.., the backward turning back by them
  rot_offset.rotary_offset = 7;
  v.push_back({"rotary, after a key/value cache (rotary_offset 7)", op_kind::rotary, rot_offset, {{1, 3, 8}}, {}});
  op_attrs rot_partial = rot_half;  // R = 4 of heads of 8: the other 4 dims pass the gradient through
  rot_partial.rotary_dims = 4;
  v.push_back({"rotary, partial (rotary_dims 4 of 8), rotate_half pairs", op_kind::rotary, rot_partial, {{1, 3, 16}}, {}});
  rot_partial.rotary_half = false;
  rot_partial.rotary_frequencies = {0.9, 0.2};
  v.push_back({"rotary, partial, interleaved pairs, explicit frequencies", op_kind::rotary, rot_partial, {{1, 3, 16}}, {}});
  for (op_kind k : {op_kind::add, op_kind::sub, op_kind::mul})
    v.push_back({std::string(to_string(k)) + " with broadcasting", k, none, {{2, 3, 4}, {4}}, {}});
  v.push_back({"div with broadcasting", op_kind::div, none, {{2, 1, 4}, {3, 1}}, {}, 0.5, 1.5});
  v.push_back({"layer_norm", op_kind::layer_norm, none, {{3, 6}, {6}, {6}}, {}});
  v.push_back({"layer_norm without weights", op_kind::layer_norm, none, {{3, 6}}, {}});
  v.push_back({"rms_norm", op_kind::rms_norm, none, {{3, 6}, {6}}, {}});
  op_attrs eps;  // an epsilon that weighs against the variance of values in [-1, 1] (about 1/3)
  eps.epsilon = 0.5;
  v.push_back({"layer_norm, epsilon 0.5", op_kind::layer_norm, eps, {{3, 6}, {6}, {6}}, {}});
  v.push_back({"rms_norm, epsilon 0.5", op_kind::rms_norm, eps, {{3, 6}, {6}}, {}});
  op_attrs offset;  // Gemma's norms: the row times 1 + weight
  offset.weight_offset = 1.0;
  v.push_back({"rms_norm, weight_offset 1 (Gemma's)", op_kind::rms_norm, offset, {{3, 6}, {6}}, {}});
  v.push_back({"layer_norm, weight_offset 1", op_kind::layer_norm, offset, {{3, 6}, {6}, {6}}, {}});
  op_attrs last;
  last.axis = -1;
  op_attrs mid;
  mid.axis = 1;
  v.push_back({"softmax, last axis", op_kind::softmax, last, {{2, 3, 4}}, {}});
  v.push_back({"softmax, middle axis", op_kind::softmax, mid, {{2, 3, 4}}, {}});
  v.push_back({"embedding", op_kind::embedding, none, {{2, 3}, {5, 4}}, {5, 0}});
  op_attrs scaled;  // Gemma's normalizer
  scaled.scale = 2.5;
  v.push_back({"embedding, rows scaled by 2.5 (Gemma's normalizer)", op_kind::embedding, scaled, {{2, 3}, {5, 4}}, {5, 0}});
  op_attrs rs;
  rs.dims = {3, 4};
  v.push_back({"reshape", op_kind::reshape, rs, {{2, 6}}, {}});
  op_attrs tp;
  tp.dims = {2, 0, 1};
  v.push_back({"transpose", op_kind::transpose, tp, {{2, 3, 4}}, {}});
  op_attrs r1;
  r1.dims = {1};
  op_attrs r02;
  r02.dims = {0, 2};
  v.push_back({"reduce_sum", op_kind::reduce_sum, r1, {{2, 3, 4}}, {}});
  v.push_back({"reduce_mean", op_kind::reduce_mean, r02, {{2, 3, 4}}, {}});
  v.push_back({"concat", op_kind::concat, mid, {{2, 3, 2}, {2, 2, 2}}, {}});
  op_attrs sp;
  sp.axis = 1;
  sp.start = 1;
  sp.length = 2;
  v.push_back({"split", op_kind::split, sp, {{2, 5}}, {}});
  op_attrs at;
  at.heads = 4;
  at.kv_heads = 2;
  at.causal = true;
  v.push_back({"causal attention, grouped heads", op_kind::attention, at, {{2, 3, 8}, {2, 3, 4}, {2, 3, 4}}, {}});
  op_attrs atw = at;
  atw.window = 2;
  v.push_back({"causal attention, sliding window 2 of 5, grouped heads", op_kind::attention, atw, {{2, 5, 8}, {2, 5, 4}, {2, 5, 4}}, {}});
  op_attrs ata = at;  // ALiBi: a constant of the scores, which the backward's recomputed softmax must add too
  ata.alibi = alibi_rule::bloom;
  v.push_back({"causal attention, BLOOM's ALiBi, grouped heads", op_kind::attention, ata, {{2, 5, 8}, {2, 5, 4}, {2, 5, 4}}, {}});
  ata.alibi = alibi_rule::falcon;
  ata.window = 3;
  v.push_back({"causal attention, Falcon's ALiBi, sliding window 3 of 5, grouped heads", op_kind::attention, ata, {{2, 5, 8}, {2, 5, 4}, {2, 5, 4}}, {}});
  op_attrs at2;
  at2.heads = 2;
  v.push_back({"attention", op_kind::attention, at2, {{1, 3, 4}, {1, 4, 4}, {1, 4, 4}}, {}});
  v.push_back({"where with broadcasting", op_kind::where, none, {{2, 1, 4}, {2, 3, 4}, {4}}, {2, 0, 0}});
  v.push_back({"where, condition broadcast over rows", op_kind::where, none, {{3, 1}, {1, 5}, {3, 5}}, {2, 0, 0}});
  op_attrs ex;
  ex.dims = {2, 3, 4, 5};
  v.push_back({"expand (new leading dim and a size-1 dim)", op_kind::expand, ex, {{3, 1, 5}}, {}});
  v.push_back({"cross_entropy", op_kind::cross_entropy, none, {{4, 5}, {4}}, {0, 5}, -2.0, 2.0});
  return v;
}

}  // namespace

TEST_CASE("every backward kernel matches finite differences of its forward kernel (f64, every operator kind)") {
  std::set<op_kind> covered;
  for (const bw_case& k : bw_cases()) {
    CAPTURE(k.what);
    CHECK(bw_check(k) < 1e-6);
    covered.insert(k.kind);
  }
  for (op_kind k : all_op_kinds) {
    if (is_source(k) || k == op_kind::opaque) continue;  // opaque: no kernel (tested apart)
    CAPTURE(to_string(k));
    CHECK(covered.count(k) == 1);
  }
}

TEST_CASE("a backward kernel that is wrong is caught: the check can fail") {
  // The finite differences of gelu compared with the gradient of relu must differ.
  bw_case k{"gelu", op_kind::gelu, {}, {{2, 5}}, {}};
  std::mt19937_64 rng(7);
  node gelu{"op", op_kind::gelu, {}, {}, dtype::f64};
  node relu{"op", op_kind::relu, {}, {}, dtype::f64};
  const host_tensor x = bw_random({2, 5}, 0, -1.0, 1.0, rng);
  const host_tensor r = bw_random({2, 5}, 0, -1.0, 1.0, rng);
  const local_context c = whole_context({x.shape()}, x.shape());
  std::vector<const host_tensor*> in{&x};
  const host_tensor a = std::move(run_kernel_backward<double>(gelu, in, r, c)[0]);
  const host_tensor b = std::move(run_kernel_backward<double>(relu, in, r, c)[0]);
  double diff = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) diff = std::max(diff, std::abs(a.as<double>()[i] - b.as<double>()[i]));
  CHECK(diff > 1e-3);
  CHECK(bw_check(k) < 1e-6);
  CHECK_THROWS_AS(run_kernel_backward<double>(gelu, in, host_tensor(dtype::f64, {3}), c), exec_error);
}

TEST_CASE("a sliding window's backward: a key gets gradient only from the queries whose window holds it (hand-computed)") {
  // Zero queries weigh the keys they see alike: with window 2 of 3 positions, query 0 sees key 0,
  // query 1 keys 0 and 1 (1/2 each), query 2 keys 1 and 2; dy = 1 gives dv = 1 + 1/2, 1/2 + 1/2, 1/2
  // (without the window query 2 would give key 0 a third too: 11/6).
  op_attrs a;
  a.heads = 1;
  a.causal = true;
  a.window = 2;
  const node nd{"op", op_kind::attention, a, {}, dtype::f64};
  const std::vector<tensor_shape> shapes{{1, 3, 1}, {1, 3, 1}, {1, 3, 1}};
  host_tensor q(dtype::f64, {1, 3, 1}), k(dtype::f64, {1, 3, 1}), v(dtype::f64, {1, 3, 1}), dy(dtype::f64, {1, 3, 1});
  for (int i = 0; i < 3; ++i) {
    q.as<double>()[i] = 0.0;
    k.as<double>()[i] = static_cast<double>(i + 1);
    v.as<double>()[i] = static_cast<double>(i);
    dy.as<double>()[i] = 1.0;
  }
  std::vector<const host_tensor*> in{&q, &k, &v};
  const std::vector<host_tensor> g = run_kernel_backward<double>(nd, in, dy, whole_context(shapes, shapes[0]));
  REQUIRE(g.size() == 3);
  CHECK(g[2].as<double>()[0] == doctest::Approx(1.5).epsilon(1e-14));
  CHECK(g[2].as<double>()[1] == doctest::Approx(1.0).epsilon(1e-14));
  CHECK(g[2].as<double>()[2] == doctest::Approx(0.5).epsilon(1e-14));
  // Query 2's score gradient: p (dp - p.dp) over keys 1, 2 (v 1, 2, weights 1/2): dq = scale sum_j ds_j k_j
  // = (1/2 (1 - 1.5) x 2 + 1/2 (2 - 1.5) x 3) = 0.25; key 0 outside its window adds nothing.
  CHECK(g[0].as<double>()[2] == doctest::Approx(0.25).epsilon(1e-14));
}

TEST_CASE("ALiBi's backward on a rank holding head 1 alone adds head 1's slope (its global index), not head 0's") {
  // 2 heads of 2 over 4 positions (slopes 1/16 and 1/256): the gradients of the piece at offset 2
  // (head 1's columns) are the unsharded gradients' head 1; taken as head 0 (offset 0), others.
  op_attrs a;
  a.heads = 2;
  a.causal = true;
  a.alibi = alibi_rule::bloom;
  const node nd{"op", op_kind::attention, a, {}, dtype::f64};
  const tensor_shape whole{1, 4, 4}, piece{1, 4, 2};
  std::mt19937_64 rng(11);
  std::vector<host_tensor> x;
  for (int i = 0; i < 3; ++i) x.push_back(bw_random(whole, 0, -2.0, 2.0, rng));
  const host_tensor dy = bw_random(whole, 0, -1.0, 1.0, rng);
  const auto head1 = [&](const host_tensor& t) {
    host_tensor p(dtype::f64, piece);
    for (int s = 0; s < 4; ++s)
      for (int d = 0; d < 2; ++d) p.as<double>()[s * 2 + d] = t.as<double>()[s * 4 + 2 + d];
    return p;
  };
  const std::vector<const host_tensor*> in{&x[0], &x[1], &x[2]};
  const std::vector<host_tensor> g = run_kernel_backward<double>(nd, in, dy, whole_context({whole, whole, whole}, whole));
  std::vector<host_tensor> xp;
  for (const host_tensor& t : x) xp.push_back(head1(t));
  const host_tensor dyp = head1(dy);
  const std::vector<const host_tensor*> in_piece{&xp[0], &xp[1], &xp[2]};
  const auto worst = [&](std::int64_t offset) {
    local_context c = whole_context({whole, whole, whole}, whole);
    for (tensor_shape& o : c.in_offset) o = tensor_shape{0, 0, offset};
    c.out_shape = piece;
    const std::vector<host_tensor> gp = run_kernel_backward<double>(nd, in_piece, dyp, c);
    double w = 0;
    for (std::size_t i = 0; i < 3; ++i) {
      const host_tensor want = head1(g[i]);
      for (std::int64_t e = 0; e < want.numel(); ++e) w = std::max(w, std::abs(gp[i].as<double>()[e] - want.as<double>()[e]));
    }
    return w;
  };
  CHECK(worst(2) < 1e-12);
  CHECK(worst(0) > 1e-4);
}
