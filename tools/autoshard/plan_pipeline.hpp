// autoshard plan --pp: a training step with pipeline stages. `--pp auto` searches (pp, tp, dp,
// micro-batch, recomputation) with every stage planned by the ILP, or with `--algo megatron`
// every stage in Megatron-LM's layout and the layers split as its arguments can split them
// (evenly, or the first and the last stage their own counts);
// `--pp P` fixes the stage count; `--algo megatron --tp T --pp P` prices the configuration
// Megatron-LM runs. The report shows the choice, its stages, the best alternatives and
// Megatron-LM's 3D configuration (tensor parallel over a node, the fewest stages that fit)
// priced the same way.
#pragma once

#include <autoshard/pass/pipelined.hpp>

#include "export_verdicts.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace autoshard::tool {

/// What `plan --pp` needs beyond the pass's options.
struct pipeline_cli {
  std::string pp;                  ///< "auto" or a stage count
  std::string schedule = "1f1b";
  int tp = 0;                      ///< megatron's --tp (0: the devices per node)
  int micro_batch = 0;             ///< 0: the search chooses (megatron: 1)
  recompute_policy recompute = recompute_policy::choose;
  bool json = false;
};

/// {"bytes": ..., "context_bytes": ..., "communicators": 3, "communicator_bytes": ...}: what a
/// rank's process holds beside the plan's tensors (runtime_reserve_of).
inline nlohmann::json runtime_json(const runtime_reserve& r) {
  return {{"bytes", r.bytes()}, {"context_bytes", r.context_bytes}, {"communicators", r.communicators},
          {"communicator_bytes", r.communicator_bytes}};
}

inline nlohmann::json pipelined_json(const pipelined_step& s) {
  nlohmann::json stages = nlohmann::json::array();
  for (std::size_t k = 0; k < s.stages.count.size(); ++k)
    stages.push_back({{"units", describe_stage(s, k)},
                      {"first_unit", s.stages.first[k]},
                      {"unit_count", s.stages.count[k]},
                      {"seconds_per_micro_batch", s.stages.seconds[k]},
                      {"memory_bytes", s.stages.memory[k]},
                      {"in_flight", s.timeline.in_flight[k]}});
  return {{"parallelism",
           {{"pp", s.config.pp},
            {"tp", s.config.tp},
            {"dp", s.config.dp},
            {"micro_batch", s.config.micro_batch},
            {"micro_batches", s.micro_batches},
            {"recompute", std::string(to_string(s.config.recompute))},
            {"schedule", std::string(to_string(s.config.schedule))}}},
          {"stages", stages},
          {"step_seconds", s.step_seconds},
          {"bubble_fraction", s.timeline.bubble_fraction},
          {"gradient_sync_seconds", s.sync_seconds},
          {"tied_sync_seconds", s.shared_sync_seconds},
          {"tflops_per_device", s.tflops_per_device},
          {"mfu", s.mfu},
          {"peak_memory_bytes", s.peak_memory_bytes},
          {"runtime_reserve", runtime_json(s.runtime)},
          {"budget_bytes", s.budget},
          {"fits", s.fits},
          {"within_budget", s.within_budget},
          {"stage_mesh", to_string(s.stage_mesh)},
          {"stage_layout", std::string(to_string(s.stage_plan.algo))},
          {"stage_plan_limit_bytes", s.stage_plan_limit ? nlohmann::json(*s.stage_plan_limit) : nlohmann::json(nullptr)}};
}

inline void print_pipelined(const pipelined_step& s, const std::string& label, const device_model& device) {
  std::cout << label << describe(s.config, s.micro_batches) << "\n";
  for (std::size_t k = 0; k < s.stages.count.size(); ++k)
    std::cout << "  stage " << k << ": " << describe_stage(s, k) << ", " << human_seconds(s.stages.seconds[k])
              << " per micro-batch, " << human_bytes(static_cast<double>(s.stages.memory[k])) << " per device ("
              << s.timeline.in_flight[k] << " in flight)\n";
  std::cout << "  step " << human_seconds(s.step_seconds) << " (bubble " << std::fixed << std::setprecision(1)
            << 100 * s.timeline.bubble_fraction << " %, gradient sync after the flush " << human_seconds(s.sync_seconds)
            << ", tied embedding " << human_seconds(s.shared_sync_seconds) << "), " << s.tflops_per_device
            << " TFLOP/s per device, MFU " << 100 * s.mfu << " %, " << describe_peak(s.peak_memory_bytes, s.runtime, device)
            << (!s.fits ? "  DOES NOT FIT" : !s.within_budget ? "  OVER THE MEMORY BUDGET of " + human_bytes_exact(s.budget) : "")
            << std::defaultfloat << "\n";
  if (s.stage_plan_limit)
    std::cout << "  stage plan solved within " << human_bytes(static_cast<double>(*s.stage_plan_limit))
              << " per device of its two-layer model (the fastest plan's stages do not fit, or fit only split more slowly): "
              << describe_zero(s.stage_plan.par) << "\n";
}

inline void print_alternative(const pipelined_step& s) {
  std::cout << "  " << describe(s.config, s.micro_batches) << ": " << human_seconds(s.step_seconds) << ", " << std::fixed
            << std::setprecision(1) << s.tflops_per_device << " TFLOP/s, MFU " << 100 * s.mfu << " %, "
            << human_bytes(static_cast<double>(s.peak_memory_bytes)) << std::defaultfloat << "\n";
}

/// Writes the plan file of `plan` to --out (pipelined_document: the stages, the schedule, every
/// layer's strategies on one stage's sub-mesh) through the one plan writer; "" when there is
/// no file to write (--preload reads one).
inline std::string write_pipelined_plan(const model_graph& g, const autosharding_options& po, const pipelined_step& plan) {
  if (po.preload_solution || po.ilp_solution_file.empty()) return {};
  write_plan_file(pipelined_document(g, po.mesh, plan, po), po.ilp_solution_file);
  return po.ilp_solution_file;
}

/// The best plan of search `found`, or the solver_error that says why it has none: no
/// configuration in its space, none the ILP could plan, or none within the device's memory (and
/// po's budget) with the one that came closest.
inline pipelined_step searched_best(const pipeline_search& found, const autosharding_options& po) {
  if (!found.empty.empty()) throw solver_error(found.empty);
  if (!found.best && found.priced == 0 && found.failed > 0) {
    // Not memory: the ILP planned none of them (a time limit too short for any answer, or a
    // pin no stage could honour, said "no pipelined configuration fits 80.00 GiB per device",
    // the failures it had kept dropped).
    std::string why;
    for (const std::string& f : found.failures) why += (why.empty() ? "" : "; ") + f;
    throw solver_error("no pipelined configuration could be planned: the ILP found no plan for any of the " +
                       count_noun(found.failed, "configuration") + " it tried (" + why +
                       (found.failed > found.failures.size() ? "; …" : "") + ")");
  }
  if (!found.best)
    throw solver_error("no pipelined configuration fits " + human_bytes_exact(po.pricing.device.memory_bytes) + " per device" +
                       (runtime_reserve_of(po.pricing.device, device_mesh{1}).bytes() > 0
                            ? std::string(" with its runtime reserve (CUDA context and NCCL communicators)")
                            : std::string()) +
                       (po.memory_budget ? " and the memory budget of " + human_bytes_exact(*po.memory_budget) : std::string()) +
                       (found.closest.empty() ? std::string() : "; the closest, " + found.closest));
  return *found.best;
}

/// Runs `plan --pp`: prints the report (or one JSON document); returns whether the plan is
/// within its budget (and so fits the device). po.memory_budget, where given, tightens each
/// configuration's budget (the device's memory less its runtime reserve).
inline bool run_pipelined_plan(const model_graph& g, const autosharding_options& po, const pipeline_cli& c) {
  const std::optional<pipeline_schedule> schedule = parse_pipeline_schedule(c.schedule);
  if (!schedule) throw spec_error("--schedule must be " + enum_names(all_pipeline_schedules) + ", got " + quoted_text(c.schedule));
  if (po.pricing.mode != run_mode::training) throw spec_error("--pp prices a training step: plan with --mode train");
  if (po.preload_solution) throw spec_error("--preload reads a plan without stages; with --pp the stages are searched again");
  const bool search = c.pp == "auto";
  int pp = 0;
  if (!search) {
    const bool digits = !c.pp.empty() && c.pp.size() <= 7 && c.pp.find_first_not_of("0123456789") == std::string::npos;
    pp = digits ? std::stoi(c.pp) : 0;
    if (pp < 1) throw spec_error("--pp must be \"auto\" or a stage count of at least 1, got " + quoted_text(c.pp));
  }
  const auto kinds = [&](algo a) { return a == algo::megatron && c.recompute == recompute_policy::choose
                                              ? recompute_kinds_of(recompute_policy::selective)
                                              : recompute_kinds_of(c.recompute); };
  const auto first_kind = [](unsigned bits) {
    for (recompute_kind r : all_recompute_kinds)
      if (has_kind(bits, r)) return r;
    return recompute_kind::none;
  };
  // Megatron's 3D configuration as people run it (tensor parallel over a node, the fewest stages
  // that fit): the baseline every pipelined plan is shown beside.
  std::optional<pipelined_step> megatron;
  std::string megatron_why;
  try {
    megatron = megatron_pipelined(g, po.mesh, po.pricing, c.tp, c.micro_batch > 0 ? c.micro_batch : 1,
                                  first_kind(kinds(algo::megatron)), *schedule, po);
  } catch (const solver_error& e) {
    megatron_why = std::string(e.message());
  }
  // The search `a` runs: with megatron, Megatron-LM's configurations as its arguments say
  // (export --to megatron writes them): its layout in every stage, the layers split as its
  // arguments can (evenly, or the first and last stage their own counts), every
  // tensor-parallel size dividing a node (or --tp's), micro-batch (or --micro-batch) and
  // recomputation it has flags for (none, selective, full; or --recompute's).
  const auto search_options = [&](algo a) {
    pipeline_search_options so;
    so.a = a;
    so.schedule = *schedule;
    so.pp = pp;
    so.micro_batch = c.micro_batch;
    so.recompute = kinds(a);
    if (a == algo::megatron) {
      so.megatron_stages = true;
      so.tp = c.tp;
      so.recompute = recompute_kinds_of(c.recompute);
    }
    so.base = po;
    return so;
  };
  std::optional<pipelined_step> plan;
  pipeline_search found;
  if (po.algo == algo::megatron && !search) {
    const int tp = c.tp > 0 ? c.tp : po.mesh.size(po.mesh.ndim() - 1);
    plan = price_pipelined(g, po.mesh, po.pricing, algo::megatron,
                           pipeline_config{pp, tp, 0, c.micro_batch > 0 ? c.micro_batch : 1, first_kind(kinds(algo::megatron)), *schedule},
                           stage_split::megatron_arguments(), po);
  } else {
    found = search_pipelines(g, po.mesh, po.pricing, search_options(po.algo));
    plan = searched_best(found, po);
  }
  const std::string file = write_pipelined_plan(g, po, *plan);
  const std::vector<export_verdict> exports = file.empty() ? std::vector<export_verdict>{} : export_verdicts(file);
  // alpa's plan that export --to megatron cannot write (its stages' layouts are the ILP's, or
  // its layers split unevenly): the fastest plan Megatron-LM runs, searched as --algo megatron
  // --pp auto searches, is shown beside it: what running the step in Megatron-LM costs.
  std::optional<pipelined_step> runnable;
  std::string runnable_why;
  const bool megatron_refuses =
      std::any_of(exports.begin(), exports.end(), [](const export_verdict& v) { return v.target == "megatron" && !v.ok; });
  if (po.algo == algo::alpa && megatron_refuses) try {
      runnable = searched_best(search_pipelines(g, po.mesh, po.pricing, search_options(algo::megatron)), po);
    } catch (const solver_error& e) {
      runnable_why = std::string(e.message());
    }
  if (c.json) {
    nlohmann::json j{{"algo", std::string(to_string(po.algo))}, {"plan", pipelined_json(*plan)}, {"files", {{"plan", file}}}};
    nlohmann::json alts = nlohmann::json::array();
    for (const pipelined_step& s : found.alternatives) alts.push_back(pipelined_json(s));
    j["alternatives"] = alts;
    j["search"] = {{"configurations", found.configurations}, {"priced", found.priced}, {"pruned_by_bound", found.pruned_bound},
                   {"pruned_by_recomputation", found.pruned_recompute}, {"failed", found.failed}, {"failures", found.failures},
                   {"seconds", found.seconds}};
    j["baselines"] = {{"megatron", megatron ? pipelined_json(*megatron) : nlohmann::json{{"feasible", false}, {"why_not", megatron_why}}}};
    if (!file.empty()) j["exports"] = export_verdicts_json(exports);
    if (runnable || !runnable_why.empty())
      j["megatron_runnable"] = runnable ? pipelined_json(*runnable) : nlohmann::json{{"feasible", false}, {"why_not", runnable_why}};
    std::cout << j.dump(2) << "\n";
    return plan->within_budget;
  }
  print_pipelined(*plan, "pipeline  ", po.pricing.device);
  if (plan->stage_plan.algo != po.algo)  // alpa's search kept Megatron-LM's layout of this configuration
    std::cout << "  each stage in " << to_string(plan->stage_plan.algo) << "'s layout: its step is faster than the "
              << to_string(po.algo) << " ILP's plan of the same configuration\n";
  if (search || po.algo != algo::megatron) {  // not a fixed --algo megatron --pp P, which is priced, not searched
    std::cout << "searched  " << found.configurations << " configurations: " << found.priced << " planned by the ILP, "
              << found.pruned_bound << " pruned by the bubble bound, " << found.pruned_recompute
              << " by a fit with less recomputation, " << found.failed << " failed, in " << human_seconds(found.seconds) << "\n";
    for (const std::string& f : found.failures) std::cout << "  failed: " << f << "\n";
    if (!found.alternatives.empty()) std::cout << "next best:\n";
    for (const pipelined_step& s : found.alternatives) print_alternative(s);
  }
  if (megatron) print_pipelined(*megatron, "megatron  ", po.pricing.device);
  else std::cout << "megatron  not feasible: " << megatron_why << "\n";
  if (!file.empty()) print_export_verdicts(exports, file);
  if (runnable)
    std::cout << "  the fastest plan Megatron-LM runs: " << describe(runnable->config, runnable->micro_batches) << ", "
              << human_seconds(runnable->step_seconds) << " (" << std::fixed << std::setprecision(1)
              << 100 * std::abs(runnable->step_seconds / plan->step_seconds - 1)
              << (runnable->step_seconds < plan->step_seconds ? " % faster" : " % slower") << std::defaultfloat
              << "): plan with --algo megatron --pp " << runnable->config.pp << " --tp " << runnable->config.tp
              << " --micro-batch " << runnable->config.micro_batch << " --recompute " << to_string(runnable->config.recompute)
              << " writes it\n";
  else if (!runnable_why.empty())
    std::cout << "  no plan Megatron-LM runs: " << runnable_why << "\n";
  if (!file.empty()) std::cout << "wrote " << escaped_text(file) << " (plan: every layer on one stage's " << to_string(plan->stage_mesh) << ", and the stages)\n";
  return plan->within_budget;
}

}  // namespace autoshard::tool
