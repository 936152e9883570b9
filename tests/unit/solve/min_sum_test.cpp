// Variable elimination (detail/min_sum.hpp) against exhaustive enumeration on small pairwise
// problems with cycles, parallel links and forbidden entries: the answer it returns must cost
// exactly the enumerated minimum, whatever the elimination order.
#include <doctest/doctest.h>

#include <autoshard/solve/detail/min_sum.hpp>

#include <algorithm>
#include <cstddef>
#include <random>
#include <utility>
#include <vector>

namespace {

namespace ad = autoshard::detail;

ad::wcost min_sum_total(const ad::min_sum_problem& pb, const std::vector<std::size_t>& val) {
  ad::wcost t = 0;
  for (std::size_t v = 0; v < pb.size.size(); ++v) t = ad::wadd(t, pb.unary[v][val[v]]);
  for (const ad::min_sum_problem::pair_table& pt : pb.pairs) t = ad::wadd(t, pt.m[val[pt.a] * pb.size[pt.b] + val[pt.b]]);
  return t;
}

ad::wcost min_sum_brute(const ad::min_sum_problem& pb) {
  std::vector<std::size_t> val(pb.size.size(), 0);
  ad::wcost best = ad::forbidden;
  for (;;) {
    best = std::min(best, min_sum_total(pb, val));
    std::size_t v = 0;
    for (; v < val.size(); ++v) {
      if (++val[v] < pb.size[v]) break;
      val[v] = 0;
    }
    if (v == val.size()) return best;
  }
}

}  // namespace

TEST_CASE("min-sum elimination: exact on random graphs with cycles and forbidden entries") {
  std::mt19937 rng(2718);
  std::uniform_int_distribution<int> cost(0, 40), coin(0, 99);
  int cyclic = 0;
  for (int round = 0; round < 300; ++round) {
    CAPTURE(round);
    ad::min_sum_problem pb;
    const std::size_t n = std::uniform_int_distribution<std::size_t>(1, 7)(rng);
    for (std::size_t v = 0; v < n; ++v) {
      pb.size.push_back(std::uniform_int_distribution<std::size_t>(1, 4)(rng));
      std::vector<ad::wcost> u;
      for (std::size_t i = 0; i < pb.size[v]; ++i) u.push_back(coin(rng) < 5 ? ad::forbidden : cost(rng));
      pb.unary.push_back(u);
    }
    // A random graph: up to 2n links, parallel ones included (a cycle is likely beyond n - 1).
    const std::size_t links = n < 2 ? 0 : std::uniform_int_distribution<std::size_t>(0, 2 * n)(rng);
    std::vector<std::pair<std::size_t, std::size_t>> ab;
    std::vector<std::vector<ad::wcost>> tables(links);  // the pairs' tables (pair_table only points at them)
    for (std::size_t l = 0; l < links; ++l) {
      std::size_t a = std::uniform_int_distribution<std::size_t>(0, n - 1)(rng), b = a;
      while (b == a) b = std::uniform_int_distribution<std::size_t>(0, n - 1)(rng);
      ad::min_sum_problem::pair_table pt;
      pt.a = a;
      pt.b = b;
      for (std::size_t k = 0; k < pb.size[a] * pb.size[b]; ++k) tables[l].push_back(coin(rng) < 10 ? ad::forbidden : cost(rng));
      pt.m = tables[l];
      pb.pairs.push_back(pt);
      ab.emplace_back(a, b);
    }
    cyclic += links >= n ? 1 : 0;
    const ad::elimination_plan plan = ad::plan_elimination(pb.size, ab);
    REQUIRE(plan.order.size() == n);
    std::vector<std::size_t> seen = plan.order;
    std::sort(seen.begin(), seen.end());
    for (std::size_t v = 0; v < n; ++v) CHECK(seen[v] == v);
    const std::vector<std::size_t> val = ad::solve_min_sum(pb, plan);
    REQUIRE(val.size() == n);
    for (std::size_t v = 0; v < n; ++v) CHECK(val[v] < pb.size[v]);
    const ad::wcost want = min_sum_brute(pb);
    CHECK(static_cast<double>(min_sum_total(pb, val)) == static_cast<double>(want));
    // Any order is exact too (only the work changes): the reverse of the greedy one.
    ad::elimination_plan rev = plan;
    std::reverse(rev.order.begin(), rev.order.end());
    CHECK(static_cast<double>(min_sum_total(pb, ad::solve_min_sum(pb, rev))) == static_cast<double>(want));
  }
  CHECK(cyclic > 50);
}

TEST_CASE("min-sum elimination: the plan's work on a tree and on a cycle") {
  // A path 0 - 1 - 2 with 3, 5, 7 values: the cheaper leaf first (3*5), then 1 and 2 tie at
  // 5*7 and the lower index goes (35), then 2 alone (7).
  const ad::elimination_plan path = ad::plan_elimination({3, 5, 7}, {{0, 1}, {1, 2}});
  CHECK(path.order == std::vector<std::size_t>{0, 1, 2});
  CHECK(path.work == doctest::Approx(3 * 5 + 5 * 7 + 7));
  // The same path in a given order: 2 first (7*5), then 1 (5*3), then 0 (3).
  const ad::elimination_plan given = ad::plan_in_order({3, 5, 7}, {{0, 1}, {1, 2}}, {2, 1, 0});
  CHECK(given.work == doctest::Approx(7 * 5 + 5 * 3 + 3));
  // Eliminating the middle of the path first links its ends: 5*3*7, then 3*7, then 7.
  CHECK(ad::plan_in_order({3, 5, 7}, {{0, 1}, {1, 2}}, {1, 0, 2}).work == doctest::Approx(105 + 21 + 7));
  // A 4-cycle of 2-value variables: the first elimination links its two neighbours (2*2*2),
  // leaving a triangle (2*2*2), then a pair (2*2), then one (2).
  const ad::elimination_plan ring = ad::plan_elimination({2, 2, 2, 2}, {{0, 1}, {1, 2}, {2, 3}, {3, 0}});
  CHECK(ring.work == doctest::Approx(8 + 8 + 4 + 2));
}
