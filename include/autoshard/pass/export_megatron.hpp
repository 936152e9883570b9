#pragma once
/// A training plan as Megatron-LM's command-line arguments: the parallelism (tensor and data
/// parallel sizes, sequence parallelism, the distributed optimizer), the step (micro-batch,
/// global batch, recomputation) and the model those arguments build, or a refusal that names
/// what the arguments cannot express.
///   const autoshard::loaded_plan p = autoshard::load_plan("plan.json");
///   const autoshard::megatron_export e = autoshard::export_megatron(p);  // e.problems: what they cannot say
///   std::string args = autoshard::megatron_arguments(e);                // throws spec_error listing them
///
/// Megatron-LM runs one layout (megatron_layout.hpp, the rules the megatron baseline is solved
/// under): tensor parallelism on consecutive ranks (the mesh's last axis), the block linears
/// column-parallel (query/key/value, the MLP's first projections) and row-parallel (the
/// attention output, the MLP's last projection), the attention core split over its heads, the
/// word embedding vocab-parallel, the output layer column-parallel over the vocabulary and the
/// cross-entropy vocab-parallel, the norms, position embeddings and row-parallel biases whole on
/// the tensor-parallel ranks; data parallelism over every other axis, the batch split over
/// every data-parallel rank and each parameter whole on it or, with the distributed optimizer,
/// its optimizer state sharded (ZeRO-1: the plan's " zero-1" storage, for every parameter that
/// offers it, over the data-parallel ranks only); sequence parallelism when the layers' norms
/// run split on the sequence; and one recomputation for all layers (full, optionally on the
/// first k layers only, or selective). A plan that lays any of those operators out otherwise
/// (a weight sharded over data-parallel ranks, ZeRO-2 or -3; a batch kept whole on a
/// data-parallel axis; a linear, embedding, head, loss or attention split another way on the
/// tensor-parallel axis), puts tensor parallelism across nodes, or recomputes some other set of
/// layers is refused, never approximated: each problem names the operator, the plan's strategy
/// and what Megatron-LM does.
///
/// A pipelined plan (plan files' "pipeline") adds --pipeline-model-parallel-size: Megatron-LM
/// splits the layers evenly over its stages, or with --decoder-first-pipeline-num-layers and
/// --decoder-last-pipeline-num-layers (Megatron Core 0.10 and later) gives the first and last
/// stage their own counts and the stages between the rest evenly. Stages between of unequal
/// counts, a stage without layers, or a schedule other than 1F1B (Megatron-LM's without
/// virtual stages) are refused.
#include <algorithm>  // std::max, std::none_of
#include <cmath>     // std::floor, std::nextafter
#include <map>       // std::map
#include <optional>  // std::optional
#include <string>    // std::string
#include <utility>   // std::pair
#include <vector>    // std::vector

#include "../core/error.hpp"     // spec_error, solver_error
#include "../graph/resize.hpp"   // graph_sequence, graph_batch
#include "layers.hpp"            // map_layers, layer_recomputation
#include "loaded_plan.hpp"       // loaded_plan
#include "megatron_layout.hpp"   // detail::megatron_tp_rule, megatron_dp_rule, megatron_kv_whole, vocab_operators_of

namespace autoshard {

/// One argument: a flag and its value ("" for a switch).
struct megatron_argument {
  std::string flag;
  std::string value;
};

/// What a plan says in Megatron-LM's arguments.
struct megatron_export {
  int tp = 1, dp = 1, pp = 1;
  std::vector<megatron_argument> arguments;  ///< in the order written
  std::vector<std::string> problems;         ///< what the arguments cannot express, naming the operators
  std::vector<std::string> notes;            ///< what they express only in part, or leave to the user
};

namespace detail {

/// The block linears of a plan and whether each is column-parallel in Megatron-LM.
inline std::vector<vertex_t> megatron_linears(const model_graph& g) {
  std::vector<vertex_t> out;
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
    if (g[v].kind == op_kind::linear && (megatron_column(g[v].name) || megatron_row(g[v].name))) out.push_back(v);
  return out;
}

/// The pipeline flags of a plan's stages (none: one stage) of a model of `layers` (see the header
/// comment); what they cannot say goes to e.problems, the flags' versions to e.notes.
inline std::vector<megatron_argument> megatron_pipeline(const std::optional<plan_pipeline>& pipeline, int layers, megatron_export& e) {
  std::vector<megatron_argument> out{{"--pipeline-model-parallel-size", "1"}};
  if (!pipeline) return out;
  const plan_pipeline& p = *pipeline;
  const std::size_t n = p.stages.size();
  std::vector<std::string>& problems = e.problems;
  e.pp = static_cast<int>(n);
  out[0].value = std::to_string(n);
  if (p.stages.back().first_layer + p.stages.back().layers != layers) {
    problems.push_back("its stages hold " + std::to_string(p.stages.back().first_layer + p.stages.back().layers) +
                       " layers of the model's " + std::to_string(layers));
    return out;
  }
  if (p.schedule != pipeline_schedule::one_f_one_b)
    problems.push_back("its stages run the " + std::string(to_string(p.schedule)) +
                       " schedule: Megatron-LM runs 1F1B (its schedule without virtual stages)");
  for (std::size_t k = 0; k < n; ++k)
    if (p.stages[k].layers == 0)
      problems.push_back("stage " + std::to_string(k) + " holds " + describe_stage(p, k) +
                         " without a layer: each of Megatron-LM's stages holds transformer layers");
  if (n < 2) return out;
  const int first = p.stages.front().layers, last = p.stages.back().layers;
  const int mid = n > 2 ? p.stages[1].layers : last;
  for (std::size_t k = 1; k + 1 < n; ++k)
    if (p.stages[k].layers != mid) {
      std::string counts;
      for (const plan_stage& s : p.stages) counts += (counts.empty() ? "" : ", ") + std::to_string(s.layers);
      problems.push_back("its stages hold " + counts + " layers: Megatron-LM gives the stages between the first and the last " +
                         "as many layers each");
      return out;
    }
  if (first != mid) out.push_back({"--decoder-first-pipeline-num-layers", std::to_string(first)});
  if (n > 2 && last != mid) out.push_back({"--decoder-last-pipeline-num-layers", std::to_string(last)});
  if (out.size() > 1)
    e.notes.push_back("--decoder-first/last-pipeline-num-layers are Megatron Core 0.10's and later's; earlier Megatron-LM splits "
                      "the layers evenly only");
  return out;
}

/// One argument at the end of e.arguments.
inline void megatron_arg(megatron_export& e, std::string flag, std::string value = {}) {
  e.arguments.push_back({std::move(flag), std::move(value)});
}

/// How plan `p` lays the model out as Megatron-LM sees it: the tensor-parallel axis (the last
/// mesh axis, when the block `linears`' weights are split on it; -1: none), and whether any
/// parameter is stored ZeRO-1 (the distributed optimizer).
struct megatron_layout {
  int tp_axis = -1;
  bool zero1 = false;
};

/// Plan p's layout, with e.tp and e.dp set and every vertex checked to run as Megatron-LM runs
/// it (megatron_layout.hpp, the rules the megatron baseline is solved under: data parallel off
/// the tensor-parallel axis with the batch split over every data-parallel rank, on it the block
/// linears column- or row-parallel, the vocabulary's operators vocab-parallel, the attention
/// core over its heads, the norms whole or split on the sequence; ZeRO-1 over the
/// data-parallel ranks or nothing): what does not goes to e.problems, one per vertex, naming
/// the vertex, the plan's strategy and what Megatron-LM does.
inline megatron_layout megatron_layout_of(const loaded_plan& p, const std::vector<vertex_t>& linears, megatron_export& e) {
  const model_graph& g = p.graph();
  const device_mesh& m = p.mesh();
  // Tensor parallelism: the last mesh axis, when the block linears' weights are split on it.
  const std::size_t last = m.ndim() - 1;
  bool split_on_last = false;
  for (vertex_t v : linears) split_on_last = split_on_last || (m.size(last) > 1 && p.strategies[v].inputs[1][last].is_shard());
  megatron_layout out;
  out.tp_axis = split_on_last ? static_cast<int>(last) : -1;
  e.tp = split_on_last ? m.size(last) : 1;
  e.dp = m.num_ranks() / e.tp;
  const vocab_operators vo = vocab_operators_of(g);
  const std::int64_t batch = graph_batch(g);
  std::vector<char> kv_whole(boost::num_vertices(g), 0);
  try {
    kv_whole = megatron_kv_whole(g, m, out.tp_axis);
  } catch (const solver_error& x) {  // heads the tensor-parallel ranks do not split whole: the baseline's refusal
    std::string why(x.message());
    if (why.starts_with("megatron: ")) why.erase(0, 10);
    e.problems.push_back(why);
  }
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
    const strategy& s = p.strategies[v];
    const std::vector<vertex_t> ops = operands(g, v);
    std::string why;
    if (s.zero_stage > 1) why = "stores it ZeRO-" + std::to_string(s.zero_stage) + " (Megatron-LM's distributed optimizer is ZeRO-1)";
    for (std::size_t a = 0; a < m.ndim() && why.empty(); ++a)
      if (static_cast<int>(a) != out.tp_axis && m.size(a) > 1)
        if (const char* does = megatron_dp_rule(g, v, ops, s, a, m.size(a), batch))
          why = (data_parallel_axis(g, v, ops, s, a) ? "does not split its batch on " : "splits it on ") + m.axis_label(a) +
                ", a data-parallel axis (" + s.name + "): " + does;
    if (why.empty() && out.tp_axis >= 0) {
      if (const char* does = megatron_tp_rule(g, v, ops, s, last, m.size(last), kv_whole[v] != 0, vo, batch))
        why = "does not split it as Megatron-LM does on the tensor-parallel " + m.axis_label(last) + " (" + s.name + "): " + does;
      else if (const char* z = megatron_zero1_rule(s, out.tp_axis))
        why = "stores its optimizer state split on the tensor-parallel " + m.axis_label(last) + " too (" + s.name + "): " + z;
    }
    if (!why.empty()) e.problems.push_back(quoted_text(g[v].name) + ": the plan " + why);
    out.zero1 = out.zero1 || s.zero_stage == 1;
  }
  if (m.ndim() >= 2 && out.tp_axis == 0) e.problems.push_back("tensor parallelism is on the first mesh axis, across nodes");
  return out;
}

/// Whether plan p runs sequence parallel: the layers' norms split on the sequence on the
/// tensor-parallel axis `tp_axis`. Megatron-LM's switch splits all or none: some is a problem.
inline bool megatron_sequence_parallel(const loaded_plan& p, const layer_map& layers, int tp_axis, megatron_export& e) {
  const model_graph& g = p.graph();
  const std::size_t last = p.mesh().ndim() - 1;  // the tensor-parallel axis when there is one
  int seq_split = 0, norms = 0;
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
    if (!is_layer_norm(g, layers, v)) continue;
    ++norms;
    if (tp_axis >= 0 && detail::runs_sequence_parallel(p.strategies[v], last)) ++seq_split;
  }
  if (seq_split > 0 && seq_split < norms)
    e.problems.push_back(std::to_string(seq_split) + " of the layers' " + std::to_string(norms) +
                         " norms run split on the sequence: Megatron-LM's sequence parallelism splits all or none");
  return seq_split > 0;
}

/// The model as Megatron-LM's arguments describe it: its sizes and its architecture's switches.
struct megatron_model {
  int layers = 0, heads = 0, kv = 0;
  /// head: each attention head's width D, which Megatron-LM's --kv-channels says (its default
  /// hidden / heads; Gemma-7B's heads of 256 on a hidden of 3072 are not).
  /// positions: the rows of the learned position table (GPT-2's n_positions), 0 without one.
  std::int64_t hidden = 0, head = 0, ffn = 0, vocab = 0, seq = 0, positions = 0;
  bool rms = false, rope = false, swiglu = false, bias = false, learned_positions = false, tied = false, dropout = false;
  std::string scaled_rope;  ///< a rotary whose frequencies are given outright (Llama-3.1's rope_scaling)
  /// The MLP's activation (the first in a layer: its name and kind), whether it gates (a mul
  /// reads it: SwiGLU, GeGLU), and whether the MLP's first projection has a bias.
  std::string act_name;
  op_kind act = op_kind::input;
  /// An attention core without the causal mask (an encoder's: BERT's), "" where none.
  std::string bidirectional;
  /// An attention core whose sliding window is shorter than the sequence (its name and window;
  /// "" and 0 where none): the arguments do not say a window (export_megatron refuses it).
  std::string windowed;
  std::int64_t window = 0, window_seq = 0;  ///< and the sequence its queries span
  /// An attention core that adds ALiBi's biases (its name and rule; "" where none): Megatron-LM
  /// has no ALiBi (export_megatron refuses it).
  std::string alibi;
  alibi_rule alibi_kind = alibi_rule::none;
  bool gated = false, mlp_bias = false;
  /// The block linears' biases: a linear with one and one without (their names; "" where all
  /// alike), and whether those with one are exactly query/key/value's (Qwen2's).
  std::string biased, unbiased;
  bool qkv_bias_only = false;
  /// The first rotary (its name, base, layout, head size D and turned dims R), and a second
  /// that turns otherwise ("" where they all turn alike): Megatron-LM's arguments say one rotary.
  std::string rope_name, rope_differs;
  double rope_base = 10000.0;
  bool rope_half = true;
  std::int64_t rope_head = 0, rope_dims = 0;
  /// The norms' epsilons (attrs.epsilon), each distinct one with the first norm that has it,
  /// in the graph's order: Megatron-LM's --norm-epsilon is one for every norm.
  std::vector<std::pair<double, std::string>> norm_epsilons;
  std::pair<std::string, double> offset_norm;       ///< the first norm scaling by weight_offset + weight, its offset (Gemma's 1)
  std::pair<std::string, double> scaled_embedding;  ///< the first embedding whose rows are scaled, its scale (Gemma's sqrt(hidden))
};

/// Model `g` of repeated layers `layers` and block `linears`: the first attention core's heads
/// and their width (its output's last dim / heads), whether it is causal, the hidden size (the
/// first row-parallel linear's output's last dim, the residual's; without one, the core's
/// output's), the MLP's width and activation, the block linears' biases, the vocabulary and
/// whether the head shares its table (vocab_operators_of: the word embedding is the head's, or
/// without a head the first whose indices are not one row of positions), the learned position
/// table's rows, the sequence (graph_sequence).
inline megatron_model megatron_model_of(const model_graph& g, const layer_map& layers, const std::vector<vertex_t>& linears) {
  megatron_model md;
  const vocab_operators vo = vocab_operators_of(g);  // the word embedding, its vocabulary, whether the head is tied
  md.vocab = vo.vocab;
  md.tied = vo.tied;
  md.layers = static_cast<int>(layers.indices.size());
  md.seq = graph_sequence(g);
  for (vertex_t v : linears)
    if (megatron_row(g[v].name) && md.hidden == 0) md.hidden = g[v].shape[g[v].shape.rank - 1u];
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
    const node& nd = g[v];
    if (nd.kind == op_kind::attention && md.heads == 0) {
      md.heads = nd.attrs.heads;
      md.kv = nd.attrs.kv_heads > 0 ? nd.attrs.kv_heads : nd.attrs.heads;
      md.head = md.heads > 0 ? nd.shape[nd.shape.rank - 1u] / md.heads : 0;
      if (!nd.attrs.causal) md.bidirectional = nd.name;
      if (md.hidden == 0) md.hidden = nd.shape[nd.shape.rank - 1u];
    }
    if (nd.kind == op_kind::attention && nd.attrs.window > 0 && nd.shape.rank == 3 && nd.attrs.window < nd.shape[1] && md.windowed.empty())
      md.windowed = nd.name, md.window = nd.attrs.window, md.window_seq = nd.shape[1];
    if (nd.kind == op_kind::attention && nd.attrs.alibi != alibi_rule::none && md.alibi.empty()) md.alibi = nd.name, md.alibi_kind = nd.attrs.alibi;
    if (nd.kind == op_kind::rms_norm) md.rms = true;
    if ((nd.kind == op_kind::rms_norm || nd.kind == op_kind::layer_norm) &&
        std::none_of(md.norm_epsilons.begin(), md.norm_epsilons.end(), [&](const auto& e) { return e.first == nd.attrs.epsilon; }))
      md.norm_epsilons.emplace_back(nd.attrs.epsilon, nd.name);
    if (nd.kind == op_kind::rotary) md.rope = true;
    if (nd.kind == op_kind::rotary && (!nd.attrs.rotary_frequencies.empty() || nd.attrs.scale != 1.0) && md.scaled_rope.empty())
      md.scaled_rope = nd.name;
    if ((nd.kind == op_kind::rms_norm || nd.kind == op_kind::layer_norm) && nd.attrs.weight_offset != 0.0 && md.offset_norm.first.empty())
      md.offset_norm = {nd.name, nd.attrs.weight_offset};
    if (nd.kind == op_kind::embedding && nd.attrs.scale != 1.0 && md.scaled_embedding.first.empty())
      md.scaled_embedding = {nd.name, nd.attrs.scale};
    if (nd.kind == op_kind::rotary) {
      const std::int64_t D = nd.attrs.heads > 0 ? nd.shape[nd.shape.rank - 1u] / nd.attrs.heads : 0, R = rotary_width(nd.attrs, D);
      if (md.rope_name.empty()) {
        md.rope_name = nd.name, md.rope_base = nd.attrs.rotary_base, md.rope_half = nd.attrs.rotary_half;
        md.rope_head = D, md.rope_dims = R;
      } else if (md.rope_differs.empty() && (nd.attrs.rotary_base != md.rope_base || nd.attrs.rotary_half != md.rope_half ||
                                             D != md.rope_head || R != md.rope_dims)) {
        md.rope_differs = nd.name;
      }
    }
    const bool activation = nd.kind == op_kind::gelu || nd.kind == op_kind::gelu_erf || nd.kind == op_kind::silu ||
                            nd.kind == op_kind::relu || nd.kind == op_kind::tanh;
    if (activation && layers.layer[v] >= 0 && md.act_name.empty()) {
      md.act_name = nd.name, md.act = nd.kind;
      for (auto [o, end] = boost::out_edges(v, g); o != end; ++o) md.gated = md.gated || g[boost::target(*o, g)].kind == op_kind::mul;
      md.swiglu = nd.kind == op_kind::silu && md.gated;
    }
    // Positions: an embedding other than the word one whose indices are one row shared by the batch.
    if (nd.kind == op_kind::embedding && vo.embedding != v && g[operands(g, v)[0]].shape.rank >= 2 &&
        g[operands(g, v)[0]].shape[0] == 1) {
      md.learned_positions = true;
      if (md.positions == 0) md.positions = g[operands(g, v)[1]].shape[0];
    }
    md.dropout = md.dropout || nd.kind == op_kind::dropout;
  }
  for (vertex_t v : linears)
    if (megatron_column(g[v].name) && (g[v].name.ends_with(".mlp.c_fc") || g[v].name.ends_with(".up_proj") ||
                                       g[v].name.ends_with(".intermediate.dense")) && md.ffn == 0)
      md.ffn = g[v].shape[g[v].shape.rank - 1u], md.mlp_bias = operands(g, v).size() == 3;
  // A fused gate|up (Phi-3's gate_up_proj) is none of those: the MLP's last projection reads
  // the width. Without --ffn-hidden-size Megatron-LM's is 4 x hidden, or with --swiglu
  // int(8 x hidden / 3 / 64) x 64.
  for (vertex_t v : linears)
    if (md.ffn == 0 && (g[v].name.ends_with(".down_proj") || g[v].name.ends_with(".mlp.c_proj"))) {
      const tensor_shape& in = g[operands(g, v)[0]].shape;
      md.ffn = in[in.rank - 1u];
    }
  bool qkv_only = true;
  for (vertex_t v : linears) {
    const bool has = operands(g, v).size() == 3;
    std::string& first = has ? md.biased : md.unbiased;
    if (first.empty()) first = g[v].name;
    qkv_only = qkv_only && has == megatron_qkv(g[v].name);
  }
  md.bias = !md.biased.empty();
  md.qkv_bias_only = md.bias && !md.unbiased.empty() && qkv_only;
  return md;
}

/// Megatron-LM's default --rotary-base (arguments.py: type=int, default=10000).
inline constexpr double megatron_rotary_base = 10000.0;

/// --rotary-percent for R turned dims of heads of D: the shortest decimal p, as Python reads
/// it, for which Megatron-LM's RotaryEmbedding turns R dims: int(D * p) with p < 1 (dim =
/// int(kv_channels * rotary_percent), then rot_dim of each head, the rest passed through).
/// R/D's own decimal, else the double just above it (where D x R/D rounds below R); nullopt
/// where neither gives R.
inline std::optional<std::string> megatron_rotary_percent(std::int64_t R, std::int64_t D) {
  const double Dd = static_cast<double>(D), p = static_cast<double>(R) / Dd;
  for (const double q : {p, std::nextafter(p, 2.0)})  // exact_number's text reads back as q, in Python too
    if (q < 1.0 && static_cast<std::int64_t>(Dd * q) == R) return exact_number(q);
  return std::nullopt;
}

/// What Megatron-LM's rotary arguments cannot say of the model's rotaries (problems, each
/// naming a rotary): rotaries that turn unalike, a base that is not an integer (--rotary-base
/// is an int), a part of the head no --rotary-percent turns exactly.
inline void megatron_rope_problems(const megatron_model& md, std::vector<std::string>& problems) {
  if (!md.rope || md.rope_name.empty()) return;
  const std::string r = quoted_text(md.rope_name) + " (rotary) ";
  if (!md.rope_differs.empty())
    problems.push_back(quoted_text(md.rope_differs) + " (rotary) turns otherwise than " + r +
                       "(its base, pairs' layout, head size or turned dims): Megatron-LM's rotary arguments are one for every layer");
  if (!(md.rope_base == std::floor(md.rope_base)))
    problems.push_back(r + "turns at base " + exact_number(md.rope_base) +
                       ": Megatron-LM's --rotary-base is an integer (arguments.py: type=int), and the base is not rounded");
  else if (!(md.rope_base < 0x1p62))
    problems.push_back(r + "turns at base " + exact_number(md.rope_base) + ", beyond the integers the export writes (2^62)");
  if (md.rope_dims != md.rope_head && !megatron_rotary_percent(md.rope_dims, md.rope_head))
    problems.push_back(r + "turns " + std::to_string(md.rope_dims) + " of each head's " + std::to_string(md.rope_head) +
                       " dims: no --rotary-percent p makes Megatron-LM's int(" + std::to_string(md.rope_head) + " * p) " +
                       std::to_string(md.rope_dims));
}

/// Megatron-LM's default --norm-epsilon (arguments.py: type=float, default=1e-5).
inline constexpr double megatron_norm_epsilon = 1e-5;

/// What Megatron-LM's --norm-epsilon cannot say of the model's norms (a problem listing each
/// epsilon with a norm that has it): norms of unlike epsilons, where it is one for every norm.
inline void megatron_norm_problems(const megatron_model& md, std::vector<std::string>& problems) {
  if (md.norm_epsilons.size() < 2) return;
  std::string list;
  for (const auto& [eps, name] : md.norm_epsilons) list += (list.empty() ? "" : ", ") + quoted_text(name) + " " + exact_number(eps);
  problems.push_back("the norms add unlike epsilons (" + list +
                     "): Megatron-LM's --norm-epsilon (TransformerConfig.layernorm_epsilon) is one for every norm");
}

/// What Megatron-LM's arguments cannot say of the MLP's activation (a problem naming it), as
/// megatron.core's MLP computes it: --swiglu is SiLU gating (silu(gate) x up); otherwise GELU,
/// the tanh approximation where the first projection has a bias (bias_gelu_fusion, on by
/// default, fuses the bias with fused_bias_gelu's tanh form), the exact F.gelu without one or
/// with --no-bias-gelu-fusion. No argument says a GELU gate (Gemma's GeGLU: --quick-geglu is
/// x sigmoid(1.702 x)), an ungated SiLU, ReLU or tanh, nor the tanh GELU without a bias.
inline void megatron_activation_problems(const megatron_model& md, std::vector<std::string>& problems) {
  if (md.act_name.empty()) return;
  const std::string a = quoted_text(md.act_name) + " (" + std::string(to_string(md.act)) + ") ";
  if (md.act == op_kind::silu && !md.gated)
    problems.push_back(a + "is an ungated SiLU: Megatron-LM's --swiglu gates it (silu(gate) x up), and no argument says it alone");
  else if ((md.act == op_kind::gelu || md.act == op_kind::gelu_erf) && md.gated)
    problems.push_back(a + "gates the MLP (GeGLU): Megatron-LM's arguments gate SiLU (--swiglu) or x sigmoid(1.702 x) "
                           "(--quick-geglu), not GELU");
  else if (md.act == op_kind::gelu && !md.mlp_bias)
    problems.push_back(a + "is GELU's tanh approximation on an MLP without biases: Megatron-LM's MLP computes it only fused "
                           "with a bias (bias_gelu_fusion), and the exact F.gelu otherwise");
  else if (md.act != op_kind::silu && md.act != op_kind::gelu && md.act != op_kind::gelu_erf)
    problems.push_back(a + "is not an activation Megatron-LM's arguments say (GELU, or SiLU gated by --swiglu)");
}

/// The model's arguments, in the order Megatron-LM's --help groups them: its sizes, its
/// architecture (its rotary's base, part of the head and layout, and its norms' epsilon, where
/// they are not Megatron-LM's defaults), the weights' dtype `t` and the attention kernel of `pricing`.
inline void megatron_model_arguments(const megatron_model& md, dtype t, const step_pricing& pricing, megatron_export& e) {
  const auto num = [](std::int64_t x) { return std::to_string(x); };
  megatron_arg(e, "--num-layers", num(md.layers));
  megatron_arg(e, "--hidden-size", num(md.hidden));
  if (md.ffn > 0) megatron_arg(e, "--ffn-hidden-size", num(md.ffn));
  megatron_arg(e, "--num-attention-heads", num(md.heads));
  // Megatron-LM's default is hidden // heads (arguments.py, validate_args); a head of another
  // width (Gemma-7B's 256 on 3072 / 16) builds other projections without it.
  if (md.head * md.heads != md.hidden) megatron_arg(e, "--kv-channels", num(md.head));
  if (md.kv != md.heads) megatron_arg(e, "--group-query-attention"), megatron_arg(e, "--num-query-groups", num(md.kv));
  megatron_arg(e, "--seq-length", num(md.seq));
  // Megatron-LM's learned position table has --max-position-embeddings rows: the model's
  // (GPT-2's 1024), not the sequence's, or the checkpoint's table does not load into it.
  megatron_arg(e, "--max-position-embeddings", num(md.learned_positions ? std::max(md.positions, md.seq) : md.seq));
  megatron_arg(e, "--position-embedding-type", md.rope ? "rope" : md.learned_positions ? "learned_absolute" : "none");
  if (md.rope && md.rope_base != megatron_rotary_base) megatron_arg(e, "--rotary-base", std::to_string(static_cast<std::int64_t>(md.rope_base)));
  if (md.rope && md.rope_dims != md.rope_head) megatron_arg(e, "--rotary-percent", *megatron_rotary_percent(md.rope_dims, md.rope_head));
  if (md.rope && !md.rope_half) megatron_arg(e, "--rotary-interleaved");  // pairs (2i, 2i+1): rope_utils' _rotate_half, interleaved
  if (md.rms) megatron_arg(e, "--normalization", "RMSNorm");
  if (!md.norm_epsilons.empty() && md.norm_epsilons.front().first != megatron_norm_epsilon)
    megatron_arg(e, "--norm-epsilon", exact_number(md.norm_epsilons.front().first));  // as Python's float() reads it back
  if (md.swiglu) megatron_arg(e, "--swiglu");
  // Exact GELU after a bias: without the switch Megatron-LM fuses them into the tanh form.
  if (md.act == op_kind::gelu_erf && md.mlp_bias) megatron_arg(e, "--no-bias-gelu-fusion");
  if (!md.bias || md.qkv_bias_only) megatron_arg(e, "--disable-bias-linear");
  if (md.qkv_bias_only) megatron_arg(e, "--add-qkv-bias");  // Qwen2's: query/key/value only
  if (!md.tied) megatron_arg(e, "--untie-embeddings-and-output-weights");
  // A model without dropout (LLaMA) runs Megatron-LM's at 0.
  if (!md.dropout) megatron_arg(e, "--attention-dropout", "0.0"), megatron_arg(e, "--hidden-dropout", "0.0");
  if (t == dtype::bf16) megatron_arg(e, "--bf16");
  else if (t == dtype::f16) megatron_arg(e, "--fp16");
  if (pricing.attention == attention_kernel::flash) megatron_arg(e, "--use-flash-attn");
}

/// Recomputation `rec` (per layer) as arguments: one kind for all layers, or full on the first
/// k. False, with the arguments cleared and the problem said, when it is neither.
inline bool megatron_recompute_arguments(const std::map<long, recompute_kind>& rec, megatron_export& e) {
  std::size_t full = 0, selective = 0, first_full = 0;
  bool prefix = true;
  for (const auto& [i, r] : rec) {
    full += r == recompute_kind::full;
    selective += r == recompute_kind::selective;
    if (r == recompute_kind::full && prefix) ++first_full;
    else prefix = false;
  }
  if (selective > 0 && selective == rec.size()) {
    megatron_arg(e, "--recompute-granularity", "selective");
  } else if (full > 0 && full == rec.size()) {
    megatron_arg(e, "--recompute-granularity", "full"), megatron_arg(e, "--recompute-method", "uniform");
    megatron_arg(e, "--recompute-num-layers", "1");
  } else if (full > 0 && full == first_full && selective == 0) {
    megatron_arg(e, "--recompute-granularity", "full"), megatron_arg(e, "--recompute-method", "block");
    megatron_arg(e, "--recompute-num-layers", std::to_string(full));
  } else if (full + selective > 0) {
    e.arguments.clear();
    e.problems.push_back("its layers recompute " + describe_recomputation(rec) +
                         ": Megatron-LM recomputes all layers alike, or fully the first k of them");
    return false;
  }
  return true;
}

}  // namespace detail

/// The arguments of plan `p` (see the header comment), with what they cannot say in
/// `problems` (then megatron_arguments refuses).
inline megatron_export export_megatron(const loaded_plan& p) {
  megatron_export e;
  const model_graph& g = p.graph();
  const step_pricing& pricing = p.document.pricing;
  const auto problem = [&e](std::string s) { e.problems.push_back(std::move(s)); };
  if (pricing.mode != run_mode::training) problem("it is an inference plan: Megatron-LM's arguments describe training");
  const std::vector<vertex_t> linears = detail::megatron_linears(g);
  if (linears.empty()) problem("the model has none of the transformer block linears Megatron-LM splits (query/key/value, MLP)");
  const detail::megatron_layout layout = detail::megatron_layout_of(p, linears, e);
  const layer_map layers = map_layers(g);
  const bool sequence_parallel = detail::megatron_sequence_parallel(p, layers, layout.tp_axis, e);
  // The step: micro-batch, global batch, recomputation.
  std::vector<const strategy*> chosen;
  for (const strategy& s : p.strategies) chosen.push_back(&s);
  const std::map<long, recompute_kind> rec = layer_recomputation(layers, chosen);
  const std::int64_t step_batch = graph_batch(g);
  const int micro_batches = pricing.accumulation();
  if (step_batch % e.dp != 0)
    problem("the micro-step's batch of " + std::to_string(step_batch) + " sequences does not split over " +
            std::to_string(e.dp) + " data-parallel ranks");
  const std::int64_t micro = step_batch / std::max(1, e.dp);
  const detail::megatron_model md = detail::megatron_model_of(g, layers, linears);
  if (md.heads == 0) problem("the model has no attention core to give Megatron-LM its heads");
  if (!md.bidirectional.empty())
    problem(quoted_text(md.bidirectional) + " (attention) attends to every position, an encoder's: Megatron-LM's arguments " +
            "build GPTModel, a causal decoder");
  // megatron-core has window_size (with window_attn_skip_freq for some layers), but its local
  // attention (the spec without TransformerEngine, as tests/client/megatron_test.py runs it)
  // makes the window's mask on CUDA only (transformer/utils.py get_sliding_window_causal_mask,
  // 0.16.1), so the arguments could not be checked against transformers: a window that masks
  // something at the plan's sequence is refused; a window at least the sequence masks nothing.
  if (!md.windowed.empty())
    problem(quoted_text(md.windowed) + " (attention) sees a sliding window of " + std::to_string(md.window) + " keys, shorter than the sequence of " +
            std::to_string(md.window_seq) + ": the arguments would say full causal attention (megatron-core's --window-size is not written)");
  // megatron.core 0.16.1's GPTModel takes position_embedding_type learned_absolute, rope, mrope,
  // yarn or none, and nothing in it adds ALiBi: "none" would build a model without positions.
  if (!md.alibi.empty())
    problem(quoted_text(md.alibi) + " (attention) adds ALiBi's position biases (" + std::string(to_string(md.alibi_kind)) +
            "'s): Megatron-LM has no ALiBi (its --position-embedding-type is learned_absolute, rope, mrope, yarn or none)");
  if (!md.scaled_rope.empty())
    problem(quoted_text(md.scaled_rope) + " (rotary) turns by frequencies given outright or scales its cos and sin (a scaled rope, as "
            "Llama-3.1's or YaRN's rope_scaling): the arguments say Megatron-LM's rope, base^(-2i/D)");
  detail::megatron_rope_problems(md, e.problems);
  detail::megatron_activation_problems(md, e.problems);
  detail::megatron_norm_problems(md, e.problems);
  // megatron.core's local norms (WrappedTorchNorm) refuse --apply-layernorm-1p (zero-centred
  // gamma), and GPTModel's embedding has no multiplier: Gemma's scaling is not said.
  if (!md.offset_norm.first.empty())
    problem(quoted_text(md.offset_norm.first) + " scales by " + exact_number(md.offset_norm.second) +
            " + weight (Gemma's norms): no Megatron-LM argument says it for the local layer spec");
  if (!md.scaled_embedding.first.empty())
    problem(quoted_text(md.scaled_embedding.first) + " (embedding) multiplies its rows by " + exact_number(md.scaled_embedding.second) +
            " (Gemma's normalizer): Megatron-LM's GPTModel does not");
  if (md.bias && !md.unbiased.empty() && !md.qkv_bias_only)
    problem(quoted_text(md.biased) + " has a bias and " + quoted_text(md.unbiased) + " none: Megatron-LM's block linears have " +
            "biases all (its default), none (--disable-bias-linear) or only query/key/value's (--add-qkv-bias)");
  const std::vector<megatron_argument> pipeline = detail::megatron_pipeline(p.document.pipeline, md.layers, e);
  if (!e.problems.empty()) return e;
  detail::megatron_model_arguments(md, g[operands(g, linears.front())[1]].type, pricing, e);
  // The parallelism and the step, in the order Megatron-LM's --help groups them.
  const auto arg = [&e](std::string flag, std::string value = {}) { detail::megatron_arg(e, std::move(flag), std::move(value)); };
  arg("--tensor-model-parallel-size", std::to_string(e.tp));
  e.arguments.insert(e.arguments.end(), pipeline.begin(), pipeline.end());
  if (sequence_parallel && e.tp > 1) arg("--sequence-parallel");
  arg("--micro-batch-size", std::to_string(micro));
  arg("--global-batch-size", std::to_string(step_batch * micro_batches));
  if (layout.zero1) arg("--use-distributed-optimizer");
  if (pricing.gradient_overlap.backward) {
    arg("--overlap-grad-reduce");
    if (layout.zero1) arg("--overlap-param-gather");
  }
  if (pricing.optimizer == optimizer_kind::sgd) arg("--optimizer", "sgd");
  if (!detail::megatron_recompute_arguments(rec, e)) return e;
  if (md.vocab % (128 * e.tp) != 0)
    e.notes.push_back("Megatron-LM pads the vocabulary of " + std::to_string(md.vocab) + " to a multiple of 128 x " +
                      std::to_string(e.tp) + " (--make-vocab-size-divisible-by): the padded rows are its own, not the plan's");
  e.notes.push_back("the data, tokenizer, optimizer settings and checkpoint arguments are the user's; these say the parallelism, the step and the model");
  return e;
}

/// The arguments as one shell word list, a flag per line ("--tensor-model-parallel-size 8 \\").
/// Throws spec_error listing every problem when the plan is one they cannot express.
inline std::string megatron_arguments(const megatron_export& e) {
  if (!e.problems.empty()) {
    std::string s = "Megatron-LM's arguments cannot express this plan:";
    for (const std::string& p : e.problems) s += "\n  " + p;
    throw spec_error(s);
  }
  std::string out;
  for (std::size_t i = 0; i < e.arguments.size(); ++i)
    out += e.arguments[i].flag + (e.arguments[i].value.empty() ? "" : " " + e.arguments[i].value) +
           (i + 1 < e.arguments.size() ? " \\\n" : "\n");
  return out;
}

}  // namespace autoshard
