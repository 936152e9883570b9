#pragma once
/// Plans leave the tool in the formats users run, for one mesh axis (the tensor-parallel one):
/// a PyTorch `parallelize_module` plan (module -> ColwiseParallel / RowwiseParallel /
/// SequenceParallel / PrepareModuleInput / PrepareModuleOutput with their layouts) and a Hugging
/// Face `tp_plan` (module -> "colwise" / "rowwise" / "embedding_rowwise" / ..., in the
/// vocabulary of the transformers release targeted).
///   const autoshard::loaded_plan p = autoshard::load_plan("plan.json");
///   const autoshard::tp_export e = autoshard::export_tensor_parallel(p, {.target = autoshard::export_target::dtensor});
///   nlohmann::json pt = autoshard::to_dtensor_plan(e);   // spec_error listing e.problems when there are any
///
/// Exact or refused. PyTorch runs the model's own code on local tensors; data moves only where
/// a style sits, at a module's input or output. The export walks the graph in the order it
/// runs and tracks the layout each activation has in PyTorch on the tensor-parallel axis (the
/// model's inputs arrive whole): a module (linear, embedding, norm) gets the style that
/// computes what the plan computes and converts its input from the layout it arrives in
/// (`input_layouts`, the annotation) to the one it needs, and its output to the one its
/// consumers take (`output_layouts`, `PrepareModuleOutput`; `use_local_output=False` where a
/// local tensor could not say an uneven split). Every other operator (attention, rotary,
/// residual adds, activations) runs as the model's code runs it, on what it is handed: it must
/// be handed exactly the layouts the plan computes it on. What no style can do (a gather
/// between two such operators, a weight held as partial sums, a Conv1D weight) is a problem
/// naming the operator and why; the writers throw spec_error listing them, never approximate.
/// The hf export tracks the same with transformers' styles, whose layouts are fixed
/// (colwise's output is split, rowwise's reduced): where the plan's layouts differ but the
/// numbers are the same (a reduce-scatter where transformers all-reduces) it says so in a
/// note; where transformers cannot compute the plan at all, a problem.
#include <algorithm>    // std::find, std::find_if, std::sort, std::upper_bound
#include <cstdint>      // std::int64_t
#include <map>          // std::map
#include <optional>     // std::optional
#include <set>          // std::set
#include <string>       // std::string
#include <vector>       // std::vector

#include <nlohmann/json.hpp>

#include "../core/error.hpp"      // spec_error
#include "../core/mesh.hpp"       // device_mesh
#include "../graph/fused.hpp"     // fused_dim_of
#include "../graph/model.hpp"     // model_graph, operands
#include "../graph/strategy.hpp"  // enumerate_strategies
#include "../graph/validate.hpp"  // topological_order
#include "loaded_plan.hpp"        // loaded_plan

namespace autoshard {

/// Where an export goes.
enum class export_target : std::uint8_t {
  dtensor,  ///< PyTorch's parallelize_module styles
  hf,       ///< transformers' tp_plan strings
};

struct export_options {
  export_target target = export_target::dtensor;
  /// The tensor-parallel mesh axis; < 0: the axis named "tp", else the last of more than one rank.
  int tp_axis = -1;
  /// hf: the transformers major release whose vocabulary is written: 5 (the current one:
  /// embedding_rowwise, colwise_gather_output, rowwise_split_input) or 4 (the previous one:
  /// rowwise / colwise on embeddings, colwise_rep, rowwise_rep).
  int transformers_major = 5;
};

/// One module's style on the tensor-parallel axis.
struct tp_module {
  std::string module;  ///< the graph's operator name, the model's module name ("model.layers.0.mlp.up_proj")
  std::string style;   ///< dtensor: PyTorch's class (ColwiseParallel, ...); hf: transformers' string
  nlohmann::json kwargs = nlohmann::json::object();  ///< dtensor: the style's keyword arguments, layouts as PyTorch writes them
  std::string mesh = {};  ///< dtensor: "" for the tensor-parallel mesh, else one of tp_export::meshes
};

/// dtensor: one `fully_shard` call: a module and the mesh axes FSDP2 shards its parameters over.
struct fsdp_unit {
  std::string module;               ///< the model's module name ("model.layers.3"); "" the model itself
  std::vector<int> shard_axes;      ///< the mesh axes it shards over (flattened in mesh order)
  std::vector<int> replicate_axes;  ///< the other data-parallel axes: HSDP's replicate dim (empty: none)
};

/// dtensor: FSDP2 (`torch.distributed.fsdp.fully_shard`) over the mesh axes where the plan
/// stores parameters split and gathers them whole at each use (ZeRO-3), applied after the
/// tensor-parallel styles, as TorchTitan composes them.
struct fsdp_export {
  /// the modules to `fully_shard`, innermost first: each layer (or, where its parameters are
  /// stored over different axes, each of its submodules whose are not), then "" (the model
  /// itself, which takes the rest)
  std::vector<fsdp_unit> units;
  /// parameter (the plan's name) -> the dim FSDP shards it on (`shard_placement_fn`: Shard(d))
  std::map<std::string, int> shard_dims;
  /// parameters the plan keeps whole on every data-parallel axis, and the styles' own on tp
  /// (`ignored_params`): FSDP leaves their gradients each rank's own, to be averaged over the
  /// data-parallel ranks as DDP does
  std::vector<std::string> ignored;
  /// parameters FSDP2 holds other blocks of on each rank than the plan stores (the plan splits
  /// them on several dims, or on their tensor-parallel dim): the same numbers, other storage
  std::vector<std::string> other_storage;
  /// what FSDP2 divides its reduced gradients by (`set_gradient_divide_factor`): the
  /// data-parallel ranks. Its world (the default) where a unit only splits the batch; without
  /// the tp axis's ranks where it shards over tp too: those compute on slices of one loss,
  /// whose shares sum.
  int gradient_divide_factor = 1;
};

/// What a plan says on its tensor-parallel axis, in one target's styles.
struct tp_export {
  device_mesh mesh;
  int tp_axis = -1;
  export_options options;
  std::vector<tp_module> modules;     ///< graph order; hf: every linear and embedding (replicate where whole)
  std::vector<std::string> problems;  ///< operators the target cannot express, and why
  std::vector<std::string> notes;     ///< what the user must know (what PyTorch does that the plan does not price)
  bool loss_parallel = false;         ///< dtensor: the loss reads vocab-split logits (torch's loss_parallel())
  /// Model inputs whose shape the export fixes (a split of a dim other than the features over
  /// the tp axis needs the plan's sizes): name -> shape.
  std::map<std::string, std::vector<std::int64_t>> fixed_inputs;
  /// dtensor: sub-meshes of the tensor-parallel group: name -> (units, replicas), the group's
  /// ranks as a (units, replicas) mesh whose units axis a style runs on (rank r of the group is
  /// unit r / replicas): key/value heads replicated over the ranks that share them.
  std::map<std::string, std::pair<int, int>> meshes;
  /// dtensor: attributes to set on modules after the styles: module -> {attribute: value}
  /// (the query heads per key/value head an attention reads on each rank).
  nlohmann::json attributes = nlohmann::json::object();
  /// dtensor: FSDP2's units, where the plan stores parameters ZeRO-3 (on data-parallel axes, or
  /// on tp where gathered whole at each use).
  std::optional<fsdp_export> fsdp;
  /// dtensor: the mesh axes whose ranks each compute their own slice of the batch, fed to them as
  /// DDP feeds it, gradients averaged over them (mesh order; the tp axis among them only where
  /// the plan splits nothing but the batch there).
  std::vector<int> data_parallel_axes;
  /// dtensor: tied weights whose uses the styles each distribute: a module's weight (the model's
  /// name, "lm_head.weight") -> the parameter it is ("model.embed_tokens.weight"), to assign after
  /// the styles (each registers a DTensor parameter of its own, which would untie them).
  std::map<std::string, std::string> tied;
  /// dtensor: parameters whole on the tp axis whose module runs, with no style, on each rank's
  /// slice of the batch or sequence there: each rank's gradient is its slice's share, summed over
  /// the tensor-parallel group before the optimizer step (a style's DTensor sums its own).
  std::vector<std::string> tp_gradient_sums;
};

namespace detail {

/// PyTorch's spelling of a placement on a tensor of `rank` dims: the last dim is Shard(-1).
inline std::string torch_placement(const placement& p, int rank) {
  if (p.is_replicate()) return "Replicate()";
  if (p.is_partial()) return "Partial()";
  return p.dim == rank - 1 ? std::string("Shard(-1)") : "Shard(" + std::to_string(p.dim) + ")";
}

inline int default_tp_axis(const device_mesh& m) {
  if (const int named = m.find_axis("tp"); named >= 0) return named;
  for (std::size_t a = m.ndim(); a-- > 0;)
    if (m.size(a) > 1) return static_cast<int>(a);
  return -1;
}

/// "model.layers.3.mlp.up_proj" -> "model.layers.*.mlp.up_proj": every all-digit component a
/// `*`, as transformers' replace_layer_number_by_wildcard writes the keys it matches.
inline std::string layer_wildcard(const std::string& name) {
  std::string out;
  std::size_t i = 0;
  while (i <= name.size()) {
    std::size_t j = name.find('.', i);
    if (j == std::string::npos) j = name.size();
    const std::string c = name.substr(i, j - i);
    const bool digits = !c.empty() && i > 0 && c.find_first_not_of("0123456789") == std::string::npos;
    out += (i ? "." : "") + (digits ? std::string("*") : c);
    i = j + 1;
  }
  return out;
}

/// How a module (linear, embedding, norm) computes on the tp axis.
enum class module_role : std::uint8_t {
  none,      ///< not a module with a weight
  whole,     ///< weight whole, computed whole (on whatever slice of the input it is given)
  sliced,    ///< weight stored whole, computed on a slice of it: PyTorch computes it whole
  column,    ///< weight split on its output features (ColwiseParallel)
  row,       ///< weight split on its input features (RowwiseParallel); embedding: on the vocabulary
  sequence,  ///< a norm on an input split on a dim other than the features (SequenceParallel)
};

/// The walk over the graph for one target.
struct tp_walk {
  const loaded_plan& p;
  const model_graph& g;
  std::size_t t;  ///< the tp axis
  int n;          ///< ranks on it
  tp_export& out;
  std::vector<placement> held;      ///< what PyTorch holds for each activation, on the tp axis
  std::vector<char> dtensor;        ///< ... as a DTensor (use_local_output=False upstream)
  std::vector<char> is_module;
  /// A learned position table's rows past its offset and a key/value cache's tokens (a `split`
  /// on dim 0 of the parameter, builders.hpp position_rows), which its embedding alone reads:
  /// in PyTorch no operator, the embedding module indexing its whole table at the positions
  /// past them (table_slice).
  std::vector<char> is_table_slice;
  std::vector<module_role> role;
  std::vector<char> failed;         ///< reported: consumers of it report nothing more
  /// Key/value chains: the operators between a replicated key/value projection and an attention
  /// whose query heads are split while the plan keeps its key/values whole; each rank computes
  /// only the key/value heads its query heads read (the projection's output is sliced so).
  std::vector<vertex_t> kv_of;      ///< the attention of each chain vertex (the projection included), or none
  std::vector<char> kv_sliced;      ///< holds the rank's key/value heads, where the plan holds all
  static constexpr vertex_t none = static_cast<vertex_t>(-1);
  /// A layer (a module whose name ends in its number: "model.layers.3") converts its input at
  /// its entry with PrepareModuleInput when one tensor enters it (the hidden states, its first
  /// argument): what the plan computes its first operators on.
  struct entry {
    bool decided = false, convert = false;
    std::set<vertex_t> inputs;  ///< tensors from outside the layer that its operators take
    placement desired;
  };
  std::map<std::string, entry> layers;
  /// dtensor: batch_sliced_embedding(), from the plan alone (set by classify).
  std::optional<vertex_t> sliced_embedding;
  /// Whether the model has rotary position embeddings (LLaMA's family; set by classify, before
  /// batch_sliced_embedding reads it).
  bool rotary_model = false;
  /// hf: the operators the plan runs on a slice of the batch, the sequence or the heads over tp
  /// that transformers hands their input whole (note_whole_runs), and what each slice is of
  /// (sliced_what: "batch", "sequence", "heads").
  std::vector<vertex_t> run_whole;
  std::set<std::string> run_whole_of;

  tp_walk(const loaded_plan& plan, tp_export& e)
      : p(plan), g(plan.graph()), t(static_cast<std::size_t>(e.tp_axis)), n(plan.mesh().size(t)), out(e),
        held(boost::num_vertices(g)), dtensor(boost::num_vertices(g), 0), is_module(boost::num_vertices(g), 0),
        is_table_slice(boost::num_vertices(g), 0), role(boost::num_vertices(g), module_role::none), failed(boost::num_vertices(g), 0),
        kv_of(boost::num_vertices(g), none), kv_sliced(boost::num_vertices(g), 0) {}

  bool hf() const { return out.options.target == export_target::hf; }
  const std::string& name(vertex_t v) const { return g[v].name; }
  std::string label(vertex_t v) const { return quoted_text(g[v].name) + " (" + std::string(to_string(g[v].kind)) + ")"; }
  std::string axis() const { return p.mesh().axis_label(t); }
  std::string pt(const placement& q, vertex_t v) const { return torch_placement(q, static_cast<int>(g[v].shape.rank)); }
  /// Reports v; its consumers then take it as the plan hands it over (so that each operator
  /// reported has a problem of its own).
  void problem(vertex_t v, const std::string& why) {
    out.problems.push_back(label(v) + ": " + why);
    failed[v] = 1;
  }
  void note(vertex_t v, const std::string& what) { out.notes.push_back(quoted_text(name(v)) + ": " + what); }
  placement in(vertex_t v, std::size_t i) const { return p.strategies[v].inputs[i][t]; }
  placement plan_out(vertex_t v) const { return p.strategies[v].output[t]; }
  bool uneven(const placement& q, vertex_t v) const {
    return q.is_shard() && g[v].shape[static_cast<std::size_t>(q.dim)] % n != 0;
  }

  /// The layer an operator belongs to: its name up to its first all-digit component
  /// ("model.layers.3.mlp.act" -> "model.layers.3"); "" outside the layers.
  static std::string layer_of(const std::string& n) {
    std::size_t i = 0;
    while (i < n.size()) {
      std::size_t j = n.find('.', i);
      if (j == std::string::npos) j = n.size();
      if (i > 0 && j > i && n.find_first_not_of("0123456789", i) >= j) return n.substr(0, j);
      i = j + 1;
    }
    return {};
  }
  std::string layer(vertex_t v) const { return layer_of(name(v)); }
  bool rigid(vertex_t c) const { return !is_module[c] || role[c] == module_role::sequence; }
  /// A key/value cache (attrs.kv_cache): in PyTorch the attention module's state, not an input
  /// the user hands over (hold_cache).
  bool is_cache(vertex_t u) const { return g[u].is_kv_cache(); }

  /// Whether the layer of c converts u at its entry (so c takes u as the layer hands it).
  bool enters_convertible_layer(vertex_t u, vertex_t c) const {
    if (hf() || is_cache(u)) return false;  // transformers has no style for a layer's input; a cache is the attention's own
    const std::string l = layer(c);
    if (l.empty() || l == layer(u)) return false;
    const auto it = layers.find(l);
    return it != layers.end() && it->second.inputs.size() == 1;
  }

  /// What c finds for its operand u: u as held, or as c's layer converts it at its entry.
  placement held_in(vertex_t u, vertex_t c) {
    if (!enters_convertible_layer(u, c)) return held[u];
    entry& e = layers[layer(c)];
    if (!e.decided) {
      e.decided = true;
      std::optional<placement> want;
      for (auto [d, i] : consumers(u)) {
        if (layer(d) != layer(c) || !rigid(d)) continue;
        if (want && !(*want == want_of(d, i))) {
          problem(d, "it takes " + quoted_text(name(u)) + " as " + to_string(want_of(d, i)) + " on " + axis() + " and another operator of " +
                         quoted_text(layer(c)) + " takes it as " + to_string(*want) + ": the layer's input has one layout");
          e.desired = held[u];
          return held[u];
        }
        want = want_of(d, i);
      }
      e.desired = want ? *want : held[u];
      e.convert = !(e.desired == held[u]) || dtensor[u];
      if (e.convert) {
        tp_module m{layer(c), "PrepareModuleInput", nlohmann::json::object()};
        m.kwargs["input_layouts"] = pt(held[u], u);
        m.kwargs["desired_input_layouts"] = pt(e.desired, u);
        m.kwargs["use_local_output"] = true;
        out.modules.push_back(std::move(m));
        fix_inputs_if_split(u, e.desired);
      }
    }
    return e.desired;
  }

  /// The model's module name for a graph operator named as its checkpoint names it: transformers
  /// 5 calls GPT-NeoX's output head lm_head (its checkpoints still say embed_out).
  std::string module_name(const std::string& n) const {
    return n == "embed_out" && out.options.transformers_major >= 5 ? std::string("lm_head") : n;
  }

  /// The rows of a learned position table embedding v reads past the table's offset and a
  /// key/value cache's tokens (GPT-2's and OPT's decode steps, OPT's and RoBERTa's offset): its
  /// operand 1 when that is a split of dim 0 of a parameter that only v reads, else none.
  std::optional<vertex_t> table_slice(vertex_t v) const {
    if (g[v].kind != op_kind::embedding) return std::nullopt;
    const std::vector<vertex_t> ops = operands(g, v);
    if (ops.size() != 2 || g[ops[1]].kind != op_kind::split || g[ops[1]].attrs.axis != 0 || boost::out_degree(ops[1], g) != 1 ||
        !g[operands(g, ops[1])[0]].is_parameter())
      return std::nullopt;
    return ops[1];
  }
  /// A module's weight: its operand 1, the parameter (an embedding's table behind its table_slice).
  vertex_t weight(vertex_t v) const {
    const vertex_t w = operands(g, v)[1];
    return is_table_slice[w] ? operands(g, w)[0] : w;
  }

  /// Classifies every module: a linear, embedding or norm whose operand 1 is a parameter (or an
  /// embedding reading a table_slice of one: the module indexes the whole table, and its rows past
  /// the slice's start are the slice's).
  void classify() {
    for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
      if (const std::optional<vertex_t> s = table_slice(v)) is_table_slice[*s] = 1;
    for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
      const node& nd = g[v];
      const bool lin = nd.kind == op_kind::linear, emb = nd.kind == op_kind::embedding;
      const bool norm = nd.kind == op_kind::layer_norm || nd.kind == op_kind::rms_norm;
      const std::vector<vertex_t> ops = operands(g, v);
      if (!(lin || emb || norm) || ops.size() < 2 || !g[weight(v)].is_parameter()) continue;
      is_module[v] = 1;
      const placement ws = stored(weight(v)), wc = in(v, 1), x = in(v, 0);
      const int out_dim = lin ? (nd.attrs.transposed_weight ? 1 : 0) : 1, in_dim = lin ? 1 - out_dim : 0;
      if (norm) role[v] = x.is_replicate() ? module_role::whole : module_role::sequence;
      else if (ws.is_replicate() && wc.is_replicate()) role[v] = module_role::whole;
      else if (ws.is_replicate() && wc.is_shard()) role[v] = module_role::sliced;
      else if (ws == wc && ws.is_shard(out_dim)) role[v] = module_role::column;
      else if (ws == wc && ws.is_shard(in_dim)) role[v] = module_role::row;
      else role[v] = module_role::none;  // reported by check_module
    }
    for (vertex_t a = 0; a < boost::num_vertices(g); ++a) {
      if (g[a].kind != op_kind::attention || n == 1) continue;
      const std::vector<vertex_t> ops = operands(g, a);
      if (ops.size() < 3 || !in(a, 0).is_shard(2) || !in(a, 1).is_replicate() || !in(a, 2).is_replicate()) continue;
      for (std::size_t i = 1; i < 3; ++i)
        for (vertex_t u = ops[i]; g[u].is_operator() && kv_of[u] == none;) {
          kv_of[u] = a;
          if (is_module[u] || !is_unary_elementwise(g[u].kind) || boost::out_degree(u, g) != 1) break;
          u = operands(g, u)[0];
        }
    }
    for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
      const std::string l = layer(v);
      if (l.empty() || !g[v].is_operator()) continue;
      entry& e = layers[l];
      for (vertex_t u : operands(g, v))
        if (!g[u].is_parameter() && !is_cache(u) && layer(u) != l) e.inputs.insert(u);
    }
    for (vertex_t v = 0; v < boost::num_vertices(g); ++v) rotary_model = rotary_model || g[v].kind == op_kind::rotary;
    sliced_embedding = batch_sliced_embedding();
  }

  /// Whether parameter v is stored split on mesh axis `a` and every operator takes it whole
  /// there: ZeRO-3 (FSDP), gathered at each use.
  bool gathered_on_use(vertex_t v, std::size_t a) const {
    if (!p.strategies[v].output[a].is_shard()) return false;
    for (auto [c, i] : consumers(v))
      if (!p.strategies[c].inputs[i][a].is_replicate()) return false;
    return true;
  }

  /// dtensor: whether parameter v is stored split on the tp axis and gathered whole at each use
  /// there (ZeRO-3 on tp): FSDP2 stores it (plan_fsdp); the styles see it whole.
  bool fsdp_on_tp(vertex_t v) const { return !hf() && g[v].is_parameter() && gathered_on_use(v, t); }

  /// What the styles hold parameter v as on the tp axis: the plan's storage, or whole where
  /// FSDP2 stores it (fsdp_on_tp).
  placement stored(vertex_t v) const { return fsdp_on_tp(v) ? Replicate() : p.strategies[v].output[t]; }

  /// Whether mesh axis `a` only splits the batch, as data parallelism does: every parameter
  /// whole on it (or, for the DTensor export, stored split and gathered whole at each use: FSDP),
  /// an activation whole or split on dim 0, and an edge at most taking a slice (each
  /// data-parallel rank computes on its own rows from the start: the same numbers). The loss may
  /// be partial over it: each rank's mean over its rows, which DDP averages. With `report`, what
  /// is not is a problem.
  bool data_parallel_axis(std::size_t a, bool report, bool& partial_loss) {
    bool dp = true;
    const std::string why = "the export covers " + axis() + " only, ";
    for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
      const node& nd = g[v];
      const placement o = p.strategies[v].output[a];
      if (nd.is_parameter()) {
        if (o.is_replicate() || (!hf() && gathered_on_use(v, a))) continue;
        if (report)
          problem(v, "stored " + to_string(o) + " on " + p.mesh().axis_label(a) +
                         (hf() ? ": a tensor-parallel plan splits weights over one mesh axis (" + axis() +
                                     "); splitting them over another too (2-D tensor parallelism, ZeRO-3 / FSDP) is beyond "
                                     "tp_plan (the DTensor export writes ZeRO-3 on a data-parallel axis as FSDP2)"
                               : " and used split there: a tensor-parallel plan splits weights over one mesh axis (" + axis() +
                                     "); on another, FSDP stores them split and gathers them whole at each use (ZeRO-3); "
                                     "computing on a split over another axis too (2-D tensor parallelism) is beyond "
                                     "parallelize_module"));
        dp = false;
        continue;
      }
      const bool loss = nd.kind == op_kind::cross_entropy && o.is_partial();
      partial_loss = partial_loss || loss;
      if (!o.is_replicate() && !o.is_shard(0) && !loss) {
        if (report)
          problem(v, "its output is " + to_string(o) + " on " + p.mesh().axis_label(a) + ": " + why +
                         "and the other axes may split the batch (dim 0) and nothing else");
        dp = false;
        continue;
      }
      const std::vector<vertex_t> ops = operands(g, v);
      for (std::size_t i = 0; i < ops.size(); ++i) {
        const placement from = p.strategies[ops[i]].output[a], to = p.strategies[v].inputs[i][a];
        if (g[ops[i]].is_parameter() || from == to || (from.is_replicate() && to.is_shard(0))) continue;
        if (report)
          problem(v, "its operand " + quoted_text(name(ops[i])) + " moves over " + p.mesh().axis_label(a) + " (" + to_string(from) + " -> " +
                         to_string(to) + "): " + why + "and data parallelism moves no activations");
        dp = false;
        break;
      }
    }
    return dp;
  }

  /// The data-parallel axes other than the tp one (every other axis of more than one rank must
  /// be one: what is not is a problem).
  std::vector<std::size_t> check_other_axes() {
    bool partial_loss = false;
    std::vector<std::size_t> dp;
    for (std::size_t a = 0; a < p.mesh().ndim(); ++a)
      if (a != t && p.mesh().size(a) > 1 && data_parallel_axis(a, true, partial_loss)) dp.push_back(a);
    if (partial_loss)
      out.notes.push_back("the loss: each data-parallel rank's mean over its rows (the plan sums the ranks' shares); "
                          "averaging the gradients over those ranks, as DDP does, gives the plan's");
    return dp;
  }

  /// dtensor: FSDP2 for the parameters the plan stores ZeRO-3: split on a data-parallel axis of
  /// `dp` (sorted), or on tp where gathered whole at each use there (fsdp_on_tp), its axes. It
  /// shards each over exactly its axes (Shard(d), chunked as the plan splits), HSDP's replicate
  /// dim the other data-parallel axes; one the plan keeps whole, or a style's on tp, is left out
  /// (ignored_params). One the plan splits on several dims there, or on the dim its
  /// tensor-parallel split takes (where FSDP2 shards each tensor-parallel shard again, the tp
  /// axis outer), gets the dim it is split on first: the same numbers, other blocks on each rank
  /// (other_storage), said in a note. A `fully_shard` unit holds parameters of one set of axes:
  /// each layer, or where its parameters differ (attention ZeRO-3 over tp, the MLP's over dp
  /// beside its tensor-parallel split) the largest submodules whose do not, then the model.
  /// Over tp, FSDP2's reduce-scatter sums the ranks' gradients, each its slice's share of one
  /// loss (gradient_sums checks): it divides by the data-parallel ranks only
  /// (gradient_divide_factor).
  void plan_fsdp(const std::vector<std::size_t>& dp, bool tp_is_dp) {
    if (hf()) return;
    fsdp_export f;
    std::map<std::string, std::vector<int>> key;  // FSDP2's parameters -> their axes
    std::map<std::string, vertex_t> vertex_of;
    std::vector<std::string> order;
    std::map<std::vector<int>, std::size_t> per_key;
    std::size_t whole_zero = 0;
    for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
      if (!g[v].is_parameter()) continue;
      std::vector<int> k;
      std::optional<int> dim;
      bool one_dim = true;
      for (std::size_t a = 0; a < p.mesh().ndim(); ++a) {
        const bool data_parallel = std::find(dp.begin(), dp.end(), a) != dp.end();
        const placement s = p.strategies[v].output[a];
        if (!(data_parallel ? s.is_shard() : a == t && fsdp_on_tp(v))) continue;
        k.push_back(static_cast<int>(a));
        one_dim = one_dim && (!dim || *dim == s.dim);
        if (!dim) dim = s.dim;
      }
      if (k.empty()) {
        f.ignored.push_back(name(v));
        whole_zero += p.strategies[v].zero_stage > 0;
        continue;
      }
      key[name(v)] = k;
      vertex_of[name(v)] = v;
      order.push_back(name(v));
      ++per_key[k];
      f.shard_dims[name(v)] = *dim;
      if (!one_dim || (!tp_is_dp && stored(v).is_shard(*dim))) f.other_storage.push_back(name(v));
    }
    if (key.empty()) return;
    f.gradient_divide_factor = 1;
    for (std::size_t a : dp) f.gradient_divide_factor *= p.mesh().size(a);
    std::map<std::string, std::vector<std::string>> by_layer;
    std::vector<std::string> layers_in_order, rest;
    for (const std::string& n : order) {
      const std::string l = layer_of(n);
      if (l.empty()) {
        rest.push_back(n);
        continue;
      }
      if (!by_layer.count(l)) layers_in_order.push_back(l);
      by_layer[l].push_back(n);
    }
    for (const std::string& l : layers_in_order) fsdp_units(f, l, by_layer[l], key, vertex_of, dp);
    fsdp_units(f, "", rest, key, vertex_of, dp);
    const auto axes_text = [&](const std::vector<int>& axes) {
      std::string text;
      for (int a : axes) text += (text.empty() ? "" : " and ") + p.mesh().axis_label(static_cast<std::size_t>(a));
      return text;
    };
    const bool training = p.document.pricing.mode == run_mode::training;
    bool over_tp = false;
    std::string how;
    for (const auto& [k, count] : per_key) {
      const std::vector<int> replicate = replicate_axes_of(k, dp);
      over_tp = over_tp || (!tp_is_dp && std::find(k.begin(), k.end(), static_cast<int>(t)) != k.end());
      how += std::string(how.empty() ? "" : "; ") + "over " + axes_text(k) + " for " + std::to_string(count) +
             (replicate.empty() ? std::string() : ", replicated over " + axes_text(replicate) + " (HSDP)");
    }
    out.notes.push_back("FSDP2 (fully_shard, " + count_noun(f.units.size(), "unit") + ") for the " +
                        count_noun(f.shard_dims.size(), "parameter") + " the plan stores split and gathers whole at each use "
                        "(ZeRO-3): " + how +
                        (!training ? std::string() : "; it averages their gradients over the data-parallel ranks") +
                        (over_tp && training ? " and sums them over " + axis() + ", whose ranks each compute a slice of one "
                                               "loss: set_gradient_divide_factor(" + std::to_string(f.gradient_divide_factor) +
                                               ") on each unit whose mesh holds " + axis() + " (on Gloo, which lacks NCCL's "
                                               "PREMUL_SUM, with set_force_sum_reduction_for_comms(True))"
                                             : std::string()));
    if (!f.other_storage.empty())
      out.notes.push_back(count_noun(f.other_storage.size(), "parameter") + " (other_storage, the first " +
                          quoted_text(f.other_storage.front()) + ") the plan splits on several dims, or on the dim of its "
                          "tensor-parallel split: FSDP2 shards each on one dim (each tensor-parallel shard again, " + axis() +
                          " outer) and so holds other blocks on each rank than the plan stores: the same numbers; "
                          "`autoshard shard --plan` files are not its shards (load the whole checkpoint before fully_shard)");
    if (!f.ignored.empty())
      out.notes.push_back(count_noun(f.ignored.size(), "parameter") + " the plan keeps whole on every data-parallel axis" +
                          (over_tp ? " or its parallel style splits on " + axis() : std::string()) + " (ignored_params)" +
                          (!training ? std::string()
                                     : ": FSDP2 leaves their gradients each rank's own; average them over the data-parallel "
                                       "ranks as DDP does") +
                          (whole_zero ? " (" + std::to_string(whole_zero) + " of them keep optimizer state sharded, ZeRO-1/2: "
                                        "ZeroRedundancyOptimizer)"
                                      : std::string()));
    out.fsdp = std::move(f);
  }

  /// dtensor: the fully_shard units for `params` (FSDP2's, their axes in `key`) under module
  /// `prefix` ("" the model), innermost first: the module itself where they share their axes,
  /// else each child module that holds some, recursively, then the module for its own. The
  /// model is always a unit (FSDP2's root).
  void fsdp_units(fsdp_export& f, const std::string& prefix, const std::vector<std::string>& params,
                  const std::map<std::string, std::vector<int>>& key, const std::map<std::string, vertex_t>& vertex_of,
                  const std::vector<std::size_t>& dp) {
    std::set<std::vector<int>> keys;
    for (const std::string& n : params) keys.insert(key.at(n));
    std::vector<std::string> own;
    if (keys.size() <= 1) {
      own = params;
    } else {
      std::map<std::string, std::vector<std::string>> child;
      std::vector<std::string> children;
      for (const std::string& n : params) {
        const std::size_t dot = n.find('.', prefix.empty() ? 0 : prefix.size() + 1);
        if (dot == std::string::npos) {
          own.push_back(n);
          continue;
        }
        const std::string c = n.substr(0, dot);
        if (!child.count(c)) children.push_back(c);
        child[c].push_back(n);
      }
      for (const std::string& c : children) fsdp_units(f, c, child[c], key, vertex_of, dp);
    }
    if (own.empty() && !prefix.empty()) return;
    std::set<std::vector<int>> mine;
    for (const std::string& n : own) mine.insert(key.at(n));
    if (mine.size() > 1) {
      problem(vertex_of.at(own.front()), "stored ZeRO-3 over other mesh axes than another parameter of " +
                                             quoted_text(prefix.empty() ? std::string("the model") : prefix) +
                                             ": FSDP2 shards the parameters of one module over one mesh");
      return;
    }
    // The model with no parameter of its own: the first unit's mesh (none where every unit
    // below was refused, a problem already).
    fsdp_unit u{prefix, !mine.empty() ? *mine.begin() : f.units.empty() ? std::vector<int>{} : f.units.front().shard_axes, {}};
    u.replicate_axes = replicate_axes_of(u.shard_axes, dp);
    f.units.push_back(std::move(u));
  }

  /// HSDP's replicate axes of FSDP2 sharding over `shard`: the data-parallel axes `dp` it leaves.
  static std::vector<int> replicate_axes_of(const std::vector<int>& shard, const std::vector<std::size_t>& dp) {
    std::vector<int> out;
    for (std::size_t a : dp)
      if (std::find(shard.begin(), shard.end(), static_cast<int>(a)) == shard.end()) out.push_back(static_cast<int>(a));
    return out;
  }

  /// The consumers of v as (consumer, operand index).
  std::vector<std::pair<vertex_t, std::size_t>> consumers(vertex_t v) const {
    std::vector<std::pair<vertex_t, std::size_t>> c;
    for (auto [e, end] = boost::out_edges(v, g); e != end; ++e)
      c.emplace_back(boost::target(*e, g), static_cast<std::size_t>(g[*e].operand));
    return c;
  }

  /// What consumer c takes operand i as in the target: the plan's layout, except for the loss,
  /// which the model computes on its whole logits and labels (a plan's loss on a slice of the
  /// batch or sequence is a sum of partial means), or, in PyTorch, on vocabulary-split logits
  /// under loss_parallel().
  placement want_of(vertex_t c, std::size_t i) const {
    const placement w = in(c, i);
    if (g[c].kind != op_kind::cross_entropy) return w;
    const int last = static_cast<int>(g[operands(g, c)[0]].shape.rank) - 1;
    return i == 0 && w.is_shard(last) && !hf() ? w : Replicate();
  }

  /// What every style must agree with, checked on a module's parameters: false (and a
  /// problem) when no style of the target holds them as the plan does.
  bool check_module(vertex_t v) {
    const node& nd = g[v];
    const std::vector<vertex_t> ops = operands(g, v);
    const module_role r = role[v];
    const placement ws = stored(weight(v)), wc = in(v, 1);
    if (ws.is_partial() || wc.is_partial()) {
      problem(v, "its weight is Partial on " + axis() + ": no parallel style holds a weight as partial sums");
      return false;
    }
    if (is_table_slice[ops[1]]) {
      // The module indexes its whole table at positions past the slice's start: the slice is
      // its rows as the module holds them only where no rows are split, and taken on each rank
      // from the table as stored (nothing moved).
      const vertex_t s = ops[1];
      const std::string rows = "it reads the rows " + std::to_string(g[s].attrs.start) + ".. of " + quoted_text(name(weight(v))) +
                               " (past the table's offset and a key/value cache's tokens), where the model's module indexes the "
                               "whole table";
      if (ws.is_shard(0) || wc.is_shard(0)) {
        problem(v, rows + ", and the plan splits the rows over " + axis() + ": a row-parallel style splits the whole table's "
                       "rows, which gives each rank other rows than the plan's split of the slice");
        return false;
      }
      if (!(in(s, 0) == ws) || !(plan_out(s) == wc)) {
        problem(v, rows + ", and the plan moves the table between its storage (" + to_string(ws) + ") and the slice it reads (" +
                       to_string(wc) + ") on " + axis() + ": no style moves a module's weight");
        return false;
      }
    }
    if (r == module_role::none) {
      problem(v, "its weight is stored " + to_string(ws) + " but used " + to_string(wc) + " on " + axis() +
                     ": a parallel style stores a weight the way the module uses it" +
                     (hf() && gathered_on_use(weight(v), t) ? " (gathered whole at each use, ZeRO-3: the DTensor export writes "
                                                           "that as FSDP2)"
                                                         : ""));
      return false;
    }
    const bool norm = nd.kind == op_kind::layer_norm || nd.kind == op_kind::rms_norm;
    if (norm) {
      for (std::size_t i = 1; i < ops.size(); ++i)
        if (!stored(ops[i]).is_replicate() || !in(v, i).is_replicate()) {
          problem(v, "its parameter " + quoted_text(name(ops[i])) + " is split on " + axis() + ": a norm's weight stays whole in every parallel style");
          return false;
        }
      if (in(v, 0).is_shard(static_cast<int>(g[ops[0]].shape.rank) - 1)) {
        problem(v, "it normalises a feature dim split on " + axis() + ": no parallel style computes a norm over split features");
        return false;
      }
      return true;
    }
    if (nd.kind == op_kind::linear && nd.attrs.transposed_weight && r != module_role::whole && r != module_role::sliced) {
      problem(v, "its weight is stored [in,out] (GPT-2's Conv1D) and split on " + axis() + ": " +
                     (hf() ? "transformers' colwise and rowwise shard nn.Linear ([out,in], with out_features)"
                           : "PyTorch's ColwiseParallel and RowwiseParallel take nn.Linear and nn.Embedding only"));
      return false;
    }
    if (r == module_role::column && fused_dim_of(g, v).any()) {
      problem(v, "its output features are " + std::to_string(fused_dim_of(g, v).parts) + " fused parts, each split over " + axis() +
                     " (rank r holds piece r of every part): a column-parallel style cuts one contiguous run of the "
                     "model's weight, which gives rank r other columns");
      return false;
    }
    if (ops.size() > 2) {  // the bias
      const placement bs = stored(ops[2]), bc = in(v, 2);
      const bool ok = r == module_role::column ? bs.is_shard(0) && bc.is_shard(0)
                      : r == module_role::row  ? bs.is_replicate()
                                               : bs.is_replicate();
      if (!ok) {
        problem(v, "its bias is stored " + to_string(bs) + " and used " + to_string(bc) + " on " + axis() + " with the weight " +
                       to_string(ws) + ": " +
                       (r == module_role::column ? "a column-parallel style splits the bias with the weight"
                                                 : "a row-parallel style keeps the bias whole and adds it once, after the reduction"));
        return false;
      }
    }
    return true;
  }

  /// The output layout every consumer of module v gets: what those that cannot convert
  /// (operators that are not modules, sequence-parallel norms) take, else what all take, else
  /// the module's own. nullopt (and a problem) when those that cannot convert disagree.
  std::optional<placement> output_layout(vertex_t v, const placement& raw, bool can_convert = true) {
    std::optional<placement> strict, common;
    bool agree = true;
    for (auto [c, i] : consumers(v)) {
      const placement want = want_of(c, i);
      if (rigid(c) && !enters_convertible_layer(v, c)) {
        if (strict && !(*strict == want)) {
          problem(v, quoted_text(name(c)) + " takes its output as " + to_string(want) + " and another consumer as " + to_string(*strict) +
                         " on " + axis() + ": PyTorch hands a module's output over in one layout, and neither converts it");
          return std::nullopt;
        }
        strict = want;
      }
      if (common && !(*common == want)) agree = false;
      common = want;
    }
    if (!can_convert) {
      if (strict && !(*strict == raw)) {
        problem(v, "it hands its output over as it computes it, " + to_string(raw) + " on " + axis() + ", but " + quoted_text(name(v)) +
                       " has consumers that take " + to_string(*strict) + " and cannot convert it");
        return std::nullopt;
      }
      return raw;
    }
    if (strict) return strict;
    if (common && agree) return common;
    return raw;
  }

  void fix_inputs_if_split(vertex_t v, const placement& q) {
    if (!sliced_rows(q, v)) return;
    for (vertex_t u = 0; u < boost::num_vertices(g); ++u)
      if (g[u].is_fed_input() && !is_cache(u)) out.fixed_inputs[name(u)] = std::vector<std::int64_t>(g[u].shape.dims.begin(), g[u].shape.dims.begin() + g[u].shape.rank);
  }

  // ---- operators that are not modules: they run as the model's code runs them -------------------

  /// dtensor: the token embedding of a rotary model (LLaMA's family) whose every rotary and
  /// attention the plan runs on a slice of the batch over tp, or none. Such a model computes its
  /// attention mask from the embedding's output and its rotary angles from the positions alone:
  /// handed the batch sliced from the embedding on, every layer sees masks and angles that fit
  /// its slice. Models without rotary (ALiBi's biases, learned positions) are left out.
  std::optional<vertex_t> batch_sliced_embedding() const {
    if (hf() || !rotary_model) return std::nullopt;
    std::optional<vertex_t> token_embedding;
    for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
      const op_kind k = g[v].kind;
      if (k == op_kind::rotary || k == op_kind::attention)
        for (std::size_t i = 0; i < operands(g, v).size(); ++i)
          if (!in(v, i).is_shard(0)) return std::nullopt;
      if (k == op_kind::embedding && is_module[v] && g[operands(g, v)[0]].is_input()) {
        if (token_embedding) return std::nullopt;
        token_embedding = v;
      }
    }
    return token_embedding;
  }

  /// dtensor: whether the model's code sees each rank's slice of the batch from its token
  /// embedding on (sliced_embedding, its output held so, a local tensor).
  bool batch_sliced_from_embedding() const {
    const std::optional<vertex_t> e = sliced_embedding;
    return e && !failed[*e] && held[*e].is_shard(0) && !dtensor[*e];
  }

  /// Kind rules beyond the strategies, for what the model's own code does around an operator:
  /// it computes the rotary angles, the attention mask and ALiBi's biases for the whole batch
  /// and sequence of its inputs, so rotary and attention run on their heads split or whole,
  /// never on a slice of the batch or the sequence (but on the batch a rotary model hands every
  /// layer sliced from its token embedding on: batch_sliced_from_embedding); and it views a
  /// projection's output as heads with its own head counts (BLOOM's, Falcon's
  /// `view(batch, seq, self.num_heads, ...)`), so a reshape of a dim split over tp into several
  /// is refused.
  bool local_kind_ok(vertex_t v, const std::vector<placement>& ins) {
    const node& nd = g[v];
    const std::vector<vertex_t> ops = operands(g, v);
    if (nd.kind == op_kind::reshape && !ins.empty() && ins[0].is_shard()) {
      const tensor_shape& from = g[ops[0]].shape;
      const auto d = static_cast<std::size_t>(ins[0].dim);
      // The split dim survives the view only when the same number of elements precede and form it.
      std::int64_t before = 1, out_before = 1;
      for (std::size_t i = 0; i < d; ++i) before *= from[i];
      bool kept = false;
      for (std::size_t j = 0; j < nd.shape.rank && !kept; ++j) {
        kept = out_before == before && nd.shape[j] == from[d];
        out_before *= nd.shape[j];
      }
      if (!kept) {
        problem(v, "it views dim " + std::to_string(ins[0].dim) + " of " + to_string(from) + ", split over " + axis() +
                       ", as " + to_string(nd.shape) + ": the model's code views it with its own head counts, which no "
                       "style changes");
        return false;
      }
    }
    if (nd.kind != op_kind::rotary && nd.kind != op_kind::attention) return true;
    const int last = static_cast<int>(g[ops[0]].shape.rank) - 1;
    for (const placement& q : ins)
      if (q.is_shard() && q.dim != last && !(q.dim == 0 && batch_sliced_from_embedding())) {
        problem(v, "it runs on a slice of dim " + std::to_string(q.dim) + " (the " + (q.dim == 0 ? "batch" : "sequence") +
                       ") over " + axis() + ": the model computes " +
                       (rotary_model ? "the rotary angles and the attention mask" : "the attention mask (and ALiBi's biases, where it has them)") +
                       " for the whole batch and sequence of its inputs" +
                       (q.dim != 0 ? std::string()
                        : rotary_model
                            ? "; its layers run on the batch sliced only where the plan slices it from the token embedding on"
                            : "; a model without rotary embeddings (learned positions, ALiBi) exports its layers on a slice of the batch only as data "
                              "parallelism, every rank fed its own rows (plan with --algo data_parallel)"));
        return false;
      }
    return true;
  }

  /// An attention whose query heads are split with its key/values whole reads, in the model's
  /// code, only the key/value heads of its query heads: its key/value chains must hand it those.
  bool kv_heads_ok(vertex_t v) {
    if (g[v].kind != op_kind::attention) return true;
    const std::vector<vertex_t> ops = operands(g, v);
    if (ops.size() < 3 || !in(v, 0).is_shard(2) || !in(v, 1).is_replicate() || n == 1) return true;
    for (std::size_t i = 1; i < 3; ++i)
      if (!kv_sliced[ops[i]] && !failed[ops[i]]) {
        problem(v, "it splits its query heads over " + axis() + " and reads " + quoted_text(name(ops[i])) + " whole, but the model's "
                   "attention reads only the key/value heads of its query heads, and nothing between it and the projection "
                   "that computes them can be sliced so (an operator with other consumers, or no projection)");
        return false;
      }
    return true;
  }

  /// An attention's key/value cache (operands 3, 4) as PyTorch holds it: not an input the user
  /// hands over but the attention module's state (transformers' DynamicCache), the keys and
  /// values the module computed on this rank in earlier steps, so it arrives as the step's own
  /// keys (operand 1) and values (operand 2) do (the rank's heads under a colwise k_proj). The
  /// plan must keep it so on tp: stored as the attention reads it, or whole and read on a slice
  /// (the module keeps only the slice: the same numbers). A cache the plan keeps in another
  /// layout and moves to the attention each step, or one that two attentions or operands
  /// read, is no cache of PyTorch's: a problem naming the cache.
  void hold_cache(vertex_t v) {
    if (g[v].kind != op_kind::attention) return;
    const std::vector<vertex_t> ops = operands(g, v);
    for (std::size_t i = 3; i < ops.size(); ++i) {
      const vertex_t u = ops[i], own = ops[i - 2];
      if (!is_cache(u) || failed[u]) continue;
      const placement kept = plan_out(u), read = in(v, i);
      const std::string whose = std::string("a key/value cache is the attention module's state (transformers' DynamicCache), the ") +
                                (i == 3 ? "keys" : "values") + " each rank computed in earlier steps as " + quoted_text(name(own)) +
                                " reaches the attention, never handed over or moved";
      if (boost::out_degree(u, g) != 1) {
        problem(u, "it is read by " + std::to_string(boost::out_degree(u, g)) + " attention operands, but " + whose + ", one attention's own");
        continue;
      }
      if (!(kept == read) && !kept.is_replicate()) {
        problem(u, "the plan keeps it " + to_string(kept) + " on " + axis() + " and " + quoted_text(name(v)) + " reads it " + to_string(read) +
                       ", but " + whose);
        continue;
      }
      if (!(kept == read))
        note(u, "the plan keeps the whole cache on each rank of " + axis() + " and the attention reads its slice " + to_string(read) +
                "; the attention module keeps only its slice: the same numbers");
      held[u] = held[own];
      dtensor[u] = dtensor[own];
      kv_of[u] = kv_of[own];
      kv_sliced[u] = kv_sliced[own];
      failed[u] = failed[own];
    }
  }

  /// dtensor: an operator gets exactly the layouts the plan computes it on.
  void local_dtensor(vertex_t v) {
    hold_cache(v);
    const node& nd = g[v];
    const std::vector<vertex_t> ops = operands(g, v);
    bool any_dt = false, all_dt = true, ok = true;
    std::vector<placement> ins;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const vertex_t u = ops[i];
      const placement want = want_of(v, i);
      ins.push_back(want);
      if (g[u].is_parameter()) {
        if (!stored(u).is_replicate() || !want.is_replicate()) {
          problem(v, "it takes the parameter " + quoted_text(name(u)) + " as " + to_string(want) + " on " + axis() +
                         ": no parallel style splits a parameter that no linear, embedding or norm holds");
          ok = false;
        }
        continue;
      }
      const placement h = failed[u] || (kv_sliced[u] && kv_of[u] == (kv_of[v] == none ? v : kv_of[v])) ? want : held_in(u, v);
      if (!(h == want)) {
        problem(v, "it takes " + quoted_text(name(u)) + " as " + to_string(want) + " on " + axis() + ", but PyTorch hands it over as " +
                       to_string(h) + ": data moves only at a module's input or output, and " +
                       (is_module[u] ? quoted_text(name(u)) + " hands its output to consumers that want other layouts"
                                     : "no module lies between them"));
        ok = false;
      }
      const bool d = dtensor[u] != 0 && !is_integer(g[u].type) && !enters_convertible_layer(u, v);
      any_dt = any_dt || d;
      all_dt = all_dt && (d || is_integer(g[u].type));
    }
    if (!ok || !local_kind_ok(v, ins)) return;
    if (!kv_heads_ok(v)) return;
    const bool elementwise = is_unary_elementwise(nd.kind) || is_binary_elementwise(nd.kind) || nd.kind == op_kind::where;
    if (any_dt && (!all_dt || !(elementwise || nd.kind == op_kind::cross_entropy))) {
      problem(v, "a split that does not divide evenly over " + axis() + " reaches it as a DTensor (a local tensor cannot "
                 "say the shard sizes), and " + (all_dt ? "PyTorch's DTensor runs it by its own rules" : "it mixes it with local tensors"));
      return;
    }
    const bool whole_loss = nd.kind == op_kind::cross_entropy && ins[0].is_replicate();
    if (whole_loss && !(in(v, 0).is_replicate() && in(v, 1).is_replicate()))
      note(v, "the plan computes the loss on a slice of the batch or sequence over " + axis() + " and sums the partial means; "
              "the model computes it on the whole logits and labels: the same number");
    const placement o = whole_loss ? Replicate() : plan_out(v);
    if (o.is_partial() && nd.kind != op_kind::cross_entropy) {
      problem(v, "it leaves partial sums on " + axis() + ": only a row-parallel module reduces them");
      return;
    }
    if (nd.kind == op_kind::cross_entropy && ins[0].is_shard()) {
      if (!any_dt) {
        problem(v, "a vocabulary-parallel loss reads logits split on " + axis() + " as a DTensor (loss_parallel), which its "
                   "producer does not hand over");
        return;
      }
      out.loss_parallel = true;
    }
    held[v] = o;
    kv_sliced[v] = kv_of[v] != none && !ops.empty() && kv_sliced[ops[0]];
    dtensor[v] = any_dt && nd.kind != op_kind::cross_entropy;
    fix_inputs_if_split(v, o);
    if (boost::out_degree(v, g) == 0 && nd.kind != op_kind::cross_entropy && !o.is_replicate())
      problem(v, "the model returns it " + to_string(o) + " on " + axis() + ", and no module is there to gather it");
  }

  /// The module whose name holds operator v ("model.layers.0.self_attn" for its attention).
  std::string parent(vertex_t v) const {
    const std::size_t dot = name(v).rfind('.');
    return dot == std::string::npos ? std::string() : name(v).substr(0, dot);
  }

  /// A key/value projection the plan keeps whole (kv_of): its output sliced to the key/value
  /// heads of the rank's query heads, on the tensor-parallel group's ranks as (kv heads, ranks
  /// per head) when there are fewer heads than ranks, and the attention told how many query
  /// heads read each.
  bool kv_slice(vertex_t v, tp_module& m, const placement& o) {
    const vertex_t a = kv_of[v];
    const int heads = g[a].attrs.heads, kv = g[a].attrs.kv_heads > 0 ? g[a].attrs.kv_heads : heads;
    const std::string why = "it computes the key/values of " + quoted_text(name(a)) + ", which splits its query heads over " + axis() +
                            " and reads the key/values whole; the model's attention reads only the key/value heads of its "
                            "query heads, ";
    if (!is_module[v] || role[v] != module_role::whole || !o.is_replicate() || (!hf() && !m.style.empty())) {
      problem(v, why + "which a style slices off a projection computed whole and handed over whole");
      return false;
    }
    if (n % kv != 0 && kv % n != 0) {
      problem(v, why + "and " + std::to_string(kv) + " key/value heads over " + std::to_string(n) +
                     " ranks are neither split nor replicated evenly");
      return false;
    }
    if (hf()) {
      if (major() < 5 && kv < n) {
        problem(v, "transformers 4 has no style that replicates key/value heads over ranks (5's unit_colwise)");
        return false;
      }
      for (std::size_t ax = 0; ax < p.mesh().ndim() && kv < n; ++ax)
        if (ax != t && p.mesh().size(ax) > 1) {
          problem(v, "transformers 5 puts the mesh's other axes (" + p.mesh().axis_label(ax) + ") under FSDP, which does not take "
                     "the meshes unit_colwise replicates key/value heads on (from_pretrained fails); the DTensor export "
                     "replicates them");
          return false;
        }
      m.style = kv < n ? "unit_colwise" : "colwise";
      note(v, "transformers stores and computes only the key/value heads each rank's query heads read; the plan keeps the "
              "projection whole on every rank: the same numbers");
      return true;
    }
    if (kv < n && p.document.pricing.mode == run_mode::training) {
      problem(v, why + "and " + std::to_string(kv) + " key/value heads over " + std::to_string(n) + " ranks are replicated: the "
                     "plan trains, and the backward of the slice PyTorch takes on a sub-mesh of heads sums no gradient over the "
                     "ranks that share a head, so the gradients would be wrong (the plan's inference twin exports, and the hf "
                     "export's unit_colwise trains it exactly)");
      return false;
    }
    m.style = "PrepareModuleOutput";
    m.kwargs = {{"output_layouts", "Replicate()"}, {"desired_output_layouts", "Shard(-1)"}, {"use_local_output", true}};
    if (kv < n) {
      m.mesh = "kv_heads_" + std::to_string(kv);
      out.meshes[m.mesh] = {kv, n / kv};
      out.attributes[parent(a)]["num_key_value_groups"] = heads / n;
      note(v, "each rank keeps the key/value head its query heads read, on the '" + m.mesh + "' mesh (the " + axis() +
              " ranks as " + std::to_string(kv) + " heads x " + std::to_string(n / kv) + " replicas), and " + quoted_text(parent(a)) +
              " is told that " + std::to_string(heads / n) + " query heads read it (num_key_value_groups)");
    }
    return true;
  }

  // ---- modules -------------------------------------------------------------------------------------

  /// dtensor: the module's style for its role, with the layout it computes on (`desired`) and
  /// the one it makes (`raw`); false when no style can take its input (a problem is recorded).
  bool style_dtensor(vertex_t v, const placement& a, const placement& w, bool x_dt, tp_module& m, placement& desired,
                     placement& raw) {
    const node& nd = g[v];
    const vertex_t x = operands(g, v)[0];
    const int orank = static_cast<int>(nd.shape.rank);
    switch (role[v]) {
      case module_role::column:
        m.style = "ColwiseParallel";
        desired = Replicate();
        raw = Shard(orank - 1);
        break;
      case module_role::row:
        m.style = "RowwiseParallel";
        desired = nd.kind == op_kind::embedding ? Replicate() : Shard(static_cast<int>(g[x].shape.rank) - 1);
        raw = Partial();
        break;
      case module_role::sequence:
        raw = w;
        if (uneven(w, x) && !x_dt) {
          problem(v, "its input is split unevenly over " + axis() + " (dim " + std::to_string(w.dim) + " of " +
                         std::to_string(g[x].shape[static_cast<std::size_t>(w.dim)]) + "), which no style can annotate");
          return false;
        }
        if (!(a == w) && !x_dt) {
          // SequenceParallel reads its input as already split: the norm runs plain on the slice
          // PrepareModuleInput takes (the same numbers; its weight's gradient is then each
          // rank's share, which SequenceParallel would sum: gradient_sums lists it in
          // tp_gradient_sums).
          break;
        }
        m.style = "SequenceParallel";
        m.kwargs["sequence_dim"] = w.dim;
        m.kwargs["use_local_output"] = true;
        break;
      case module_role::sliced:
        desired = Replicate();
        raw = Replicate();
        note(v, "the plan stores its weight whole on " + axis() + " and computes on a slice of it (" + to_string(in(v, 1)) +
                    "); PyTorch computes the whole output from the whole weight and keeps what its consumers take: the same "
                    "numbers, more compute");
        break;
      default: break;  // whole: the module computes on the slice of the input the plan gives it
    }
    return true;
  }

  /// dtensor: the layout the module's consumers take (whole for the model's own output), whether
  /// it is the logits a vocabulary-parallel loss reads split, and whether it must stay a DTensor
  /// for the model's code to read the whole shape off it (`whole_shape`); empty when no style
  /// makes it.
  std::optional<placement> output_dtensor(vertex_t v, const placement& raw, bool& loss_parallel, bool& whole_shape) {
    const node& nd = g[v];
    const module_role r = role[v];
    const vertex_t x = operands(g, v)[0];
    const int orank = static_cast<int>(nd.shape.rank);
    std::optional<placement> o;
    if (boost::out_degree(v, g) == 0) {
      o = Replicate();
      if (!raw.is_replicate())
        note(v, "the model's output: gathered over " + axis() + " (the plan leaves it " + to_string(plan_out(v)) +
                    "), so that every rank has the whole of it");
      return o;
    }
    for (auto [c, i] : consumers(v))
      if (g[c].kind == op_kind::cross_entropy && in(c, i).is_shard(orank - 1) && r == module_role::column) loss_parallel = true;
    o = loss_parallel ? std::optional<placement>(Shard(orank - 1)) : output_layout(v, raw, r != module_role::sequence);
    if (!o) return o;
    // The model's own code reads the batch and sequence length off the token embedding's
    // output (positions, the causal mask): it leaves the embedding with both whole, and the
    // first layer takes its slice at its entry; but the batch sliced there where every layer's
    // rotary and attention run on that slice (batch_sliced_embedding).
    auto splits_rows = [&](const placement& q) { return q.is_shard() && q.dim != orank - 1; };
    const bool vocab_parallel = nd.kind == op_kind::embedding && r == module_role::row;
    if (nd.kind == op_kind::embedding && g[x].is_input() && splits_rows(*o)) {
      if (o->is_shard(0) && sliced_embedding == v) {
        note(v, "its output is each rank's slice of the batch over " + axis() + ", and every layer runs on it: the model "
                    "computes its causal mask for that slice; an attention_mask passed to the model must be the rank's "
                    "slice of it too");
      } else if (vocab_parallel) {
        // RowwiseParallel on an nn.Embedding leaves a MaskPartial, which PyTorch reduces to
        // Replicate() or reduce-scatters to a Shard, never hands over as Partial(): the slice the
        // layers take is made here (Megatron-LM's reduce-scatter into the sequence-parallel
        // region; torchtitan's output_layouts=Shard(1)), as a DTensor, so that the model's code
        // reads the whole batch and sequence length off it and each layer's PrepareModuleInput
        // hands its operators the local slice. Where an operator that is no layer's entry takes
        // it, the sums are made whole (an all-reduce), as for any token embedding here, and an
        // operator that takes a slice of them is reported (no module lies between them).
        bool layers_only = true;
        for (auto [c, i] : consumers(v)) layers_only = layers_only && enters_convertible_layer(v, c);
        if (layers_only) whole_shape = true;
        else o = Replicate();
      } else {
        o = splits_rows(raw) ? Replicate() : raw;
      }
    }
    if (vocab_parallel && o->is_partial()) {
      problem(v, "it computes on its slice of the vocabulary (RowwiseParallel), whose output PyTorch holds as a MaskPartial and "
                 "hands over only summed (Replicate(), or Shard(d) reduce-scattered), but its consumers keep the partial sums");
      return std::nullopt;
    }
    return o;
  }

  /// dtensor: whether module v's output, split on a dim other than its features, goes only to
  /// column-parallel modules (as their input, inside v's layer), which take a DTensor and convert
  /// it: it then stays a DTensor (use_local_output=False), so that the model's code between them
  /// sees the whole shape. LLaMA's attention reads its batch and sequence length off its input
  /// (`input_shape = hidden_states.shape[:-1]`) before its projections gather the sequence;
  /// a local slice gives it the slice's length.
  bool modules_take_dtensor(vertex_t v, const placement& o) const {
    if (!o.is_shard() || o.dim == static_cast<int>(g[v].shape.rank) - 1) return false;
    bool any = false;
    for (auto [c, i] : consumers(v)) {
      if (!is_module[c] || i != 0 || role[c] != module_role::column || enters_convertible_layer(v, c)) return false;
      any = true;
    }
    return any;
  }

  /// dtensor: the module's style, the layouts it converts between, and what it leaves its
  /// consumers (the held layout and whether it is a DTensor).
  void module_dtensor(vertex_t v) {
    const node& nd = g[v];
    const std::vector<vertex_t> ops = operands(g, v);
    const vertex_t x = ops[0];
    if (!check_module(v)) return;
    const module_role r = role[v];
    const placement a = failed[x] ? in(v, 0) : held_in(x, v), w = in(v, 0);
    const bool x_dt = dtensor[x] && !enters_convertible_layer(x, v);
    tp_module m{module_name(nd.name), "", nlohmann::json::object()};
    placement desired = w, raw = plan_out(v);
    if (!style_dtensor(v, a, w, x_dt, m, desired, raw)) return;
    if (!desired.is_replicate() && !desired.is_shard(static_cast<int>(g[x].shape.rank) - 1) && uneven(desired, x) && r != module_role::sequence) {
      problem(v, "it computes on a split of dim " + std::to_string(desired.dim) + " of its input over " + axis() +
                     " that does not divide evenly: no style hands a module such a slice");
      return;
    }
    const bool styled = !m.style.empty();
    if (r == module_role::column || r == module_role::row) m.kwargs["input_layouts"] = pt(a, x);
    if (r == module_role::sequence && !styled) desired = w;
    const bool convert_in = !styled && (!(a == desired) || x_dt);
    // The output: what the consumers take, or the whole tensor for the model's own output.
    bool loss_parallel = false, whole_shape = false;
    const std::optional<placement> o = output_dtensor(v, raw, loss_parallel, whole_shape);
    if (!o) return;
    const bool emits = styled || convert_in || !(*o == raw);  // a style whose output can stay a DTensor
    const bool local_out = !uneven(*o, v) && !loss_parallel && !whole_shape && !(emits && modules_take_dtensor(v, *o));
    if (o->is_partial() && !styled) {
      problem(v, "its consumers keep partial sums it does not make");
      return;
    }
    if (r == module_role::column || r == module_role::row) {
      m.kwargs["output_layouts"] = pt(*o, v);
      m.kwargs["use_local_output"] = local_out;
    } else if (styled) {
      m.kwargs["use_local_output"] = local_out;  // SequenceParallel
    } else {
      const bool convert_out = !(*o == raw);
      if (convert_in && convert_out) m.style = "PrepareModuleInputOutput";
      else if (convert_in) m.style = "PrepareModuleInput";
      else if (convert_out) m.style = "PrepareModuleOutput";
      if (convert_in) {
        m.kwargs["input_layouts"] = pt(a, x);
        m.kwargs["desired_input_layouts"] = pt(desired, x);
        m.kwargs[convert_out ? "use_local_input" : "use_local_output"] = true;
      }
      if (convert_out) {
        m.kwargs["output_layouts"] = pt(raw, v);
        m.kwargs["desired_output_layouts"] = pt(*o, v);
        m.kwargs["use_local_output"] = local_out;
      }
    }
    if (loss_parallel)
      note(v, "its output (the logits) stays split over " + axis() + " as a DTensor, as the plan's vocabulary-parallel loss "
              "reads it: compute the loss under torch.distributed.tensor.parallel.loss_parallel()");
    if (kv_of[v] != none) {
      if (!kv_slice(v, m, *o)) return;
      kv_sliced[v] = 1;
    }
    held[v] = *o;
    dtensor[v] = !local_out;
    fix_inputs_if_split(v, desired);
    fix_inputs_if_split(v, *o);
    if (!m.style.empty()) out.modules.push_back(std::move(m));
  }

  // ---- transformers: its styles have fixed layouts ---------------------------------------------

  int major() const { return out.options.transformers_major; }

  /// hf: whether a style that takes its input whole can take `a`; records the problem if not.
  bool takes_whole_hf(vertex_t v, const placement& a, const char* style) {
    if (a.is_replicate()) return true;
    problem(v, std::string("transformers' '") + style + "' takes its input whole, but it arrives " + to_string(a) + " on " + axis() +
                   " (the DTensor export converts it)");
    return false;
  }

  /// hf: a column-parallel module's style (an embedding's, or a linear's from the layout its
  /// consumers take); false when transformers has none for it (a problem is recorded).
  bool column_hf(vertex_t v, const placement& a, tp_module& m) {
    const node& nd = g[v];
    const int orank = static_cast<int>(nd.shape.rank);
    if (nd.kind == op_kind::embedding) {
      if (major() < 5) {
        problem(v, "an embedding split on its hidden dim: transformers 4's 'colwise' leaves each rank its slice of every "
                   "vector (5's embedding_colwise gathers them)");
        return false;
      }
      if (!takes_whole_hf(v, a, "embedding_colwise")) return false;
      m.style = "embedding_colwise";
      held[v] = Replicate();
      return true;
    }
    if (!takes_whole_hf(v, a, "colwise")) return false;
    std::optional<placement> o = boost::out_degree(v, g) == 0 ? std::optional<placement>(Replicate()) : output_layout(v, Shard(orank - 1));
    if (!o) return false;
    const bool split = o->is_shard(orank - 1);
    if (split && uneven(*o, v) && major() < 5) {
      problem(v, "its output features (" + std::to_string(nd.shape[static_cast<std::size_t>(orank - 1)]) + ") do not divide over " +
                     axis() + ": transformers 4's colwise assumes even shards");
      return false;
    }
    m.style = split ? "colwise" : major() >= 5 ? "colwise_gather_output" : "colwise_rep";
    if (!split && !o->is_replicate())
      note(v, "the plan hands its output over " + to_string(*o) + " on " + axis() + "; transformers gathers it whole: the same numbers");
    held[v] = split ? Shard(orank - 1) : Replicate();
    return true;
  }

  /// hf: a row-parallel module's style from the layout its input arrives in; false when
  /// transformers has none for it (a problem is recorded).
  bool row_hf(vertex_t v, const placement& a, tp_module& m) {
    const int xlast = static_cast<int>(g[operands(g, v)[0]].shape.rank) - 1;
    if (g[v].kind == op_kind::embedding) {
      if (!takes_whole_hf(v, a, "embedding_rowwise")) return false;
      m.style = major() >= 5 ? "embedding_rowwise" : "rowwise";
    } else if (a.is_shard(xlast)) {
      m.style = "rowwise";
    } else if (a.is_replicate()) {
      m.style = major() >= 5 ? "rowwise_split_input" : "rowwise_rep";
    } else {
      problem(v, "row-parallel with its input " + to_string(a) + " on " + axis() + ": transformers' rowwise takes it split on the "
                 "features or whole");
      return false;
    }
    for (auto [c, i] : consumers(v))
      if (!in(c, i).is_replicate() && !in(c, i).is_partial()) {
        note(v, "the plan reduce-scatters its output to " + to_string(in(c, i)) + " on " + axis() + " (sequence parallel); "
                "transformers' '" + m.style + "' all-reduces it: the same numbers, other collectives");
        break;
      }
    held[v] = Replicate();
    return true;
  }

  /// Whether `q`, a layout of activation u on tp, splits its rows: a dim other than its features
  /// (the batch, the sequence, or the heads of a [B, S, heads, ...] view: sliced_what).
  bool sliced_rows(const placement& q, vertex_t u) const {
    return q.is_shard() && q.dim != static_cast<int>(g[u].shape.rank) - 1;
  }

  /// What the split dim of sliced_rows(q, u) is: "heads" between the sequence and the features
  /// of a view of 4 or more dims (BLOOM's q/k/v slices of [B, S, heads, 3D]), else "batch" (dim
  /// 0) or "sequence".
  static std::string sliced_what(const placement& q, const tensor_shape& s) {
    if (s.rank >= 4 && q.dim >= 2) return "heads";
    return q.dim == 0 ? "batch" : "sequence";
  }

  void add_run_whole(vertex_t v, const placement& q, vertex_t u) {
    run_whole.push_back(v);
    run_whole_of.insert(sliced_what(q, g[u].shape));
  }

  /// hf: one note for the operators the plan runs on a slice of the batch, sequence or heads over
  /// tp that transformers runs on the whole (run_whole): every rank of tp repeats their work.
  void note_whole_runs() {
    if (run_whole.empty()) return;
    std::vector<std::string> of;  // in the order batch, sequence, heads
    for (const char* w : {"batch", "sequence", "heads"})
      if (run_whole_of.count(w)) of.push_back(std::string("the ") + w);
    std::string what = of[0];
    for (std::size_t i = 1; i < of.size(); ++i) what += (i + 1 == of.size() ? " or " : ", ") + of[i];
    out.notes.push_back(count_noun(run_whole.size(), "operator") + " (the first " + quoted_text(name(run_whole.front())) +
                        ") the plan runs on a slice of " + what + " over " + axis() + " run on the whole on each of its " +
                        std::to_string(n) + " ranks: transformers' styles hand them their inputs whole. The same numbers, "
                        "with up to " + std::to_string(n) + " times the plan's compute and activation memory on them (the "
                        "DTensor export keeps the plan's slices where its styles can express them)");
  }

  /// hf: the module's style in transformers' vocabulary, from the layout its input arrives in.
  void module_hf(vertex_t v) {
    const node& nd = g[v];
    const std::vector<vertex_t> ops = operands(g, v);
    const vertex_t x = ops[0];
    const bool emb = nd.kind == op_kind::embedding, norm = !emb && nd.kind != op_kind::linear;
    const int orank = static_cast<int>(nd.shape.rank), xlast = static_cast<int>(g[x].shape.rank) - 1;
    if (!check_module(v)) return;
    const module_role r = role[v];
    const placement a = failed[x] ? in(v, 0) : held[x];
    if (sliced_rows(in(v, 0), x) && a.is_replicate()) add_run_whole(v, in(v, 0), x);
    tp_module m{module_name(nd.name), "replicate", nlohmann::json::object()};
    if (a.is_partial()) {
      problem(v, "its input arrives as partial sums, which no transformers style reduces before a module");
      return;
    }
    switch (r) {
      case module_role::whole:
      case module_role::sequence:
        if (kv_of[v] != none && !norm) {
          if (!takes_whole_hf(v, a, "unit_colwise") || !kv_slice(v, m, Replicate())) return;
          kv_sliced[v] = 1;
          held[v] = Shard(orank - 1);
          break;
        }
        if (a.is_shard(xlast) && !norm) {
          problem(v, "its input arrives split on its features over " + axis() + " and its weight is whole");
          return;
        }
        held[v] = a.is_shard() ? Shard(a.dim) : Replicate();
        break;
      case module_role::sliced:
        if (!takes_whole_hf(v, a, "replicate")) return;
        note(v, "the plan stores its weight whole and computes on a slice of it; transformers computes it whole: the same numbers");
        held[v] = Replicate();
        break;
      case module_role::column:
        if (!column_hf(v, a, m)) return;
        break;
      case module_role::row:
        if (!row_hf(v, a, m)) return;
        break;
      default: break;
    }
    if (!norm) out.modules.push_back(std::move(m));
  }

  /// hf: an operator runs on what transformers hands it; it must be a way the graph's rules
  /// compute it (a strategy taking exactly those layouts, with no communication of its own).
  void local_hf(vertex_t v, const strategy_options& so) {
    hold_cache(v);
    const node& nd = g[v];
    const std::vector<vertex_t> ops = operands(g, v);
    std::vector<placement> ins;
    for (std::size_t i = 0; i < ops.size(); ++i)
      ins.push_back(g[ops[i]].is_parameter() ? stored(ops[i]) : failed[ops[i]] ? in(v, i) : held[ops[i]]);
    for (std::size_t i = 0; i < ops.size(); ++i)
      if (!g[ops[i]].is_parameter() && sliced_rows(in(v, i), ops[i]) && ins[i].is_replicate()) {
        add_run_whole(v, in(v, i), ops[i]);
        break;
      }
    if (!local_kind_ok(v, ins)) return;
    if (kv_of[v] != none && !ops.empty() && kv_sliced[ops[0]]) {  // a key/value chain on the rank's heads
      held[v] = held[ops[0]];
      kv_sliced[v] = 1;
      return;
    }
    if (nd.kind == op_kind::attention && ops.size() >= 3 && (kv_sliced[ops[1]] || kv_sliced[ops[2]])) {
      if (ins[0].is_shard(2) && kv_sliced[ops[1]] && kv_sliced[ops[2]]) {
        held[v] = Shard(2);
        return;
      }
      problem(v, "its key/values arrive as the rank's heads, its queries " + to_string(ins[0]) + " on " + axis());
      return;
    }
    if (!kv_heads_ok(v)) return;
    const strategy& chosen = p.strategies[v];
    for (const strategy& s : enumerate_strategies(g, v, p.mesh(), so)) {
      bool match = s.comm_seconds == 0 && !s.output[t].is_partial() && s.zero_stage == 0;
      for (std::size_t a = 0; a < p.mesh().ndim() && match; ++a) {
        if (a != t && !(s.output[a] == chosen.output[a])) match = false;
        for (std::size_t i = 0; i < ops.size() && match; ++i)
          match = a == t ? s.inputs[i][a] == ins[i] : s.inputs[i][a] == chosen.inputs[i][a];
      }
      if (!match) continue;
      held[v] = s.output[t];
      if (boost::out_degree(v, g) == 0 && nd.kind != op_kind::cross_entropy && !held[v].is_replicate())
        problem(v, "the model returns it " + to_string(held[v]) + " on " + axis() + ", and no transformers style gathers it");
      return;
    }
    std::string given;
    for (std::size_t i = 0; i < ops.size(); ++i) given += (i ? ", " : "") + name(ops[i]) + " " + to_string(ins[i]);
    problem(v, "transformers hands it " + given + " on " + axis() + ", and it cannot compute on those without moving data "
               "(the plan computes it on other layouts, which transformers' styles cannot produce here)");
  }

  void run() {
    classify();
    std::vector<std::size_t> dp = check_other_axes();
    bool partial_loss = false;
    const bool tp_is_dp = data_parallel_axis(t, false, partial_loss);
    if (tp_is_dp) dp.insert(std::upper_bound(dp.begin(), dp.end(), t), t);
    for (std::size_t a : dp) out.data_parallel_axes.push_back(static_cast<int>(a));
    plan_fsdp(dp, tp_is_dp);
    if (!out.fsdp && !hf()) {
      std::size_t zero = 0;
      for (vertex_t v = 0; v < boost::num_vertices(g); ++v) zero += g[v].is_parameter() && p.strategies[v].zero_stage > 0;
      if (zero)
        out.notes.push_back(count_noun(zero, "parameter") + " keep their optimizer state (and, ZeRO-2, their "
                            "gradients) sharded over the data-parallel ranks: ZeRO-1/2, PyTorch's ZeroRedundancyOptimizer; "
                            "the styles say how the model computes");
    }
    if (tp_is_dp) {
      // Only the batch is split over the chosen axis too: data parallelism, nothing to shard.
      // Every rank computes its own rows with the whole model (fed its slice of the batch, as
      // DDP feeds it); the hf export still names every module, replicate.
      out.notes.push_back("the plan only splits the batch over " + axis() + " (data parallelism): every rank computes its "
                          "own rows with the whole model; feed each its slice of the batch, as DDP does");
      if (hf())
        for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
          if (is_module[v] && g[v].kind != op_kind::layer_norm && g[v].kind != op_kind::rms_norm)
            out.modules.push_back({module_name(name(v)), "replicate", nlohmann::json::object()});
      return;
    }
    strategy_options so;
    so.pricing.mode = p.document.pricing.mode;
    for (vertex_t v : topological_order(g)) {
      const node& nd = g[v];
      if (nd.is_parameter() || is_table_slice[v]) continue;  // a table slice: its embedding module's weight
      if (nd.is_input()) {
        held[v] = Replicate();  // the user hands every rank of the tp group the whole input (a cache: hold_cache)
        continue;
      }
      if (is_module[v]) hf() ? module_hf(v) : module_dtensor(v);
      else hf() ? local_hf(v, so) : local_dtensor(v);
    }
    // Parameters no module holds, split on the tensor-parallel axis.
    for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
      if (!g[v].is_parameter() || stored(v).is_replicate()) continue;
      bool held_by_module = false;
      for (auto [c, i] : consumers(v))
        held_by_module = held_by_module || (is_module[c] && i >= 1) || (is_table_slice[c] && is_module[consumers(c).front().first]);
      if (!held_by_module)
        problem(v, "a parameter split " + to_string(p.strategies[v].output) + " that no linear, embedding or norm holds: no parallel "
                   "style splits it");
    }
    if (!out.fixed_inputs.empty())
      out.notes.push_back("the plan splits activations over " + axis() + " on a dim other than their features (the batch or "
                          "the sequence): the model's inputs must have the plan's shapes (fixed_inputs)");
    if (!hf()) {
      gradient_sums();
      ties();
    } else {
      note_whole_runs();
    }
  }

  /// dtensor: the modules whose style replaces their parameters with DTensors of its own.
  std::set<std::string> styled_modules() const {
    std::set<std::string> styled;
    for (const tp_module& m : out.modules)
      if (m.style == "ColwiseParallel" || m.style == "RowwiseParallel" || m.style == "SequenceParallel") styled.insert(m.module);
    return styled;
  }

  /// dtensor: a weight two modules use (a tied table: Qwen2's or GPT-2's lm_head and token
  /// embedding) whose styles distribute it. parallelize_module registers a DTensor parameter of
  /// its own on each module, which unties them: the forward is the same, but the two tables then
  /// train apart (each gets only its own use's gradient). Both styles hold the weight as the plan
  /// stores it (a styled module computes on its weight as stored), so either is the tied
  /// parameter: `tied` says to assign it to the other uses after the styles, as transformers'
  /// tie_weights() does after its tp_plan and as Megatron-LM shares its vocabulary-parallel table.
  void ties() {
    const std::set<std::string> styled = styled_modules();
    for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
      if (!g[v].is_parameter()) continue;
      std::vector<std::string> uses;
      std::size_t distributed = 0;
      bool reported = false;  // a use refused already: no style to tie
      for (auto [c, i] : consumers(v)) {
        if (!is_module[c] || i != 1) continue;
        uses.push_back(module_name(name(c)));
        distributed += styled.count(uses.back());
        reported = reported || failed[c];
      }
      if (uses.size() < 2 || distributed == 0 || reported) continue;
      std::sort(uses.begin(), uses.end());
      if (distributed != uses.size()) {  // check_module refuses a weight stored split and used whole: not reached
        problem(v, "tied: a style distributes it for one of its modules and not for another (of " + quoted_text(uses.front()) + ", " +
                       quoted_text(uses.back()) + "), which would leave them two tensors");
        continue;
      }
      // The module its own name names (model.embed_tokens of model.embed_tokens.weight) keeps it.
      const auto own = std::find_if(uses.begin(), uses.end(), [&](const std::string& u) { return u + ".weight" == name(v); });
      const std::string source = (own != uses.end() ? *own : uses.front()) + ".weight";
      for (const std::string& u : uses)
        if (u + ".weight" != source) {
          out.tied[u + ".weight"] = source;
          out.notes.push_back(quoted_text(u + ".weight") + " is " + quoted_text(source) + " (tied): each style makes a parameter "
                              "of its own, which would train two tables; assign the one to both after the styles (tied)");
        }
    }
  }

  /// dtensor: tp_gradient_sums, the parameters whole on tp that a module without a parallel style
  /// (whose parameters stay plain tensors) computes on a slice of its input's rows over tp. A
  /// parameter FSDP2 stores over tp (fsdp_on_tp) of a training plan must be such a share: its
  /// reduce-scatter sums over tp, which is right only where each rank's gradient is its slice's
  /// share.
  void gradient_sums() {
    const std::set<std::string> styled = styled_modules();
    for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
      const bool fsdp = fsdp_on_tp(v);
      if (!g[v].is_parameter() || !(plan_out(v).is_replicate() || fsdp)) continue;
      bool share = false;
      std::optional<vertex_t> whole;  // a consumer computing on the whole rows
      for (auto [c, i] : consumers(v)) {
        if (styled.count(module_name(name(c)))) continue;
        const std::vector<vertex_t> ops = operands(g, c);
        bool sliced = false;
        for (std::size_t j = 0; j < ops.size() && !sliced; ++j) {
          const placement q = in(c, j);
          sliced = j != i && !g[ops[j]].is_parameter() && q.is_shard() && q.dim != static_cast<int>(g[ops[j]].shape.rank) - 1;
        }
        share = share || sliced;
        if (!sliced && !whole) whole = c;
      }
      if (!fsdp) {
        if (share) out.tp_gradient_sums.push_back(name(v));
      } else if (whole && p.document.pricing.mode == run_mode::training) {
        problem(v, "stored " + to_string(plan_out(v)) + " on " + axis() + " and gathered whole at each use (ZeRO-3), where " +
                       quoted_text(name(*whole)) + " computes on whole rows: FSDP2 over " + axis() + " would sum the gradient "
                       "every rank computes whole (it is right only where each rank computes a slice of the batch or sequence)");
      }
    }
    if (!out.tp_gradient_sums.empty())
      out.notes.push_back(count_noun(out.tp_gradient_sums.size(), "parameter") + " (tp_gradient_sums, the first " +
                          quoted_text(out.tp_gradient_sums.front()) + ") whole on " + axis() + " compute on each rank's slice of the "
                          "batch or sequence with no style holding them: each rank's gradient is its slice's share; sum them "
                          "over " + axis() + " (all_reduce) before the optimizer step");
  }
};

}  // namespace detail

/// Reads a plan's tensor-parallel axis as one target's module styles. Throws spec_error for an
/// axis the mesh lacks or a transformers release other than 4 or 5; what the target cannot
/// express is listed in problems.
inline tp_export export_tensor_parallel(const loaded_plan& p, const export_options& o = {}) {
  tp_export out;
  out.mesh = p.mesh();
  out.options = o;
  if (p.document.pipeline)  // the tp_plan and DTensor layouts place a whole model on one mesh
    throw spec_error("the plan is pipelined (" + count_noun(p.document.pipeline->stages.size(), "stage") +
                     "): a tensor-parallel plan or DTensor layout places the whole model on one mesh; export it "
                     "--to megatron");
  out.tp_axis = o.tp_axis >= 0 ? o.tp_axis : detail::default_tp_axis(p.mesh());
  if (out.tp_axis < 0) throw spec_error("the plan's mesh " + to_string(p.mesh()) + " has no axis of more than one rank to export");
  if (out.tp_axis >= static_cast<int>(p.mesh().ndim()))
    throw spec_error("mesh axis " + std::to_string(out.tp_axis) + " is outside the plan's mesh " + to_string(p.mesh()));
  if (o.transformers_major != 4 && o.transformers_major != 5)
    throw spec_error("transformers " + std::to_string(o.transformers_major) + ": the hf export writes the vocabulary of "
                     "transformers 5 (the current release) or 4 (the previous one)");
  detail::tp_walk w(p, out);
  w.run();
  return out;
}

namespace detail {
/// The most of a refused export's problems its message lists, one a line: a 512-layer plan
/// exported over the wrong mesh axis listed all 10,755 (2.5 MB of stderr; 4,096 layers, 20 MB).
inline constexpr std::size_t max_listed_export_problems = 20;

inline void throw_if_problems(const tp_export& e, const std::string& target) {
  if (e.problems.empty()) return;
  std::string msg = "the plan cannot be written as " + target + ": " + count_noun(e.problems.size(), "operator") +
                    " it cannot express:";
  for (std::size_t i = 0; i < e.problems.size() && i < max_listed_export_problems; ++i) msg += "\n  " + e.problems[i];
  if (e.problems.size() > max_listed_export_problems)
    msg += "\n  ... and " + std::to_string(e.problems.size() - max_listed_export_problems) + " more (the first " +
           std::to_string(max_listed_export_problems) + " are listed)";
  throw spec_error(msg);
}
inline nlohmann::json mesh_json(const tp_export& e) {
  nlohmann::json shape = nlohmann::json::array(), names = nlohmann::json::array();
  for (std::size_t a = 0; a < e.mesh.ndim(); ++a) {
    shape.push_back(e.mesh.size(a));
    names.push_back(e.mesh.axis_name(a).empty() ? (static_cast<int>(a) == e.tp_axis ? std::string("tp") : "dim" + std::to_string(a))
                                                : std::string(e.mesh.axis_name(a)));
  }
  return {{"mesh", to_string(e.mesh)},
          {"mesh_shape", shape},
          {"mesh_dim_names", names},
          {"tp_axis", e.tp_axis},
          {"tp_axis_name", names[static_cast<std::size_t>(e.tp_axis)]},
          {"tp_size", e.mesh.size(static_cast<std::size_t>(e.tp_axis))}};
}
}  // namespace detail

/// PyTorch's parallelize_module plan: {"plan": {module: {"style", "kwargs"}}}; kwargs hold the
/// layouts as PyTorch writes them ("Shard(-1)"), for ColwiseParallel(**kwargs) and friends.
inline nlohmann::json to_dtensor_plan(const tp_export& e) {
  if (e.options.target != export_target::dtensor) throw spec_error("to_dtensor_plan needs an export made for the dtensor target");
  detail::throw_if_problems(e, "a PyTorch parallelize_module plan");
  nlohmann::json plan = nlohmann::json::object(), meshes = nlohmann::json::object();
  for (const tp_module& m : e.modules) {
    plan[m.module] = {{"style", m.style}, {"kwargs", m.kwargs}};
    if (!m.mesh.empty()) plan[m.module]["mesh"] = m.mesh;
  }
  for (const auto& [name, ur] : e.meshes) meshes[name] = {{"units", ur.first}, {"replicas", ur.second}};
  nlohmann::json j = detail::mesh_json(e);
  const auto names = [&](const std::vector<int>& axes) {
    nlohmann::json a = nlohmann::json::array();
    for (int x : axes) a.push_back(j["mesh_dim_names"][static_cast<std::size_t>(x)]);
    return a;
  };
  nlohmann::json fsdp = nullptr;
  if (e.fsdp) {
    nlohmann::json units = nlohmann::json::array();
    for (const fsdp_unit& u : e.fsdp->units)
      units.push_back({{"module", u.module}, {"shard_axes", names(u.shard_axes)}, {"replicate_axes", names(u.replicate_axes)}});
    fsdp = {{"units", units}, {"reshard_after_forward", true}, {"shard_dims", e.fsdp->shard_dims},
            {"ignored_params", e.fsdp->ignored}, {"other_storage", e.fsdp->other_storage},
            {"gradient_divide_factor", e.fsdp->gradient_divide_factor}};
  }
  j.update({{"format", "autoshard.dtensor_plan"}, {"version", 5}, {"plan", plan}, {"meshes", meshes}, {"tied", e.tied},
            {"data_parallel_axes", names(e.data_parallel_axes)},
            {"attributes", e.attributes}, {"loss_parallel", e.loss_parallel}, {"fixed_inputs", e.fixed_inputs},
            {"fsdp", fsdp}, {"tp_gradient_sums", e.tp_gradient_sums}, {"notes", e.notes}});
  return j;
}

/// transformers' tp_plan: {"tp_plan": {key: style}} with the model's module names, layer
/// numbers as `*` (the only keys transformers matches), every linear and embedding named
/// ("replicate" where the plan keeps it whole, so that a model class's own plan cannot change
/// it when transformers merges the two), and the same without the base model's prefix
/// ("base_model_tp_plan", for a config). Layers that differ are a problem: no key says them.
inline nlohmann::json to_hf_tp_plan(const tp_export& e) {
  if (e.options.target != export_target::hf) throw spec_error("to_hf_tp_plan needs an export made for the hf target");
  tp_export checked = e;
  std::map<std::string, std::string> by_key, first_module;
  std::vector<std::string> order;
  for (const tp_module& m : e.modules) {
    const std::string k = detail::layer_wildcard(m.module);
    auto [it, fresh] = by_key.emplace(k, m.style);
    if (fresh) {
      order.push_back(k);
      first_module[k] = m.module;
    } else if (it->second != m.style) {
      checked.problems.push_back(quoted_text(m.module) + " (" + m.style + ") and " + quoted_text(first_module[k]) + " (" + it->second +
                                 "): the plan treats layers of " + quoted_text(k) + " differently, and transformers matches only that key (a key per "
                                 "layer matches nothing)");
      it->second = m.style;  // reported once per layer that differs
    }
  }
  detail::throw_if_problems(checked, "a transformers " + std::to_string(e.options.transformers_major) + " tp_plan");
  nlohmann::json plan = nlohmann::json::object();
  for (const std::string& k : order) plan[k] = by_key[k];
  // The base model: the first component every layered key shares ("model." in "model.layers.*").
  std::string prefix;
  bool first = true;
  for (const std::string& k : order) {
    const std::size_t star = k.find('*'), dot = k.find('.');
    if (star == std::string::npos) continue;
    const std::string head = dot < star ? k.substr(0, dot + 1) : std::string();
    if (first) prefix = head;
    else if (head != prefix) prefix.clear();
    first = false;
  }
  nlohmann::json base = nlohmann::json::object();
  for (const std::string& k : order)
    if (!prefix.empty() && k.rfind(prefix, 0) == 0) base[k.substr(prefix.size())] = by_key[k];
  nlohmann::json j = detail::mesh_json(e);
  j.update({{"format", "autoshard.hf_tp_plan"},
            {"version", 2},
            {"transformers", e.options.transformers_major},
            {"tp_plan", plan},
            {"base_model_prefix", prefix.empty() ? "" : prefix.substr(0, prefix.size() - 1)},
            {"base_model_tp_plan", base},
            {"notes", e.notes}});
  return j;
}

}  // namespace autoshard
