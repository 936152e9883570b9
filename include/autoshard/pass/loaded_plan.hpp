#pragma once
/// Plan files read back as strategies, for whoever executes or checks a plan. The file is
/// read by the one reader (plan/document.hpp); its embedded graph and its mesh, with the
/// links it was solved with, give one strategy per vertex, checked against each other.
///   autoshard::loaded_plan p = autoshard::load_plan("plan.json");
///   // p.graph(), p.mesh(), p.strategies[v], p.collectives: what verify_plan, a sharder or an
///   // executor needs; p.document: the rest of what the file says
#include <string>  // std::string
#include <vector>  // std::vector

#include "../plan/document.hpp"  // plan_document, read_plan_file
#include "autosharding.hpp"      // detail::pass_model, detail::plan_choice
#include "layers.hpp"            // map_layers
#include "step_report.hpp"       // parallelism_of

namespace autoshard {

/// A plan file read back whole: the document (the graph it was solved for, the mesh with the
/// links it was priced with, the pricing, the options), one strategy per vertex, and the
/// collectives the cost model prices for it. Nothing is copied out of the document.
struct loaded_plan {
  plan_document document;            ///< everything the file says
  std::vector<strategy> strategies;  ///< index = vertex of document.graph
  /// The collectives the cost model prices for this plan (what verify audits the run against).
  std::vector<collective_use> collectives;

  const model_graph& graph() const noexcept { return document.graph; }
  const device_mesh& mesh() const noexcept { return document.mesh; }  ///< with the links the plan was priced with
};

/// The parallelism of a plan document's specs (parallelism_of on the layouts it records, no
/// strategy enumerated): its tp and dp, and the micro-batch that makes of the graph's micro-step.
/// The ZeRO stages are not read (the specs do not say them).
inline parallelism document_parallelism(const plan_document& d) {
  std::vector<strategy> specs(d.tensors.size());
  std::vector<const strategy*> chosen;
  for (std::size_t v = 0; v < d.tensors.size(); ++v) {
    specs[v].inputs = d.tensors[v].inputs;
    specs[v].output = d.tensors[v].output;
    specs[v].recompute = d.tensors[v].recompute;
    chosen.push_back(&specs[v]);
  }
  return parallelism_of(d.graph, d.mesh, chosen, d.pricing.accumulation(), map_layers(d.graph));
}

/// Throws io_error when a training plan's pricing.micro_batch is not what its strategies make
/// of the graph's micro-step (`p`: their parallelism, document_parallelism or a summary's): the
/// batch over the ranks its layers split it on. The pass writes exactly that; a hand edit that
/// changed it had `show` describe another job.
inline void check_micro_batch(const plan_document& d, const parallelism& p, const std::string& file) {
  const int mb = d.pricing.micro_batch;
  if (d.pricing.mode != run_mode::training || mb <= 0) return;
  if (p.micro_batch != mb)
    throw io_error("plan file " + quoted_path(file) + ": pricing.micro_batch is " + std::to_string(mb) + ", but its strategies split the " +
                   "graph's micro-step of " + std::to_string(graph_batch(d.graph)) + " sequences over " +
                   count_noun(p.dp, "data-parallel rank") + ": " + std::to_string(p.micro_batch) + " per rank");
}

/// The strategies a plan document chose, rebuilt on its own graph, mesh and pricing (so the
/// collectives are priced as the plan was). Throws solver_error when a strategy is not one
/// its vertex offers. Only the chosen pairs are priced (summarize): the model's edges, every
/// strategy pair's resharding cost that a solve needs, are left unpriced.
inline loaded_plan load_plan(plan_document d, const std::string& file = "(in memory)") {
  loaded_plan out;
  out.document = std::move(d);
  const plan_document& doc = out.document;
  const detail::pass_model pm(doc.graph, doc.mesh, doc.pricing, std::nullopt, {}, detail::pass_model::edges_when::deferred);
  // A pipelined plan's stages take the layers by number: refused here, for every reader, when the
  // graph does not run them in that order (verify ran such stages into a segfault).
  if (doc.pipeline) (void)detail::unit_of_vertices(doc.graph, pm.layers);
  const std::vector<int> choice = detail::plan_choice(pm, doc, file);
  for (vertex_t v = 0; v < pm.size(); ++v) out.strategies.push_back(pm.strategies[v][static_cast<std::size_t>(choice[v])]);
  const plan_summary summary = detail::summarize(pm, doc.options.algo, choice);
  out.collectives = summary.collectives;
  check_micro_batch(doc, summary.par, file);
  return out;
}

/// Reads a plan file written by the pass (ilp_solution_file). Throws io_error for an
/// unreadable or malformed file, graph_error for an invalid embedded graph, solver_error
/// when the plan does not fit its graph.
inline loaded_plan load_plan(const std::string& file) { return load_plan(read_plan_file(file), file); }

}  // namespace autoshard
