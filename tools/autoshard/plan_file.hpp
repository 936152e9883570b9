#pragma once
// A plan document's parameters as the parameter -> spec map the checkpoint sharder takes,
// matched against a checkpoint's names.
#include "common.hpp"

#include <autoshard/graph/fused.hpp>  // fused_dim_of: c_attn cut per part
#include <autoshard/pass/pipelined.hpp>  // stages_of_parameters
#include <autoshard/plan/plan.hpp>
#include <autoshard/tensor/tensor.hpp>

#include <iostream>
#include <string_view>
#include <utility>

namespace autoshard::tool {

/// The checkpoint's name for a plan parameter: the same name, or without its first component
/// (Hugging Face's GPT-2 files say "h.0.attn.c_attn.weight" for "transformer.h.0.attn.c_attn.weight"),
/// each also in the legacy spelling of a LayerNorm's parameters that checkpoints converted from
/// TensorFlow keep ("LayerNorm.gamma" and ".beta" for ".weight" and ".bias", as in
/// bert-base-uncased; transformers renames them the same way when it loads them).
inline std::string checkpoint_name(const checkpoint& ck, const std::string& name) {
  auto legacy = [](const std::string& n) -> std::string {
    for (auto [now, old] : {std::pair{"LayerNorm.weight", "LayerNorm.gamma"}, std::pair{"LayerNorm.bias", "LayerNorm.beta"}}) {
      const std::string_view suffix(now);
      if (n.size() > suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
        return n.substr(0, n.size() - suffix.size()) + old;
    }
    return {};
  };
  const auto dot = name.find('.');
  for (const std::string& n : {name, dot == std::string::npos ? std::string() : name.substr(dot + 1)}) {
    if (n.empty()) continue;
    if (ck.contains(n)) return n;
    if (const std::string old = legacy(n); !old.empty() && ck.contains(old)) return old;
  }
  return {};
}

/// The plan document (read by the one plan reader) as a sharding policy for `ck`: every
/// parameter in the spec it is stored in. Every matched tensor must have the plan's shape; a
/// plan none of whose parameters the checkpoint has is for another model.
inline plan_policy plan_policy_for(const plan_document& plan, const checkpoint& ck, const std::string& file) {
  plan_policy pol;
  pol.mesh = plan.mesh;
  std::vector<vertex_t> params;
  for (vertex_t v = 0; v < plan.tensors.size(); ++v)
    if (plan.graph[v].is_parameter()) params.push_back(v);
  std::vector<std::string> missing;
  for (vertex_t v : params) {
    const node& p = plan.graph[v];
    const std::string n = checkpoint_name(ck, p.name);
    if (n.empty()) {
      missing.push_back(p.name);
      continue;
    }
    const auto& e = ck.entry(n);
    if (!(e.shape == p.shape))
      throw io_error("plan file " + quoted_path(file) + " has parameter " + quoted_text(p.name) + " of shape " + to_string(p.shape) +
                     " but the checkpoint's " + quoted_text(n) + " is " + to_string(e.shape) + ": the plan is for another model");
    pol.specs[n] = plan.tensors[v].output;
    if (const fused_dim f = fused_dim_of(plan.graph, v); f.any()) pol.fused[n] = f;
  }
  if (pol.specs.empty())
    throw io_error("plan file " + quoted_path(file) + " names none of the checkpoint's tensors (first: " +
                   (params.empty() ? std::string("none") : quoted_text(plan.graph[params.front()].name)) +
                   "): the plan is for another model");
  // A plan for fewer (or more) layers would leave the checkpoint's other layers replicated
  // without a word: every stack of numbered layers must have as many layers in both.
  auto layer_counts = [](const auto& names) {
    std::map<std::string, std::int64_t> c;
    for (const auto& n : names)
      if (auto l = split_layer_name(n)) c[l->stack] = std::max(c[l->stack], l->index + 1);
    return c;
  };
  const auto in_ck = layer_counts(ck.names());
  std::vector<std::string> planned;  // in the checkpoint's spelling, also for those it lacks
  for (vertex_t v : params) {
    const std::string& name = plan.graph[v].name;
    std::string n = checkpoint_name(ck, name);
    const auto dot = name.find('.');
    if (n.empty()) {
      const auto l = split_layer_name(name);
      n = (l && in_ck.count(l->stack)) || dot == std::string::npos ? name : name.substr(dot + 1);
    }
    planned.push_back(n);
  }
  const auto in_plan = layer_counts(planned);
  for (const auto& [stack, count] : in_ck) {
    const auto it = in_plan.find(stack);
    const std::int64_t p = it == in_plan.end() ? 0 : it->second;
    if (p != count)
      throw io_error("plan file " + quoted_path(file) + " has " + count_noun(p, "layer") + " of " + quoted_text(stack + "N.") + " but the checkpoint has " +
                     std::to_string(count) + ": the plan is for another model");
  }
  for (const auto& n : missing)
    std::cerr << "autoshard: note: plan parameter " << quoted_text(n) << " is not in the checkpoint (tied or unused); skipped\n";
  return pol;
}

/// One stage of a pipelined plan as the sharder takes it: the checkpoint's tensors it holds and
/// how each is cut.
struct stage_shards {
  plan_policy policy;
  std::vector<std::string> names;
};

/// `pol` on its mesh less the axes no parameter is cut on: ranks that differ only there hold
/// the same shards (data-parallel replicas), so each file is written once.
inline plan_policy without_replica_axes(plan_policy pol) {
  std::vector<std::size_t> keep;
  for (std::size_t a = 0; a < pol.mesh.ndim(); ++a)
    for (const auto& [name, spec] : pol.specs)
      if (!spec[a].is_replicate()) {
        keep.push_back(a);
        break;
      }
  std::vector<int> sizes;
  for (std::size_t a : keep) sizes.push_back(pol.mesh.size(a));
  if (sizes.empty()) sizes.push_back(1);
  device_mesh m(sizes);
  for (std::size_t i = 0; i < keep.size(); ++i) {
    m.set_link(i, pol.mesh.link(keep[i]));
    if (pol.mesh.has_axis_names()) m.set_axis_name(i, pol.mesh.axis_name(keep[i]));
  }
  for (auto& [name, spec] : pol.specs) {
    sharding_spec s = spec;
    s.mesh_rank = static_cast<std::uint8_t>(sizes.size());
    for (std::size_t i = 0; i < s.placements.size(); ++i) s.placements[i] = i < keep.size() ? spec[keep[i]] : placement{};
    spec = s;
  }
  pol.mesh = m;
  return pol;
}

/// A pipelined plan's stages for `ck` (plan_policy_for's specs, on the stage's mesh less its
/// replica axes): stage k holds the parameters its layers use (an embedding tied to the head:
/// the first and the last), and a tensor the plan does not name (a layer's buffer) goes with
/// its layer, or else to the first stage, with a note.
inline std::vector<stage_shards> stage_policies_for(const plan_document& plan, const checkpoint& ck, const std::string& file) {
  const plan_policy all = without_replica_axes(plan_policy_for(plan, ck, file));
  const std::vector<std::vector<int>> on = stages_of_parameters(plan);  // checks the stages' layers
  std::vector<stage_shards> out(plan.pipeline->stages.size());
  std::map<std::string, std::vector<int>> stages_of;  // checkpoint name -> stages
  for (vertex_t v = 0; v < on.size(); ++v)
    if (plan.graph[v].is_parameter())
      if (const std::string n = checkpoint_name(ck, plan.graph[v].name); !n.empty()) stages_of[n] = on[v];
  const auto layer_stage = [&](std::int64_t layer) {
    for (std::size_t k = 0; k < out.size(); ++k)
      if (layer >= plan.pipeline->stages[k].first_layer && layer < plan.pipeline->stages[k].first_layer + plan.pipeline->stages[k].layers)
        return static_cast<int>(k);
    return 0;
  };
  for (const std::string& n : ck.names()) {
    std::vector<int> stages = stages_of.count(n) ? stages_of[n] : std::vector<int>{};
    if (stages.empty()) {
      const auto l = split_layer_name(n);
      stages.push_back(l ? layer_stage(l->index) : 0);
      if (!l) std::cerr << "autoshard: note: " << quoted_text(n) << " is neither a plan parameter nor in a layer: written with stage 0\n";
    }
    for (int k : stages) out[static_cast<std::size_t>(k)].names.push_back(n);
  }
  for (stage_shards& s : out) {
    s.policy.mesh = all.mesh;
    s.policy.rule = all.rule;
    for (const std::string& n : s.names) {
      if (const auto it = all.specs.find(n); it != all.specs.end()) s.policy.specs.insert(*it);
      if (const auto it = all.fused.find(n); it != all.fused.end()) s.policy.fused.insert(*it);
    }
  }
  return out;
}

}  // namespace autoshard::tool
