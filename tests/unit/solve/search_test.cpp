// The parallel anytime search of solve_ilp: answers never worse with more threads or more work,
// the same answer for the same seed and thread count, and every stop reason.
#include <autoshard/solve/solve.hpp>

#include <doctest/doctest.h>

#include <sched.h>

#include <random>
#include <string>
#include <thread>
#include <vector>

using autoshard::solve_ilp;
using autoshard::solve_options;
using autoshard::stop_reason;
using autoshard::strategy_problem;

namespace {

/// A grid of `side` x `side` nodes of 4 strategies, random node and edge costs (seeded), every
/// node live at every time point and a usage limit that binds (about half the largest total).
strategy_problem memory_grid(int side, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::int64_t> cost(0, 100), use(1, 10);
  strategy_problem p;
  std::int64_t top = 0, low = 0;
  for (int v = 0; v < side * side; ++v) {
    autoshard::strategy_node n;
    std::int64_t hi = 0, lo = 1000;
    for (int i = 0; i < 4; ++i) {
      n.costs.push_back(cost(rng));
      n.usages.push_back(use(rng));
      hi = std::max(hi, n.usages.back());
      lo = std::min(lo, n.usages.back());
    }
    n.live = {0, 4};
    top += hi;
    low += lo;
    p.nodes.push_back(n);
  }
  const auto edge = [&](int a, int b) {
    autoshard::strategy_edge e{static_cast<std::size_t>(a), static_cast<std::size_t>(b), {}};
    for (int k = 0; k < 16; ++k) e.costs.push_back(cost(rng));
    p.edges.push_back(e);
  };
  for (int r = 0; r < side; ++r)
    for (int q = 0; q < side; ++q) {
      if (q + 1 < side) edge(r * side + q, r * side + q + 1);
      if (r + 1 < side) edge(r * side + q, (r + 1) * side + q);
    }
  p.usage_limit = (top + low) / 2;
  return p;
}

/// The search alone (no ILP), a fixed number of rounds per thread, no time pressure.
solve_options search_only(int threads, std::size_t rounds, unsigned seed = 7) {
  solve_options o;
  o.exact = false;
  o.threads = threads;
  o.work_limit = rounds;
  o.stall_rounds = 0;
  o.seed = seed;
  o.time_limit = 300;
  o.heuristic_share = 0.0;  // thread 0's greedy start only: the rounds do the work
  return o;
}

}  // namespace

TEST_CASE("search: more threads or more rounds never give a worse answer, and a seed and thread count give one answer") {
  const strategy_problem p = memory_grid(6, 11);
  solve_options exact;
  exact.threads = 1;
  const autoshard::solve_result best = solve_ilp(p, exact);  // the optimum, proven
  REQUIRE(best.stop == stop_reason::optimal);

  for (const std::size_t rounds : {1u, 3u, 9u}) {
    autoshard::solve_result one = solve_ilp(p, search_only(1, rounds));
    autoshard::solve_result two = solve_ilp(p, search_only(2, rounds));
    autoshard::solve_result three = solve_ilp(p, search_only(3, rounds));
    CAPTURE(rounds);
    for (const autoshard::solve_result* r : {&one, &two, &three}) {
      const autoshard::evaluation ev = p.evaluate(r->choice);
      REQUIRE(ev.feasible);
      CHECK(ev.objective == r->objective);
      CHECK(r->objective >= best.objective);
      CHECK(r->bound <= best.objective);
      CHECK(r->stop != stop_reason::time_limit);
    }
    CHECK(two.objective <= one.objective);
    CHECK(three.objective <= two.objective);
    CHECK(two.threads == 2);
    // The same seed and thread count: the same answer, choice for choice.
    const autoshard::solve_result again = solve_ilp(p, search_only(2, rounds));
    CHECK(again.objective == two.objective);
    CHECK(again.choice == two.choice);
    CHECK(again.search_rounds == two.search_rounds);
  }
  // More rounds, same seed and threads: never worse.
  std::int64_t last = std::numeric_limits<std::int64_t>::max();
  for (const std::size_t rounds : {1u, 2u, 4u, 8u, 16u}) {
    const autoshard::solve_result r = solve_ilp(p, search_only(2, rounds));
    CHECK(r.objective <= last);
    last = r.objective;
  }
}

TEST_CASE("search: every stop reason, said in words") {
  // An odd cycle that penalises equal neighbours: the optimum pays one edge (cost 5), which no
  // spanning tree's bound sees; the memory limit binds (the three 2s do not fit in 5).
  strategy_problem p;
  for (int v = 0; v < 3; ++v) p.nodes.push_back({"n" + std::to_string(v), {0, 0}, {1, 2}, {0, 1}});
  for (int v = 0; v < 3; ++v) p.edges.push_back({static_cast<std::size_t>(v), static_cast<std::size_t>((v + 1) % 3), {5, 0, 0, 5}});
  p.usage_limit = 5;

  solve_options o;
  o.threads = 2;
  autoshard::solve_result r = solve_ilp(p, o);
  CHECK(r.objective == 5);
  CHECK(r.stop == stop_reason::optimal);
  CHECK(r.stopped.find("proven optimal") != std::string::npos);

  // The search alone cannot prove it (its bound is a spanning tree's): it stops for other reasons.
  o.exact = false;
  o.threads = 2;
  o.stall_rounds = 3;
  r = solve_ilp(p, o);
  CHECK(r.objective == 5);
  CHECK(r.bound < 5);
  CHECK(r.stop == stop_reason::stalled);
  CHECK(r.stopped.find("no improvement possible under the method") != std::string::npos);
  CHECK(r.seconds < o.time_limit);

  o.stall_rounds = 0;
  o.work_limit = 2;
  r = solve_ilp(p, o);
  CHECK(r.stop == stop_reason::work_limit);
  CHECK(r.stopped.find("work_limit of 2 rounds") != std::string::npos);
  CHECK(r.search_rounds == 4);  // two threads, two rounds each

  o.work_limit = 0;
  o.time_limit = 0.2;
  r = solve_ilp(p, o);
  CHECK(r.stop == stop_reason::time_limit);
  CHECK(r.stopped.find("time_limit of 0.2 s reached") != std::string::npos);
  // It searched until the time limit less what freeing its tables is charged (2 us an item).
  const double wind_down = autoshard::detail::wind_down_seconds(autoshard::detail::solver_size_of(p), 0.2);
  CHECK(wind_down == doctest::Approx(2e-6 * static_cast<double>(p.nodes.size() + p.edges.size())));
  CHECK(r.seconds >= 0.2 - wind_down);

  o.time_limit = 60;
  o.work_limit = 2;
  o.mip_rel_gap = 1.0;  // any answer is within 100% of a bound >= 0
  r = solve_ilp(p, o);
  CHECK(r.stop == stop_reason::gap_reached);
  CHECK(r.stopped.find("mip_rel_gap 1 reached") != std::string::npos);
}

TEST_CASE("search: once the search on thread 0 stalls, the LP relaxation cut off at its share goes on and proves") {
  // The odd cycle of the stop-reason test: the search's bound (a spanning tree's) cannot prove
  // its answer, the LP relaxation with its memory row can.
  strategy_problem p;
  for (int v = 0; v < 3; ++v) p.nodes.push_back({"n" + std::to_string(v), {0, 0}, {1, 2}, {0, 1}});
  for (int v = 0; v < 3; ++v) p.edges.push_back({static_cast<std::size_t>(v), static_cast<std::size_t>((v + 1) % 3), {5, 0, 0, 5}});
  p.usage_limit = 5;

  for (const int threads : {1, 2}) {
    CAPTURE(threads);
    solve_options o;
    o.threads = threads;
    o.relaxation_share = 0.0;  // the LP relaxation gets no time before the search
    o.stall_rounds = 3;
    o.time_limit = 60;
    const autoshard::solve_result r = solve_ilp(p, o);
    CHECK(r.stop == stop_reason::optimal);
    CHECK(r.objective == 5);
    CHECK(r.bound == 5);
    CHECK(p.evaluate(r.choice).objective == 5);
    CHECK(r.search_rounds >= 3);  // the search ran first, and stalled
    CHECK(r.seconds < 30);
  }
  // A search that does not stall keeps thread 0 to its work limit: no proof.
  solve_options o;
  o.threads = 1;
  o.relaxation_share = 0.0;
  o.stall_rounds = 0;
  o.work_limit = 2;
  const autoshard::solve_result r = solve_ilp(p, o);
  CHECK(r.stop == stop_reason::work_limit);
  CHECK(r.bound < 5);
  CHECK(r.stopped.find("relaxation_share (0) of the time_limit") != std::string::npos);
  CHECK(r.search_rounds == 2);

  o.relaxation_share = 1.5;
  CHECK_THROWS_WITH_AS(solve_ilp(p, o), "solver error: relaxation_share must be in [0, 1], got 1.5",
                       autoshard::solver_error);
}

TEST_CASE("search: progress shows exact incumbents that never rise and bounds that never pass the final one") {
  const strategy_problem p = memory_grid(5, 3);
  solve_options o;
  o.threads = 2;
  o.progress_interval = 0.0;
  std::vector<autoshard::solve_progress> seen;
  o.on_progress = [&](const autoshard::solve_progress& pr) { seen.push_back(pr); };
  const autoshard::solve_result r = solve_ilp(p, o);
  REQUIRE(!seen.empty());
  for (std::size_t i = 0; i < seen.size(); ++i) {
    CAPTURE(i);
    CHECK(!seen[i].phase.empty());
    CHECK(seen[i].bound <= static_cast<double>(r.bound));
    CHECK(seen[i].bound <= seen[i].incumbent);
    if (i > 0) CHECK(seen[i].incumbent <= seen[i - 1].incumbent);
  }
  CHECK(seen.back().incumbent == static_cast<double>(r.objective));
}

TEST_CASE("search: threads is checked before any thread starts") {
  const strategy_problem p = memory_grid(2, 1);
  solve_options o;
  o.threads = -1;
  CHECK_THROWS_WITH_AS(solve_ilp(p, o), doctest::Contains("threads must be 0"), autoshard::solver_error);
  o.threads = 5000;
  CHECK_THROWS_WITH_AS(solve_ilp(p, o), doctest::Contains("got 5000"), autoshard::solver_error);
}

TEST_CASE("search: threads 0 is the cores this thread may run on (its CPU affinity), not the machine's") {
  cpu_set_t mine;
  CPU_ZERO(&mine);
  REQUIRE(sched_getaffinity(0, sizeof(mine), &mine) == 0);
  CHECK(autoshard::available_cores() == static_cast<unsigned>(CPU_COUNT(&mine)));
  int first = 0;
  while (!CPU_ISSET(first, &mine)) ++first;
  // A thread pinned to one core, as `taskset -c 0` pins a process: one solver thread. (Under
  // LeakSanitizer this also proves that GLPK's environment of a thread that solved and exited
  // is freed: it leaked 5 KiB per thread.)
  unsigned cores = 0;
  int threads = 0, solved_with = 0;
  std::thread pinned([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    if (sched_setaffinity(0, sizeof(one), &one) != 0) return;
    cores = autoshard::available_cores();
    threads = autoshard::solver_threads(0);
    solved_with = solve_ilp(memory_grid(2, 1), solve_options{}).threads;
  });
  pinned.join();
  CHECK(cores == 1);
  CHECK(threads == 1);
  CHECK(solved_with == 1);
  CHECK(autoshard::solver_threads(3) == 3);  // asked for: as asked
}
