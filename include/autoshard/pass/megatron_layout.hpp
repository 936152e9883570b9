#pragma once
/// Megatron-LM's layout, operator by operator (Shoeybi et al. 2019; Megatron-LM's
/// ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding and
/// vocab_parallel_cross_entropy): which operators it names and what it does with each on its
/// tensor-parallel mesh axis (megatron_tp_rule) and on the data-parallel ones
/// (megatron_dp_rule). The one home of those rules: the megatron baseline offers only the
/// strategies they accept (allows, autosharding.hpp) and export_megatron refuses a plan whose
/// strategies they do not, quoting what Megatron-LM does instead.
///   const autoshard::detail::vocab_operators vo = autoshard::detail::vocab_operators_of(g);
///   const char* why = autoshard::detail::megatron_tp_rule(g, v, operands(g, v), s, tp, n, false, vo, batch);
///   if (why) ...;  // "Megatron-LM's RowParallelLinear takes its input split on the last dim ..."
#include <algorithm>  // std::find, std::max_element
#include <cstddef>    // std::size_t
#include <cstdint>    // std::int64_t
#include <optional>   // std::optional
#include <string>     // std::string
#include <vector>     // std::vector

#include "../core/error.hpp"     // solver_error, quoted_text
#include "../core/layout.hpp"    // split_range, padded_piece
#include "../core/mesh.hpp"      // device_mesh
#include "../graph/model.hpp"    // model_graph, operands, is_unary_elementwise
#include "../graph/strategy.hpp" // strategy

namespace autoshard::detail {

inline bool ends_with(const std::string& s, const char* suf) {
  const std::string t(suf);
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

/// Whether column-parallel linear `n` is the attention's query, key or value (Megatron-LM's
/// linear_qkv, whose bias --add-qkv-bias keeps).
inline bool megatron_qkv(const std::string& n) {
  for (const char* s : {".attn.c_attn", ".attention.self.query", ".attention.self.key", ".attention.self.value", ".q_proj",
                        ".k_proj", ".v_proj"})
    if (ends_with(n, s)) return true;
  return false;
}
/// Whether linear `n` (by its Hugging Face name) is a block linear Megatron-LM makes
/// column-parallel: query/key/value (fused or not) and the MLP's first projections.
inline bool megatron_column(const std::string& n) {
  if (megatron_qkv(n)) return true;
  for (const char* s : {".mlp.c_fc", ".intermediate.dense", ".gate_proj", ".up_proj"})  // the MLP's first projections
    if (ends_with(n, s)) return true;
  return false;
}
/// Whether linear `n` is one Megatron-LM makes row-parallel: the attention output and the
/// MLP's last projection.
inline bool megatron_row(const std::string& n) {
  for (const char* s : {".attn.c_proj", ".mlp.c_proj", ".output.dense", ".o_proj", ".down_proj"})
    if (ends_with(n, s)) return true;
  return false;
}

/// The vocabulary's operators of a model, as Megatron-LM lays them out on its tensor-parallel
/// ranks (megatron_tp_rule): the token (word) embedding, VocabParallelEmbedding; the output layer
/// over the vocabulary, a ColumnParallelLinear (tied: it reads the embedding's table); and the
/// loss of its logits, vocab_parallel_cross_entropy. A model may lack any of them: an encoder
/// has no head, an inference graph no loss.
struct vocab_operators {
  std::optional<vertex_t> embedding;  ///< the word embedding (an embedding operator)
  std::optional<vertex_t> head;       ///< the output layer (a linear whose outputs are the vocabulary)
  std::optional<vertex_t> loss;       ///< the cross-entropy of the head's logits
  std::int64_t vocab = 0;             ///< the word embedding's table's rows (0: none)
  bool tied = false;                  ///< the head reads the word embedding's table
};

/// Which operators of `g` those are, the one home of the test (export_megatron's model reads
/// its vocabulary from it too):
///   head: the linear whose output is the cross-entropy's logits, or, without a loss
///         (inference), a linear that reads an embedding's table (tied) or one no operator
///         consumes whose output is as wide as an embedding's table has rows;
///   word embedding: the embedding whose table the head reads, or whose table has as many rows
///         as the head has outputs. A head that matches none (a classifier's) is no vocabulary
///         head, and a loss of it no vocabulary loss. Without a head: the first embedding whose
///         indices are not one row of positions shared by the batch ([1, s]: GPT-2's wpe, BERT's
///         position_embeddings), else the one of the most rows.
inline vocab_operators vocab_operators_of(const model_graph& g) {
  vocab_operators vo;
  std::vector<vertex_t> embeddings, linears;
  std::optional<vertex_t> loss;
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
    if (g[v].kind == op_kind::embedding && operands(g, v).size() == 2) embeddings.push_back(v);
    if (g[v].kind == op_kind::linear && operands(g, v).size() >= 2 && g[v].shape.rank >= 1) linears.push_back(v);
    if (g[v].kind == op_kind::cross_entropy && !loss) loss = v;
  }
  const auto table = [&g](vertex_t e) { return operands(g, e)[1]; };
  const auto rows = [&](vertex_t e) { return g[table(e)].shape.rank >= 1 ? g[table(e)].shape[0] : std::int64_t{-1}; };
  const auto width = [&g](vertex_t v) { return g[v].shape[g[v].shape.rank - 1u]; };
  const auto word_of = [&](vertex_t head) -> std::optional<vertex_t> {  // the head's embedding (vo.tied: it reads its table)
    for (vertex_t e : embeddings)
      if (operands(g, head)[1] == table(e)) {
        vo.tied = true;
        return e;
      }
    for (vertex_t e : embeddings)
      if (rows(e) == width(head)) return e;
    return std::nullopt;
  };
  std::vector<vertex_t> heads;  // the candidates, best first
  if (loss) {
    const vertex_t logits = operands(g, *loss)[0];
    if (std::find(linears.begin(), linears.end(), logits) != linears.end()) heads.push_back(logits);
  } else {
    for (vertex_t v : linears)
      for (vertex_t e : embeddings)
        if (operands(g, v)[1] == table(e)) heads.push_back(v);
    for (vertex_t v : linears)
      if (boost::out_degree(v, g) == 0) heads.push_back(v);
  }
  for (vertex_t h : heads)
    if ((vo.embedding = word_of(h))) {
      vo.head = h;
      if (loss) vo.loss = loss;
      break;
    }
  if (!vo.embedding && !embeddings.empty()) {
    for (vertex_t e : embeddings) {
      const tensor_shape& ids = g[operands(g, e)[0]].shape;
      if (!(ids.rank >= 2 && ids[0] == 1)) {
        vo.embedding = e;
        break;
      }
    }
    if (!vo.embedding)
      vo.embedding = *std::max_element(embeddings.begin(), embeddings.end(), [&](vertex_t a, vertex_t b) { return rows(a) < rows(b); });
  }
  if (vo.embedding) vo.vocab = rows(*vo.embedding);
  return vo;
}

inline bool dp_ok(const placement& p, bool allow_partial) {
  return p.is_replicate() || p.is_shard(0) || (allow_partial && p.is_partial());
}

/// Megatron-LM splits whole attention heads over the tensor-parallel axis `tp_axis` (-1: none): a
/// head count its ranks do not divide is refused (Qwen2-0.5B's 14 heads on 4 ranks would cut
/// q_proj at 3.5 heads). Key/value heads fewer than the ranks, a count the ranks are a multiple
/// of, are replicated, as vLLM and Megatron-LM do: their projections (and the operators between
/// them and the attention) stay whole on every rank. Returns those vertices (operators and
/// their parameters); throws solver_error for a count neither divides. The head counts are the
/// graph's at any batch: search_algo asks once, before it prices any micro-batching.
inline std::vector<char> megatron_kv_whole(const model_graph& g, const device_mesh& mesh, int tp_axis) {
  const std::size_t size = boost::num_vertices(g);
  std::vector<char> whole(size, 0);
  if (tp_axis < 0) return whole;
  const auto tp = static_cast<std::size_t>(tp_axis);
  const int n = mesh.size(tp);
  for (vertex_t v = 0; v < size; ++v) {
    const node& nd = g[v];
    if (nd.kind != op_kind::attention) continue;
    const int heads = nd.attrs.heads, kv = nd.attrs.kv_heads > 0 ? nd.attrs.kv_heads : heads;
    const std::string where = "megatron: " + quoted_text(nd.name) + " has ";
    if (heads % n != 0)
      throw solver_error(where + std::to_string(heads) + " attention heads, which the " + std::to_string(n) + " ranks of " +
                         mesh.axis_label(tp) + " do not divide: Megatron-LM splits whole heads (" +
                         std::to_string(heads) + "/" + std::to_string(n) + " per rank would cut one)");
    if (kv % n == 0) continue;
    if (n % kv != 0)
      throw solver_error(where + std::to_string(kv) + " key/value heads, which the " + std::to_string(n) + " ranks of " +
                         mesh.axis_label(tp) + " neither divide nor replicate evenly (a multiple of them)");
    const std::vector<vertex_t> ops = operands(g, v);
    for (std::size_t i = 1; i < ops.size(); ++i)
      for (vertex_t u = ops[i]; g[u].is_operator();) {
        whole[u] = 1;
        const std::vector<vertex_t> in = operands(g, u);
        if (g[u].kind == op_kind::linear) {
          for (std::size_t j = 1; j < in.size(); ++j) whole[in[j]] = 1;
          break;
        }
        if (!is_unary_elementwise(g[u].kind) || in.empty()) break;
        u = in[0];
      }
  }
  return whole;
}


/// The vocabulary operators megatron lays out on the tensor-parallel axis `tp_axis` (-1: none;
/// megatron_tp_rule), after checking that the vocabulary splits over its ranks. An uneven split is
/// the split rule's (DESIGN.md: ceil(V / tp) rows a rank, the last short), priced at its padded
/// piece as Megatron-LM's --make-vocab-size-divisible-by pads the vocabulary; a split that leaves
/// a rank no rows the strategies do not offer, and is refused naming the numbers rather than
/// laid out some other way. Like megatron_kv_whole, search_algo asks once, before any pricing.
inline vocab_operators megatron_vocab(const model_graph& g, const device_mesh& mesh, int tp_axis) {
  vocab_operators vo = vocab_operators_of(g);
  if (tp_axis < 0 || !vo.embedding) return vo;
  const auto tp = static_cast<std::size_t>(tp_axis);
  const int n = mesh.size(tp);
  if (n > 1 && split_range(vo.vocab, n, n - 1).size == 0)
    throw solver_error("megatron: the vocabulary of " + std::to_string(vo.vocab) + " rows of " + quoted_text(g[*vo.embedding].name) +
                       " does not split over the " + std::to_string(n) + " ranks of " + mesh.axis_label(tp) + ": " +
                       std::to_string(padded_piece(vo.vocab, n)) + " rows a rank leave the last none (Megatron-LM pads the " +
                       "vocabulary to a multiple of the tensor-parallel size, --make-vocab-size-divisible-by)");
  return vo;
}

/// Data parallelism on mesh axis `a`: a parameter replicated, an activation split on its
/// batch dim or replicated (a scalar may be Partial), every operand taken likewise.
inline bool data_parallel_axis(const model_graph& g, vertex_t v, const std::vector<vertex_t>& ops, const strategy& s,
                               std::size_t a) {
  const node& nd = g[v];
  if (nd.is_parameter()) return s.output[a].is_replicate();
  if (!dp_ok(s.output[a], nd.shape.rank == 0)) return false;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (g[ops[i]].is_parameter() ? !s.inputs[i][a].is_replicate() : !dp_ok(s.inputs[i][a], false)) return false;
  }
  return true;
}

/// Whether strategy `s` runs sequence parallel on mesh axis `tp`: its output split on the
/// sequence (dim 1 of the layers' [batch, sequence, hidden] activations).
inline bool runs_sequence_parallel(const strategy& s, std::size_t tp) { return s.output[tp].is_shard(1); }

/// What Megatron-LM does with the operators it names, as megatron_tp_rule and megatron_dp_rule
/// quote it when a strategy does otherwise.
namespace megatron_does {
inline constexpr const char* kv_whole =
    "Megatron-LM keeps the key/value projections of fewer heads than tensor-parallel ranks whole on every rank";
inline constexpr const char* word_table = "Megatron-LM's VocabParallelEmbedding stores its table split on the vocabulary (dim 0)";
inline constexpr const char* other_table =
    "Megatron-LM keeps the tables of the embeddings other than the word one (positions, token types) whole on every "
    "tensor-parallel rank";
inline constexpr const char* norm_weight = "Megatron-LM keeps the norms' weights whole on every tensor-parallel rank";
inline constexpr const char* column_weight =
    "Megatron-LM's ColumnParallelLinear stores its weight split on the output dim and its bias split";
inline constexpr const char* head_weight =
    "Megatron-LM's output layer, column-parallel over the vocabulary, stores its weight split on the vocabulary";
inline constexpr const char* row_weight =
    "Megatron-LM's RowParallelLinear stores its weight split on the input dim and its bias whole (added once, after the "
    "reduction)";
inline constexpr const char* column =
    "Megatron-LM's ColumnParallelLinear takes its input whole and its weight split on the output dim, and gives its output "
    "split on the last dim";
inline constexpr const char* head =
    "Megatron-LM's output layer is column-parallel over the vocabulary: its input whole, its weight split on the "
    "vocabulary, the logits split on the last dim";
inline constexpr const char* row =
    "Megatron-LM's RowParallelLinear takes its input split on the last dim and its weight on the input dim, and gives a "
    "partial sum (all-reduced, or reduce-scattered onto the sequence under sequence parallelism)";
inline constexpr const char* word_embedding =
    "Megatron-LM's VocabParallelEmbedding looks the ids up whole in its table split on the vocabulary and gives a partial "
    "sum";
inline constexpr const char* loss =
    "Megatron-LM's vocab_parallel_cross_entropy takes the logits split on the vocabulary and the labels whole, and gives "
    "the loss whole";
inline constexpr const char* attention = "Megatron-LM splits the attention core over its heads";
inline constexpr const char* batch_on_tp =
    "Megatron-LM splits the batch over the data-parallel ranks only (sequence parallelism splits the sequence)";
inline constexpr const char* norm =
    "Megatron-LM runs the norms whole on every tensor-parallel rank, or split on the sequence under sequence parallelism";
inline constexpr const char* data_parallel =
    "Megatron-LM keeps every parameter whole on a data-parallel axis and splits the activations on the batch only";
inline constexpr const char* batch_split = "Megatron-LM splits the batch over every data-parallel rank";
inline constexpr const char* zero1 =
    "Megatron-LM's distributed optimizer shards the optimizer state over the data-parallel ranks only";
}  // namespace megatron_does

/// Whether `v` is a norm (layer_norm or rms_norm), in a layer or not (GPT-2's ln_f).
inline bool is_norm(const model_graph& g, vertex_t v) {
  return g[v].kind == op_kind::layer_norm || g[v].kind == op_kind::rms_norm;
}

/// What Megatron-LM does on its tensor-parallel mesh axis `tp` (of `n` ranks) with vertex `v`
/// (operands `ops`) where strategy `s` does otherwise (a megatron_does text), or nullptr where s
/// agrees. `kv_whole`: v is a key/value projection (or its parameter) Megatron-LM keeps whole
/// (megatron_kv_whole); `vo`: the model's vocabulary operators (vocab_operators_of); `batch`:
/// the graph's (graph_batch). The rules:
///   - the block linears column-parallel (megatron_column: query/key/value, the MLP's first
///     projections; and the output layer over the vocabulary) or row-parallel (megatron_row:
///     the attention output, the MLP's last projection), their weights and biases stored the
///     way they take them (a row-parallel bias whole);
///   - the word embedding vocab-parallel (its table split on the vocabulary, dim 0; the ids
///     whole; the output a partial sum, all-reduced or reduce-scattered onto sequence slices by
///     its consumer), every other embedding's table (positions, token types) whole, as
///     Megatron-LM's plain torch.nn.Embedding keeps it;
///   - the loss vocab-parallel (the logits split on the vocabulary, the labels and loss whole);
///   - the attention core split over its heads (when the axis has more than one rank);
///   - no activation split on the batch (the data-parallel axes split it);
///   - the norms whole or split on the sequence (sequence parallelism), their weights whole.
inline const char* megatron_tp_rule(const model_graph& g, vertex_t v, const std::vector<vertex_t>& ops, const strategy& s,
                                    std::size_t tp, int n, bool kv_whole, const vocab_operators& vo,
                                    std::int64_t batch) {
  const node& nd = g[v];
  const auto is = [](const std::optional<vertex_t>& o, vertex_t u) { return o && *o == u; };
  const auto column = [&](vertex_t u) { return g[u].kind == op_kind::linear && (megatron_column(g[u].name) || is(vo.head, u)); };
  const auto row = [&](vertex_t u) { return g[u].kind == op_kind::linear && megatron_row(g[u].name); };
  if (kv_whole) {
    bool whole = s.output[tp].is_replicate();
    for (const sharding_spec& in : s.inputs) whole = whole && in[tp].is_replicate();
    return whole ? nullptr : megatron_does::kv_whole;
  }
  if (nd.is_parameter()) {
    // A weight or bias of a Megatron linear is stored the way that linear takes it on the
    // tensor-parallel axis (sharded), not replicated and sliced on use: the time is the
    // same, but a replicated copy wastes memory and `shard --plan` would write it whole.
    // Likewise an embedding's table (the word embedding's split, the others' whole) and a
    // norm's weight (whole).
    for (auto [e, end] = boost::out_edges(v, g); e != end; ++e) {
      const vertex_t u = boost::target(*e, g);
      const node& use = g[u];
      const int i = g[*e].operand;
      if (use.kind == op_kind::embedding && i == 1) {
        if (is(vo.embedding, u) ? !s.output[tp].is_shard(0) : !s.output[tp].is_replicate())
          return is(vo.embedding, u) ? megatron_does::word_table : megatron_does::other_table;
        continue;
      }
      if (is_norm(g, u) && i >= 1) {
        if (!s.output[tp].is_replicate()) return megatron_does::norm_weight;
        continue;
      }
      if (!column(u) && !row(u)) continue;
      const int out_dim = use.attrs.transposed_weight ? 1 : 0;
      const placement want = i == 1 ? Shard(column(u) ? out_dim : 1 - out_dim)
                                    : (column(u) ? placement(Shard(0)) : placement(Replicate()));
      if (s.output[tp] != want)
        return is(vo.head, u) ? megatron_does::head_weight : column(u) ? megatron_does::column_weight : megatron_does::row_weight;
    }
    return nullptr;
  }
  if (column(v) || row(v)) {
    const bool tw = nd.attrs.transposed_weight;
    const int out_dim = tw ? 1 : 0, in_dim = tw ? 0 : 1;
    const int last = static_cast<int>(nd.shape.rank) - 1;
    if (column(v))
      return s.inputs[1][tp].is_shard(out_dim) && s.inputs[0][tp].is_replicate() && s.output[tp].is_shard(last)
                 ? nullptr
                 : (is(vo.head, v) ? megatron_does::head : megatron_does::column);
    return s.inputs[1][tp].is_shard(in_dim) && s.inputs[0][tp].is_shard(static_cast<int>(g[ops[0]].shape.rank) - 1) &&
                   s.output[tp].is_partial()
               ? nullptr
               : megatron_does::row;
  }
  if (nd.kind == op_kind::embedding && ops.size() == 2) {
    if (is(vo.embedding, v))
      return s.inputs[0][tp].is_replicate() && s.inputs[1][tp].is_shard(0) && s.output[tp].is_partial() ? nullptr
                                                                                                       : megatron_does::word_embedding;
    if (!s.inputs[1][tp].is_replicate()) return megatron_does::other_table;
  }
  if (is(vo.loss, v))
    return s.inputs[0][tp].is_shard(static_cast<int>(g[ops[0]].shape.rank) - 1) && s.inputs[1][tp].is_replicate() &&
                   s.output[tp].is_replicate()
               ? nullptr
               : megatron_does::loss;
  if (n > 1 && nd.kind == op_kind::attention && !s.inputs[0][tp].is_shard(2)) return megatron_does::attention;
  // Megatron-LM's sequence parallelism splits the sequence over the tensor-parallel ranks,
  // never the batch (which the data-parallel ranks split).
  if (n > 1 && nd.shape.rank >= 1 && nd.shape[0] == batch && s.output[tp].is_shard(0)) return megatron_does::batch_on_tp;
  if (is_norm(g, v) && !s.output[tp].is_replicate() && !s.output[tp].is_shard(1)) return megatron_does::norm;
  return nullptr;
}

/// What Megatron-LM does on a data-parallel mesh axis `a` (of `n` ranks) with vertex `v`
/// (operands `ops`) where strategy `s` does otherwise, or nullptr where s agrees: each parameter
/// whole, each activation split on its batch dim or whole (data_parallel_axis), and an
/// activation of the batch (`batch`: graph_batch) split on it where the axis has more than one
/// rank. An opaque operator can only be whole (an exported model's arange over the batch, for
/// its mask): each rank computes it, as each Megatron-LM rank computes it on its own batch.
inline const char* megatron_dp_rule(const model_graph& g, vertex_t v, const std::vector<vertex_t>& ops, const strategy& s,
                                    std::size_t a, int n, std::int64_t batch) {
  const node& nd = g[v];
  if (!data_parallel_axis(g, v, ops, s, a)) return megatron_does::data_parallel;
  const bool opaque_whole = nd.kind == op_kind::opaque && !nd.attrs.elementwise;
  const bool batch_tensor = nd.shape.rank >= 1 && nd.shape[0] == batch;
  if (n > 1 && batch_tensor && !nd.is_parameter() && !opaque_whole && !s.output[a].is_shard(0)) return megatron_does::batch_split;
  return nullptr;
}

/// What Megatron-LM's distributed optimizer does where strategy `s` (ZeRO-1) shards the
/// optimizer state over the tensor-parallel mesh axis `tp_axis` (-1: none) too, or nullptr:
/// it shards over the data-parallel ranks only, so a weight whole on tp (a norm's, a
/// row-parallel bias) keeps its state whole.
inline const char* megatron_zero1_rule(const strategy& s, int tp_axis) {
  if (s.zero_stage != 1 || tp_axis < 0) return nullptr;
  const auto tp = static_cast<std::size_t>(tp_axis);
  return s.gradient_spec[tp] == s.output[tp] ? nullptr : megatron_does::zero1;
}

}  // namespace autoshard::detail
