// The reference executor: kernels against hand-computed values, every strategy of every
// operator kind executed on 4 real Gloo ranks against the unsharded kernel, solved plans of
// small GPT-2, BERT and LLaMA graphs executed on 8 ranks, and plans that are wrong on purpose.
#if defined(__SANITIZE_ADDRESS__)
#define AUTOSHARD_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define AUTOSHARD_TEST_ASAN 1
#endif
#endif
#ifndef AUTOSHARD_TEST_ASAN
#define AUTOSHARD_TEST_ASAN 0
#endif
#if AUTOSHARD_TEST_ASAN
#include <sanitizer/allocator_interface.h>  // __sanitizer_get_current_allocated_bytes
#endif
#include <doctest/doctest.h>

#include <autoshard/exec/exec.hpp>

#include <malloc.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <utility>

#include "unit/exec/tiny_models.hpp"
#include "unit/scratch.hpp"

namespace {
using namespace autoshard;

host_tensor make(tensor_shape s, std::vector<double> v) {
  host_tensor t(dtype::f64, s);
  REQUIRE(static_cast<std::int64_t>(v.size()) == t.numel());
  std::copy(v.begin(), v.end(), t.as<double>());
  return t;
}
host_tensor make_ids(tensor_shape s, std::vector<std::int64_t> v) {
  host_tensor t(dtype::i64, s);
  std::copy(v.begin(), v.end(), t.as<std::int64_t>());
  return t;
}

host_tensor run1(const node& nd, std::vector<const host_tensor*> in) {
  std::vector<tensor_shape> shapes;
  for (const host_tensor* t : in) shapes.push_back(t->shape());
  std::vector<tensor_shape> s2 = shapes;
  const tensor_shape out = infer_shape(nd.kind, nd.attrs, s2);
  return run_kernel<double>(nd, in, whole_context(shapes, out));
}

node op(op_kind k, op_attrs a = {}) { return node{"op", k, std::move(a), {}, dtype::f64}; }

// The pass's options for the tests' 2x4 cluster: `mode`, `algo`, no baselines compared.
autosharding_options pass_on_2x4(run_mode mode, algo a = autosharding_options{}.algo) {
  autosharding_options o;
  o.mesh = make_cluster_mesh({2, 4});
  o.pricing.mode = mode;
  o.compare_baselines = false;
  o.algo = a;
  return o;
}

// Every operator piece compared with the same block of the unsharded value (Partial axes
// summed first), as verify_plan does; returns the largest difference.
double compare_on_ranks(mesh_communicator& mc, const model_graph& g, const std::vector<strategy>& plan,
                        const std::vector<host_tensor>& sources, const std::vector<host_tensor>& ref) {
  double worst = 0.0;
  run_sharded<double>(mc, g, plan, sources, [&](vertex_t v, const host_tensor& piece, const sharding_spec& spec) {
    if (!g[v].is_operator()) return;
    sharding_spec settled = spec;
    for (std::size_t a = 0; a < spec.mesh_rank; ++a)
      if (spec[a].is_partial()) settled[a] = Replicate();
    host_tensor got = redistribute(mc, piece.view(), g[v].shape, spec, settled);
    host_tensor want = shard_of(ref[v], mc.mesh(), settled, mc.rank());
    REQUIRE(got.shape() == want.shape());
    for (std::int64_t i = 0; i < got.numel(); ++i)
      worst = std::max(worst, std::abs(got.as<double>()[i] - want.as<double>()[i]));
  });
  return worst;
}

}  // namespace

TEST_CASE("kernels compute what the operators mean (hand-computed values)") {
  SUBCASE("linear, both weight layouts, with bias") {
    const host_tensor x = make({2, 3}, {1, 2, 3, 4, 5, 6});
    const host_tensor w = make({2, 3}, {1, 0, -1, 2, 1, 0});  // [out, in]
    const host_tensor b = make({2}, {10, 20});
    const host_tensor y = run1(op(op_kind::linear), {&x, &w, &b});
    CHECK(y.shape() == tensor_shape{2, 2});
    // row 0: [1-3, 2+2] + b = [8, 24]; row 1: [4-6, 8+5] + b = [8, 33]
    CHECK(std::vector<double>(y.as<double>(), y.as<double>() + 4) == std::vector<double>{8, 24, 8, 33});
    op_attrs t;
    t.transposed_weight = true;
    const host_tensor wt = make({3, 2}, {1, 2, 0, 1, -1, 0});  // [in, out], the same weight
    const host_tensor yt = run1(op(op_kind::linear, t), {&x, &wt, &b});
    CHECK(bitwise_equal(y, yt));
  }
  SUBCASE("causal attention with grouped heads: position 0 sees only itself") {
    op_attrs a;
    a.heads = 2;
    a.kv_heads = 1;
    a.causal = true;
    const host_tensor q = make({1, 2, 4}, {1, 0, 0, 1, 0, 1, 1, 0});
    const host_tensor k = make({1, 2, 2}, {1, 0, 0, 1});
    const host_tensor v = make({1, 2, 2}, {1, 2, 3, 4});
    const host_tensor o = run1(op(op_kind::attention, a), {&q, &k, &v});
    const double* p = o.as<double>();
    CHECK(p[0] == 1.0);  // position 0, head 0: only key 0 -> v[0]
    CHECK(p[1] == 2.0);
    CHECK(p[2] == 1.0);  // head 1 shares the one kv head
    // position 1, head 0: q=[0,1], scores [0, 1]/sqrt(2)
    const double e = std::exp(1.0 / std::sqrt(2.0)), w1 = e / (1 + e);
    CHECK(p[4] == doctest::Approx((1 - w1) * 1 + w1 * 3).epsilon(1e-14));
    CHECK(p[5] == doctest::Approx((1 - w1) * 2 + w1 * 4).epsilon(1e-14));
  }
  SUBCASE("each norm adds its own epsilon (attrs.epsilon), forward and backward") {
    // x = [1, 2, 3, 4]: variance 1.25 about the mean 2.5, mean square 7.5. At epsilon 0.5 the
    // layer norm divides by sqrt(1.75) (1.3229, not the default's sqrt(1.25001) = 1.1180) and
    // the RMS norm by sqrt(8) (2.8284, not sqrt(7.50001) = 2.7386).
    const host_tensor x = make({1, 4}, {1, 2, 3, 4});
    const host_tensor w = make({4}, {1, 1, 2, 2});
    const host_tensor b = make({4}, {0, 0, 0, 1});
    op_attrs half;
    half.epsilon = 0.5;
    const host_tensor ln = run1(op(op_kind::layer_norm, half), {&x, &w, &b});
    const std::vector<double> ln_want{-1.5 / std::sqrt(1.75), -0.5 / std::sqrt(1.75), 2 * 0.5 / std::sqrt(1.75),
                                      2 * 1.5 / std::sqrt(1.75) + 1};
    for (std::size_t i = 0; i < 4; ++i) CHECK(ln.as<double>()[i] == doctest::Approx(ln_want[i]).epsilon(1e-14));
    const host_tensor rms = run1(op(op_kind::rms_norm, half), {&x, &w});
    const std::vector<double> rms_want{1 / std::sqrt(8.0), 2 / std::sqrt(8.0), 2 * 3 / std::sqrt(8.0), 2 * 4 / std::sqrt(8.0)};
    for (std::size_t i = 0; i < 4; ++i) CHECK(rms.as<double>()[i] == doctest::Approx(rms_want[i]).epsilon(1e-14));
    // The default's is visibly another row.
    CHECK(run1(op(op_kind::rms_norm), {&x, &w}).as<double>()[0] == doctest::Approx(1 / std::sqrt(7.5 + 1e-5)).epsilon(1e-14));
    // The backward of y = x / sqrt(mean square + eps) (no weight), by hand: with r = sqrt(7.5 + 0.5),
    // dx_i = dy_i / r - x_i (sum_j dy_j x_j) / (n r^3); dy = [1, 0, 0, 0]: dx_0 = 1/r - 1/(4 r^3).
    const host_tensor dy = make({1, 4}, {1, 0, 0, 0});
    const std::vector<const host_tensor*> xs{&x};
    const std::vector<host_tensor> dx =
        run_kernel_backward<double>(op(op_kind::rms_norm, half), xs, dy, whole_context({x.shape()}, x.shape()));
    const double r = std::sqrt(8.0);
    CHECK(dx[0].as<double>()[0] == doctest::Approx(1 / r - 1 / (4 * r * r * r)).epsilon(1e-14));
    CHECK(dx[0].as<double>()[3] == doctest::Approx(-4 / (4 * r * r * r)).epsilon(1e-14));
    // An epsilon autoshard does not compute with is refused by the shape rule, naming it.
    for (const double bad : {0.0, -1e-5, 2.0, std::numeric_limits<double>::infinity(), std::nan("")}) {
      op_attrs a;
      a.epsilon = bad;
      const std::vector<tensor_shape> s{tensor_shape{1, 4}};
      const std::string why = "rms_norm: epsilon " + exact_number(bad) + " is not a finite number in (0, 1]";
      CHECK_THROWS_WITH_AS(infer_shape(op_kind::rms_norm, a, s), doctest::Contains(why.c_str()), graph_error);
    }
  }
  SUBCASE("Gemma's scaling: a norm's weight_offset (1 + weight) and an embedding's scale, forward and backward") {
    // x = [1, 2, 3, 4], mean square 7.5: rms_norm at the default epsilon divides by
    // r = sqrt(7.50001); with weight_offset 1 and weight [0, 0, 1, -1] the row is times [1, 1, 2, 0].
    const host_tensor x = make({1, 4}, {1, 2, 3, 4});
    const host_tensor w = make({4}, {0, 0, 1, -1});
    op_attrs gemma;
    gemma.weight_offset = 1.0;
    const host_tensor y = run1(op(op_kind::rms_norm, gemma), {&x, &w});
    const double r = std::sqrt(7.5 + 1e-5);
    const std::vector<double> want{1 / r, 2 / r, 2 * 3 / r, 0};
    for (std::size_t i = 0; i < 4; ++i) CHECK(y.as<double>()[i] == doctest::Approx(want[i]).epsilon(1e-14));
    // Without the offset the same weights zero the first two: visibly another row.
    CHECK(run1(op(op_kind::rms_norm), {&x, &w}).as<double>()[0] == 0.0);
    // Backward, dy = [0, 0, 0, 1] on the zeroed column (1 + w = 0): dx is 0 and dw_3 = x_3 / r.
    const host_tensor dy = make({1, 4}, {0, 0, 0, 1});
    const std::vector<const host_tensor*> xs{&x, &w};
    const std::vector<host_tensor> d =
        run_kernel_backward<double>(op(op_kind::rms_norm, gemma), xs, dy, whole_context({x.shape(), w.shape()}, x.shape()));
    for (std::size_t i = 0; i < 4; ++i) CHECK(d[0].as<double>()[i] == doctest::Approx(0.0).epsilon(1e-14));
    CHECK(d[1].as<double>()[3] == doctest::Approx(4 / r).epsilon(1e-14));
    // The embedding's rows times its scale (its gradient: backward_test's finite differences).
    const host_tensor ids = make_ids({1, 2}, {2, 0});
    const host_tensor table = make({3, 2}, {1, 2, 3, 4, 5, 6});
    op_attrs norm;
    norm.scale = 8.0;  // GemmaModel's sqrt(64)
    const host_tensor e = run1(op(op_kind::embedding, norm), {&ids, &table});
    const std::vector<double> rows{40, 48, 8, 16};
    for (std::size_t i = 0; i < 4; ++i) CHECK(e.as<double>()[i] == rows[i]);
    // A scale or offset that is not a finite number is refused by the shape rule, naming it.
    op_attrs inf_scale;
    inf_scale.scale = std::numeric_limits<double>::infinity();
    const std::vector<tensor_shape> es{tensor_shape{1, 2}, tensor_shape{3, 2}};
    CHECK_THROWS_WITH_AS(infer_shape(op_kind::embedding, inf_scale, es), doctest::Contains("embedding: scale inf is not a finite number"),
                         graph_error);
    const std::vector<tensor_shape> alone{tensor_shape{1, 4}};
    CHECK_THROWS_WITH_AS(infer_shape(op_kind::rms_norm, gemma, alone),
                         doctest::Contains("rms_norm: weight_offset 1 without a weight"), graph_error);
  }
  SUBCASE("causal attention with a sliding window: position q sees keys q-W+1..q, the window's W keys") {
    // Zero queries score every key alike, so each output is the mean of the values it sees:
    // v = 1, 10, 100, 1000 at positions 0..3 (both dims, 10x apart).
    op_attrs a;
    a.heads = 1;
    a.causal = true;
    const host_tensor q = make({1, 4, 2}, {0, 0, 0, 0, 0, 0, 0, 0});
    const host_tensor k = make({1, 4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
    const host_tensor v = make({1, 4, 2}, {1, 10, 10, 100, 100, 1000, 1000, 10000});
    const auto first_dims = [&](const op_attrs& at) {
      const host_tensor o = run1(op(op_kind::attention, at), {&q, &k, &v});
      std::vector<double> r;
      for (int i = 0; i < 4; ++i) r.push_back(o.as<double>()[2 * i]);
      return r;
    };
    const std::vector<double> full = first_dims(a);
    CHECK(full[3] == doctest::Approx(1111.0 / 4).epsilon(1e-14));
    a.window = 2;  // itself and the one key before it
    const std::vector<double> w2 = first_dims(a);
    CHECK(w2[0] == doctest::Approx(1.0).epsilon(1e-14));
    CHECK(w2[1] == doctest::Approx(11.0 / 2).epsilon(1e-14));
    CHECK(w2[2] == doctest::Approx(110.0 / 2).epsilon(1e-14));
    CHECK(w2[3] == doctest::Approx(1100.0 / 2).epsilon(1e-14));
    a.window = 1;  // itself only
    CHECK(first_dims(a) == std::vector<double>{1, 10, 100, 1000});
    a.window = 4;  // the whole sequence: as no window
    CHECK(first_dims(a) == full);
    a.window = 1000;
    CHECK(first_dims(a) == full);
  }
  SUBCASE("causal attention with ALiBi: BLOOM's bias after the scaling, Falcon's scaled with the scores, each head its own slope") {
    // 2 heads of D = 4 over 3 positions: slopes 1/16 and 1/256 (transformers' for 2 heads, exact
    // in float and bfloat16). The score of query i, key j <= i, head h is q.k / 2 + s_h j (BLOOM)
    // or (q.k + s_h j) / 2 (Falcon); the output the softmax-weighted mean of v over j <= i.
    const int H = 2, D = 4, S = 3;
    const double slope[2] = {1.0 / 16, 1.0 / 256};
    std::vector<double> qv, kv, vv;
    for (int i = 0; i < S * H * D; ++i) {
      qv.push_back(0.25 * ((i * 7) % 5) - 0.5);
      kv.push_back(0.5 * ((i * 3) % 7) - 1.0);
      vv.push_back(std::pow(10.0, i / (H * D)) + (i % (H * D)));  // v at position j: 10^j + column
    }
    const host_tensor q = make({1, S, H * D}, qv), k = make({1, S, H * D}, kv), v = make({1, S, H * D}, vv);
    const auto expected = [&](alibi_rule r) {  // by hand, one (query, head) at a time
      std::vector<double> o(static_cast<std::size_t>(S * H * D), 0.0);
      for (int i = 0; i < S; ++i)
        for (int h = 0; h < H; ++h) {
          std::vector<double> w;
          double sum = 0;
          for (int j = 0; j <= i; ++j) {
            double dot = 0;
            for (int d = 0; d < D; ++d) dot += qv[static_cast<std::size_t>(i * H * D + h * D + d)] * kv[static_cast<std::size_t>(j * H * D + h * D + d)];
            const double bias = r == alibi_rule::none ? 0.0 : slope[h] * j;
            w.push_back(std::exp(r == alibi_rule::falcon ? (dot + bias) / 2 : dot / 2 + bias));
            sum += w.back();
          }
          for (int j = 0; j <= i; ++j)
            for (int d = 0; d < D; ++d)
              o[static_cast<std::size_t>(i * H * D + h * D + d)] += w[static_cast<std::size_t>(j)] / sum * vv[static_cast<std::size_t>(j * H * D + h * D + d)];
        }
      return o;
    };
    const auto ran = [](const host_tensor& t) { return std::vector<double>(t.as<double>(), t.as<double>() + t.numel()); };
    const auto close = [](const std::vector<double>& a, const std::vector<double>& b) {
      double worst = 0;
      for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
      return worst;
    };
    op_attrs a;
    a.heads = H;
    a.causal = true;
    const std::vector<double> plain = ran(run1(op(op_kind::attention, a), {&q, &k, &v}));
    CHECK(close(plain, expected(alibi_rule::none)) < 1e-12);
    for (const alibi_rule r : {alibi_rule::bloom, alibi_rule::falcon}) {
      CAPTURE(to_string(r));
      a.alibi = r;
      const std::vector<double> got = ran(run1(op(op_kind::attention, a), {&q, &k, &v}));
      CHECK(close(got, expected(r)) < 1e-12);
      CHECK(close(got, plain) > 1e-3);  // the bias moves the output
    }
    a.alibi = alibi_rule::bloom;
    CHECK(close(ran(run1(op(op_kind::attention, a), {&q, &k, &v})), expected(alibi_rule::falcon)) > 1e-3);  // the place matters

    // A rank holding head 1 alone (its columns 4..7, at offset 4 in the global q, k, v) adds head
    // 1's slope: its output is the unsharded run's head 1. Taking the local index (head 0's slope,
    // as if the piece were at offset 0) gives another.
    const auto head1 = [&](const host_tensor& t) {
      std::vector<double> c;
      for (int i = 0; i < S; ++i)
        for (int d = 0; d < D; ++d) c.push_back(t.as<double>()[i * H * D + D + d]);
      return make({1, S, D}, c);
    };
    const host_tensor q1 = head1(q), k1 = head1(k), v1 = head1(v);
    const std::vector<const host_tensor*> in1{&q1, &k1, &v1};
    const host_tensor whole = run1(op(op_kind::attention, a), {&q, &k, &v});
    const auto on_rank = [&](std::int64_t offset) {
      local_context c = whole_context({q.shape(), k.shape(), v.shape()}, q.shape());
      for (tensor_shape& o : c.in_offset) o = tensor_shape{0, 0, offset};
      c.out_shape = q1.shape();
      return ran(run_kernel<double>(op(op_kind::attention, a), in1, c));
    };
    const std::vector<double> want = ran(head1(whole));
    CHECK(close(on_rank(D), want) < 1e-12);
    CHECK(close(on_rank(0), want) > 1e-3);
  }
  SUBCASE("layer norm, softmax, cross-entropy, embedding, rotary") {
    const host_tensor x = make({1, 4}, {1, 2, 3, 4});
    const host_tensor w = make({4}, {1, 1, 2, 2});
    const host_tensor b = make({4}, {0, 0, 0, 1});
    const host_tensor y = run1(op(op_kind::layer_norm), {&x, &w, &b});
    const double sd = std::sqrt(1.25 + 1e-5);
    CHECK(y.as<double>()[0] == doctest::Approx(-1.5 / sd).epsilon(1e-14));
    CHECK(y.as<double>()[3] == doctest::Approx(2 * 1.5 / sd + 1).epsilon(1e-14));
    op_attrs sm;
    sm.axis = -1;
    const host_tensor s = run1(op(op_kind::softmax, sm), {&x});
    CHECK(s.as<double>()[3] == doctest::Approx(std::exp(4.0) / (std::exp(1.0) + std::exp(2.0) + std::exp(3.0) + std::exp(4.0))).epsilon(1e-14));
    const host_tensor logits = make({2, 3}, {0, 0, 0, 1, 2, 3});
    const host_tensor labels = make_ids({2}, {1, 2});
    const host_tensor l = run1(op(op_kind::cross_entropy), {&logits, &labels});
    const double want = (std::log(3.0) + (std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 3.0)) / 2;
    CHECK(l.as<double>()[0] == doctest::Approx(want).epsilon(1e-14));
    const host_tensor table = make({3, 2}, {0, 1, 10, 11, 20, 21});
    const host_tensor ids = make_ids({1, 2}, {2, 0});
    const host_tensor em = run1(op(op_kind::embedding), {&ids, &table});
    CHECK(std::vector<double>(em.as<double>(), em.as<double>() + 4) == std::vector<double>{20, 21, 0, 1});
    op_attrs r;
    r.heads = 1;
    const host_tensor xr = make({2, 2}, {1, 0, 1, 0});  // positions 0 and 1, one pair
    const host_tensor yr = run1(op(op_kind::rotary, r), {&xr});
    CHECK(yr.as<double>()[0] == 1.0);  // position 0 does not turn
    CHECK(yr.as<double>()[2] == doctest::Approx(std::cos(1.0)).epsilon(1e-14));
    CHECK(yr.as<double>()[3] == doctest::Approx(std::sin(1.0)).epsilon(1e-14));
    r.rotary_offset = 5;  // a step after a key/value cache of 5 tokens: its rows at positions 5 and 6
    const host_tensor yo = run1(op(op_kind::rotary, r), {&xr});
    CHECK(yo.as<double>()[0] == doctest::Approx(std::cos(5.0)).epsilon(1e-14));
    CHECK(yo.as<double>()[1] == doctest::Approx(std::sin(5.0)).epsilon(1e-14));
    CHECK(yo.as<double>()[3] == doctest::Approx(std::sin(6.0)).epsilon(1e-14));
    // Hugging Face's rotate_half pairs (i, i + D/2); pair i turns by p x base^(-2i/D). One head
    // of 4 at position 1, base 100: columns (0, 2) by 1 radian, (1, 3) by 100^(-1/2) = 0.1.
    op_attrs h;
    h.heads = 1;
    h.rotary_half = true;
    h.rotary_base = 100.0;
    const host_tensor xh = make({2, 4}, {0, 0, 0, 0, 1, 2, 3, 4});
    const host_tensor yh = run1(op(op_kind::rotary, h), {&xh});
    const double* ph = yh.as<double>();
    CHECK(ph[0] == 0.0);
    CHECK(ph[4] == doctest::Approx(1 * std::cos(1.0) - 3 * std::sin(1.0)).epsilon(1e-14));
    CHECK(ph[6] == doctest::Approx(1 * std::sin(1.0) + 3 * std::cos(1.0)).epsilon(1e-14));
    CHECK(ph[5] == doctest::Approx(2 * std::cos(0.1) - 4 * std::sin(0.1)).epsilon(1e-14));
    CHECK(ph[7] == doctest::Approx(2 * std::sin(0.1) + 4 * std::cos(0.1)).epsilon(1e-14));
    h.heads = 2;  // heads of 2: rotary pairs a head's own two columns
    const host_tensor y2 = run1(op(op_kind::rotary, h), {&xh});
    CHECK(y2.as<double>()[5] == doctest::Approx(1 * std::sin(1.0) + 2 * std::cos(1.0)).epsilon(1e-14));
    // Explicit frequencies (Llama-3's scaled ones) replace base^(-2i/D), pair by pair: columns
    // (0, 2) turn by 0.5 radians at position 1, (1, 3) by 2, whatever the base.
    h.heads = 1;
    h.rotary_frequencies = {0.5, 2.0};
    const host_tensor yf = run1(op(op_kind::rotary, h), {&xh});  // kept: a pointer into a temporary dangles
    const double* pf = yf.as<double>();
    CHECK(pf[4] == doctest::Approx(1 * std::cos(0.5) - 3 * std::sin(0.5)).epsilon(1e-14));
    CHECK(pf[6] == doctest::Approx(1 * std::sin(0.5) + 3 * std::cos(0.5)).epsilon(1e-14));
    CHECK(pf[5] == doctest::Approx(2 * std::cos(2.0) - 4 * std::sin(2.0)).epsilon(1e-14));
    CHECK(pf[7] == doctest::Approx(2 * std::sin(2.0) + 4 * std::cos(2.0)).epsilon(1e-14));
    h.rotary_frequencies = {0.5, 2.0, 1.0};  // one a pair, two pairs in a head of 4
    CHECK_THROWS_WITH_AS(run1(op(op_kind::rotary, h), {&xh}), doctest::Contains("3 rotary_frequencies for heads of 4: one a pair, 2, is needed"), graph_error);
    h.rotary_frequencies = {0.5, 0.0};
    CHECK_THROWS_WITH_AS(run1(op(op_kind::rotary, h), {&xh}), doctest::Contains("rotary_frequencies[1] 0.000000 is not a finite number above 0"), graph_error);
    h.rotary_frequencies = {std::numeric_limits<double>::infinity(), 1.0};
    CHECK_THROWS_WITH_AS(run1(op(op_kind::rotary, h), {&xh}), doctest::Contains("rotary_frequencies[0] inf is not a finite number above 0"), graph_error);
    h.rotary_frequencies.clear();
    h.heads = 4;  // heads of 1: no pair, refused where the shape is inferred
    CHECK_THROWS_WITH_AS(run1(op(op_kind::rotary, h), {&xh}), doctest::Contains("an even head size"), graph_error);
    h.heads = 1;
    h.rotary_base = 1.0;  // no turn at all, or a growing one: not a rotary's base
    CHECK_THROWS_WITH_AS(run1(op(op_kind::rotary, h), {&xh}), doctest::Contains("base 1.000000 is not a finite number above 1"), graph_error);
  }
  SUBCASE("a partial rotary turns the first R dims of each head and passes the rest through") {
    // GPT-NeoX's rotary_pct, Phi's partial_rotary_factor: R = 4 of each head of D = 8 turned,
    // pair i by p x base^(-2i/R) (not base^(-2i/D)), dims 4..7 copied. Two heads, base 100, at
    // position 1: rotate_half's pairs (0, 2) turn by 100^0 = 1 radian, (1, 3) by 100^(-2/4) = 0.1.
    op_attrs pr;
    pr.heads = 2;
    pr.rotary_half = true;
    pr.rotary_base = 100.0;
    pr.rotary_dims = 4;
    std::vector<double> xv(32);
    for (std::size_t e = 0; e < xv.size(); ++e) xv[e] = 0.5 + static_cast<double>(e) * 0.25;
    const host_tensor xp = make({2, 16}, xv);  // positions 0 and 1
    const auto turned = [&](const op_attrs& a) {
      const host_tensor y = run1(op(op_kind::rotary, a), {&xp});
      return std::vector<double>(y.as<double>(), y.as<double>() + 32);
    };
    const auto turn = [](double a, double b, double angle) {
      return std::pair{a * std::cos(angle) - b * std::sin(angle), a * std::sin(angle) + b * std::cos(angle)};
    };
    const std::vector<double> yh = turned(pr);
    for (std::size_t e = 0; e < 16; ++e) CHECK(yh[e] == xv[e]);  // position 0 does not turn
    for (std::size_t h0 : {16u, 24u}) {  // each head at position 1
      CAPTURE(h0);
      for (std::size_t d = 4; d < 8; ++d) CHECK(yh[h0 + d] == xv[h0 + d]);  // passed through, bit for bit
      const std::pair<double, double> p02 = turn(xv[h0 + 0], xv[h0 + 2], 1.0), p13 = turn(xv[h0 + 1], xv[h0 + 3], 0.1);
      CHECK(yh[h0 + 0] == doctest::Approx(p02.first).epsilon(1e-14));
      CHECK(yh[h0 + 2] == doctest::Approx(p02.second).epsilon(1e-14));
      CHECK(yh[h0 + 1] == doctest::Approx(p13.first).epsilon(1e-14));
      CHECK(yh[h0 + 3] == doctest::Approx(p13.second).epsilon(1e-14));
    }
    pr.rotary_half = false;  // interleaved pairs within the R dims: (0, 1) by 1 radian, (2, 3) by 0.1
    const std::vector<double> yi = turned(pr);
    for (std::size_t h0 : {16u, 24u}) {
      CAPTURE(h0);
      for (std::size_t d = 4; d < 8; ++d) CHECK(yi[h0 + d] == xv[h0 + d]);
      const std::pair<double, double> p01 = turn(xv[h0 + 0], xv[h0 + 1], 1.0), p23 = turn(xv[h0 + 2], xv[h0 + 3], 0.1);
      CHECK(yi[h0 + 0] == doctest::Approx(p01.first).epsilon(1e-14));
      CHECK(yi[h0 + 1] == doctest::Approx(p01.second).epsilon(1e-14));
      CHECK(yi[h0 + 2] == doctest::Approx(p23.first).epsilon(1e-14));
      CHECK(yi[h0 + 3] == doctest::Approx(p23.second).epsilon(1e-14));
    }
    pr.rotary_half = true;  // explicit frequencies: one a pair of the R dims
    pr.rotary_frequencies = {0.5, 2.0};
    const std::vector<double> yf = turned(pr);
    CHECK(yf[16 + 0] == doctest::Approx(turn(xv[16], xv[18], 0.5).first).epsilon(1e-14));
    CHECK(yf[16 + 3] == doctest::Approx(turn(xv[17], xv[19], 2.0).second).epsilon(1e-14));
    CHECK(yf[16 + 5] == xv[16 + 5]);
    pr.rotary_frequencies = {0.5, 2.0, 1.0, 1.0};  // a pair of the whole head each: R/2 = 2 are needed
    CHECK_THROWS_WITH_AS(run1(op(op_kind::rotary, pr), {&xp}),
                         doctest::Contains("4 rotary_frequencies for 4 turned dims of heads of 8: one a pair, 2, is needed"), graph_error);
    pr.rotary_frequencies.clear();
    pr.rotary_dims = 8;  // R = D: the whole head, as 0 says it
    const std::vector<double> y8 = turned(pr);
    pr.rotary_dims = 0;
    CHECK(y8 == turned(pr));
    for (const std::int64_t bad : {3, 10, -2}) {
      CAPTURE(bad);
      pr.rotary_dims = bad;
      const std::string why = "rotary_dims " + std::to_string(bad) + " is not an even number of dims in 1..8, the head size";
      CHECK_THROWS_WITH_AS(run1(op(op_kind::rotary, pr), {&xp}), doctest::Contains(why.c_str()), graph_error);
    }
  }
  SUBCASE("an id outside the table is an exec_error naming the vertex") {
    const host_tensor table = make({3, 2}, {0, 1, 10, 11, 20, 21});
    const host_tensor ids = make_ids({1}, {3});
    node nd = op(op_kind::embedding);
    nd.name = "wte";
    CHECK_THROWS_WITH_AS(run1(nd, {&ids, &table}), doctest::Contains("'wte'"), exec_error);
  }
}

TEST_CASE("an attention after a key/value cache computes the last rows of the whole sequence's attention") {
  // Independent computation: the whole sequence of P + S tokens through the causal kernel with
  // no cache, against the step's S queries, keys and values after the first P keys and values
  // given as the cache: query i of the step is token P + i, so its row is row P + i of the whole
  // run, with a sliding window shorter and longer than the cache, and ALiBi (by key position).
  const std::int64_t B = 2, P = 5, S = 3, H = 4, KV = 2, D = 3;
  const auto filled = [](tensor_shape s, double phase) {
    host_tensor t(dtype::f64, s);
    for (std::int64_t i = 0; i < t.numel(); ++i) t.as<double>()[i] = std::sin(0.7 * static_cast<double>(i) + phase);
    return t;
  };
  const auto tokens = [](const host_tensor& t, std::int64_t from, std::int64_t count) {  // [B, count, W] from token `from`
    const std::int64_t n = t.shape()[1], w = t.shape()[2];
    host_tensor o(dtype::f64, {t.shape()[0], count, w});
    for (std::int64_t b = 0; b < t.shape()[0]; ++b)
      std::copy_n(t.as<double>() + (b * n + from) * w, count * w, o.as<double>() + b * count * w);
    return o;
  };
  const host_tensor q = filled({B, P + S, H * D}, 0.1), k = filled({B, P + S, KV * D}, 1.3), v = filled({B, P + S, KV * D}, 2.9);
  const host_tensor qs = tokens(q, P, S), ks = tokens(k, P, S), vs = tokens(v, P, S), kc = tokens(k, 0, P), vc = tokens(v, 0, P);
  for (const std::int64_t window : {0, 2, 4, 7, 100})
    for (const alibi_rule alibi : {alibi_rule::none, alibi_rule::bloom, alibi_rule::falcon}) {
      op_attrs a;
      a.heads = H;
      a.kv_heads = KV;
      a.causal = true;
      a.window = window;
      a.alibi = alibi;
      const host_tensor want = tokens(run1(op(op_kind::attention, a), {&q, &k, &v}), P, S);
      const host_tensor got = run1(op(op_kind::attention, a), {&qs, &ks, &vs, &kc, &vc});
      REQUIRE(got.shape() == want.shape());
      double worst = 0.0;
      for (std::int64_t i = 0; i < got.numel(); ++i) worst = std::max(worst, std::abs(got.as<double>()[i] - want.as<double>()[i]));
      CHECK_MESSAGE(worst < 1e-12, "window " << window << ", alibi " << to_string(alibi));
      // Without the cache the step's queries see only their own keys: another answer.
      CHECK(run1(op(op_kind::attention, a), {&qs, &ks, &vs}).as<double>()[0] != doctest::Approx(want.as<double>()[0]));
    }
}

TEST_CASE("every strategy of every operator kind runs on 4 Gloo ranks and matches the unsharded kernel") {
  // One-operator graphs; each source starts in the spec the strategy takes (Partial operands
  // start Replicate, so the executor's local Partial conversion runs too).
  struct one_op {
    model_graph g;
    std::vector<vertex_t> ins;
    vertex_t v = 0;
  };
  std::vector<one_op> cases;
  auto make_case = [&](op_kind k, std::vector<std::tuple<std::string, tensor_shape, dtype>> inputs, op_attrs a = {}) {
    one_op c;
    for (auto& [name, shape, t] : inputs) c.ins.push_back(add_input(c.g, name, shape, t));
    c.v = add_op(c.g, k, "op", c.ins, a);
    cases.push_back(std::move(c));
  };
  const dtype f = dtype::f32, i = dtype::i64;
  op_attrs conv1d;
  conv1d.transposed_weight = true;
  make_case(op_kind::linear, {{"x", {4, 3, 6}, f}, {"w", {5, 6}, f}, {"b", {5}, f}});
  make_case(op_kind::linear, {{"x", {4, 6}, f}, {"w", {6, 4}, f}}, conv1d);
  make_case(op_kind::matmul, {{"a", {2, 4, 6}, f}, {"b", {2, 6, 4}, f}});
  make_case(op_kind::matmul, {{"a", {2, 3, 4}, f}, {"b", {4, 2}, f}});
  for (op_kind k : {op_kind::gelu, op_kind::gelu_erf, op_kind::silu, op_kind::relu, op_kind::tanh, op_kind::exp, op_kind::dropout})
    make_case(k, {{"x", {4, 3, 5}, f}});
  op_attrs rot;
  rot.heads = 2;
  make_case(op_kind::rotary, {{"x", {2, 4, 8}, f}}, rot);
  op_attrs rot_half = rot;  // Hugging Face's pairs, LLaMA-3's base
  rot_half.rotary_half = true;
  rot_half.rotary_base = 500000.0;
  make_case(op_kind::rotary, {{"x", {2, 4, 8}, f}}, rot_half);
  op_attrs rot_scaled = rot_half;  // explicit frequencies (Llama-3's scaled ones): pairs keep their own across shards
  rot_scaled.rotary_frequencies = {0.9, 0.05};
  make_case(op_kind::rotary, {{"x", {2, 4, 8}, f}}, rot_scaled);
  op_attrs rot_yarn = rot_scaled;  // YaRN's attention_factor on cos and sin
  rot_yarn.scale = 1.25;
  make_case(op_kind::rotary, {{"x", {2, 4, 8}, f}}, rot_yarn);
  op_attrs rot_partial = rot_half;  // a partial rotary (Pythia's rotary_pct 0.25 of heads of 8): split by whole heads only
  rot_partial.rotary_dims = 2;
  make_case(op_kind::rotary, {{"x", {2, 4, 16}, f}}, rot_partial);
  rot_partial.rotary_half = false;
  rot_partial.rotary_frequencies = {0.7};
  make_case(op_kind::rotary, {{"x", {2, 4, 16}, f}}, rot_partial);
  for (op_kind k : {op_kind::add, op_kind::sub, op_kind::mul, op_kind::div})
    make_case(k, {{"x", {4, 3, 6}, f}, {"y", {6}, f}});
  make_case(op_kind::add, {{"x", {4, 1, 6}, f}, {"y", {1, 3, 6}, f}});
  make_case(op_kind::layer_norm, {{"x", {4, 3, 6}, f}, {"w", {6}, f}, {"b", {6}, f}});
  make_case(op_kind::rms_norm, {{"x", {4, 6}, f}, {"w", {6}, f}});
  op_attrs sm;
  sm.axis = 1;
  make_case(op_kind::softmax, {{"x", {4, 5, 2}, f}}, sm);
  make_case(op_kind::embedding, {{"ids", {4, 3}, i}, {"table", {10, 6}, f}});
  op_attrs rs;
  rs.dims = {4, 3, 2, 4};
  make_case(op_kind::reshape, {{"x", {4, 6, 4}, f}}, rs);
  op_attrs tp;
  tp.dims = {2, 0, 1};
  make_case(op_kind::transpose, {{"x", {4, 3, 6}, f}}, tp);
  op_attrs red;
  red.dims = {0, 2};
  make_case(op_kind::reduce_sum, {{"x", {4, 3, 6}, f}}, red);
  make_case(op_kind::reduce_mean, {{"x", {4, 3, 6}, f}}, red);
  op_attrs cat;
  cat.axis = 1;
  make_case(op_kind::concat, {{"x", {4, 3, 6}, f}, {"y", {4, 2, 6}, f}}, cat);
  op_attrs sp;
  sp.axis = 2;
  sp.start = 2;
  sp.length = 3;
  make_case(op_kind::split, {{"x", {4, 3, 6}, f}}, sp);
  op_attrs att;
  att.heads = 4;
  att.kv_heads = 2;
  att.causal = true;
  make_case(op_kind::attention, {{"q", {2, 3, 8}, f}, {"k", {2, 3, 4}, f}, {"v", {2, 3, 4}, f}}, att);
  op_attrs att_window = att;  // a sliding window of 2 of 5 positions, on every split of the heads and batch
  att_window.window = 2;
  make_case(op_kind::attention, {{"q", {2, 5, 8}, f}, {"k", {2, 5, 4}, f}, {"v", {2, 5, 4}, f}}, att_window);
  for (const alibi_rule r : {alibi_rule::bloom, alibi_rule::falcon}) {  // ALiBi: each head its global slope on every split
    op_attrs att_alibi = att;
    att_alibi.alibi = r;
    make_case(op_kind::attention, {{"q", {2, 5, 8}, f}, {"k", {2, 5, 4}, f}, {"v", {2, 5, 4}, f}}, att_alibi);
  }
  {  // a key/value cache of 3 tokens before the step's 2, windowed past it, with ALiBi: split as the keys and values
    one_op c;
    for (const char* n : {"q", "k", "v"}) c.ins.push_back(add_input(c.g, n, {2, 2, n[0] == 'q' ? 8 : 4}, f));
    for (const char* n : {"k_cache", "v_cache"}) c.ins.push_back(add_kv_cache(c.g, n, {2, 3, 4}, f));
    op_attrs att_cache = att;
    att_cache.window = 3;
    att_cache.alibi = alibi_rule::bloom;
    c.v = add_op(c.g, op_kind::attention, "op", c.ins, att_cache);
    cases.push_back(std::move(c));
  }
  make_case(op_kind::where, {{"c", {4, 1, 6}, dtype::boolean}, {"x", {4, 3, 6}, f}, {"y", {6}, f}});
  op_attrs ex;
  ex.dims = {4, 3, 2, 6};
  make_case(op_kind::expand, {{"x", {3, 1, 6}, f}}, ex);
  make_case(op_kind::cross_entropy, {{"logits", {4, 3, 8}, f}, {"labels", {4, 3}, i}});
  make_case(op_kind::cross_entropy, {{"logits", {6, 8}, f}, {"labels", {6}, i}});

  const device_mesh mesh{2, 2};
  std::map<op_kind, int> per_kind;
  struct run_case {
    const one_op* c;
    std::vector<strategy> plan;
    std::vector<host_tensor> sources, ref;
  };
  std::vector<run_case> runs;
  for (const one_op& c : cases) {
    const std::vector<host_tensor> sources = make_source_values<double>(c.g, 7);
    for (const strategy& s : enumerate_strategies(c.g, c.v, mesh, strategy_options{{device_model{}, run_mode::inference}})) {  // forward runs
      run_case r{&c, std::vector<strategy>(boost::num_vertices(c.g)), {}, {}};
      for (std::size_t k = 0; k < c.ins.size(); ++k) {
        strategy src;
        src.output = s.inputs[k];
        for (std::size_t a = 0; a < src.output.mesh_rank; ++a)
          if (src.output[a].is_partial()) src.output[a] = Replicate();
        r.plan[c.ins[k]] = src;
      }
      r.plan[c.v] = s;
      for (const host_tensor& t : sources) r.sources.push_back(host_tensor::copy_of(t));
      runs.push_back(std::move(r));
      ++per_kind[c.g[c.v].kind];
    }
  }
  for (run_case& r : runs) r.ref = run_unsharded<double>(r.c->g, r.sources);
  std::vector<double> worst(runs.size() * 4, -1.0);
  run_ranks(4, [&](gloo_communicator& world) {
    const int me = world.rank();
    mesh_communicator mc(std::move(world), mesh);
    for (std::size_t k = 0; k < runs.size(); ++k)
      worst[k * 4 + static_cast<std::size_t>(me)] = compare_on_ranks(mc, runs[k].c->g, runs[k].plan, runs[k].sources, runs[k].ref);
  });
  for (std::size_t k = 0; k < runs.size(); ++k) {
    CAPTURE(runs[k].plan[runs[k].c->v].name);
    CAPTURE(to_string(runs[k].c->g[runs[k].c->v].kind));
    for (int r = 0; r < 4; ++r) {
      CHECK(worst[k * 4 + static_cast<std::size_t>(r)] >= 0.0);
      CHECK(worst[k * 4 + static_cast<std::size_t>(r)] < 1e-12);
    }
  }
  for (op_kind k : all_op_kinds) {
    CAPTURE(to_string(k));
    if (!is_source(k) && k != op_kind::opaque) CHECK(per_kind[k] >= 2);  // opaque: no kernel (tested apart)
  }
  MESSAGE("executed " << runs.size() << " strategies on 4 ranks");
  CHECK(runs.size() > 300);
}

namespace {
using autoshard_test::tiny;
bool splits_something(const std::vector<strategy>& plan) {
  for (const strategy& s : plan)
    for (std::size_t a = 0; a < s.output.mesh_rank; ++a)
      if (!s.output[a].is_replicate()) return true;
  return false;
}
}  // namespace

TEST_CASE("solved plans of small GPT-2, BERT and LLaMA graphs run on 8 Gloo ranks and match the unsharded run") {
  autosharding_options o = pass_on_2x4(run_mode::training);
  const model_graph g = build_gpt2(tiny(transformer_config::gpt2_124m()));
  SUBCASE("GPT-2 (small width), the ILP plan on 2x4 under a memory budget, in f64 and f32") {
    // So small a model is cheapest replicated; a budget near the smallest feasible one
    // (every vertex at its smallest usage) forces the solver to split weights and
    // activations over both axes.
    autosharding_options tight = o;
    tight.memory_budget = detail::pass_model(g, o).problem.min_peak_usage().bytes * 108 / 100;
    // The micro-batching the pass's search picks at this budget (2 micro-batches: tp 4, dp 2,
    // full recomputation, ZeRO-2), solved alone: the same plan, and the case takes 22 s of CPU
    // under ASan instead of 73 s (the search solved every micro-batching under the budget). The
    // search is proven exact in tests/unit/pass/training_step_test.cpp.
    tight.pricing.micro_batches = 2;
    const autosharding_result res = autosharding_analysis_pass(g, tight);
    REQUIRE(res.report.plan.par.micro_batches == 2);
    std::size_t split_params = 0, resharded_edges = 0;
    for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
      if (g[v].is_parameter() && !(res.strategies[v].output == replicated_spec(2, g[v].shape.rank))) ++split_params;
    for (auto [e, end] = boost::edges(g); e != end; ++e)
      if (!(res.strategies[boost::source(*e, g)].output ==
            res.strategies[boost::target(*e, g)].inputs[static_cast<std::size_t>(g[*e].operand)]))
        ++resharded_edges;
    CHECK(split_params > 4);
    CHECK(resharded_edges > 4);
    verify_options audited;
    audited.priced = res.report.plan.collectives;
    // The forward of the graph the strategies are for (one micro-step's, when the pass chose
    // micro-batches), audited against one forward of the priced step.
    const verify_report r = verify_plan(res.graph, device_mesh{2, 4}, res.strategies, audited);
    INFO(r);
    CHECK(r.passed());
    CHECK(r.traffic.checked);
    CHECK(r.traffic.executed_bytes > 0);  // the plan communicates, and what ran is what was priced
    std::size_t operators = 0;
    for (vertex_t v = 0; v < boost::num_vertices(g); ++v) operators += g[v].is_operator() ? 1 : 0;
    CHECK(r.checks.size() == operators);  // every operator compared, not only the loss
    CHECK(r.max_rel_diff < 1e-12);
    verify_options f32;
    f32.compute = dtype::f32;
    const verify_report r32 = verify_plan(g, device_mesh{2, 4}, res.strategies, f32);
    INFO(r32);
    CHECK(r32.passed());
    // Where the plan sums partial results of a tensor (not only the scalar loss), float
    // rounding is visible, and within tolerance.
    bool sums_partials = false;
    for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
      sums_partials = sums_partials || (g[v].shape.rank > 0 && res.strategies[v].output.has_partial());
    if (sums_partials) CHECK(r32.max_abs_diff > 0.0);
  }
  SUBCASE("GPT-2, the megatron, data-parallel and ZeRO-3 plans") {
    for (const algo a : {algo::megatron, algo::data_parallel, algo::zero3}) {
      autosharding_options mo = o;
      mo.algo = a;
      // So small a model trains fastest replicated on fast devices; on slow ones splitting
      // the compute pays, so the plans exercise sharding.
      mo.pricing.device.peak_flops = 1e9;
      const autosharding_result res = autosharding_analysis_pass(g, mo);
      REQUIRE(splits_something(res.strategies));
      const verify_report r = verify_plan(g, device_mesh{2, 4}, res.strategies);
      INFO(to_string(a) << ": " << r);
      CHECK(r.passed());
    }
  }
  SUBCASE("LLaMA (rms norm, rotary, SiLU gating, grouped-query attention) and BERT") {
    transformer_config lc = tiny(transformer_config::llama_7b());
    lc.kv_heads = 2;
    const model_graph lg = build_llama(lc);
    const verify_report rl = verify_plan(lg, device_mesh{2, 4}, autosharding_analysis_pass(lg, o).strategies);
    INFO(rl);
    CHECK(rl.passed());
    transformer_config bc = tiny(transformer_config::bert_base());
    bc.mode = run_mode::inference;
    autosharding_options bo = o;
    bo.pricing.mode = run_mode::inference;
    const model_graph bg = build_bert(bc);
    const verify_report rb = verify_plan(bg, device_mesh{2, 4}, autosharding_analysis_pass(bg, bo).strategies);
    INFO(rb);
    CHECK(rb.passed());
  }
}

TEST_CASE("verify's report quotes operator names: one that differs is named escaped, the count agrees") {
  const std::string hostile = "a\x1B[31mb\nc";  // a plan file's name: it must not recolour the terminal
  verify_report r;
  r.mesh = device_mesh{2};
  r.checks = {{hostile, "RR", 0.5, 1.0, false}, {"fine", "RR", 0.0, 1.0, true}};
  r.failed = 1;
  r.first_failed = r.worst = hostile;
  std::ostringstream os;
  os << r;
  const std::string text = os.str();
  CAPTURE(text);
  CHECK(text.find("; 1 operator differs, the first 'a\\x1B[31mb\\x0Ac', the worst 'a\\x1B[31mb\\x0Ac'\n") != std::string::npos);
  CHECK(text.find("  'a\\x1B[31mb\\x0Ac' [RR]: 0.5") != std::string::npos);
  CHECK(text.find('\x1B') == std::string::npos);
  r.failed = 2;
  std::ostringstream two;
  two << r;
  CHECK(two.str().find("; 2 operators differ, the first ") != std::string::npos);
}

TEST_CASE("verify's communication lines name their site escaped, unquoted, and count the lines") {
  const std::string hostile = "edge a\x1B[31mb\nc -> d (operand 0)";  // traffic_site::name of a plan file's names
  verify_report r;
  r.mesh = device_mesh{2};
  r.traffic.checked = true;
  r.traffic.lines = {{traffic_site::edge(1, 0), hostile, "all-gather", 0, 64, 32, 1, 1, {}}};
  r.traffic.mismatches = 1;
  std::ostringstream os;
  os << r;
  const std::string text = os.str();
  CAPTURE(text);
  CHECK(text.find("\n  edge a\\x1B[31mb\\x0Ac -> d (operand 0), all-gather on mesh axis 0: priced 64 B") != std::string::npos);
  CHECK(text.find("differs from the priced at 1 line, the first at edge a\\x1B[31mb\\x0Ac -> d (operand 0)\n") != std::string::npos);
  CHECK(text.find('\x1B') == std::string::npos);
}

TEST_CASE("a wrong plan is caught: the check can fail") {
  const model_graph g = build_gpt2(tiny(transformer_config::gpt2_124m()));
  autosharding_options o = pass_on_2x4(run_mode::training, algo::megatron);
  std::vector<strategy> plan = autosharding_analysis_pass(g, o).strategies;
  // Claim that a row-parallel projection's partial sums are already replicated.
  const vertex_t v = *find_vertex(g, "transformer.h.0.mlp.c_proj");
  bool found = false;
  for (const strategy& s : enumerate_strategies(g, v, device_mesh{2, 4}))
    if (s.output[1].is_partial() && s.output[0].is_replicate()) {
      plan[v] = s;
      plan[v].output[1] = Replicate();
      found = true;
      break;
    }
  REQUIRE(found);
  const verify_report r = verify_plan(g, device_mesh{2, 4}, plan);
  CHECK_FALSE(r.passed());
  CHECK(r.first_failed == "transformer.h.0.mlp.c_proj");
  CHECK_THROWS_WITH_AS(numeric_check()(g, device_mesh{2, 4}, plan, {}),  // the numbers are named before the traffic
                       doctest::Contains("first at 'transformer.h.0.mlp.c_proj'"), solver_error);
  std::vector<strategy> short_plan(plan.begin(), plan.end() - 1);
  CHECK_THROWS_WITH_AS(verify_plan(g, device_mesh{2, 4}, short_plan), doctest::Contains("strategies for a graph of"), exec_error);
}

TEST_CASE("run_checks with numeric_check executes the plan, plan files carry the graph and load back") {
  const model_graph g = build_gpt2(tiny(transformer_config::gpt2_124m()));
  const std::filesystem::path dir = autoshard_test::unique_temp_path("exec-plan");
  std::filesystem::create_directories(dir);
  autosharding_options o = pass_on_2x4(run_mode::training);
  o.run_checks = true;
  o.numeric_check = numeric_check();
  o.ilp_solution_file = (dir / "plan.json").string();
  const autosharding_result res = autosharding_analysis_pass(g, o);
  const loaded_plan lp = load_plan(o.ilp_solution_file);
  REQUIRE(boost::num_vertices(lp.graph()) == boost::num_vertices(g));
  CHECK(lp.mesh().shape() == std::vector<int>{2, 4});
  CHECK(lp.document.pricing.mode == run_mode::training);
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
    CHECK(lp.graph()[v].name == g[v].name);
    CHECK(lp.strategies[v].name == res.strategies[v].name);
  }
  const verify_report whole = verify_plan(lp);  // the plan whole: audited against its own pricing
  CHECK(whole.passed());
  CHECK(whole.traffic.checked);
  // The check audits the run against the collectives the pass priced for the plan (training:
  // the backward's gradient reductions too); pricing altered on purpose fails it at that site.
  verify_options train;
  train.training = true;
  std::vector<collective_use> audited;
  o.numeric_check = [&](const model_graph& cg, const device_mesh& m, const std::vector<strategy>& p,
                        const std::vector<collective_use>& priced) {
    audited = priced;
    numeric_check(train)(cg, m, p, priced);
  };
  autosharding_options mo = o;
  mo.algo = algo::megatron;  // so small a model is cheapest replicated, with nothing to communicate
  const autosharding_result checked = autosharding_analysis_pass(g, mo);
  REQUIRE_FALSE(audited.empty());
  CHECK(audited.size() == checked.report.plan.collectives.size());
  std::vector<collective_use> halved = audited;
  halved.front().bytes /= 2;
  const std::string altered = "executed communication differs from its pricing at 1 place, first at " + halved.front().site.name(g);
  CHECK_THROWS_WITH_AS(numeric_check(train)(g, lp.mesh(), checked.strategies, halved), doctest::Contains(altered.c_str()),
                       solver_error);
  // A failing numeric check leaves no plan file behind.
  std::filesystem::remove(o.ilp_solution_file);
  o.numeric_check = [](const model_graph&, const device_mesh&, const std::vector<strategy>&, const std::vector<collective_use>&) {
    throw solver_error("check: numeric mismatch");
  };
  CHECK_THROWS_AS(autosharding_analysis_pass(g, o), solver_error);
  CHECK_FALSE(std::filesystem::exists(o.ilp_solution_file));
  std::filesystem::remove_all(dir);
}

TEST_CASE("a rank whose kernel fails ends its run with exec_error, and its peers with comm_error within their timeout") {
  // ids [4,3] split over 4 ranks by row; only rank 0's row holds an id outside the table, so
  // only rank 0 fails; the others reach the all-gather in front of the linear and time out.
  model_graph g;
  const vertex_t ids = add_input(g, "ids", {4, 3}, dtype::i64);
  const vertex_t table = add_parameter(g, "table", {10, 6}, dtype::f32);
  const vertex_t wte = add_op(g, op_kind::embedding, "wte", {ids, table});
  const vertex_t w = add_parameter(g, "w", {5, 6}, dtype::f32);
  const vertex_t fc = add_op(g, op_kind::linear, "fc", {wte, w});
  const device_mesh mesh{4};
  std::vector<strategy> plan(boost::num_vertices(g));
  plan[ids].output = parse_spec("S0R", 1, 2);
  plan[table].output = replicated_spec(1, 2);
  plan[w].output = replicated_spec(1, 2);
  for (const strategy& s : enumerate_strategies(g, wte, mesh))
    if (s.output == parse_spec("S0RR", 1, 3)) plan[wte] = s;
  for (const strategy& s : enumerate_strategies(g, fc, mesh))
    if (s.inputs[0] == replicated_spec(1, 3) && s.output == replicated_spec(1, 3)) plan[fc] = s;
  REQUIRE(plan[wte].inputs.size() == 2);
  REQUIRE(plan[fc].inputs.size() == 2);
  std::vector<host_tensor> sources = make_source_values<double>(g, 3);
  sources[ids].as<std::int64_t>()[1] = 10;  // row 0: rank 0's piece
  gloo_options go;
  go.timeout = std::chrono::milliseconds(1500);
  const auto start = std::chrono::steady_clock::now();
  const rank_results res = run_ranks_collect(4, [&](gloo_communicator& world) {
    mesh_communicator mc(std::move(world), mesh);
    run_sharded<double>(mc, g, plan, sources);
  }, go);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(seconds < 10.0);
  REQUIRE(res[0]);
  CHECK_THROWS_WITH_AS(std::rethrow_exception(res[0]), doctest::Contains("vertex 'wte' (embedding): id 10 outside the table of 10 rows"), exec_error);
  for (int r = 1; r < 4; ++r) {
    CAPTURE(r);
    REQUIRE(res[static_cast<std::size_t>(r)]);
    CHECK_THROWS_AS(std::rethrow_exception(res[static_cast<std::size_t>(r)]), comm_error);
  }
}

TEST_CASE("verify refuses a run above its memory limit before starting, naming the estimate and what to change") {
  const model_graph g = build_gpt2(tiny(transformer_config::gpt2_124m()));
  autosharding_options o = pass_on_2x4(run_mode::training);
  const std::vector<strategy> plan = autosharding_analysis_pass(g, o).strategies;
  const device_mesh mesh{2, 4};
  // The sources are held once: the sum of every input and parameter (ids and labels in i64).
  std::uint64_t source_bytes = 0;
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
    if (!g[v].is_operator()) source_bytes += static_cast<std::uint64_t>(g[v].shape.numel()) * 8u;
  const memory_estimate e = estimate_verify_memory(g, mesh, plan, dtype::f64);
  CHECK(e.sources == source_bytes);
  CHECK(estimate_verify_memory(g, mesh, plan, dtype::f32).activations < e.activations);
  // The estimate covers what the streamed reference run really holds.
  const std::vector<host_tensor> sources = make_source_values<double>(g, 1);
  reference_stream<double> ref(g, sources, 0);
  for (vertex_t v : topological_order(g)) ref.value(v);
  CHECK(ref.peak_bytes() > 0);
  CHECK(e.activations >= ref.peak_bytes());
  verify_options vo;
  vo.max_memory = e.sources + e.ranks + e.activations / 2;
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(verify_plan(g, mesh, plan, vo), doctest::Contains("verify would need about"), exec_error);
  CHECK_THROWS_WITH_AS(verify_plan(g, mesh, plan, vo), doctest::Contains("--dtype f32"), exec_error);
  CHECK_THROWS_WITH_AS(verify_plan(g, mesh, plan, vo), doctest::Contains("--batch/--seq"), exec_error);
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < 5.0);
  vo.max_memory = e.total();
  const verify_report r = verify_plan(g, mesh, plan, vo);
  CHECK(r.passed());
  CHECK(r.estimate.total() == e.total());
}

TEST_CASE("numbers: a refusal whose inputs outgrow the memory asks for a smaller batch, not a smaller model") {
  // verify --batch 1048576 --seq 1048576 of a tiny model: its token ids took 16 TiB, and the
  // refusal said "a smaller model (the parameters alone take 16.00 TiB ...)", the parameters
  // being kilobytes: the inputs scale with batch x seq as the activations do.
  model_graph g;
  const vertex_t x = add_input(g, "x", {262144, 64}, dtype::f32);  // 128 MiB in f64
  const vertex_t w = add_parameter(g, "w", {4, 64}, dtype::f32);
  add_op(g, op_kind::linear, "fc", {x, w});
  const device_mesh mesh{2, 4};
  const std::vector<strategy> plan = autosharding_analysis_pass(g, pass_on_2x4(run_mode::inference)).strategies;
  const memory_estimate e = estimate_verify_memory(g, mesh, plan, dtype::f64);
  verify_options vo;
  vo.max_memory = e.total() / 4;
  REQUIRE(e.sources > vo.max_memory);                   // the inputs alone outgrow it ...
  REQUIRE(e.ranks + e.parameters + 4096 < vo.max_memory);  // ... what does not scale with them fits
  CHECK_THROWS_WITH_AS(verify_plan(g, mesh, plan, vo), doctest::Contains("and a smaller batch or sequence"), exec_error);
  try {
    (void)verify_plan(g, mesh, plan, vo);
  } catch (const exec_error& err) {
    CHECK(std::string(err.what()).find("the parameters alone") == std::string::npos);
  }
}

TEST_CASE("rank threads beyond what the machine allows are refused before any starts") {
  const device_mesh mesh{2, 4};
  const rank_thread_cost c = rank_threads_cost(mesh);
  CHECK(c.threads == 16);  // a rank thread and its TCP device's loop thread each
  CHECK(c.files == 8u * (7 + 1 + 3 + 3));  // world peers, axis peers, epoll, listener, spare
  machine_limits m;  // nothing limited
  CHECK_NOTHROW(check_rank_threads(mesh, m));
  m.threads = 15;
  CHECK_THROWS_WITH_AS(check_rank_threads(mesh, m), doctest::Contains("need 16 threads"), exec_error);
  m = machine_limits{};
  m.files = 100;
  CHECK_THROWS_WITH_AS(check_rank_threads(mesh, m), doctest::Contains("ulimit -n"), exec_error);
  m = machine_limits{};
  m.address_space = 64u << 20;
  CHECK_THROWS_WITH_AS(check_rank_threads(mesh, m), doctest::Contains("ulimit -v"), exec_error);
  // The advice names the ranks that fit here, never a fixed example: "verify a plan for a
  // smaller mesh (e.g. `autoshard plan --mesh 2x4`)" proposed 8 ranks for 4 refused.
  m = machine_limits{};
  m.files = 31;  // 4 ranks on 2x2 need 4 x (3 + 1 + 1 + 3) = 32; 3 ranks in a row 3 x (2 + 2 + 3) = 21
  CHECK_THROWS_WITH_AS(check_rank_threads(device_mesh{2, 2}, m),
                       "execution error: 4 ranks on mesh(2,2) need 32 sockets as threads of one process, but the open-file limit (ulimit -n) "
                       "allows 31: raise it (by at least 1), or verify a plan for fewer ranks (at most 3 fit here)",
                       exec_error);
  m.files = 1;
  CHECK_THROWS_WITH_AS(check_rank_threads(device_mesh{2, 2}, m), doctest::Contains("(here not even 2 fit)"), exec_error);
  m = machine_limits{};
  m.threads = 9;
  CHECK_THROWS_WITH_AS(check_rank_threads(mesh, m), doctest::Contains("allows 9: raise it (by at least 7), or verify a plan for fewer ranks (at most 4 fit here)"),
                       exec_error);
  // A 40,000-rank plan fails at once here, whatever this machine's limits are.
  const machine_limits here = machine_limits::here();
  if (here.files != machine_limits::unlimited || here.threads != machine_limits::unlimited) {
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_AS(check_rank_threads(device_mesh{200, 200}, here), exec_error);
    CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < 1.0);
  }
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define AUTOSHARD_TEST_NO_RLIMIT_AS 1  // the sanitizers reserve terabytes of address space
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define AUTOSHARD_TEST_NO_RLIMIT_AS 1
#endif
#endif

#ifndef AUTOSHARD_TEST_NO_RLIMIT_AS
TEST_CASE("a rank thread that cannot be created stops the started ranks and reports it instead of aborting") {
  // In a child under an address-space limit with room for about 10 thread stacks, 64 ranks
  // cannot all start: run_ranks_collect must throw comm_error (before the fix: SIGABRT).
  std::fflush(nullptr);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int code = 3;
    try {
      std::ifstream st("/proc/self/status");
      std::string k;
      std::uint64_t vm_kb = 0;
      while (st >> k)
        if (k == "VmSize:" && st >> vm_kb) break;
      rlimit r{};
      getrlimit(RLIMIT_STACK, &r);
      const std::uint64_t stack = r.rlim_cur == RLIM_INFINITY ? 8u << 20 : r.rlim_cur;
      r.rlim_cur = r.rlim_max = vm_kb * 1024 + 10 * (stack + (1u << 20));
      if (setrlimit(RLIMIT_AS, &r) != 0) _exit(4);
      std::atomic<int> ran{0};
      run_ranks_collect(64, [&](int, const gloo_store&, const gloo_options&) { ++ran; });
      code = 2;  // every thread started: the limit did not bite
    } catch (const comm_error& e) {
      code = std::string(e.what()).find("cannot start the thread of rank") != std::string::npos ? 0 : 5;
    } catch (...) {
      code = 6;
    }
    _exit(code);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK_FALSE(WIFSIGNALED(status));
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
#endif

TEST_CASE("training plans: forward, gradients and one Adam or SGD step on 8 Gloo ranks match the unsharded step") {
  const model_graph g = build_gpt2(tiny(transformer_config::gpt2_124m()));
  autosharding_options o = pass_on_2x4(run_mode::training);
  verify_options vo;
  vo.training = true;
  for (const algo a : {algo::megatron, algo::data_parallel, algo::zero3}) {
    CAPTURE(to_string(a));
    o.algo = a;
    const autosharding_result res = autosharding_analysis_pass(g, o);
    vo.priced = res.report.plan.collectives;
    const verify_report r = verify_plan(g, device_mesh{2, 4}, res.strategies, vo);
    INFO(r);
    CHECK(r.passed());
    CHECK(r.traffic.checked);
    std::size_t params = 0;
    for (vertex_t v = 0; v < boost::num_vertices(g); ++v) params += g[v].is_parameter() ? 1 : 0;
    CHECK(r.gradients.size() == params);  // every parameter reaches the loss (wte twice: tied)
    CHECK(r.updates.size() == params);
    double largest_grad = 0;
    for (const vertex_check& c : r.gradients) largest_grad = std::max(largest_grad, c.ref_max_abs);
    CHECK(largest_grad > 1e-3);  // the gradients compared are not all zero
  }
  o.algo = algo::alpa;
  autosharding_options tight = o;
  tight.memory_budget = 90000;  // forces weights and activations split over both axes
  tight.pricing.micro_batches = 1;  // what the search picks at this budget, solved alone: the same plan, a third of the time
  const autosharding_result alpa = autosharding_analysis_pass(g, tight);
  vo.step.optimizer = optimizer_kind::sgd;
  vo.priced = alpa.report.plan.collectives;
  const verify_report ra = verify_plan(g, device_mesh{2, 4}, alpa.strategies, vo);
  INFO(ra);
  CHECK(ra.passed());
}

TEST_CASE("the training estimate bounds the heap a training check holds, sampled while it runs, at two sequence lengths") {
  // At sequence 32 the logits (8 x 32 x 2048) are the largest tensor, as GPT-2's are; at 512
  // the attention kernels' score matrices (S x S per head, one forward, two backward, on every
  // rank at once) and their matrix products' packing buffers outgrow every tensor. The
  // estimate counted none of them (issue 30 class 12): in a release build of this case the
  // heap reached 1.52x the estimate at sequence 512, 2.82x at 1,024 and 15.6x at 2,048; now
  // 0.69-0.70, 0.71-0.90 and 0.92-0.94 of it over two runs (0.44-0.52 at 32).
  // Sequence 512 runs on 2 ranks, not on the 2x4 mesh: the score matrices outgrow the rest as
  // much, for less than half the CPU under ASan (31 s instead of 69). Without them the
  // estimate is 13.6 MB against a 16.3 MB heap there, and this case fails.
  struct sizes {
    std::int64_t seq, vocab, batch;
    int layers;
    std::vector<int> mesh;
  };
  for (const sizes& z : {sizes{32, 2048, 8, 2, {2, 4}}, sizes{512, 128, 1, 1, {2}}}) {
    CAPTURE(z.seq);
    transformer_config c = tiny(transformer_config::gpt2_124m());
    c.layers = z.layers;
    c.hidden = 64;
    c.ffn = 128;
    c.vocab = z.vocab;
    c.batch = z.batch;
    c.max_positions = c.seq = z.seq;
    const model_graph g = build_gpt2(c);
    autosharding_options o = pass_on_2x4(run_mode::training);
    o.mesh = make_cluster_mesh(z.mesh);
    const std::vector<strategy> plan = autosharding_analysis_pass(g, o).strategies;
    const device_mesh& mesh = o.mesh;
    const memory_estimate e = estimate_verify_memory(g, mesh, plan, dtype::f64, true);
    // At least the logits and their gradient's buffer (the same one: d logits is written over them).
    CHECK(e.activations + e.parameters >= static_cast<std::uint64_t>(z.batch * z.seq * z.vocab) * 8u);
    // The heap in use (every arena's chunks and the mmapped ones), polled while verify runs.
    // Under ASan, malloc is ASan's and glibc's mallinfo2 sees nothing: ask ASan's allocator.
    const auto in_use = [] {
#if AUTOSHARD_TEST_ASAN
      return static_cast<std::uint64_t>(__sanitizer_get_current_allocated_bytes());
#else
      const struct mallinfo2 m = mallinfo2();
      return static_cast<std::uint64_t>(m.uordblks + m.hblkhd);
#endif
    };
    const std::uint64_t before = in_use();
    std::atomic<std::uint64_t> peak{before};
    std::atomic<bool> done{false};
    std::thread sampler([&] {
      while (!done) {
        peak = std::max(peak.load(), in_use());
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    });
    verify_options vo;
    vo.training = true;
    verify_report r;
    try {
      r = verify_plan(g, mesh, plan, vo);
    } catch (...) {
      done = true;
      sampler.join();
      throw;
    }
    done = true;
    sampler.join();
    INFO(r);
    CHECK(r.passed());
    MESSAGE("sequence " << z.seq << ": heap in use at most " << (peak - before) << " bytes above the start, estimate "
                        << e.total());
    CHECK(peak > before + static_cast<std::uint64_t>(z.batch * z.seq * z.vocab) * 8u);  // the sampler saw the logits
    CHECK(peak - before <= e.total());
  }
}

TEST_CASE("the sharded step synchronises and updates each parameter as soon as its last use ran its backward") {
  const model_graph g = build_gpt2(tiny(transformer_config::gpt2_124m()));
  // Every parameter replicated: each rank's gradient is as large as the parameter.
  autosharding_options o = pass_on_2x4(run_mode::training, algo::data_parallel);
  const std::vector<strategy> plan = autosharding_analysis_pass(g, o).strategies;
  const std::vector<host_tensor> sources = make_source_values<double>(g, 1);
  // What each rank saw, in order: a forward piece of an operator ("F") or a finished parameter ("P").
  std::vector<std::vector<std::pair<char, vertex_t>>> seen(8);
  run_ranks(8, [&](gloo_communicator& world) {
    const auto me = static_cast<std::size_t>(world.rank());
    mesh_communicator mc(std::move(world), device_mesh{2, 4});
    train_sharded<double>(
        mc, g, plan, sources, training_step{},
        [&](vertex_t v, const host_tensor&, const sharding_spec&) { seen[me].emplace_back('F', v); },
        [&](vertex_t v, const host_tensor& grad, const host_tensor&, const sharding_spec&) {
          CHECK(grad.shape() == g[v].shape);
          seen[me].emplace_back('P', v);
        });
  });
  const auto at = [&](std::size_t r, const std::string& name) {
    const vertex_t v = *find_vertex(g, name);
    const auto it = std::find(seen[r].begin(), seen[r].end(), std::make_pair('P', v));
    REQUIRE_MESSAGE(it != seen[r].end(), name);
    return it - seen[r].begin();
  };
  for (std::size_t r = 0; r < 8; ++r) {
    CAPTURE(r);
    CHECK(seen[r] == seen[0]);  // every rank in the same order: the reductions pair up
    // The backward runs from the head to the embeddings: the last block's parameters are
    // finished before the first block's, and wte (tied: lm_head and the lookup) last of all.
    CHECK(at(r, "transformer.ln_f.weight") < at(r, "transformer.h.1.mlp.c_proj.weight"));
    CHECK(at(r, "transformer.h.1.mlp.c_proj.weight") < at(r, "transformer.h.0.attn.c_attn.weight"));
    CHECK(at(r, "transformer.h.0.attn.c_attn.weight") < at(r, "transformer.wte.weight"));
  }
  // The estimate counts what finishing wte holds on the 8 ranks at once: each rank's whole
  // contribution, the reduction's buffer and result, and the update.
  const std::uint64_t wte = static_cast<std::uint64_t>(g[*find_vertex(g, "transformer.wte.weight")].shape.numel()) * 8u;
  const memory_estimate e = estimate_verify_memory(g, device_mesh{2, 4}, plan, dtype::f64, true);
  CHECK(e.activations + e.parameters >= 8 * 4 * wte);
  CHECK(e.parameters > 0);
  CHECK(e.total() > estimate_verify_memory(g, device_mesh{2, 4}, plan, dtype::f64, false).total());
}

TEST_CASE("BERT trains as a masked LM: the head's tied decoder and bias get gradients and updates on 8 Gloo ranks") {
  const model_graph g = build_bert(tiny(transformer_config::bert_base()));
  autosharding_options o = pass_on_2x4(run_mode::training, algo::megatron);
  const autosharding_result res = autosharding_analysis_pass(g, o);
  verify_options vo;
  vo.training = true;
  vo.priced = res.report.plan.collectives;
  const verify_report r = verify_plan(g, device_mesh{2, 4}, res.strategies, vo);
  INFO(r);
  CHECK(r.passed());
  std::size_t params = 0;
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) params += g[v].is_parameter() ? 1 : 0;
  CHECK(r.gradients.size() == params);  // every parameter reaches the loss: no pooler left over
  const auto grad_of = [&](const std::string& name) {
    const auto it = std::find_if(r.gradients.begin(), r.gradients.end(), [&](const vertex_check& c) { return c.name == "grad:" + name; });
    REQUIRE(it != r.gradients.end());
    return *it;
  };
  // The word embeddings are used twice (lookup and decoder): both contributions are summed.
  CHECK(grad_of("bert.embeddings.word_embeddings.weight").ref_max_abs > 0.0);
  CHECK(grad_of("cls.predictions.bias").ref_max_abs > 0.0);
}

TEST_CASE("a training check of a graph without a loss is refused before anything runs, naming its outputs") {
  transformer_config c = tiny(transformer_config::bert_base());
  c.mode = run_mode::inference;  // BertModel: the pooler's output, no labels, no loss
  const model_graph g = build_bert(c);
  autosharding_options o = pass_on_2x4(run_mode::training);
  const std::vector<strategy> plan = autosharding_analysis_pass(g, o).strategies;
  verify_options vo;
  vo.training = true;
  vo.max_memory = 1;  // the loss is checked first: no estimate, no rank started
  CHECK_THROWS_WITH_AS(verify_plan(g, device_mesh{2, 4}, plan, vo), doctest::Contains("needs a loss, and this graph has none"),
                       exec_error);
  CHECK_THROWS_WITH_AS(verify_plan(g, device_mesh{2, 4}, plan, vo), doctest::Contains("'bert.pooler.activation' [8,32]"),
                       exec_error);
  CHECK_THROWS_WITH_AS(verify_plan(g, device_mesh{2, 4}, plan, vo), doctest::Contains("--forward-only"), exec_error);
  vo.training = false;  // the forward alone needs no loss
  vo.max_memory = 0;
  CHECK(verify_plan(g, device_mesh{2, 4}, plan, vo).passed());
}

TEST_CASE("a training plan broken in its backward (a missing gradient reduction) is caught at that parameter") {
  const model_graph g = build_gpt2(tiny(transformer_config::gpt2_124m()));
  autosharding_options o = pass_on_2x4(run_mode::training);
  o.memory_budget = 90000;  // weights and activations split over both axes
  o.pricing.micro_batches = 1;  // what the search picks at this budget, solved alone: the same plan, a third of the time
  const autosharding_result res = autosharding_analysis_pass(g, o);
  const std::vector<strategy>& plan = res.strategies;
  // A parameter replicated on an axis where its consumer's output is split needs its
  // gradient summed over that axis (the data-parallel reduction): leave that sum out.
  std::string victim;
  for (vertex_t p = 0; p < boost::num_vertices(g) && victim.empty(); ++p) {
    if (!g[p].is_parameter() || boost::out_degree(p, g) != 1) continue;
    const vertex_t v = boost::target(*boost::out_edges(p, g).first, g);
    for (std::size_t a = 0; a < 2; ++a)
      if (plan[p].output[a].is_replicate() && plan[v].output[a].is_shard()) victim = g[p].name;
  }
  REQUIRE_FALSE(victim.empty());
  CAPTURE(victim);
  verify_options vo;
  vo.training = true;
  vo.step.drop_gradient_sync = victim;
  vo.priced = res.report.plan.collectives;
  const verify_report r = verify_plan(g, device_mesh{2, 4}, plan, vo);
  CHECK_FALSE(r.passed());
  CHECK(r.first_failed == "grad:" + victim);
  // The audit sees the same fault: the reduction priced for that gradient never ran.
  REQUIRE(r.traffic.mismatches >= 1);
  const traffic_line& missing = r.traffic.lines[r.traffic.first_mismatch];
  CHECK(missing.where == "gradient of " + victim);
  CHECK(missing.executed_bytes < missing.priced_bytes);
  for (const traffic_line& l : r.traffic.lines)  // every differing line is that reduction's (one per mesh axis it spans)
    if (l.failed()) CHECK(l.where == "gradient of " + victim);
  for (const vertex_check& c : r.checks) CHECK(c.passed);  // the forward is right
  std::size_t bad_grads = 0;
  for (const vertex_check& c : r.gradients) bad_grads += c.passed ? 0 : 1;
  CHECK(bad_grads == 1);
}

TEST_CASE("the communication audit: what the ranks issue is what the plan was priced, and altered pricing is caught") {
  const model_graph g = build_gpt2(tiny(transformer_config::gpt2_124m()));
  autosharding_options o = pass_on_2x4(run_mode::inference, algo::megatron);
  const autosharding_result res = autosharding_analysis_pass(g, o);
  verify_options vo;
  vo.priced = res.report.plan.collectives;
  const verify_report r = verify_plan(g, device_mesh{2, 4}, res.strategies, vo);
  INFO(r);
  REQUIRE(r.passed());
  REQUIRE(r.traffic.checked);
  std::int64_t priced = 0;
  for (const collective_use& c : res.report.plan.collectives) priced += c.bytes;
  CHECK(r.traffic.priced_bytes == priced);
  CHECK(r.traffic.executed_bytes == priced);  // Megatron's activation all-reduces, byte for byte
  std::size_t all_reduces = 0;
  for (const traffic_line& l : r.traffic.lines) {
    CHECK(l.matches());
    CHECK(l.executed_calls > 0);
    all_reduces += l.kind == "all-reduce" ? 1 : 0;
  }
  CHECK(all_reduces >= 2);  // the attention and MLP outputs of the layer
  // The same run audited against pricing changed on purpose: one collective priced at half
  // its size, then one left out. Each is caught at its own site.
  REQUIRE_FALSE(res.report.plan.collectives.empty());
  const collective_use victim = res.report.plan.collectives.front();
  std::vector<collective_use> halved = res.report.plan.collectives;
  halved.front().bytes /= 2;
  const verify_report rh = verify_plan(g, device_mesh{2, 4}, res.strategies, [&] {
    verify_options h = vo;
    h.priced = halved;
    return h;
  }());
  CHECK_FALSE(rh.passed());
  CHECK(rh.failed == 0);  // the numbers are right: only the traffic disagrees
  REQUIRE(rh.traffic.mismatches == 1);
  const traffic_line& bad = rh.traffic.lines[rh.traffic.first_mismatch];
  CHECK(bad.site == victim.site);
  // The line sums its site's collectives of one kind and axis (the first, the vocab-parallel
  // loss's row max, shares it with the sum of exponentials and the target logit): it is short
  // by exactly the half left out.
  CHECK(bad.executed_bytes - bad.priced_bytes == victim.bytes - victim.bytes / 2);
  CHECK(bad.executed_bytes >= victim.bytes);
  std::vector<collective_use> dropped(res.report.plan.collectives.begin() + 1, res.report.plan.collectives.end());
  verify_options d = vo;
  d.priced = dropped;
  const verify_report rd = verify_plan(g, device_mesh{2, 4}, res.strategies, d);
  CHECK_FALSE(rd.passed());
  REQUIRE(rd.traffic.mismatches >= 1);
  CHECK(rd.traffic.lines[rd.traffic.first_mismatch].site == victim.site);
  std::ostringstream text;
  text << rd;
  CHECK(text.str().find("the executed communication differs from the priced") != std::string::npos);
  CHECK(text.str().find(victim.site.name(g)) != std::string::npos);
}
