// A training step as Megatron-LM runs it: activation memory and recomputation against
// Korthikanti et al. 2022's closed forms, FLOPs against Narayanan et al. 2021's eq. 3, the
// search over micro-batches against every micro-batching solved alone, the Megatron-LM and
// ZeRO baselines, and the plan as Megatron-LM's arguments.
#include <doctest/doctest.h>

#include <autoshard/pass/export_megatron.hpp>
#include <autoshard/pass/pass.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include "unit/scratch.hpp"

namespace {

using namespace autoshard;

/// A GPT layer stack of Megatron-LM's shape (GPT-2's graph: 4h MLP, learned positions, tied
/// logits, dropout in training), small enough for a unit test.
transformer_config gpt(int layers, int hidden, int heads, int seq, int batch) {
  transformer_config c = transformer_config::gpt2(layers, hidden, heads);
  c.seq = seq;
  c.max_positions = seq;
  c.vocab = 256;
  c.batch = batch;
  c.mode = run_mode::training;
  return c;
}

/// Per device, what the operators of layer `layer` keep for the backward under the plan.
double layer_activation_bytes(const autosharding_result& r, int layer) {
  double bytes = 0;
  const std::string mark = ".h." + std::to_string(layer) + ".";
  for (vertex_t v = 0; v < boost::num_vertices(r.graph); ++v)
    if (r.graph[v].is_operator() && r.graph[v].name.find(mark) != std::string::npos) bytes += static_cast<double>(r.strategies[v].memory_bytes);
  return bytes;
}

autosharding_options one_step(device_mesh m, recompute_policy r, attention_kernel a = attention_kernel::unfused) {
  autosharding_options o;
  o.mesh = std::move(m);
  o.compare_baselines = false;
  o.pricing.recompute = r;
  o.pricing.attention = a;
  o.pricing.micro_batches = 1;
  return o;
}

/// Megatron-LM's configuration on two nodes of four, with the unfused attention core it ran.
autosharding_options megatron_on_2x4() {
  autosharding_options o;
  o.mesh = make_cluster_mesh({2, 4});
  o.compare_baselines = false;
  o.algo = algo::megatron;
  o.pricing.attention = attention_kernel::unfused;
  return o;
}

}  // namespace

TEST_CASE("activation memory per layer is Korthikanti et al.'s s b h (34 + 5 a s / h) bytes, 34 s b h selective, 2 s b h full") {
  // s 32, b 2, h 64, a 4 on one device: every layer keeps, in bf16, the inputs of its norms,
  // linears, GeLU and attention core, its two dropout masks, and the unfused core's
  // probabilities, their dropout mask and dropped-out copy (5 a s^2 b bytes).
  const double s = 32, b = 2, h = 64, a = 4;
  const model_graph g = build_gpt2(gpt(3, 64, 4, 32, 2));
  const double none = s * b * h * (34 + 5 * a * s / h), selective = 34 * s * b * h, full = 2 * s * b * h;
  const auto kept = [&](recompute_policy r, int layer) {
    return layer_activation_bytes(autosharding_analysis_pass(g, one_step(device_mesh{1}, r)), layer);
  };
  CHECK(kept(recompute_policy::none, 1) == none);
  CHECK(kept(recompute_policy::selective, 1) == selective);
  CHECK(kept(recompute_policy::full, 1) == full);  // the layer's output: the next layer's checkpoint
  // With the flash kernel the probabilities never reach memory: 34 s b h without recomputing.
  CHECK(layer_activation_bytes(autosharding_analysis_pass(g, one_step(device_mesh{1}, recompute_policy::none,
                                                                      attention_kernel::flash)), 1) == selective);
  // The peak, one layer more: its parameters' 16 bytes each (bf16 Adam) and its activations,
  // or under full recomputation one more checkpoint (the working set of the layer being
  // recomputed is live once, whatever the depth).
  const auto peak = [&](int layers, recompute_policy r) {
    return static_cast<double>(autosharding_analysis_pass(build_gpt2(gpt(layers, 64, 4, 32, 2)), one_step(device_mesh{1}, r))
                                   .report.plan.peak_memory_bytes);
  };
  const double layer_parameters = 12 * h * h + 13 * h;  // c_attn, c_proj, c_fc, c_proj with biases, two norms
  CHECK(peak(3, recompute_policy::none) - peak(2, recompute_policy::none) == 16 * layer_parameters + none);
  CHECK(peak(3, recompute_policy::selective) - peak(2, recompute_policy::selective) == 16 * layer_parameters + selective);
  CHECK(peak(3, recompute_policy::full) - peak(2, recompute_policy::full) == 16 * layer_parameters + full);
}

TEST_CASE("activation memory under tensor and sequence parallelism is divided by t") {
  // Megatron-LM with sequence parallelism on 4 devices: the norms, dropouts and residual adds
  // split on the sequence, the attention core and MLP on heads and columns.
  const double s = 32, b = 2, h = 64, a = 4, t = 4;
  const model_graph g = build_gpt2(gpt(2, 64, 4, 32, 2));
  autosharding_options o = one_step(device_mesh{4}, recompute_policy::none);
  o.algo = algo::megatron;
  for (const char* n : {"transformer.drop", "transformer.h.1.ln_1", "transformer.h.1.attn.resid_dropout",
                        "transformer.h.1.attn.residual", "transformer.h.1.ln_2", "transformer.h.1.mlp.dropout",
                        "transformer.h.1.mlp.residual", "transformer.h.0.mlp.residual"})
    o.pinned[n] = parse_spec("RS0R", 1, 3);
  CHECK(layer_activation_bytes(autosharding_analysis_pass(g, o), 1) == s * b * h * (34 + 5 * a * s / h) / t);
  o.pricing.recompute = recompute_policy::selective;
  CHECK(layer_activation_bytes(autosharding_analysis_pass(g, o), 1) == 34 * s * b * h / t);
  o.pricing.recompute = recompute_policy::full;
  CHECK(layer_activation_bytes(autosharding_analysis_pass(g, o), 1) == 2 * s * b * h / t);
}

TEST_CASE("recomputation costs one more forward: the layer's for full, the attention core's for selective") {
  // Compute at the peak and memory traffic free: seconds x peak are FLOPs. A GPT layer's
  // forward is 24 b s h^2 + 4 b s^2 h in its GEMMs (the unfused core computes every pair),
  // and 55 b s h elementwise (biases 9, two norms 2 x 5, GeLU 8 x 4, a dropout and a residual
  // add of b s h each, twice).
  const double s = 32, b = 2, h = 64, layers = 3;
  const model_graph g = build_gpt2(gpt(3, 64, 4, 32, 2));
  autosharding_options o = one_step(device_mesh{1}, recompute_policy::none);
  o.pricing.device.memory_bandwidth = 1e29;
  o.pricing.achievable = false;
  const auto compute = [&](recompute_policy r) {
    o.pricing.recompute = r;
    return autosharding_analysis_pass(g, o).report.plan.compute_seconds * o.pricing.device.peak_flops;
  };
  const double none = compute(recompute_policy::none);
  CHECK(compute(recompute_policy::full) - none == doctest::Approx(layers * (24 * b * s * h * h + 4 * b * s * s * h + 55 * b * s * h)));
  CHECK(compute(recompute_policy::selective) - none == doctest::Approx(layers * 4 * b * s * s * h));
}

TEST_CASE("FLOPs of a GPT step are Megatron-LM's eq. 3 and the model's 72 B s l h^2 (1 + (s+1)/12h + V/12lh)") {
  const double B = 16, s = 32, l = 3, h = 64, V = 256;
  const model_graph g = build_gpt2(gpt(3, 64, 4, 32, 4));  // 4 sequences a micro-step, 4 micro-steps
  const step_flops f = count_step_flops(g, 4, map_layers(g));
  CHECK(f.megatron == doctest::Approx(96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))).epsilon(1e-12));
  // The model's FLOPs: GPT-2's causal core needs the s (s + 1) / 2 pairs its mask keeps.
  CHECK(f.model == doctest::Approx(72 * B * s * l * h * h * (1 + (s + 1) / (12 * h) + V / (12 * l * h))).epsilon(1e-12));
  CHECK(f.masked == doctest::Approx(l * 4 * B * h * (s * s - s * (s + 1) / 2)).epsilon(1e-12));
  // TFLOP/s per device and MFU of a plan: those counts over its step time.
  autosharding_options o = one_step(device_mesh{2}, recompute_policy::none);
  o.pricing.micro_batches = 0;
  const autosharding_result r = autosharding_analysis_pass(build_gpt2(gpt(3, 64, 4, 32, 16)), o);
  const plan_summary& p = r.report.plan;
  CHECK(p.tflops_per_device == doctest::Approx(f.megatron / (p.step_seconds * 2) / 1e12));
  CHECK(p.mfu == doctest::Approx(f.model / (p.step_seconds * 2 * o.pricing.device.peak_flops)));
}

TEST_CASE("MFU stays below 100 % at a sequence far longer than the hidden size, where eq. 3 counts past the peak") {
  // s = 32 h: eq. 3's s/6h term counts every S x S pair, twice what the causal flash core
  // computes. Priced at the peak with memory traffic free, the step's compute is exactly the
  // FLOPs run, so the model's FLOPs over it are at most the peak.
  const model_graph g = build_gpt2(gpt(2, 64, 4, 2048, 1));
  autosharding_options o = one_step(device_mesh{1}, recompute_policy::none, attention_kernel::flash);
  o.pricing.device.memory_bandwidth = 1e29;
  o.pricing.achievable = false;
  o.compare_baselines = false;
  const plan_summary& p = autosharding_analysis_pass(g, o).report.plan;
  CHECK(p.mfu > 0.9);
  CHECK(p.mfu < 1.0);
  CHECK(p.tflops_per_device * 1e12 > o.pricing.device.peak_flops);  // eq. 3's count: past the peak
}

TEST_CASE("micro-batches: the counts a global batch runs in are its divisors, found without a walk up to it") {
  CHECK(detail::micro_step_counts(12) == std::vector<std::int64_t>{1, 2, 3, 4, 6, 12});
  CHECK(detail::micro_step_counts(1) == std::vector<std::int64_t>{1});
  CHECK(detail::micro_step_counts(2147483647) == std::vector<std::int64_t>{1});  // prime, and above max_micro_batches
  CHECK(detail::micro_step_counts(1LL << 30).back() == max_micro_batches);
}

TEST_CASE("micro-batches: the search is exact over every micro-batching, and a tight budget picks more of them") {
  // 2 GPT layers of width 256 (4 heads, sequence 64), a global batch of 8 on 2x4: the search's
  // plan is the fastest of the plans each micro-batching has when solved alone. (With GPT-2
  // 124M's widths, 4 layers and a batch of 16, the same proof took 91 s of CPU under ASan, and
  // the tight budget picked one micro-batch; here 2.)
  const model_graph g = build_gpt2(gpt(2, 256, 4, 64, 8));
  autosharding_options o;
  o.mesh = make_cluster_mesh({2, 4});
  o.compare_baselines = false;
  const autosharding_result free = autosharding_analysis_pass(g, o);
  CHECK(free.report.plan.par.micro_batches == 1);  // no budget: one step is the fastest
  o.memory_budget = free.report.plan.peak_memory_bytes / 4;
  const autosharding_result tight = autosharding_analysis_pass(g, o);
  const plan_summary& t = tight.report.plan;
  CHECK(t.par.micro_batches > 1);  // the budget is met by running the batch in more micro-steps
  CHECK(t.peak_memory_bytes <= *o.memory_budget);
  CHECK(t.step_seconds >= free.report.plan.step_seconds);
  CHECK(!t.tried.empty());
  double best = std::numeric_limits<double>::infinity();
  for (int m : {1, 2, 4, 8}) {
    autosharding_options alone = o;
    alone.pricing.micro_batches = m;
    try {
      const autosharding_result r = autosharding_analysis_pass(g, alone);
      CHECK(r.report.plan.par.micro_batches == m);
      CHECK(graph_batch(r.graph) == 8 / m);  // the graph the plan is for: one micro-step's batch
      best = std::min(best, r.report.plan.step_seconds);
    } catch (const solver_error&) {  // m does not fit
    }
  }
  CHECK(t.step_seconds == doctest::Approx(best).epsilon(1e-9));
  // A micro-batch given per data-parallel rank is kept.
  o.pricing.micro_batch = 2;
  const autosharding_result given = autosharding_analysis_pass(g, o);
  CHECK(given.report.plan.par.micro_batch == 2);
  CHECK(given.report.plan.par.micro_batch * given.report.plan.par.dp * given.report.plan.par.micro_batches == 8);
}

TEST_CASE("micro-batches: a plan stays optimal only while every other part of the space was proven no faster") {
  // Several solves (micro-batchings, recomputation kinds, Megatron-LM's sequence parallelism on
  // or off) each cover a part of one space; the fastest is optimal over the whole only where
  // each other part was proven to take at least as long.
  plan_summary s;
  s.step_seconds = 1.0;
  solve_result kept;
  kept.cost_unit = 1e-3;
  kept.objective = kept.bound = 1000;
  detail::weaken_by(kept, s, 1.5);  // another part proven slower: nothing changes
  CHECK(kept.status == solve_status::optimal);
  CHECK(kept.bound == 1000);
  detail::weaken_by(kept, s, 1.0);  // as fast, proven: still optimal
  CHECK(kept.status == solve_status::optimal);
  detail::weaken_by(kept, s, 0.4004);  // a part only proven to take 0.4004 s: it may hold a faster plan
  CHECK(kept.status == solve_status::feasible);
  CHECK(kept.bound == 400);  // rounded down to whole cost units: still a proven bound
  CHECK(kept.gap == doctest::Approx(0.6));
  detail::weaken_by(kept, s, 0.7);  // a higher floor never raises a bound
  CHECK(kept.bound == 400);
  detail::weaken_by(kept, s, -1.0);  // nothing proven at all
  CHECK(kept.bound == 0);
  CHECK(kept.gap == doctest::Approx(1.0));
  // Running out of time without an answer proves nothing; a problem without answers does.
  CHECK(solver_error::none_found("the search ended").unproven());
  CHECK_FALSE(solver_error("no choice is feasible").unproven());
  CHECK(std::string(solver_error::none_found("x").what()) == std::string(solver_error("x").what()));
}

TEST_CASE("micro-batches: the gradient sync runs once per step, each micro-step's collectives every micro-step") {
  const model_graph g = build_gpt2(gpt(2, 256, 4, 64, 64));
  autosharding_options o;
  o.mesh = make_cluster_mesh({2, 4});
  o.compare_baselines = false;
  o.algo = algo::data_parallel;
  o.pricing.zero = false;
  o.pricing.micro_batches = 4;
  const plan_summary p = autosharding_analysis_pass(g, o).report.plan;
  int syncs = 0;
  for (const collective_use& c : p.collectives) {
    if (c.where.rfind("gradient of ", 0) == 0) {
      ++syncs;
      CHECK(c.repeats == 1);  // accumulated over the 4 micro-steps, reduced once
    } else if (c.where.rfind("ZeRO", 0) != 0) {
      CHECK(c.repeats == 4);  // every micro-step's own
    }
  }
  CHECK(syncs > 0);
  // Fewer micro-steps of more sequences each: the same sync, fewer of every other collective.
  o.pricing.micro_batches = 1;
  const plan_summary one = autosharding_analysis_pass(g, o).report.plan;
  CHECK(one.step_seconds < p.step_seconds);
  CHECK(p.par.micro_batch * p.par.dp * p.par.micro_batches == 64);
  CHECK(one.par.micro_batch * one.par.dp * one.par.micro_batches == 64);
}

TEST_CASE("baselines: Megatron-LM with its tensor-parallel size, distributed optimizer and selective recomputation") {
  const model_graph g = build_gpt2(gpt(2, 256, 4, 64, 16));
  autosharding_options o = megatron_on_2x4();
  const autosharding_result r = autosharding_analysis_pass(g, o);
  const parallelism& p = r.report.plan.par;
  CHECK(p.tp == 4);
  CHECK(p.dp == 2);
  CHECK(p.pp == 1);
  CHECK(p.zero == 1);  // the distributed optimizer
  // Every parameter is counted at its stage: the norms and biases whole on tp keep theirs plain.
  std::int64_t params = 0;
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) params += g[v].is_parameter() ? g[v].shape.numel() : 0;
  CHECK(p.zero_elements[0] + p.zero_elements[1] + p.zero_elements[2] + p.zero_elements[3] == params);
  CHECK(p.zero_elements[1] > 10 * p.zero_elements[0]);  // the norms, biases and position table: a twentieth
  CHECK(p.zero_elements[2] + p.zero_elements[3] == 0);
  CHECK(p.recompute == "selective on all 2 layers");
  CHECK(r.strategies[*find_vertex(r.graph, "transformer.h.0.attn.c_attn.weight")].zero_stage == 1);
  // --tp 2: the node's 4 devices as 2 data-parallel ranks of 2 tensor-parallel ones.
  o.tensor_parallel = 2;
  const autosharding_result two = autosharding_analysis_pass(g, o);
  CHECK(two.report.mesh.shape() == std::vector<int>{2, 2, 2});
  CHECK(two.report.plan.par.tp == 2);
  CHECK(two.report.plan.par.dp == 4);
  o.tensor_parallel = 1;
  const autosharding_result dp = autosharding_analysis_pass(g, o);
  CHECK(dp.report.plan.par.tp == 1);
  CHECK(dp.report.plan.par.dp == 8);
  o.tensor_parallel = 3;
  CHECK_THROWS_WITH_AS(autosharding_analysis_pass(g, o), doctest::Contains("a tensor-parallel size of 3 does not divide"),
                       solver_error);
  // A refusal says what it tried and what came closest, in the algo's own terms.
  o.tensor_parallel = 0;
  o.memory_budget = 1 << 20;
  CHECK_THROWS_WITH_AS(autosharding_analysis_pass(g, o),
                       doctest::Contains("megatron (tensor parallel 4, data parallel 2, distributed optimizer) does not fit the "
                                         "memory budget of 1.00 MiB (1048576 bytes) per device with selective recomputation: "
                                         "tried 4 micro-batchings of the global batch of 16; with the closest,"),
                       solver_error);
}

TEST_CASE("baselines: Megatron-LM's sequence parallelism splits every layer's norms or none, so its plan exports") {
  // LLaMA-7B's widths, two layers, one sequence, on one node of four: with each norm free, the
  // input norms ran split on the sequence and the post-attention ones whole, which Megatron-LM's
  // one --sequence-parallel switch cannot say (and export --to megatron refused).
  transformer_config c = transformer_config::llama_7b();
  c.layers = 2;
  c.batch = 1;
  c.mode = run_mode::training;
  const model_graph g = build_llama(c);
  autosharding_options o;
  o.mesh = make_cluster_mesh({1, 4});
  o.algo = algo::megatron;
  o.compare_baselines = false;
  o.ilp_solution_file = autoshard_test::unique_temp_path("megatron_sp.json").string();
  const autosharding_result r = autosharding_analysis_pass(g, o);
  const layer_map L = map_layers(r.graph);
  int norms = 0, split = 0;
  for (vertex_t v = 0; v < boost::num_vertices(r.graph); ++v) {
    if (!is_layer_norm(r.graph, L, v)) continue;
    ++norms;
    split += detail::runs_sequence_parallel(r.strategies[v], 1) ? 1 : 0;
  }
  CHECK(norms == 4);
  CHECK((split == 0 || split == norms));
  // The faster of all split and none, each solved alone as the search solves a micro-batching.
  const detail::pass_model pm(r.graph, r.report.mesh, r.report.pricing);
  double fastest = std::numeric_limits<double>::infinity();
  for (const bool sp : {true, false}) {
    detail::solve_request rq;
    rq.a = algo::megatron;
    rq.recompute = detail::algo_recompute_kinds(algo::megatron, recompute_policy::choose);
    rq.budget = false;
    rq.tp_axis = 1;
    rq.sequence_parallel = sp;
    std::size_t classes = 0;
    fastest = std::min(fastest, detail::solve_algo(pm, o, rq, classes).first.step_seconds);
  }
  CHECK(r.report.plan.step_seconds == doctest::Approx(fastest).epsilon(1e-12));
  const megatron_export e = export_megatron(load_plan(o.ilp_solution_file));
  CHECK(e.problems.empty());
  CHECK((megatron_arguments(e).find("--sequence-parallel") != std::string::npos) == (split == norms));
  std::filesystem::remove(o.ilp_solution_file);
}

TEST_CASE("export --to megatron: a Megatron-LM plan as its arguments, and a ZeRO-3 plan is refused") {
  const model_graph g = build_gpt2(gpt(2, 256, 4, 64, 16));
  autosharding_options o = megatron_on_2x4();
  o.pricing.micro_batches = 2;
  o.ilp_solution_file = autoshard_test::unique_temp_path("megatron_export.json").string();
  autosharding_analysis_pass(g, o);
  const megatron_export e = export_megatron(load_plan(o.ilp_solution_file));
  const std::string args = megatron_arguments(e);
  for (const char* want : {"--num-layers 2 \\", "--hidden-size 256 \\", "--num-attention-heads 4 \\", "--seq-length 64 \\",
                           "--tensor-model-parallel-size 4 \\", "--pipeline-model-parallel-size 1 \\",
                           "--micro-batch-size 4 \\", "--global-batch-size 16 \\", "--use-distributed-optimizer \\",
                           "--recompute-granularity selective"}) {
    CAPTURE(want);
    CHECK(args.find(want) != std::string::npos);
  }
  CHECK(args.find("--use-flash-attn") == std::string::npos);  // the plan was priced unfused
  // A ZeRO-3 plan stores weights sharded over the data-parallel ranks: not Megatron-LM's.
  o.algo = algo::zero3;
  autosharding_analysis_pass(g, o);
  const megatron_export z = export_megatron(load_plan(o.ilp_solution_file));
  CHECK(!z.problems.empty());
  CHECK_THROWS_WITH_AS(megatron_arguments(z), doctest::Contains("Megatron-LM's arguments cannot express this plan"), spec_error);
  CHECK_THROWS_WITH_AS(megatron_arguments(z), doctest::Contains("'transformer.h.0.attn.c_attn.weight': the plan splits it on"),
                       spec_error);
  std::filesystem::remove(o.ilp_solution_file);
}

TEST_CASE("step report: a plan that stores its parameters at several ZeRO stages says so, by the elements at each") {
  parallelism p;
  p.recompute = "none on all 2 layers";
  p.zero_elements = {0, 0, 8, 0};
  p.zero = 2;
  CHECK(describe_zero(p) == "ZeRO-2");
  CHECK(to_string(p).find(", ZeRO-2") != std::string::npos);
  // LLaMA-7B's plan on 8 H100s: the MLP's gate_proj of each layer plain, the rest ZeRO-2.
  p.zero_elements = {23, 0, 77, 0};
  CHECK(describe_zero(p) == "ZeRO-2 for 77 % of the parameters (ZeRO-0 for 23 %)");
  p.zero_elements = {1, 0, 7200, 2799};
  CHECK(describe_zero(p) == "ZeRO-2 for 72 % of the parameters (ZeRO-0 for under 1 %, ZeRO-3 for 28 %)");
  p.zero_elements = {1, 999, 0, 0};
  p.zero = 1;
  CHECK(describe_zero(p) == "ZeRO-1 for over 99 % of the parameters (ZeRO-0 for under 1 %)");
}

TEST_CASE("micro-batches: a graph whose views the micro-step's batch cannot follow runs as one step, and says why") {
  // The batch merged into another dim and cut apart otherwise ([8,6] viewed as [4,12]): no
  // micro-step of fewer sequences has a view of the same meaning.
  model_graph g;
  const vertex_t x = add_input(g, "x", {8, 6}, dtype::f32);
  op_attrs a;
  a.dims = {4, 12};
  const vertex_t mix = add_op(g, op_kind::reshape, "mix", {x}, a);
  const vertex_t w = add_parameter(g, "w", {12, 12}, dtype::f32);
  add_op(g, op_kind::linear, "fc", {mix, w});
  autosharding_options o = one_step(device_mesh{2}, recompute_policy::none);
  o.compare_baselines = false;
  o.pricing.micro_batches = 0;  // the planner chooses: one step is all it can run
  CHECK(autosharding_analysis_pass(g, o).report.plan.par.micro_batches == 1);
  o.pricing.micro_batches = 2;
  CHECK_THROWS_WITH_AS(autosharding_analysis_pass(g, o),
                       doctest::Contains("cannot run in 2 micro-batches on mesh mesh(2) (the graph cannot be re-sized to a micro-step: "
                                         "reshape 'mix' from [8,6] to [4,12] cannot follow its input re-sized to [4,6])"),
                       solver_error);
}

TEST_CASE("a sliding window's pairs: the model's FLOPs count only the keys each query sees, eq. 3 all of them") {
  // Mistral's window W < s: the first W queries see W (W + 1) / 2 pairs, every later one W.
  const double B = 2, s = 32, l = 2, h = 64, W = 8;
  transformer_config c = transformer_config::llama(2, 64, 4, 4, 128);
  c.seq = 32;
  c.batch = 2;
  c.vocab = 256;
  const model_graph full = build_llama(c);
  const step_flops f = count_step_flops(full, 1, map_layers(full));
  c.sliding_window = 8;
  const model_graph windowed = build_llama(c);
  const step_flops w = count_step_flops(windowed, 1, map_layers(windowed));
  CHECK(w.megatron == f.megatron);
  CHECK(f.masked == doctest::Approx(l * 4 * B * h * (s * s - s * (s + 1) / 2)).epsilon(1e-12));
  CHECK(w.masked == doctest::Approx(l * 4 * B * h * (s * s - (W * (W + 1) / 2 + (s - W) * W))).epsilon(1e-12));
  CHECK(f.model - w.model == doctest::Approx(3 * (w.masked - f.masked)).epsilon(1e-12));
  c.sliding_window = 32;  // the whole sequence: the causal count
  const model_graph whole = build_llama(c);
  CHECK(count_step_flops(whole, 1, map_layers(whole)).masked == f.masked);
}
