// libFuzzer target: plan files read back by the auto-sharding pass (pass/autosharding.hpp,
// preload_solution). A small MLP graph on a 2x2 mesh is the model; each input is written as
// read as a plan for it, as preload_solution does (no ILP is solved). Only io_error (malformed
// file) and solver_error (a plan for another graph, mesh or mode) may escape. A plan that loads
// must give every vertex one of its own strategies. Every 256th input also goes through the
// whole pass and through load_plan (pass/loaded_plan.hpp, with the file's embedded graph).
//
// With AUTOSHARD_FUZZ_WRITE_PLANS=<dir> set, it first solves the MLP with each algo and
// writes the plans there: that is how fuzz/corpus/plan_json/ was seeded.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <autoshard/graph/graph.hpp>
#include <autoshard/pass/autosharding.hpp>
#include <autoshard/pass/loaded_plan.hpp>

#include "target.hpp"

namespace autoshard_fuzz::plan_json_target {
namespace fs = std::filesystem;

const char* const mlp_json = R"({"nodes": [
  {"name": "x", "kind": "input", "shape": [8, 16], "dtype": "f32"},
  {"name": "w1", "kind": "parameter", "shape": [32, 16], "dtype": "f32"},
  {"name": "b1", "kind": "parameter", "shape": [32], "dtype": "f32"},
  {"name": "fc1", "kind": "linear", "shape": [8, 32], "dtype": "f32", "inputs": ["x", "w1", "b1"]},
  {"name": "act", "kind": "gelu", "shape": [8, 32], "dtype": "f32", "inputs": ["fc1"]},
  {"name": "w2", "kind": "parameter", "shape": [16, 32], "dtype": "f32"},
  {"name": "fc2", "kind": "linear", "shape": [8, 16], "dtype": "f32", "inputs": ["act", "w2"]},
  {"name": "out", "kind": "add", "shape": [8, 16], "dtype": "f32", "inputs": ["fc2", "x"]}]})";

struct fixture {
  autoshard::model_graph g = autoshard::from_json(nlohmann::json::parse(mlp_json));
  fs::path plan;
  autoshard::autosharding_options opt;
  std::unique_ptr<autoshard::detail::pass_model> pm;
  fixture() {
    const fs::path base = fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    plan = base / ("autoshard-fuzz-plan-" + std::to_string(::getpid()) + ".json");
    opt.mesh = autoshard::make_cluster_mesh({2, 2});
    opt.pricing.mode = autoshard::run_mode::inference;  // the corpus's plans are inference plans
    opt.compare_baselines = false;
    opt.time_limit = 10;
    if (const char* dir = std::getenv("AUTOSHARD_FUZZ_WRITE_PLANS")) {
      for (const char* algo : {"alpa", "megatron", "data_parallel", "fully_replicated"}) {
        autoshard::autosharding_options o = opt;
        o.algo = *autoshard::parse_algo(algo);
        o.ilp_solution_file = (fs::path(dir) / (std::string(algo) + ".json")).string();
        autoshard::autosharding_analysis_pass(g, o);
      }
    }
    opt.preload_solution = true;
    opt.ilp_solution_file = plan.string();
    pm = std::make_unique<autoshard::detail::pass_model>(g, opt);
  }
  ~fixture() {
    std::error_code ec;
    fs::remove(plan, ec);
  }
};

int one_input(const std::uint8_t* data, std::size_t size) {
  static fixture f;
  // The preload path of autosharding_analysis_pass without re-enumerating the strategies on
  // every execution (that made the pass itself run at ~12 executions/s): the same JSON
  // parse, the same plan_from_json reading and plan_choice check against the graph and mesh, the same summary.
  nlohmann::json j;
  try {  // as load_json_file reads a plan file: depth-checked first (io/json.hpp)
    j = autoshard::parse_json_text(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.json");
  } catch (const autoshard::io_error&) {
    return 0;  // not JSON, or nested too deep
  }
  try {
    const autoshard::plan_document d = autoshard::plan_from_json(j, "fuzz.json");
    std::vector<int> choice = autoshard::detail::plan_choice(*f.pm, d, "fuzz.json");
    if (choice.size() != boost::num_vertices(f.g)) {
      std::fprintf(stderr, "fuzz_plan_json: plan does not cover the graph\n");
      std::abort();
    }
    for (std::size_t v = 0; v < choice.size(); ++v)
      if (choice[v] < 0 || static_cast<std::size_t>(choice[v]) >= f.pm->strategies[v].size()) {
        std::fprintf(stderr, "fuzz_plan_json: vertex %zu got strategy %d\n", v, choice[v]);
        std::abort();
      }
    (void)autoshard::detail::summarize(*f.pm, autoshard::algo::alpa, std::move(choice));
  } catch (const autoshard::io_error&) {
  } catch (const autoshard::graph_error&) {
  } catch (const autoshard::solver_error&) {
  }
  // Every few hundred inputs, the whole public path (file, preload, "algo"), as users call it.
  static unsigned n = 0;
  if (++n % 256 == 0) {
    {
      std::ofstream out(f.plan, std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    }
    try {
      (void)autoshard::autosharding_analysis_pass(f.g, f.opt);
    } catch (const autoshard::io_error&) {
    } catch (const autoshard::graph_error&) {  // an invalid embedded graph
    } catch (const autoshard::solver_error&) {
    } catch (const autoshard::resource_error&) {  // a mesh whose planning would not fit this machine
    }
    // load_plan (what `autoshard verify` reads): the file's own embedded graph when it has
    // one, else the MLP; every vertex must come back with one of its own strategies.
    try {
      const autoshard::loaded_plan lp = autoshard::load_plan(f.plan.string());
      if (lp.strategies.size() != boost::num_vertices(lp.graph())) {
        std::fprintf(stderr, "fuzz_plan_json: load_plan returned %zu strategies for %zu vertices\n",
                     lp.strategies.size(), static_cast<std::size_t>(boost::num_vertices(lp.graph())));
        std::abort();
      }
    } catch (const autoshard::graph_error&) {
    } catch (const autoshard::io_error&) {
    } catch (const autoshard::solver_error&) {
    }
  }
  return 0;
}

}  // namespace autoshard_fuzz::plan_json_target

AUTOSHARD_FUZZ_TARGET(plan_json)
