// autoshard verify: execute a plan file on one local Gloo rank per device of its mesh and
// compare every operator with the unsharded run of the same graph and seeded weights, or a
// checkpoint's (--weights), writing the logits of both runs for a client to judge (--outputs).
#include "common.hpp"
#include "hf_weights.hpp"  // hf_checkpoint, check_weights_match: a checkpoint matched as shard matches it
#include "paths.hpp"
#include "plan_file.hpp"   // checkpoint_name
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
  std::string weights;  // a checkpoint directory: the parameters' values
  std::string tokens;   // a JSON file of token ids: input_ids
  std::string outputs;  // a safetensors file: the inputs and outputs of both runs
};

/// The most token ids a --tokens file may give (the batch and sequence flags' bounds allow
/// more, but no run of that many ids fits a host).
inline constexpr std::int64_t max_token_ids = std::int64_t{1} << 28;

/// `--tokens FILE`: a JSON array of B arrays of S token ids (or one array of S ids, batch 1),
/// as a tokenizer's input_ids; every row as long, every id an integer (its range against the
/// vocabulary is checked with the run's other sources, check_source_values).
host_tensor read_tokens(const std::string& path) {
  const nlohmann::json j = load_json_file(path, "--tokens file");
  const std::string where = "--tokens file " + quoted_path(path);
  if (!j.is_array() || j.empty())
    throw io_error(where + " must hold a JSON array of token ids, or an array of such arrays (one per sequence), not " + autoshard::detail::json_excerpt(j));
  const bool one = !j.front().is_array();
  const std::size_t rows = one ? 1 : j.size();
  const std::size_t cols = one ? j.size() : j.front().size();
  if (cols == 0) throw io_error(where + ": its first sequence has no ids");
  if (static_cast<double>(rows) * static_cast<double>(cols) > static_cast<double>(max_token_ids))
    throw io_error(where + " gives " + std::to_string(rows) + " sequences of " + std::to_string(cols) + " ids; at most " +
                   std::to_string(max_token_ids) + " ids are read");
  host_tensor t(dtype::i64, tensor_shape{static_cast<std::int64_t>(rows), static_cast<std::int64_t>(cols)});
  std::int64_t* p = t.as<std::int64_t>();
  for (std::size_t r = 0; r < rows; ++r) {
    const nlohmann::json& row = one ? j : j[r];
    if (!row.is_array() || row.size() != cols)
      throw io_error(where + ": sequence " + std::to_string(r) + " has " + (row.is_array() ? std::to_string(row.size()) + " ids" : "no array") +
                     ", the first " + std::to_string(cols) + " (every sequence of a batch is as long)");
    for (std::size_t c = 0; c < cols; ++c) {
      const std::optional<std::int64_t> id = json_int64(row[c]);
      if (!id) throw io_error(where + ": sequence " + std::to_string(r) + ", position " + std::to_string(c) + " is " + autoshard::detail::json_excerpt(row[c]) + ", not an integer token id");
      p[r * cols + c] = *id;
    }
  }
  return t;
}

/// The graph input that `--tokens` feeds: input_ids.
std::optional<vertex_t> token_input(const model_graph& g) {
  const auto v = find_vertex(g, "input_ids");
  return v && g[*v].is_input() ? v : std::nullopt;
}

/// `--weights DIR`: the checkpoint checked against the plan's graph as `shard` and `plan`
/// check one (names with or without the base-model prefix, tied copies, saved buffers and task
/// heads; shapes, and a float dtype verify can convert), before the plan is re-priced or a rank
/// starts. Returns the largest tensor's bytes: what reading one while converting it holds.
std::uint64_t check_weights(const model_graph& g, const checkpoint& ck, const std::string& dir, const std::string& plan) {
  weights_check how;
  how.where = dir;
  how.config = "the graph of plan file " + quoted_path(plan);
  how.compare_dtype = false;  // converted to the compute dtype
  check_weights_match(g, ck, how);
  std::uint64_t largest = 0;
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
    if (!g[v].is_parameter()) continue;
    const std::string n = checkpoint_name(ck, g[v].name);
    const safetensors_entry& e = ck.entry(n);
    if (e.type != dtype::f64 && e.type != dtype::f32 && e.type != dtype::f16 && e.type != dtype::bf16)
      throw io_error("the weights in " + quoted_path(dir) + ": " + quoted_text(n) + " is " + std::string(to_string(e.type)) +
                     ", not a float dtype verify converts (f64, f32, f16, bf16)");
    largest = std::max<std::uint64_t>(largest, e.nbytes());
  }
  return largest;
}

/// Every parameter of `g` read from `ck` and converted to `compute`, one tensor at a time (its
/// pages dropped after), and input_ids from `tokens` when given; the rest left to the seed.
std::vector<host_tensor> checkpoint_sources(const model_graph& g, dtype compute, const checkpoint* ck, const host_tensor* tokens) {
  std::vector<host_tensor> out(boost::num_vertices(g));
  for (vertex_t v = 0; ck && v < boost::num_vertices(g); ++v) {
    if (!g[v].is_parameter()) continue;
    const std::string n = checkpoint_name(*ck, g[v].name);
    const safetensors_entry& e = ck->entry(n);
    const safetensors_file& f = ck->file_of(n);
    host_tensor t(compute, g[v].shape);
    const std::byte* src = f.bytes(e).data();
    std::byte* dst = t.data();
    const std::int64_t count = t.numel();
    f.read_guarded([&] { convert_into(src, e.type, dst, compute, count); });
    f.release(e);
    out[v] = std::move(t);
  }
  if (tokens) {
    const vertex_t v = *token_input(g);
    if (!(g[v].shape == tokens->shape()))
      throw exec_error("--tokens gives " + to_string(tokens->shape()) + " ids but the run feeds input_ids " + to_string(g[v].shape) +
                       " (a training plan of micro-batches runs its global batch: give that many sequences)");
    out[v] = host_tensor::copy_of(tokens->view());
  }
  return out;
}

/// `--outputs FILE`: the run's graph inputs ("input.NAME"), and each output of the unsharded
/// run ("unsharded.NAME") and of the sharded one gathered whole ("sharded.NAME"), written at
/// once (atomically: a failed write leaves no file, and an earlier one whole).
void write_outputs(const std::string& path, const verify_report& r, const verify_cli_options& o) {
  std::vector<std::pair<std::string, const_tensor_view>> tensors;
  std::string names;
  for (const named_tensor& t : r.inputs) tensors.emplace_back("input." + t.name, t.value.view());
  for (const named_tensor& t : r.unsharded_outputs) {
    tensors.emplace_back("unsharded." + t.name, t.value.view());
    names += (names.empty() ? "" : ",") + t.name;
  }
  for (const named_tensor& t : r.sharded_outputs) tensors.emplace_back("sharded." + t.name, t.value.view());
  save_safetensors(path, tensors,
                   {{"plan", o.plan}, {"weights", o.weights}, {"dtype", std::string(to_string(r.compute))}, {"outputs", names},
                    {"passed", r.passed() ? "true" : "false"}});
}

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
  command_paths paths;
  paths.input("--plan", o.plan);
  if (!o.tokens.empty()) paths.input("--tokens", o.tokens);
  if (!o.weights.empty()) paths.input_or_dir("--weights", o.weights);
  paths.check();  // the inputs exist before the checkpoint is opened
  std::optional<checkpoint> ck;
  if (!o.weights.empty()) {
    if (!std::filesystem::is_directory(o.weights))
      throw io_error("--weights " + quoted_path(o.weights) + " is not a directory: give the Hugging Face directory that holds "
                     "model.safetensors (or model.safetensors.index.json), or one `autoshard synth` wrote");
    ck = hf_checkpoint(o.weights);
    if (!ck)
      throw io_error("--weights " + quoted_path(o.weights) + " holds neither model.safetensors nor model.safetensors.index.json");
    for (const std::filesystem::path& f : hf_checkpoint_files(o.weights)) paths.input("--weights file", f);  // the index too
  }
  const std::string outputs = paths.output_path("--outputs", o.outputs);
  paths.check();  // --outputs is none of the inputs: not the plan, the tokens or a checkpoint file
  std::optional<host_tensor> tokens;
  if (!o.tokens.empty()) tokens = read_tokens(o.tokens);
  plan_document doc = read_plan_file(o.plan);
  // An inference plan's check is its forward pass: --optimizer sgd was taken without a word.
  if (!o.optimizer.empty() && doc.pricing.mode != run_mode::training)
    throw spec_error("--optimizer " + o.optimizer + ": " + quoted_path(o.plan) + " is an inference plan, whose check is its forward pass, "
                     "with no optimizer step: leave --optimizer out");
  // Before the plan is re-priced (seconds on a large graph): every operator has a kernel, and
  // a training check needs a loss.
  require_known_operators(doc.graph, doc.pricing.mode == run_mode::training && !o.forward_only);
  if (doc.pricing.mode == run_mode::training && !o.forward_only) (void)training_losses(doc.graph);
  // The tokens' batch and sequence are the run's (the plan's strategies at those sizes, as
  // --batch and --seq run them); flags that say otherwise are refused.
  std::int64_t batch = o.batch, seq = o.seq;
  if (tokens) {
    const auto v = token_input(doc.graph);
    if (!v || doc.graph[*v].shape.rank != 2)
      throw spec_error("--tokens feeds input_ids [batch, seq], but the graph of " + quoted_path(o.plan) + " has " +
                       (v ? "input_ids " + to_string(doc.graph[*v].shape) : std::string("no input named input_ids")));
    const std::int64_t tb = tokens->shape()[0], ts = tokens->shape()[1];
    if ((o.batch > 0 && o.batch != tb) || (o.seq > 0 && o.seq != ts))
      throw spec_error("--tokens " + quoted_path(o.tokens) + " holds " + count_noun(tb, "sequence") + " of " + std::to_string(ts) +
                       " ids, but --batch " + std::to_string(o.batch > 0 ? o.batch : tb) + " --seq " + std::to_string(o.seq > 0 ? o.seq : ts) +
                       " were given: leave them out (the tokens set both)");
    const tensor_shape& was = doc.graph[*v].shape;
    // A training step of several micro-batches runs the global batch (the graph's is one
    // micro-step's): the tokens must be it, refused here rather than after the memory check.
    const int steps = doc.pricing.mode == run_mode::training && !o.forward_only ? plan_micro_batches(doc) : 1;
    if (steps > 1 && tb != was[0] * steps)
      throw spec_error("--tokens " + quoted_path(o.tokens) + " holds " + count_noun(tb, "sequence") + ", but the training step of " +
                       quoted_path(o.plan) + " runs " + std::to_string(steps) + " micro-batches of " + count_noun(was[0], "sequence") +
                       ": give its whole global batch, " + count_noun(was[0] * steps, "sequence") +
                       " (or --forward-only, one forward pass of the tokens' batch)");
    batch = steps == 1 && tb != was[0] ? tb : 0;
    seq = ts != was[1] ? ts : 0;
  }
  if (batch > 0 || seq > 0) doc.graph = with_batch_seq(doc.graph, batch, seq);
  // Another batch is split over the same ranks into another micro-batch (which the run does not use).
  if (batch > 0) doc.pricing.micro_batch = 0;
  // Before the plan is re-priced and any rank runs: a --seq beyond the model's position table.
  check_position_tables(doc.graph, seq > 0 ? (tokens ? "--tokens of " + std::to_string(seq) + " ids" : "--seq " + std::to_string(seq))
                                           : std::string());
  // Before the plan is re-priced: the checkpoint is the graph's, tensor by tensor.
  const std::uint64_t largest_tensor = ck ? check_weights(doc.graph, *ck, o.weights, o.plan) : 0;
  const loaded_plan lp = [&] {
    try {
      return load_plan(std::move(doc), o.plan);
    } catch (const solver_error& e) {
      if (batch == 0 && seq == 0) throw;
      throw solver_error("at " + std::string(tokens ? "the --tokens' " : "") + "--batch " +
                         (batch > 0 ? std::to_string(batch) : std::string("(the plan's)")) + " --seq " +
                         (seq > 0 ? std::to_string(seq) : std::string("(the plan's)")) +
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
  if (ck || tokens) {
    const checkpoint* c = ck ? &*ck : nullptr;
    const host_tensor* t = tokens ? &*tokens : nullptr;
    vo.source_values = [c, t](const model_graph& g, dtype compute) { return checkpoint_sources(g, compute, c, t); };
    vo.source_overhead = largest_tensor;
  }
  vo.keep_outputs = !outputs.empty();
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
  if (!outputs.empty()) write_outputs(outputs, r, o);  // whether it passed or not: the values to look at
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
                     {"weights", o.weights.empty() ? nlohmann::json(nullptr) : nlohmann::json(o.weights)},
                     {"tokens", o.tokens.empty() ? nlohmann::json(nullptr) : nlohmann::json(o.tokens)},
                     {"outputs", outputs.empty() ? nlohmann::json(nullptr) : nlohmann::json(outputs)},
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
      "  autoshard verify --plan small.json --dtype f32\n"
      "  autoshard verify --plan tiny.json --weights tiny/ --outputs logits.safetensors  # tiny/: save_pretrained's directory");
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
  cmd->add_option("--weights", o->weights,
                  "the parameters' values from this checkpoint directory (model.safetensors or its index: save_pretrained's, or "
                  "synth's) instead of the seed, matched by name and checked by shape, converted to --dtype");
  cmd->add_option("--tokens", o->tokens,
                  "input_ids from this JSON file (an array of token ids, or of equally long arrays: one per sequence) instead of "
                  "the seed; its batch and sequence are the run's");
  cmd->add_option("--outputs", o->outputs,
                  "write the graph inputs (input.NAME), the unsharded run's outputs (unsharded.NAME: the logits) and the sharded "
                  "run's gathered whole (sharded.NAME) to this safetensors file");
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
