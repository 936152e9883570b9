#pragma once
/// Plans leave the tool in the formats users run: a Hugging Face `tp_plan` (module name ->
/// "colwise" / "rowwise" / ..., as transformers' `base_model_tp_plan`) and a PyTorch
/// `parallelize_module` plan (module -> ColwiseParallel / RowwiseParallel / SequenceParallel
/// with input and output layouts), both for one mesh axis: the tensor-parallel one.
///   const autoshard::loaded_plan p = autoshard::load_plan("plan.json");
///   const autoshard::tp_export e = autoshard::export_tensor_parallel(p);   // e.problems: what no style says
///   nlohmann::json hf = autoshard::to_hf_tp_plan(e), pt = autoshard::to_dtensor_plan(e);
/// A plan no such style can express is reported (e.problems names the operators and why),
/// never approximated: the writers throw spec_error listing them. What the styles express
/// only in part (activation layouts a plan string cannot name) is listed in e.notes.
#include <map>          // std::map
#include <optional>     // std::optional
#include <set>          // std::set
#include <string>       // std::string
#include <vector>       // std::vector

#include <nlohmann/json.hpp>

#include "../core/error.hpp"    // spec_error
#include "../core/mesh.hpp"     // device_mesh
#include "../graph/fused.hpp"   // fused_dim_of
#include "../graph/model.hpp"   // model_graph, operands
#include "autosharding.hpp"     // detail::layer_key
#include "loaded_plan.hpp"      // loaded_plan

namespace autoshard {

/// One module's style on the tensor-parallel axis.
struct tp_module {
  std::string module;  ///< the graph's operator name, Hugging Face's module name ("model.layers.0.mlp.up_proj")
  std::string hf;      ///< transformers' style string: colwise, colwise_rep, rowwise, rowwise_rep
  std::string style;   ///< PyTorch's: ColwiseParallel, RowwiseParallel, SequenceParallel
  std::string input_layout, output_layout;  ///< PyTorch placements ("Replicate()", "Shard(-1)", "Shard(1)"); empty for SequenceParallel
  int sequence_dim = 1;                     ///< SequenceParallel only
  bool transposed_weight = false;           ///< a linear whose weight is stored [in,out] (GPT-2's Conv1D)
};

/// What a plan says on its tensor-parallel axis, in the styles of transformers and PyTorch.
struct tp_export {
  device_mesh mesh;
  int tp_axis = -1;
  std::vector<tp_module> modules;     ///< graph order
  std::vector<std::string> problems;  ///< operators no style can express, and why
  std::vector<std::string> notes;     ///< what both exports leave to the user (weights kept whole, storage order)
  std::vector<std::string> hf_notes;  ///< what transformers' strings cannot say but PyTorch's layouts do
};

namespace detail {

inline std::string tp_placement(int dim, int rank) {
  return dim == rank - 1 ? std::string("Shard(-1)") : "Shard(" + std::to_string(dim) + ")";
}

/// The placement on `axis` that every consumer of `v` asks for, or nullopt when they differ.
inline std::optional<placement> consumers_want(const loaded_plan& p, vertex_t v, std::size_t axis) {
  std::optional<placement> want;
  for (auto [it, end] = boost::out_edges(v, p.graph()); it != end; ++it) {
    const vertex_t c = boost::target(*it, p.graph());
    const placement q = p.strategies[c].inputs[static_cast<std::size_t>(p.graph()[*it].operand)][axis];
    if (want && !(*want == q)) return std::nullopt;
    want = q;
  }
  return want;
}

inline int default_tp_axis(const device_mesh& m) {
  if (const int named = m.find_axis("tp"); named >= 0) return named;
  for (std::size_t a = m.ndim(); a-- > 0;)
    if (m.size(a) > 1) return static_cast<int>(a);
  return -1;
}

}  // namespace detail

/// Reads a plan's tensor-parallel axis as module styles. `tp_axis` < 0 picks the axis named
/// "tp", else the last axis of more than one rank. Throws spec_error for an axis the mesh lacks.
inline tp_export export_tensor_parallel(const loaded_plan& p, int tp_axis = -1) {
  tp_export out;
  out.mesh = p.mesh();
  out.tp_axis = tp_axis >= 0 ? tp_axis : detail::default_tp_axis(p.mesh());
  if (out.tp_axis < 0) throw spec_error("the plan's mesh " + to_string(p.mesh()) + " has no axis of more than one rank to export");
  if (out.tp_axis >= static_cast<int>(p.mesh().ndim()))
    throw spec_error("mesh axis " + std::to_string(out.tp_axis) + " is outside the plan's mesh " + to_string(p.mesh()));
  const auto tp = static_cast<std::size_t>(out.tp_axis);
  const std::string tp_label = p.mesh().axis_label(tp);
  const model_graph& g = p.graph();
  auto problem = [&](vertex_t v, const std::string& why) { out.problems.push_back("'" + g[v].name + "' (" + std::string(to_string(g[v].kind)) + "): " + why); };
  auto note = [&](vertex_t v, const std::string& what) { out.notes.push_back("'" + g[v].name + "': " + what); };
  auto hf_note = [&](vertex_t v, const std::string& what) { out.hf_notes.push_back("'" + g[v].name + "': " + what); };
  std::set<vertex_t> styled_params;  // parameters a style accounts for

  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
    const node& nd = g[v];
    const bool lin = nd.kind == op_kind::linear, emb = nd.kind == op_kind::embedding;
    const bool norm = nd.kind == op_kind::layer_norm || nd.kind == op_kind::rms_norm;
    if (!lin && !emb && !norm) continue;
    const std::vector<vertex_t> ops = operands(g, v);
    const strategy& st = p.strategies[v];
    const std::size_t wi = 1;  // the weight: linear (x, W, b), embedding (ids, table), norms (x, w, b)
    if (ops.size() <= wi || !g[ops[wi]].is_parameter()) continue;
    // Every parameter of the module: stored whole on every axis but the tensor-parallel one.
    bool other_axes_ok = true;
    for (std::size_t i = 1; i < ops.size(); ++i) {
      if (!g[ops[i]].is_parameter()) continue;
      styled_params.insert(ops[i]);
      const sharding_spec& stored = p.strategies[ops[i]].output;
      for (std::size_t a = 0; a < p.mesh().ndim(); ++a) {
        if (a == tp || p.mesh().size(a) == 1) continue;
        if (!stored[a].is_replicate() || !st.inputs[i][a].is_replicate()) {
          problem(v, "its parameter '" + g[ops[i]].name + "' is " + to_string(stored[a]) + " on " + p.mesh().axis_label(a) +
                         ": a tensor-parallel plan splits weights over one mesh axis (" + tp_label +
                         "); splitting them over another too (2-D tensor parallelism, ZeRO-3 / FSDP) is beyond tp_plan and parallelize_module");
          other_axes_ok = false;
          break;
        }
      }
      if (!other_axes_ok) break;
    }
    if (!other_axes_ok) continue;
    const int xrank = static_cast<int>(g[ops[0]].shape.rank);
    const placement x = st.inputs[0][tp];
    const placement ws = p.strategies[ops[wi]].output[tp], wc = st.inputs[wi][tp];
    if (ws.is_partial() || wc.is_partial()) {
      problem(v, "its weight is Partial on " + tp_label + ": no parallel style holds a weight as partial sums");
      continue;
    }
    if (x.is_partial()) {
      problem(v, "its input arrives as partial sums on " + tp_label + " and is used before they are reduced: no parallel style takes a Partial input");
      continue;
    }
    if (norm) {
      if (!ws.is_replicate() || !wc.is_replicate() ||
          (ops.size() > 2 && (!p.strategies[ops[2]].output[tp].is_replicate() || !st.inputs[2][tp].is_replicate()))) {
        problem(v, "its parameters are split on " + tp_label + ": a norm's weight stays whole in every parallel style");
        continue;
      }
      if (x.is_shard(xrank - 1)) {
        problem(v, "it normalises a feature dim split on " + tp_label + ": no parallel style computes a norm over split features");
        continue;
      }
      if (x.is_shard() && (xrank < 3 || x.dim != xrank - 2)) {
        note(v, "its input is split on dim " + std::to_string(x.dim) + " over " + tp_label +
                    " with the weights whole (data parallel compute): exported as replicated, the same weights");
      } else if (x.is_shard()) {  // [B,S,H]: the sequence dim
        out.modules.push_back({nd.name, "", "SequenceParallel", "", "", x.dim, false});
        hf_note(v, "sequence parallel (dim " + std::to_string(x.dim) + " split on " + tp_label +
                    "): transformers' plan strings leave norms replicated, so the hf export omits it");
      }
      continue;
    }
    const int out_dim = lin ? (nd.attrs.transposed_weight ? 1 : 0) : 1;  // embedding table [V,H]: H is the output
    const int in_dim = lin ? (nd.attrs.transposed_weight ? 0 : 1) : 0;
    if (ws.is_replicate()) {
      if (wc.is_shard())
        note(v, "the plan stores the weight whole on " + tp_label + " and computes on a slice of it (" +
                    (wc.is_shard(out_dim) ? "column" : "row") + "-parallel in compute only); exported as replicated, the same weights");
      else if (x.is_shard() && p.mesh().size(tp) > 1)
        note(v, "weight whole, input split on dim " + std::to_string(x.dim) + " over " + tp_label +
                    " (data or sequence parallel compute): exported as replicated, the same weights");
      continue;
    }
    if (!(ws == wc)) {
      problem(v, "the weight is stored " + to_string(ws) + " but used " + to_string(wc) + " on " + tp_label +
                     ": a parallel style stores a weight the way the module uses it");
      continue;
    }
    const bool conv1d = lin && nd.attrs.transposed_weight;
    if (conv1d)
      note(v, "the weight is stored [in,out] (GPT-2's Conv1D): transformers' styles split nn.Linear's [out,in] weight, so "
              "the module needs nn.Linear storage before this plan applies (the role, column or row, is what is exported)");
    if (emb && !x.is_replicate()) {
      note(v, "its ids arrive split on dim " + std::to_string(x.dim) + " over " + tp_label + "; the styles take them whole");
    }
    const std::optional<placement> want = detail::consumers_want(p, v, tp);
    tp_module m{nd.name, "", "", "", "", 1, conv1d};
    if (ws.is_shard(out_dim)) {  // column-parallel: output features split
      if (lin && x.is_shard(xrank - 1)) {
        problem(v, "column-parallel with its input features split on " + tp_label + ": no style splits both");
        continue;
      }
      m.style = "ColwiseParallel";
      m.input_layout = x.is_replicate() || emb ? "Replicate()" : detail::tp_placement(x.dim, xrank);
      // The module's output is split on its features (st.output); what the consumers ask for
      // is a redistribute after the module, which the plan prices on the edge.
      const int orank = static_cast<int>(nd.shape.rank);
      m.hf = "colwise";
      m.output_layout = "Shard(-1)";
      if (want && !want->is_shard(orank - 1))
        hf_note(v, "the plan redistributes the output to " + to_string(*want) + " on " + tp_label +
                    " after the module (" + (want->is_replicate() ? "an all-gather: transformers' colwise_rep would do it inside" : "for its consumers") + ")");
      if (!want) note(v, "its consumers take the output in different layouts on " + tp_label);
      if (lin && x.is_shard()) hf_note(v, "its input arrives split on dim " + std::to_string(x.dim) + " (sequence parallel): 'colwise' in transformers assumes it whole");
      if (const fused_dim f = fused_dim_of(g, v); f.any())
        note(v, "its output features are " + std::to_string(f.parts) + " fused parts, each split over " + tp_label +
                    " (rank r holds piece r of every part, Megatron's fused QKV): ColwiseParallel and 'colwise' cut one "
                    "contiguous run, so the weight's columns and bias must be stored regrouped rank by rank before this "
                    "plan applies (`autoshard shard --plan` writes them so)");
    } else if (ws.is_shard(in_dim)) {  // row-parallel: input features split, output partial sums
      m.style = "RowwiseParallel";
      if (emb) {  // vocab-parallel: each rank looks up its rows, the partial sums are reduced
        m.hf = "rowwise";
        m.input_layout = "Replicate()";
      } else if (x.is_shard(xrank - 1)) {
        m.hf = "rowwise";
        m.input_layout = "Shard(-1)";
      } else if (x.is_replicate()) {
        m.hf = "rowwise_rep";
        m.input_layout = "Replicate()";
      } else {
        problem(v, "row-parallel with its input split on dim " + std::to_string(x.dim) + " over " + tp_label +
                       ": RowwiseParallel takes the features split or the input whole");
        continue;
      }
      const int orank = static_cast<int>(nd.shape.rank);
      if (!want || want->is_partial()) {
        problem(v, "row-parallel and its consumers keep the partial sums on " + tp_label +
                       ": RowwiseParallel reduces them at the module's output");
        continue;
      }
      if (want->is_replicate()) m.output_layout = "Replicate()";
      else {
        m.output_layout = detail::tp_placement(want->dim, orank);
        hf_note(v, "the output is reduce-scattered to " + m.output_layout + " (sequence parallel); transformers' '" + m.hf +
                    "' all-reduces it: the same weights and results, other collectives");
      }
    } else {
      problem(v, "its weight is " + to_string(ws) + " on " + tp_label + ": no parallel style splits that dim");
      continue;
    }
    out.modules.push_back(m);
  }
  // Parameters no style accounts for, split on the tensor-parallel axis.
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
    if (g[v].is_parameter() && !styled_params.count(v) && !p.strategies[v].output.is_replicated())
      problem(v, "a parameter split " + to_string(p.strategies[v].output) +
                     " that no linear, embedding or norm module holds: no parallel style splits it");
  return out;
}

namespace detail {
/// "model.layers.3.mlp.up_proj" -> "model.layers.*.mlp.up_proj", transformers' spelling of
/// the pass's layer key.
inline std::string layer_wildcard(const std::string& name) {
  std::string k = layer_key(name);
  if (k != name)
    if (const std::size_t h = k.find('#'); h != std::string::npos) k[h] = '*';
  return k;
}
inline void throw_if_problems(const tp_export& e, const std::string& target) {
  if (e.problems.empty()) return;
  std::string msg = "the plan cannot be written as " + target + ": " + std::to_string(e.problems.size()) +
                    " operator(s) no parallel style expresses:";
  for (const std::string& p : e.problems) msg += "\n  " + p;
  throw spec_error(msg);
}
}  // namespace detail

/// The notes that go with the hf export: both lists.
inline std::vector<std::string> hf_export_notes(const tp_export& e) {
  std::vector<std::string> n = e.notes;
  n.insert(n.end(), e.hf_notes.begin(), e.hf_notes.end());
  return n;
}

/// transformers' spelling: {"tp_plan": {module: style}, "base_model_prefix", "base_model_tp_plan"}.
/// Repeated layers with one style become one "layers.*" key, as transformers writes them.
inline nlohmann::json to_hf_tp_plan(const tp_export& e) {
  detail::throw_if_problems(e, "a Hugging Face tp_plan");
  // Group per wildcard key; a key stands for all its layers only when they agree and all are listed.
  std::map<std::string, std::set<std::string>> styles;  // wildcard -> styles
  std::map<std::string, std::string> by_module;
  std::vector<std::string> order;
  for (const tp_module& m : e.modules) {
    if (m.hf.empty()) continue;
    const std::string w = detail::layer_wildcard(m.module);
    if (!styles.count(w)) order.push_back(w);
    styles[w].insert(m.hf);
    by_module[m.module] = m.hf;
  }
  nlohmann::json plan = nlohmann::json::object();
  for (const std::string& w : order) {
    if (styles[w].size() == 1) plan[w] = *styles[w].begin();
    else
      for (const auto& [mod, s] : by_module)
        if (detail::layer_wildcard(mod) == w) plan[mod] = s;
  }
  // The base model: the first component the layered names share ("model." in
  // "model.layers.*", "transformer." in "transformer.h.*"); none when they share none.
  std::string prefix;
  bool first = true;
  for (const tp_module& m : e.modules) {
    const std::string w = detail::layer_wildcard(m.module);
    const std::size_t star = w.find('*'), dot = w.find('.');
    if (m.hf.empty() || star == std::string::npos) continue;
    const std::string head = dot < star ? w.substr(0, dot + 1) : std::string();
    if (first) prefix = head;
    else if (head != prefix) prefix.clear();
    first = false;
  }
  nlohmann::json base = nlohmann::json::object();
  for (const auto& [k, s] : plan.items())
    if (prefix.empty() || k.rfind(prefix, 0) == 0) base[prefix.empty() ? k : k.substr(prefix.size())] = s;
  nlohmann::json j{{"format", "autoshard.hf_tp_plan"},
                   {"version", 1},
                   {"mesh", to_string(e.mesh)},
                   {"tp_axis", e.tp_axis},
                   {"tp_size", e.mesh.size(static_cast<std::size_t>(e.tp_axis))},
                   {"tp_plan", plan},
                   {"base_model_prefix", prefix.empty() ? "" : prefix.substr(0, prefix.size() - 1)},
                   {"base_model_tp_plan", base},
                   {"notes", hf_export_notes(e)}};
  if (!e.mesh.axis_name(static_cast<std::size_t>(e.tp_axis)).empty())
    j["tp_axis_name"] = std::string(e.mesh.axis_name(static_cast<std::size_t>(e.tp_axis)));
  return j;
}

/// PyTorch's parallelize_module plan: {"plan": {module: {"style", "kwargs"}}}; kwargs hold the
/// layouts as PyTorch writes them ("Shard(-1)"), for ColwiseParallel(**kwargs) and friends.
inline nlohmann::json to_dtensor_plan(const tp_export& e) {
  tp_export checked = e;
  for (const tp_module& m : e.modules)
    if (m.transposed_weight)
      checked.problems.push_back("'" + m.module + "' (linear): its weight is stored [in,out] (GPT-2's Conv1D), and PyTorch's " +
                                 m.style + " accepts nn.Linear and nn.Embedding only");
  detail::throw_if_problems(checked, "a PyTorch parallelize_module plan");
  nlohmann::json plan = nlohmann::json::object();
  for (const tp_module& m : e.modules) {
    nlohmann::json kw = nlohmann::json::object();
    if (m.style == "SequenceParallel") kw["sequence_dim"] = m.sequence_dim;
    else {
      kw["input_layouts"] = m.input_layout;
      kw["output_layouts"] = m.output_layout;
    }
    plan[m.module] = {{"style", m.style}, {"kwargs", kw}};
  }
  nlohmann::json j{{"format", "autoshard.dtensor_plan"},
                   {"version", 1},
                   {"mesh", to_string(e.mesh)},
                   {"tp_axis", e.tp_axis},
                   {"tp_size", e.mesh.size(static_cast<std::size_t>(e.tp_axis))},
                   {"plan", plan},
                   {"notes", e.notes}};
  if (!e.mesh.axis_name(static_cast<std::size_t>(e.tp_axis)).empty())
    j["tp_axis_name"] = std::string(e.mesh.axis_name(static_cast<std::size_t>(e.tp_axis)));
  return j;
}

}  // namespace autoshard
