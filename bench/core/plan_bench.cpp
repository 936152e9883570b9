// Run-time cost of the core on dynamic specs: planning a redistribution, pricing it, and
// parsing the specs first. Each iteration handles one spec pair, cycling through every valid
// pair of a mesh (R, S(0), S(1), P per axis, tensor [1024, 768] f32), so the numbers are
// per plan, averaged over all the transition kinds.
//   build-release/bench/bench_core_plan_bench --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <autoshard/autoshard.hpp>  // plan_redistribute, price_plan, parse_spec

#include <string>   // std::string
#include <utility>  // std::pair
#include <vector>   // std::vector

namespace as = autoshard;

namespace {

as::device_mesh mesh_of_rank(int n) {
  switch (n) {
    case 1: return as::device_mesh{8};
    case 2: return as::make_mesh_2d(2, 4, 25e9, 300e9);
    default: {
      as::device_mesh m{2, 2, 2};
      m.set_link(0, {2e-5, 25e9}).set_link(1, {5e-6, 300e9}).set_link(2, {5e-6, 600e9});
      return m;
    }
  }
}

/// Every spec of the mesh over R, S(0), S(1), P, and the pairs a plan exists for.
std::vector<std::pair<as::sharding_spec, as::sharding_spec>> valid_pairs(int mesh_rank) {
  const as::placement options[] = {as::Replicate(), as::Shard(0), as::Shard(1), as::Partial()};
  std::vector<as::sharding_spec> specs;
  int total = 1;
  for (int i = 0; i < mesh_rank; ++i) total *= 4;
  for (int code = 0; code < total; ++code) {
    as::sharding_spec s = as::replicated_spec(mesh_rank, 2);
    for (int i = 0, c = code; i < mesh_rank; ++i, c /= 4) s.placements[static_cast<std::size_t>(i)] = options[c % 4];
    specs.push_back(s);
  }
  std::vector<std::pair<as::sharding_spec, as::sharding_spec>> out;
  for (const auto& a : specs)
    for (const auto& b : specs) {
      bool ok = true;
      for (int i = 0; i < mesh_rank; ++i) ok = ok && !(a[static_cast<std::size_t>(i)].is_shard() && b[static_cast<std::size_t>(i)].is_partial());
      if (ok) out.emplace_back(a, b);
    }
  return out;
}

void BM_plan(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const as::device_mesh m = mesh_of_rank(n);
  const auto pairs = valid_pairs(n);
  std::size_t i = 0;
  for (auto _ : state) {
    const auto& [a, b] = pairs[i];
    i = i + 1 == pairs.size() ? 0 : i + 1;
    as::redist_plan p = as::plan_redistribute(m, a, b);
    benchmark::DoNotOptimize(p);
  }
  state.SetItemsProcessed(state.iterations());
  state.SetLabel(std::to_string(pairs.size()) + " pairs");
}

void BM_plan_and_price(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const as::device_mesh m = mesh_of_rank(n);
  const auto pairs = valid_pairs(n);
  const as::tensor_shape shape{1024, 768};
  std::size_t i = 0;
  for (auto _ : state) {
    const auto& [a, b] = pairs[i];
    i = i + 1 == pairs.size() ? 0 : i + 1;
    as::plan_cost c = as::price_plan(m, as::plan_redistribute(m, a, b), shape, as::dtype::f32);
    benchmark::DoNotOptimize(c);
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_parse_plan_and_price(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const as::device_mesh m = mesh_of_rank(n);
  std::vector<std::pair<std::string, std::string>> text;
  for (const auto& [a, b] : valid_pairs(n)) text.emplace_back(as::to_string(a), as::to_alpa_string(b));
  const as::tensor_shape shape{1024, 768};
  std::size_t i = 0;
  for (auto _ : state) {
    const auto& [a, b] = text[i];
    i = i + 1 == text.size() ? 0 : i + 1;
    const auto src = as::parse_spec(a, n, 2), dst = as::parse_spec(b, n, 2);
    as::plan_cost c = as::price_plan(m, as::plan_redistribute(m, src, dst), shape, as::dtype::f32);
    benchmark::DoNotOptimize(c);
  }
  state.SetItemsProcessed(state.iterations());
}

}  // namespace

BENCHMARK(BM_plan)->DenseRange(1, 3)->ArgName("mesh_rank");
BENCHMARK(BM_plan_and_price)->DenseRange(1, 3)->ArgName("mesh_rank");
BENCHMARK(BM_parse_plan_and_price)->DenseRange(1, 3)->ArgName("mesh_rank");

BENCHMARK_MAIN();
