// Graph build and strategy enumeration time for GPT-2 1.5B and the LLaMA-70B shape on
// 2x4 and 8x8 meshes, plus the edge resharding matrices a solver needs. Before the timings
// it prints how many strategies each operator kind gets on each mesh.
//   ./bench_graph_strategies --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <autoshard/graph/graph.hpp>

#include <cstdio>
#include <map>

namespace {
using namespace autoshard;

// Inference (forward only), as the numbers in docs/performance.md were measured.
const strategy_options forward{step_pricing{device_model{}, run_mode::inference}};

model_graph build(int which) {
  transformer_config c = which == 0 ? transformer_config::gpt2_1_5b() : transformer_config::llama_70b();
  c.mode = forward.pricing.mode;
  return which == 0 ? build_gpt2(c) : build_llama(c);
}
const char* model_name(int which) { return which == 0 ? "gpt2-1.5b" : "llama-70b"; }
device_mesh mesh(int which) { return which == 0 ? make_mesh_2d(2, 4, 25e9, 300e9) : make_mesh_2d(8, 8, 25e9, 300e9); }
const char* mesh_name(int which) { return which == 0 ? "2x4" : "8x8"; }

void BM_build(benchmark::State& st) {
  for (auto _ : st) {
    model_graph g = build(static_cast<int>(st.range(0)));
    benchmark::DoNotOptimize(boost::num_vertices(g));
  }
  st.SetLabel(model_name(static_cast<int>(st.range(0))));
}
BENCHMARK(BM_build)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

void BM_enumerate(benchmark::State& st) {
  const model_graph g = build(static_cast<int>(st.range(0)));
  const device_mesh m = mesh(static_cast<int>(st.range(1)));
  std::size_t total = 0;
  for (auto _ : st) {
    auto all = enumerate_all_strategies(g, m, forward);
    total = 0;
    for (const auto& s : all) total += s.size();
    benchmark::DoNotOptimize(total);
  }
  st.counters["vertices"] = static_cast<double>(boost::num_vertices(g));
  st.counters["strategies"] = static_cast<double>(total);
  st.SetLabel(std::string(model_name(static_cast<int>(st.range(0)))) + " on " + mesh_name(static_cast<int>(st.range(1))));
}
BENCHMARK(BM_enumerate)->Args({0, 0})->Args({0, 1})->Args({1, 0})->Args({1, 1})->Unit(benchmark::kMillisecond);

// Every edge's resharding matrix: what the ILP reads after enumeration.
void BM_edge_costs(benchmark::State& st) {
  const model_graph g = build(static_cast<int>(st.range(0)));
  const device_mesh m = mesh(static_cast<int>(st.range(1)));
  const auto all = enumerate_all_strategies(g, m, forward);
  std::size_t entries = 0;
  for (auto _ : st) {
    entries = 0;
    for (auto [it, end] = boost::edges(g); it != end; ++it) {
      const cost_matrix c = resharding_costs(g, *it, all[boost::source(*it, g)], all[boost::target(*it, g)], m, forward);
      entries += c.values.size();
    }
    benchmark::DoNotOptimize(entries);
  }
  st.counters["matrix_entries"] = static_cast<double>(entries);
  st.SetLabel(std::string(model_name(static_cast<int>(st.range(0)))) + " on " + mesh_name(static_cast<int>(st.range(1))));
}
BENCHMARK(BM_edge_costs)->Args({0, 0})->Args({0, 1})->Args({1, 0})->Args({1, 1})->Unit(benchmark::kMillisecond);

void print_strategy_counts() {
  for (int which = 0; which < 2; ++which) {
    const model_graph g = build(which);
    for (int mi = 0; mi < 2; ++mi) {
      const auto all = enumerate_all_strategies(g, mesh(mi), forward);
      std::map<std::string, std::pair<std::size_t, std::size_t>> per_kind;  // kind -> (min, max)
      std::map<std::string, std::size_t> vertices;
      for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
        const std::string k(to_string(g[v].kind));
        auto [it, fresh] = per_kind.try_emplace(k, all[v].size(), all[v].size());
        it->second.first = std::min(it->second.first, all[v].size());
        it->second.second = std::max(it->second.second, all[v].size());
        ++vertices[k];
      }
      std::printf("%s on %s: strategies per vertex by kind (min..max, vertices)\n", model_name(which), mesh_name(mi));
      for (const auto& [k, mm] : per_kind)
        std::printf("  %-14s %3zu..%-3zu (%zu)\n", k.c_str(), mm.first, mm.second, vertices[k]);
    }
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  print_strategy_counts();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
