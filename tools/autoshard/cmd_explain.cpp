// autoshard explain: the redistribute plan between two specs, step by step, with each
// rank's local shape and offset before and after.
#include "common.hpp"

#include <algorithm>
#include <iomanip>
#include <iostream>
#include <sstream>

namespace autoshard::tool {
namespace {

struct explain_options {
  mesh_options mesh;
  std::string shape = "8,4";
  std::string from, to;
  std::string dtype_name = "f32";
  bool json = false;
};

std::string coord_string(const device_mesh& m, int rank) {
  auto c = m.coordinate(rank);
  std::string s = "(";
  for (std::size_t i = 0; i < m.ndim(); ++i) s += (i ? "," : "") + std::to_string(c[i]);
  return s + ")";
}

std::string box_string(const shard_box& b) { return to_string(b.shape) + " @ " + to_string(b.offset); }

int run_explain(const explain_options& o) {
  const device_mesh m = o.mesh.build();
  const tensor_shape shape = parse_shape_list(o.shape);
  const dtype t = parse_dtype_or_throw(o.dtype_name);
  const int mr = static_cast<int>(m.ndim()), tr = static_cast<int>(shape.rank);
  const sharding_spec src = parse_spec(o.from, mr, tr);
  const sharding_spec dst = parse_spec(o.to, mr, tr);
  check_spec(src, m, shape, "--from");
  check_spec(dst, m, shape, "--to");
  const redist_plan plan = plan_redistribute(m, src, dst, shape);
  const plan_cost cost = price_plan(m, plan, shape, t);

  if (o.json) {
    nlohmann::json j;
    j["mesh"] = to_json(m);
    j["shape"] = to_json(shape);
    j["dtype"] = std::string(to_string(t));
    j["from"] = {{"dtensor", to_string(src)}, {"alpa", to_alpa_string(src)}};
    j["to"] = {{"dtensor", to_string(dst)}, {"alpa", to_alpa_string(dst)}};
    j["steps"] = nlohmann::json::array();
    for (const priced_step& p : cost)
      j["steps"].push_back({{"mesh_axis", p.step.mesh_axis},
                            {"collective", std::string(to_string(p.step.kind))},
                            {"from", to_string(p.step.from)},
                            {"to", to_string(p.step.to)},
                            {"src_dim", p.step.src_dim()},
                            {"dst_dim", p.step.dst_dim()},
                            {"group_size", p.group_size},
                            {"bytes", p.bytes},
                            {"bytes_sent_per_rank", p.sent_bytes},
                            {"seconds", p.seconds}});
    j["total_seconds"] = cost.seconds;
    j["total_bytes_sent_per_rank"] = cost.sent_bytes;
    // The ranks are written one at a time, where the document has them, as dump(2) would: as
    // one tree, a mesh of 2^20 ranks took 1.9 GB (and 15 s) to print.
    j["ranks"] = nullptr;
    const std::string text = j.dump(2);
    const std::string slot = "\n  \"ranks\": null";
    const std::size_t at = text.find(slot);
    std::cout << text.substr(0, at) << "\n  \"ranks\": [";
    for (int r = 0; r < m.num_ranks(); ++r) {
      auto a = local_box(m, src, shape, r), b = local_box(m, dst, shape, r);
      auto c = m.coordinate(r);
      const nlohmann::json e{{"rank", r},
                             {"coord", std::vector<int>(c.begin(), c.begin() + static_cast<long>(m.ndim()))},
                             {"before", {{"shape", to_json(a.shape)}, {"offset", to_json(a.offset)}}},
                             {"after", {{"shape", to_json(b.shape)}, {"offset", to_json(b.offset)}}}};
      std::string entry = e.dump(2);
      for (std::size_t nl = entry.find('\n'); nl != std::string::npos; nl = entry.find('\n', nl + 1)) entry.insert(nl + 1, "    ");
      std::cout << (r > 0 ? "," : "") << "\n    " << entry;
    }
    std::cout << "\n  ]" << text.substr(at + slot.size()) << "\n";
    return exit_ok;
  }

  std::cout << "tensor " << shape << " " << to_string(t) << " on " << m << "\n"
            << "from   " << to_string(src) << "  (" << to_alpa_string(src) << ")\n"
            << "to     " << to_string(dst) << "  (" << to_alpa_string(dst) << ")\n\n";
  if (plan.empty()) {
    std::cout << "no steps: the specs already agree on every mesh axis of size > 1\n";
  } else {
    std::cout << std::left << std::setw(5) << "step" << std::setw(6) << "axis" << std::setw(16) << "collective"
              << std::setw(16) << "placement" << std::setw(8) << "dims" << std::setw(8) << "ranks"
              << std::setw(14) << "bytes (B)" << std::setw(16) << "sent per rank" << "time\n";
    int i = 1;
    for (const priced_step& p : cost) {
      std::ostringstream dims;
      if (p.step.src_dim() >= 0) dims << p.step.src_dim();
      if (p.step.src_dim() >= 0 && p.step.dst_dim() >= 0) dims << "->";
      if (p.step.dst_dim() >= 0) dims << p.step.dst_dim();
      if (dims.str().empty()) dims << "-";
      std::cout << std::setw(5) << i++ << std::setw(6) << int(p.step.mesh_axis) << std::setw(16)
                << to_string(p.step.kind) << std::setw(16)
                << (to_string(p.step.from) + " -> " + to_string(p.step.to)) << std::setw(8) << dims.str()
                << std::setw(8) << p.group_size << std::setw(14) << human_bytes(static_cast<double>(p.bytes))
                << std::setw(16) << human_bytes(static_cast<double>(p.sent_bytes)) << human_seconds(p.seconds)
                << "\n";
    }
    std::cout << "modeled time " << human_seconds(cost.seconds) << ", each rank sends "
              << human_bytes(static_cast<double>(cost.sent_bytes)) << "\n";
  }
  std::cout << "\n" << std::left << std::setw(6) << "rank" << std::setw(12) << "coord" << std::setw(28)
            << "before: shape @ offset" << "after: shape @ offset\n";
  // At most max_drawn_ranks rows: the table of a 2^20-rank mesh was 80 MB of text.
  const int listed = std::min(m.num_ranks(), max_drawn_ranks);
  for (int r = 0; r < listed; ++r)
    // A space after each column however wide its cell: "[1024,1024] @ [3072,1047552]" filled
    // its 28 and ran into the next.
    std::cout << std::setw(6) << r << std::setw(11) << coord_string(m, r) << " " << std::setw(27)
              << box_string(local_box(m, src, shape, r)) << " " << box_string(local_box(m, dst, shape, r)) << "\n";
  if (listed < m.num_ranks())
    std::cout << "... and " << m.num_ranks() - listed << " more ranks (the table lists the first " << listed
              << ", max_drawn_ranks; --json lists every rank)\n";
  return exit_ok;
}

}  // namespace

void register_explain(CLI::App& app, action& run) {
  auto o = std::make_shared<explain_options>();
  CLI::App* cmd = app.add_subcommand("explain", "the redistribute plan between two specs, step by step");
  cmd->footer(
      "Examples:\n"
      "  autoshard explain --mesh 2x2 --shape 8,4 --from \"[S(0),S(1)]\" --to \"[S(1),S(0)]\"\n"
      "  autoshard explain --mesh dp=2,tp=4 --shape 768,2304 --from \"(Replicate(), Shard(dim=-1))\" --to S0R --json");

  o->mesh.mesh = "2x2";
  o->mesh.add_to(*cmd);
  cmd->add_option("--shape", o->shape, "global tensor shape, e.g. 8,4")->required();
  cmd->add_option("--from", o->from, "source spec, \"[S(0),S(1)]\" or \"S0S1\"")->required();
  cmd->add_option("--to", o->to, "target spec")->required();
  cmd->add_option("--dtype", o->dtype_name, "element type")->capture_default_str()->check(dtype_value());
  cmd->add_flag("--json", o->json, "write one JSON document to stdout");
  cmd->callback([o, &run] { run = [o] { return run_explain(*o); }; });
}

}  // namespace autoshard::tool
