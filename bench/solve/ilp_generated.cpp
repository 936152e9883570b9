// Solver-level instances of XLA size (the IOPDDL contest's shape): ~800 nodes, ~1,100 edges,
// ~250,000 pair variables before reduction, with a usage limit. Costs come from "specs": each
// strategy of a node carries one of K labels, edges price label changes with a random metric
// (resharding-like: zero on the diagonal), node costs and usages depend on the label (compute
// and shard factor). Prints the ILP size after each reduction, time to optimum and the bound;
// then the naive MASE-style formulation (no reductions, AND linearisation, all memory rows up
// front) on the same GLPK under a time limit, and the ratio.
//   ./bench_solve_ilp_generated [--benchmark_filter=...]   env AUTOSHARD_BENCH_NAIVE_LIMIT=seconds
#include <benchmark/benchmark.h>

#include <autoshard/solve/solve.hpp>

#include <cstdlib>
#include <iostream>
#include <random>

namespace {

autoshard::strategy_problem generated(unsigned seed, int n_nodes, int n_edges, int max_strategies, bool limit) {
  std::mt19937 rng(seed);
  constexpr int K = 8;  // spec labels
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  double metric[K][K];
  for (int a = 0; a < K; ++a)
    for (int b = 0; b < K; ++b) metric[a][b] = a == b ? 0.0 : 0.2 + unit(rng);
  double shard[K];
  for (int a = 0; a < K; ++a) shard[a] = 1 << (a % 4);
  autoshard::strategy_problem p;
  p.name = "generated-" + std::to_string(seed);
  std::vector<std::vector<int>> labels(static_cast<std::size_t>(n_nodes));
  std::uniform_int_distribution<int> ns(max_strategies / 2, max_strategies), lab(0, K - 1), len(1, 60);
  for (int v = 0; v < n_nodes; ++v) {
    autoshard::strategy_node node;
    node.name = "op" + std::to_string(v);
    const double size = 1.0 + 9.0 * unit(rng);
    const int k = ns(rng);
    for (int i = 0; i < k; ++i) {
      const int l = lab(rng);
      labels[static_cast<std::size_t>(v)].push_back(l);
      node.costs.push_back(std::round(1000.0 * size / shard[l] * (1.0 + 0.3 * unit(rng))));
      node.usages.push_back(static_cast<std::int64_t>(1e6 * size / shard[l]));
    }
    node.live = {v, v + len(rng)};
    p.nodes.push_back(std::move(node));
  }
  // A chain plus skip edges to recent nodes: a DAG shaped like a layered model.
  std::uniform_int_distribution<int> back(2, 40);
  for (int e = 0; e < n_edges; ++e) {
    const int to = e < n_nodes - 1 ? e + 1 : 1 + static_cast<int>(rng() % static_cast<unsigned>(n_nodes - 1));
    const int from = e < n_nodes - 1 ? e : std::max(0, to - back(rng));
    autoshard::strategy_edge ed{static_cast<std::size_t>(from), static_cast<std::size_t>(to), {}};
    const double bytes = 1.0 + 20.0 * unit(rng);
    for (int a : labels[static_cast<std::size_t>(from)])
      for (int b : labels[static_cast<std::size_t>(to)]) ed.costs.push_back(std::round(1000.0 * bytes * metric[a][b]));
    p.edges.push_back(std::move(ed));
  }
  if (limit) {  // between the smallest reachable peak and the unconstrained optimum's
    const std::int64_t lo = p.min_peak_usage().bytes;
    const auto free = autoshard::solve_ilp(p, {});
    p.usage_limit = lo + (free.peak.bytes - lo) / 2;
  }
  return p;
}

double naive_limit() {
  const char* s = std::getenv("AUTOSHARD_BENCH_NAIVE_LIMIT");
  return s ? std::atof(s) : 60.0;
}

void report(benchmark::State& state, const autoshard::solve_result& r) {
  state.counters["objective"] = r.objective;
  state.counters["bound"] = r.bound;
  state.counters["gap"] = r.gap;
  state.counters["vars_in"] = static_cast<double>(r.sizes.front().variables);
  state.counters["vars_ilp"] = static_cast<double>(r.sizes.back().variables);
  state.counters["rows_ilp"] = static_cast<double>(r.sizes.back().rows);
  state.counters["mem_rows"] = static_cast<double>(r.memory_rows);
  state.counters["rounds"] = r.rounds;
}

void BM_generated_reduced(benchmark::State& state) {
  const auto p = generated(static_cast<unsigned>(state.range(0)), 800, 1100, 20, state.range(1) != 0);
  autoshard::solve_result r;
  for (auto _ : state) r = autoshard::solve_ilp(p, {});
  report(state, r);
  std::cout << p.name << (p.usage_limit ? " (usage limit)" : "") << ":\n" << r;
}

void BM_generated_naive(benchmark::State& state) {
  const auto p = generated(static_cast<unsigned>(state.range(0)), 800, 1100, 20, state.range(1) != 0);
  autoshard::solve_options o;
  o.reduce = false;
  o.formulation = autoshard::ilp_formulation::naive_and;
  o.lazy_memory = false;
  o.time_limit = naive_limit();
  autoshard::solve_result r;
  for (auto _ : state) {
    try {
      r = autoshard::solve_ilp(p, o);
    } catch (const autoshard::solver_error& e) {
      state.SkipWithError(e.what());
      std::cout << p.name << " naive: " << e.what() << "\n";
      return;
    }
  }
  report(state, r);
  std::cout << p.name << (p.usage_limit ? " (usage limit)" : "") << " naive:\n" << r;
}

}  // namespace

BENCHMARK(BM_generated_reduced)->Args({1, 0})->Args({1, 1})->Args({2, 1})->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();
BENCHMARK(BM_generated_naive)->Args({1, 0})->Args({1, 1})->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();

BENCHMARK_MAIN();
