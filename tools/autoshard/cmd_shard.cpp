// autoshard shard: cut a safetensors checkpoint into one file per rank, by a built-in
// tensor-parallel policy or by a solved plan, with DIR/index.json saying what went where.
#include "common.hpp"
#include "hf_weights.hpp"  // check_checkpoint_config: the weights against config.json
#include "paths.hpp"
#include "plan_file.hpp"

#include <autoshard/tensor/tensor.hpp>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <iostream>

namespace autoshard::tool {
namespace {

struct shard_cli_options {
  std::string checkpoint;
  std::string policy;
  int tp = 0;
  std::string plan;
  std::string config;
  std::string out;
  std::string dtype_name;
  bool json = false;
  bool quiet = false;
  bool follow_symlinks = false;
};

/// config.json beside the checkpoint (or inside it, for a directory), if there is one.
std::filesystem::path default_config(const std::filesystem::path& ck) {
  namespace fs = std::filesystem;
  fs::path dir = fs::is_directory(ck) ? ck : ck.parent_path();
  fs::path c = (dir.empty() ? fs::path(".") : dir) / "config.json";
  return fs::exists(c) ? c : fs::path();
}

/// Removes the sharded checkpoint in `dir` (index.json and rank-<r>.safetensors) when it is
/// provably a sharding run's output: it reads as one (sharded_checkpoint: one generation,
/// every rank file present) and none of its files is one of `keep` (the input's). `whole`: only
/// when the directory holds nothing else, and the directory with it; otherwise other entries
/// (stage directories) stay. Anything else is left as it is; returns "" when it was removed,
/// else why not ("it is not wholly a sharded checkpoint", "it holds '…', a file of the input").
std::string remove_sharded_output(const std::filesystem::path& dir, bool whole, const std::vector<std::filesystem::path>& keep = {}) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(fs::symlink_status(dir, ec))) return "it is not a directory (a link or a file)";
  int world = 0;
  try {
    world = sharded_checkpoint(dir).world_size();
  } catch (const std::exception&) {
    return "it is not wholly a sharded checkpoint";
  }
  std::vector<fs::path> files;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    bool ours = n == "index.json";
    for (int r = 0; r < world && !ours; ++r) ours = n == rank_file("", r).string();
    if (ours)
      for (const auto& k : keep) {
        std::error_code sec;
        if (fs::equivalent(k, it->path(), sec)) return "it holds " + quoted_path(it->path().string()) + ", a file of the input checkpoint";
      }
    if (ours) files.push_back(it->path());
    else if (whole) return "it holds " + quoted_path(it->path().string()) + ", which no sharding run writes";
  }
  if (ec) return "it cannot be listed: " + ec.message();
  for (const auto& f : files) fs::remove(f, ec);
  if (whole && !fs::remove(dir, ec)) return "it cannot be removed" + (ec ? ": " + ec.message() : std::string());
  return {};
}

/// What an earlier run of another layout left in `out` beside this run's output of `stages`
/// stages (0: not pipelined, the rank files in `out` itself): stage-<k> for k >= stages, and for
/// a pipelined run the unpipelined output at the top. A reader would take it for this run's (a
/// 4-stage output sharded again on 2 stages kept stage-2 and stage-3, layers 2-3 and the head a
/// second time). Each is removed when it is a sharder's output, as the rank files beyond a
/// smaller world are; anything else is left, with a note (even with --quiet, which silences the
/// progress). The files of checkpoint `in` are never removed.
void remove_other_layouts(const std::filesystem::path& out, std::size_t stages, const checkpoint& in) {
  namespace fs = std::filesystem;
  std::vector<fs::path> inputs;
  for (const auto& f : in.files()) inputs.push_back(f.path());
  std::error_code ec;
  std::vector<fs::path> extra;
  for (fs::directory_iterator it(out, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    const std::string digits = n.rfind("stage-", 0) == 0 ? n.substr(6) : std::string();
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos ||
        (digits.size() > 1 && digits[0] == '0') || std::stoul(digits) < stages)
      continue;
    extra.push_back(it->path());
  }
  const std::string layout = stages ? "this pipeline's (it has " + count_noun(stages, "stage") + ")" : "this output's (not pipelined)";
  for (const fs::path& dir : extra)
    if (const std::string why = remove_sharded_output(dir, /*whole=*/true, inputs); !why.empty())
      std::cerr << "note: " << quoted_path(dir.string()) << " is not " << layout << " and is left as it is: " << why << "\n";
  if (stages && fs::exists(out / "index.json", ec))
    if (const std::string why = remove_sharded_output(out, /*whole=*/false, inputs); !why.empty())
      std::cerr << "note: " << quoted_path((out / "index.json").string()) << " is not " << layout
                << " and is left as it is: " << why << "\n";
}

/// `shard --plan` of a pipelined plan: DIR/stage-<k>/ per stage, each a sharded checkpoint
/// (rank files and index.json) of the stage's tensors alone, one rank file per (stage,
/// tensor-parallel) coordinate (stage_policies_for: data-parallel replicas written once).
int shard_stages(const shard_cli_options& o, const checkpoint& in, const plan_document& plan, const shard_options& so) {
  namespace fs = std::filesystem;
  const std::vector<stage_shards> stages = stage_policies_for(plan, in, o.plan);
  command_paths paths(o.follow_symlinks);
  for (const auto& f : in.files()) paths.input("checkpoint file", f.path());
  for (std::size_t k = 0; k < stages.size(); ++k) {
    const fs::path dir = fs::path(o.out) / ("stage-" + std::to_string(k));
    // The stage directories are the sharder's own: one that is a symbolic link sent the stage's
    // rank files wherever it pointed (beside the input checkpoint, for `stage-1 -> ck`).
    std::error_code ec;
    if (!o.follow_symlinks && fs::is_symlink(fs::symlink_status(dir, ec)))
      throw io_error("--out stage directory " + quoted_path(dir.string()) + " is a symbolic link (to " +
                     quoted_path(fs::read_symlink(dir, ec).string()) + "): the sharder makes its stage directories itself; remove "
                     "it, or give --follow-symlinks to write where it points");
    check_shard_count(stages[k].policy.mesh.num_ranks(), stages[k].names.size());
    for (int r = 0; r < stages[k].policy.mesh.num_ranks(); ++r) paths.output("--out rank file", rank_file(dir, r));
    paths.output("--out index", dir / "index.json");
  }
  paths.check();
  // Every stage is written under temporary names before any is put in place: a stage that
  // fails (no room, an error in its tensors) leaves an older run's stages all as they were.
  std::vector<pending_shard_checkpoint> pending;
  for (std::size_t k = 0; k < stages.size(); ++k)
    pending.push_back(prepare_shard_checkpoint(in, stages[k].policy, stages[k].names, fs::path(o.out) / ("stage-" + std::to_string(k)), so));
  nlohmann::json files = nlohmann::json::array();
  std::uint64_t bytes = 0;
  for (std::size_t k = 0; k < stages.size(); ++k) {
    const fs::path dir = pending[k].dir();
    shard_report r;
    try {
      r = pending[k].commit();
    } catch (...) {
      // Renaming failed part way (a file system error): the stages put in place already are
      // removed, so no mix of this run's stages and an older run's is left.
      for (std::size_t done = 0; done < k; ++done) (void)remove_sharded_output(pending[done].dir(), /*whole=*/true);
      throw;
    }
    bytes += r.bytes_written;
    files.push_back({{"stage", k}, {"holds", describe_stage(*plan.pipeline, k)}, {"dir", dir.string()},
                     {"world_size", r.world_size}, {"tensors", stages[k].names.size()}, {"bytes_written", r.bytes_written}});
    if (!o.json)
      std::cout << "stage " << k << " (" << describe_stage(*plan.pipeline, k) << "): " << stages[k].names.size() << " tensors into "
                << r.world_size << " rank files on " << to_string(stages[k].policy.mesh) << ", "
                << human_bytes(static_cast<double>(r.bytes_written)) << ", in " << escaped_text(dir.string()) << "\n";
  }
  remove_other_layouts(o.out, stages.size(), in);
  if (o.json)
    std::cout << nlohmann::json{{"checkpoint", o.checkpoint}, {"how", "plan " + o.plan + ", " + describe(*plan.pipeline)},
                                {"stages", files}, {"bytes_written", bytes}}.dump(2)
              << "\n";
  return exit_ok;
}

int run_shard(const shard_cli_options& o) {
  namespace fs = std::filesystem;
  // Inputs first checked as files (a FIFO would block), then opened; outputs checked below.
  command_paths paths(o.follow_symlinks);
  paths.input_or_dir("checkpoint", o.checkpoint);
  if (!o.plan.empty()) paths.input("--plan", o.plan);
  if (!o.config.empty()) paths.input("--config", o.config);
  paths.check();
  const checkpoint in(o.checkpoint);
  // Every file the checkpoint is made of is an input the outputs must not replace.
  for (const auto& f : in.files()) paths.input("checkpoint file", f.path());
  auto check_outputs = [&](int ranks) {
    check_shard_count(ranks, in.size());  // before a path is made per rank: a 2^20-rank plan
    for (int r = 0; r < ranks; ++r) paths.output("--out rank file", rank_file(o.out, r));
    paths.output("--out index", fs::path(o.out) / "index.json");
    paths.check();
  };
  shard_options so;
  if (!o.dtype_name.empty()) so.convert_to = parse_dtype_or_throw(o.dtype_name);
  so.follow_symlinks = o.follow_symlinks;

  const bool tty = ::isatty(STDERR_FILENO) == 1;
  auto last = std::chrono::steady_clock::now() - std::chrono::seconds(10);
  bool printed = false;
  so.progress = [&](const shard_progress& p) {
    if (o.quiet) return;
    const auto now = std::chrono::steady_clock::now();
    const bool done = p.bytes_done == p.bytes_total;
    if (!done && now - last < std::chrono::milliseconds(tty ? 100 : 1000)) return;
    last = now;
    std::fprintf(stderr, "%sshard: %s of %s  %s/s  %.1f s%s", tty ? "\r\033[K" : "",
                 human_bytes(static_cast<double>(p.bytes_done)).c_str(),
                 human_bytes(static_cast<double>(p.bytes_total)).c_str(), human_bytes(p.bytes_per_second).c_str(),
                 p.seconds, tty ? "" : "\n");
    printed = true;
  };

  shard_report r;
  std::string how;
  if (!o.policy.empty()) {
    auto normal = [](std::string n) {
      for (char& c : n)
        if (c == '-') c = '_';
      return n;
    };
    const fs::path cfg = o.config.empty() ? default_config(o.checkpoint) : fs::path(o.config);
    const model_config config = cfg.empty() ? model_config{} : load_model_config(cfg);
    const std::string model_type = cfg.empty() ? std::string() : normal(load_model_type(cfg));
    std::string name = normal(o.policy);
    if (name == "auto") {
      if (cfg.empty()) throw spec_error("--policy auto reads model_type from config.json, but there is none beside " +
                                        quoted_path(o.checkpoint) + ": give --config or a policy by name");
      if (model_type.empty()) throw spec_error("--policy auto: " + quoted_path(cfg.string()) + " has no \"model_type\"; give a policy by name");
      name = model_type;
    } else if (!model_type.empty() && model_type != name) {
      throw spec_error("policy " + quoted_text(name) + " does not fit this checkpoint: " + quoted_path(cfg.string()) + " says model_type " +
                       quoted_text(model_type) + " (use --policy auto, or --policy " + quoted_text(model_type) + ")");
    }
    const tp_policy policy = policies::by_model_type(name);
    // The weights must be the model the config describes: a policy cuts by names and head
    // counts, so a checkpoint of another width (or dtype) was cut as if it were this one. A
    // config without a model_type describes no model to build; the policy's names decide.
    // (The library's checks first: a layer missing a tensor, or a layer count other than the
    // config's, in their own words.)
    if (!model_type.empty()) {
      check_policy_fits(in, policy, config, so);
      check_checkpoint_config(in, o.checkpoint, cfg);
    }
    // As the library bounds it, before a path is made per rank: --tp 1048576 passed the flag's
    // range and made a million paths (15 s) before "axis size 1048576 is not in [1, 1000000]".
    check_mesh_size({o.tp}, "tensor-parallel size " + std::to_string(o.tp));
    check_outputs(o.tp);
    r = shard_checkpoint(in, policy, o.tp, config, o.out, so);
    how = "policy " + policy.name + ", tp " + std::to_string(o.tp);
  } else if (const plan_document plan = read_plan_file(o.plan); plan.pipeline) {
    return shard_stages(o, in, plan, so);
  } else {
    const plan_policy policy = plan_policy_for(plan, in, o.plan);
    check_outputs(policy.mesh.num_ranks());
    r = shard_checkpoint(in, policy, o.out, so);
    how = "plan " + o.plan + " on " + to_string(policy.mesh);
  }
  if (printed && tty) std::fputc('\n', stderr);
  remove_other_layouts(o.out, 0, in);  // a pipelined run's stage directories

  if (o.json) {
    nlohmann::json files = nlohmann::json::array();
    for (int k = 0; k < r.world_size; ++k) files.push_back(rank_file(o.out, k).string());
    std::cout << nlohmann::json{{"checkpoint", o.checkpoint}, {"how", how},        {"world_size", r.world_size},
                                {"bytes_written", r.bytes_written}, {"seconds", r.seconds},
                                {"largest_buffer", r.largest_buffer}, {"files", files},
                                {"index", (fs::path(o.out) / "index.json").string()}}
                     .dump(2)
              << "\n";
    return exit_ok;
  }
  std::cout << "sharded " << in.size() << " tensors of " << escaped_text(o.checkpoint) << " by " << escaped_text(how) << " into "
            << r.world_size << " rank files: " << human_bytes(static_cast<double>(r.bytes_written)) << " in "
            << human_seconds(r.seconds) << " ("
            << human_bytes(r.seconds > 0 ? static_cast<double>(r.bytes_written) / r.seconds : 0.0) << "/s)\n"
            << "  " << escaped_text(rank_file(o.out, 0).string()) << " .. " << escaped_text(rank_file(o.out, r.world_size - 1).string()) << "\n"
            << "  " << escaped_text((fs::path(o.out) / "index.json").string()) << " says which block of which tensor each rank holds\n";
  return exit_ok;
}

}  // namespace

void register_shard(CLI::App& app, action& run) {
  auto o = std::make_shared<shard_cli_options>();
  CLI::App* cmd = app.add_subcommand("shard", "cut a safetensors checkpoint into one file per rank");
  cmd->footer(
      "Examples:\n"
      "  autoshard shard ckpt --policy gpt2 --tp 4 --out shards\n"
      "  autoshard shard ckpt --plan plan.json --out shards");

  cmd->add_option("checkpoint", o->checkpoint, "model.safetensors, its index json, or a directory")->required();
  auto* pol = cmd->add_option("--policy", o->policy, "built-in policy: gpt2, bert, opt, gpt_neox, bloom, llama, or auto (config.json's model_type)");
  cmd->add_option("--tp", o->tp, "tensor-parallel size (with --policy), at most 1048576 (2^20, the most ranks a mesh has)")
      ->needs(pol)
      ->check(CLI::Range(1, static_cast<int>(max_parsed_mesh_ranks)));
  auto* plan = cmd->add_option("--plan", o->plan, "a plan file written by `autoshard plan --out`");
  pol->excludes(plan);
  cmd->add_option("--config", o->config, "Hugging Face config.json (default: the one beside the checkpoint)");
  cmd->add_option("--out", o->out, "output directory")->required();
  cmd->add_option("--dtype", o->dtype_name, "convert float tensors to this float dtype (f32, bf16, f16, f64)")
      ->check(dtype_value(true));
  add_follow_symlinks(*cmd, o->follow_symlinks);
  cmd->add_flag("--json", o->json, "write one JSON document to stdout");
  cmd->add_flag("--quiet", o->quiet, "no progress on stderr");
  cmd->callback([o, cmd, &run] {
    if (o->policy.empty() && o->plan.empty()) throw CLI::RequiredError("--policy (with --tp) or --plan");
    if (!o->policy.empty() && o->tp == 0) throw CLI::RequiredError("--tp (the tensor-parallel size, with --policy)");
    // A plan's graph is the model: --config was checked as an input and then never read.
    if (!o->plan.empty())
      refuse_given(*cmd, {"--config"}, "the config.json a --policy cuts by; with --plan the plan's graph says the model: leave it out");
    run = [o] { return run_shard(*o); };
  });
}

}  // namespace autoshard::tool
