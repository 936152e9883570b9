#pragma once
/// Host reference kernels: every operator kind of the graph area, on host tensors, in f32 or
/// f64 (Eigen for the matrix products). A kernel computes one rank's piece of an operator's
/// output from that rank's pieces of the operands; `local_context` says where the pieces lie
/// in the global tensors, which is all the position-dependent kernels need (embedding rows
/// of a vocab-parallel table, rotary positions, the global row count of a mean loss). The
/// unsharded run is the same kernel with every piece equal to the whole tensor.
///   autoshard::local_context c = autoshard::whole_context(shapes, out_shape);
///   autoshard::host_tensor y = autoshard::run_kernel<double>(g[v], operands, c);
#include <algorithm>   // std::max, std::fill, std::copy_n
#include <array>       // std::array
#include <cmath>       // std::exp, std::log, std::tanh, std::erf, std::sqrt, std::cos, std::sin, std::pow
#include <cstdint>     // std::int64_t
#include <cstring>     // std::memcpy
#include <functional>  // std::function
#include <limits>      // std::numeric_limits
#include <numeric>     // std::accumulate
#include <span>        // std::span
#include <string>      // std::string
#include <string_view> // std::string_view
#include <utility>     // std::pair
#include <vector>      // std::vector

#include <Eigen/Dense>

#include "../comm/communicator.hpp"   // reduce_op
#include "../core/error.hpp"          // exec_error
#include "../core/shape.hpp"          // tensor_shape
#include "../graph/elementwise.hpp"   // elementwise_fn, onnx_elementwise_function
#include "../graph/model.hpp"         // node, op_kind
#include "../tensor/host_tensor.hpp"  // host_tensor

namespace autoshard {

/// What a kernel knows beyond its local operands.
struct local_context {
  std::vector<tensor_shape> global_in;  ///< global shape of each operand
  std::vector<tensor_shape> in_offset;  ///< where each local operand starts in its global tensor
  tensor_shape global_out;              ///< global output shape
  tensor_shape out_shape;               ///< local output shape
  /// cross_entropy with a vocab-parallel logits piece: combines `n` values element-wise over
  /// the ranks holding the other vocabulary slices of the same rows. Empty: nothing to combine.
  std::function<void(void* values, std::size_t n, dtype t, reduce_op op)> vocab_reduce;
};

/// The context of an unsharded run: every piece is the whole tensor.
inline local_context whole_context(const std::vector<tensor_shape>& in, const tensor_shape& out) {
  local_context c;
  c.global_in = in;
  for (const tensor_shape& s : in) c.in_offset.push_back(tensor_shape(std::vector<std::int64_t>(s.rank, 0)));
  c.global_out = c.out_shape = out;
  return c;
}

namespace detail {

template <class T>
using rm_matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

inline std::int64_t prod(const tensor_shape& s, std::size_t from, std::size_t to) {
  std::int64_t p = 1;
  for (std::size_t d = from; d < to; ++d) p *= s[d];
  return p;
}

[[noreturn]] inline void kernel_error(const node& nd, const std::string& why) {
  throw exec_error("vertex " + quoted_text(nd.name) + " (" + std::string(to_string(nd.kind)) + "): " + why);
}

/// The element function of an imported elementwise operator (attrs.elementwise): ONNX's for
/// attrs.op_type over its `n` operands (onnx_elementwise_function), or null.
inline elementwise_fn elementwise_kernel_of(const node& nd, std::size_t n) {
  if (nd.kind != op_kind::opaque || !nd.attrs.elementwise) return nullptr;
  return onnx_elementwise_function(nd.attrs.op_type, n);
}

/// Why an opaque operator (imported with no mapping) cannot run: the kernels know no such operator.
inline std::string opaque_why(const node& nd) {
  return "has no kernel: it is an imported operator with no mapping (" +
         (nd.attrs.op_type.empty() ? std::string("of unknown type") : quoted_text(nd.attrs.op_type)) +
         "), so a graph holding it can be planned but not executed or verified";
}

/// Calls f(flat output index, source offsets...) over an output of shape `out`, where source
/// k has element strides `st[k]` (0 on broadcast dims).
template <std::size_t K, class F>
void strided_loop(const tensor_shape& out, const std::array<std::array<std::int64_t, max_tensor_rank>, K>& st, F&& f) {
  const std::int64_t n = out.numel();
  if (n == 0) return;
  std::array<std::int64_t, max_tensor_rank> idx{};
  std::array<std::int64_t, K> off{};
  for (std::int64_t flat = 0; flat < n; ++flat) {
    f(flat, off);
    for (std::size_t d = out.rank; d-- > 0;) {
      ++idx[d];
      for (std::size_t k = 0; k < K; ++k) off[k] += st[k][d];
      if (idx[d] < out[d]) break;
      for (std::size_t k = 0; k < K; ++k) off[k] -= st[k][d] * out[d];
      idx[d] = 0;
    }
  }
}

/// Element strides of `s` seen from an output of shape `out` (numpy broadcasting).
inline std::array<std::int64_t, max_tensor_rank> broadcast_strides(const tensor_shape& s, const tensor_shape& out) {
  std::array<std::int64_t, max_tensor_rank> st{};
  std::int64_t stride = 1;
  for (std::size_t i = 0; i < s.rank; ++i) {
    const std::size_t d = s.rank - 1 - i, od = out.rank - 1 - i;
    st[od] = s[d] == 1 ? 0 : stride;
    stride *= s[d];
  }
  return st;
}

template <class T, class F>
host_tensor unary(const host_tensor& x, F f) {
  host_tensor o(x.type(), x.shape());
  const T* in = x.as<T>();
  T* out = o.as<T>();
  for (std::int64_t i = 0; i < x.numel(); ++i) out[i] = f(in[i]);
  return o;
}

template <class T, class F>
host_tensor binary(const node& nd, const host_tensor& a, const host_tensor& b, F f) {
  tensor_shape s;
  s.rank = std::max(a.shape().rank, b.shape().rank);
  for (std::size_t i = 0; i < s.rank; ++i) {
    const std::int64_t da = i < a.shape().rank ? a.shape()[a.shape().rank - 1 - i] : 1;
    const std::int64_t db = i < b.shape().rank ? b.shape()[b.shape().rank - 1 - i] : 1;
    if (da != db && da != 1 && db != 1)
      kernel_error(nd, "local operands " + to_string(a.shape()) + " and " + to_string(b.shape()) + " do not broadcast");
    s[s.rank - 1 - i] = std::max(da, db);
  }
  host_tensor o(a.type(), s);
  const T* pa = a.as<T>();
  const T* pb = b.as<T>();
  T* po = o.as<T>();
  if (a.shape() == s && b.shape() == s) {
    for (std::int64_t i = 0; i < o.numel(); ++i) po[i] = f(pa[i], pb[i]);
    return o;
  }
  const std::array<std::array<std::int64_t, max_tensor_rank>, 2> st{broadcast_strides(a.shape(), s),
                                                                     broadcast_strides(b.shape(), s)};
  strided_loop<2>(s, st, [&](std::int64_t flat, const std::array<std::int64_t, 2>& off) {
    po[flat] = f(pa[off[0]], pb[off[1]]);
  });
  return o;
}

/// The numpy broadcast of local shapes (each operand's piece of a broadcasting operator).
inline tensor_shape broadcast_shape(const node& nd, std::span<const host_tensor* const> in) {
  tensor_shape s;
  for (const host_tensor* t : in) s.rank = std::max(s.rank, t->shape().rank);
  for (std::size_t i = 0; i < s.rank; ++i) s[i] = 1;
  for (const host_tensor* t : in)
    for (std::size_t i = 0; i < t->shape().rank; ++i) {
      const std::int64_t d = t->shape()[t->shape().rank - 1 - i];
      std::int64_t& o = s[s.rank - 1 - i];
      if (d != o && d != 1 && o != 1) {
        std::string shapes;
        for (const host_tensor* u : in) shapes += (shapes.empty() ? "" : ", ") + to_string(u->shape());
        kernel_error(nd, "local operands " + shapes + " do not broadcast");
      }
      if (o == 1) o = d;
    }
  return s;
}

/// cond ? x : y; cond is integer (ids, booleans: i64 in a run), nonzero is true.
template <class T>
host_tensor where(const node& nd, std::span<const host_tensor* const> in) {
  const tensor_shape s = broadcast_shape(nd, in);
  host_tensor o(in[1]->type(), s);
  const std::array<std::array<std::int64_t, max_tensor_rank>, 3> st{
      broadcast_strides(in[0]->shape(), s), broadcast_strides(in[1]->shape(), s), broadcast_strides(in[2]->shape(), s)};
  const std::int64_t* pc = in[0]->as<std::int64_t>();
  const T* px = in[1]->as<T>();
  const T* py = in[2]->as<T>();
  T* po = o.as<T>();
  strided_loop<3>(s, st, [&](std::int64_t flat, const std::array<std::int64_t, 3>& off) {
    po[flat] = pc[off[0]] != 0 ? px[off[1]] : py[off[2]];
  });
  return o;
}

/// An imported elementwise operator (elementwise_kernel_of): its operands (T, or i64 for
/// integers and booleans, as a run holds them) broadcast, each element computed in double, the
/// result in the vertex's type (T, or i64: a boolean is 0 or 1, a number truncated toward 0).
template <class T>
host_tensor elementwise_opaque(const node& nd, std::span<const host_tensor* const> in) {
  const elementwise_fn f = elementwise_kernel_of(nd, in.size());
  if (f == nullptr) kernel_error(nd, opaque_why(nd));
  const tensor_shape s = broadcast_shape(nd, in);
  const bool integral = is_integer(nd.type);
  host_tensor o(integral ? dtype::i64 : host_dtype_of<T>(), s);
  std::vector<std::array<std::int64_t, max_tensor_rank>> st;
  for (const host_tensor* t : in) st.push_back(broadcast_strides(t->shape(), s));
  std::vector<double> x(in.size());
  std::vector<std::int64_t> idx(s.rank, 0), off(in.size(), 0);
  for (std::int64_t flat = 0; flat < s.numel(); ++flat) {
    for (std::size_t k = 0; k < in.size(); ++k)
      x[k] = in[k]->type() == dtype::i64 ? static_cast<double>(in[k]->as<std::int64_t>()[off[k]])
                                         : static_cast<double>(in[k]->as<T>()[off[k]]);
    const double y = f(x.data(), x.size());
    if (!integral) {
      o.as<T>()[flat] = static_cast<T>(y);
    } else if (nd.type == dtype::boolean) {
      o.as<std::int64_t>()[flat] = y != 0.0 ? 1 : 0;
    } else {
      if (!(std::abs(y) < 9.2e18)) kernel_error(nd, "gives " + std::to_string(y) + ", which its integer type cannot hold");
      o.as<std::int64_t>()[flat] = static_cast<std::int64_t>(std::trunc(y));
    }
    for (std::size_t d = s.rank; d-- > 0;) {
      ++idx[d];
      for (std::size_t k = 0; k < in.size(); ++k) off[k] += st[k][d];
      if (idx[d] < s[d]) break;
      for (std::size_t k = 0; k < in.size(); ++k) off[k] -= st[k][d] * s[d];
      idx[d] = 0;
    }
  }
  return o;
}

/// x broadcast to the local output shape (a piece of attrs.dims).
template <class T>
host_tensor expand(const node& nd, const host_tensor& x, const tensor_shape& out) {
  const tensor_shape& xs = x.shape();
  bool ok = xs.rank <= out.rank;
  for (std::size_t i = 0; ok && i < xs.rank; ++i) ok = xs[xs.rank - 1 - i] == 1 || xs[xs.rank - 1 - i] == out[out.rank - 1 - i];
  if (!ok) kernel_error(nd, "cannot broadcast the local " + to_string(xs) + " to " + to_string(out));
  host_tensor o(x.type(), out);
  const std::array<std::array<std::int64_t, max_tensor_rank>, 1> st{broadcast_strides(xs, out)};
  const T* px = x.as<T>();
  T* po = o.as<T>();
  strided_loop<1>(out, st, [&](std::int64_t flat, const std::array<std::int64_t, 1>& off) { po[flat] = px[off[0]]; });
  return o;
}

template <class T>
host_tensor linear(const node& nd, std::span<const host_tensor* const> in) {
  const host_tensor& x = *in[0];
  const host_tensor& w = *in[1];
  const bool tw = nd.attrs.transposed_weight;
  const std::int64_t C = x.shape()[x.shape().rank - 1u];
  const std::int64_t wc = tw ? w.shape()[0] : w.shape()[1], O = tw ? w.shape()[1] : w.shape()[0];
  if (wc != C) kernel_error(nd, "local input " + to_string(x.shape()) + " does not fit local weight " + to_string(w.shape()));
  tensor_shape s = x.shape();
  s[s.rank - 1u] = O;
  host_tensor o(x.type(), s);
  const std::int64_t rows = prod(x.shape(), 0, x.shape().rank - 1u);
  Eigen::Map<const rm_matrix<T>> X(x.as<T>(), rows, C);
  Eigen::Map<rm_matrix<T>> Y(o.as<T>(), rows, O);
  if (tw) Y.noalias() = X * Eigen::Map<const rm_matrix<T>>(w.as<T>(), C, O);
  else Y.noalias() = X * Eigen::Map<const rm_matrix<T>>(w.as<T>(), O, C).transpose();
  if (in.size() == 3) {
    if (in[2]->numel() != O) kernel_error(nd, "local bias " + to_string(in[2]->shape()) + " for " + std::to_string(O) + " outputs");
    Y.rowwise() += Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>(in[2]->as<T>(), O);
  }
  return o;
}

template <class T>
host_tensor matmul(const node& nd, const host_tensor& x, const host_tensor& y) {
  const std::size_t r = x.shape().rank;
  const std::int64_t M = x.shape()[r - 2], K = x.shape()[r - 1], N = y.shape()[y.shape().rank - 1u];
  if (y.shape()[y.shape().rank - 2u] != K)
    kernel_error(nd, "local operands " + to_string(x.shape()) + " @ " + to_string(y.shape()) + " do not contract");
  tensor_shape s = x.shape();
  s[r - 1] = N;
  host_tensor o(x.type(), s);
  const std::int64_t batches = prod(x.shape(), 0, r - 2);
  const bool batched = y.shape().rank > 2;
  for (std::int64_t b = 0; b < batches; ++b) {
    Eigen::Map<const rm_matrix<T>> A(x.as<T>() + b * M * K, M, K);
    Eigen::Map<const rm_matrix<T>> B(y.as<T>() + (batched ? b * K * N : 0), K, N);
    Eigen::Map<rm_matrix<T>>(o.as<T>() + b * M * N, M, N).noalias() = A * B;
  }
  return o;
}

/// One row's statistics for layer_norm (`centred`: mean and 1 / sqrt(variance + eps)) and
/// rms_norm (mean 0, 1 / sqrt(mean square + eps)), eps the norm's attrs.epsilon; the forward
/// and the backward share them.
template <class T>
std::pair<T, T> norm_stats(const T* px, std::int64_t n, bool centred, double eps) {
  T mean = 0, var = 0;
  if (centred) {
    for (std::int64_t i = 0; i < n; ++i) mean += px[i];
    mean /= static_cast<T>(n);
  }
  for (std::int64_t i = 0; i < n; ++i) var += (px[i] - mean) * (px[i] - mean);
  return {mean, T(1) / std::sqrt(var / static_cast<T>(n) + static_cast<T>(eps))};
}

template <class T>
host_tensor norm(const node& nd, std::span<const host_tensor* const> in) {
  const bool ln = nd.kind == op_kind::layer_norm;
  const host_tensor& x = *in[0];
  const std::int64_t n = x.shape().rank ? x.shape()[x.shape().rank - 1u] : 1;
  for (std::size_t i = 1; i < in.size(); ++i)
    if (in[i]->numel() != n) kernel_error(nd, "local weight " + to_string(in[i]->shape()) + " for rows of " + std::to_string(n));
  host_tensor o(x.type(), x.shape());
  const std::int64_t rows = n ? x.numel() / n : 0;
  const T offset = static_cast<T>(nd.attrs.weight_offset);  // Gemma's 1 + weight
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* px = x.as<T>() + r * n;
    T* py = o.as<T>() + r * n;
    const auto [mean, inv] = norm_stats(px, n, ln, nd.attrs.epsilon);
    for (std::int64_t i = 0; i < n; ++i) {
      T v = (px[i] - mean) * inv;
      if (in.size() > 1) v *= offset + in[1]->as<T>()[i];
      if (in.size() > 2) v += in[2]->as<T>()[i];
      py[i] = v;
    }
  }
  return o;
}

template <class T>
host_tensor softmax(const node& nd, const host_tensor& x) {
  const int r = x.shape().rank;
  const int ax = nd.attrs.axis < 0 ? nd.attrs.axis + r : nd.attrs.axis;
  const std::int64_t outer = prod(x.shape(), 0, static_cast<std::size_t>(ax)), n = x.shape()[static_cast<std::size_t>(ax)],
                     inner = prod(x.shape(), static_cast<std::size_t>(ax) + 1, x.shape().rank);
  host_tensor o(x.type(), x.shape());
  for (std::int64_t a = 0; a < outer; ++a)
    for (std::int64_t c = 0; c < inner; ++c) {
      const T* px = x.as<T>() + a * n * inner + c;
      T* py = o.as<T>() + a * n * inner + c;
      T mx = -std::numeric_limits<T>::infinity(), sum = 0;
      for (std::int64_t i = 0; i < n; ++i) mx = std::max(mx, px[i * inner]);
      for (std::int64_t i = 0; i < n; ++i) sum += (py[i * inner] = std::exp(px[i * inner] - mx));
      for (std::int64_t i = 0; i < n; ++i) py[i * inner] /= sum;
    }
  return o;
}

/// The pairs a rotary turns in a row of its local piece of W columns (whole heads of D, D
/// even): each pair's two columns and its frequency, rotary_frequency(attrs, i, D) for pair i
/// of its head (base^(-2i/R), or the explicit list). The pairs lie within the head's first R =
/// rotary_width(attrs, D) columns: pair i is columns (2i, 2i+1) of the head, or (i, i + R/2)
/// with attrs.rotary_half (Hugging Face's rotate_half); columns R..D-1 are in no pair. One list
/// for the forward and the backward.
struct rotary_pair {
  std::int64_t a = 0, b = 0;
  double freq = 0;
};
inline std::vector<rotary_pair> rotary_pairs(const op_attrs& at, std::int64_t D, std::int64_t W) {
  std::vector<rotary_pair> p;
  const std::int64_t R = rotary_width(at, D);
  p.reserve(static_cast<std::size_t>(W / D * (R / 2)));
  for (std::int64_t h = 0; h + D <= W; h += D)
    for (std::int64_t i = 0; i < R / 2; ++i) {
      const double freq = rotary_frequency(at, i, D);
      p.push_back(at.rotary_half ? rotary_pair{h + i, h + i + R / 2, freq} : rotary_pair{h + 2 * i, h + 2 * i + 1, freq});
    }
  return p;
}

/// The head size of a rotary's input, checked against its local piece: whole heads, D even,
/// the turned dims even and within the head, one explicit frequency a pair of them.
inline std::int64_t rotary_head_size(const node& nd, const local_context& c, std::int64_t W) {
  const std::size_t r = c.global_in[0].rank;
  if (nd.attrs.heads <= 0) kernel_error(nd, "rotary needs attrs.heads");
  const std::int64_t D = c.global_in[0][r - 1] / nd.attrs.heads, e_off = c.in_offset[0][r - 1];
  if (D <= 0 || D % 2 != 0 || e_off % D != 0 || W % D != 0)
    kernel_error(nd, "the local piece (columns " + std::to_string(e_off) + ".." + std::to_string(e_off + W) +
                         ") does not hold whole heads of an even size " + std::to_string(D));
  const std::int64_t R = rotary_width(nd.attrs, D);
  if (R <= 0 || R > D || R % 2 != 0)
    kernel_error(nd, "rotary_dims " + std::to_string(R) + " is not an even number of dims within heads of " + std::to_string(D));
  if (const std::size_t n = nd.attrs.rotary_frequencies.size(); n != 0 && n != static_cast<std::size_t>(R / 2))
    kernel_error(nd, std::to_string(n) + " rotary_frequencies for " + std::to_string(R) + " turned dims of heads of " + std::to_string(D));
  return D;
}

/// Rotary embedding of x[..., S, heads*D]: each pair of a head (rotary_pairs) at position p
/// turns by p x its frequency, its cos and sin times attrs.scale (YaRN's attention_factor, as
/// transformers scales its tables); a column in no pair (past a partial rotary's R) is copied.
/// Positions and head offsets are global (the piece's offsets); row s of the sequence is at
/// position attrs.rotary_offset + s (a step after a key/value cache of that many tokens).
template <class T>
host_tensor rotary(const node& nd, const host_tensor& x, const local_context& c) {
  const std::size_t r = x.shape().rank;
  const std::int64_t W = x.shape()[r - 1], S = x.shape()[r - 2], s_off = nd.attrs.rotary_offset + c.in_offset[0][r - 2];
  const std::vector<rotary_pair> pairs = rotary_pairs(nd.attrs, rotary_head_size(nd, c, W), W);
  host_tensor o(x.type(), x.shape());
  const std::int64_t rows = W ? x.numel() / W : 0;
  for (std::int64_t row = 0; row < rows; ++row) {
    const double pos = static_cast<double>(row % S + s_off);
    const T* px = x.as<T>() + row * W;
    T* py = o.as<T>() + row * W;
    std::copy_n(px, W, py);  // the columns no pair turns
    for (const rotary_pair& q : pairs) {
      const T cs = static_cast<T>(std::cos(pos * q.freq) * nd.attrs.scale), sn = static_cast<T>(std::sin(pos * q.freq) * nd.attrs.scale);
      py[q.a] = px[q.a] * cs - px[q.b] * sn;
      py[q.b] = px[q.a] * sn + px[q.b] * cs;
    }
  }
  return o;
}

template <class T>
host_tensor embedding(const node& nd, const host_tensor& ids, const host_tensor& table, const local_context& c) {
  const std::int64_t rows = table.shape()[0], H = table.shape()[1], row_off = c.in_offset[1][0];
  tensor_shape s = ids.shape();
  s.dims[s.rank++] = H;
  host_tensor o(table.type(), s);
  const std::int64_t* pid = ids.as<std::int64_t>();
  for (std::int64_t i = 0; i < ids.numel(); ++i) {
    if (pid[i] < 0 || pid[i] >= c.global_in[1][0])
      kernel_error(nd, "id " + std::to_string(pid[i]) + " outside the table of " + std::to_string(c.global_in[1][0]) + " rows");
    const std::int64_t id = pid[i] - row_off;
    if (id < 0 || id >= rows) continue;  // another rank's rows (vocab-parallel): zeros, a partial sum
    std::copy_n(table.as<T>() + id * H, H, o.as<T>() + i * H);
  }
  if (nd.attrs.scale != 1.0) {  // Gemma's normalizer: every row, a partial sum's too (it is linear)
    const T scale = static_cast<T>(nd.attrs.scale);
    for (std::int64_t i = 0; i < o.numel(); ++i) o.as<T>()[i] *= scale;
  }
  return o;
}

template <class T>
host_tensor transpose(const node& nd, const host_tensor& x) {
  const tensor_shape& xs = x.shape();
  if (nd.attrs.dims.size() != xs.rank) kernel_error(nd, "permutation does not fit " + to_string(xs));
  tensor_shape s = xs;
  std::array<std::int64_t, max_tensor_rank> xst{};
  for (std::size_t d = xs.rank, st = 1; d-- > 0;) {
    xst[d] = static_cast<std::int64_t>(st);
    st *= static_cast<std::size_t>(xs[d]);
  }
  std::array<std::array<std::int64_t, max_tensor_rank>, 1> st{};
  for (std::size_t d = 0; d < s.rank; ++d) {
    const auto p = static_cast<std::size_t>(nd.attrs.dims[d]);
    s[d] = xs[p];
    st[0][d] = xst[p];
  }
  host_tensor o(x.type(), s);
  const T* px = x.as<T>();
  T* po = o.as<T>();
  strided_loop<1>(s, st, [&](std::int64_t flat, const std::array<std::int64_t, 1>& off) { po[flat] = px[off[0]]; });
  return o;
}

template <class T>
host_tensor reduce(const node& nd, const host_tensor& x, const local_context& c) {
  const tensor_shape& xs = x.shape();
  std::vector<bool> red(xs.rank, false);
  T count = 1;
  for (std::int64_t d : nd.attrs.dims) {
    red[static_cast<std::size_t>(d)] = true;
    count *= static_cast<T>(c.global_in[0][static_cast<std::size_t>(d)]);
  }
  tensor_shape s;
  for (std::size_t d = 0; d < xs.rank; ++d)
    if (!red[d]) s.dims[s.rank++] = xs[d];
  host_tensor o(x.type(), s);
  // Walk x; the output offset uses the output's strides on kept dims and 0 on reduced ones.
  std::array<std::array<std::int64_t, max_tensor_rank>, 1> st{};
  std::int64_t stride = 1;
  for (std::size_t d = xs.rank; d-- > 0;)
    if (!red[d]) {
      st[0][d] = stride;
      stride *= xs[d];
    }
  const T* px = x.as<T>();
  T* po = o.as<T>();
  const T scale = nd.kind == op_kind::reduce_mean ? T(1) / count : T(1);
  strided_loop<1>(xs, st, [&](std::int64_t flat, const std::array<std::int64_t, 1>& off) { po[off[0]] += px[flat] * scale; });
  return o;
}

/// A split whose operand arrives cut along the split axis: the operand is fused there
/// (graph/fused.hpp), so the local piece holds this rank's piece of every part, k = global /
/// local of each, and the part [start, start + length) is the local [start / k, (start + length) / k).
/// Any other split (its axis whole) is returned as it is.
inline node local_split(const node& nd, const tensor_shape& local_in, const local_context& c) {
  const auto ax = static_cast<std::size_t>(nd.attrs.axis < 0 ? nd.attrs.axis + local_in.rank : nd.attrs.axis);
  if (c.global_in.empty() || ax >= local_in.rank || local_in[ax] == c.global_in[0][ax]) return nd;
  const std::int64_t n = c.global_in[0][ax], l = local_in[ax];
  if (l <= 0 || n % l != 0 || nd.attrs.start % (n / l) != 0 || nd.attrs.length % (n / l) != 0)
    throw exec_error("vertex " + quoted_text(nd.name) + " (split): its operand's dim " + std::to_string(ax) + " is cut to " +
                     std::to_string(l) + " of " + std::to_string(n) + ", which does not cut the part [" +
                     std::to_string(nd.attrs.start) + ", " + std::to_string(nd.attrs.start + nd.attrs.length) +
                     ") into equal pieces (only a fused operand may arrive cut along the split axis)");
  node local = nd;
  local.attrs.start = nd.attrs.start / (n / l);
  local.attrs.length = nd.attrs.length / (n / l);
  return local;
}

template <class T>
host_tensor concat_or_split(const node& nd, std::span<const host_tensor* const> in) {
  const tensor_shape& x0 = in[0]->shape();
  const auto ax = static_cast<std::size_t>(nd.attrs.axis < 0 ? nd.attrs.axis + x0.rank : nd.attrs.axis);
  const std::int64_t outer = prod(x0, 0, ax), inner = prod(x0, ax + 1, x0.rank);
  tensor_shape s = x0;
  if (nd.kind == op_kind::split) {
    if (nd.attrs.start + nd.attrs.length > x0[ax]) kernel_error(nd, "slice outside the local " + to_string(x0));
    s[ax] = nd.attrs.length;
  } else {
    for (std::size_t k = 1; k < in.size(); ++k) s[ax] += in[k]->shape()[ax];
  }
  host_tensor o(in[0]->type(), s);
  T* po = o.as<T>();
  for (std::int64_t a = 0; a < outer; ++a) {
    if (nd.kind == op_kind::split) {
      std::copy_n(in[0]->as<T>() + (a * x0[ax] + nd.attrs.start) * inner, nd.attrs.length * inner,
                  po + a * s[ax] * inner);
      continue;
    }
    std::int64_t at = 0;
    for (const host_tensor* t : in) {
      const std::int64_t n = t->shape()[ax] * inner;
      std::copy_n(t->as<T>() + a * n, n, po + a * s[ax] * inner + at);
      at += n;
    }
  }
  return o;
}

/// Scaled-dot-product attention of q[B,S,hq*D] with k,v[B,Sk,hkv*D]; query head h reads
/// key/value head h / (hq/hkv). D comes from the global width and attrs.heads. Scores are
/// Q K^T / sqrt(D), plus ALiBi's biases where attrs.alibi says (add_alibi), then masked.
/// Row-wise softmax of attention scores in place; with `causal`, query i (at position q0 + i:
/// q0 the keys of a key/value cache before the step's) sees keys 0..q0+i only, and with a
/// sliding `window` W > 0 as well only keys q0+i-W+1..q0+i (op_attrs::window: itself and
/// the W-1 before it, transformers' kv_idx > q_idx - sliding_window); the rest become 0. Row
/// and column indices are the global positions: no strategy splits the attention core's
/// sequence (strategy.hpp: batch or heads), so a rank holds every query and key of its heads.
/// The forward kernel and its backward share it, so they cannot drift.
template <class T>
void softmax_scores(rm_matrix<T>& p, bool causal, std::int64_t window = 0, std::int64_t q0 = 0) {
  const std::int64_t S = p.rows(), Sk = p.cols();
  for (std::int64_t i = 0; i < S; ++i) {
    const std::int64_t last = causal ? std::min(q0 + i, Sk - 1) : Sk - 1;
    const std::int64_t first = causal && window > 0 ? std::max<std::int64_t>(0, q0 + i - window + 1) : 0;
    T mx = -std::numeric_limits<T>::infinity(), sum = 0;
    for (std::int64_t j = first; j <= last; ++j) mx = std::max(mx, p(i, j));
    for (std::int64_t j = 0; j < Sk; ++j) sum += (p(i, j) = j >= first && j <= last ? std::exp(p(i, j) - mx) : T(0));
    p.row(i) /= sum;
  }
}

/// Adds ALiBi's biases (op_attrs::alibi; alibi_bias) of query head `head`, its GLOBAL index
/// (the slope is the head's, wherever the heads are split), to every row of the scaled scores
/// p, key j at global position key0 + j; nothing without ALiBi. Masked scores get it too, and
/// softmax_scores drops them after. The forward kernel and its backward share it.
template <class T>
void add_alibi(rm_matrix<T>& p, const op_attrs& a, std::int64_t head, std::int64_t key0, std::int64_t D) {
  if (a.alibi == alibi_rule::none) return;
  Eigen::Matrix<T, 1, Eigen::Dynamic> bias(p.cols());
  for (std::int64_t j = 0; j < p.cols(); ++j) bias(j) = static_cast<T>(alibi_bias(a.alibi, a.heads, head, key0 + j, D));
  p.rowwise() += bias;
}

/// Which local key/value head each local query head reads: query head h (global) reads key/value
/// head h / (heads / kv_heads) (global), found in the local k at its offset. The ranks hold
/// whole heads, and the key/value heads of their query heads: split with them, or whole.
struct kv_heads_map {
  std::int64_t hq = 0;        ///< local query heads
  std::int64_t q0 = 0, k0 = 0;  ///< global index of the first local query / key-value head
  std::int64_t group = 1;     ///< query heads per key/value head
  std::int64_t kv_head(std::int64_t h) const noexcept { return (q0 + h) / group - k0; }
};
inline kv_heads_map kv_heads_of(const node& nd, const host_tensor& q, const host_tensor& k, const local_context& c, std::int64_t D) {
  const std::int64_t Wq = q.shape()[2], Wk = k.shape()[2];
  const int heads = nd.attrs.heads, kv = nd.attrs.kv_heads > 0 ? nd.attrs.kv_heads : heads;
  kv_heads_map m;
  if (D > 0 && Wq % D == 0 && Wk % D == 0 && Wk > 0 && heads % kv == 0 && c.in_offset[0][2] % D == 0 && c.in_offset[1][2] % D == 0) {
    m.hq = Wq / D;
    m.q0 = c.in_offset[0][2] / D;
    m.k0 = c.in_offset[1][2] / D;
    m.group = heads / kv;
    if (m.hq == 0 || (m.kv_head(0) >= 0 && m.kv_head(m.hq - 1) < Wk / D)) return m;
  }
  kernel_error(nd, "local q " + to_string(q.shape()) + " and k " + to_string(k.shape()) + " (at " + to_string(c.in_offset[0]) + ", " +
                       to_string(c.in_offset[1]) + ") do not hold whole heads of " + std::to_string(D) +
                       " with the key/value heads of their query heads");
}

/// The keys (or values) an attention with a key/value cache weighs: cache[B,P,W] then the
/// step's own x[B,S,W], as [B,P+S,W] (the cache's in-place append, made as a copy here).
template <class T>
host_tensor after_cache(const host_tensor& cache, const host_tensor& x) {
  const std::int64_t B = x.shape()[0], P = cache.shape()[1], S = x.shape()[1], W = x.shape()[2];
  host_tensor o(x.type(), tensor_shape{B, P + S, W});
  for (std::int64_t b = 0; b < B; ++b) {
    std::copy_n(cache.as<T>() + b * P * W, P * W, o.as<T>() + b * (P + S) * W);
    std::copy_n(x.as<T>() + b * S * W, S * W, o.as<T>() + (b * (P + S) + P) * W);
  }
  return o;
}

/// The attention core over q and the whole keys and values, query i at position q0 + i.
template <class T>
host_tensor attention_core(const node& nd, std::span<const host_tensor* const> in, const local_context& c, std::int64_t q0) {
  const host_tensor &q = *in[0], &k = *in[1], &v = *in[2];
  if (nd.attrs.heads <= 0) kernel_error(nd, "attention needs attrs.heads");
  const std::int64_t D = c.global_in[0][2] / nd.attrs.heads;
  const std::int64_t B = q.shape()[0], S = q.shape()[1], Sk = k.shape()[1];
  const std::int64_t Wq = q.shape()[2], Wk = k.shape()[2];
  const kv_heads_map kvm = kv_heads_of(nd, q, k, c, D);
  host_tensor o(q.type(), q.shape());
  using stride_map = Eigen::Map<const rm_matrix<T>, 0, Eigen::OuterStride<>>;
  const T scale = T(1) / std::sqrt(static_cast<T>(D));
  rm_matrix<T> p(S, Sk);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < kvm.hq; ++h) {
      const std::int64_t kh = kvm.kv_head(h);
      stride_map Q(q.as<T>() + b * S * Wq + h * D, S, D, Eigen::OuterStride<>(Wq));
      stride_map K(k.as<T>() + b * Sk * Wk + kh * D, Sk, D, Eigen::OuterStride<>(Wk));
      stride_map V(v.as<T>() + b * Sk * Wk + kh * D, Sk, D, Eigen::OuterStride<>(Wk));
      p.noalias() = Q * K.transpose();  // into p: (Q K^T) * scale would make an S x Sk temporary
      p *= scale;
      add_alibi(p, nd.attrs, kvm.q0 + h, c.in_offset[1][1], D);
      softmax_scores(p, nd.attrs.causal, nd.attrs.window, q0);
      Eigen::Map<rm_matrix<T>, 0, Eigen::OuterStride<>>(o.as<T>() + b * S * Wq + h * D, S, D, Eigen::OuterStride<>(Wq))
          .noalias() = p * V;
    }
  return o;
}

template <class T>
host_tensor attention(const node& nd, std::span<const host_tensor* const> in, const local_context& c) {
  if (in.size() == 5) {  // a key/value cache: its keys and values before the step's, the queries after them
    if (!(in[3]->shape() == in[4]->shape()) || in[3]->shape().rank != 3 || in[3]->shape()[0] != in[1]->shape()[0] ||
        in[3]->shape()[2] != in[1]->shape()[2])
      kernel_error(nd, "local key/value cache " + to_string(in[3]->shape()) + ", " + to_string(in[4]->shape()) + " does not fit k " +
                           to_string(in[1]->shape()));
    const host_tensor k = after_cache<T>(*in[3], *in[1]), v = after_cache<T>(*in[4], *in[2]);
    local_context whole = c;
    whole.global_in.resize(3);
    whole.in_offset.resize(3);
    whole.global_in[1][1] = whole.global_in[2][1] = k.shape()[1];
    const host_tensor* ops[] = {in[0], &k, &v};
    return attention_core<T>(nd, ops, whole, in[3]->shape()[1]);
  }
  return attention_core<T>(nd, in, c, 0);
}

/// Mean cross-entropy over every row of the global batch; this piece's rows contribute
/// their sum divided by the global row count (a partial sum when rows are split). With a
/// vocab-parallel piece, the row max, the sum of exponentials and the target logit are
/// combined over the other vocabulary slices through c.vocab_reduce (Megatron's loss).
template <class T>
host_tensor cross_entropy(const node& nd, const host_tensor& logits, const host_tensor& labels, const local_context& c) {
  const std::int64_t V = logits.shape()[logits.shape().rank - 1u];
  const std::int64_t v_off = c.in_offset[0][logits.shape().rank - 1u], V_global = c.global_in[0][logits.shape().rank - 1u];
  const std::int64_t rows = labels.numel();
  if (rows * V != logits.numel()) kernel_error(nd, "local labels " + to_string(labels.shape()) + " do not match logits " + to_string(logits.shape()));
  T n_rows = 1;
  for (std::int64_t d : c.global_in[1]) n_rows *= static_cast<T>(d);
  const T* x = logits.as<T>();
  const std::int64_t* lab = labels.as<std::int64_t>();
  std::vector<T> mx(static_cast<std::size_t>(rows), -std::numeric_limits<T>::infinity());
  std::vector<T> sum_target(static_cast<std::size_t>(2 * rows), T(0));  // [sum exp..., target...]
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < V; ++j) mx[static_cast<std::size_t>(r)] = std::max(mx[static_cast<std::size_t>(r)], x[r * V + j]);
  const dtype t = logits.type();
  if (c.vocab_reduce) c.vocab_reduce(mx.data(), mx.size(), t, reduce_op::max);
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    for (std::int64_t j = 0; j < V; ++j) sum_target[ur] += std::exp(x[r * V + j] - mx[ur]);
    if (lab[r] < 0 || lab[r] >= V_global)
      kernel_error(nd, "label " + std::to_string(lab[r]) + " outside the vocabulary of " + std::to_string(V_global));
    const std::int64_t lc = lab[r] - v_off;
    if (lc >= 0 && lc < V) sum_target[static_cast<std::size_t>(rows) + ur] = x[r * V + lc];
  }
  if (c.vocab_reduce) c.vocab_reduce(sum_target.data(), sum_target.size(), t, reduce_op::sum);
  T loss = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    loss += std::log(sum_target[ur]) + mx[ur] - sum_target[static_cast<std::size_t>(rows) + ur];
  }
  host_tensor o(t, tensor_shape{});
  o.as<T>()[0] = loss / n_rows;
  return o;
}

}  // namespace detail

/// Runs operator `nd` on local operands `in` (operand order) and returns the local output.
/// Float tensors are T (float or double); ids and labels are i64. Throws exec_error naming
/// the vertex when the pieces do not fit.
template <class T>
host_tensor run_kernel(const node& nd, std::span<const host_tensor* const> in, const local_context& c) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "autoshard: kernels run in float or double");
  using namespace detail;
  auto need = [&](std::size_t n) {
    if (in.size() < n) kernel_error(nd, "needs " + std::to_string(n) + " operands, got " + std::to_string(in.size()));
  };
  need(static_cast<std::size_t>(operand_count_range(nd.kind).first));
  switch (nd.kind) {
    case op_kind::linear: return linear<T>(nd, in);
    case op_kind::matmul: return matmul<T>(nd, *in[0], *in[1]);
    case op_kind::gelu:  // GPT-2's gelu_new (tanh approximation)
      return unary<T>(*in[0], [](T v) { return T(0.5) * v * (T(1) + std::tanh(T(0.7978845608028654) * (v + T(0.044715) * v * v * v))); });
    case op_kind::gelu_erf:  // exact: x Phi(x)
      return unary<T>(*in[0], [](T v) { return T(0.5) * v * (T(1) + std::erf(v * T(0.7071067811865476))); });
    case op_kind::silu: return unary<T>(*in[0], [](T v) { return v / (T(1) + std::exp(-v)); });
    case op_kind::relu: return unary<T>(*in[0], [](T v) { return v > T(0) ? v : T(0); });
    case op_kind::tanh: return unary<T>(*in[0], [](T v) { return std::tanh(v); });
    case op_kind::exp: return unary<T>(*in[0], [](T v) { return std::exp(v); });
    case op_kind::dropout: return host_tensor::copy_of(*in[0]);  // inference: identity
    case op_kind::rotary: return rotary<T>(nd, *in[0], c);
    case op_kind::add: return binary<T>(nd, *in[0], *in[1], [](T a, T b) { return a + b; });
    case op_kind::sub: return binary<T>(nd, *in[0], *in[1], [](T a, T b) { return a - b; });
    case op_kind::mul: return binary<T>(nd, *in[0], *in[1], [](T a, T b) { return a * b; });
    case op_kind::div: return binary<T>(nd, *in[0], *in[1], [](T a, T b) { return a / b; });
    case op_kind::layer_norm:
    case op_kind::rms_norm: return norm<T>(nd, in);
    case op_kind::softmax: return softmax<T>(nd, *in[0]);
    case op_kind::embedding: return embedding<T>(nd, *in[0], *in[1], c);
    case op_kind::reshape: {
      if (c.out_shape.numel() != in[0]->numel())
        kernel_error(nd, "cannot view the local " + to_string(in[0]->shape()) + " as " + to_string(c.out_shape));
      host_tensor o(in[0]->type(), c.out_shape);
      if (o.nbytes()) std::memcpy(o.data(), in[0]->data(), o.nbytes());
      return o;
    }
    case op_kind::transpose: return transpose<T>(nd, *in[0]);
    case op_kind::reduce_sum:
    case op_kind::reduce_mean: return reduce<T>(nd, *in[0], c);
    case op_kind::concat:
    case op_kind::split: return concat_or_split<T>(local_split(nd, in[0]->shape(), c), in);
    case op_kind::attention: return attention<T>(nd, in, c);
    case op_kind::cross_entropy: return cross_entropy<T>(nd, *in[0], *in[1], c);
    case op_kind::where: return where<T>(nd, in);
    case op_kind::expand: return expand<T>(nd, *in[0], c.out_shape);
    case op_kind::opaque: return elementwise_opaque<T>(nd, in);
    case op_kind::input:
    case op_kind::parameter: break;
  }
  kernel_error(nd, "has no kernel (a source's value is given, not computed)");
}

}  // namespace autoshard
