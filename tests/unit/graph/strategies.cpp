// Strategies of every operator kind, checked numerically: each rank computes its local
// result from the shards its strategy's input specs give it, a small simulator sums the
// Partial outputs over their mesh axes, and every rank's piece is compared with the shard
// of the unsharded result.
#include <doctest/doctest.h>

#include <autoshard/graph/graph.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>

namespace {
using namespace autoshard;

// ---------------------------------------------------------------- a tiny dense tensor
struct dense {
  tensor_shape shape;
  std::vector<double> v;
  explicit dense(tensor_shape s = {}) : shape(s), v(static_cast<std::size_t>(s.numel()), 0.0) {}
  std::vector<std::int64_t> strides() const {
    std::vector<std::int64_t> st(shape.rank, 1);
    for (std::size_t d = shape.rank; d-- > 1;) st[d - 1] = st[d] * shape[d];
    return st;
  }
};

// Calls f(index vector, flat offset) for every element of `s`, row-major.
void for_each_index(const tensor_shape& s, const std::function<void(const std::vector<std::int64_t>&, std::size_t)>& f) {
  if (s.numel() == 0) return;
  std::vector<std::int64_t> idx(s.rank, 0);
  for (std::size_t flat = 0;; ++flat) {
    f(idx, flat);
    std::size_t d = s.rank;
    while (d > 0) {
      --d;
      if (++idx[d] < s[d]) break;
      idx[d] = 0;
      if (d == 0) return;
    }
    if (s.rank == 0) return;
  }
}

std::size_t offset_of(const dense& t, const std::vector<std::int64_t>& idx) {
  std::int64_t o = 0;
  auto st = t.strides();
  for (std::size_t d = 0; d < idx.size(); ++d) o += idx[d] * st[d];
  return static_cast<std::size_t>(o);
}

dense slice(const dense& t, const shard_box& b) {
  dense out(b.shape);
  for_each_index(b.shape, [&](const std::vector<std::int64_t>& i, std::size_t flat) {
    std::vector<std::int64_t> g = i;
    for (std::size_t d = 0; d < g.size(); ++d) g[d] += b.offset[d];
    out.v[flat] = t.v[offset_of(t, g)];
  });
  return out;
}

// ---------------------------------------------------------------- reference operators
// What a rank knows beyond its local operands: the global shapes and where its pieces lie.
struct op_context {
  std::vector<tensor_shape> global_in;
  tensor_shape global_out;
  std::vector<tensor_shape> in_offset;
  tensor_shape out_shape;  // local output shape (reshape needs it)
};

dense unary(const dense& x, const std::function<double(double)>& f) {
  dense o(x.shape);
  for (std::size_t i = 0; i < x.v.size(); ++i) o.v[i] = f(x.v[i]);
  return o;
}

dense broadcast_binary(const dense& a, const dense& b, const std::function<double(double, double)>& f) {
  tensor_shape s;
  s.rank = std::max(a.shape.rank, b.shape.rank);
  for (std::size_t i = 0; i < s.rank; ++i) {
    const std::int64_t da = i < a.shape.rank ? a.shape[a.shape.rank - 1 - i] : 1;
    const std::int64_t db = i < b.shape.rank ? b.shape[b.shape.rank - 1 - i] : 1;
    s[s.rank - 1 - i] = std::max(da, db);
  }
  dense o(s);
  for_each_index(s, [&](const std::vector<std::int64_t>& i, std::size_t flat) {
    auto pick = [&](const dense& t) {
      std::vector<std::int64_t> j(t.shape.rank);
      for (std::size_t d = 0; d < t.shape.rank; ++d) {
        const std::size_t od = s.rank - t.shape.rank + d;
        j[d] = t.shape[d] == 1 ? 0 : i[od];
      }
      return t.v[offset_of(t, j)];
    };
    o.v[flat] = f(pick(a), pick(b));
  });
  return o;
}

// rows over the last dim: calls f(row pointer in, row pointer out, length)
dense rowwise(const dense& x, const std::function<void(const double*, double*, std::int64_t, std::int64_t)>& f) {
  dense o(x.shape);
  const std::int64_t n = x.shape.rank ? x.shape[x.shape.rank - 1u] : 1;
  for (std::int64_t r = 0; n > 0 && r * n < static_cast<std::int64_t>(x.v.size()); ++r)
    f(x.v.data() + r * n, o.v.data() + r * n, n, r);
  return o;
}

dense apply(const node& nd, const std::vector<dense>& in, const op_context& c) {
  const op_attrs& a = nd.attrs;
  switch (nd.kind) {
    case op_kind::linear: {
      const dense& x = in[0];
      const dense& w = in[1];
      const std::int64_t C = x.shape[x.shape.rank - 1u];
      const std::int64_t O = a.transposed_weight ? w.shape[1] : w.shape[0];
      tensor_shape s = x.shape;
      s[s.rank - 1u] = O;
      dense o(s);
      const std::int64_t rows = C ? static_cast<std::int64_t>(x.v.size()) / C : s.numel() / std::max<std::int64_t>(O, 1);
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t j = 0; j < O; ++j) {
          double acc = in.size() == 3 ? in[2].v[static_cast<std::size_t>(j)] : 0.0;
          for (std::int64_t k = 0; k < C; ++k)
            acc += x.v[static_cast<std::size_t>(r * C + k)] *
                   w.v[static_cast<std::size_t>(a.transposed_weight ? k * O + j : j * C + k)];
          o.v[static_cast<std::size_t>(r * O + j)] = acc;
        }
      return o;
    }
    case op_kind::matmul: {
      const dense& x = in[0];
      const dense& y = in[1];
      const std::int64_t M = x.shape[x.shape.rank - 2u], K = x.shape[x.shape.rank - 1u], N = y.shape[y.shape.rank - 1u];
      tensor_shape s = x.shape;
      s[s.rank - 1u] = N;
      dense o(s);
      const std::int64_t batches = (M * K) != 0 ? static_cast<std::int64_t>(x.v.size()) / (M * K) : s.numel() / std::max<std::int64_t>(M * N, 1);
      for (std::int64_t bt = 0; bt < batches; ++bt)
        for (std::int64_t i = 0; i < M; ++i)
          for (std::int64_t j = 0; j < N; ++j) {
            double acc = 0;
            for (std::int64_t k = 0; k < K; ++k)
              acc += x.v[static_cast<std::size_t>(bt * M * K + i * K + k)] *
                     y.v[static_cast<std::size_t>((y.shape.rank > 2 ? bt * K * N : 0) + k * N + j)];
            o.v[static_cast<std::size_t>(bt * M * N + i * N + j)] = acc;
          }
      return o;
    }
    case op_kind::gelu: return unary(in[0], [](double v) { return 0.5 * v * (1 + std::tanh(0.7978845608 * (v + 0.044715 * v * v * v))); });
    case op_kind::gelu_erf: return unary(in[0], [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); });
    case op_kind::silu: return unary(in[0], [](double v) { return v / (1 + std::exp(-v)); });
    case op_kind::relu: return unary(in[0], [](double v) { return v > 0 ? v : 0.0; });
    case op_kind::tanh: return unary(in[0], [](double v) { return std::tanh(v); });
    case op_kind::exp: return unary(in[0], [](double v) { return std::exp(v); });
    case op_kind::dropout: return in[0];
    case op_kind::rotary: {
      const dense& x = in[0];
      const std::size_t r = x.shape.rank;
      const std::int64_t D = c.global_in[0][r - 1] / a.heads;
      const std::int64_t e_off = c.in_offset[0][r - 1], s_off = c.in_offset[0][r - 2];
      REQUIRE(e_off % D == 0);  // whole heads per rank
      dense o(x.shape);
      for_each_index(x.shape, [&](const std::vector<std::int64_t>& i, std::size_t flat) {
        const std::int64_t j = (i[r - 1] + e_off) % D, pair = j - j % 2;
        const double theta = static_cast<double>(i[r - 2] + s_off) * std::pow(100.0, -static_cast<double>(pair) / static_cast<double>(D));
        std::vector<std::int64_t> k = i;
        k[r - 1] += (j % 2 == 0) ? 1 : -1;
        const double other = x.v[offset_of(x, k)];
        o.v[flat] = j % 2 == 0 ? x.v[flat] * std::cos(theta) - other * std::sin(theta)
                               : other * std::sin(theta) + x.v[flat] * std::cos(theta);
      });
      return o;
    }
    case op_kind::add: return broadcast_binary(in[0], in[1], [](double p, double q) { return p + q; });
    case op_kind::sub: return broadcast_binary(in[0], in[1], [](double p, double q) { return p - q; });
    case op_kind::mul: return broadcast_binary(in[0], in[1], [](double p, double q) { return p * q; });
    case op_kind::div: return broadcast_binary(in[0], in[1], [](double p, double q) { return p / q; });
    case op_kind::where: {  // select by the condition broadcast to the values' shape, then broadcast again
      const dense sel = broadcast_binary(in[0], broadcast_binary(in[1], in[2], [](double p, double) { return p; }),
                                         [](double c, double) { return c; });
      const dense xs = broadcast_binary(in[1], sel, [](double p, double) { return p; });
      const dense ys = broadcast_binary(in[2], sel, [](double p, double) { return p; });
      dense o(sel.shape);
      for (std::size_t i = 0; i < o.v.size(); ++i) o.v[i] = sel.v[i] != 0 ? xs.v[i] : ys.v[i];
      return o;
    }
    case op_kind::expand: return broadcast_binary(in[0], dense(c.out_shape), [](double p, double) { return p; });
    case op_kind::layer_norm:
    case op_kind::rms_norm: {
      const bool ln = nd.kind == op_kind::layer_norm;
      return rowwise(in[0], [&](const double* x, double* y, std::int64_t n, std::int64_t) {
        double mean = 0, var = 0;
        for (std::int64_t i = 0; i < n; ++i) mean += x[i] / static_cast<double>(n);
        if (!ln) mean = 0;
        for (std::int64_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean) / static_cast<double>(n);
        for (std::int64_t i = 0; i < n; ++i) {
          y[i] = (x[i] - mean) / std::sqrt(var + a.epsilon);
          if (in.size() > 1) y[i] *= a.weight_offset + in[1].v[static_cast<std::size_t>(i)];
          if (in.size() > 2) y[i] += in[2].v[static_cast<std::size_t>(i)];
        }
      });
    }
    case op_kind::softmax: {
      const dense& x = in[0];
      const auto ax = static_cast<std::size_t>(a.axis < 0 ? a.axis + x.shape.rank : a.axis);
      dense o(x.shape);
      for_each_index(x.shape, [&](const std::vector<std::int64_t>& i, std::size_t flat) {
        std::vector<std::int64_t> k = i;
        double mx = -1e300, sum = 0;
        for (k[ax] = 0; k[ax] < x.shape[ax]; ++k[ax]) mx = std::max(mx, x.v[offset_of(x, k)]);
        for (k[ax] = 0; k[ax] < x.shape[ax]; ++k[ax]) sum += std::exp(x.v[offset_of(x, k)] - mx);
        o.v[flat] = std::exp(x.v[flat] - mx) / sum;
      });
      return o;
    }
    case op_kind::embedding: {
      const dense& ids = in[0];
      const dense& tab = in[1];
      const std::int64_t rows = tab.shape[0], H = tab.shape[1], row_off = c.in_offset[1][0];
      tensor_shape s = ids.shape;
      s.dims[s.rank++] = H;
      dense o(s);
      for (std::size_t i = 0; i < ids.v.size(); ++i) {
        const auto id = static_cast<std::int64_t>(ids.v[i]) - row_off;
        if (id < 0 || id >= rows) continue;  // another rank's rows (vocab-parallel)
        for (std::int64_t h = 0; h < H; ++h)
          o.v[i * static_cast<std::size_t>(H) + static_cast<std::size_t>(h)] = a.scale * tab.v[static_cast<std::size_t>(id * H + h)];
      }
      return o;
    }
    case op_kind::reshape: {
      dense o(c.out_shape);
      REQUIRE(o.v.size() == in[0].v.size());
      o.v = in[0].v;
      return o;
    }
    case op_kind::transpose: {
      const dense& x = in[0];
      tensor_shape s = x.shape;
      for (std::size_t d = 0; d < s.rank; ++d) s[d] = x.shape[static_cast<std::size_t>(a.dims[d])];
      dense o(s);
      for_each_index(s, [&](const std::vector<std::int64_t>& i, std::size_t flat) {
        std::vector<std::int64_t> j(s.rank);
        for (std::size_t d = 0; d < s.rank; ++d) j[static_cast<std::size_t>(a.dims[d])] = i[d];
        o.v[flat] = x.v[offset_of(x, j)];
      });
      return o;
    }
    case op_kind::reduce_sum:
    case op_kind::reduce_mean: {
      const dense& x = in[0];
      std::vector<bool> red(x.shape.rank, false);
      double count = 1;
      for (std::int64_t d : a.dims) {
        red[static_cast<std::size_t>(d)] = true;
        count *= static_cast<double>(c.global_in[0][static_cast<std::size_t>(d)]);
      }
      tensor_shape s;
      for (std::size_t d = 0; d < x.shape.rank; ++d)
        if (!red[d]) s.dims[s.rank++] = x.shape[d];
      dense o(s);
      for_each_index(x.shape, [&](const std::vector<std::int64_t>& i, std::size_t flat) {
        std::vector<std::int64_t> j;
        for (std::size_t d = 0; d < i.size(); ++d)
          if (!red[d]) j.push_back(i[d]);
        o.v[offset_of(o, j)] += x.v[flat] / (nd.kind == op_kind::reduce_mean ? count : 1.0);
      });
      return o;
    }
    case op_kind::concat:
    case op_kind::split: {
      const auto ax = static_cast<std::size_t>(a.axis < 0 ? a.axis + in[0].shape.rank : a.axis);
      tensor_shape s = in[0].shape;
      if (nd.kind == op_kind::split) s[ax] = a.length;
      else
        for (std::size_t k = 1; k < in.size(); ++k) s[ax] += in[k].shape[ax];
      dense o(s);
      for_each_index(s, [&](const std::vector<std::int64_t>& i, std::size_t flat) {
        std::vector<std::int64_t> j = i;
        std::size_t src = 0;
        if (nd.kind == op_kind::split) j[ax] += a.start;
        else
          while (j[ax] >= in[src].shape[ax]) j[ax] -= in[src++].shape[ax];
        o.v[flat] = in[src].v[offset_of(in[src], j)];
      });
      return o;
    }
    case op_kind::attention: {
      const dense &q = in[0], &k = in[1], &v = in[2];
      const std::int64_t D = c.global_in[0][2] / a.heads;
      const std::int64_t B = q.shape[0], S = q.shape[1], Sk = k.shape[1];
      // Query head h (global q0 + h) reads key/value head (q0 + h) / group (global), at k0 locally.
      const std::int64_t hq = q.shape[2] / D, q0 = c.in_offset[0][2] / D, k0 = c.in_offset[1][2] / D;
      dense o(q.shape);
      if (hq == 0 || B == 0) return o;
      const std::int64_t group = a.heads / (a.kv_heads > 0 ? a.kv_heads : a.heads);
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t h = 0; h < hq; ++h)
          for (std::int64_t i = 0; i < S; ++i) {
            std::vector<double> p(static_cast<std::size_t>(Sk));
            double mx = -1e300, sum = 0;
            for (std::int64_t j = 0; j < Sk; ++j) {
              double dot = 0;
              for (std::int64_t d = 0; d < D; ++d)
                dot += q.v[offset_of(q, {b, i, h * D + d})] * k.v[offset_of(k, {b, j, ((q0 + h) / group - k0) * D + d})];
              p[static_cast<std::size_t>(j)] = (a.causal && j > i) ? -1e300 : dot / std::sqrt(static_cast<double>(D));
              mx = std::max(mx, p[static_cast<std::size_t>(j)]);
            }
            for (auto& x : p) sum += (x = (x <= -1e299 ? 0.0 : std::exp(x - mx)));
            for (std::int64_t d = 0; d < D; ++d) {
              double acc = 0;
              for (std::int64_t j = 0; j < Sk; ++j) acc += p[static_cast<std::size_t>(j)] / sum * v.v[offset_of(v, {b, j, ((q0 + h) / group - k0) * D + d})];
              o.v[offset_of(o, {b, i, h * D + d})] = acc;
            }
          }
      return o;
    }
    case op_kind::cross_entropy: {
      double n_rows = 1;
      for (std::int64_t d : c.global_in[1]) n_rows *= static_cast<double>(d);
      dense o(tensor_shape{});
      rowwise(in[0], [&](const double* x, double*, std::int64_t n, std::int64_t r) {
        double mx = -1e300, sum = 0;
        for (std::int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
        for (std::int64_t i = 0; i < n; ++i) sum += std::exp(x[i] - mx);
        const auto label = static_cast<std::int64_t>(in[1].v[static_cast<std::size_t>(r)]);
        o.v[0] += (std::log(sum) + mx - x[label]) / n_rows;
      });
      return o;
    }
    default: FAIL("no reference for " << to_string(nd.kind)); return dense{};
  }
}

// ---------------------------------------------------------------- the simulator
// Rank r's copy of a global tensor under `spec`: its block, and zeros where a Partial axis
// gives the value to coordinate 0 only (what a local R -> P conversion produces).
dense local_piece(const device_mesh& m, const sharding_spec& spec, const dense& global, int r) {
  dense out = slice(global, local_box(m, spec, global.shape, r));
  auto coord = m.coordinate(r);
  for (std::size_t a = 0; a < spec.mesh_rank; ++a)
    if (spec[a].is_partial() && coord[a] != 0) std::fill(out.v.begin(), out.v.end(), 0.0);
  return out;
}

int checked_strategies = 0;

// Vocab-parallel cross-entropy needs the operator's own collectives: ranks that hold the same
// rows (they differ only on the mesh axes that shard the vocabulary) combine their row max,
// sum of exponentials and target logit. Returns every rank's loss contribution.
std::vector<dense> cross_entropy_vocab_parallel(const device_mesh& m, const strategy& s, const std::vector<dense>& globals) {
  const int vdim = globals[0].shape.rank - 1;
  double n_rows = 1;
  for (std::int64_t d : globals[1].shape) n_rows *= static_cast<double>(d);
  std::vector<dense> logits, labels;
  std::vector<std::int64_t> voff;
  for (int r = 0; r < m.num_ranks(); ++r) {
    logits.push_back(local_piece(m, s.inputs[0], globals[0], r));
    labels.push_back(local_piece(m, s.inputs[1], globals[1], r));
    voff.push_back(local_box(m, s.inputs[0], globals[0].shape, r).offset[static_cast<std::size_t>(vdim)]);
  }
  std::vector<dense> out;
  for (int r = 0; r < m.num_ranks(); ++r) {
    std::vector<int> group;  // r and the ranks that differ from it only on vocab axes
    for (int q = 0; q < m.num_ranks(); ++q) {
      bool same = true;
      for (std::size_t a = 0; a < m.ndim(); ++a)
        same = same && (s.inputs[0][a].is_shard(vdim) || m.coordinate(q)[a] == m.coordinate(r)[a]);
      if (same) group.push_back(q);
    }
    dense loss(tensor_shape{});
    const std::size_t rows = labels[static_cast<std::size_t>(r)].v.size();
    for (std::size_t i = 0; i < rows; ++i) {
      double mx = -1e300, sum = 0, target = 0;
      const auto label = static_cast<std::int64_t>(labels[static_cast<std::size_t>(r)].v[i]);
      for (int q : group) {  // all-reduce(max)
        const dense& l = logits[static_cast<std::size_t>(q)];
        const std::int64_t vq = l.shape[static_cast<std::size_t>(vdim)];
        for (std::int64_t c = 0; c < vq; ++c) mx = std::max(mx, l.v[i * static_cast<std::size_t>(vq) + static_cast<std::size_t>(c)]);
      }
      for (int q : group) {  // all-reduce(sum) of exponentials and of the target logit
        const dense& l = logits[static_cast<std::size_t>(q)];
        const std::int64_t vq = l.shape[static_cast<std::size_t>(vdim)];
        for (std::int64_t c = 0; c < vq; ++c) sum += std::exp(l.v[i * static_cast<std::size_t>(vq) + static_cast<std::size_t>(c)] - mx);
        const std::int64_t lc = label - voff[static_cast<std::size_t>(q)];
        if (lc >= 0 && lc < vq) target += l.v[i * static_cast<std::size_t>(vq) + static_cast<std::size_t>(lc)];
      }
      loss.v[0] += (std::log(sum) + mx - target) / n_rows;
    }
    out.push_back(std::move(loss));
  }
  return out;
}

// Runs every strategy of vertex `v` on mesh `m` and compares with the unsharded result.
void check_all_strategies(const model_graph& g, vertex_t v, const device_mesh& m, const std::vector<dense>& globals,
                          std::size_t min_strategies = 2) {
  const node& nd = g[v];
  op_context gc;
  for (const dense& t : globals) {
    gc.global_in.push_back(t.shape);
    gc.in_offset.push_back(tensor_shape(std::vector<std::int64_t>(t.shape.rank, 0)));
  }
  gc.global_out = nd.shape;
  gc.out_shape = nd.shape;
  const dense want = apply(nd, globals, gc);
  REQUIRE(want.shape == nd.shape);
  const auto strategies = enumerate_strategies(g, v, m, strategy_options{{device_model{}, run_mode::inference}});  // forward
  CHECK(strategies.size() >= min_strategies);
  for (const strategy& s : strategies) {
    CAPTURE(nd.name);
    CAPTURE(s.name);
    REQUIRE(s.inputs.size() == globals.size());
    std::vector<dense> local_out;
    const bool vocab_parallel = nd.kind == op_kind::cross_entropy && s.inputs[0].is_sharded(static_cast<int>(globals[0].shape.rank) - 1);
    if (vocab_parallel) local_out = cross_entropy_vocab_parallel(m, s, globals);
    for (int r = 0; r < m.num_ranks() && !vocab_parallel; ++r) {
      op_context c = gc;
      std::vector<dense> ins;
      for (std::size_t i = 0; i < globals.size(); ++i) {
        ins.push_back(local_piece(m, s.inputs[i], globals[i], r));
        c.in_offset[i] = local_box(m, s.inputs[i], globals[i].shape, r).offset;
      }
      c.out_shape = local_shape(m, s.output, nd.shape, r);
      local_out.push_back(apply(nd, ins, c));
      REQUIRE(local_out.back().shape == c.out_shape);
    }
    for (int r = 0; r < m.num_ranks(); ++r) {
      dense got = local_out[static_cast<std::size_t>(r)];
      // settle Partial axes: sum over every rank that differs from r only on those axes
      auto coord = m.coordinate(r);
      for (int q = 0; q < m.num_ranks(); ++q) {
        if (q == r) continue;
        auto cq = m.coordinate(q);
        bool same_elsewhere = true;
        for (std::size_t a = 0; a < m.ndim(); ++a)
          same_elsewhere = same_elsewhere && (s.output[a].is_partial() || cq[a] == coord[a]);
        if (!same_elsewhere) continue;
        for (std::size_t i = 0; i < got.v.size(); ++i) got.v[i] += local_out[static_cast<std::size_t>(q)].v[i];
      }
      const dense expect = slice(want, local_box(m, s.output, nd.shape, r));
      REQUIRE(got.shape == expect.shape);
      for (std::size_t i = 0; i < got.v.size(); ++i) {
        CAPTURE(r);
        CAPTURE(i);
        REQUIRE(got.v[i] == doctest::Approx(expect.v[i]).epsilon(1e-9));
      }
    }
    ++checked_strategies;
  }
}

// A one-operator graph over fresh inputs, filled with seeded values.
struct one_op {
  model_graph g;
  std::vector<vertex_t> ins;
  std::vector<dense> values;
  std::mt19937 rng{1234};
  vertex_t add(const std::string& name, tensor_shape s, dtype t = dtype::f32, std::int64_t int_range = 0) {
    ins.push_back(add_input(g, name, s, t));
    dense d(s);
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    std::uniform_int_distribution<std::int64_t> ui(0, std::max<std::int64_t>(int_range - 1, 0));
    for (double& x : d.v) x = int_range ? static_cast<double>(ui(rng)) : u(rng);
    values.push_back(std::move(d));
    return ins.back();
  }
  void check(op_kind k, op_attrs a = {}, std::size_t min_strategies = 2, const device_mesh& mesh = device_mesh{2, 2}) {
    model_graph h = g;
    std::vector<vertex_t> ops = ins;
    std::vector<tensor_shape> shapes;
    for (vertex_t u : ops) shapes.push_back(h[u].shape);
    const tensor_shape out = infer_shape(k, a, shapes);
    vertex_t v = boost::add_vertex(node{"op", k, a, out, dtype::f32}, h);
    for (std::size_t i = 0; i < ops.size(); ++i) boost::add_edge(ops[i], v, edge{static_cast<int>(i)}, h);
    validate(h);
    check_all_strategies(h, v, mesh, values, min_strategies);
  }
};

}  // namespace

TEST_CASE("matmul strategy counts follow DTensor's einsum generator") {
  model_graph g;
  const device_mesh m{2, 2};
  strategy_options all;
  all.drop_empty_shards = false;
  SUBCASE("mm: 4 options (R, m, n, k) per axis, 16 on a 2-D mesh") {
    auto a = add_input(g, "a", {8, 16}, dtype::f32);
    auto b = add_input(g, "b", {16, 4}, dtype::f32);
    auto c = add_op(g, op_kind::matmul, "mm", {a, b});
    CHECK(enumerate_strategies(g, c, m, all).size() == 16);
    CHECK(enumerate_strategies(g, c, device_mesh{2, 2, 2}, all).size() == 64);
    CHECK(enumerate_strategies(g, c, device_mesh{8}, all).size() == 4);
  }
  SUBCASE("bmm: 5 options (R, b, m, n, k) per axis, 25 on a 2-D mesh") {
    auto a = add_input(g, "a", {4, 8, 16}, dtype::f32);
    auto b = add_input(g, "b", {4, 16, 4}, dtype::f32);
    auto c = add_op(g, op_kind::matmul, "bmm", {a, b});
    CHECK(enumerate_strategies(g, c, m, all).size() == 25);
  }
  SUBCASE("the filter drops dims smaller than their shard count, the even policy uneven ones") {
    // m=2, k=16, n=4 on a 2x4 mesh. Sharding m on the 4-wide axis 1 (4 combinations) cuts
    // 2 rows 4 ways; n on both axes cuts 4 columns 8 ways: 16 - 4 - 1 = 11 remain.
    auto a = add_input(g, "a", {2, 16}, dtype::f32);
    auto b = add_input(g, "b", {16, 4}, dtype::f32);
    auto c = add_op(g, op_kind::matmul, "mm", {a, b});
    const device_mesh m24{2, 4};
    CHECK(enumerate_strategies(g, c, m24, all).size() == 16);
    CHECK(enumerate_strategies(g, c, m24).size() == 11);
    // m=5: over axis 0 it is cut 3,2 (uneven, kept by default, dropped by the even policy);
    // over axis 1 it is cut 2,2,1,0 (an empty shard: always dropped), over both 8 ways.
    auto a5 = add_input(g, "a5", {5, 16}, dtype::f32);
    auto c5 = add_op(g, op_kind::matmul, "mm5", {a5, b});
    strategy_options even;
    even.even_split_only = true;
    CHECK(enumerate_strategies(g, c5, m24).size() == 11);
    CHECK(enumerate_strategies(g, c5, m24, even).size() == 8);
    for (const strategy& s : enumerate_strategies(g, c5, m24, even)) CHECK(divides_evenly(m24, s.output, {5, 4}));
  }
}

TEST_CASE("every strategy of every operator kind computes the sharded result") {
  checked_strategies = 0;
  std::map<op_kind, bool> covered;
  auto run = [&](op_kind k, const std::function<void(one_op&)>& setup, op_attrs a = {}, std::size_t min_s = 2) {
    one_op t;
    setup(t);
    t.check(k, a, min_s);
    covered[k] = true;
  };
  op_attrs conv1d;
  conv1d.transposed_weight = true;
  run(op_kind::linear, [](one_op& t) { t.add("x", {4, 3, 6}); t.add("w", {5, 6}); t.add("b", {5}); });
  run(op_kind::linear, [](one_op& t) { t.add("x", {4, 6}); t.add("w", {6, 4}); }, conv1d);
  run(op_kind::matmul, [](one_op& t) { t.add("a", {4, 6}); t.add("b", {6, 5}); });
  run(op_kind::matmul, [](one_op& t) { t.add("a", {2, 4, 6}); t.add("b", {2, 6, 4}); });
  run(op_kind::matmul, [](one_op& t) { t.add("a", {2, 3, 4}); t.add("b", {4, 2}); });
  for (op_kind k : {op_kind::gelu, op_kind::gelu_erf, op_kind::silu, op_kind::relu, op_kind::tanh, op_kind::exp, op_kind::dropout})
    run(k, [](one_op& t) { t.add("x", {4, 3, 5}); });
  op_attrs rot;
  rot.heads = 2;
  run(op_kind::rotary, [](one_op& t) { t.add("x", {2, 4, 8}); }, rot);
  for (op_kind k : {op_kind::add, op_kind::sub, op_kind::mul})
    run(k, [](one_op& t) { t.add("x", {4, 3, 6}); t.add("y", {6}); });
  run(op_kind::add, [](one_op& t) { t.add("x", {4, 1, 6}); t.add("y", {1, 3, 6}); });
  run(op_kind::div, [](one_op& t) {
    t.add("x", {4, 6});
    t.add("y", {4, 6});
    for (double& v : t.values[1].v) v = 1.5 + v;  // keep away from zero
  });
  run(op_kind::layer_norm, [](one_op& t) { t.add("x", {4, 3, 6}); t.add("w", {6}); t.add("b", {6}); });
  run(op_kind::rms_norm, [](one_op& t) { t.add("x", {4, 6}); t.add("w", {6}); });
  op_attrs gemma_norm;  // Gemma's: the row times 1 + weight; and an epsilon that shows
  gemma_norm.weight_offset = 1.0;
  gemma_norm.epsilon = 0.5;
  run(op_kind::rms_norm, [](one_op& t) { t.add("x", {4, 6}); t.add("w", {6}); }, gemma_norm);
  op_attrs sm;
  sm.axis = 1;
  run(op_kind::softmax, [](one_op& t) { t.add("x", {4, 5, 2}); }, sm);
  run(op_kind::embedding, [](one_op& t) { t.add("ids", {4, 3}, dtype::i64, 10); t.add("table", {10, 6}); });
  op_attrs scaled;  // Gemma's normalizer: a vocab-parallel partial sum scales as well
  scaled.scale = 3.0;
  run(op_kind::embedding, [](one_op& t) { t.add("ids", {4, 3}, dtype::i64, 10); t.add("table", {10, 6}); }, scaled);
  op_attrs rs;
  rs.dims = {4, 3, 2, 4};
  run(op_kind::reshape, [](one_op& t) { t.add("x", {4, 6, 4}); }, rs);
  rs.dims = {8, 12};
  run(op_kind::reshape, [](one_op& t) { t.add("x", {4, 2, 3, 4}); }, rs);
  op_attrs tp;
  tp.dims = {2, 0, 1};
  run(op_kind::transpose, [](one_op& t) { t.add("x", {4, 3, 6}); }, tp);
  op_attrs red;
  red.dims = {0, 2};
  run(op_kind::reduce_sum, [](one_op& t) { t.add("x", {4, 3, 6}); }, red);
  run(op_kind::reduce_mean, [](one_op& t) { t.add("x", {4, 3, 6}); }, red);
  op_attrs cat;
  cat.axis = 1;
  run(op_kind::concat, [](one_op& t) { t.add("x", {4, 3, 6}); t.add("y", {4, 2, 6}); }, cat);
  op_attrs sp;
  sp.axis = 2;
  sp.start = 2;
  sp.length = 3;
  run(op_kind::split, [](one_op& t) { t.add("x", {4, 3, 6}); }, sp);
  op_attrs att;
  att.heads = 4;
  att.kv_heads = 2;
  att.causal = true;
  run(op_kind::attention, [](one_op& t) { t.add("q", {2, 3, 8}); t.add("k", {2, 3, 4}); t.add("v", {2, 3, 4}); }, att);
  att.kv_heads = 4;
  att.causal = false;
  run(op_kind::attention, [](one_op& t) { t.add("q", {4, 3, 8}); t.add("k", {4, 5, 8}); t.add("v", {4, 5, 8}); }, att);
  run(op_kind::where, [](one_op& t) { t.add("c", {4, 1, 6}, dtype::boolean, 2); t.add("x", {4, 3, 6}); t.add("y", {6}); });
  op_attrs ex;
  ex.dims = {4, 3, 2, 6};
  run(op_kind::expand, [](one_op& t) { t.add("x", {3, 1, 6}); }, ex);
  run(op_kind::cross_entropy, [](one_op& t) { t.add("logits", {4, 3, 7}); t.add("labels", {4, 3}, dtype::i64, 7); });
  run(op_kind::cross_entropy, [](one_op& t) { t.add("logits", {6, 8}); t.add("labels", {6}, dtype::i64, 8); });

  for (op_kind k : all_op_kinds)
    if (is_source(k) || k == op_kind::opaque) CHECK_FALSE(covered.count(k));  // opaque: no kernel (tested apart)
    else {
      CAPTURE(to_string(k));
      CHECK(covered.count(k) == 1);
    }
  MESSAGE("checked " << checked_strategies << " strategies numerically");
  CHECK(checked_strategies > 300);
}

TEST_CASE("strategy costs: compute, training communication, memory") {
  model_graph g;
  const device_mesh m = make_mesh_2d(2, 2, 25e9, 300e9);
  auto x = add_input(g, "x", {64, 1024}, dtype::bf16);
  auto w = add_parameter(g, "fc.weight", {4096, 1024}, dtype::bf16);
  auto fc = add_op(g, op_kind::linear, "fc", {x, w});
  const auto parse = [](const char* s, int rank) { return parse_spec(s, 2, rank); };
  auto find = [&](const std::vector<strategy>& ss, const sharding_spec& a, const sharding_spec& b) -> const strategy& {
    for (const strategy& s : ss)
      if (s.inputs[0] == a && s.inputs[1] == b) return s;
    FAIL("strategy not found");
    return ss.front();
  };
  strategy_options infer, train;
  infer.pricing.mode = run_mode::inference;
  train.pricing.mode = run_mode::training;
  const auto si = enumerate_strategies(g, fc, m, infer);
  const auto st = enumerate_strategies(g, fc, m, train);
  CHECK(si.size() == 16);  // labels b, o, c (+R) on two axes

  // data parallel on axis 0 and column parallel on axis 1: x S0R, W RS0 (out dim on axis 1)
  const strategy& dp = find(si, parse("S0R", 2), parse("S1R", 2));
  CHECK(dp.output == parse("S0S1", 2));
  const double flops = 2.0 * 32 * 2048 * 1024;
  const double bytes = (32.0 * 1024 + 2048.0 * 1024 + 32.0 * 2048) * 2;
  CHECK(dp.compute_seconds == doctest::Approx(flops / 312e12 + bytes / 2e12).scale(1e-9));
  CHECK(dp.comm_seconds == 0.0);
  CHECK(dp.memory_bytes == 32 * 2048 * 2);
  // training: W is Replicate on axis 0 where the batch is sharded -> its gradient is Partial
  // there (the data-parallel gradient sync, priced on the edge W -> fc). x is a graph input:
  // no gradient, so its operand's gradient spec only mirrors its input spec.
  const strategy& dpt = find(st, parse("S0R", 2), parse("S1R", 2));
  CHECK(dpt.comm_seconds == 0.0);
  CHECK(dpt.grads[1] == parse("[P,S(0)]", 2));
  CHECK(dpt.grads[0] == dpt.inputs[0]);
  CHECK(dpt.compute_seconds == doctest::Approx(3 * dp.compute_seconds).scale(1e-9));
  // A differentiable activation operand Replicate where the weight's out dim is sharded has a
  // Partial gradient there (a second linear fed by fc's output).
  auto w2 = add_parameter(g, "fc2.weight", {256, 4096}, dtype::bf16);
  auto fc2 = add_op(g, op_kind::linear, "fc2", {fc, w2});
  const auto st2 = enumerate_strategies(g, fc2, m, train);
  const strategy& col2 = find(st2, parse("RR", 2), parse("S0R", 2));
  CHECK(col2.grads[0] == parse("[P,R]", 2));
  CHECK(col2.grads[1] == parse("S0R", 2));
  // fully replicated: nothing to reduce
  CHECK(find(st, parse("RR", 2), parse("RR", 2)).grads[1] == parse("RR", 2));
  // row parallel (contraction on both axes): output Partial, no gradient reduction
  const strategy& rp = find(st, parse("RS01", 2), parse("RS01", 2));
  CHECK(rp.output == parse("RRP01", 2));
  CHECK(rp.comm_seconds == 0.0);
  // vocab-parallel cross-entropy: its own forward all-reduces (max, sum of exp, target) of
  // one f32 per local row; batch-sharded on axis 0 (256 of 512 rows), vocab on axis 1.
  auto logits = add_input(g, "logits", {512, 32000}, dtype::bf16);
  auto labels = add_input(g, "labels", {512}, dtype::i64);
  auto loss = add_op(g, op_kind::cross_entropy, "loss", {logits, labels});
  const auto sl = enumerate_strategies(g, loss, m, infer);
  CHECK(sl.size() == 9);  // R, batch, vocab on two axes
  const strategy& vp = find(sl, parse("S0S1", 2), parse("S0", 1));
  CHECK(vp.output == replicated_spec(2, 0).with(0, Partial()));
  CHECK(vp.comm_seconds == doctest::Approx(3 * collective_time(collective::all_reduce, m.link(1), 2, 256.0 * 4)).scale(1e-9));
  CHECK(find(sl, parse("S0R", 2), parse("S0", 1)).comm_seconds == 0.0);
  // a parameter's memory: its local shard, 16 B per element in training with mixed-precision
  // Adam (bf16 weight and gradient, f32 master and two moments), 8 B with SGD. Stored
  // replicated on some axes it also comes as ZeRO-1 (the 12 B of optimizer state sharded over
  // those axes) and ZeRO-2 (the gradient's 2 B too): 9 specs, 5 of them replicated somewhere.
  const auto pw = enumerate_strategies(g, w, m, train);
  CHECK(pw.size() == 9 + 2 * 5);
  for (const strategy& s : pw) {
    CAPTURE(s.name);
    const std::int64_t n = max_local_shape(m, s.output, {4096, 1024}).numel();
    int replicated = 1;  // ranks that hold the same n elements
    for (std::size_t a = 0; a < 2; ++a) replicated *= s.output[a].is_replicate() ? 2 : 1;
    if (s.zero_stage == 0) CHECK(s.memory_bytes == 16 * n);
    if (s.zero_stage == 1) CHECK(s.memory_bytes == 4 * n + 12 * n / replicated);
    if (s.zero_stage == 2) CHECK(s.memory_bytes == 2 * n + 14 * n / replicated);
    CHECK((s.zero_stage == 0 || replicated > 1));
  }
  strategy_options sgd = train;
  sgd.pricing.optimizer = optimizer_kind::sgd;
  sgd.pricing.zero = false;
  for (const strategy& s : enumerate_strategies(g, w, m, sgd))
    CHECK(s.memory_bytes == 8 * max_local_shape(m, s.output, {4096, 1024}).numel());
  CHECK(parameter_state_bytes(dtype::f32, optimizer_kind::adam) == 16);
  CHECK(parameter_state_bytes(dtype::f32, optimizer_kind::sgd) == 8);
}

TEST_CASE("edge resharding cost matrix is the priced redistribute plan, and in training its adjoint") {
  model_graph g;
  const device_mesh m = make_mesh_2d(2, 4, 25e9, 300e9);
  auto x = add_input(g, "x", {64, 1000}, dtype::f32);
  auto w = add_parameter(g, "fc.weight", {512, 1000}, dtype::f32);
  auto b = add_parameter(g, "fc.bias", {512}, dtype::f32);
  auto fc = add_op(g, op_kind::linear, "fc", {x, w, b});
  auto act = add_op(g, op_kind::gelu, "act", {fc});
  for (strategy_options opt : {strategy_options{{device_model{}, run_mode::inference}}, strategy_options{{device_model{}, run_mode::training}}}) {
    const bool train = opt.pricing.mode == run_mode::training;
    opt.pricing.gradient_bucket_bytes = 0;  // every tensor pays its own latency: the plain plan price
    opt.pricing.gradient_overlap = 0.0;     // none of it hidden behind the backward
    const auto sx = enumerate_strategies(g, x, m, opt);
    const auto sb = enumerate_strategies(g, b, m, opt);
    const auto sfc = enumerate_strategies(g, fc, m, opt);
    const auto sact = enumerate_strategies(g, act, m, opt);
    // Partial axes of a produced tensor take a Replicate gradient.
    auto grad_layout = [](sharding_spec s) {
      for (std::size_t a = 0; a < s.mesh_rank; ++a)
        if (s[a].is_partial()) s[a] = Replicate();
      return s;
    };
    const edge_t e = boost::edge(fc, act, g).first;
    const cost_matrix r = resharding_costs(g, e, sfc, sact, m, opt);
    REQUIRE(r.rows == sfc.size());
    REQUIRE(r.cols == sact.size());
    int free_backward = 0, paid_backward = 0;
    for (std::size_t i = 0; i < r.rows; ++i)
      for (std::size_t j = 0; j < r.cols; ++j) {
        const double fwd = price_plan(m, plan_redistribute(m, sfc[i].output, sact[j].inputs[0], tensor_shape{64, 512}),
                                      {64, 512}, dtype::f32).seconds;
        // gelu hands back its gradient laid out as its input; it goes back to fc's layout.
        const double bwd = train ? price_plan(m, plan_redistribute(m, sact[j].inputs[0], grad_layout(sfc[i].output), tensor_shape{64, 512}),
                                              {64, 512}, dtype::f32).seconds
                                 : 0.0;
        CHECK(r(i, j) == doctest::Approx(fwd + bwd).scale(1e-9));
        if (sfc[i].output == sact[j].inputs[0]) CHECK(r(i, j) == 0.0);
        // An all-reduce's backward is free; a local slice's backward is an all-gather.
        if (train && sfc[i].output == parse_spec("[R,P]", 2, 2) && sact[j].inputs[0] == parse_spec("RR", 2)) {
          CHECK(bwd == 0.0);
          ++free_backward;
        }
        if (train && sfc[i].output == parse_spec("RR", 2) && sact[j].inputs[0] == parse_spec("RS1", 2)) {
          CHECK(bwd == doctest::Approx(collective_time(collective::all_gather, m.link(1), 4, 64 * 512 * 4.0)).scale(1e-9));
          ++paid_backward;
        }
      }
    if (train) CHECK(free_backward + paid_backward == 2);
    // x -> fc operand 0: a graph input has no gradient, so only the forward is priced
    const cost_matrix rx = resharding_costs(g, boost::edge(x, fc, g).first, sx, sfc, m, opt);
    for (std::size_t i = 0; i < rx.rows; ++i)
      for (std::size_t j = 0; j < rx.cols; ++j)
        CHECK(rx(i, j) == doctest::Approx(redistribute_seconds(m, sx[i].output, sfc[j].inputs[0], {64, 1000}, dtype::f32)).scale(1e-9));
    // bias -> fc operand 2: Replicate -> Partial is free; Shard -> Partial gathers first.
    // In training the bias gradient comes back (Partial where fc splits the batch: the
    // data-parallel gradient sync) to the bias's own layout, or a ZeRO bias's shard; and a
    // bias gathered for the forward is gathered again for the backward.
    const cost_matrix rb = resharding_costs(g, boost::edge(b, fc, g).first, sb, sfc, m, opt);
    std::size_t partial_cols = 0;
    for (std::size_t j = 0; j < rb.cols; ++j) {
      if (!sfc[j].inputs[2].has_partial()) continue;
      ++partial_cols;
      for (std::size_t i = 0; i < rb.rows; ++i) {
        sharding_spec via = sfc[j].inputs[2];
        for (std::size_t a = 0; a < 2; ++a)
          if (via[a].is_partial() && sb[i].output[a].is_shard()) via[a] = Replicate();
        const sharding_spec back = sb[i].zero_stage > 0 ? sb[i].gradient_spec : sb[i].output;
        const double bwd = train ? price_plan(m, plan_redistribute(m, sfc[j].grads[2], back, tensor_shape{512}), {512}, dtype::f32).seconds
                                 : 0.0;
        const double fwd = redistribute_seconds(m, sb[i].output, via, {512}, dtype::f32);
        CHECK(std::isfinite(rb(i, j)));
        CHECK(rb(i, j) == doctest::Approx(fwd * (train ? 2 : 1) + bwd).scale(1e-9));
      }
    }
    CHECK(partial_cols > 0);
  }
}

namespace {
/// Two layers of x [64, 256] -> fc(W [256, 256]) -> gelu, f32: "l0.weight", "l0.fc", "l0.act", then "l1.*".
model_graph two_linear_layers() {
  model_graph g;
  vertex_t h = add_input(g, "x", {64, 256}, dtype::f32);
  for (int l = 0; l < 2; ++l) {
    const std::string n = "l" + std::to_string(l);
    auto w = add_parameter(g, n + ".weight", {256, 256}, dtype::f32);
    auto fc = add_op(g, op_kind::linear, n + ".fc", {h, w});
    h = add_op(g, op_kind::gelu, n + ".act", {fc});
  }
  return g;
}
}  // namespace

TEST_CASE("a plan price cache shared by edges gives every edge the prices it gets alone") {
  // Two layers of the same shapes: the second layer's edges are the first's plans again.
  model_graph g = two_linear_layers();
  const device_mesh m = make_mesh_2d(2, 4, 25e9, 300e9);
  strategy_options opt{{device_model{}, run_mode::training}};
  std::vector<std::vector<strategy>> all(boost::num_vertices(g));
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) all[v] = enumerate_strategies(g, v, m, opt);
  plan_price_cache shared(m);
  const auto vertex = [&](const std::string& name) {
    for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
      if (g[v].name == name) return v;
    throw std::logic_error("no vertex " + name);
  };
  const auto price = [&](const std::string& from, const std::string& to) {
    const vertex_t u = vertex(from), v = vertex(to);
    const edge_t e = boost::edge(u, v, g).first;
    const cost_matrix alone = resharding_costs(g, e, all[u], all[v], m, opt);
    const cost_matrix cached = resharding_costs(g, e, all[u], all[v], m, opt, {}, &shared);
    CHECK(cached.values == alone.values);  // bit for bit
  };
  price("x", "l0.fc");
  price("l0.weight", "l0.fc");
  price("l0.fc", "l0.act");
  const std::size_t first_layer = shared.size();
  CHECK(first_layer > 0);
  // The second layer's weight and output edges are the first layer's plans: nothing new.
  price("l1.weight", "l1.fc");
  price("l1.fc", "l1.act");
  CHECK(shared.size() == first_layer);
  price("l0.act", "l1.fc");
  // What the cache answers is price_plan of plan_redistribute, for any spec pair and shape.
  const sharding_spec from = parse_spec("S0R", 2), to = parse_spec("RS1", 2);
  const plan_cost direct = price_plan(m, plan_redistribute(m, from, to, tensor_shape{64, 256}), {64, 256}, dtype::f32);
  CHECK(shared(from, to, {64, 256}, dtype::f32).seconds == direct.seconds);
  CHECK(shared(from, to, {64, 256}, dtype::bf16).seconds < direct.seconds);  // the dtype is part of the key
  CHECK(shared(from, to, {64, 512}, dtype::f32).seconds > direct.seconds);   // and the shape
  // A full cache still answers, without keeping what it priced.
  plan_price_cache none(m, 0);
  CHECK(none(from, to, {64, 256}, dtype::f32).seconds == direct.seconds);
  CHECK(none.size() == 0);
  // A cache on another mesh is refused: its prices would be another mesh's.
  const device_mesh other = make_mesh_2d(2, 4, 25e9, 100e9);
  plan_price_cache wrong(other);
  const edge_t e = boost::edge(vertex("l0.fc"), vertex("l0.act"), g).first;
  CHECK_THROWS_AS(resharding_costs(g, e, all[boost::source(e, g)], all[boost::target(e, g)], m, opt, {}, &wrong), graph_error);
}

TEST_CASE("edges alike in everything resharding_costs reads price alike, and each thing it reads tells two apart") {
  // Two layers of x -> fc(W) -> gelu; the second layer's edges are the first's over again.
  const model_graph g = two_linear_layers();
  const device_mesh m = make_mesh_2d(2, 2, 25e9, 300e9);
  strategy_options opt{{device_model{}, run_mode::training}};
  opt.pricing.gradient_overlap = gradient_overlap_model::behind_backward();  // the consumer's backward hides the sync
  std::vector<std::vector<strategy>> all(boost::num_vertices(g));
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) all[v] = enumerate_strategies(g, v, m, opt);
  const auto edge = [&](const std::string& from, const std::string& to) {
    const auto u = find_vertex(g, from), v = find_vertex(g, to);
    REQUIRE((u && v));
    return boost::edge(*u, *v, g).first;
  };
  const auto inputs = [&](edge_t e, const std::vector<strategy>& p, const std::vector<strategy>& c) {
    return edge_pricing_inputs(g, e, p, c, opt);
  };
  const auto costs = [&](edge_t e, const std::vector<strategy>& p, const std::vector<strategy>& c) {
    return resharding_costs(g, e, p, c, m, opt).values;
  };
  for (const auto& [a, b] : {std::pair{edge("l0.weight", "l0.fc"), edge("l1.weight", "l1.fc")},
                             std::pair{edge("l0.fc", "l0.act"), edge("l1.fc", "l1.act")}}) {
    const vertex_t ua = boost::source(a, g), va = boost::target(a, g), ub = boost::source(b, g), vb = boost::target(b, g);
    const edge_pricing_inputs ia = inputs(a, all[ua], all[va]), ib = inputs(b, all[ub], all[vb]);
    CHECK(ia.alike(ib));
    CHECK(ia.hash() == ib.hash());
    CHECK(costs(a, all[ua], all[va]) == costs(b, all[ub], all[vb]));  // bit for bit
  }
  // Each thing the pricer reads, changed on the second layer's weight edge alone: no longer
  // alike, and (where the change reaches this edge's costs) priced otherwise.
  const edge_t wa = edge("l0.weight", "l0.fc"), wb = edge("l1.weight", "l1.fc");
  const vertex_t pw = boost::source(wb, g), cw = boost::target(wb, g);
  const edge_pricing_inputs base = inputs(wa, all[boost::source(wa, g)], all[boost::target(wa, g)]);
  const std::vector<double> before = costs(wb, all[pw], all[cw]);
  std::size_t dp = all[cw].size();  // a consumer strategy whose weight gradient is synchronised
  for (std::size_t j = 0; j < all[cw].size(); ++j)
    if (all[cw][j].grads.size() > 1 && all[cw][j].grads[1].has_partial() && all[cw][j].inputs[1].is_replicated()) dp = j;
  REQUIRE(dp < all[cw].size());
  const auto differs = [&](const char* what, std::vector<strategy> producer, std::vector<strategy> consumer, bool costs_move) {
    INFO(what);
    CHECK_FALSE(base.alike(inputs(wb, producer, consumer)));
    if (costs_move) CHECK(costs(wb, producer, consumer) != before);
  };
  {
    std::vector<strategy> c = all[cw];
    c[dp].backward_compute_seconds *= 0.5;  // less backward to hide the sync behind
    differs("the consumer's backward compute", all[pw], c, true);
  }
  {
    std::vector<strategy> c = all[cw];
    c[dp].grads[1] = c[dp].inputs[1];  // the weight's gradient handed back whole: no sync
    differs("the consumer's gradient", all[pw], c, true);
  }
  {
    std::vector<strategy> c = all[cw];
    c[dp].inputs[1] = c[dp].output;  // another spec the weight must arrive in
    differs("the consumer's operand spec", all[pw], c, true);
  }
  {
    std::vector<strategy> c = all[cw];
    c[dp].recompute = recompute_kind::full;  // a recomputed consumer reshards its activations again
    differs("the consumer's recomputation", all[pw], c, false);
  }
  {
    std::vector<strategy> p = all[pw];
    const auto other_output = std::find_if(p.begin(), p.end(), [&](const strategy& s) { return !(s.output == p[0].output); });
    REQUIRE(other_output != p.end());
    p[0].output = other_output->output;
    differs("the producer's output", p, all[cw], true);
  }
  {
    std::vector<strategy> p = all[pw];
    std::size_t r = p.size();
    for (std::size_t i = 0; i < p.size(); ++i) r = p[i].output.is_replicated() && p[i].zero_stage == 0 ? i : r;
    REQUIRE(r < p.size());
    p[r].zero_stage = 1;  // ZeRO-1: the gradient ends where gradient_spec says, synchronised once per step
    p[r].gradient_spec = p[r].output;
    p[r].gradient_spec[0] = Shard(0);
    differs("the producer's ZeRO stage and backward target", p, all[cw], true);
  }
  {
    std::vector<strategy> p = all[pw];
    p[0].recompute = recompute_kind::full;  // what the pass's ties inside a layer read
    differs("the producer's recomputation", p, all[cw], false);
  }
  {
    std::vector<strategy> c = all[cw];
    c.pop_back();
    differs("the consumer's strategy count", all[pw], c, true);
  }
  // The pricing options the backward reads, and the mode.
  strategy_options other = opt;
  other.pricing.gradient_bucket_bytes = 1 << 20;
  CHECK_FALSE(base.alike(edge_pricing_inputs(g, wb, all[pw], all[cw], other)));
  other = opt;
  other.pricing.mode = run_mode::inference;
  CHECK_FALSE(base.alike(edge_pricing_inputs(g, wb, all[pw], all[cw], other)));
  // Another source shape: a wider layer's edge, in a graph of its own (the inputs refer to
  // their graph's nodes: adding vertices to g would move them).
  model_graph g2;
  const vertex_t wide = add_parameter(g2, "l2.weight", {256, 512}, dtype::f32);
  const vertex_t x2 = add_input(g2, "x2", {64, 512}, dtype::f32);
  const vertex_t fc2 = add_op(g2, op_kind::linear, "l2.fc", {x2, wide});
  const std::vector<strategy> sw = enumerate_strategies(g2, wide, m, opt), sf = enumerate_strategies(g2, fc2, m, opt);
  CHECK_FALSE(base.alike(edge_pricing_inputs(g2, boost::edge(wide, fc2, g2).first, sw, sf, opt)));
}

TEST_CASE("gradient sync of parameters is bucketed and may overlap") {
  model_graph g;
  const device_mesh m = make_mesh_2d(2, 4, 25e9, 300e9);
  auto x = add_input(g, "x", {64, 1000}, dtype::bf16);
  auto w = add_parameter(g, "fc.weight", {512, 1000}, dtype::bf16);
  auto fc = add_op(g, op_kind::linear, "fc", {x, w});
  strategy_options opt{{device_model{}, run_mode::training}};
  opt.pricing.gradient_overlap = 0.0;
  const auto sw = enumerate_strategies(g, w, m, opt);
  const auto sfc = enumerate_strategies(g, fc, m, opt);
  std::size_t rep = 0, dp = 0;
  for (std::size_t i = 0; i < sw.size(); ++i) rep = sw[i].output.is_replicated() && sw[i].zero_stage == 0 ? i : rep;
  for (std::size_t j = 0; j < sfc.size(); ++j)
    dp = sfc[j].inputs[0] == parse_spec("S01R", 2) && sfc[j].inputs[1].is_replicated() ? j : dp;
  REQUIRE(sfc[dp].grads[1] == parse_spec("[P,P]", 2, 2));
  const edge_t e = boost::edge(w, fc, g).first;
  const double B = 512 * 1000 * 2;  // bytes of the weight gradient
  // Per tensor: the hierarchical all-reduce over both axes, each collective with its latency.
  opt.pricing.gradient_bucket_bytes = 0;
  const double per_tensor = resharding_costs(g, e, sw, sfc, m, opt)(rep, dp);
  const link_model a = m.link(0), b = m.link(1);
  CHECK(per_tensor == doctest::Approx(2 * (b.alpha + 0.75 * B / b.beta) + a.alpha + 2 * 0.5 * (B / 4) / a.beta).scale(1e-9));
  // Bucketed (25 MiB): each collective's latency is paid in proportion to the bytes.
  opt.pricing.gradient_bucket_bytes = 25.0 * (1 << 20);
  const double bucketed = resharding_costs(g, e, sw, sfc, m, opt)(rep, dp);
  const double lat = 2 * b.alpha + a.alpha;
  CHECK(bucketed == doctest::Approx(per_tensor - lat + 2 * b.alpha * B / opt.pricing.gradient_bucket_bytes +
                                    a.alpha * (B / 4) / opt.pricing.gradient_bucket_bytes).scale(1e-9));
  // Half of it overlapped with the backward compute: half is charged.
  opt.pricing.gradient_overlap = 0.5;
  CHECK(resharding_costs(g, e, sw, sfc, m, opt)(rep, dp) == doctest::Approx(0.5 * bucketed).scale(1e-9));
  opt.pricing.gradient_overlap = 1.0;
  CHECK(resharding_costs(g, e, sw, sfc, m, opt)(rep, dp) == 0.0);
}

TEST_CASE("gradient sync hidden behind the backward: per edge, exposed = max(0, sync - the consumer's backward)") {
  // fc = x W^T, x [batch, 1000], W [512, 1000] bf16, batch over all 8 devices of a 2x4 mesh
  // (25 / 300 GB/s), W replicated: W's gradient is [P,P] and its sync is the hierarchical
  // all-reduce of 1,024,000 B, bucketed (25 MiB): the same for any batch. The consumer's
  // backward is two products as costly as its forward (312 TFLOP/s, 2 TB/s):
  //   forward = 2 (batch/8) 1000 512 / 312e12 + ((batch/8) 1000 + 512 1000 + (batch/8) 512) 2 / 2e12
  const device_mesh m = make_mesh_2d(2, 4, 25e9, 300e9);
  const link_model a = m.link(0), b = m.link(1);
  const double B = 512 * 1000 * 2, bucket = 25.0 * (1 << 20);
  const double sync = 2 * (b.alpha * B / bucket + 0.75 * B / b.beta) + a.alpha * (B / 4) / bucket + 2 * 0.5 * (B / 4) / a.beta;
  const auto price = [&](std::int64_t batch, gradient_overlap_model overlap) {
    model_graph g;
    auto x = add_input(g, "x", {batch, 1000}, dtype::bf16);
    auto w = add_parameter(g, "fc.weight", {512, 1000}, dtype::bf16);
    auto fc = add_op(g, op_kind::linear, "fc", {x, w});
    strategy_options opt{{device_model{}, run_mode::training}};
    opt.pricing.gradient_overlap = overlap;
    const auto sw = enumerate_strategies(g, w, m, opt);
    const auto sfc = enumerate_strategies(g, fc, m, opt);
    const strategy* rep = nullptr;
    const strategy* dp = nullptr;
    for (const strategy& s : sw) rep = s.output.is_replicated() && s.zero_stage == 0 ? &s : rep;
    for (const strategy& s : sfc) dp = s.inputs[0] == parse_spec("S01R", 2) && s.inputs[1].is_replicated() ? &s : dp;
    REQUIRE((rep && dp));
    const double local = static_cast<double>(batch / 8);
    const double forward = 2 * local * 1000 * 512 / 312e12 + (local * 1000 + 512 * 1000 + local * 512) * 2 / 2e12;
    CHECK(dp->backward_compute_seconds == doctest::Approx(2 * forward).scale(1e-9));
    CHECK(dp->compute_seconds == doctest::Approx(3 * forward).scale(1e-9));
    const edge_t e = boost::edge(w, fc, g).first;
    const edge_costs c = price_edge(g, e, *rep, *dp, m, true, backward_pricing_of(g, e, opt));
    CHECK(c.sync == doctest::Approx(sync).scale(1e-9));
    CHECK(c.forward == 0.0);
    CHECK(c.regather == 0.0);
    return std::pair{c.backward, 2 * forward};
  };
  const gradient_overlap_model behind = gradient_overlap_model::behind_backward();
  // 64 rows: the window (1.10 us) hides part of the sync (15.4 us plus latencies).
  const auto [exposed64, window64] = price(64, behind);
  CHECK(window64 == doctest::Approx(2 * (2.0 * 8 * 1000 * 512 / 312e12 + (8.0 * 1000 + 512 * 1000 + 8 * 512) * 2 / 2e12)).scale(1e-9));
  CHECK(window64 < sync);
  CHECK(exposed64 == doctest::Approx(sync - window64).scale(1e-9));
  // 65536 rows: a window of 80 us hides all of it.
  const auto [exposed64k, window64k] = price(65536, behind);
  CHECK(window64k > sync);
  CHECK(exposed64k == 0.0);
  // A fraction keeps its meaning whatever the window; 0 is every byte charged.
  CHECK(price(65536, 0.25).first == doctest::Approx(0.75 * sync).scale(1e-9));
  CHECK(price(64, 0.0).first == doctest::Approx(sync).scale(1e-9));
  // Inference has no gradients: every model prices the same.
  {
    model_graph g;
    auto x = add_input(g, "x", {64, 1000}, dtype::bf16);
    auto w = add_parameter(g, "fc.weight", {512, 1000}, dtype::bf16);
    auto fc = add_op(g, op_kind::linear, "fc", {x, w});
    strategy_options infer{{device_model{}, run_mode::inference}};
    const auto sw = enumerate_strategies(g, w, m, infer), sfc = enumerate_strategies(g, fc, m, infer);
    const edge_t e = boost::edge(w, fc, g).first;
    infer.pricing.gradient_overlap = 0.0;
    const cost_matrix none = resharding_costs(g, e, sw, sfc, m, infer);
    infer.pricing.gradient_overlap = behind;
    CHECK(resharding_costs(g, e, sw, sfc, m, infer).values == none.values);
  }
  // The model on its own, the numbers by hand.
  CHECK(behind.exposed(3e-3, 1e-3) == doctest::Approx(2e-3).scale(1e-15));
  CHECK(behind.exposed(1e-3, 3e-3) == 0.0);
  CHECK(gradient_overlap_model(0.4).exposed(3e-3, 1e-3) == doctest::Approx(1.8e-3).scale(1e-15));
  CHECK(gradient_overlap_model(0.0).exposed(3e-3, 1e-3) == 3e-3);  // exactly the old price
  // Spelled as the CLI and plan files spell it.
  CHECK(to_string(behind) == "backward");
  CHECK(to_string(gradient_overlap_model(0.4)) == "0.4");
  CHECK(parse_gradient_overlap("backward") == behind);
  CHECK(parse_gradient_overlap("0.25") == gradient_overlap_model(0.25));
  CHECK(parse_gradient_overlap("0") == gradient_overlap_model(0.0));
  CHECK_THROWS_WITH_AS(parse_gradient_overlap("1.5", "--gradient-overlap"),
                       "spec error: --gradient-overlap '1.5' is neither \"backward\" nor a decimal number in [0, 1]", spec_error);
  CHECK_THROWS_AS(parse_gradient_overlap("0.5x"), spec_error);
  // Decimal only, as every real-valued flag: std::stod took "0x1p-1" as 0.5, and " 0.5".
  for (const char* bad : {"0x1p-1", "0x0", " 0.5", "+0.5", "-0", "inf", "1e-400"})
    CHECK_THROWS_WITH_AS(parse_gradient_overlap(bad, ""), doctest::Contains("' is neither \"backward\" nor a decimal number"), spec_error);
  CHECK(parse_gradient_overlap(".5") == gradient_overlap_model(0.5));
  CHECK(parse_gradient_overlap("5e-1") == gradient_overlap_model(0.5));
  CHECK_THROWS_AS(parse_gradient_overlap("nan"), spec_error);
  CHECK_THROWS_AS(parse_gradient_overlap(""), spec_error);
}

TEST_CASE("strategies on 1-D and 3-D meshes (with a size-1 axis) compute the sharded result") {
  checked_strategies = 0;
  op_attrs att;
  att.heads = 8;
  att.kv_heads = 4;
  att.causal = true;
  for (const device_mesh& m : {device_mesh{4}, device_mesh{2, 1, 2}}) {
    CAPTURE(to_string(m));
    {
      one_op t;
      t.add("x", {4, 8, 12});
      t.add("w", {4, 12});
      t.add("b", {4});
      t.check(op_kind::linear, {}, 5, m);
    }
    {
      one_op t;
      t.add("q", {4, 3, 16});
      t.add("k", {4, 3, 8});
      t.add("v", {4, 3, 8});
      t.check(op_kind::attention, att, 3, m);
    }
    {
      one_op t;
      t.add("ids", {4, 4}, dtype::i64, 8);
      t.add("table", {8, 4});
      t.check(op_kind::embedding, {}, 5, m);
    }
  }
  // Per mesh axis: linear 5 options (R, batch, seq, out, in), attention 4 (R, batch, heads,
  // query heads with the key/values whole), embedding 5 (R, ids dim 0, ids dim 1, column,
  // vocab). Every size here splits 4 ways without an empty piece, and the size-1 axis offers
  // only the all-Replicate option (any other is the same layout): 5 + 4 + 5 on the 1-D mesh; on
  // the 3-D one 5^2 + 5^2, and of attention's 4^2 all but the 2 that split the key/values on
  // one axis and keep them whole on the other (a rank's query heads would read key/value heads
  // it does not hold): 14.
  CHECK(checked_strategies == (5 + 4 + 5) + (25 + 14 + 25));
}

TEST_CASE("device presets price compute with their data sheet's numbers") {
  // H100 SXM5: 989.4 TFLOP/s dense bf16 (1,979 with sparsity), 3.35 TB/s HBM3, 81559 MiB as
  // nvidia-smi totals it, NVLink 4 at 900 GB/s both ways, NDR 400 Gb/s per GPU.
  const device_preset* h100 = find_device_preset("h100-80g");
  REQUIRE(h100 != nullptr);
  CHECK(h100->intra_node_bandwidth == 900e9 / 2);
  CHECK(h100->inter_node_bandwidth == 400e9 / 8);
  CHECK(h100->device.memory_bytes == 81559LL * 1024 * 1024);
  CHECK(find_device_preset("H100") == nullptr);
  CHECK(device_preset_names() == "a100-80g, h100-80g, h200-141g");
  for (const device_preset& p : device_presets) {
    CAPTURE(p.name);
    CHECK(find_device_preset(p.name) == &p);
    CHECK(!p.peak_source.empty());
    // An achievable figure names its source and stays under the peak it is a fraction of.
    for (const auto& [rate, peak] : {std::pair{p.achievable.large_matmul, p.device.peak_flops},
                                     std::pair{p.achievable.sliced_matmul, p.device.peak_flops},
                                     std::pair{p.achievable.memory, p.device.memory_bandwidth}}) {
      CHECK(rate.source.empty() == (rate.value == 0));
      CHECK(rate.value <= peak);
      CHECK(rate.fraction_of(peak) <= 1.0);
    }
  }
  // The H200's were measured (issue 33); tensor-parallel slices run slower than whole layers.
  const device_preset* h200 = find_device_preset("h200-141g");
  REQUIRE(h200 != nullptr);
  CHECK(h200->achievable.large_matmul.value > h200->achievable.sliced_matmul.value);
  CHECK(h200->achievable.sliced_matmul.value > 0);
  CHECK(h200->achievable.memory.fraction_of(h200->device.memory_bandwidth) ==
        doctest::Approx(h200->achievable.memory.value / 4.8e12));
  CHECK(sourced_rate{}.fraction_of(1e12) == 1.0);  // no figure: priced at the peak
  // A [512, 4096] x [4096, 4096] bf16 matmul on one device: 2 m n k FLOPs at the peak, and its
  // operands and output once through HBM.
  model_graph g;
  auto x = add_input(g, "x", {512, 4096}, dtype::bf16);
  auto w = add_parameter(g, "w", {4096, 4096}, dtype::bf16);
  auto y = add_op(g, op_kind::matmul, "y", {x, w});
  const device_mesh one{1};
  for (const char* name : {"a100-80g", "h100-80g", "h200-141g"}) {
    CAPTURE(name);
    strategy_options o;
    o.pricing.device = find_device_preset(name)->device;
    o.pricing.mode = run_mode::inference;  // the forward's FLOPs and bytes
    o.pricing.achievable = false;          // the data sheet's peaks
    const std::vector<strategy> s = enumerate_strategies(g, y, one, o);
    REQUIRE(!s.empty());
    const double flops = 2.0 * 512 * 4096 * 4096, bytes = (512.0 * 4096 * 2 + 4096.0 * 4096) * 2;
    const double peak = std::string(name) == "a100-80g" ? 312e12 : 989.4e12;
    const double hbm = std::string(name) == "a100-80g" ? 2.039e12 : std::string(name) == "h100-80g" ? 3.35e12 : 4.8e12;
    CHECK(s.front().compute_seconds == doctest::Approx(flops / peak + bytes / hbm).scale(1e-9));
    // At what GEMMs and copies achieve (the default): 512 is below the large-GEMM class's
    // smallest dimension, so the sliced figure, or the large one where there is no other.
    o.pricing.achievable = true;
    const device_model& d = o.pricing.device;
    const double gemm = d.sliced_matmul_flops > 0 ? d.sliced_matmul_flops : d.large_matmul_flops;
    const double copy = d.achievable_memory_bandwidth > 0 ? d.achievable_memory_bandwidth : hbm;
    CHECK(enumerate_strategies(g, y, one, o).front().compute_seconds == doctest::Approx(flops / gemm + bytes / copy).scale(1e-9));
  }
  // The A100's figures are published measurements: 271.2 TFLOP/s (MAMF), 1.80 TB/s, and what
  // NCCL reaches on its links, 200 GB/s in the node and 24 between nodes.
  const device_preset* a100 = find_device_preset("a100-80g");
  CHECK(a100->device.large_matmul_flops == 271.2e12);
  CHECK(a100->device.matmul_flops(8192, true) == 271.2e12);
  CHECK(a100->device.matmul_flops(8192, false) == 312e12);
  CHECK(a100->device.memory_rate(true) == 1.80e12);
  CHECK(a100->intra_node_link(true) == 200e9);
  CHECK(a100->intra_node_link(false) == 300e9);
  CHECK(a100->inter_node_link(true) == 24e9);
  CHECK(h200->device.matmul_flops(4096, true) == 714e12);  // whole-layer shapes
  CHECK(h200->device.matmul_flops(1024, true) == 593e12);  // their tensor-parallel slices
}

TEST_CASE("a rank's runtime reserve: its CUDA context and one NCCL communicator per group of more than one rank") {
  // The cited figures, by hand: a CUDA context of 400 MiB (pytorch issue 109888), NCCL buffers of
  // 688 MiB per communicator of more than 2 ranks and 544 MiB per one of 2 (nccl issue 964, on
  // A100; standing in on H100 and H200). One communicator per mesh axis of more than one rank,
  // and one of pp ranks for the stages' sends when pp > 1.
  constexpr std::int64_t MiB = 1 << 20;
  const device_model& h100 = find_device_preset("h100-80g")->device;
  struct row {
    device_mesh mesh;
    int pp, communicators;
    std::int64_t mib;
  };
  for (const row& r : {row{{1, 8}, 1, 1, 400 + 688},                    // tp 8 in a node
                       row{{1, 8}, 2, 2, 400 + 688 + 544},              // and 2 stages
                       row{{2, 8}, 1, 2, 400 + 544 + 688},              // 2 nodes
                       row{{2, 8}, 4, 3, 400 + 544 + 688 + 688},        // and 4 stages
                       row{{8, 8}, 1, 2, 400 + 688 + 688},              // 8 nodes
                       row{{8, 8}, 16, 3, 400 + 688 + 688 + 688},       // and 16 stages
                       row{{2, 2}, 16, 3, 400 + 544 + 544 + 688},       // a stage of dp 2 x tp 2 of 16
                       row{{1}, 1, 0, 400}}) {                          // one device: the context alone
    CAPTURE(to_string(r.mesh));
    CAPTURE(r.pp);
    const runtime_reserve got = runtime_reserve_of(h100, r.mesh, r.pp);
    CHECK(got.communicators == r.communicators);
    CHECK(got.bytes() == r.mib * MiB);
    CHECK(runtime_reserve_bytes(h100, r.mesh, r.pp) == r.mib * MiB);
    CHECK(got.left_on(h100) == (81559 - r.mib) * MiB);
    CHECK(got.fits((81559 - r.mib) * MiB, h100));
    CHECK_FALSE(got.fits((81559 - r.mib) * MiB + 1, h100));
  }
  CHECK(to_string(runtime_reserve_of(h100, device_mesh{8, 8}, 16)) == "2.41 GiB runtime (CUDA context, 3 NCCL communicators)");
  CHECK(to_string(runtime_reserve_of(h100, device_mesh{1, 8})) == "1.06 GiB runtime (CUDA context, 1 NCCL communicator)");
  // Every preset carries the figures, each with its source; the plain device_model none (an
  // abstract device: its plans count tensors alone).
  for (const device_preset& p : device_presets) {
    CAPTURE(p.name);
    CHECK(p.device.context_bytes == 400 * MiB);
    CHECK(p.device.communicator_bytes == 688 * MiB);
    CHECK(p.device.pair_communicator_bytes == 544 * MiB);
    for (const sourced_bytes& b : {p.runtime.context, p.runtime.communicator, p.runtime.pair_communicator})
      CHECK(!b.source.empty());
  }
  CHECK(runtime_reserve_of(device_model{}, device_mesh{8, 8}, 16).bytes() == 0);
  CHECK(runtime_reserve_of(device_model{}, device_mesh{8, 8}, 16).communicators == 3);
  CHECK(to_string(runtime_reserve{}).empty());
}

TEST_CASE("causal attention is priced over the S (S + 1) / 2 query-key pairs a causal kernel computes") {
  // q, k, v [2, 128, 64] bf16 (4 heads) on one A100: scores and weighted sum are 4 B S_q S_k hidden
  // FLOPs unmasked; with the causal mask, 4 B (S (S + 1) / 2) hidden. Same bytes through HBM.
  const device_mesh one{1};
  strategy_options o;
  o.pricing.device = find_device_preset("a100-80g")->device;
  o.pricing.mode = run_mode::inference;  // the forward's FLOPs
  o.pricing.achievable = false;          // at the data sheet's peaks
  const auto seconds = [&](bool causal) {
    model_graph g;
    auto q = add_input(g, "q", {2, 128, 64}, dtype::bf16);
    auto k = add_input(g, "k", {2, 128, 64}, dtype::bf16);
    auto v = add_input(g, "v", {2, 128, 64}, dtype::bf16);
    op_attrs a;
    a.heads = 4;
    a.causal = causal;
    const std::vector<strategy> s = enumerate_strategies(g, add_op(g, op_kind::attention, "att", {q, k, v}, a), one, o);
    REQUIRE(!s.empty());
    return s.front().compute_seconds;
  };
  const double bytes = 4.0 * 2 * 128 * 64 * 2;  // three operands and the output
  CHECK(seconds(false) == doctest::Approx(4.0 * 2 * 128 * 128 * 64 / 312e12 + bytes / 2.039e12).scale(1e-9));
  CHECK(seconds(true) == doctest::Approx(4.0 * 2 * (128 * 129 / 2) * 64 / 312e12 + bytes / 2.039e12).scale(1e-9));
}

TEST_CASE("a ZeRO shard is a block of the local shard: its weight comes back in one all-gather on the ZeRO axis") {
  // A vocabulary-parallel weight [32000, 4096] on 2 nodes of 4: split on dim 0 over the node's
  // axis 1, replicated over axis 0. ZeRO splits the local [8000, 4096] block over axis 0; on
  // dim 0 the spec would order axis 0 before axis 1 (another block of the whole tensor, a
  // shuffle to gather), so the shard is on dim 1, gathered back by one all-gather.
  const device_mesh m = make_cluster_mesh({2, 4});
  const tensor_shape shape{32000, 4096};
  const sharding_spec vocab = parse_spec("S1R", 2, 2);
  const std::optional<sharding_spec> z = zero_spec(m, vocab, shape);
  REQUIRE(z);
  CHECK(*z == parse_spec("S1S0", 2, 2));
  const auto plan = plan_redistribute(m, *z, vocab, shape);
  REQUIRE(plan.size() == 1);
  CHECK(plan[0].kind == collective::all_gather);
  CHECK(plan[0].mesh_axis == 0);
  // Replicated, or split where the ZeRO axis comes after: the largest local dim, as before.
  CHECK(*zero_spec(m, parse_spec("RR", 2, 2), shape) == parse_spec("S01R", 2, 2));
  CHECK(*zero_spec(m, parse_spec("S0R", 2, 2), shape) == parse_spec("S01R", 2, 2));
}

TEST_CASE("ZeRO stages priced as the ZeRO paper counts them: 2 volumes for stages 1 and 2, 3 for stage 3") {
  // A [1024, 1024] bf16 weight (2 MiB) used by a batch-split linear on 8 ranks of one link
  // (alpha 5 us, 300 GB/s, no per-step term, one collective per tensor): the consumer hands
  // back a Partial gradient of the whole weight.
  model_graph g;
  device_mesh m{8};
  m.set_link(0, {5e-6, 300e9, 0.0});
  auto x = add_input(g, "x", {64, 1024}, dtype::bf16);
  auto w = add_parameter(g, "fc.weight", {1024, 1024}, dtype::bf16);
  auto fc = add_op(g, op_kind::linear, "fc", {x, w});
  strategy_options opt{{device_model{}, run_mode::training}};
  opt.pricing.gradient_bucket_bytes = 0;
  opt.pricing.gradient_overlap = 0.0;  // the paper counts volumes, none hidden behind the backward
  const auto sw = enumerate_strategies(g, w, m, opt);
  const auto sfc = enumerate_strategies(g, fc, m, opt);
  const strategy* dp = nullptr;
  for (const strategy& s : sfc)
    if (s.inputs[0] == parse_spec("[S(0)]", 1, 2) && s.inputs[1].is_replicated()) dp = &s;
  REQUIRE(dp != nullptr);
  REQUIRE(dp->grads[1] == parse_spec("[P]", 1, 2));
  const edge_t e = boost::edge(w, fc, g).first;
  const backward_pricing bp = backward_pricing_of(g, e, opt);
  const double B = 1024.0 * 1024 * 2, n = 1024.0 * 1024, alpha = 5e-6, beta = 300e9;
  const double ring = 7.0 / 8 * B / beta;  // one volume: an all-gather's or a reduce-scatter's
  auto find = [&](const char* spec, int stage) -> const strategy& {
    for (const strategy& s : sw)
      if (s.output == parse_spec(spec, 1, 2) && s.zero_stage == stage) return s;
    FAIL("no strategy " << spec << " zero-" << stage);
    return sw.front();
  };
  auto cost = [&](const strategy& s) { return s.comm_seconds + price_edge(g, e, s, *dp, m, true, bp).total(); };
  // Data parallel: one all-reduce (two volumes), 16 B per parameter.
  const strategy& ddp = find("[R]", 0);
  CHECK(cost(ddp) == doctest::Approx(alpha + 2 * ring).scale(1e-9));
  CHECK(ddp.memory_bytes == 16 * n);
  // ZeRO-1 and ZeRO-2: the gradient reduce-scattered, the updated weight all-gathered (two
  // volumes, two latencies); optimizer state (and gradient) an eighth.
  const strategy& z1 = find("[R]", 1);
  const strategy& z2 = find("[R]", 2);
  CHECK(z1.name == "->RR zero-1");
  for (const strategy* z : {&z1, &z2}) {
    CHECK(z->gradient_spec.is_sharded(0));  // the larger local dim, the first of equals
    CHECK(cost(*z) == doctest::Approx(2 * alpha + 2 * ring).scale(1e-9));
    CHECK(price_edge(g, e, *z, *dp, m, true, bp).backward == doctest::Approx(alpha + ring).scale(1e-9));  // the reduce-scatter
  }
  CHECK(z1.memory_bytes == (2 + 2) * n + 12 * n / 8);
  CHECK(z2.memory_bytes == 2 * n + (2 + 12) * n / 8);
  // ZeRO-3: stored sharded, gathered for the forward and again for the backward, the gradient
  // reduce-scattered (three volumes); everything an eighth.
  const strategy& z3 = find("[S(0)]", 0);
  const edge_costs c3 = price_edge(g, e, z3, *dp, m, true, bp);
  CHECK(c3.forward == doctest::Approx(alpha + ring).scale(1e-9));
  CHECK(c3.regather == doctest::Approx(alpha + ring).scale(1e-9));
  CHECK(c3.backward == doctest::Approx(alpha + ring).scale(1e-9));
  CHECK(z3.memory_bytes == 16 * n / 8);
  // Without the option, only plain storage; SGD in f32 has no optimizer state: no ZeRO-1.
  opt.pricing.zero = false;
  for (const strategy& s : enumerate_strategies(g, w, m, opt)) CHECK(s.zero_stage == 0);
  model_graph g32;
  auto w32 = add_parameter(g32, "w", {1024, 1024}, dtype::f32);
  strategy_options sgd{{device_model{}, run_mode::training}};
  sgd.pricing.optimizer = optimizer_kind::sgd;
  int stages[3] = {0, 0, 0};
  for (const strategy& s : enumerate_strategies(g32, w32, m, sgd)) ++stages[s.zero_stage];
  CHECK(stages[1] == 0);
  CHECK(stages[2] == 1);
}
