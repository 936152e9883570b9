#pragma once
/// Backward kernels: for every operator kind, the gradients of its operands from the gradient
/// of its output (the vector-Jacobian product), on host tensors in f32 or f64. Like the
/// forward kernels they work on one rank's pieces: `local_context` says where the pieces lie,
/// and a piece's gradient is that rank's contribution (summed over ranks where the operand
/// is replicated and the work is not, i.e. a Partial gradient).
///   std::vector<host_tensor> d = autoshard::run_kernel_backward<double>(g[v], operands, dy, c);
///   // d[i]: gradient of operand i (empty for integer operands: ids, labels)
#include <algorithm>  // std::max, std::min, std::copy_n
#include <array>      // std::array
#include <cstring>    // std::memcpy
#include <cmath>      // std::exp, std::tanh, std::erf, std::sqrt, std::cos, std::sin, std::pow
#include <span>       // std::span
#include <vector>     // std::vector

#include "kernels.hpp"  // run_kernel, local_context, detail helpers

namespace autoshard {
namespace detail {

/// Sums g (shaped `out`) into a tensor shaped `s` that was broadcast to `out` (numpy rules).
template <class T>
host_tensor unbroadcast(const host_tensor& g, const tensor_shape& s) {
  host_tensor o(g.type(), s);
  if (g.shape() == s) {
    std::copy_n(g.as<T>(), g.numel(), o.as<T>());
    return o;
  }
  const std::array<std::array<std::int64_t, max_tensor_rank>, 1> st{broadcast_strides(s, g.shape())};
  const T* pg = g.as<T>();
  T* po = o.as<T>();
  strided_loop<1>(g.shape(), st, [&](std::int64_t flat, const std::array<std::int64_t, 1>& off) { po[off[0]] += pg[flat]; });
  return o;
}

template <class T, class F>
host_tensor unary_backward(const host_tensor& x, const host_tensor& dy, F dfdx) {
  host_tensor o(x.type(), x.shape());
  const T* px = x.as<T>();
  const T* pd = dy.as<T>();
  T* po = o.as<T>();
  for (std::int64_t i = 0; i < x.numel(); ++i) po[i] = pd[i] * dfdx(px[i]);
  return o;
}

/// Gradients of a broadcasting binary operator: da = unbroadcast(dy * fa(a, b)), db alike.
template <class T, class FA, class FB>
std::vector<host_tensor> binary_backward(const host_tensor& a, const host_tensor& b, const host_tensor& dy,
                                         FA fa, FB fb) {
  const tensor_shape& s = dy.shape();
  host_tensor ga(a.type(), s), gb(b.type(), s);
  const std::array<std::array<std::int64_t, max_tensor_rank>, 2> st{broadcast_strides(a.shape(), s),
                                                                     broadcast_strides(b.shape(), s)};
  const T* pa = a.as<T>();
  const T* pb = b.as<T>();
  const T* pd = dy.as<T>();
  strided_loop<2>(s, st, [&](std::int64_t flat, const std::array<std::int64_t, 2>& off) {
    ga.as<T>()[flat] = pd[flat] * fa(pa[off[0]], pb[off[1]]);
    gb.as<T>()[flat] = pd[flat] * fb(pa[off[0]], pb[off[1]]);
  });
  std::vector<host_tensor> out;
  out.push_back(unbroadcast<T>(ga, a.shape()));
  out.push_back(unbroadcast<T>(gb, b.shape()));
  return out;
}

/// where(cond, x, y): dx = dy where cond, dy' = dy elsewhere (each summed back over its
/// broadcast dims); cond (integer) has none.
template <class T>
std::vector<host_tensor> where_backward(const node& nd, std::span<const host_tensor* const> in, const host_tensor& dy) {
  const tensor_shape s = broadcast_shape(nd, in);
  if (!(s == dy.shape())) kernel_error(nd, "the output gradient " + to_string(dy.shape()) + " is not the local output " + to_string(s));
  host_tensor gx(in[1]->type(), s), gy(in[2]->type(), s);
  const std::array<std::array<std::int64_t, max_tensor_rank>, 1> st{broadcast_strides(in[0]->shape(), s)};
  const std::int64_t* pc = in[0]->as<std::int64_t>();
  const T* pd = dy.as<T>();
  T* px = gx.as<T>();
  T* py = gy.as<T>();
  strided_loop<1>(s, st, [&](std::int64_t flat, const std::array<std::int64_t, 1>& off) {
    const bool take_x = pc[off[0]] != 0;
    px[flat] = take_x ? pd[flat] : T(0);
    py[flat] = take_x ? T(0) : pd[flat];
  });
  std::vector<host_tensor> out;
  out.emplace_back();
  out.push_back(unbroadcast<T>(gx, in[1]->shape()));
  out.push_back(unbroadcast<T>(gy, in[2]->shape()));
  return out;
}

/// Whether the backward kernel of `kind` reads the values of operand `i` (else only its
/// shape and dtype): an executor can free a forward value that no backward reads as soon as
/// its consumers' forwards have run, keeping only a host_tensor::shape_only stand-in.
inline bool backward_reads_operand(op_kind kind, std::size_t i) {
  switch (kind) {
    case op_kind::dropout:
    case op_kind::reshape:
    case op_kind::transpose:
    case op_kind::concat:
    case op_kind::split:
    case op_kind::expand:
    case op_kind::reduce_sum:
    case op_kind::reduce_mean:
    case op_kind::rotary:  // orthogonal (times its scale): the gradient is turned back by the same angle
    case op_kind::add:
    case op_kind::sub: return false;
    case op_kind::linear: return i < 2;     // x and W; the bias's gradient is a column sum of dy
    case op_kind::where: return i == 0;     // the condition picks; x and y give shapes
    case op_kind::embedding: return i == 0; // the ids; the table gives its shape
    default: return true;
  }
}

template <class T>
std::vector<host_tensor> linear_backward(const node& nd, std::span<const host_tensor* const> in, const host_tensor& dy) {
  const host_tensor& x = *in[0];
  const host_tensor& w = *in[1];
  const bool tw = nd.attrs.transposed_weight;
  const std::int64_t C = x.shape()[x.shape().rank - 1u];
  const std::int64_t O = tw ? w.shape()[1] : w.shape()[0];
  const std::int64_t rows = prod(x.shape(), 0, x.shape().rank - 1u);
  Eigen::Map<const rm_matrix<T>> X(x.as<T>(), rows, C);
  Eigen::Map<const rm_matrix<T>> DY(dy.as<T>(), rows, O);
  std::vector<host_tensor> out;
  out.emplace_back(x.type(), x.shape());
  out.emplace_back(w.type(), w.shape());
  Eigen::Map<rm_matrix<T>> DX(out[0].as<T>(), rows, C);
  if (tw) {
    Eigen::Map<const rm_matrix<T>> W(w.as<T>(), C, O);
    DX.noalias() = DY * W.transpose();
    Eigen::Map<rm_matrix<T>>(out[1].as<T>(), C, O).noalias() = X.transpose() * DY;
  } else {
    Eigen::Map<const rm_matrix<T>> W(w.as<T>(), O, C);
    DX.noalias() = DY * W;
    Eigen::Map<rm_matrix<T>>(out[1].as<T>(), O, C).noalias() = DY.transpose() * X;
  }
  if (in.size() == 3) {
    out.emplace_back(in[2]->type(), in[2]->shape());
    Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>>(out[2].as<T>(), O).noalias() = DY.colwise().sum();
  }
  return out;
}

template <class T>
std::vector<host_tensor> matmul_backward(const host_tensor& x, const host_tensor& y, const host_tensor& dy) {
  const std::size_t r = x.shape().rank;
  const std::int64_t M = x.shape()[r - 2], K = x.shape()[r - 1], N = y.shape()[y.shape().rank - 1u];
  std::vector<host_tensor> out;
  out.emplace_back(x.type(), x.shape());
  out.emplace_back(y.type(), y.shape());
  const std::int64_t batches = prod(x.shape(), 0, r - 2);
  const bool batched = y.shape().rank > 2;
  for (std::int64_t b = 0; b < batches; ++b) {
    Eigen::Map<const rm_matrix<T>> A(x.as<T>() + b * M * K, M, K);
    Eigen::Map<const rm_matrix<T>> B(y.as<T>() + (batched ? b * K * N : 0), K, N);
    Eigen::Map<const rm_matrix<T>> D(dy.as<T>() + b * M * N, M, N);
    Eigen::Map<rm_matrix<T>>(out[0].as<T>() + b * M * K, M, K).noalias() = D * B.transpose();
    Eigen::Map<rm_matrix<T>> DB(out[1].as<T>() + (batched ? b * K * N : 0), K, N);
    if (batched) DB.noalias() = A.transpose() * D;
    else DB.noalias() += A.transpose() * D;
  }
  return out;
}

template <class T>
std::vector<host_tensor> norm_backward(const node& nd, std::span<const host_tensor* const> in, const host_tensor& dy) {
  const bool ln = nd.kind == op_kind::layer_norm;
  const host_tensor& x = *in[0];
  const std::int64_t n = x.shape().rank ? x.shape()[x.shape().rank - 1u] : 1;
  std::vector<host_tensor> out;
  out.emplace_back(x.type(), x.shape());
  for (std::size_t i = 1; i < in.size(); ++i) out.emplace_back(in[i]->type(), in[i]->shape());
  const std::int64_t rows = n ? x.numel() / n : 0;
  std::vector<T> xhat(static_cast<std::size_t>(n)), dxhat(static_cast<std::size_t>(n));
  const T offset = static_cast<T>(nd.attrs.weight_offset);  // y = xhat (offset + w): dy/dw is xhat still
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* px = x.as<T>() + r * n;
    const T* pd = dy.as<T>() + r * n;
    const auto [mean, inv] = norm_stats(px, n, ln, nd.attrs.epsilon);
    T sum_d = 0, sum_dx = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const auto ui = static_cast<std::size_t>(i);
      xhat[ui] = (px[i] - mean) * inv;
      dxhat[ui] = in.size() > 1 ? pd[i] * (offset + in[1]->as<T>()[i]) : pd[i];
      sum_d += dxhat[ui];
      sum_dx += dxhat[ui] * xhat[ui];
      if (in.size() > 1) out[1].as<T>()[i] += pd[i] * xhat[ui];
      if (in.size() > 2) out[2].as<T>()[i] += pd[i];
    }
    const T nn = static_cast<T>(n);
    T* pg = out[0].as<T>() + r * n;
    for (std::int64_t i = 0; i < n; ++i) {
      const auto ui = static_cast<std::size_t>(i);
      pg[i] = inv * (dxhat[ui] - (ln ? sum_d / nn : T(0)) - xhat[ui] * sum_dx / nn);
    }
  }
  return out;
}

template <class T>
host_tensor softmax_backward(const node& nd, const host_tensor& x, const host_tensor& dy) {
  const host_tensor y = softmax<T>(nd, x);
  const int r = x.shape().rank;
  const int ax = nd.attrs.axis < 0 ? nd.attrs.axis + r : nd.attrs.axis;
  const std::int64_t outer = prod(x.shape(), 0, static_cast<std::size_t>(ax)), n = x.shape()[static_cast<std::size_t>(ax)],
                     inner = prod(x.shape(), static_cast<std::size_t>(ax) + 1, x.shape().rank);
  host_tensor o(x.type(), x.shape());
  for (std::int64_t a = 0; a < outer; ++a)
    for (std::int64_t c = 0; c < inner; ++c) {
      const std::int64_t base = a * n * inner + c;
      T dot = 0;
      for (std::int64_t i = 0; i < n; ++i) dot += dy.as<T>()[base + i * inner] * y.as<T>()[base + i * inner];
      for (std::int64_t i = 0; i < n; ++i)
        o.as<T>()[base + i * inner] = y.as<T>()[base + i * inner] * (dy.as<T>()[base + i * inner] - dot);
    }
  return o;
}

/// The rotary turn is orthogonal (times attrs.scale): its backward turns the gradient back by
/// the same angle, times the same scale; the columns no pair turns (past a partial rotary's R)
/// pass the gradient through. Positions as the forward's (from attrs.rotary_offset).
template <class T>
host_tensor rotary_backward(const node& nd, const host_tensor& x, const host_tensor& dy, const local_context& c) {
  const std::size_t r = x.shape().rank;
  const std::int64_t W = x.shape()[r - 1], S = x.shape()[r - 2], s_off = nd.attrs.rotary_offset + c.in_offset[0][r - 2];
  const std::vector<rotary_pair> pairs = rotary_pairs(nd.attrs, rotary_head_size(nd, c, W), W);
  host_tensor o(x.type(), x.shape());
  const std::int64_t rows = W ? x.numel() / W : 0;
  for (std::int64_t row = 0; row < rows; ++row) {
    const double pos = static_cast<double>(row % S + s_off);
    const T* pd = dy.as<T>() + row * W;
    T* pg = o.as<T>() + row * W;
    std::copy_n(pd, W, pg);
    for (const rotary_pair& q : pairs) {
      const T cs = static_cast<T>(std::cos(pos * q.freq) * nd.attrs.scale), sn = static_cast<T>(std::sin(pos * q.freq) * nd.attrs.scale);
      pg[q.a] = pd[q.a] * cs + pd[q.b] * sn;
      pg[q.b] = -pd[q.a] * sn + pd[q.b] * cs;
    }
  }
  return o;
}

template <class T>
host_tensor embedding_backward(const node& nd, const host_tensor& ids, const host_tensor& table, const host_tensor& dy,
                               const local_context& c) {
  const T scale = static_cast<T>(nd.attrs.scale);
  const std::int64_t rows = table.shape()[0], H = table.shape()[1], row_off = c.in_offset[1][0];
  host_tensor o(table.type(), table.shape());
  const std::int64_t* pid = ids.as<std::int64_t>();
  for (std::int64_t i = 0; i < ids.numel(); ++i) {
    const std::int64_t id = pid[i] - row_off;
    if (id < 0 || id >= rows) continue;  // another rank's rows
    T* pr = o.as<T>() + id * H;
    const T* pd = dy.as<T>() + i * H;
    for (std::int64_t h = 0; h < H; ++h) pr[h] += scale * pd[h];
  }
  return o;
}

template <class T>
host_tensor reduce_backward(const node& nd, const host_tensor& x, const host_tensor& dy, const local_context& c) {
  const tensor_shape& xs = x.shape();
  std::vector<bool> red(xs.rank, false);
  T count = 1;
  for (std::int64_t d : nd.attrs.dims) {
    red[static_cast<std::size_t>(d)] = true;
    count *= static_cast<T>(c.global_in[0][static_cast<std::size_t>(d)]);
  }
  std::array<std::array<std::int64_t, max_tensor_rank>, 1> st{};
  std::int64_t stride = 1;
  for (std::size_t d = xs.rank; d-- > 0;)
    if (!red[d]) {
      st[0][d] = stride;
      stride *= xs[d];
    }
  host_tensor o(x.type(), xs);
  const T scale = nd.kind == op_kind::reduce_mean ? T(1) / count : T(1);
  const T* pd = dy.as<T>();
  T* po = o.as<T>();
  strided_loop<1>(xs, st, [&](std::int64_t flat, const std::array<std::int64_t, 1>& off) { po[flat] = pd[off[0]] * scale; });
  return o;
}

template <class T>
std::vector<host_tensor> concat_or_split_backward(const node& nd, std::span<const host_tensor* const> in, const host_tensor& dy) {
  const tensor_shape& x0 = in[0]->shape();
  const auto ax = static_cast<std::size_t>(nd.attrs.axis < 0 ? nd.attrs.axis + x0.rank : nd.attrs.axis);
  const std::int64_t outer = prod(x0, 0, ax), inner = prod(x0, ax + 1, x0.rank);
  std::vector<host_tensor> out;
  for (const host_tensor* t : in) out.emplace_back(t->type(), t->shape());
  const T* pd = dy.as<T>();
  const std::int64_t dw = dy.shape()[ax];
  for (std::int64_t a = 0; a < outer; ++a) {
    if (nd.kind == op_kind::split) {
      std::copy_n(pd + a * dw * inner, nd.attrs.length * inner, out[0].as<T>() + (a * x0[ax] + nd.attrs.start) * inner);
      continue;
    }
    std::int64_t at = 0;
    for (std::size_t k = 0; k < in.size(); ++k) {
      const std::int64_t n = in[k]->shape()[ax] * inner;
      std::copy_n(pd + a * dw * inner + at, n, out[k].as<T>() + a * n);
      at += n;
    }
  }
  return out;
}

template <class T>
std::vector<host_tensor> attention_backward(const node& nd, std::span<const host_tensor* const> in, const host_tensor& dy,
                                            const local_context& c) {
  if (in.size() != 3)  // a decode step's: inference only (the builders and the pass refuse to train one)
    kernel_error(nd, "an attention with a key/value cache has no backward: a step after a cache is inference");
  const host_tensor &q = *in[0], &k = *in[1], &v = *in[2];
  const std::int64_t D = c.global_in[0][2] / nd.attrs.heads;
  const std::int64_t B = q.shape()[0], S = q.shape()[1], Sk = k.shape()[1];
  const std::int64_t Wq = q.shape()[2], Wk = k.shape()[2];
  const kv_heads_map kvm = kv_heads_of(nd, q, k, c, D);
  std::vector<host_tensor> out;
  out.emplace_back(q.type(), q.shape());
  out.emplace_back(k.type(), k.shape());
  out.emplace_back(v.type(), v.shape());
  using cmap = Eigen::Map<const rm_matrix<T>, 0, Eigen::OuterStride<>>;
  using mmap = Eigen::Map<rm_matrix<T>, 0, Eigen::OuterStride<>>;
  const T scale = T(1) / std::sqrt(static_cast<T>(D));
  rm_matrix<T> p(S, Sk), dp(S, Sk);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < kvm.hq; ++h) {
      const std::int64_t kh = kvm.kv_head(h);
      cmap Q(q.as<T>() + b * S * Wq + h * D, S, D, Eigen::OuterStride<>(Wq));
      cmap K(k.as<T>() + b * Sk * Wk + kh * D, Sk, D, Eigen::OuterStride<>(Wk));
      cmap V(v.as<T>() + b * Sk * Wk + kh * D, Sk, D, Eigen::OuterStride<>(Wk));
      cmap DO(dy.as<T>() + b * S * Wq + h * D, S, D, Eigen::OuterStride<>(Wq));
      p.noalias() = Q * K.transpose();  // into p: (Q K^T) * scale would make an S x Sk temporary
      p *= scale;
      detail::add_alibi(p, nd.attrs, kvm.q0 + h, c.in_offset[1][1], D);  // a constant of the scores: their gradient is the softmax's
      detail::softmax_scores(p, nd.attrs.causal, nd.attrs.window);
      mmap(out[2].as<T>() + b * Sk * Wk + kh * D, Sk, D, Eigen::OuterStride<>(Wk)).noalias() += p.transpose() * DO;
      dp.noalias() = DO * V.transpose();
      for (std::int64_t i = 0; i < S; ++i) {
        const T dot = (dp.row(i).array() * p.row(i).array()).sum();
        dp.row(i) = (p.row(i).array() * (dp.row(i).array() - dot)).matrix();
      }
      mmap(out[0].as<T>() + b * S * Wq + h * D, S, D, Eigen::OuterStride<>(Wq)).noalias() = (dp * K) * scale;
      mmap(out[1].as<T>() + b * Sk * Wk + kh * D, Sk, D, Eigen::OuterStride<>(Wk)).noalias() += (dp.transpose() * Q) * scale;
    }
  return out;
}

/// d loss / d logits = dloss (softmax - onehot(label)) / rows, the softmax over the whole
/// vocabulary: with a vocab-parallel piece the row max and sum come through c.vocab_reduce.
/// With `reuse` (the logits themselves, given up by the caller) the gradient is written over
/// them: each element is read before it is overwritten.
template <class T>
host_tensor cross_entropy_backward(const node& nd, const host_tensor& logits, const host_tensor& labels, const host_tensor& dy,
                                   const local_context& c, host_tensor* reuse = nullptr) {
  const std::int64_t V = logits.shape()[logits.shape().rank - 1u];
  const std::int64_t v_off = c.in_offset[0][logits.shape().rank - 1u];
  const std::int64_t rows = labels.numel();
  if (rows * V != logits.numel()) kernel_error(nd, "local labels " + to_string(labels.shape()) + " do not match logits " + to_string(logits.shape()));
  T n_rows = 1;
  for (std::int64_t d : c.global_in[1]) n_rows *= static_cast<T>(d);
  const T* x = logits.as<T>();
  const std::int64_t* lab = labels.as<std::int64_t>();
  std::vector<T> mx(static_cast<std::size_t>(rows), -std::numeric_limits<T>::infinity()), sum(static_cast<std::size_t>(rows), T(0));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < V; ++j) mx[static_cast<std::size_t>(r)] = std::max(mx[static_cast<std::size_t>(r)], x[r * V + j]);
  if (c.vocab_reduce) c.vocab_reduce(mx.data(), mx.size(), logits.type(), reduce_op::max);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < V; ++j) sum[static_cast<std::size_t>(r)] += std::exp(x[r * V + j] - mx[static_cast<std::size_t>(r)]);
  if (c.vocab_reduce) c.vocab_reduce(sum.data(), sum.size(), logits.type(), reduce_op::sum);
  const T g = dy.as<T>()[0] / n_rows;
  host_tensor o = reuse != nullptr ? std::move(*reuse) : host_tensor(logits.type(), logits.shape());
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    for (std::int64_t j = 0; j < V; ++j) o.as<T>()[r * V + j] = g * std::exp(x[r * V + j] - mx[ur]) / sum[ur];
    const std::int64_t lc = lab[r] - v_off;
    if (lc >= 0 && lc < V) o.as<T>()[r * V + lc] -= g;
  }
  return o;
}

}  // namespace detail

namespace detail {

/// The backward of an element-wise operator: a unary one's derivative at its operand times
/// dy, or a binary one's (add and sub read only the shapes, backward_reads_operand: dy summed
/// back over each operand's broadcast dims).
template <class T>
std::vector<host_tensor> elementwise_backward(const node& nd, std::span<const host_tensor* const> in, const host_tensor& dy) {
  const auto one = [](host_tensor t) {
    std::vector<host_tensor> v;
    v.push_back(std::move(t));
    return v;
  };
  switch (nd.kind) {
    case op_kind::gelu:
      return one(unary_backward<T>(*in[0], dy, [](T v) {
        const T a = T(0.7978845608028654), b = T(0.044715);
        const T t = std::tanh(a * (v + b * v * v * v));
        return T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * a * (T(1) + T(3) * b * v * v);
      }));
    case op_kind::gelu_erf:  // Phi(x) + x phi(x)
      return one(unary_backward<T>(*in[0], dy, [](T v) {
        return T(0.5) * (T(1) + std::erf(v * T(0.7071067811865476))) + v * T(0.3989422804014327) * std::exp(T(-0.5) * v * v);
      }));
    case op_kind::silu:
      return one(unary_backward<T>(*in[0], dy, [](T v) {
        const T s = T(1) / (T(1) + std::exp(-v));
        return s * (T(1) + v * (T(1) - s));
      }));
    case op_kind::relu: return one(unary_backward<T>(*in[0], dy, [](T v) { return v > T(0) ? T(1) : T(0); }));
    case op_kind::tanh: return one(unary_backward<T>(*in[0], dy, [](T v) { const T t = std::tanh(v); return T(1) - t * t; }));
    case op_kind::exp: return one(unary_backward<T>(*in[0], dy, [](T v) { return std::exp(v); }));
    case op_kind::mul: return binary_backward<T>(*in[0], *in[1], dy, [](T, T b) { return b; }, [](T a, T) { return a; });
    case op_kind::div:
      return binary_backward<T>(*in[0], *in[1], dy, [](T, T b) { return T(1) / b; }, [](T a, T b) { return -a / (b * b); });
    default: {  // add, sub
      std::vector<host_tensor> v;
      v.push_back(unbroadcast<T>(dy, in[0]->shape()));
      v.push_back(unbroadcast<T>(dy, in[1]->shape()));
      if (nd.kind == op_kind::sub)
        for (std::int64_t i = 0; i < v[1].numel(); ++i) v[1].as<T>()[i] = -v[1].as<T>()[i];
      return v;
    }
  }
}

}  // namespace detail

/// The gradients of operator `nd`'s operands (operand order) from `dy`, the gradient of its
/// local output, given the same local operands and context its forward kernel had. Integer
/// operands (ids, labels) get an empty tensor. Throws exec_error naming the vertex.
/// `reuse`, when given, is operand 0 (`in[0]` points at it) handed over by a caller that no
/// longer needs it: a kernel that can write operand 0's gradient over it does
/// (cross_entropy: d logits over the logits, the largest tensor of a language model), and
/// leaves it empty; the others leave it alone.
template <class T>
std::vector<host_tensor> run_kernel_backward(const node& nd, std::span<const host_tensor* const> in, const host_tensor& dy,
                                             const local_context& c, host_tensor* reuse = nullptr) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "autoshard: kernels run in float or double");
  using namespace detail;
  if (in.size() < static_cast<std::size_t>(operand_count_range(nd.kind).first))
    kernel_error(nd, "needs " + std::to_string(operand_count_range(nd.kind).first) + " operands, got " + std::to_string(in.size()));
  if (!(dy.shape() == c.out_shape))
    kernel_error(nd, "the output gradient is " + to_string(dy.shape()) + ", the local output " + to_string(c.out_shape));
  const auto one = [](host_tensor t) {
    std::vector<host_tensor> v;
    v.push_back(std::move(t));
    return v;
  };
  const auto with_none = [](host_tensor t) {  // an operand without a gradient (ids, labels) second or first
    std::vector<host_tensor> v;
    v.push_back(std::move(t));
    v.emplace_back();
    return v;
  };
  switch (nd.kind) {
    case op_kind::linear: return linear_backward<T>(nd, in, dy);
    case op_kind::matmul: return matmul_backward<T>(*in[0], *in[1], dy);
    case op_kind::gelu:
    case op_kind::gelu_erf:
    case op_kind::silu:
    case op_kind::relu:
    case op_kind::tanh:
    case op_kind::exp:
    case op_kind::add:
    case op_kind::sub:
    case op_kind::mul:
    case op_kind::div: return elementwise_backward<T>(nd, in, dy);
    case op_kind::dropout: return one(host_tensor::copy_of(dy));  // identity, as the forward
    case op_kind::rotary: return one(rotary_backward<T>(nd, *in[0], dy, c));
    case op_kind::layer_norm:
    case op_kind::rms_norm: return norm_backward<T>(nd, in, dy);
    case op_kind::softmax: return one(softmax_backward<T>(nd, *in[0], dy));
    case op_kind::embedding: {
      std::vector<host_tensor> v;
      v.emplace_back();  // ids
      v.push_back(embedding_backward<T>(nd, *in[0], *in[1], dy, c));
      return v;
    }
    case op_kind::reshape: {
      host_tensor o(in[0]->type(), in[0]->shape());
      if (o.nbytes() != dy.nbytes()) kernel_error(nd, "cannot view the gradient " + to_string(dy.shape()) + " as " + to_string(in[0]->shape()));
      if (o.nbytes()) std::memcpy(o.data(), dy.data(), o.nbytes());
      return one(std::move(o));
    }
    case op_kind::transpose: {
      node inv = nd;  // the inverse permutation
      for (std::size_t d = 0; d < nd.attrs.dims.size(); ++d) inv.attrs.dims[static_cast<std::size_t>(nd.attrs.dims[d])] = static_cast<std::int64_t>(d);
      return one(transpose<T>(inv, dy));
    }
    case op_kind::reduce_sum:
    case op_kind::reduce_mean: return one(reduce_backward<T>(nd, *in[0], dy, c));
    case op_kind::concat: return concat_or_split_backward<T>(nd, in, dy);
    case op_kind::split: return concat_or_split_backward<T>(local_split(nd, in[0]->shape(), c), in, dy);
    case op_kind::attention: return attention_backward<T>(nd, in, dy, c);
    case op_kind::cross_entropy:
      return with_none(cross_entropy_backward<T>(nd, *in[0], *in[1], dy, c, reuse != nullptr && reuse == in[0] ? reuse : nullptr));
    case op_kind::where: return where_backward<T>(nd, in, dy);
    case op_kind::expand: return one(unbroadcast<T>(dy, in[0]->shape()));
    case op_kind::opaque: kernel_error(nd, opaque_why(nd));
    case op_kind::input:
    case op_kind::parameter: break;
  }
  kernel_error(nd, "has no backward kernel (a source's gradient is where the backward ends)");
}

}  // namespace autoshard
