#pragma once
// Reading a plan file (written by the auto-sharding pass, "format": "autoshard.plan") as the
// parameter -> spec map the checkpoint sharder takes, matched against a checkpoint's names.
#include "common.hpp"

#include <autoshard/tensor/tensor.hpp>

#include <fstream>
#include <iostream>

namespace autoshard::tool {

/// One parameter of a plan: its spec on the plan's mesh and its global shape.
struct plan_parameter {
  std::string name;
  tensor_shape shape;
  sharding_spec spec;
};

struct plan_parameters {
  device_mesh mesh;
  std::vector<plan_parameter> params;
};

inline plan_parameters read_plan_parameters(const std::string& file) {
  std::ifstream f(file);
  if (!f) throw io_error("cannot open plan file '" + file + "'");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw io_error("plan file '" + file + "' is not valid JSON: " + e.what());
  }
  plan_parameters out;
  try {
    if (!j.is_object() || j.value("format", std::string()) != "autoshard.plan")
      throw io_error("'" + file + "' is not an autoshard plan (\"format\" is not \"autoshard.plan\")");
    const auto& mj = j.at("mesh");
    const std::vector<int> mesh_shape = json_int_array<int>(mj.at("shape"), "plan file '" + file + "': the mesh shape");
    check_mesh_size(mesh_shape, "plan file '" + file + "': the mesh shape");  // before anything is sized by it
    device_mesh m(mesh_shape);
    const auto& links = mj.at("links");
    for (std::size_t a = 0; a < m.ndim() && a < links.size(); ++a)
      m.set_link(a, {links.at(a).at("alpha").get<double>(), links.at(a).at("beta").get<double>()});
    read_axis_names(m, mj, "plan file '" + file + "'");
    out.mesh = m;
    for (const auto& op : j.at("operators")) {
      if (op.at("kind").get<std::string>() != "parameter") continue;
      plan_parameter p;
      p.name = op.at("name").get<std::string>();
      p.shape = tensor_shape(json_int_array<std::int64_t>(op.at("shape"), "plan file '" + file + "': a shape"));
      p.spec = parse_spec(op.at("output").get<std::string>(), static_cast<int>(m.ndim()), static_cast<int>(p.shape.rank));
      out.params.push_back(p);
    }
  } catch (const nlohmann::json::exception& e) {
    throw io_error("plan file '" + file + "': " + e.what());
  }
  return out;
}

/// The checkpoint's name for a plan parameter: the same name, or without its first component
/// (Hugging Face's GPT-2 files say "h.0.attn.c_attn.weight" for "transformer.h.0.attn.c_attn.weight").
inline std::string checkpoint_name(const checkpoint& ck, const std::string& name) {
  if (ck.contains(name)) return name;
  auto dot = name.find('.');
  if (dot != std::string::npos && ck.contains(name.substr(dot + 1))) return name.substr(dot + 1);
  return {};
}

/// The plan as a sharding policy for `ck`. Every matched tensor must have the plan's shape;
/// a plan none of whose parameters the checkpoint has is for another model.
inline plan_policy plan_policy_for(const plan_parameters& plan, const checkpoint& ck, const std::string& file) {
  plan_policy pol;
  pol.mesh = plan.mesh;
  std::vector<std::string> missing;
  for (const auto& p : plan.params) {
    const std::string n = checkpoint_name(ck, p.name);
    if (n.empty()) {
      missing.push_back(p.name);
      continue;
    }
    const auto& e = ck.entry(n);
    if (!(e.shape == p.shape))
      throw io_error("plan file '" + file + "' has parameter '" + p.name + "' of shape " + to_string(p.shape) +
                     " but the checkpoint's '" + n + "' is " + to_string(e.shape) + ": the plan is for another model");
    pol.specs[n] = p.spec;
  }
  if (pol.specs.empty())
    throw io_error("plan file '" + file + "' names none of the checkpoint's tensors (first: '" +
                   (plan.params.empty() ? std::string("none") : plan.params.front().name) +
                   "'): the plan is for another model");
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
  for (const auto& p : plan.params) {
    std::string n = checkpoint_name(ck, p.name);
    const auto dot = p.name.find('.');
    if (n.empty()) {
      const auto l = split_layer_name(p.name);
      n = (l && in_ck.count(l->stack)) || dot == std::string::npos ? p.name : p.name.substr(dot + 1);
    }
    planned.push_back(n);
  }
  const auto in_plan = layer_counts(planned);
  for (const auto& [stack, count] : in_ck) {
    const auto it = in_plan.find(stack);
    const std::int64_t p = it == in_plan.end() ? 0 : it->second;
    if (p != count)
      throw io_error("plan file '" + file + "' has " + std::to_string(p) + " layers of '" + stack + "N.' but the checkpoint has " +
                     std::to_string(count) + ": the plan is for another model");
  }
  for (const auto& n : missing)
    std::cerr << "autoshard: note: plan parameter '" << n << "' is not in the checkpoint (tied or unused); skipped\n";
  return pol;
}

}  // namespace autoshard::tool
