// autoshard export: a plan file in the formats users run, for its tensor-parallel mesh axis:
// Hugging Face's tp_plan (module -> "colwise" / "rowwise" / ...) or PyTorch's
// parallelize_module plan (module -> ColwiseParallel / RowwiseParallel / SequenceParallel with
// layouts). A plan no such style expresses is an error that lists the operators and why.
#include "common.hpp"
#include "paths.hpp"

#include <autoshard/pass/export.hpp>
#include <autoshard/pass/export_megatron.hpp>

#include <iostream>

namespace autoshard::tool {
namespace {

struct export_cli_options {
  std::string plan;
  std::string to;
  std::string out;
  std::string axis;
  bool follow_symlinks = false;
  int transformers = 5;
};

int run_export(const export_cli_options& o) {
  command_paths paths(o.follow_symlinks);  // the export never written over the plan, a FIFO or a link
  paths.input("--plan", o.plan);
  const std::filesystem::path out = paths.output_path("--out", o.out);
  paths.check();
  const loaded_plan lp = load_plan(o.plan);
  if (o.to == "megatron") {  // Megatron-LM's command-line arguments (pass/export_megatron.hpp)
    if (!o.axis.empty()) throw spec_error("--axis: Megatron-LM's tensor parallelism is on the mesh's last axis");
    const megatron_export e = export_megatron(lp);
    const std::string text = megatron_arguments(e);  // refuses a plan they cannot express, listing why
    if (o.out.empty()) std::cout << text;
    else {
      write_file_atomically(out, text);
      std::cout << "wrote " << escaped_text(o.out) << " (Megatron-LM arguments: tensor parallel " << e.tp << ", data parallel " << e.dp
                << (e.pp > 1 ? ", " + std::to_string(e.pp) + " pipeline stages" : std::string()) << ", "
                << e.arguments.size() << " arguments)\n";
    }
    for (const std::string& n : e.notes) std::cerr << "note: " << n << "\n";
    return exit_ok;
  }
  int axis = -1;
  if (!o.axis.empty()) {
    axis = lp.mesh().find_axis(o.axis);
    if (axis < 0) {
      if (o.axis.find_first_not_of("0123456789") != std::string::npos || o.axis.size() > 2)
        throw spec_error("--axis " + quoted_text(o.axis) + " is neither a mesh axis number nor a name of the plan's mesh " +
                         to_string(lp.mesh()));
      axis = std::stoi(o.axis);
    }
  }
  const bool hf = o.to == "hf-tp-plan";
  export_options eo;
  eo.target = hf ? export_target::hf : export_target::dtensor;
  eo.tp_axis = axis;
  eo.transformers_major = o.transformers;
  const tp_export e = export_tensor_parallel(lp, eo);
  const nlohmann::json j = hf ? to_hf_tp_plan(e) : to_dtensor_plan(e);
  const std::string text = j.dump(2) + "\n";
  if (o.out.empty()) {
    std::cout << text;
  } else {
    write_file_atomically(out, text);
    std::cout << "wrote " << escaped_text(o.out) << " (" << o.to << ", " << lp.mesh().axis_label(static_cast<std::size_t>(e.tp_axis))
              << " of " << to_string(lp.mesh()) << ", "
              << (hf ? j["tp_plan"].size() : j["plan"].size()) << " entries)\n";
  }
  for (const std::string& n : e.notes) std::cerr << "note: " << n << "\n";
  return exit_ok;
}

}  // namespace

void register_export(CLI::App& app, action& run) {
  auto o = std::make_shared<export_cli_options>();
  CLI::App* cmd = app.add_subcommand("export", "write a plan as a Hugging Face tp_plan, a PyTorch parallelize_module plan or Megatron-LM's arguments");
  cmd->add_option("--plan", o->plan, "plan file written by `autoshard plan --out`")->required();
  cmd->add_option("--to", o->to,
                  "hf-tp-plan (transformers' tp_plan), dtensor (parallelize_module styles and layouts, FSDP2 units for "
                  "ZeRO-3) or megatron (Megatron-LM's command-line arguments: parallelism, micro-batches, recomputation, "
                  "the model)")
      ->required()
      ->check(CLI::IsMember({"hf-tp-plan", "dtensor", "megatron"}));
  cmd->add_option("--out", o->out, "file to write (default: stdout); notes go to stderr");
  add_follow_symlinks(*cmd, o->follow_symlinks);
  cmd->add_option("--transformers", o->transformers,
                 "hf-tp-plan: the transformers major release whose style names to write: 5 (the current one) or 4")
      ->capture_default_str()
      ->check(CLI::IsMember({4, 5}));
  cmd->add_option("--axis", o->axis, "the tensor-parallel mesh axis, a number or a name (default: the axis named tp, else the last of size > 1)");
  cmd->footer(
      "Examples:\n"
      "  autoshard plan --model llama-7b --mesh dp=2,tp=4 --algo megatron --out plan.json --quiet\n"
      "  autoshard export --plan plan.json --to hf-tp-plan --out tp_plan.json\n"
      "  autoshard export --plan plan.json --to dtensor --out dtensor.json\n"
      "  autoshard export --plan plan.json --to megatron");
  cmd->callback([o, cmd, &run] {
    // --transformers names the style names of a tp_plan: the other formats have none, and it
    // was taken without a word (`--to dtensor --transformers 4` wrote the one DTensor plan).
    if (o->to != "hf-tp-plan")
      refuse_given(*cmd, {"--transformers"}, "picks the style names of a Hugging Face tp_plan (--to hf-tp-plan); --to " + o->to +
                                                 " has none: leave it out");
    run = [o] { return run_export(*o); };
  });
}

}  // namespace autoshard::tool
