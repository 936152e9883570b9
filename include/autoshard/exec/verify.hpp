#pragma once
/// Numeric verification of a plan: run the graph unsharded once, then sharded by the plan on
/// one real Gloo rank per device of the mesh (threads of this process, TCP over loopback),
/// each rank computing only its pieces and running the plan's collectives, and compare every
/// operator's output piece with the same block of the unsharded result.
///   autoshard::verify_report r = autoshard::verify_plan(g, mesh, result.strategies);
///   std::cout << r;                    // worst vertices, largest difference, pass / fail
///   opts.numeric_check = autoshard::numeric_check();  // the pass's run_checks runs it too
/// A plan file comes back whole through load_plan (pass/loaded_plan.hpp); verify_plan takes it so.
#include <algorithm>  // std::max, std::sort
#include <chrono>     // std::chrono::steady_clock
#include <cmath>      // std::abs, std::isfinite
#include <cstring>    // std::memcpy
#include <functional> // std::function
#include <iomanip>    // std::setprecision
#include <mutex>      // std::mutex
#include <optional>   // std::optional
#include <ostream>    // std::ostream
#include <sstream>    // std::ostringstream
#include <string>     // std::string
#include <vector>     // std::vector

#include "../gloo/communicator.hpp"  // mesh_communicator, gloo_options
#include "../gloo/launch.hpp"        // run_ranks_collect
#include "../pass/autosharding.hpp"  // autosharding_options, solver_error, collective_use
#include "../pass/loaded_plan.hpp"   // loaded_plan
#include "../pass/pipelined.hpp"     // stages_of_vertices, pipeline_traffic_of
#include "audit.hpp"           // traffic_audit, audit_traffic
#include "executor.hpp"        // reference_stream, run_sharded, make_source_values
#include "pipeline.hpp"        // pipeline_communicator, make_stage_graph, run_stage, train_stage
#include "resources.hpp"       // check_rank_threads, estimate_verify_memory
#include "training.hpp"        // train_sharded, train_unsharded, training_step

namespace autoshard {

/// Where a verification is: `phase` is "reference" (training: the whole unsharded step,
/// before the ranks start; `done` of `total` operators), "ranks" (the ranks' run: `done` of
/// `total` pieces compared, one per operator per rank, plus a gradient and an updated
/// value per parameter per rank in training; the unsharded values of inference are computed
/// on demand inside it) or "comparison" (`done` of `total` tensors merged over the ranks).
/// `seconds` since verify_plan started.
struct verify_progress {
  const char* phase = "";
  std::size_t done = 0, total = 0;
  double seconds = 0.0;
};

/// How verify runs a pipelined plan: its stages, their schedule, and what the pricing says
/// moves between them (pass/pipelined.hpp's pipeline_traffic_of, audited with the rest).
struct verify_pipeline {
  int stages = 1;
  pipeline_schedule schedule = pipeline_schedule::one_f_one_b;
  /// Per vertex: an operator's stage, the stages that read a source (stages_of_vertices).
  std::vector<std::vector<int>> stage_of;
  pipeline_traffic priced;
  /// Fault injection for tests of the checker: this tensor's transfer to the next stage is
  /// left out (its receivers take zeros) and so is its gradient's back.
  std::string drop_transfer;
};

/// The pipeline of a pipelined plan as verify runs it (solver_error when its stages do not add
/// up to its graph's layers).
inline verify_pipeline verify_pipeline_of(const loaded_plan& p) {
  const plan_document& d = p.document;
  if (!d.pipeline) throw solver_error("the plan has no pipeline stages");
  return {static_cast<int>(d.pipeline->stages.size()), d.pipeline->schedule, stages_of_vertices(d),
          pipeline_traffic_of(d, p.strategies), {}};
}

struct verify_options {
  dtype compute = dtype::f64;  ///< f64 (differences are rounding only) or f32 (what models run in)
  std::uint64_t seed = 1;      ///< of the input and parameter values
  /// A vertex passes when its largest difference <= rtol x max(1, largest |reference value|);
  /// 0 = the default for the dtype: 1e-9 for f64, 1e-3 for f32.
  double rtol = 0.0;
  std::chrono::milliseconds timeout{120000};  ///< per collective (a dead rank ends the run)
  /// Refuse to start when the estimated peak (estimate_verify_memory) is above this many
  /// bytes; 0 = the memory available now (MemAvailable, or less under a cgroup's limit).
  std::uint64_t max_memory = 0;
  /// Also run the backward and one optimizer step (`step`), and compare every parameter's
  /// gradient and updated value block by block (a training plan's verification).
  bool training = false;
  training_step step;
  /// The collectives the cost model priced for this plan (plan_summary::collectives, or
  /// loaded_plan::collectives): when given, every collective the ranks issue is counted and
  /// compared with them (verify_report::traffic), and a difference fails the verification.
  std::optional<std::vector<collective_use>> priced;
  /// Training: audit the backward's collectives too (gradients, their synchronisation, the
  /// re-gathered weights); the forward's are always audited.
  bool audit_backward = true;
  /// Called at the start and end of each phase and as pieces are compared (from the rank
  /// threads, one call at a time); empty = no reports. It must not throw.
  std::function<void(const verify_progress&)> progress;
  /// A pipelined plan's stages (verify_pipeline_of; verify_plan of a loaded pipelined plan sets
  /// it): the plan's mesh is one stage's, and stages x its ranks run, each stage its operators.
  std::optional<verify_pipeline> pipeline;
  /// The values of the sources instead of seeded ones (a checkpoint's weights, given token
  /// ids): called once, after the memory check and before any rank starts, with the graph the
  /// run computes (a training plan's global batch) and the compute dtype; it returns a value
  /// per vertex, and a source it leaves empty (an operator's entry is ignored) takes its seeded
  /// value (make_source_value). Each is checked (check_source_values: shape, dtype i64 for
  /// integers and `compute` for the rest, ids inside their tables) before the run.
  std::function<std::vector<host_tensor>(const model_graph&, dtype compute)> source_values;
  /// Bytes source_values holds while it makes them beyond what it returns (a checkpoint's
  /// largest tensor, read while it is converted): counted in the memory check.
  std::uint64_t source_overhead = 0;
  /// Keep the graph inputs' values and the outputs' (operators nothing reads: a language
  /// model's logits) of the unsharded run and, gathered whole, of the sharded one
  /// (verify_report::inputs, unsharded_outputs, sharded_outputs), counted in the memory check.
  bool keep_outputs = false;
};

/// A tensor by name (verify_report's kept values).
struct named_tensor {
  std::string name;
  host_tensor value;
};

/// One operator's comparison, over every rank's piece.
struct vertex_check {
  std::string name;
  std::string spec;            ///< the plan's output spec (Alpa notation)
  double max_abs_diff = 0.0;   ///< largest |sharded - unsharded| over the tensor
  double ref_max_abs = 0.0;    ///< largest |unsharded value|
  bool passed = true;
};

struct verify_report {
  device_mesh mesh;  ///< a pipelined plan's: one stage's
  int stages = 1;    ///< pipeline stages, each on `mesh`
  pipeline_schedule schedule = pipeline_schedule::one_f_one_b;
  dtype compute = dtype::f64;
  double rtol = 0.0;
  std::vector<vertex_check> checks;  ///< every operator, in topological order
  std::vector<vertex_check> gradients;  ///< training: every parameter's gradient, in the order the backward reaches them
  std::vector<vertex_check> updates;    ///< training: every parameter after the optimizer step, same order
  /// Training: each loss over the step ("loss:NAME": the mean of the micro-steps' losses
  /// against the unsharded loss of the whole global batch).
  std::vector<vertex_check> losses;
  /// Training: the step's micro-steps, and the operator forwards run again for their backward
  /// (full recomputation), per rank.
  int micro_batches = 1;
  std::size_t replayed_forwards = 0;
  /// Training: how many times each parameter's gradient was synchronised in the step (indexed
  /// by vertex; the largest over the ranks; training_record::gradient_syncs).
  std::vector<int> gradient_syncs;
  std::string worst;                 ///< the operator (or "grad:P", "update:P") with the largest relative difference
  std::string first_failed;          ///< the first failing one: operators in topological order, then losses, gradients, updates
  double max_abs_diff = 0.0;         ///< over every operator
  double max_rel_diff = 0.0;         ///< max over operators of max_abs_diff / max(1, ref_max_abs)
  std::size_t failed = 0;
  double reference_seconds = 0.0, sharded_seconds = 0.0;
  memory_estimate estimate;  ///< the peak estimated before the run started
  traffic_audit traffic;     ///< executed against priced collectives (checked when verify_options::priced is given)
  /// With verify_options::keep_outputs: every graph input's value (vertex order), and every
  /// output's (operators nothing reads, topological order) of the unsharded run and of the
  /// sharded run gathered whole, in the compute dtype.
  std::vector<named_tensor> inputs, unsharded_outputs, sharded_outputs;
  bool passed() const noexcept { return failed == 0 && traffic.passed(); }
};

inline std::ostream& operator<<(std::ostream& os, const verify_report& r) {
  std::vector<const vertex_check*> order;
  for (const auto* list : {&r.checks, &r.losses, &r.gradients, &r.updates})
    for (const vertex_check& c : *list) order.push_back(&c);
  std::sort(order.begin(), order.end(), [](const vertex_check* a, const vertex_check* b) {
    return a->max_abs_diff / std::max(1.0, a->ref_max_abs) > b->max_abs_diff / std::max(1.0, b->ref_max_abs);
  });
  os << "verified " << r.checks.size() << " operators";
  if (!r.gradients.empty()) os << ", " << r.gradients.size() << " parameter gradients and their update";
  os << " on " << (r.stages > 1 ? std::to_string(r.stages) + " pipeline stages (" + std::string(to_string(r.schedule)) + ") of " : "")
     << to_string(r.mesh) << " (" << r.mesh.num_ranks() * r.stages << " Gloo ranks, " << to_string(r.compute) << "): unsharded " << std::fixed << std::setprecision(2)
     << r.reference_seconds << " s, sharded " << r.sharded_seconds << " s (estimated peak memory "
     << human_bytes(static_cast<double>(r.estimate.total())) << ")\n";
  os << std::defaultfloat << std::setprecision(3);
  if (!r.gradients.empty()) {
    std::size_t synced = 0, once = 0;
    for (int n : r.gradient_syncs) {
      synced += n > 0 ? 1 : 0;
      once += n == 1 ? 1 : 0;
    }
    os << "training step: " << r.micro_batches << (r.micro_batches == 1 ? " micro-batch" : " micro-batches")
       << " against the unsharded step on the whole batch";
    if (r.replayed_forwards > 0) os << ", " << r.replayed_forwards << " operator forwards recomputed";
    os << "; " << synced << " parameter gradients synchronised, " << once << " of them once per step\n";
  }
  os << "largest differences (sharded - unsharded):\n";
  for (std::size_t i = 0; i < order.size() && i < 5; ++i)
    os << "  " << quoted_text(order[i]->name) << " [" << order[i]->spec << "]: " << order[i]->max_abs_diff << " (values up to "
       << order[i]->ref_max_abs << ")" << (order[i]->passed ? "" : "  FAILED") << "\n";
  if (r.traffic.checked) {
    const traffic_audit& a = r.traffic;
    os << "communication per rank: priced " << human_bytes(static_cast<double>(a.priced_bytes)) << ", executed "
       << human_bytes(static_cast<double>(a.executed_bytes)) << " over " << a.lines.size() << " site/kind/axis lines";
    if (a.documented_bytes > 0)
      os << " (" << human_bytes(static_cast<double>(a.documented_bytes)) << " of it on documented differences)";
    os << (a.passed() ? ": every line matches\n" : ": " + std::to_string(a.mismatches) + " lines differ\n");
    std::size_t shown = 0;
    for (const traffic_line& l : a.lines)
      if (l.failed() && shown++ < 5)
        os << "  " << escaped_text(l.where) << ", " << l.kind << " on mesh axis " << l.mesh_axis << ": priced " << l.priced_bytes
           << " B in " << l.priced_calls << " collectives, executed " << l.executed_bytes << " B in " << l.executed_calls << "\n";
  }
  os << (r.passed() ? "PASS" : "FAIL") << ": largest difference " << r.max_abs_diff << ", relative " << r.max_rel_diff
     << " (tolerance " << r.rtol << ")";
  if (r.failed > 0)
    os << "; " << count_noun(r.failed, "operator") << (r.failed == 1 ? " differs" : " differ") << ", the first "
       << quoted_text(r.first_failed) << ", the worst " << quoted_text(r.worst);
  if (!r.traffic.passed())
    os << "; the executed communication differs from the priced at " << count_noun(r.traffic.mismatches, "line") << ", the first at "
       << escaped_text(r.traffic.lines[r.traffic.first_mismatch].where);
  return os << "\n";
}

namespace detail {

/// A 64-bit digest of a tensor's bytes (to see that two runs gave the same bits).
inline std::uint64_t bytes_digest(const host_tensor& t) {
  std::uint64_t h = 0x9e3779b97f4a7c15ull ^ t.nbytes();
  const std::byte* p = t.data();
  const std::size_t n = p == nullptr ? 0 : t.nbytes();
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  }
  for (; i < n; ++i) h = (h ^ static_cast<std::uint64_t>(p[i])) * 0x100000001b3ull;
  return h;
}

template <class T>
void compare_piece(const host_tensor& piece, const host_tensor& ref_block, vertex_check& c) {
  // An integer operator (a view of token ids, an imported model's positions) keeps its dtype
  // whatever the compute dtype T is.
  const auto compare = [&](auto tag) {
    using E = decltype(tag);
    const E* a = piece.as<E>();
    const E* b = ref_block.as<E>();
    for (std::int64_t i = 0; i < piece.numel(); ++i) {
      const double d = std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
      c.max_abs_diff = std::max(c.max_abs_diff, std::isfinite(d) ? d : std::numeric_limits<double>::infinity());
      c.ref_max_abs = std::max(c.ref_max_abs, std::abs(static_cast<double>(b[i])));
    }
  };
  switch (piece.type()) {
    case dtype::i64: return compare(std::int64_t{});
    case dtype::i32: return compare(std::int32_t{});
    case dtype::u8: return compare(std::uint8_t{});
    case dtype::boolean: return compare(bool{});
    default: return compare(T{});
  }
}

/// Refuses, before anything is allocated or started, a run this machine cannot hold: more
/// rank threads than it can start, or an estimated peak above `max_memory` (0: what this
/// process can allocate, machine_limits::memory: MemAvailable, a cgroup's limit, ulimit -v).
/// The message names the estimate, the limit and what to change. `stage_of`: a pipelined
/// plan's stages (verify_pipeline::stage_of), each on `mesh`. `held`: the bytes the caller holds
/// beyond the estimate when the run computes in a dtype (verify_options::source_overhead, the
/// outputs keep_outputs keeps, at that dtype's size): asked at `compute`, and at f32 for the
/// figure a refused f64 run is offered.
inline memory_estimate check_verify_resources(const model_graph& g, const device_mesh& mesh, const std::vector<strategy>& plan,
                                              dtype compute, std::uint64_t max_memory, bool training = false,
                                              int micro_batches = 1, const std::vector<std::vector<int>>* stage_of = nullptr,
                                              const std::function<std::uint64_t(dtype)>& held = {}) {
  const machine_limits m = machine_limits::here();
  const int ranks = stage_of ? pipeline_world(mesh, *stage_of).num_ranks() : mesh.num_ranks();
  const auto estimate = [&](dtype t) {
    return stage_of ? estimate_pipelined_verify_memory(g, mesh, plan, t, *stage_of, training, micro_batches)
                    : estimate_verify_memory(g, mesh, plan, t, training, micro_batches);
  };
  if (stage_of) check_rank_threads(pipeline_world(mesh, *stage_of), m, pipeline_extra_peers(mesh));
  else check_rank_threads(mesh, m);
  const auto held_at = [&](dtype t) { return held ? held(t) : std::uint64_t{0}; };
  memory_estimate e = estimate(compute);
  e.held = held_at(compute);  // the caller's (verify_options::source_overhead, keep_outputs)
  // The address space left counts too (machine_limits::memory): under ulimit -v 700000 a run
  // estimated at 714 MiB started, ran for 30 s and ended in "out of memory". Where it is what
  // binds, so does what the threads map beyond their bytes (reserved_address_space).
  const std::uint64_t limit = max_memory > 0 ? max_memory : m.memory();
  const bool by_address = max_memory == 0 && m.address_space < m.mem_available;
  const std::uint64_t threads = rank_threads_cost(stage_of ? pipeline_world(mesh, *stage_of) : mesh).threads;
  const std::uint64_t reserved = by_address ? reserved_address_space(threads, m) : 0;
  if (e.total() + reserved <= limit) return e;
  std::string fix;
  if (compute == dtype::f64) {
    const std::uint64_t f32 = estimate(dtype::f32).total() + held_at(dtype::f32) + reserved;  // the kept outputs at f32 too
    fix += "--dtype f32 (about " + human_bytes(static_cast<double>(f32)) + ")" + std::string(f32 <= limit ? ", or " : " and ");
  }
  // The sources' graph inputs (token ids, positions) scale with batch x seq as the activations
  // do; the parameters do not. `verify --batch 1048576 --seq 1048576` of a tiny model blamed
  // "the parameters alone take 16.00 TiB": its inputs, the parameters being kilobytes.
  std::uint64_t inputs = 0;
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
    if (!g[v].is_operator() && !g[v].is_parameter())
      inputs += detail::bytes_of(g[v].shape, detail::is_integer(g[v].type) ? dtype::i64 : compute) *
                (1 + (stage_of ? static_cast<std::uint64_t>((*stage_of)[v].size()) : 0));  // once, and each stage's copy
  inputs = std::min(inputs, e.sources);
  const std::uint64_t fixed = e.sources - inputs + e.ranks + e.parameters + e.held + reserved;  // what a smaller batch or sequence leaves
  if (fixed < limit && e.activations + inputs > 0) {
    const double shrink = static_cast<double>(e.activations + inputs) / static_cast<double>(limit - fixed);
    std::ostringstream f;
    f.precision(2);
    f << std::fixed << shrink;
    fix += "a smaller batch or sequence (verify --batch/--seq runs the plan's strategies at smaller sizes, as does a plan "
           "made with plan --batch/--seq: the activations scale with batch x seq; divide it by more than " + f.str() + ")";
  } else {
    fix += "a smaller model (the parameters alone take " + human_bytes(static_cast<double>(e.sources - inputs + e.parameters)) +
           (e.parameters > 0 ? " with their gradients and updates" : "") + ")";
  }
  throw exec_error("verify would need about " + human_bytes(static_cast<double>(e.total() + reserved)) + " (inputs and parameters " +
                   human_bytes(static_cast<double>(e.sources)) + ", activations " + human_bytes(static_cast<double>(e.activations)) + " at " + e.worst_step +
                   (e.parameters > 0 ? ", gradients and updates of the parameters " + human_bytes(static_cast<double>(e.parameters)) : std::string()) +
                   (e.held > 0 ? ", the outputs kept and the sources' making " + human_bytes(static_cast<double>(e.held)) : std::string()) +
                   ", " + std::to_string(ranks) + " rank threads " + human_bytes(static_cast<double>(e.ranks)) +
                   (reserved > 0 ? ", and " + human_bytes(static_cast<double>(reserved)) +
                                       " of address space their stacks and a malloc arena map beyond what they use"
                                 : std::string()) +
                   ") but " +
                   (max_memory > 0 ? "--max-memory allows " : "this machine has ") + human_bytes(static_cast<double>(limit)) +
                   (max_memory > 0 ? "" : " available (" + m.memory_source() + ")") + "; use " + fix +
                   (max_memory > 0 ? "" : ", or --max-memory to allow more"));
}

/// The first failure of a ranks' run that is not a consequence of another rank's (a peer's
/// comm_error), rethrown; nothing when every rank succeeded.
inline void rethrow_first_failure(const rank_results& res) {
  std::exception_ptr first, first_comm;
  for (const std::exception_ptr& e : res) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const comm_error&) {
      if (!first_comm) first_comm = e;
    } catch (...) {
      if (!first) first = e;
    }
  }
  if (first) std::rethrow_exception(first);
  if (first_comm) std::rethrow_exception(first_comm);
}

/// One verification in its phases: the unsharded training step (training), the ranks' run
/// (each rank's forward compared with the streamed reference, then its training step's
/// gradients and updates), and the report folded from every rank's comparisons.
/// Training: the unsharded step is run first, keeping only its parameter gradients (each
/// dropped once every rank compared its block). Each rank then runs the plan's forward once
/// against the streamed reference, comparing every operator (what inference verifies), and
/// then the training step, whose forward must give the same pieces bit for bit (a digest of
/// each): the reference's activations and the ranks' never coexist.
template <class T>
class verify_run {
 public:
  verify_run(const model_graph& g, const device_mesh& mesh, const std::vector<strategy>& plan, const verify_options& o)
      : g_(g), mesh_(mesh), plan_(plan), o_(o), n_(boost::num_vertices(g)), stages_(o.pipeline ? o.pipeline->stages : 1),
        ranks_(mesh.num_ranks() * stages_), micro_batches_(o.training ? o.step.micro_batches : 1) {
    if (plan.size() != n_)
      throw exec_error("the plan has " + std::to_string(plan.size()) + " strategies for a graph of " + std::to_string(n_) +
                       " vertices");
    if (micro_batches_ < 1 || micro_batches_ > max_micro_batches)
      throw exec_error("a step runs 1 to " + std::to_string(max_micro_batches) + " micro-batches, not " +
                       std::to_string(micro_batches_));
    // Micro-batches: the graph is one micro-step's; the unsharded reference, and the forward
    // compared operator by operator, run the whole global batch.
    if (micro_batches_ > 1) global_ = with_batch_seq(g, graph_batch(g) * micro_batches_, 0);
    whole_ = micro_batches_ > 1 ? &global_ : &g;
    rep_.mesh = mesh;
    rep_.stages = stages_;
    if (o.pipeline) rep_.schedule = o.pipeline->schedule;
    rep_.compute = compute_dtype<T>();
    rep_.rtol = o.rtol > 0 ? o.rtol : (std::is_same_v<T, double> ? 1e-9 : 1e-3);
    rep_.micro_batches = micro_batches_;
    if (o.pipeline && o.pipeline->stage_of.size() != n_)
      throw exec_error("the pipeline gives stages for " + std::to_string(o.pipeline->stage_of.size()) + " vertices of a graph of " +
                       std::to_string(n_));
    // The global batch's step bounds each micro-step's (its activations are micro_batches times theirs).
    if (o.keep_outputs) find_outputs();
    rep_.estimate = check_verify_resources(*whole_, mesh, plan, compute_dtype<T>(), o.max_memory, o.training, micro_batches_,
                                           o.pipeline ? &o.pipeline->stage_of : nullptr,
                                           [this](dtype t) { return o_.source_overhead + kept_bytes(t); });
    for (vertex_t v = 0; v < n_; ++v) {
      operators_ += g[v].is_operator() ? 1 : 0;
      parameters_ += g[v].is_parameter() ? 1 : 0;
      // The ranks that compare v: its stage's (a parameter's: those of every stage that holds it).
      users_.push_back(mesh.num_ranks() * (o.pipeline && g[v].is_parameter() ? static_cast<int>(o.pipeline->stage_of[v].size()) : 1));
    }
    if (o.pipeline) make_stages();
  }

  verify_report run() {
    const std::vector<host_tensor> sources = source_values();
    sources_ = &sources;
    if (o_.keep_outputs)
      for (vertex_t v = 0; v < n_; ++v)
        if (!g_[v].is_operator() && !g_[v].is_parameter()) rep_.inputs.push_back({(*whole_)[v].name, host_tensor::copy_of(sources[v].view())});
    for (const stage_graph& sg : step_stages_) stage_sources_.push_back(stage_sources(sg, sources));
    // Each rank compares its piece with the same block of the reference as soon as it has it;
    // the reference is computed on demand and forgotten once every rank has compared.
    reference_stream<T> ref(*whole_, sources, mesh_.num_ranks());  // every operator is compared by one stage's ranks
    ref_ = &ref;
    t0_ = std::chrono::steady_clock::now();
    if (o_.training) reference_training_step();
    const double train_ref_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    pieces_ = static_cast<std::size_t>(mesh_.num_ranks()) * operators_;
    for (vertex_t v = 0; v < n_ && o_.training; ++v) pieces_ += reached_[v] ? 2 * static_cast<std::size_t>(users_[v]) : 0;
    const auto t1 = std::chrono::steady_clock::now();
    run_all_ranks();
    const auto t2 = std::chrono::steady_clock::now();
    // The reference is computed on demand inside the ranks' run: its time is taken out.
    rep_.reference_seconds = ref.seconds() + train_ref_seconds;
    rep_.sharded_seconds = std::max(0.0, std::chrono::duration<double>(t2 - t1).count() - ref.seconds());
    for (const vertex_t v : outputs_) {
      rep_.unsharded_outputs.push_back({(*whole_)[v].name, std::move(unsharded_out_[v])});
      rep_.sharded_outputs.push_back({(*whole_)[v].name, std::move(sharded_out_[v])});
    }
    fold_report();
    if (o_.priced) audit();
    return std::move(rep_);
  }

 private:
  /// The sources: the caller's (verify_options::source_values), any it leaves empty seeded,
  /// checked against the graph before a rank starts.
  std::vector<host_tensor> source_values() const {
    if (!o_.source_values) return make_source_values<T>(*whole_, o_.seed);
    std::vector<host_tensor> s = o_.source_values(*whole_, compute_dtype<T>());
    if (s.size() != n_)
      throw exec_error("the source values are " + std::to_string(s.size()) + " for a graph of " + std::to_string(n_) + " vertices");
    for (vertex_t v = 0; v < n_; ++v)
      if (!(*whole_)[v].is_operator() && s[v].data() == nullptr && (*whole_)[v].shape.numel() > 0)
        s[v] = make_source_value<T>(*whole_, v, o_.seed);
    check_source_values(*whole_, s, compute_dtype<T>());
    return s;
  }

  /// What keep_outputs holds beside the run: the inputs' copies, and per output its unsharded
  /// copy, its sharded copy and the whole tensor every rank of its stage gathers for it.
  /// (Computed in `compute`: the run's dtype, or the f32 a refused f64 run is offered.)
  std::uint64_t kept_bytes(dtype compute) const {
    if (!o_.keep_outputs) return 0;
    std::uint64_t b = 0;
    const auto type_of = [&](vertex_t v) { return detail::is_integer((*whole_)[v].type) ? dtype::i64 : compute; };
    for (vertex_t v = 0; v < n_; ++v) {
      const node& nd = (*whole_)[v];
      if (!nd.is_operator() && !nd.is_parameter()) b += detail::bytes_of(nd.shape, type_of(v));
      if (nd.is_operator() && boost::out_degree(v, *whole_) == 0)
        b += detail::bytes_of(nd.shape, type_of(v)) * (2 + static_cast<std::uint64_t>(mesh_.num_ranks()));
    }
    return b;
  }

  /// keep_outputs: the outputs (operators nothing reads) whose values the report keeps.
  void find_outputs() {
    for (vertex_t v = 0; v < n_; ++v)
      if ((*whole_)[v].is_operator() && boost::out_degree(v, *whole_) == 0) outputs_.push_back(v);
    unsharded_out_.resize(n_);
    sharded_out_.resize(n_);
  }

  void report(const char* phase, std::size_t done, std::size_t total) const {
    if (o_.progress)
      o_.progress({phase, done, total, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count()});
  }

  /// The unsharded training step, keeping only the parameters' gradients (each update block is
  /// computed where it is compared); the parameters the backward reaches are those compared.
  void reference_training_step() {
    report("reference", 0, operators_);
    training_step whole_batch = o_.step;  // the global batch in one step
    whole_batch.micro_batches = 1;
    tref_ = train_unsharded<T>(*whole_, *sources_, whole_batch, false, false);
    report("reference", operators_, operators_);
    reached_.assign(n_, false);
    parameters_ = 0;  // those the backward reaches: the ranks compare a gradient and an update of each
    for (vertex_t v = 0; v < n_; ++v) {
      reached_[v] = g_[v].is_parameter() && tref_.grad[v].data() != nullptr;
      parameters_ += reached_[v] ? 1 : 0;
    }
  }

  void run_all_ranks() {
    const auto ur = static_cast<std::size_t>(ranks_);
    report("ranks", 0, pieces_);
    per_rank_.assign(ur, std::vector<vertex_check>(n_));
    per_rank_grad_.assign(o_.training ? ur : 0, std::vector<vertex_check>(n_));
    per_rank_update_.assign(o_.training ? ur : 0, std::vector<vertex_check>(n_));
    fused_ = fused_dims(g_);  // tensors cut per part (graph/fused.hpp)
    unread_ = o_.training ? users_ : std::vector<int>();
    digest_.assign(o_.training ? ur : 0, std::vector<std::uint64_t>(n_));
    loss_.assign(o_.training ? ur : 0, std::vector<double>(n_, 0.0));
    records_.assign(o_.training ? ur : 0, training_record{});
    issued_.assign(ur, {});
    gloo_options go;
    go.timeout = o_.timeout;
    const rank_results res = run_ranks_collect(ranks_, [&](gloo_communicator& world) { run_rank(world); }, go);
    if (compared_ != pieces_) report("ranks", compared_, pieces_);  // ended early: a rank failed (rethrown below)
    rethrow_first_failure(res);
  }

  /// This rank's piece of a settled spec compared with the same block of the reference.
  void compare_block(int me, const host_tensor& got, const host_tensor& want, const sharding_spec& settled, vertex_check& c,
                     fused_dim f) {
    std::lock_guard<std::mutex> lock(compare_mu_);
    if (whole_on_every_rank(settled)) compare_piece<T>(got, want, c);
    else compare_piece<T>(got, shard_of(want, mesh_, settled, me, split_rule::chunk, f), c);
    report("ranks", ++compared_, pieces_);
  }

  /// A parameter's gradient and updated block from the training step, compared with the
  /// unsharded ones (the optimizer is elementwise: the block's update is computed here).
  void compare_parameter(int slot, int me, vertex_t v, const host_tensor& grad, const host_tensor& updated, const sharding_spec& spec) {
    const auto ume = static_cast<std::size_t>(slot);
    std::lock_guard<std::mutex> lock(compare_mu_);
    const bool whole = whole_on_every_rank(spec);
    const host_tensor gblock = whole ? host_tensor() : shard_of(tref_.grad[v], mesh_, spec, me, split_rule::chunk, fused_[v]);
    const host_tensor pblock = whole ? host_tensor() : shard_of((*sources_)[v], mesh_, spec, me, split_rule::chunk, fused_[v]);
    const host_tensor& want_grad = whole ? tref_.grad[v] : gblock;
    const host_tensor want_update = optimizer_update<T>(whole ? (*sources_)[v] : pblock, want_grad, o_.step);
    compare_piece<T>(grad, want_grad, per_rank_grad_[ume][v]);
    compare_piece<T>(updated, want_update, per_rank_update_[ume][v]);
    compared_ += 2;
    report("ranks", compared_, pieces_);
    if (--unread_[v] == 0) tref_.grad[v] = host_tensor();
  }

  /// What rank `slot` (of the world; `me` of the plan's mesh) compares of each forward piece
  /// (by vertex of its graph; `whole_of` maps it to g's, none: the same) against the reference.
  template <class M>
  piece_callback forward_checker(M& mc, int slot, const std::vector<vertex_t>* whole_of) {
    return [this, &mc, slot, whole_of](vertex_t local, const host_tensor& piece, const sharding_spec& spec) {
      const vertex_t v = whole_of ? (*whole_of)[local] : local;
      if (!g_[v].is_operator()) return;
      const sharding_spec settled = settled_spec(spec);
      const auto uncounted = charge(mc, collective_ledger::no_site);  // the checker's traffic, not the plan's
      const host_tensor whole = settled == spec ? host_tensor() : redistribute(mc, piece.view(), (*whole_)[v].shape, spec, settled);
      const host_tensor& got = settled == spec ? piece : whole;
      if (o_.training) digest_[static_cast<std::size_t>(slot)][v] = bytes_digest(piece);
      if (o_.keep_outputs && boost::out_degree(v, *whole_) == 0) keep_output(mc, v, piece, spec, ref_->value(v));
      compare_block(mc.rank(), got, ref_->value(v), settled, per_rank_[static_cast<std::size_t>(slot)][v], fused_[v]);
      ref_->release(v);
    };
  }

  /// Output v kept whole: the unsharded value, and the ranks' pieces gathered (every rank of
  /// the stage takes part; its first keeps the result).
  template <class M>
  void keep_output(M& mc, vertex_t v, const host_tensor& piece, const sharding_spec& spec, const host_tensor& want) {
    sharding_spec whole_spec = spec;
    for (std::size_t a = 0; a < whole_spec.mesh_rank; ++a) whole_spec[a] = Replicate();
    host_tensor all = whole_spec == spec ? host_tensor::copy_of(piece.view())
                                         : redistribute(mc, piece.view(), (*whole_)[v].shape, spec, whole_spec);
    std::lock_guard<std::mutex> lock(compare_mu_);
    if (mc.rank() == 0) sharded_out_[v] = std::move(all);
    if (unsharded_out_[v].data() == nullptr) unsharded_out_[v] = host_tensor::copy_of(want.view());
  }

  /// The training step's forward pieces: with one micro-step, the same bits as the forward just
  /// compared; each loss's pieces add up to the step's loss (1 / micro_batches each).
  template <class M>
  piece_callback step_checker(M& mc, int slot, const std::vector<vertex_t>* whole_of) {
    return [this, &mc, slot, whole_of](vertex_t local, const host_tensor& piece, const sharding_spec& spec) {
      const vertex_t v = whole_of ? (*whole_of)[local] : local;
      const auto ume = static_cast<std::size_t>(slot);
      if (micro_batches_ == 1 && g_[v].is_operator() && bytes_digest(piece) != digest_[ume][v]) {
        std::lock_guard<std::mutex> lock(compare_mu_);
        per_rank_[ume][v].max_abs_diff = std::numeric_limits<double>::infinity();
      }
      if (!is_training_loss(g_, v)) return;
      const sharding_spec settled = settled_spec(spec);
      const auto uncounted = charge(mc, collective_ledger::no_site);  // the checker's traffic, not the plan's
      const host_tensor whole = settled == spec ? host_tensor() : redistribute(mc, piece.view(), g_[v].shape, spec, settled);
      loss_[ume][v] += static_cast<double>((settled == spec ? piece : whole).template as<T>()[0]) / micro_batches_;
    };
  }

  parameter_callback parameter_checker(int slot, int me, const std::vector<vertex_t>* whole_of) {
    return [this, slot, me, whole_of](vertex_t local, const host_tensor& grad, const host_tensor& updated, const sharding_spec& spec) {
      compare_parameter(slot, me, whole_of ? (*whole_of)[local] : local, grad, updated, spec);
    };
  }

  void run_rank(gloo_communicator& world) {
    if (o_.pipeline) return run_stage_rank(world);
    const int me = world.rank();
    mesh_communicator mc(std::move(world), mesh_);
    run_sharded<T>(mc, *whole_, plan_, *sources_, forward_checker(mc, me, nullptr));
    if (o_.training) {
      mc.ledger().clear();  // the audit counts the training step's collectives, as the model prices one step
      records_[static_cast<std::size_t>(me)] =
          train_sharded<T>(mc, g_, plan_, *sources_, o_.step, step_checker(mc, me, nullptr), parameter_checker(me, me, nullptr));
    }
    issued_[static_cast<std::size_t>(me)] = mc.ledger().entries();
  }

  /// A pipelined plan's rank: rank r % S of stage r / S (S the plan's mesh's ranks) runs that
  /// stage's forward over the whole batch against the reference, then its training step.
  void run_stage_rank(gloo_communicator& world) {
    const int slot = world.rank();
    const auto k = static_cast<std::size_t>(slot / mesh_.num_ranks());
    pipeline_communicator<gloo_communicator> pc(std::move(world), mesh_, stages_);
    const stage_graph& fg = forward_stages_[k];
    const stage_graph& sg = step_stages_[k];
    run_stage<T>(pc, fg, stage_sources_[k], forward_checker(pc.stage(), slot, &fg.whole));
    if (o_.training) {
      pc.stage().ledger().clear();
      training_record r = train_stage<T>(pc, sg, stage_sources_[k], o_.step, o_.pipeline->schedule,
                                         step_checker(pc.stage(), slot, &sg.whole), parameter_checker(slot, pc.stage().rank(), &sg.whole));
      std::vector<int> syncs(n_, 0);  // by the whole graph's vertex
      for (vertex_t v = 0; v < sg.whole.size(); ++v) syncs[sg.whole[v]] = r.gradient_syncs[v];
      r.gradient_syncs = std::move(syncs);
      records_[static_cast<std::size_t>(slot)] = std::move(r);
    }
    issued_[static_cast<std::size_t>(slot)] = whole_graph_sites(sg, pc.stage().ledger().entries());
  }

  /// Each stage as a graph of its own: of the whole batch (the forward compared) and of one
  /// micro-step (the training step), and the values its ranks read.
  void make_stages() {
    const verify_pipeline& p = *o_.pipeline;
    for (int k = 0; k < p.stages; ++k) {
      forward_stages_.push_back(make_stage_graph(*whole_, plan_, p.stage_of, p.stages, k));
      step_stages_.push_back(make_stage_graph(g_, plan_, p.stage_of, p.stages, k));
      for (stage_graph* sg : {&forward_stages_.back(), &step_stages_.back()})
        if (const auto d = find_vertex(g_, p.drop_transfer); d && !p.drop_transfer.empty()) sg->dropped = *d;
    }
  }

  /// The collectives and transfers the ranks issued against those priced (a pipeline's too).
  void audit() {
    std::vector<collective_use> priced = *o_.priced;
    std::vector<priced_transfer> transfers;
    if (o_.pipeline) {
      priced.insert(priced.end(), o_.pipeline->priced.collectives.begin(), o_.pipeline->priced.collectives.end());
      transfers = o_.pipeline->priced.transfers;
    }
    rep_.traffic = audit_traffic(g_, priced, issued_, o_.training && o_.audit_backward, o_.training, transfers);
  }

  /// One check's verdict folded into the report: passed when its largest difference relative
  /// to max(1, the reference's largest magnitude) is within rtol (false for NaN and infinity).
  void judge(vertex_check& c) {
    const double rel = c.max_abs_diff / std::max(1.0, c.ref_max_abs);
    c.passed = rel <= rep_.rtol;
    rep_.failed += c.passed ? 0 : 1;
    if (!c.passed && rep_.first_failed.empty()) rep_.first_failed = c.name;
    rep_.max_abs_diff = std::max(rep_.max_abs_diff, c.max_abs_diff);
    rep_.max_rel_diff = std::max(rep_.max_rel_diff, rel);
    if (rel > worst_ || !(rel == rel)) {
      worst_ = rel;
      rep_.worst = c.name;
    }
  }

  /// Vertex v's check over every rank's comparison.
  vertex_check merged(vertex_t v, std::string name, const std::vector<std::vector<vertex_check>>& per_rank) const {
    vertex_check c;
    c.name = std::move(name);
    c.spec = to_alpa_string(plan_[v].output);
    for (const auto& r : per_rank) {
      c.max_abs_diff = std::max(c.max_abs_diff, r[v].max_abs_diff);
      c.ref_max_abs = std::max(c.ref_max_abs, r[v].ref_max_abs);
    }
    return c;
  }

  void fold_report() {
    const std::size_t tensors = operators_ + (o_.training ? 2 * parameters_ : 0);
    report("comparison", 0, tensors);
    const std::vector<vertex_t> order = topological_order(g_);
    for (vertex_t v : order) {
      if (!g_[v].is_operator()) continue;
      vertex_check c = merged(v, g_[v].name, per_rank_);
      judge(c);
      rep_.checks.push_back(std::move(c));
    }
    if (o_.training) fold_training_step();
    if (o_.training)
      for (int pass = 0; pass < 2; ++pass)
        for (auto it = order.rbegin(); it != order.rend(); ++it) {
          const vertex_t v = *it;
          if (!reached_[v]) continue;
          vertex_check c = merged(v, (pass == 0 ? "grad:" : "update:") + g_[v].name, pass == 0 ? per_rank_grad_ : per_rank_update_);
          judge(c);
          (pass == 0 ? rep_.gradients : rep_.updates).push_back(std::move(c));
        }
    report("comparison", rep_.checks.size() + rep_.gradients.size() + rep_.updates.size(), tensors);
  }

  /// Each loss of the step against the unsharded one, and what the ranks' step did (the
  /// gradient synchronisations: the same on every rank; the largest is reported).
  void fold_training_step() {
    for (vertex_t v : training_losses(g_)) {
      vertex_check c;
      c.name = "loss:" + g_[v].name;
      c.spec = to_alpa_string(plan_[v].output);
      const double want = static_cast<double>(tref_.value[v].template as<T>()[0]);
      c.ref_max_abs = std::abs(want);
      for (std::size_t slot = 0; slot < loss_.size(); ++slot)  // the ranks that hold the loss (a pipeline's last stage)
        if (!o_.pipeline || o_.pipeline->stage_of[v].front() == static_cast<int>(slot) / mesh_.num_ranks())
          c.max_abs_diff = std::max(c.max_abs_diff, std::abs(loss_[slot][v] - want));
      judge(c);
      rep_.losses.push_back(std::move(c));
    }
    rep_.gradient_syncs.assign(n_, 0);
    for (const training_record& r : records_) {
      rep_.replayed_forwards = std::max(rep_.replayed_forwards, r.replayed_forwards);
      for (vertex_t v = 0; v < n_ && v < r.gradient_syncs.size(); ++v)
        rep_.gradient_syncs[v] = std::max(rep_.gradient_syncs[v], r.gradient_syncs[v]);
    }
  }

  const model_graph& g_;
  const device_mesh& mesh_;
  const std::vector<strategy>& plan_;
  const verify_options& o_;
  const std::size_t n_;
  const int stages_;  // pipeline stages (1: none)
  const int ranks_;   // the world: stages x the plan's mesh
  const int micro_batches_;
  model_graph global_;                  // the global batch's graph (micro_batches > 1)
  const model_graph* whole_ = nullptr;  // the graph of the whole batch: global_ or g_
  verify_report rep_;
  std::size_t operators_ = 0, parameters_ = 0, pieces_ = 0;
  std::size_t compared_ = 0;  // under compare_mu_
  const std::vector<host_tensor>* sources_ = nullptr;
  reference_stream<T>* ref_ = nullptr;
  std::chrono::steady_clock::time_point t0_;
  training_result tref_;
  std::vector<bool> reached_ = std::vector<bool>(n_, false);  // training: the parameters the backward reaches
  std::vector<std::vector<vertex_check>> per_rank_, per_rank_grad_, per_rank_update_;
  std::vector<fused_dim> fused_;
  std::mutex compare_mu_;  // one block copy at a time
  // Training: the unsharded step's gradients are dropped once every rank has compared its block.
  std::vector<int> unread_;
  std::vector<int> users_;  // per vertex: the ranks that compare it
  // A pipelined plan: each stage's graph of the whole batch and of one micro-step, and the values its ranks read.
  std::vector<stage_graph> forward_stages_, step_stages_;
  std::vector<std::vector<host_tensor>> stage_sources_;
  // Training: each rank's digest of each forward piece it compared.
  std::vector<std::vector<std::uint64_t>> digest_;
  // Training: each rank's value of each loss over the step, and what its step did.
  std::vector<std::vector<double>> loss_;
  std::vector<training_record> records_;
  std::vector<std::vector<issued_collective>> issued_;  // each rank's ledger
  double worst_ = -1.0;
  // keep_outputs: the graph's outputs, and (by vertex) their unsharded and gathered sharded values.
  std::vector<vertex_t> outputs_;
  std::vector<host_tensor> unsharded_out_, sharded_out_;
};

template <class T>
verify_report verify_typed(const model_graph& g, const device_mesh& mesh, const std::vector<strategy>& plan,
                           const verify_options& o) {
  return verify_run<T>(g, mesh, plan, o).run();
}

}  // namespace detail

/// Throws exec_error naming the opaque operators of `g` (imported with no mapping) that have
/// no kernel: checked before anything else about running a graph (a rank would stop
/// half-way; a missing loss is the second question). An imported elementwise operator whose
/// ONNX semantics need nothing the vertex does not record runs (elementwise_kernel_of), its
/// forward only: with `training`, one on the gradient's path is refused too.
inline void require_known_operators(const model_graph& g, bool training = false) {
  std::string opaque, forward_only;
  int n_opaque = 0, n_forward_only = 0;
  const std::vector<char> grad = training ? detail::gradient_flags(g) : std::vector<char>();
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
    if (g[v].kind != op_kind::opaque) continue;
    const std::string named = quoted_text(g[v].name) + " (" + quoted_text(g[v].attrs.op_type) + ")";
    if (detail::elementwise_kernel_of(g[v], operands(g, v).size()) == nullptr) {
      if (n_opaque++ < 5) opaque += (opaque.empty() ? "" : ", ") + named;
    } else if (training && grad[v] && n_forward_only++ < 5) {
      forward_only += (forward_only.empty() ? "" : ", ") + named;
    }
  }
  if (n_opaque > 0)
    throw exec_error("verify cannot run this graph: " + count_noun(n_opaque, "opaque operator") + " with no kernel (" + opaque + (n_opaque > 5 ? ", ..." : "") +
                     "); the plan is valid, but only a graph of known operators can be executed");
  if (n_forward_only > 0)
    throw exec_error("verify cannot run this graph's backward: " + count_noun(n_forward_only, "imported elementwise operator") +
                     " on the gradient's path " + (n_forward_only > 1 ? "have" : "has") + " a forward kernel only (" + forward_only +
                     (n_forward_only > 5 ? ", ..." : "") + "); check the forward pass (verify --forward-only)");
}

/// Runs `plan` (one strategy per vertex of `g`, e.g. autosharding_result::strategies) on
/// mesh.num_ranks() Gloo ranks and compares every operator with the unsharded run. Throws
/// exec_error for a plan that does not fit the graph, comm_error when a rank fails.
inline verify_report verify_plan(const model_graph& g, const device_mesh& mesh, const std::vector<strategy>& plan,
                                 const verify_options& o = {}) {
  validate(g);
  require_known_operators(g, o.training);
  check_position_tables(g);  // before any rank runs
  if (o.training) (void)training_losses(g);  // before the reference run: a graph without a loss has no backward
  if (o.compute == dtype::f32) return detail::verify_typed<float>(g, mesh, plan, o);
  if (o.compute == dtype::f64) return detail::verify_typed<double>(g, mesh, plan, o);
  throw exec_error("verify computes in f32 or f64, not " + std::string(to_string(o.compute)));
}

/// Runs a plan file read back whole (load_plan) as verify_plan does, auditing the collectives
/// the ranks issue against the ones the plan is priced with (`o.priced`, when set, instead);
/// a training plan's step runs the plan's micro-batches (plan_micro_batches), a pipelined
/// plan's stages on stages x its mesh's ranks with their transfers (verify_pipeline_of).
///   const autoshard::loaded_plan p = autoshard::load_plan("plan.json");
///   autoshard::verify_report r = autoshard::verify_plan(p, {.training = true});
inline verify_report verify_plan(const loaded_plan& p, verify_options o = {}) {
  if (!o.priced) o.priced = p.collectives;
  if (p.document.pipeline && !o.pipeline) o.pipeline = verify_pipeline_of(p);
  o.step.micro_batches = plan_micro_batches(p.document);
  return verify_plan(p.graph(), p.mesh(), p.strategies, o);
}

/// For autosharding_options::numeric_check: with run_checks the pass runs the chosen plan on
/// real ranks and throws solver_error when it does not match: naming the first differing
/// vertex, or the first place where the collectives the ranks issued differ from those the
/// cost model priced for the plan (the communication audit; `o.priced`, when set, is audited
/// instead of the pass's pricing).
inline std::function<void(const model_graph&, const device_mesh&, const std::vector<strategy>&, const std::vector<collective_use>&)>
numeric_check(verify_options o = {}) {
  return [o](const model_graph& g, const device_mesh& mesh, const std::vector<strategy>& plan,
             const std::vector<collective_use>& priced) {
    verify_options vo = o;
    if (!vo.priced) vo.priced = priced;
    const verify_report r = verify_plan(g, mesh, plan, vo);
    if (r.failed > 0) {
      const vertex_check* it = nullptr;  // an operator's output, or a training step's gradient or update
      for (const auto* list : {&r.checks, &r.losses, &r.gradients, &r.updates})
        for (const vertex_check& c : *list)
          if (it == nullptr && c.name == r.first_failed) it = &c;
      throw solver_error("check: the plan executed on " + std::to_string(mesh.num_ranks()) + " ranks differs from the "
                         "unsharded run at " + count_noun(r.failed, "operator") + ", first at " + quoted_text(r.first_failed) + " [" +
                         it->spec + "] by " + std::to_string(it->max_abs_diff) + " (values up to " +
                         std::to_string(it->ref_max_abs) + ", tolerance " + std::to_string(r.rtol) + " relative)");
    }
    if (!r.traffic.passed()) {
      const traffic_line& l = r.traffic.lines[r.traffic.first_mismatch];
      throw solver_error("check: the plan's executed communication differs from its pricing at " +
                         count_noun(r.traffic.mismatches, "place") + ", first at " + escaped_text(l.where) + " (" + l.kind +
                         " on mesh axis " + std::to_string(l.mesh_axis) + "): priced " + std::to_string(l.priced_bytes) +
                         " bytes per rank, executed " + std::to_string(l.executed_bytes));
    }
  };
}

}  // namespace autoshard
