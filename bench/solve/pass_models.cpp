// The auto-sharding pass on full-size models: time to optimality (graph enumeration and edge
// pricing included) and the ILP size, for BERT-base on 2x4, GPT-2 1.5B on 2x4 and a
// LLaMA-70B-shaped model on 8x8 (with and without a memory budget); then the naive MASE-style
// formulation (no reductions, no tying, AND linearisation) of BERT-base under a time limit.
// BM_gpt2_depth and BM_bert_depth sweep the number of layers at GPT-2 1.5B's and BERT-base's
// widths (args: layers, tied), identical layers tied into one ILP node class (tied = 1) or
// each with its own nodes (tied = 0).
//   ./bench_solve_pass_models   env AUTOSHARD_BENCH_NAIVE_LIMIT=seconds (default 60)
//   ./bench_solve_pass_models --benchmark_filter=_depth   (the sweeps scripts/plot_bench.py plots)
#include <benchmark/benchmark.h>

#include <autoshard/pass/pass.hpp>

#include <cstdlib>
#include <iostream>

namespace {

void run(benchmark::State& state, const autoshard::model_graph& g, autoshard::autosharding_options o, const char* what) {
  autoshard::autosharding_result r;
  for (auto _ : state) {
    try {
      r = autoshard::autosharding_analysis_pass(g, o);
    } catch (const autoshard::error& e) {
      state.SkipWithError(e.what());
      std::cout << what << ": " << e.what() << "\n";
      return;
    }
  }
  state.counters["step_s"] = r.report.plan.step_seconds;
  state.counters["ilp_nodes"] = static_cast<double>(r.report.tied_classes);
  state.counters["vars_in"] = static_cast<double>(r.report.solver.sizes.front().variables);
  state.counters["vars_ilp"] = static_cast<double>(r.report.solver.sizes.back().variables);
  state.counters["solve_s"] = r.report.solver.seconds;
  std::cout << what << ":\n" << r.report << r.report.solver;
}

autoshard::autosharding_options opts(std::vector<int> mesh, autoshard::run_mode mode) {
  autoshard::autosharding_options o;
  o.mesh = autoshard::make_cluster_mesh(mesh, {.inter_node_bandwidth = 25e9, .intra_node_bandwidth = 300e9});
  o.pricing.mode = mode;
  o.compare_baselines = false;
  o.time_limit = 600;
  return o;
}

autoshard::transformer_config inference(autoshard::transformer_config c) {
  c.mode = autoshard::run_mode::inference;  // the graph without labels and loss
  return c;
}

void BM_bert_base_2x4(benchmark::State& state) {
  const auto g = autoshard::build_bert(inference(autoshard::transformer_config::bert_base()));
  run(state, g, opts({2, 4}, autoshard::run_mode::inference), "BERT-base 2x4");
}

void BM_gpt2_1_5b_2x4_training(benchmark::State& state) {
  auto c = autoshard::transformer_config::gpt2_1_5b();
  c.mode = autoshard::run_mode::training;
  const auto g = autoshard::build_gpt2(c);
  run(state, g, opts({2, 4}, autoshard::run_mode::training), "GPT-2 1.5B 2x4 training");
}

// Depth sweeps: args (layers, tied); tied = 0 gives every layer its own ILP nodes.
void depth_sweep(benchmark::State& state, autoshard::transformer_config c, bool gpt2, const char* what) {
  c.layers = static_cast<int>(state.range(0));
  const auto g = gpt2 ? autoshard::build_gpt2(c) : autoshard::build_bert(c);
  auto o = opts({2, 4}, c.mode);
  o.tie_layers = state.range(1) != 0;
  state.counters["layers"] = static_cast<double>(c.layers);
  state.counters["operators"] = static_cast<double>(boost::num_vertices(g));
  run(state, g, o, what);
}

void BM_gpt2_depth(benchmark::State& state) {
  auto c = autoshard::transformer_config::gpt2_1_5b();
  c.mode = autoshard::run_mode::training;
  depth_sweep(state, c, true, "GPT-2 1.5B width, training, 2x4, depth sweep");
}

void BM_bert_depth(benchmark::State& state) {
  auto c = autoshard::transformer_config::bert_base();
  c.mode = autoshard::run_mode::inference;
  depth_sweep(state, c, false, "BERT-base width, inference, 2x4, depth sweep");
}

void BM_llama_70b_8x8(benchmark::State& state) {
  const auto g = autoshard::build_llama(inference(autoshard::transformer_config::llama_70b()));
  auto o = opts({8, 8}, autoshard::run_mode::inference);
  if (state.range(0)) o.memory_budget = std::int64_t{40} << 30;  // 40 GiB per device
  run(state, g, o, state.range(0) ? "LLaMA-70B 8x8, 40 GiB budget" : "LLaMA-70B 8x8");
}

void BM_bert_base_2x4_naive(benchmark::State& state) {
  const auto g = autoshard::build_bert(inference(autoshard::transformer_config::bert_base()));
  const char* s = std::getenv("AUTOSHARD_BENCH_NAIVE_LIMIT");
  // The naive formulation through the solver level: the pass's full problem, untied and unreduced.
  autoshard::autosharding_options o = opts({2, 4}, autoshard::run_mode::inference);
  o.tie_layers = false;
  autoshard::detail::pass_model pm(g, o);
  autoshard::solve_options so;
  so.reduce = false;
  so.formulation = autoshard::ilp_formulation::naive_and;
  so.lazy_memory = false;
  so.time_limit = s ? std::atof(s) : 60.0;
  autoshard::solve_result r;
  for (auto _ : state) {
    try {
      r = autoshard::solve_ilp(pm.problem, so);
    } catch (const autoshard::solver_error& e) {
      state.SkipWithError(e.what());
      std::cout << "BERT-base 2x4 naive: " << e.what() << "\n";
      return;
    }
  }
  state.counters["step_s"] = r.objective;
  state.counters["gap"] = r.gap;
  std::cout << "BERT-base 2x4 naive:\n" << r;
}

}  // namespace

BENCHMARK(BM_bert_base_2x4)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();
BENCHMARK(BM_gpt2_1_5b_2x4_training)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();
BENCHMARK(BM_gpt2_depth)
    ->ArgsProduct({{1, 2, 4, 8, 16, 32, 48}, {1, 0}})
    ->ArgNames({"layers", "tied"})
    ->Iterations(1)
    ->Unit(benchmark::kSecond)
    ->UseRealTime();
BENCHMARK(BM_bert_depth)
    ->ArgsProduct({{1, 2, 4, 8, 12, 24, 48}, {1, 0}})
    ->ArgNames({"layers", "tied"})
    ->Iterations(1)
    ->Unit(benchmark::kSecond)
    ->UseRealTime();
BENCHMARK(BM_llama_70b_8x8)->Arg(0)->Arg(1)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();
BENCHMARK(BM_bert_base_2x4_naive)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();

BENCHMARK_MAIN();
