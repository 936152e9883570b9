// The plan's picture: tied layers drawn once with their count, a legend, resharding edges
// labelled with their collectives and modeled time.
#include <doctest/doctest.h>

#include <autoshard/pass/pass.hpp>

#include <filesystem>
#include <regex>
#include <sstream>
#include <string>
#include "unit/scratch.hpp"

namespace {

autoshard::loaded_plan plan_of(int layers, const std::string& algo) {
  auto c = autoshard::transformer_config::gpt2(layers, 128, 4);
  c.seq = 32;
  c.batch = 8;
  c.vocab = 256;
  c.max_positions = 32;
  c.mode = autoshard::run_mode::training;
  autoshard::autosharding_options o;
  o.pricing.mode = c.mode;
  o.mesh = autoshard::make_cluster_mesh({2, 4});
  o.mesh.set_axis_name(0, "dp").set_axis_name(1, "tp");
  o.algo = *autoshard::parse_algo(algo);
  o.compare_baselines = false;
  o.ilp_solution_file = autoshard_test::unique_temp_path("plan_dot_" + algo + ".json").string();
  (void)autoshard::autosharding_analysis_pass(autoshard::build_gpt2(c), o);
  autoshard::loaded_plan p = autoshard::load_plan(o.ilp_solution_file);
  std::filesystem::remove(o.ilp_solution_file);
  return p;
}

std::size_t count(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

std::string dot_of(const autoshard::loaded_plan& p) {
  std::ostringstream os;
  autoshard::write_plan_dot(os, p.graph(), p.mesh(), p.strategies, p.document.pricing);
  return os.str();
}

}  // namespace

TEST_CASE("plan DOT: six tied layers are drawn once, with their count") {
  const autoshard::loaded_plan p = plan_of(6, "megatron");
  const std::string dot = dot_of(p);
  CHECK(count(dot, "subgraph cluster_layer") == 1);
  CHECK(dot.find("layers 0-5 (x 6, tied") != std::string::npos);
  CHECK(dot.find("transformer.h.[0-5].mlp.c_fc") != std::string::npos);
  CHECK(dot.find("transformer.h.3.") == std::string::npos);  // no layer drawn twice
  // Nodes: every vertex outside the layers plus one layer's worth.
  std::size_t in_layer0 = 0, outside = 0;
  for (autoshard::vertex_t v = 0; v < boost::num_vertices(p.graph()); ++v) {
    const std::string& nm = p.graph()[v].name;
    if (nm.rfind("transformer.h.0.", 0) == 0) ++in_layer0;
    else if (nm.rfind("transformer.h.", 0) != 0) ++outside;
  }
  CHECK(count(dot, "\n    v") == in_layer0 + outside);
  // The legend has a swatch per output spec drawn, and the resharding edges say what and how long.
  CHECK(dot.find("subgraph cluster_legend") != std::string::npos);
  CHECK(count(dot, "    legend") >= 3);
  const std::regex edge_label(R"(label="(all-gather|all-reduce|reduce-scatter|all-to-all) \((dp|tp)\)[^"]*\\n[0-9.]+ (us|ms|s)( \(x [0-9]+\))?")");
  CHECK(std::regex_search(dot, edge_label));
  CHECK(dot.find("(x 6)") != std::string::npos);  // an edge inside the collapsed layers stands for six
}

TEST_CASE("plan DOT: a layer that chose differently is drawn on its own") {
  autoshard::loaded_plan p = plan_of(4, "megatron");
  const auto v = autoshard::find_vertex(p.graph(), "transformer.h.2.mlp.act");
  REQUIRE(v);
  p.strategies[*v].name += " (changed)";  // a different choice for layer 2 only
  const std::string dot = dot_of(p);
  CHECK(dot.find("layers 0-1 (x 2") != std::string::npos);
  CHECK(dot.find("label=\"layer 2\"") != std::string::npos);
  CHECK(dot.find("label=\"layer 3\"") != std::string::npos);
  CHECK(count(dot, "subgraph cluster_layer") == 3);
}

TEST_CASE("plan DOT: strategies that do not fit the graph are an error") {
  autoshard::loaded_plan p = plan_of(1, "data_parallel");
  p.strategies.pop_back();
  std::ostringstream os;
  CHECK_THROWS_AS(autoshard::write_plan_dot(os, p.graph(), p.mesh(), p.strategies, p.document.pricing), autoshard::solver_error);
}
