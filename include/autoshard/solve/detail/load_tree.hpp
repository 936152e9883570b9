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
    return {max_[1], first_max_leaf(1)};
  }

  /// Largest value over [a, b) and the first time point in it holding it, in O(log T)
  /// ({lowest, a} when empty).
  std::pair<int128, std::size_t> argmax(std::size_t a, std::size_t b) const {
    b = std::min(b, n_);
    if (a >= b) return {lowest(), a};
    return argmax(1, 0, size_, a, b);
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

  /// The first leaf under `node` holding the subtree's largest value (max_[node]).
  std::size_t first_max_leaf(std::size_t i) const {
    while (i < size_) i = max_[2 * i] >= max_[2 * i + 1] ? 2 * i : 2 * i + 1;  // the parent's add is common to both
    return i - size_;
  }

  std::pair<int128, std::size_t> argmax(std::size_t node, std::size_t lo, std::size_t hi, std::size_t a,
                                        std::size_t b) const {
    if (a <= lo && hi <= b) return {max_[node], first_max_leaf(node)};
    const std::size_t mid = (lo + hi) / 2;
    std::pair<int128, std::size_t> best{lowest(), a};
    bool any = false;
    if (a < mid) best = argmax(2 * node, lo, mid, a, b), any = true;
    if (mid < b) {
      const std::pair<int128, std::size_t> right = argmax(2 * node + 1, mid, hi, a, b);
      if (!any || right.first > best.first) best = right;
    }
    best.first += add_[node];
    return best;
  }

  int128 max(std::size_t node, std::size_t lo, std::size_t hi, std::size_t a, std::size_t b) const {
    if (b <= lo || hi <= a) return lowest();
    if (a <= lo && hi <= b) return max_[node];
    const std::size_t mid = (lo + hi) / 2;
    return std::max(max(2 * node, lo, mid, a, b), max(2 * node + 1, mid, hi, a, b)) + add_[node];
  }
};

}  // namespace autoshard::detail
