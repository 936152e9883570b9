// Tensor-parallel layers on 4 Gloo ranks against plain single-rank Eigen math written
// here: outputs, input gradients and each rank's piece of the weight gradients, with
// sizes that do not divide by 4; then a small MLP trained a few steps follows the
// single-rank loss curve.
#include <doctest/doctest.h>

#include <autoshard/exec/exec.hpp>
#include <autoshard/gloo/gloo.hpp>

#include <cmath>
#include <mutex>
#include <random>
#include <string>
#include <vector>

using namespace autoshard;
using mat = tp_matrix<double>;
using row = tp_row<double>;

namespace {

mat random_matrix(Eigen::Index r, Eigen::Index c, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  mat m(r, c);
  for (Eigen::Index i = 0; i < r; ++i)
    for (Eigen::Index j = 0; j < c; ++j) m(i, j) = u(gen);
  return m;
}
row random_row(Eigen::Index n, unsigned seed) { return random_matrix(1, n, seed).row(0); }

double max_diff(const mat& a, const mat& b) {
  if (a.rows() != b.rows() || a.cols() != b.cols()) return HUGE_VAL;
  return a.size() == 0 ? 0.0 : (a - b).cwiseAbs().maxCoeff();
}

// Single-rank reference of Y = X W^T + b and its gradients.
struct dense_ref {
  mat y, dx, dw;
  row db;
  dense_ref(const mat& x, const mat& w, const row& b, const mat& dy)
      : y((x * w.transpose()).rowwise() + b), dx(dy * w), dw(dy.transpose() * x), db(dy.colwise().sum()) {}
};

// Collects failures from rank threads; checked on the main thread.
struct failures {
  std::mutex mu;
  std::vector<std::string> list;
  void check(bool ok, int rank, const std::string& what) {
    if (ok) return;
    std::lock_guard lock(mu);
    list.push_back("rank " + std::to_string(rank) + ": " + what);
  }
  void report() {
    for (auto& f : list) FAIL_CHECK(f);
    CHECK(list.empty());
  }
};

constexpr double tol = 1e-12;

}  // namespace

TEST_CASE("column-parallel linear on 4 ranks equals the single-rank layer, gradients included") {
  const mat w = random_matrix(10, 6, 1), x = random_matrix(5, 6, 2), dy = random_matrix(5, 10, 3);
  const row b = random_row(10, 4);
  const dense_ref ref(x, w, b, dy);
  failures f;
  run_ranks(4, [&](gloo_communicator& c) {
    for (bool gather : {false, true}) {
      auto l = column_parallel_linear<double>::from_full(w, b, c.rank(), c.size(), gather);
      const dim_range r = split_range(10, 4, c.rank());  // 3,3,3,1
      f.check(l.weight.rows() == r.size, c.rank(), "weight rows");
      const mat y = l.forward(c, x);
      const mat want_y = gather ? ref.y : mat(ref.y.middleCols(r.offset, r.size));
      f.check(max_diff(y, want_y) < tol, c.rank(), "forward, gather=" + std::to_string(gather));
      const mat dx = l.backward(c, gather ? dy : mat(dy.middleCols(r.offset, r.size)));
      f.check(max_diff(dx, ref.dx) < tol, c.rank(), "dX");
      f.check(max_diff(l.grad_weight, ref.dw.middleRows(r.offset, r.size)) < tol, c.rank(), "dW rows");
      f.check(max_diff(l.grad_bias, ref.db.segment(r.offset, r.size)) < tol, c.rank(), "db piece");
    }
  });
  f.report();
}

TEST_CASE("row-parallel linear on 4 ranks equals the single-rank layer, gradients included") {
  const mat w = random_matrix(4, 10, 5), x = random_matrix(5, 10, 6), dy = random_matrix(5, 4, 7);
  const row b = random_row(4, 8);
  const dense_ref ref(x, w, b, dy);
  failures f;
  run_ranks(4, [&](gloo_communicator& c) {
    auto l = row_parallel_linear<double>::from_full(w, b, c.rank(), c.size());
    const dim_range r = split_range(10, 4, c.rank());
    const mat y = l.forward(c, x.middleCols(r.offset, r.size));
    f.check(max_diff(y, ref.y) < tol, c.rank(), "forward");
    const mat dx = l.backward(c, dy);
    f.check(max_diff(dx, ref.dx.middleCols(r.offset, r.size)) < tol, c.rank(), "dX piece");
    f.check(max_diff(l.grad_weight, ref.dw.middleCols(r.offset, r.size)) < tol, c.rank(), "dW columns");
    f.check(max_diff(l.grad_bias, ref.db) < tol, c.rank(), "db (whole)");
  });
  f.report();
}

TEST_CASE("vocab-parallel embedding and cross-entropy equal the single-rank ones") {
  const mat table = random_matrix(11, 3, 9), logits = random_matrix(6, 11, 10) * 3.0;
  const std::vector<std::int64_t> ids{0, 10, 4, 4, 7, 2}, targets{10, 0, 3, 8, 9, 5};
  const mat dy = random_matrix(6, 3, 11);
  // reference: rows of the table; log-softmax loss and (softmax - onehot) / n
  mat ref_emb(6, 3), ref_dtable = mat::Zero(11, 3), ref_grad(6, 11);
  double ref_loss = 0;
  for (int i = 0; i < 6; ++i) {
    ref_emb.row(i) = table.row(ids[static_cast<std::size_t>(i)]);
    ref_dtable.row(ids[static_cast<std::size_t>(i)]) += dy.row(i);
    double z = 0;
    for (int j = 0; j < 11; ++j) z += std::exp(logits(i, j));
    ref_loss += std::log(z) - logits(i, targets[static_cast<std::size_t>(i)]);
    for (int j = 0; j < 11; ++j)
      ref_grad(i, j) = (std::exp(logits(i, j)) / z - (j == targets[static_cast<std::size_t>(i)] ? 1.0 : 0.0)) / 6.0;
  }
  ref_loss /= 6.0;
  failures f;
  run_ranks(4, [&](gloo_communicator& c) {
    const dim_range r = split_range(11, 4, c.rank());  // 3,3,3,2
    auto emb = vocab_parallel_embedding<double>::from_full(table, c.rank(), c.size());
    f.check(max_diff(emb.forward(c, ids), ref_emb) < tol, c.rank(), "embedding forward");
    emb.backward(c, dy);
    f.check(max_diff(emb.grad_weight, ref_dtable.middleRows(r.offset, r.size)) < tol, c.rank(), "embedding grad");
    vocab_parallel_cross_entropy<double> ce(11, c.rank(), c.size());
    const double loss = ce.forward(c, logits.middleCols(r.offset, r.size), targets);
    f.check(std::abs(loss - ref_loss) < tol, c.rank(), "loss " + std::to_string(loss) + " vs " + std::to_string(ref_loss));
    f.check(max_diff(ce.backward(), ref_grad.middleCols(r.offset, r.size)) < tol, c.rank(), "logit grad");
  });
  f.report();
}

TEST_CASE("an MLP trained on 4 ranks follows the single-rank loss curve") {
  // x [8,6] -> column-parallel fc1 [10,6] -> relu -> row-parallel fc2 [6,10] -> column-parallel
  // head [11,6] (vocab-parallel logits) -> vocab-parallel cross-entropy. Plain SGD.
  const mat x = random_matrix(8, 6, 20);
  const std::vector<std::int64_t> targets{1, 5, 10, 3, 3, 0, 7, 9};
  const mat w1 = random_matrix(10, 6, 21), w2 = random_matrix(6, 10, 22), w3 = random_matrix(11, 6, 23);
  const row b1 = random_row(10, 24), b2 = random_row(6, 25), b3 = random_row(11, 26);
  constexpr int steps = 6;
  constexpr double lr = 0.5;

  // Single rank, written out: forward, backward, update.
  std::vector<double> ref_curve;
  mat W1 = w1, W2 = w2, W3 = w3;
  row B1 = b1, B2 = b2, B3 = b3;
  for (int s = 0; s < steps; ++s) {
    const mat h_pre = (x * W1.transpose()).rowwise() + B1;
    const mat h = h_pre.cwiseMax(0.0);
    const mat z = (h * W2.transpose()).rowwise() + B2;
    const mat logits = (z * W3.transpose()).rowwise() + B3;
    mat g(8, 11);
    double loss = 0;
    for (int i = 0; i < 8; ++i) {
      const double m = logits.row(i).maxCoeff();
      const double sum = (logits.row(i).array() - m).exp().sum();
      loss += std::log(sum) + m - logits(i, targets[static_cast<std::size_t>(i)]);
      g.row(i) = (logits.row(i).array() - m).exp().matrix() / sum;
      g(i, targets[static_cast<std::size_t>(i)]) -= 1.0;
    }
    ref_curve.push_back(loss / 8.0);
    g /= 8.0;
    const mat dz = g * W3;
    const mat dh = (dz * W2).cwiseProduct(mat((h_pre.array() > 0.0).cast<double>()));
    W3 -= lr * mat(g.transpose() * z);
    B3 -= lr * row(g.colwise().sum());
    W2 -= lr * mat(dz.transpose() * h);
    B2 -= lr * row(dz.colwise().sum());
    W1 -= lr * mat(dh.transpose() * x);
    B1 -= lr * row(dh.colwise().sum());
  }
  REQUIRE(ref_curve.back() < ref_curve.front());  // it learns something

  failures f;
  run_ranks(4, [&](gloo_communicator& c) {
    auto fc1 = column_parallel_linear<double>::from_full(w1, b1, c.rank(), c.size());
    auto fc2 = row_parallel_linear<double>::from_full(w2, b2, c.rank(), c.size());
    auto head = column_parallel_linear<double>::from_full(w3, b3, c.rank(), c.size());
    vocab_parallel_cross_entropy<double> ce(11, c.rank(), c.size());
    for (int s = 0; s < steps; ++s) {
      fc1.zero_grad();
      fc2.zero_grad();
      head.zero_grad();
      const mat h_pre = fc1.forward(c, x);
      const mat h = h_pre.cwiseMax(0.0);
      const mat z = fc2.forward(c, h);
      const double loss = ce.forward(c, head.forward(c, z), targets);
      f.check(std::abs(loss - ref_curve[static_cast<std::size_t>(s)]) < 1e-10, c.rank(),
              "step " + std::to_string(s) + " loss " + std::to_string(loss) + " vs " +
                  std::to_string(ref_curve[static_cast<std::size_t>(s)]));
      const mat dz = head.backward(c, ce.backward());
      const mat dh = fc2.backward(c, dz).cwiseProduct(mat((h_pre.array() > 0.0).cast<double>()));
      fc1.backward(c, dh);
      for (auto* l : {&fc1, &head}) {
        l->weight -= lr * l->grad_weight;
        l->bias -= lr * l->grad_bias;
      }
      fc2.weight -= lr * fc2.grad_weight;
      fc2.bias -= lr * fc2.grad_bias;
    }
    const dim_range r = split_range(10, 4, c.rank());
    f.check(max_diff(fc1.weight, W1.middleRows(r.offset, r.size)) < 1e-10, c.rank(), "trained fc1 rows");
    f.check(max_diff(fc2.weight, W2.middleCols(r.offset, r.size)) < 1e-10, c.rank(), "trained fc2 columns");
    f.check(max_diff(fc2.bias, B2) < 1e-10, c.rank(), "trained fc2 bias");
  });
  f.report();
}
