#pragma once
/// Plan files read back with the graph they were solved for. The pass writes a plan file
/// (autosharding_options::ilp_solution_file) that embeds its graph; load_plan gives the
/// graph, the mesh and one strategy per vertex, checked against each other.
///   autoshard::loaded_plan p = autoshard::load_plan("plan.json");
///   // p.graph, p.mesh, p.strategies[v]: what verify_plan, a sharder or an executor needs
#include <fstream>  // std::ifstream
#include <memory>   // std::unique_ptr
#include <string>   // std::string
#include <vector>   // std::vector

#include "pass.hpp"  // autosharding_options, detail::pass_model, detail::plan_from_json

namespace autoshard {

/// A plan file read back with the graph it was solved for.
struct loaded_plan {
  model_graph graph;
  device_mesh mesh;
  std::vector<strategy> strategies;  ///< index = vertex
  std::string algo;
  run_mode mode = run_mode::inference;
};

/// Reads a plan file written by the pass (ilp_solution_file). The graph is the one the file
/// embeds ("graph"), or `graph` when given (older files embed none). Throws io_error for an
/// unreadable or malformed file, solver_error when the plan does not fit the graph.
inline loaded_plan load_plan(const std::string& file, const model_graph* graph = nullptr) {
  std::ifstream in(file);
  if (!in) throw io_error("cannot open plan file '" + file + "'");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw io_error("plan file '" + file + "' is not valid JSON: " + e.what());
  }
  if (!j.is_object() || j.value("format", std::string()) != "autoshard.plan")
    throw io_error("'" + file + "' is not an autoshard plan (\"format\" is not \"autoshard.plan\")");
  loaded_plan out;
  autosharding_options o;
  try {
    if (graph) out.graph = *graph;
    else if (j.contains("graph")) out.graph = from_json(j.at("graph"));
    else throw io_error("plan file '" + file + "' embeds no graph (written before plans carried one); give the model");
    o.mesh_shape = detail::plan_mesh_shape(j, "plan file '" + file + "'");
    o.mesh_axis_names = detail::plan_mesh_axis_names(j, "plan file '" + file + "'");
    o.mode = j.at("mode").get<std::string>() == "training" ? run_mode::training : run_mode::inference;
    out.algo = j.value("algo", std::string());
  } catch (const nlohmann::json::exception& e) {
    throw io_error("plan file '" + file + "' is malformed: " + e.what());
  } catch (const graph_error& e) {
    std::string why = e.what();
    if (why.rfind("autoshard: ", 0) == 0) why.erase(0, 11);
    throw io_error("plan file '" + file + "': its graph is invalid: " + why);
  }
  o.compare_baselines = false;
  std::unique_ptr<detail::pass_model> pm;
  try {
    pm = std::make_unique<detail::pass_model>(out.graph, o);
  } catch (const solver_error&) {
    throw;
  } catch (const spec_error& e) {  // a bad axis name
    std::string why = e.what();
    if (why.rfind("autoshard: spec error: ", 0) == 0) why.erase(0, 23);
    throw io_error("plan file '" + file + "': \"mesh\": " + why);
  } catch (const error& e) {  // a graph or mesh the strategies cannot be built for
    std::string why = e.what();
    if (why.rfind("autoshard: ", 0) == 0) why.erase(0, 11);
    throw solver_error("plan file '" + file + "': " + why);
  }
  const std::vector<int> choice = detail::plan_from_json(*pm, j, file);
  out.mesh = pm->mesh;
  out.mode = o.mode;
  for (vertex_t v = 0; v < pm->size(); ++v) out.strategies.push_back(pm->strategies[v][static_cast<std::size_t>(choice[v])]);
  return out;
}

}  // namespace autoshard
