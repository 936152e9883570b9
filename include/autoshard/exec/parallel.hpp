#pragma once
/// Tensor-parallel building blocks for hand-written training loops on the host (Eigen math,
/// Megatron-LM's scheme): the f/g conjugate collectives, column- and row-parallel linear
/// layers with forward and backward, a vocab-parallel embedding and a vocab-parallel
/// cross-entropy. Weights are [out, in] (torch.nn.Linear); splits follow core's chunk rule,
/// so sizes need not divide (10 over 4 -> 3,3,3,1).
///   auto fc1 = autoshard::column_parallel_linear<float>::from_full(W1, b1, tp.rank(), tp.size());
///   auto fc2 = autoshard::row_parallel_linear<float>::from_full(W2, b2, tp.rank(), tp.size());
///   auto y = fc2.forward(tp, relu(fc1.forward(tp, x)));     // y is replicated on the group
///   auto dx = fc1.backward(tp, relu_grad(fc2.backward(tp, dy)));
#include <cmath>    // std::exp, std::log
#include <cstddef>  // std::size_t
#include <cstdint>  // std::int64_t
#include <limits>   // std::numeric_limits
#include <string>   // std::string
#include <type_traits>  // std::is_same_v
#include <utility>  // std::move
#include <vector>   // std::vector

#include <Eigen/Core>  // Eigen::Matrix

#include "../comm/communicator.hpp"  // communicator
#include "../core/dtype.hpp"         // dtype
#include "../core/error.hpp"         // shape_error
#include "../core/layout.hpp"        // split_range, padded_piece, dim_range
#include "../core/placement.hpp"     // reduce_op

namespace autoshard {

/// Row-major dynamic matrix, the layout of the library's buffers.
template <class S>
using tp_matrix = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
/// Row vector (a bias).
template <class S>
using tp_row = Eigen::Matrix<S, 1, Eigen::Dynamic>;

namespace detail {
template <class S>
constexpr dtype scalar_dtype() {
  static_assert(std::is_same_v<S, float> || std::is_same_v<S, double>,
                "autoshard: tensor-parallel layers compute in float or double");
  return std::is_same_v<S, float> ? dtype::f32 : dtype::f64;
}

template <class S, communicator C>
void all_reduce_matrix(C& c, tp_matrix<S>& m, reduce_op op = reduce_op::sum) {
  c.all_reduce(m.data(), static_cast<std::size_t>(m.size()), scalar_dtype<S>(), op);
}

/// Columns [r.offset, r.offset + r.size) of every rank's block, gathered into one matrix
/// (pieces padded to ceil(n/k) columns for the collective, narrowed after).
template <class S, communicator C>
tp_matrix<S> all_gather_columns(C& c, const tp_matrix<S>& local, std::int64_t total) {
  const int k = c.size();
  const std::int64_t pad = padded_piece(total, k);
  const auto rows = local.rows();
  tp_matrix<S> send = tp_matrix<S>::Zero(rows, pad);
  send.leftCols(local.cols()) = local;
  // Gather row-major [rows, pad] blocks; block j is rank j's piece.
  std::vector<S> recv(static_cast<std::size_t>(rows * pad * k));
  c.all_gather(send.data(), recv.data(), static_cast<std::size_t>(rows * pad), scalar_dtype<S>());
  tp_matrix<S> out(rows, total);
  for (int j = 0; j < k; ++j) {
    const dim_range r = split_range(total, k, j);
    if (r.size == 0) continue;
    Eigen::Map<const tp_matrix<S>> block(recv.data() + static_cast<std::size_t>(j) * static_cast<std::size_t>(rows * pad),
                                         rows, pad);
    out.middleCols(r.offset, r.size) = block.leftCols(r.size);
  }
  return out;
}

inline void require(bool ok, const std::string& what) {
  if (!ok) throw shape_error(what);
}
}  // namespace detail

/// Megatron's f: identity forward, all-reduce (sum) of the gradient backward. Put where a
/// replicated activation enters a tensor-parallel region.
struct copy_to_parallel_region {
  template <class S, communicator C>
  static const tp_matrix<S>& forward(C&, const tp_matrix<S>& x) { return x; }
  template <class S, communicator C>
  static tp_matrix<S> backward(C& c, tp_matrix<S> dx) {
    detail::all_reduce_matrix<S>(c, dx);
    return dx;
  }
};

/// Megatron's g: all-reduce (sum) forward, identity backward. Put where partial sums leave
/// a tensor-parallel region.
struct reduce_from_parallel_region {
  template <class S, communicator C>
  static tp_matrix<S> forward(C& c, tp_matrix<S> y) {
    detail::all_reduce_matrix<S>(c, y);
    return y;
  }
  template <class S, communicator C>
  static const tp_matrix<S>& backward(C&, const tp_matrix<S>& dy) { return dy; }
};

/// Y = X W^T + b with W [out, in] split on its output dim (rows): rank r holds rows
/// split_range(out, k, r) of W and of b. Input replicated (f in front), output split on its
/// last dim unless gather_output (then all-gathered, replicated).
template <class S>
struct column_parallel_linear {
  tp_matrix<S> weight;       ///< [out_local, in]
  tp_row<S> bias;            ///< [out_local]
  tp_matrix<S> grad_weight;  ///< accumulated by backward
  tp_row<S> grad_bias;
  std::int64_t out_features = 0;
  dim_range rows;  ///< this rank's rows of the full weight
  bool gather_output = false;

  /// This rank's piece of the full W [out, in] and b [out].
  static column_parallel_linear from_full(const tp_matrix<S>& w, const tp_row<S>& b, int tp_rank, int tp_size,
                                          bool gather_output = false) {
    detail::require(b.size() == w.rows(), "column_parallel_linear: bias of " + std::to_string(b.size()) +
                                              " does not match weight [" + std::to_string(w.rows()) + "," +
                                              std::to_string(w.cols()) + "]");
    column_parallel_linear l;
    l.out_features = w.rows();
    l.rows = split_range(w.rows(), tp_size, tp_rank);
    l.weight = w.middleRows(l.rows.offset, l.rows.size);
    l.bias = b.segment(l.rows.offset, l.rows.size);
    l.gather_output = gather_output;
    l.zero_grad();
    return l;
  }
  void zero_grad() {
    grad_weight = tp_matrix<S>::Zero(weight.rows(), weight.cols());
    grad_bias = tp_row<S>::Zero(bias.size());
  }

  /// x [batch, in], replicated on the group. Returns [batch, out_local] (or [batch, out]).
  template <communicator C>
  tp_matrix<S> forward(C& c, const tp_matrix<S>& x) {
    detail::require(x.cols() == weight.cols(), "column_parallel_linear: input has " + std::to_string(x.cols()) +
                                                   " features, the weight expects " + std::to_string(weight.cols()));
    input_ = copy_to_parallel_region::forward<S>(c, x);
    tp_matrix<S> y = (input_ * weight.transpose()).rowwise() + bias;
    return gather_output ? detail::all_gather_columns<S>(c, y, out_features) : y;
  }

  /// dy [batch, out_local] (or [batch, out] when gathered). Accumulates the gradients of this
  /// rank's piece, returns dX [batch, in] (all-reduced: replicated, f's backward).
  template <communicator C>
  tp_matrix<S> backward(C& c, const tp_matrix<S>& dy_in) {
    const tp_matrix<S> dy = gather_output ? tp_matrix<S>(dy_in.middleCols(rows.offset, rows.size)) : dy_in;
    detail::require(dy.rows() == input_.rows() && dy.cols() == weight.rows(),
                    "column_parallel_linear: backward got dY [" + std::to_string(dy_in.rows()) + "," +
                        std::to_string(dy_in.cols()) + "] for a forward of batch " + std::to_string(input_.rows()));
    grad_weight += dy.transpose() * input_;
    grad_bias += dy.colwise().sum();
    return copy_to_parallel_region::backward<S>(c, tp_matrix<S>(dy * weight));
  }

 private:
  tp_matrix<S> input_;
};

/// Y = X W^T + b with W [out, in] split on its input dim (columns): rank r holds columns
/// split_range(in, k, r) of W and takes the matching columns of X (the output of a
/// column-parallel layer). Partial products are all-reduced (g); the bias is whole and
/// added once, after the reduction.
template <class S>
struct row_parallel_linear {
  tp_matrix<S> weight;  ///< [out, in_local]
  tp_row<S> bias;       ///< [out], the same on every rank
  tp_matrix<S> grad_weight;
  tp_row<S> grad_bias;
  dim_range cols;  ///< this rank's columns of the full weight

  static row_parallel_linear from_full(const tp_matrix<S>& w, const tp_row<S>& b, int tp_rank, int tp_size) {
    detail::require(b.size() == w.rows(), "row_parallel_linear: bias of " + std::to_string(b.size()) +
                                              " does not match weight [" + std::to_string(w.rows()) + "," +
                                              std::to_string(w.cols()) + "]");
    row_parallel_linear l;
    l.cols = split_range(w.cols(), tp_size, tp_rank);
    l.weight = w.middleCols(l.cols.offset, l.cols.size);
    l.bias = b;
    l.zero_grad();
    return l;
  }
  void zero_grad() {
    grad_weight = tp_matrix<S>::Zero(weight.rows(), weight.cols());
    grad_bias = tp_row<S>::Zero(bias.size());
  }

  /// x_local [batch, in_local]. Returns Y [batch, out], replicated.
  template <communicator C>
  tp_matrix<S> forward(C& c, const tp_matrix<S>& x_local) {
    detail::require(x_local.cols() == weight.cols(), "row_parallel_linear: input piece has " +
                                                         std::to_string(x_local.cols()) + " features, this rank's "
                                                         "weight columns are " + std::to_string(weight.cols()));
    input_ = x_local;
    tp_matrix<S> y = reduce_from_parallel_region::forward<S>(c, tp_matrix<S>(x_local * weight.transpose()));
    return y.rowwise() + bias;
  }

  /// dy [batch, out] (replicated). Returns dX_local [batch, in_local].
  template <communicator C>
  tp_matrix<S> backward(C& c, const tp_matrix<S>& dy_in) {
    const tp_matrix<S>& dy = reduce_from_parallel_region::backward<S>(c, dy_in);
    detail::require(dy.rows() == input_.rows() && dy.cols() == weight.rows(),
                    "row_parallel_linear: backward got dY [" + std::to_string(dy.rows()) + "," +
                        std::to_string(dy.cols()) + "] for a forward of batch " + std::to_string(input_.rows()));
    grad_weight += dy.transpose() * input_;
    grad_bias += dy.colwise().sum();
    return dy * weight;
  }

 private:
  tp_matrix<S> input_;
};

/// An embedding table [vocab, hidden] split on the vocabulary: rank r holds rows
/// split_range(vocab, k, r). Lookups outside the piece give zeros; an all-reduce (g)
/// completes every row.
template <class S>
struct vocab_parallel_embedding {
  tp_matrix<S> weight;  ///< [vocab_local, hidden]
  tp_matrix<S> grad_weight;
  std::int64_t vocab = 0;
  dim_range rows;

  static vocab_parallel_embedding from_full(const tp_matrix<S>& table, int tp_rank, int tp_size) {
    vocab_parallel_embedding e;
    e.vocab = table.rows();
    e.rows = split_range(table.rows(), tp_size, tp_rank);
    e.weight = table.middleRows(e.rows.offset, e.rows.size);
    e.zero_grad();
    return e;
  }
  void zero_grad() { grad_weight = tp_matrix<S>::Zero(weight.rows(), weight.cols()); }

  /// ids (each in [0, vocab)) -> [ids.size(), hidden], replicated.
  template <communicator C>
  tp_matrix<S> forward(C& c, const std::vector<std::int64_t>& ids) {
    ids_ = ids;
    tp_matrix<S> out = tp_matrix<S>::Zero(static_cast<Eigen::Index>(ids.size()), weight.cols());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      detail::require(ids[i] >= 0 && ids[i] < vocab, "vocab_parallel_embedding: token id " + std::to_string(ids[i]) +
                                                          " is outside a vocabulary of " + std::to_string(vocab));
      if (ids[i] >= rows.offset && ids[i] < rows.offset + rows.size)
        out.row(static_cast<Eigen::Index>(i)) = weight.row(ids[i] - rows.offset);
    }
    return reduce_from_parallel_region::forward<S>(c, std::move(out));
  }

  /// dy [ids.size(), hidden] (replicated): accumulates the rows this rank owns.
  template <communicator C>
  void backward(C& c, const tp_matrix<S>& dy_in) {
    const tp_matrix<S>& dy = reduce_from_parallel_region::backward<S>(c, dy_in);
    for (std::size_t i = 0; i < ids_.size(); ++i)
      if (ids_[i] >= rows.offset && ids_[i] < rows.offset + rows.size)
        grad_weight.row(ids_[i] - rows.offset) += dy.row(static_cast<Eigen::Index>(i));
  }

 private:
  std::vector<std::int64_t> ids_;
};

/// Mean cross-entropy of logits split on the vocabulary (the output of a column-parallel
/// layer without gather): rank r holds columns split_range(vocab, k, r). Three all-reduces
/// of one number per row (max, sum of exponentials, target logit); the full logits are
/// never gathered.
template <class S>
struct vocab_parallel_cross_entropy {
  std::int64_t vocab = 0;
  dim_range cols;

  vocab_parallel_cross_entropy(std::int64_t vocab_size, int tp_rank, int tp_size)
      : vocab(vocab_size), cols(split_range(vocab_size, tp_size, tp_rank)) {}

  /// logits_local [batch, vocab_local], targets [batch]. Returns the mean loss (replicated).
  template <communicator C>
  S forward(C& c, const tp_matrix<S>& logits_local, const std::vector<std::int64_t>& targets) {
    const auto n = logits_local.rows();
    detail::require(logits_local.cols() == cols.size && static_cast<std::size_t>(n) == targets.size(),
                    "vocab_parallel_cross_entropy: logits piece [" + std::to_string(n) + "," +
                        std::to_string(logits_local.cols()) + "] with " + std::to_string(targets.size()) +
                        " targets, expected " + std::to_string(cols.size) + " columns");
    tp_matrix<S> row_max(n, 1);
    for (Eigen::Index i = 0; i < n; ++i)
      row_max(i, 0) = cols.size > 0 ? logits_local.row(i).maxCoeff() : -std::numeric_limits<S>::infinity();
    detail::all_reduce_matrix<S>(c, row_max, reduce_op::max);
    softmax_ = (logits_local.colwise() - row_max.col(0)).array().exp().matrix();
    tp_matrix<S> sums = softmax_.rowwise().sum();
    detail::all_reduce_matrix<S>(c, sums);
    tp_matrix<S> target_logit = tp_matrix<S>::Zero(n, 1);
    targets_ = targets;
    for (Eigen::Index i = 0; i < n; ++i) {
      const std::int64_t t = targets[static_cast<std::size_t>(i)];
      detail::require(t >= 0 && t < vocab, "vocab_parallel_cross_entropy: target " + std::to_string(t) +
                                               " is outside a vocabulary of " + std::to_string(vocab));
      if (t >= cols.offset && t < cols.offset + cols.size) target_logit(i, 0) = logits_local(i, t - cols.offset);
    }
    detail::all_reduce_matrix<S>(c, target_logit);
    S loss = 0;
    for (Eigen::Index i = 0; i < n; ++i) {
      softmax_.row(i) /= sums(i, 0);
      loss += std::log(sums(i, 0)) + row_max(i, 0) - target_logit(i, 0);
    }
    return loss / static_cast<S>(n);
  }

  /// d(mean loss)/d(logits_local): (softmax - one_hot) / batch, this rank's columns.
  tp_matrix<S> backward() const {
    tp_matrix<S> g = softmax_;
    for (Eigen::Index i = 0; i < g.rows(); ++i) {
      const std::int64_t t = targets_[static_cast<std::size_t>(i)];
      if (t >= cols.offset && t < cols.offset + cols.size) g(i, t - cols.offset) -= S(1);
    }
    return g / static_cast<S>(g.rows());
  }

 private:
  tp_matrix<S> softmax_;
  std::vector<std::int64_t> targets_;
};

}  // namespace autoshard
