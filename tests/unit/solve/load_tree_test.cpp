// The local search's load tree (solve/detail/load_tree.hpp) against a plain array: after
// random range additions, every range's largest value and the first time point holding it
// are what a scan finds, including ties, single points and ranges that reach the end.
#include <doctest/doctest.h>

#include <autoshard/solve/detail/load_tree.hpp>

#include <cstddef>
#include <random>
#include <utility>
#include <vector>

namespace {

namespace ad = autoshard::detail;
using autoshard::int128;

/// The largest value over [a, b) and its first index, by a scan.
std::pair<int128, std::size_t> scan_argmax(const std::vector<int128>& v, std::size_t a, std::size_t b) {
  std::pair<int128, std::size_t> best{v[a], a};
  for (std::size_t t = a + 1; t < b; ++t)
    if (v[t] > best.first) best = {v[t], t};
  return best;
}

}  // namespace

TEST_CASE("load_tree: range max and first argmax equal a scan after random range additions") {
  std::mt19937 rng(12345);
  for (std::size_t n : {std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{7}, std::size_t{8}, std::size_t{33}}) {
    std::uniform_int_distribution<int> value(-3, 3);  // small values: many ties
    std::vector<int128> plain(n);
    for (int128& x : plain) x = value(rng);
    ad::load_tree tree(plain);
    std::uniform_int_distribution<std::size_t> point(0, n);
    for (int round = 0; round < 300; ++round) {
      std::size_t a = point(rng), b = point(rng);
      if (a > b) std::swap(a, b);
      const int128 d = value(rng) * (int128{1} << 70);  // beyond 64 bits: the sums are exact
      tree.add(a, b, d);
      for (std::size_t t = a; t < b; ++t) plain[t] += d;
      for (std::size_t x = 0; x < n; ++x)
        for (std::size_t y = x + 1; y <= n; ++y) {
          CAPTURE(n);
          CAPTURE(x);
          CAPTURE(y);
          const auto want = scan_argmax(plain, x, y);
          const auto got = tree.argmax(x, y);
          CHECK(got.first == want.first);
          CHECK(got.second == want.second);
          CHECK(tree.max(x, y) == want.first);
        }
      CHECK(tree.argmax() == scan_argmax(plain, 0, n));
      CHECK(tree.at(n - 1) == plain[n - 1]);
    }
    CHECK(tree.argmax(n, n).second == n);  // empty ranges: the lowest value, at their start
    CHECK(tree.argmax(1, 1).first < -(int128{1} << 100));
  }
}
