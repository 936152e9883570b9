// A custom training loop: a two-layer MLP, column-parallel then row-parallel (Megatron's
// split), trained with SGD on 4 Gloo ranks (threads over loopback TCP). The same model is
// trained on one rank alongside; the loss curves must agree.
//   build/gcc/examples/example_mlp_training
#include <autoshard/exec/parallel.hpp>
#include <autoshard/gloo/gloo.hpp>

#include <cmath>
#include <cstdio>
#include <mutex>
#include <random>
#include <vector>

using namespace autoshard;
using mat = tp_matrix<double>;
using row = tp_row<double>;

struct data {
  mat x, y, w1, w2;
  row b1, b2;
};

// Inputs, targets and initial weights, the same for every rank.
data make_data(int batch, int in, int hidden, int out) {
  std::mt19937 rng(7);
  std::normal_distribution<double> n(0.0, 1.0);
  auto fill = [&](mat& m, int r, int c, double s) {
    m.resize(r, c);
    for (int i = 0; i < r; ++i)
      for (int j = 0; j < c; ++j) m(i, j) = s * n(rng);
  };
  data d;
  fill(d.x, batch, in, 1.0);
  mat teacher;
  fill(teacher, out, in, 0.5);
  d.y = (d.x * teacher.transpose()).array().tanh().matrix();
  fill(d.w1, hidden, in, 1.0 / std::sqrt(in));
  fill(d.w2, out, hidden, 1.0 / std::sqrt(hidden));
  d.b1 = row::Zero(hidden);
  d.b2 = row::Zero(out);
  return d;
}

mat relu(const mat& a) { return a.cwiseMax(0.0); }
mat relu_grad(const mat& a, const mat& g) { return (a.array() > 0.0).select(g, 0.0); }
double mse(const mat& p, const mat& y) { return (p - y).squaredNorm() / static_cast<double>(p.size()); }

int main() {
  const int batch = 32, in = 16, hidden = 64, out = 8, steps = 25, ranks = 4;
  const double lr = 0.05;
  const data d = make_data(batch, in, hidden, out);

  // One rank: plain Eigen.
  std::vector<double> reference;
  {
    mat w1 = d.w1, w2 = d.w2;
    row b1 = d.b1, b2 = d.b2;
    for (int s = 0; s < steps; ++s) {
      const mat h = (d.x * w1.transpose()).rowwise() + b1;
      const mat a = relu(h);
      const mat p = (a * w2.transpose()).rowwise() + b2;
      reference.push_back(mse(p, d.y));
      const mat dp = 2.0 * (p - d.y) / static_cast<double>(p.size());
      const mat dh = relu_grad(h, dp * w2);
      w2 -= lr * dp.transpose() * a;
      b2 -= lr * dp.colwise().sum();
      w1 -= lr * dh.transpose() * d.x;
      b1 -= lr * dh.colwise().sum();
    }
  }

  // Four ranks: fc1 column-parallel (16 hidden units each), fc2 row-parallel.
  std::vector<double> parallel(steps);
  std::mutex m;
  run_ranks(ranks, [&](gloo_communicator& c) {
    auto fc1 = column_parallel_linear<double>::from_full(d.w1, d.b1, c.rank(), c.size());
    auto fc2 = row_parallel_linear<double>::from_full(d.w2, d.b2, c.rank(), c.size());
    for (int s = 0; s < steps; ++s) {
      fc1.zero_grad();
      fc2.zero_grad();
      const mat h = fc1.forward(c, d.x);      // [batch, hidden/4], this rank's units
      const mat p = fc2.forward(c, relu(h));  // [batch, out], all-reduced: the same everywhere
      if (c.rank() == 0) {
        std::lock_guard<std::mutex> lock(m);
        parallel[static_cast<std::size_t>(s)] = mse(p, d.y);
      }
      const mat dp = 2.0 * (p - d.y) / static_cast<double>(p.size());
      fc1.backward(c, relu_grad(h, fc2.backward(c, dp)));
      fc2.weight -= lr * fc2.grad_weight;
      fc2.bias -= lr * fc2.grad_bias;
      fc1.weight -= lr * fc1.grad_weight;
      fc1.bias -= lr * fc1.grad_bias;
    }
  });

  double worst = 0.0;
  std::printf("step   1 rank      4 ranks (tensor-parallel)\n");
  for (int s = 0; s < steps; ++s) {
    worst = std::max(worst, std::abs(reference[static_cast<std::size_t>(s)] - parallel[static_cast<std::size_t>(s)]));
    if (s % 5 == 0 || s == steps - 1)
      std::printf("%4d   %.8f  %.8f\n", s, reference[static_cast<std::size_t>(s)], parallel[static_cast<std::size_t>(s)]);
  }
  std::printf("largest difference of the loss curves: %.3g\n", worst);
  const bool learned = parallel.back() < 0.5 * parallel.front();
  return worst < 1e-9 && learned ? 0 : 1;
}
