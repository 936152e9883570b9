#pragma once
/// What a pipelined plan records beside its tensors: the schedule its stages run and, per
/// stage, the model's layers it holds (docs/plan-format.md, "pipeline"). The plan's mesh is one
/// stage's sub-mesh and its tensors are planned on it; the pipeline has as many copies of that
/// sub-mesh as it has stages, each running its consecutive layers (the first stage also what
/// comes before the layers, the embedding; the last what comes after them, the head).
///   autoshard::plan_pipeline p = *document.pipeline;
///   p.stages[1].first_layer;  p.stages[1].layers;   // layers 24..47 of 48
///   autoshard::to_string(p.schedule);               // "1f1b"
#include <cstdint>      // std::int64_t, std::uint8_t
#include <optional>     // std::optional
#include <string>       // std::string, std::to_string
#include <string_view>  // std::string_view
#include <vector>       // std::vector

#include "../core/enum_text.hpp"  // parse_enum
#include "../core/mesh.hpp"       // link_model

namespace autoshard {

/// How the stages of a pipeline order their micro-batches' passes (pass/pipeline.hpp).
enum class pipeline_schedule : std::uint8_t { one_f_one_b, gpipe };
inline constexpr pipeline_schedule all_pipeline_schedules[] = {pipeline_schedule::one_f_one_b, pipeline_schedule::gpipe};

/// "1f1b" or "gpipe": what plan files, reports and flags write.
constexpr std::string_view to_string(pipeline_schedule s) noexcept { return s == pipeline_schedule::gpipe ? "gpipe" : "1f1b"; }
/// The schedule to_string wrote, or nullopt.
constexpr std::optional<pipeline_schedule> parse_pipeline_schedule(std::string_view s) noexcept {
  return parse_enum(s, all_pipeline_schedules);
}

/// The most micro-batches whose activations stage `stage` of `stages` holds at once under
/// `s` (forward run, backward not yet): min(p - stage, m) for 1F1B, m for GPipe. The closed
/// form of what schedule_passes' orders do (pass/pipeline.hpp), and what a plan file's stages
/// must record (plan/document.hpp).
constexpr int in_flight_micro_batches(pipeline_schedule s, int stages, int stage, int micro_batches) noexcept {
  return s == pipeline_schedule::gpipe ? micro_batches : (stages - stage < micro_batches ? stages - stage : micro_batches);
}

/// One stage of a pipelined plan.
struct plan_stage {
  int first_layer = 0;            ///< the position (0-based, in the model's layer order) of its first layer
  int layers = 0;                 ///< how many consecutive layers it holds (0: the embedding or the head alone)
  double seconds = 0.0;           ///< one micro-batch's forward and backward on it
  std::int64_t memory_bytes = 0;  ///< its peak per device under the schedule
  int in_flight = 0;              ///< the most micro-batches whose activations it holds at once
  friend bool operator==(const plan_stage&, const plan_stage&) = default;
};

/// The pipeline of a plan: its stages in order and how the step runs over them.
struct plan_pipeline {
  pipeline_schedule schedule = pipeline_schedule::one_f_one_b;
  link_model link;                        ///< the link a stage-to-stage transfer crosses
  std::vector<plan_stage> stages;         ///< at least one
  std::vector<double> transfer_seconds;   ///< per boundary (stages - 1): one activation's transfer
  double step_seconds = 0.0;              ///< the step as the schedule was simulated
  double bubble_fraction = 0.0;           ///< step over the ideal (m times the slowest stage), less 1
  double gradient_sync_seconds = 0.0;     ///< the exposed gradient sync after the flush
  double tied_sync_seconds = 0.0;         ///< a parameter used on two stages: its gradient's all-reduce
  friend bool operator==(const plan_pipeline&, const plan_pipeline&) = default;
};

/// "embedding + layers 0-23", "layers 24-47 + head", "layer 5": what stage k of `p` holds.
inline std::string describe_stage(const plan_pipeline& p, std::size_t k) {
  const plan_stage& s = p.stages.at(k);
  std::string out = k == 0 ? "embedding" : "";
  const auto join = [&out](const std::string& part) { out += (out.empty() ? "" : " + ") + part; };
  if (s.layers == 1) join("layer " + std::to_string(s.first_layer));
  if (s.layers > 1) join("layers " + std::to_string(s.first_layer) + "-" + std::to_string(s.first_layer + s.layers - 1));
  if (k + 1 == p.stages.size()) join("head");
  return out;
}

/// "2 stages, 1f1b: embedding + layers 0-1 | layers 2-3 + head": the pipeline in one line.
inline std::string describe(const plan_pipeline& p) {
  std::string out = std::to_string(p.stages.size()) + (p.stages.size() == 1 ? " stage, " : " stages, ") +
                    std::string(to_string(p.schedule)) + ":";
  for (std::size_t k = 0; k < p.stages.size(); ++k) out += (k ? " | " : " ") + describe_stage(p, k);
  return out;
}

}  // namespace autoshard
