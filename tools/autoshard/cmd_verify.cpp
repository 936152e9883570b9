// autoshard verify: execute a plan file on one local Gloo rank per device of its mesh and
// compare every operator with the unsharded run of the same graph and seeded weights.
#include "common.hpp"
#include "paths.hpp"
#include "progress.hpp"

#include <autoshard/exec/exec.hpp>

#include <iostream>

#if defined(__GLIBC__)
#include <malloc.h>  // mallopt
#endif

namespace autoshard::tool {
namespace {

struct verify_cli_options {
  std::string plan;
  std::string dtype_name = "f64";
  std::uint64_t seed = 1;
  double rtol = 0.0;
  double timeout = 120.0;
  std::string max_memory;
  std::string optimizer;  // empty: the one the plan was priced with
  std::int64_t batch = 0, seq = 0;  // 0: the plan's
  bool forward_only = false;
  bool json = false;
  bool progress = false;
};

std::string without_prefix(std::string s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0 ? s.substr(prefix.size()) : s;
}

/// The communication audit: totals, then every site/kind/axis line with both sides.
nlohmann::json traffic_json(const traffic_audit& a) {
  nlohmann::json lines = nlohmann::json::array();
  for (const traffic_line& l : a.lines)
    lines.push_back({{"site", l.where},
                     {"kind", l.kind},
                     {"mesh_axis", l.mesh_axis},
                     {"priced_bytes", l.priced_bytes},
                     {"executed_bytes", l.executed_bytes},
                     {"priced_calls", l.priced_calls},
                     {"executed_calls", l.executed_calls},
                     {"matches", l.matches()},
                     {"documented", l.documented.empty() ? nlohmann::json(nullptr) : nlohmann::json(l.documented)}});
  return {{"checked", a.checked},
          {"passed", a.passed()},
          {"priced_bytes", a.priced_bytes},
          {"executed_bytes", a.executed_bytes},
          {"documented_bytes", a.documented_bytes},
          {"mismatches", a.mismatches},
          {"first_mismatch", a.mismatches > 0 ? nlohmann::json(a.lines[a.first_mismatch].where) : nlohmann::json(nullptr)},
          {"lines", lines}};
}

/// Every parameter's gradient synchronisations in the step (name -> count; 0: none needed),
/// and how many parameters were synchronised once and how many at every micro-step.
nlohmann::json gradient_syncs_json(const model_graph& g, const verify_report& r) {
  nlohmann::json per = nlohmann::json::object();
  std::size_t once = 0, every = 0;
  for (vertex_t v = 0; v < r.gradient_syncs.size(); ++v) {
    if (!g[v].is_parameter()) continue;
    per[g[v].name] = r.gradient_syncs[v];
    once += r.gradient_syncs[v] == 1 ? 1 : 0;
    every += r.gradient_syncs[v] > 1 ? 1 : 0;
  }
  return {{"once_per_step", once}, {"every_micro_step", every}, {"parameters", per}};
}

int run_verify(const verify_cli_options& o) {
#if defined(__GLIBC__)
  // Tensors of 128 KiB and more are mapped and unmapped whole. glibc's default threshold
  // rises to the largest block freed (up to 32 MiB), after which freed gradients and pieces
  // stay in the rank threads' arenas: the resident size would grow past the live bytes that
  // the estimate counts and the run frees. (At 1 MiB, GPT-2's pieces at sequence 256, 768
  // KiB each, stayed there: 3.00 GiB resident against an estimate of 2.80 GiB.)
  mallopt(M_MMAP_THRESHOLD, 128 << 10);
#endif
  command_paths{}.input("--plan", o.plan).check();
  plan_document doc = read_plan_file(o.plan);
  // An inference plan's check is its forward pass: --optimizer sgd was taken without a word.
  if (!o.optimizer.empty() && doc.pricing.mode != run_mode::training)
    throw spec_error("--optimizer " + o.optimizer + ": " + quoted_path(o.plan) + " is an inference plan, whose check is its forward pass, "
                     "with no optimizer step: leave --optimizer out");
  // Before the plan is re-priced (seconds on a large graph): every operator has a kernel, and
  // a training check needs a loss.
  require_known_operators(doc.graph, doc.pricing.mode == run_mode::training && !o.forward_only);
  if (doc.pricing.mode == run_mode::training && !o.forward_only) (void)training_losses(doc.graph);
  if (o.batch > 0 || o.seq > 0) doc.graph = with_batch_seq(doc.graph, o.batch, o.seq);
  // Another batch is split over the same ranks into another micro-batch (which the run does not use).
  if (o.batch > 0) doc.pricing.micro_batch = 0;
  // Before the plan is re-priced and any rank runs: a --seq beyond the model's position table.
  check_position_tables(doc.graph, o.seq > 0 ? "--seq " + std::to_string(o.seq) : std::string());
  const loaded_plan lp = [&] {
    try {
      return load_plan(std::move(doc), o.plan);
    } catch (const solver_error& e) {
      if (o.batch == 0 && o.seq == 0) throw;
      throw solver_error("at --batch " + (o.batch > 0 ? std::to_string(o.batch) : std::string("(the plan's)")) + " --seq " +
                         (o.seq > 0 ? std::to_string(o.seq) : std::string("(the plan's)")) +
                         " the plan no longer fits its graph: " + without_prefix(e.what(), "solver error: ") +
                         "; choose sizes its shards divide");
    }
  }();
  verify_options vo;
  vo.compute = parse_dtype_or_throw(o.dtype_name);
  if (vo.compute != dtype::f32 && vo.compute != dtype::f64)
    throw exec_error("--dtype: verify computes in f32 or f64, not " + o.dtype_name);
  vo.seed = o.seed;
  vo.rtol = o.rtol;
  if (!(o.timeout > 0.0)) throw exec_error("--timeout must be positive seconds, got " + std::to_string(o.timeout));
  vo.timeout = std::chrono::milliseconds(checked_milliseconds(o.timeout, "--timeout"));
  if (!o.max_memory.empty()) vo.max_memory = static_cast<std::uint64_t>(parse_bytes(o.max_memory, "--max-memory"));
  vo.training = lp.document.pricing.mode == run_mode::training && !o.forward_only;
  vo.step.optimizer = o.optimizer.empty() ? lp.document.pricing.optimizer : *parse_optimizer_kind(o.optimizer);
  const std::string optimizer(to_string(vo.step.optimizer));
  if (!o.json)
    std::cerr << "running " << o.plan << " (" << boost::num_vertices(lp.graph()) << " vertices, " << to_string(lp.document.options.algo) << ", "
              << to_string(lp.document.pricing.mode) << " plan; "
              << (vo.training ? "forward, backward and one " + optimizer + " step" +
                                    (plan_micro_batches(lp.document) > 1
                                         ? " over " + std::to_string(plan_micro_batches(lp.document)) + " micro-batches"
                                         : std::string())
                              : std::string("the forward pass"))
              << ") on "
              << (lp.document.pipeline ? describe(*lp.document.pipeline) + ", each stage on " : std::string())
              << to_string(lp.mesh()) << " ...\n";
  if (!o.json && lp.document.pricing.mode == run_mode::training)
    std::cerr << "priced for training with " << describe_training(lp.document.pricing) << "\n";
  phase_printer progress(progress_wanted(o.progress), "verify");
  vo.progress = [&progress](const verify_progress& p) {
    const std::string phase = p.phase;
    progress(phase, p.done, p.total,
             phase == "reference" ? "operators (the unsharded training step)"
             : phase == "ranks"   ? "pieces compared with the unsharded run"
                                  : "tensors merged over the ranks",
             p.seconds);
  };
  const verify_report r = verify_plan(lp, vo);  // audited against the collectives the plan is priced with
  progress.finish();
  if (o.json) {
    const auto list = [](const std::vector<vertex_check>& v) {
      nlohmann::json checks = nlohmann::json::array();
      for (const vertex_check& c : v)
        checks.push_back({{"name", c.name},
                          {"spec", c.spec},
                          {"max_abs_diff", c.max_abs_diff},
                          {"ref_max_abs", c.ref_max_abs},
                          {"passed", c.passed}});
      return checks;
    };
    nlohmann::json j{{"plan", o.plan},
                     {"mesh", to_json(r.mesh)},
                     {"ranks", r.mesh.num_ranks() * r.stages},
                     {"stages", r.stages},
                     {"dtype", std::string(to_string(r.compute))},
                     {"seed", o.seed},
                     {"rtol", r.rtol},
                     {"passed", r.passed()},
                     {"failed", r.failed},
                     {"first_failed", r.first_failed.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.first_failed)},
                     {"max_abs_diff", r.max_abs_diff},
                     {"max_rel_diff", r.max_rel_diff},
                     {"reference_seconds", r.reference_seconds},
                     {"sharded_seconds", r.sharded_seconds},
                     {"estimated_peak_bytes", r.estimate.total()},
                     {"training", vo.training},
                     {"worst", r.worst},
                     {"operators", list(r.checks)},
                     {"gradients", list(r.gradients)},
                     {"updates", list(r.updates)},
                     {"losses", list(r.losses)},
                     {"micro_batches", r.micro_batches},
                     {"recomputed_forwards", r.replayed_forwards},
                     {"gradient_syncs", gradient_syncs_json(lp.graph(), r)},
                     {"communication", traffic_json(r.traffic)}};
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << r;
  }
  if (r.failed > 0)
    std::cerr << "autoshard: verify: the plan's result differs from the unsharded run at " << count_noun(r.failed, "tensor")
              << "; the first is " << quoted_text(r.first_failed) << ", the worst " << quoted_text(r.worst) << "\n";
  if (!r.traffic.passed())
    std::cerr << "autoshard: verify: the executed communication differs from what the cost model priced at "
              << count_noun(r.traffic.mismatches, "place") << "; the first is "
              << escaped_text(r.traffic.lines[r.traffic.first_mismatch].where) << "\n";
  if (!r.passed()) return exit_user_error;
  return exit_ok;
}

}  // namespace

void register_verify(CLI::App& app, action& run) {
  auto o = std::make_shared<verify_cli_options>();
  CLI::App* cmd = app.add_subcommand(
      "verify", "execute a plan on local Gloo ranks (one per device) and compare with the unsharded run");
  cmd->footer(
      "Examples:\n"
      "  autoshard plan --model gpt2 --layers 1 --hidden 32 --heads 4 --vocab 128 --seq 16 --batch 8 --out small.json\n"
      "  autoshard verify --plan small.json --dtype f32");
  cmd->add_option("--plan", o->plan, "plan file written by `autoshard plan --out`")->required();
  cmd->add_option("--dtype", o->dtype_name, "compute in f64 (differences are rounding only) or f32")
      ->check(CLI::IsMember({"f32", "f64"}))
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "seed of the input and weight values")->capture_default_str()->check(seed_value());
  cmd->add_option("--rtol", o->rtol, "tolerance relative to max(1, |values|); 0 = 1e-9 for f64, 1e-3 for f32")
      ->capture_default_str()
      ->check(finite_in(0, 1));
  cmd->add_option("--timeout", o->timeout, "seconds a rank waits in one collective")
      ->capture_default_str()
      ->check(finite_in(0, 86400, true));  // a day, as docs/cli.md says
  cmd->add_option("--max-memory", o->max_memory,
                  "refuse to start when the estimated peak is above this (e.g. 8GiB); "
                  "default: MemAvailable, or less under a cgroup's limit")
      ->check(byte_size());
  cmd->add_option("--optimizer", o->optimizer,
                  "training plans: the optimizer step checked after the backward (default: the plan's)")
      ->check(CLI::IsMember({"adam", "sgd"}));
  cmd->add_flag("--forward-only", o->forward_only, "training plans: check the forward pass only");
  cmd->add_option("--batch", o->batch,
                  "run the plan's graph at this batch size (a micro-step's, in a plan of micro-batches; the plan's "
                  "strategies, checked to still fit)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  cmd->add_option("--seq", o->seq, "run the plan's graph at this sequence length (the plan's strategies, checked to still fit)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  cmd->add_flag("--json", o->json, "write one JSON document to stdout");
  cmd->add_flag("--progress", o->progress,
                "progress of each phase (reference run, ranks, comparison) on stderr even when it is not a terminal");
  cmd->callback([o, cmd, &run] {
    // No optimizer step runs in a check of the forward pass: --optimizer was taken without a word.
    if (o->forward_only)
      refuse_given(*cmd, {"--optimizer"}, "picks the optimizer step checked after the backward; --forward-only checks the "
                                          "forward pass alone: leave one of them out");
    run = [o] { return run_verify(*o); };
  });
}

}  // namespace autoshard::tool
