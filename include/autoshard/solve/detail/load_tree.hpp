#pragma once
// The summed usage at every candidate time point, as a segment tree: add a value over a range
// of time points and ask the largest value over a range, each in O(log T), exactly (128 bits).
#include <algorithm>  // std::max
#include <cstddef>    // std::size_t
#include <utility>    // std::pair
#include <vector>     // std::vector

#include "../problem.hpp"  // int128

namespace autoshard::detail {

class load_tree {
 public:
  load_tree() = default;
  /// Leaves start at `values`.
  explicit load_tree(const std::vector<int128>& values) : n_(values.size()) {
    size_ = 1;
    while (size_ < n_) size_ *= 2;
    max_.assign(2 * size_, lowest());
    add_.assign(2 * size_, 0);
    for (std::size_t i = 0; i < n_; ++i) max_[size_ + i] = values[i];
    for (std::size_t i = size_ - 1; i >= 1; --i) max_[i] = std::max(max_[2 * i], max_[2 * i + 1]);
  }

  std::size_t size() const { return n_; }

  /// Add `d` to every time point in [a, b).
  void add(std::size_t a, std::size_t b, int128 d) {
    if (a < b && d != 0) add(1, 0, size_, a, b, d);
  }

  /// Largest value over [a, b) (the lowest int128 when empty).
  int128 max(std::size_t a, std::size_t b) const { return a < b ? max(1, 0, size_, a, b) : lowest(); }

  /// The value at one time point.
  int128 at(std::size_t t) const { return max(t, t + 1); }

  /// Largest value overall and the first time point holding it.
  std::pair<int128, std::size_t> argmax() const {
    if (n_ == 0) return {lowest(), 0};
    std::size_t i = 1;
    int128 carried = 0;
    while (i < size_) {
      carried += add_[i];
      i = max_[2 * i] + carried >= max_[2 * i + 1] + carried ? 2 * i : 2 * i + 1;
    }
    return {max_[i] + carried, i - size_};
  }

 private:
  std::size_t n_ = 0, size_ = 0;
  std::vector<int128> max_;  // max of the subtree including its own pending add
  std::vector<int128> add_;  // pending add for the whole subtree (already in max_ of that node)

  static int128 lowest() { return -(static_cast<int128>(1) << 120); }

  void add(std::size_t node, std::size_t lo, std::size_t hi, std::size_t a, std::size_t b, int128 d) {
    if (b <= lo || hi <= a) return;
    if (a <= lo && hi <= b) {
      max_[node] += d;
      add_[node] += d;
      return;
    }
    const std::size_t mid = (lo + hi) / 2;
    add(2 * node, lo, mid, a, b, d);
    add(2 * node + 1, mid, hi, a, b, d);
    max_[node] = std::max(max_[2 * node], max_[2 * node + 1]) + add_[node];
  }

  int128 max(std::size_t node, std::size_t lo, std::size_t hi, std::size_t a, std::size_t b) const {
    if (b <= lo || hi <= a) return lowest();
    if (a <= lo && hi <= b) return max_[node];
    const std::size_t mid = (lo + hi) / 2;
    return std::max(max(2 * node, lo, mid, a, b), max(2 * node + 1, mid, hi, a, b)) + add_[node];
  }
};

}  // namespace autoshard::detail
