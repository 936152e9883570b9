#pragma once
/// What the ONNX importer takes and gives (onnx_options, onnx_import, onnx_opaque), and its
/// reader (detail): the model, its values, the graph being built and the small accessors
/// every phase uses. Its phases live in one file each, in the order
/// read_onnx (onnx.hpp) runs them: read.hpp (bounds, parse, order, shape inference, the
/// values), shapes.hpp (shape computations folded into constants; what is data),
/// constants.hpp (values computed from constants alone, and their evaluation), fusions.hpp
/// (patterns of several nodes that are one kind) with attention.hpp (the attention's), emit.hpp
/// (the vertices, and build()).
#include <algorithm>      // std::find, std::min, std::max
#include <cctype>         // std::isalnum
#include <charconv>       // std::to_chars, std::from_chars (as_written)
#include <cmath>          // std::abs, std::sqrt
#include <cstdint>        // std::int64_t
#include <cstdio>         // std::snprintf
#include <cstring>        // std::memcpy
#include <functional>     // std::greater
#include <map>            // std::map
#include <optional>       // std::optional
#include <queue>          // std::priority_queue (sort_nodes)
#include <set>            // std::set
#include <string>         // std::string
#include <string_view>    // std::string_view
#include <tuple>          // std::tuple (memo keys)
#include <unordered_map>  // std::unordered_map
#include <utility>        // std::pair, std::move
#include <vector>         // std::vector

// <sys/mman.h> (the tensor area maps checkpoints) defines MAP_TYPE, which ONNX's parser.h
// uses as an enumerator: hidden while ONNX's headers are read, so any include order works.
#pragma push_macro("MAP_TYPE")
#undef MAP_TYPE
#include <onnx/onnx_pb.h>                          // onnx::ModelProto (protobuf)
#include <onnx/shape_inference/implementation.h>  // onnx::shape_inference::InferShapes
#include <google/protobuf/unknown_field_set.h>    // google::protobuf::UnknownFieldSet (metadata)
#pragma pop_macro("MAP_TYPE")

#include "../core/checked.hpp"    // checked_bytes
#include "../core/error.hpp"      // graph_error, io_error, resource_error, quoted_text
#include "../core/machine.hpp"    // machine_limits (check_parse_memory)
#include "../graph/model.hpp"     // model_graph, add_op, add_parameter, add_input
#include "../graph/validate.hpp"  // validate, max_graph_tensor_bytes
#include "../io/json.hpp"         // read_regular_file

namespace autoshard {


/// How an ONNX file is read.
struct onnx_options {
  std::uint64_t max_file_bytes = (std::uint64_t{1} << 31) - 1;  ///< protobuf's own limit is 2 GiB
  std::int64_t max_nodes = std::int64_t{1} << 20;                ///< nodes, initializers, inputs, outputs each
  std::int64_t batch = 0;  ///< size of a symbolic dim 0 of a graph input (0: the model must give it)
  std::int64_t seq = 0;    ///< size of a symbolic dim 1 of a graph input
  /// size of a symbolic dim 2 of a rank-4 graph input: a key/value cache's past P in
  /// transformers' layout [B, kv_heads, P, D] (`plan --kv-cache P`)
  std::int64_t past = 0;
  std::map<std::string, std::int64_t> dims;  ///< symbolic dim name -> size (before batch / seq)
  std::optional<dtype> float_type;           ///< every floating tensor in this dtype (default: the model's)
};

/// An operator that became an opaque vertex: only Replicate strategies, no kernel.
struct onnx_opaque {
  std::string node;     ///< the vertex's name (the ONNX node's, or its output's when it has none)
  std::string op_type;  ///< "NonMaxSuppression", "com.example.FancyNorm"
  std::string why;      ///< "no mapping", or what the mapping could not express
};

/// The imported graph and what the import could not map.
struct onnx_import {
  model_graph graph;
  std::vector<onnx_opaque> opaque;
  std::int64_t opset = 0;  ///< of the default domain
  std::string producer;    ///< producer_name and version ("pytorch 2.1.0")
  /// Whether onnx_options::batch (seq) applies: it sized a symbolic dim 0 (1) of a graph input,
  /// or one has it as its fixed size. A caller whose size the model has no place for says so
  /// (`plan --batch 7` of a model whose inputs are fixed [4,8] planned batch 4 without a word).
  bool batch_used = false, seq_used = false;
  bool past_used = false;  ///< onnx_options::past sized a symbolic dim 2 of a rank-4 graph input, or one has it there
  /// The graph outputs that are a layer's key/value cache written back (present.<i>.key: the
  /// past concatenated with the step's new keys, read by its attention): not outputs of the
  /// graph, whose attention reads the past as its kv_cache operands (as the builders' decode
  /// steps do; the runtime appends the step's keys and values to its cache).
  std::vector<std::string> cache_outputs;
};

namespace detail::onnx_in {

/// The largest size of one dim; larger is refused before anything is allocated.
inline constexpr std::int64_t max_dim = std::int64_t{1} << 40;

inline std::optional<dtype> to_dtype(std::int32_t t) {
  using T = onnx::TensorProto;
  switch (t) {
    case T::FLOAT: return dtype::f32;
    case T::FLOAT16: return dtype::f16;
    case T::BFLOAT16: return dtype::bf16;
    case T::DOUBLE: return dtype::f64;
    case T::INT32: return dtype::i32;
    case T::INT64: return dtype::i64;
    case T::UINT8: return dtype::u8;
    case T::BOOL: return dtype::boolean;
    case T::INT8: return dtype::u8;  // the same size: what the cost model needs
    case T::UINT32: return dtype::i32;
    case T::UINT64: return dtype::i64;
    default: return std::nullopt;
  }
}
inline bool is_float(dtype t) { return t == dtype::f32 || t == dtype::f16 || t == dtype::bf16 || t == dtype::f64; }

/// One value of the graph: its type after shape inference, and where it comes from.
struct value_info {
  bool known = false;  ///< an element type and a shape with every dim a number
  std::string unknown_why;
  tensor_shape shape;
  dtype type = dtype::f32;
  const onnx::TensorProto* init = nullptr;  ///< an initializer or a Constant node's tensor
  int producer = -1;                        ///< node index, or -1 for inputs and initializers
  bool graph_input = false;
  std::vector<int> consumers;  ///< node indices (a node reading it twice is listed twice)
  bool graph_output = false;
};

/// A value computed from constants alone, evaluated (constants.hpp): its shape, type and
/// elements in row-major order, read as doubles (positions, counts and the fills of masks are
/// exact); booleans (a mask) are held in a byte each.
struct dense_value {
  tensor_shape shape;
  dtype type = dtype::f32;
  std::vector<double> v;            ///< the elements, unless booleans
  std::vector<std::uint8_t> bits;   ///< the elements of a boolean value, 0 or 1
  bool packed() const noexcept { return type == dtype::boolean; }
  std::size_t size() const noexcept { return packed() ? bits.size() : v.size(); }
  double operator[](std::size_t i) const { return packed() ? bits[i] : v[i]; }
  void push_back(double x) {
    if (packed()) bits.push_back(x != 0.0);
    else v.push_back(x);
  }
  void resize(std::size_t n) {
    if (packed()) bits.resize(n);
    else v.resize(n);
  }
  void set(std::size_t i, double x) {
    if (packed()) bits[i] = x != 0.0;
    else v[i] = x;
  }
  /// Appends elements [from, from + n) of `a`.
  void append(const dense_value& a, std::size_t from, std::size_t n) {
    for (std::size_t k = 0; k < n; ++k) push_back(a[from + k]);
  }
  /// Bytes an element of type `t` takes here.
  static std::uint64_t element_bytes(dtype t) noexcept { return t == dtype::boolean ? 1 : sizeof(double); }
};

struct reader {
  onnx::ModelProto model;
  const onnx_options& opt;
  std::string source;
  onnx_import out;
  std::unordered_map<std::string, value_info> values;
  std::vector<const onnx::NodeProto*> nodes;  // topological order
  std::unordered_map<std::string, vertex_t> vertex_of;  // value name -> vertex
  std::set<std::string> used_names;
  std::vector<char> needed, absorbed;
  /// Per node (in sorted order): the name its vertices take from the module path torch's
  /// exporter records (scoped_names), or empty for the node's own name (vertex_base).
  std::vector<std::string> scoped;
  std::map<std::string, std::string> weight_names;  ///< initializer -> its parameter's name (name_lifted_weights)
  std::vector<onnx::TensorProto> shape_constants;  // Shape nodes' values, when needed as data
  /// Graph inputs a fused attention reads as its key/value cache (heads_source::past): emitted
  /// as kv_cache inputs [B, P, kv_heads*D] (their values' shapes rewritten to that).
  std::set<std::string> kv_caches;

  reader(const onnx_options& o, std::string src) : opt(o), source(std::move(src)) {}

  [[noreturn]] void fail_io(const std::string& why) const { throw io_error(source + ": " + why); }
  [[noreturn]] void fail(const std::string& why) const { throw graph_error(source + ": " + why); }
  static std::string node_label(const onnx::NodeProto& n, int i) {
    return "node " + std::to_string(i) + " " + quoted_text(n.name()) + " (" + quoted_text(n.op_type()) + ")";
  }

  // ---- bounds on everything the file says, before it is used ---- (read.hpp)
  void check_count(std::int64_t n, const char* what) const;
  tensor_shape checked_shape(const google::protobuf::RepeatedField<std::int64_t>& dims, const std::string& who) const;
  void check_initializer(const onnx::TensorProto& t, const std::string& who) const;
  void check_type(const onnx::TypeProto& t, const std::string& who) const;
  void check_names() const;
  void parse(std::string_view bytes);

  // ---- topological order (Kahn), a cycle or a dangling value is an error; and the nodes'
  // module-path names (scoped_names), which need both the file's order and that one ---- (read.hpp)
  void sort_nodes();
  /// Whether the initializer `name` of rank `rank` is a constant an exporter lifted, not a
  /// weight: 0-d, with a name no module qualifies (torch's dynamo exporter's val_196).
  static bool lifted_constant(const std::string& name, std::size_t rank) {
    return rank == 0 && name.find('.') == std::string::npos;
  }
  static std::vector<std::string> scoped_names(const onnx::GraphProto& g, const std::vector<char>& on_data);
  static std::string metadata(const google::protobuf::Message& m, int field, std::string_view key);
  /// The initializers torch's exporter marks as not trained (mark_buffers): inputs, not parameters.
  std::set<std::string> buffers;
  void mark_buffers();
  std::string vertex_base(int k) const;

  // ---- symbolic dims of the graph inputs get sizes; then ONNX infers the rest ---- (read.hpp)
  void fix_input_dims();
  void infer_shapes();

  // ---- shape computations folded into constants, so that inference sees through them ---- (shapes.hpp)
  /// Shape -> Slice/Gather -> Concat -> Reshape chains (how exporters write views) are
  /// evaluated on the inferred shapes and replaced by Constant nodes; inference runs again
  /// while that settles more shapes (ONNX 1.12's data propagation does not cover Slice, and
  /// crashes on malformed models).
  struct int_value {
    std::vector<std::int64_t> v;
    bool scalar = false;
  };
  std::unordered_map<std::string, tensor_shape> inferred_shapes() const;
  static std::optional<int_value> int_tensor(const onnx::TensorProto& t);
  std::optional<int_value> fold(const onnx::NodeProto& n, int index, const std::unordered_map<std::string, int_value>& known_ints,
                                const std::unordered_map<std::string, tensor_shape>& shapes) const;
  void fold_shape_computations();

  // ---- the values: types, producers, consumers ---- (read.hpp)
  void set_type(value_info& v, const onnx::TypeProto& t, const std::string& name);
  void collect_values();

  // ---- small constants (Slice bounds, pattern scalars) ----
  std::optional<std::vector<double>> constant(const std::string& name, std::int64_t max_count = 64) const {
    auto it = values.find(name);
    if (it == values.end() || !it->second.init) return std::nullopt;
    return elements(*it->second.init, max_count);
  }
  /// The elements of a tensor held in the file, at most `max_count` of them.
  static std::optional<std::vector<double>> elements(const onnx::TensorProto& t, std::int64_t max_count) {
    if (t.data_location() == onnx::TensorProto::EXTERNAL) return std::nullopt;
    std::int64_t n = 1;
    for (std::int64_t d : t.dims()) n *= d;  // bounded by check_initializer
    if (n > max_count) return std::nullopt;
    std::vector<double> v;
    using T = onnx::TensorProto;
    const std::string& raw = t.raw_data();
    auto from_raw = [&](auto tag) {
      using E = decltype(tag);
      if (raw.size() != static_cast<std::size_t>(n) * sizeof(E)) return false;
      for (std::int64_t i = 0; i < n; ++i) {
        E e;
        std::memcpy(&e, raw.data() + static_cast<std::size_t>(i) * sizeof(E), sizeof(E));
        v.push_back(static_cast<double>(e));
      }
      return true;
    };
    const bool has_raw = t.has_raw_data();
    switch (t.data_type()) {
      case T::FLOAT:
        if (has_raw) { if (!from_raw(float{})) return std::nullopt; }
        else for (float f : t.float_data()) v.push_back(f);
        break;
      case T::DOUBLE:
        if (has_raw) { if (!from_raw(double{})) return std::nullopt; }
        else for (double f : t.double_data()) v.push_back(f);
        break;
      case T::INT64:
        if (has_raw) { if (!from_raw(std::int64_t{})) return std::nullopt; }
        else for (std::int64_t f : t.int64_data()) v.push_back(static_cast<double>(f));
        break;
      case T::INT32:
        if (has_raw) { if (!from_raw(std::int32_t{})) return std::nullopt; }
        else for (std::int32_t f : t.int32_data()) v.push_back(f);
        break;
      case T::BOOL:
      case T::UINT8:  // one byte each in raw_data, int32_data otherwise
        if (has_raw) { if (!from_raw(std::uint8_t{})) return std::nullopt; }
        else for (std::int32_t f : t.int32_data()) v.push_back(f);
        break;
      default: return std::nullopt;
    }
    if (static_cast<std::int64_t>(v.size()) != n) return std::nullopt;
    return v;
  }
  std::optional<double> scalar(const std::string& name) const {
    auto v = constant(name, 1);
    if (!v || v->size() != 1) return std::nullopt;
    return (*v)[0];
  }
  static bool near(std::optional<double> v, double want, double tol = 1e-3) { return v && std::abs(*v - want) <= tol * std::max(1.0, std::abs(want)); }

  static const onnx::AttributeProto* attr(const onnx::NodeProto& n, std::string_view name) {
    for (const auto& a : n.attribute())
      if (a.name() == name) return &a;
    return nullptr;
  }
  /// A number the file holds as a float32 (a norm's epsilon: a 0-d initializer, a float
  /// attribute) as its writer gave it: the shortest decimal that reads back as that float32
  /// (torch's eps=1e-5 is stored as 9.99999974737875e-06, and is 1e-05 again), so that the
  /// graph, and what is exported from it (Megatron-LM's --norm-epsilon), says the model's own
  /// number. A value no float32 holds exactly (a double's) as it is.
  static double as_written(double v) {
    const float f = static_cast<float>(v);
    if (!(static_cast<double>(f) == v)) return v;
    char buf[32];
    const auto end = std::to_chars(buf, buf + sizeof buf, f).ptr;
    double d = v;
    std::from_chars(buf, end, d);
    return d;
  }
  /// A norm's epsilon from its pattern's constant (or its attribute): as_written, nullopt where
  /// it is no epsilon autoshard computes with (valid_norm_epsilon: 0, negative, above 1), and the
  /// pattern is then not a norm.
  static std::optional<double> norm_epsilon(std::optional<double> v) {
    if (!v || !valid_norm_epsilon(*v)) return std::nullopt;
    return as_written(*v);
  }
  static std::int64_t attr_int(const onnx::NodeProto& n, std::string_view name, std::int64_t fallback) {
    const auto* a = attr(n, name);
    return a ? a->i() : fallback;
  }
  static std::optional<std::vector<std::int64_t>> attr_ints(const onnx::NodeProto& n, std::string_view name) {
    const auto* a = attr(n, name);
    if (!a) return std::nullopt;
    return std::vector<std::int64_t>(a->ints().begin(), a->ints().end());
  }
  static bool default_domain(const onnx::NodeProto& n) { return n.domain().empty() || n.domain() == "ai.onnx"; }
  static std::string qualified(const onnx::NodeProto& n) {
    return default_domain(n) ? n.op_type() : n.domain() + "." + n.op_type();
  }

  // ---- which nodes compute data (vertices) rather than shapes only ---- (shapes.hpp)
  static std::vector<int> data_inputs(const onnx::NodeProto& n);
  static std::vector<int> iota(int n);
  void mark_needed();

  // ---- values computed from constants alone, and their elements ---- (constants.hpp)
  std::set<std::string> computed_from_constants, computed_with_buffers;
  bool holds_constant(const std::string& name, bool buffers_too) const;
  void mark_constants();
  std::optional<dense_value> evaluate_node(int k, const std::vector<const dense_value*>& in) const;
  std::optional<dense_value> evaluate(const std::string& name, std::uint64_t max_bytes, bool buffers_too = false) const;
  mutable std::map<std::tuple<std::string, bool, std::int64_t>, bool> causal_memo;  ///< evaluates_causal's answers
  mutable std::optional<std::uint64_t> budget_cache;
  bool evaluates_causal(const std::string& v, bool additive, std::int64_t past = 0) const;
  std::uint64_t constant_budget() const;

  // ---- fusions: patterns of several nodes that are one kind ---- (fusions.hpp)
  struct fusion {
    op_kind kind;
    std::vector<std::string> operands;  // value names
    op_attrs attrs;
    std::string name;
    std::string output;
  };
  std::map<int, fusion> fused;  // at the pattern's last node

  std::optional<int> only_consumer(const std::string& v) const;
  int producer(const std::string& v) const;
  bool is_op(int k, std::string_view t) const;
  const onnx::NodeProto& nd(int k) const;
  std::string in_of(int k, int i) const;
  std::string out_of(int k, int i) const;
  std::optional<std::string> other(int k, const std::string& x) const;
  bool is_param_vector(const std::string& v, std::int64_t h) const;
  bool reduces_last(int k, std::int64_t rank) const;
  std::string pattern_name(int k) const;
  void absorb(std::initializer_list<int> ks);
  void fuse_layer_norm(int div);
  std::optional<std::string> scaled_by(int k, double c) const;
  bool fuse_gelu_tail(op_kind kind, const std::string& x, const std::string& f, std::vector<int> body, const std::string& name);
  void fuse_erf_gelu(int erf);
  void fuse_tanh_gelu(int tanh);
  void fuse_silu(int sig);
  void fuse_rms_norm(int mean);

  /// A 2-D floating initializer, or Transpose(perm [1,0]) of one: the weight of a linear.
  struct weight_ref {
    std::string name;
    bool transposed_weight;  // [in,out]
    int transpose_node = -1;
  };
  std::optional<weight_ref> weight_of(const std::string& v) const;
  void fuse_linear(int mm);
  std::string gemm_as_linear(int k, op_attrs& a, std::vector<std::string>& ops) const;
  void fuse_flat_linear(int gemm);
  std::optional<std::pair<std::string, std::int64_t>> heads_of(const std::string& v, const std::vector<std::int64_t>& perm,
                                                               std::size_t uses = 1) const;
  /// An attention operand in heads [B,h,S,hd] traced back to the [B,S,own*hd] value `x` it is
  /// split from (attention.hpp): maybe turned by rotary positions in the heads' layout (a
  /// rotary of x, emitted at node `rotary_at`), maybe with its heads repeated (GQA's repeat_kv).
  struct heads_source {
    std::string x;
    std::int64_t heads = 0;  // as the attention reads them, after a repeat
    std::int64_t own = 0;    // x's
    std::vector<int> nodes;  // from x's split to the operand, the rotary's but its last
    std::optional<fusion> rotary;
    int rotary_at = -1;
    /// A key/value cache: the graph input [B, own, P, hd] (transformers' past_key_values.<i>.key)
    /// concatenated in front of the step's heads on the sequence axis, and that Concat's output
    /// (present.<i>.key, the cache written back); empty without one.
    std::string past, present;
    std::int64_t past_len = 0;
    std::string value() const { return rotary ? rotary->output : x; }  // the attention's operand
  };
  /// `first`: the position of the step's first token (a rotary turns from it); -1: the past of
  /// a cache this operand is concatenated with, 0 without one.
  std::optional<heads_source> heads_source_of(const std::string& v, std::int64_t first = -1) const;
  /// x_rot = Add(Mul(xh, C), Mul(Concat(Neg(Slice(xh, hd/2:)), Slice(xh, :hd/2)), S)): xh, the
  /// frequencies C and S turn by, and the nodes (the Add last); or a partial rotary's
  /// Concat(that turn of Slice(xh, :R), Slice(xh, R:)) with its R (`dims`; the Concat last).
  struct rotary_turn {  ///< a rotary's base, and its explicit frequencies where they are not base^(-2i/D)
    double base = 10000.0;
    std::vector<double> frequencies;
  };
  struct rotary_match {
    std::string xh;
    rotary_turn turn;
    std::vector<int> nodes;
    std::int64_t dims = 0;  ///< a partial rotary's turned dims R; 0: the whole head
  };
  std::optional<rotary_match> rotary_of(const std::string& v, std::int64_t first = 0) const;
  std::optional<rotary_turn> rotary_frequencies_of(const std::string& cos, const std::string& sin, std::int64_t seq, std::int64_t hd,
                                                   std::int64_t first = 0) const;
  mutable std::map<std::tuple<std::string, std::string, std::int64_t>, std::optional<rotary_turn>> rotary_memo;  ///< rotary_frequencies_of's answers
  std::optional<heads_source> keys_of(const std::string& kt) const;
  std::optional<std::pair<std::int64_t, std::int64_t>> last_dim_slice(int k, std::int64_t rank, std::int64_t dim) const;
  bool causal_mask(const std::string& v, const tensor_shape& scores, bool additive, std::vector<int>& nodes_used) const;
  bool strip_causal_mask(std::string& z, int& p, const tensor_shape& scores, bool& causal, std::vector<int>& used) const;
  void fuse_attention(int sm);
  void find_fusions();
  void name_lifted_weights();

  // ---- emitting vertices ---- (emit.hpp)
  std::string unique_name(std::string base);
  const value_info& known(const std::string& v, const std::string& who) const;
  vertex_t operand(const std::string& v, const std::string& who);
  vertex_t shape_value(int p, const std::string& v, const std::string& who);
  bool elementwise(int k) const;
  void opaque(int k, const std::string& why);
  bool try_emit(op_kind kind, const std::string& name, const std::vector<std::string>& ins, op_attrs a,
                const std::string& o, const std::string& who, std::string& why);
  void emit(int k);
  bool single_output(int k) const;
  bool pass_through(int k, const std::string& who);
  bool emit_elementwise(int k, const std::string& name, const std::string& who, std::string& why);
  bool emit_gemm(int k, const std::string& name, const std::string& who, std::string& why);
  bool emit_normalisation(int k, const std::string& name, const std::string& who, std::string& why);
  bool emit_layout(int k, const std::string& name, const std::string& who, std::string& why);
  std::int64_t positions_from(const std::string& ids, std::int64_t rows) const;
  bool emit_reduction(int k, const std::string& name, const std::string& who, std::string& why);
  bool split(int k, const std::string& name, const std::string& who, std::string& why);
  std::optional<vertex_t> slice(int k, const std::string& who, std::string& why);
  bool reduce(int k, op_kind kind, const std::string& name, const std::string& who, std::string& why);
  void build();
};

}  // namespace detail::onnx_in
}  // namespace autoshard
