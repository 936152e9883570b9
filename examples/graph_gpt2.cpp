// Build GPT-2 124M as a model graph, list the cheapest strategies of one attention
// projection on a 2x4 mesh, price one edge, and write the graph as JSON and DOT.
//   ./example_graph_gpt2 [out_dir]
#include <autoshard/graph/graph.hpp>

#include <algorithm>
#include <fstream>
#include <iostream>

int main(int argc, char** argv) {
  using namespace autoshard;
  transformer_config cfg = transformer_config::gpt2_124m();
  cfg.batch = 8;
  cfg.seq = 1024;
  cfg.mode = run_mode::training;
  model_graph g = build_gpt2(cfg);
  validate(g);
  std::cout << "GPT-2 124M: " << boost::num_vertices(g) << " vertices, " << boost::num_edges(g) << " edges, "
            << parameter_count(g) << " parameters\n";

  const device_mesh mesh = make_mesh_2d(2, 4, 25e9, 300e9);  // 2 nodes x 4 GPUs
  strategy_options opt;
  opt.pricing.mode = run_mode::training;
  const vertex_t qkv = *find_vertex(g, "transformer.h.0.attn.c_attn");
  std::vector<strategy> s = enumerate_strategies(g, qkv, mesh, opt);
  std::sort(s.begin(), s.end(), [](const strategy& a, const strategy& b) { return a.seconds() < b.seconds(); });
  std::cout << g[qkv].name << " (" << parameter_names(g, qkv)[0] << "): " << s.size() << " strategies, cheapest:\n";
  for (std::size_t i = 0; i < std::min<std::size_t>(5, s.size()); ++i)
    std::cout << "  " << s[i].name << "  compute " << s[i].compute_seconds * 1e6 << " us, comm "
              << s[i].comm_seconds * 1e6 << " us, " << s[i].memory_bytes / 1024 << " KiB\n";

  // The edge from the first layer norm into c_attn: producer x consumer resharding seconds.
  const vertex_t ln = *find_vertex(g, "transformer.h.0.ln_1");
  const auto s_ln = enumerate_strategies(g, ln, mesh, opt);
  const cost_matrix r = resharding_costs(g, boost::edge(ln, qkv, g).first, s_ln, s, mesh, opt);
  std::cout << "ln_1 -> c_attn resharding matrix: " << r.rows << " x " << r.cols << ", e.g. "
            << s_ln[1].name << " => " << s[0].inputs[0] << " costs " << r(1, 0) * 1e6 << " us\n";

  const std::string dir = argc > 1 ? argv[1] : ".";
  std::ofstream(dir + "/gpt2.json") << to_json(g).dump(1) << '\n';
  std::ofstream dot(dir + "/gpt2_layer0.dot");
  transformer_config one = cfg;
  one.layers = 1;
  write_dot(dot, build_gpt2(one), {{"transformer.h.0.attn.c_attn", to_alpa_string(s[0].output)}});
  std::cout << "wrote " << dir << "/gpt2.json and " << dir << "/gpt2_layer0.dot\n";
  std::ifstream back(dir + "/gpt2.json");
  return boost::num_vertices(read_json(back)) == boost::num_vertices(g) ? 0 : 1;
}
