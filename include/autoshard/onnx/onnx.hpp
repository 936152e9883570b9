#pragma once
/// ONNX models -> the model graph, through Debian's libonnx (protobuf, ONNX's shape inference):
///   autoshard::onnx_options o;
///   o.batch = 8;                                    // symbolic dim 0 of the graph inputs
///   o.seq = 1024;                                   // symbolic dim 1
///   autoshard::onnx_import m = autoshard::read_onnx_file("model.onnx", o);
///   autoshard::parameter_count(m.graph);            // the initializers' elements
///   for (const auto& op : m.opaque) std::cout << op.node << " " << op.op_type << "\n";
///
/// Initializers become parameters with their exact names and shapes (non-floating ones, and
/// Constant nodes, become inputs: data, not weights). Operators map to the graph's kinds:
/// MatMul by a 2-D initializer (or its Transpose) and Gemm -> linear (a following Add of a
/// 1-D initializer is its bias), MatMul -> matmul, Add/Sub/Mul/Div, Softmax,
/// LayerNormalization and the decomposed ReduceMean/Sub/Pow/Add/Sqrt/Div(/Mul/Add) pattern ->
/// layer_norm, the decomposed RMSNorm (Pow/ReduceMean/Add/Sqrt, then Reciprocal+Mul or Div,
/// then Mul by the weight) -> rms_norm, the Erf pattern (x * 0.5 * (1 + erf(x / sqrt 2))) and
/// Gelu -> gelu_erf, the tanh pattern (GPT-2's gelu_new: 0.5 x (1 + tanh(sqrt(2/pi) (x +
/// 0.044715 x^3)))) and Gelu(approximate="tanh") -> gelu, x * Sigmoid(x) -> silu, Relu, Tanh,
/// Exp, Identity/Dropout, Reshape/Flatten/Squeeze/Unsqueeze -> reshape, Transpose, Gather of
/// a 2-D table -> embedding, Concat, Split and unit-step Slice -> split, a floating Cast -> reshape,
/// ReduceMean/ReduceSum, Where (floating values) -> where, Expand (floating) -> expand.
/// Softmax over QK^T / sqrt(hd) with heads split by Reshape+Transpose is attention; an
/// additive causal mask or GPT-2's Where(bool causal buffer, scores, finfo.min) before the
/// Softmax makes it causal. Any other operator (and one whose attributes the kinds cannot
/// express: a Gemm with alpha != 1, a strided Slice, a Where on integers) becomes an opaque
/// vertex that offers only Replicate; `opaque` lists each with the reason, so every model
/// gets a plan. Values computed only for shapes (Shape -> Gather -> Concat -> Reshape) are
/// not vertices: they are folded into constants on the inferred shapes, and ONNX's shape
/// inference runs again (its own data propagation stays off: in ONNX 1.12 it reads through
/// a null pointer on malformed models, which fuzz_onnx found in its first 20,000 inputs).
///
/// The file is input: its size is bounded before it is read, and node counts, ranks, dims,
/// element counts and initializer payloads are checked before anything is allocated for
/// them; a cycle, a value nobody produces, a truncated protobuf are io_error / graph_error
/// naming the node, the value and the numbers.
#include <algorithm>      // std::find, std::min, std::max
#include <cmath>          // std::abs, std::sqrt
#include <cstdint>        // std::int64_t
#include <cstring>        // std::memcpy
#include <map>            // std::map
#include <optional>       // std::optional
#include <set>            // std::set
#include <string>         // std::string
#include <string_view>    // std::string_view
#include <unordered_map>  // std::unordered_map
#include <vector>         // std::vector

// <sys/mman.h> (the tensor area maps checkpoints) defines MAP_TYPE, which ONNX's parser.h
// uses as an enumerator: hidden while ONNX's headers are read, so any include order works.
#pragma push_macro("MAP_TYPE")
#undef MAP_TYPE
#include <onnx/onnx_pb.h>                          // onnx::ModelProto (protobuf)
#include <onnx/shape_inference/implementation.h>  // onnx::shape_inference::InferShapes
#pragma pop_macro("MAP_TYPE")

#include "../core/checked.hpp"    // checked_bytes
#include "../core/error.hpp"      // graph_error, io_error
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
  std::vector<onnx::TensorProto> shape_constants;  // Shape nodes' values, when needed as data

  reader(const onnx_options& o, std::string src) : opt(o), source(std::move(src)) {}

  [[noreturn]] void fail_io(const std::string& why) const { throw io_error(source + ": " + why); }
  [[noreturn]] void fail(const std::string& why) const { throw graph_error(source + ": " + why); }
  static std::string node_label(const onnx::NodeProto& n, int i) {
    return "node " + std::to_string(i) + " '" + n.name() + "' (" + n.op_type() + ")";
  }

  // ---- bounds on everything the file says, before it is used ----
  void check_count(std::int64_t n, const char* what) const {
    if (n > opt.max_nodes)
      fail_io(std::to_string(n) + " " + what + ", more than the limit of " + std::to_string(opt.max_nodes));
  }
  tensor_shape checked_shape(const google::protobuf::RepeatedField<std::int64_t>& dims, const std::string& who) const {
    if (dims.size() > static_cast<int>(max_tensor_rank))
      fail_io(who + " has " + std::to_string(dims.size()) + " dims; at most " + std::to_string(max_tensor_rank) + " are supported");
    tensor_shape s;
    for (std::int64_t d : dims) {
      if (d < 0 || d > max_dim)
        fail_io(who + " dim " + std::to_string(s.rank) + " is " + std::to_string(d) + ", outside [0, 2^40]");
      s.dims[s.rank++] = d;
    }
    return s;
  }
  void check_initializer(const onnx::TensorProto& t, const std::string& who) const {
    const tensor_shape s = checked_shape(t.dims(), who);
    const std::optional<dtype> dt = to_dtype(t.data_type());
    const std::int64_t elem = dt ? static_cast<std::int64_t>(dtype_size(*dt)) : 8;
    std::int64_t bytes = 0;
    try {
      bytes = checked_bytes(s, elem, who);
    } catch (const shape_error&) {
      fail_io(who + " shape " + to_string(s) + " has more than 2^63 bytes");
    }
    if (bytes > max_graph_tensor_bytes) fail_io(who + " shape " + to_string(s) + " is " + std::to_string(bytes) + " bytes, more than 2^53");
    if (t.data_location() == onnx::TensorProto::EXTERNAL) return;  // the weights live elsewhere; shapes suffice
    const std::int64_t n = s.numel();
    using T = onnx::TensorProto;
    if (t.has_raw_data()) {
      if (!dt) fail_io(who + " has raw_data of element type " + std::to_string(t.data_type()) + ", which autoshard cannot size");
      if (static_cast<std::int64_t>(t.raw_data().size()) != bytes)
        fail_io(who + " raw_data holds " + std::to_string(t.raw_data().size()) + " bytes, but its shape " + to_string(s) + " of " +
                std::string(to_string(*dt)) + " needs " + std::to_string(bytes));
      return;
    }
    std::int64_t have = 0, per = 1;
    switch (t.data_type()) {
      case T::FLOAT: have = t.float_data_size(); break;
      case T::COMPLEX64: have = t.float_data_size(), per = 2; break;
      case T::DOUBLE: have = t.double_data_size(); break;
      case T::COMPLEX128: have = t.double_data_size(), per = 2; break;
      case T::INT64: have = t.int64_data_size(); break;
      case T::UINT32:
      case T::UINT64: have = t.uint64_data_size(); break;
      case T::STRING: have = t.string_data_size(); break;
      default: have = t.int32_data_size(); break;
    }
    if (have != n * per)
      fail_io(who + " holds " + std::to_string(have) + " values, but its shape " + to_string(s) + " needs " + std::to_string(n * per));
  }
  void check_type(const onnx::TypeProto& t, const std::string& who) const {
    if (!t.has_tensor_type() || !t.tensor_type().has_shape()) return;
    const auto& dims = t.tensor_type().shape().dim();
    if (dims.size() > static_cast<int>(max_tensor_rank))
      fail_io(who + " has " + std::to_string(dims.size()) + " dims; at most " + std::to_string(max_tensor_rank) + " are supported");
    for (int i = 0; i < dims.size(); ++i)
      if (dims[i].has_dim_value() && (dims[i].dim_value() < 0 || dims[i].dim_value() > max_dim))
        fail_io(who + " dim " + std::to_string(i) + " is " + std::to_string(dims[i].dim_value()) + ", outside [0, 2^40]");
  }

  void parse(std::string_view bytes) {
    if (bytes.size() > opt.max_file_bytes)
      fail_io(std::to_string(bytes.size()) + " bytes, more than the limit of " + std::to_string(opt.max_file_bytes));
    if (bytes.size() > static_cast<std::size_t>(std::numeric_limits<int>::max()) ||
        !model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
      fail_io("not an ONNX model: the protobuf does not parse (" + std::to_string(bytes.size()) + " bytes; truncated, or another format?)");
    if (!model.has_graph() || model.graph().node_size() == 0)
      fail_io("not an ONNX model: no graph with nodes (" + std::to_string(bytes.size()) + " bytes parsed)");
    for (const auto& o : model.opset_import())
      if (o.domain().empty() || o.domain() == "ai.onnx") out.opset = o.version();
    if (model.opset_import_size() > 0 && out.opset <= 0) fail_io("the model imports no opset of the default ONNX domain");
    if (out.opset == 0) out.opset = 1;
    out.producer = model.producer_name() + (model.producer_version().empty() ? "" : " " + model.producer_version());
    const onnx::GraphProto& g = model.graph();
    check_count(g.node_size(), "nodes");
    check_count(g.initializer_size(), "initializers");
    check_count(g.input_size(), "graph inputs");
    check_count(g.output_size(), "graph outputs");
    check_count(g.value_info_size(), "value_info entries");
    if (g.output_size() == 0) fail_io("the graph has no outputs");
    for (const auto& t : g.initializer()) check_initializer(t, "initializer '" + t.name() + "'");
    if (g.sparse_initializer_size() > 0) fail_io("sparse initializers are not supported ('" + g.sparse_initializer(0).values().name() + "')");
    for (const auto& v : g.input()) check_type(v.type(), "input '" + v.name() + "'");
    for (const auto& v : g.output()) check_type(v.type(), "output '" + v.name() + "'");
    for (const auto& v : g.value_info()) check_type(v.type(), "value_info '" + v.name() + "'");
    // A custom domain the model forgot to import: ONNX's inference would stop at it; imported
    // here at version 1 (its operators become opaque anyway).
    std::set<std::string> domains;
    for (const auto& o : model.opset_import()) domains.insert(o.domain());
    for (const auto& n : g.node())
      if (!n.domain().empty() && n.domain() != "ai.onnx" && domains.insert(n.domain()).second) {
        auto* o = model.add_opset_import();
        o->set_domain(n.domain());
        o->set_version(1);
      }
    for (int i = 0; i < g.node_size(); ++i) {
      const onnx::NodeProto& n = g.node(i);
      if (n.op_type() == "Constant")
        for (const auto& a : n.attribute())
          if (a.has_t()) check_initializer(a.t(), node_label(n, i) + " value");
    }
  }

  // ---- topological order (Kahn), a cycle or a dangling value is an error ----
  void sort_nodes() {
    onnx::GraphProto& g = *model.mutable_graph();
    std::unordered_map<std::string, int> producer;
    std::set<std::string> available;
    for (const auto& t : g.initializer()) available.insert(t.name());
    for (const auto& v : g.input()) available.insert(v.name());
    for (int i = 0; i < g.node_size(); ++i)
      for (const std::string& o : g.node(i).output()) {
        if (o.empty()) continue;
        if (available.count(o)) fail(node_label(g.node(i), i) + " writes '" + o + "', which is already a graph input or initializer");
        if (!producer.emplace(o, i).second)
          fail(node_label(g.node(i), i) + " writes '" + o + "', which " + node_label(g.node(producer[o]), producer[o]) + " writes too");
      }
    std::vector<int> missing(static_cast<std::size_t>(g.node_size()), 0);
    std::vector<std::vector<int>> users(static_cast<std::size_t>(g.node_size()));
    for (int i = 0; i < g.node_size(); ++i)
      for (const std::string& in : g.node(i).input()) {
        if (in.empty() || available.count(in)) continue;
        auto p = producer.find(in);
        if (p == producer.end())
          fail(node_label(g.node(i), i) + " reads '" + in + "', which no node, graph input or initializer provides");
        ++missing[static_cast<std::size_t>(i)];
        users[static_cast<std::size_t>(p->second)].push_back(i);
      }
    std::vector<int> order, ready;
    for (int i = g.node_size() - 1; i >= 0; --i)
      if (missing[static_cast<std::size_t>(i)] == 0) ready.push_back(i);
    while (!ready.empty()) {
      const int i = ready.back();
      ready.pop_back();
      order.push_back(i);
      for (int u : users[static_cast<std::size_t>(i)])
        if (--missing[static_cast<std::size_t>(u)] == 0) ready.push_back(u);
    }
    if (static_cast<int>(order.size()) != g.node_size()) {
      std::string left;
      int shown = 0;
      for (int i = 0; i < g.node_size() && shown < 4; ++i)
        if (missing[static_cast<std::size_t>(i)] > 0) left += (shown++ ? ", " : "") + node_label(g.node(i), i);
      fail("the graph has a cycle: " + std::to_string(g.node_size() - static_cast<int>(order.size())) +
           " nodes are on it or wait on it (" + left + ")");
    }
    google::protobuf::RepeatedPtrField<onnx::NodeProto> sorted;
    sorted.Reserve(g.node_size());
    for (int i : order) *sorted.Add() = g.node(i);
    g.mutable_node()->Swap(&sorted);
  }

  // ---- symbolic dims of the graph inputs get sizes; then ONNX infers the rest ----
  void fix_input_dims() {
    onnx::GraphProto& g = *model.mutable_graph();
    std::set<std::string> inits;
    for (const auto& t : g.initializer()) inits.insert(t.name());
    std::map<std::string, std::int64_t> named = opt.dims;
    for (auto& v : *g.mutable_input()) {
      if (inits.count(v.name()) || !v.type().has_tensor_type()) continue;
      auto* tt = v.mutable_type()->mutable_tensor_type();
      if (!tt->has_shape()) fail("graph input '" + v.name() + "' has no shape; give the model one (every input needs its rank)");
      auto& dims = *tt->mutable_shape()->mutable_dim();
      for (int i = 0; i < dims.size(); ++i) {
        auto& d = dims[i];
        if (d.has_dim_value()) continue;
        const std::string sym = d.has_dim_param() ? d.dim_param() : std::string();
        std::int64_t size = 0;
        if (auto it = named.find(sym); !sym.empty() && it != named.end()) size = it->second;
        else if (i == 0 && opt.batch > 0) size = opt.batch;
        else if (i == 1 && opt.seq > 0) size = opt.seq;
        if (size <= 0)
          fail("graph input '" + v.name() + "' dim " + std::to_string(i) + " is symbolic" +
               (sym.empty() ? std::string() : " ('" + sym + "')") + "; give its size (--batch sizes dim 0, --seq dim 1)");
        if (size > max_dim) fail("graph input '" + v.name() + "' dim " + std::to_string(i) + " is " + std::to_string(size) + ", more than 2^40");
        if (!sym.empty()) named.emplace(sym, size);
        d.set_dim_value(size);
      }
    }
    // The same symbol elsewhere (outputs, value_info) takes the same size.
    auto fix = [&](onnx::ValueInfoProto& v) {
      if (!v.type().has_tensor_type() || !v.type().tensor_type().has_shape()) return;
      for (auto& d : *v.mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim())
        if (d.has_dim_param())
          if (auto it = named.find(d.dim_param()); it != named.end()) d.set_dim_value(it->second);
    };
    for (auto& v : *g.mutable_output()) fix(v);
    for (auto& v : *g.mutable_value_info()) fix(v);
  }

  /// ONNX's shape inference over the model. A failure names the node (ONNX's own message
  /// names it by its name only, "node name: " for the many exporters leave unnamed): unnamed
  /// nodes carry a name of their index while inference runs.
  void infer_shapes() {
    onnx::GraphProto& g = *model.mutable_graph();
    const std::string mark = "autoshard-node-";
    std::vector<int> unnamed;
    for (int i = 0; i < g.node_size(); ++i)
      if (g.node(i).name().empty()) {
        unnamed.push_back(i);
        g.mutable_node(i)->set_name(mark + std::to_string(i));
      }
    std::string failure;
    try {
      onnx::shape_inference::InferShapes(model, onnx::OpSchemaRegistry::Instance(),
                                         onnx::ShapeInferenceOptions(false, 0, false));
    } catch (const std::exception& e) {
      failure = e.what();
    }
    int culprit = -1;  // the node ONNX names: "(op_type:Relu, node name: act)"
    if (const std::size_t at = failure.find("node name: "); at != std::string::npos) {
      const std::size_t from = at + 11, to = failure.find(')', from);
      const std::string name = failure.substr(from, to == std::string::npos ? std::string::npos : to - from);
      for (int i = 0; i < g.node_size() && culprit < 0; ++i)
        if (g.node(i).name() == name) culprit = i;
    }
    for (const int i : unnamed) {
      g.mutable_node(i)->clear_name();
      const std::string name = mark + std::to_string(i);
      if (const std::size_t at = failure.find(name); at != std::string::npos) failure.replace(at, name.size(), "(none)");
    }
    if (failure.empty()) return;
    fail((culprit >= 0 ? node_label(g.node(culprit), culprit) + ": " : std::string()) + "ONNX shape inference failed: " + failure);
  }

  // ---- shape computations folded into constants, so that inference sees through them ----
  /// Shape -> Slice/Gather -> Concat -> Reshape chains (how exporters write views) are
  /// evaluated on the inferred shapes and replaced by Constant nodes; inference runs again
  /// while that settles more shapes (ONNX 1.12's data propagation does not cover Slice, and
  /// crashes on malformed models).
  struct int_value {
    std::vector<std::int64_t> v;
    bool scalar = false;
  };
  std::unordered_map<std::string, tensor_shape> inferred_shapes() const {
    std::unordered_map<std::string, tensor_shape> m;
    auto add = [&](const onnx::ValueInfoProto& vi) {
      if (!vi.type().has_tensor_type() || !vi.type().tensor_type().has_shape()) return;
      tensor_shape s;
      for (const auto& d : vi.type().tensor_type().shape().dim()) {
        if (!d.has_dim_value() || d.dim_value() < 0 || d.dim_value() > max_dim || s.rank >= max_tensor_rank) return;
        s.dims[s.rank++] = d.dim_value();
      }
      m[vi.name()] = s;
    };
    for (const auto& v : model.graph().input()) add(v);
    for (const auto& v : model.graph().value_info()) add(v);
    for (const auto& v : model.graph().output()) add(v);
    for (const auto& t : model.graph().initializer()) {
      tensor_shape s;
      if (t.dims_size() > static_cast<int>(max_tensor_rank)) continue;
      for (std::int64_t d : t.dims()) s.dims[s.rank++] = d;
      m[t.name()] = s;
    }
    return m;
  }
  static std::optional<int_value> int_tensor(const onnx::TensorProto& t) {
    if (t.dims_size() > 1 || t.data_location() == onnx::TensorProto::EXTERNAL) return std::nullopt;
    const std::int64_t n = t.dims_size() ? t.dims(0) : 1;
    if (n < 0 || n > 64) return std::nullopt;
    int_value r;
    r.scalar = t.dims_size() == 0;
    const std::string& raw = t.raw_data();
    if (t.data_type() == onnx::TensorProto::INT64) {
      if (t.has_raw_data()) {
        if (raw.size() != static_cast<std::size_t>(n) * 8) return std::nullopt;
        for (std::int64_t i = 0; i < n; ++i) {
          std::int64_t e;
          std::memcpy(&e, raw.data() + i * 8, 8);
          r.v.push_back(e);
        }
      } else {
        r.v.assign(t.int64_data().begin(), t.int64_data().end());
      }
    } else if (t.data_type() == onnx::TensorProto::INT32) {
      if (t.has_raw_data()) {
        if (raw.size() != static_cast<std::size_t>(n) * 4) return std::nullopt;
        for (std::int64_t i = 0; i < n; ++i) {
          std::int32_t e;
          std::memcpy(&e, raw.data() + i * 4, 4);
          r.v.push_back(e);
        }
      } else {
        r.v.assign(t.int32_data().begin(), t.int32_data().end());
      }
    } else {
      return std::nullopt;
    }
    if (static_cast<std::int64_t>(r.v.size()) != n) return std::nullopt;
    return r;
  }
  /// Evaluates node `n` on known integer inputs; nullopt when it is not a shape computation.
  std::optional<int_value> fold(const onnx::NodeProto& n, const std::unordered_map<std::string, int_value>& known_ints,
                                const std::unordered_map<std::string, tensor_shape>& shapes) const {
    if (!default_domain(n) || n.output_size() != 1) return std::nullopt;
    const std::string& t = n.op_type();
    auto get = [&](int i) -> const int_value* {
      if (i >= n.input_size()) return nullptr;
      auto it = known_ints.find(n.input(i));
      return it == known_ints.end() ? nullptr : &it->second;
    };
    auto clamp_index = [](std::int64_t i, std::int64_t size) { return std::min(std::max(i < 0 ? i + size : i, std::int64_t{0}), size); };
    int_value r;
    if (t == "Shape") {
      if (n.input_size() < 1) return std::nullopt;
      auto it = shapes.find(n.input(0));
      if (it == shapes.end()) return std::nullopt;
      const auto rank = static_cast<std::int64_t>(it->second.rank);
      const std::int64_t b = clamp_index(attr_int(n, "start", 0), rank), e = clamp_index(attr_int(n, "end", rank), rank);
      for (std::int64_t d = b; d < e; ++d) r.v.push_back(it->second[static_cast<std::size_t>(d)]);
      return r;
    }
    const int_value* a = get(0);
    if (!a) return std::nullopt;
    const auto size = static_cast<std::int64_t>(a->v.size());
    if (t == "Cast" || t == "Identity") return *a;
    if (t == "Unsqueeze" && a->scalar) return r.v = a->v, r;
    if (t == "Squeeze" && size == 1) return r.v = a->v, r.scalar = true, r;
    if (t == "Gather" && !a->scalar && attr_int(n, "axis", 0) == 0) {
      const int_value* idx = get(1);
      if (!idx) return std::nullopt;
      for (std::int64_t i : idx->v) {
        const std::int64_t j = i < 0 ? i + size : i;
        if (j < 0 || j >= size) return std::nullopt;
        r.v.push_back(a->v[static_cast<std::size_t>(j)]);
      }
      r.scalar = idx->scalar;
      return r;
    }
    if (t == "Slice" && !a->scalar) {
      const int_value *st = get(1), *en = get(2), *ax = get(3), *sp = get(4);
      if (!st || !en || st->v.size() != 1 || en->v.size() != 1 || (ax && (ax->v.size() != 1 || (ax->v[0] != 0 && ax->v[0] != -1))) ||
          (sp && (sp->v.size() != 1 || sp->v[0] != 1)))
        return std::nullopt;
      const std::int64_t b = clamp_index(st->v[0], size), e = clamp_index(en->v[0], size);
      for (std::int64_t d = b; d < e; ++d) r.v.push_back(a->v[static_cast<std::size_t>(d)]);
      return r;
    }
    if (t == "Concat") {
      for (int i = 0; i < n.input_size(); ++i) {
        const int_value* p = get(i);
        if (!p || p->scalar || r.v.size() + p->v.size() > 64) return std::nullopt;
        r.v.insert(r.v.end(), p->v.begin(), p->v.end());
      }
      return r;
    }
    if (t == "Add" || t == "Sub" || t == "Mul") {
      const int_value* b = get(1);
      if (!b || (a->v.size() != b->v.size() && a->v.size() != 1 && b->v.size() != 1)) return std::nullopt;
      const std::size_t len = std::max(a->v.size(), b->v.size());
      for (std::size_t i = 0; i < len; ++i) {
        const std::int64_t x = a->v[a->v.size() == 1 ? 0 : i], y = b->v[b->v.size() == 1 ? 0 : i];
        if (std::abs(x) > max_dim || std::abs(y) > max_dim) return std::nullopt;  // no overflow below 2^80
        r.v.push_back(t == "Add" ? x + y : t == "Sub" ? x - y : x * y);
      }
      r.scalar = a->scalar && b->scalar;
      return r;
    }
    return std::nullopt;
  }
  void fold_shape_computations() {
    for (int round = 0; round < 8; ++round) {
      const std::unordered_map<std::string, tensor_shape> shapes = inferred_shapes();
      std::unordered_map<std::string, int_value> ints;
      for (const auto& t : model.graph().initializer())
        if (auto v = int_tensor(t)) ints[t.name()] = *v;
      int folded = 0;
      for (auto& n : *model.mutable_graph()->mutable_node()) {
        if (n.op_type() == "Constant" && default_domain(n) && n.output_size() == 1) {
          for (const auto& a : n.attribute())
            if (a.name() == "value" && a.has_t())
              if (auto v = int_tensor(a.t())) ints[n.output(0)] = *v;
          continue;
        }
        std::optional<int_value> v = fold(n, ints, shapes);
        if (!v) continue;
        ints[n.output(0)] = *v;
        onnx::TensorProto tp;
        tp.set_data_type(onnx::TensorProto::INT64);
        if (!v->scalar) tp.add_dims(static_cast<std::int64_t>(v->v.size()));
        for (std::int64_t x : v->v) tp.add_int64_data(x);
        const std::string out_name = n.output(0), node_name = n.name();
        n.Clear();
        n.set_op_type("Constant");
        n.set_name(node_name);
        n.add_output(out_name);
        onnx::AttributeProto* at = n.add_attribute();
        at->set_name("value");
        at->set_type(onnx::AttributeProto::TENSOR);
        *at->mutable_t() = std::move(tp);
        ++folded;
      }
      if (folded == 0) return;
      infer_shapes();
    }
  }

  // ---- the values: types, producers, consumers ----
  void set_type(value_info& v, const onnx::TypeProto& t, const std::string& name) {
    if (t.value_case() == onnx::TypeProto::VALUE_NOT_SET) {
      v.unknown_why = "the shape of '" + name + "' is unknown after shape inference (give it in the model's value_info)";
      return;
    }
    if (!t.has_tensor_type()) {
      v.unknown_why = "'" + name + "' is not a tensor";
      return;
    }
    const auto& tt = t.tensor_type();
    const std::optional<dtype> dt = to_dtype(tt.elem_type());
    if (!dt) {
      v.unknown_why = "'" + name + "' has element type " + std::to_string(tt.elem_type()) + ", which autoshard has no dtype for";
      return;
    }
    if (!tt.has_shape()) {
      v.unknown_why = "the shape of '" + name + "' is unknown after shape inference (give it in the model's value_info)";
      return;
    }
    tensor_shape s;
    if (tt.shape().dim_size() > static_cast<int>(max_tensor_rank)) {
      v.unknown_why = "'" + name + "' has " + std::to_string(tt.shape().dim_size()) + " dims; at most 8 are supported";
      return;
    }
    for (const auto& d : tt.shape().dim()) {
      if (!d.has_dim_value()) {
        v.unknown_why = "dim " + std::to_string(s.rank) + " of '" + name + "' is " +
                        (d.has_dim_param() ? "symbolic ('" + d.dim_param() + "')" : std::string("unknown")) +
                        " after shape inference (data-dependent, or the model leaves it open)";
        return;
      }
      if (d.dim_value() < 0 || d.dim_value() > max_dim) {
        v.unknown_why = "dim " + std::to_string(s.rank) + " of '" + name + "' is " + std::to_string(d.dim_value()) + ", outside [0, 2^40]";
        return;
      }
      s.dims[s.rank++] = d.dim_value();
    }
    v.known = true;
    v.unknown_why.clear();
    v.shape = s;
    v.type = *dt;
  }
  void collect_values() {
    const onnx::GraphProto& g = model.graph();
    for (const auto& t : g.initializer()) {
      value_info& v = values[t.name()];
      v.init = &t;
      const std::optional<dtype> dt = to_dtype(t.data_type());
      if (dt) {
        v.known = true;
        v.shape = checked_shape(t.dims(), "initializer '" + t.name() + "'");
        v.type = *dt;
      } else {
        v.unknown_why = "initializer '" + t.name() + "' has element type " + std::to_string(t.data_type()) + ", which autoshard has no dtype for";
      }
    }
    for (const auto& i : g.input()) {
      value_info& v = values[i.name()];
      if (v.init) continue;  // an initializer listed as an input too (IR < 4)
      v.graph_input = true;
      set_type(v, i.type(), i.name());
    }
    for (const auto& i : g.value_info()) set_type(values[i.name()], i.type(), i.name());
    for (const auto& o : g.output()) {
      value_info& v = values[o.name()];
      v.graph_output = true;
      if (!v.init && !v.graph_input) set_type(v, o.type(), o.name());
    }
    nodes.clear();
    for (int i = 0; i < g.node_size(); ++i) {
      const onnx::NodeProto& n = g.node(i);
      nodes.push_back(&n);
      for (const std::string& o : n.output())
        if (!o.empty()) values[o].producer = i;
      if (n.op_type() == "Constant" && n.output_size() == 1) {
        for (const auto& a : n.attribute())
          if (a.name() == "value" && a.has_t()) {
            value_info& v = values[n.output(0)];
            v.init = &a.t();
            if (const std::optional<dtype> dt = to_dtype(a.t().data_type())) {
              v.known = true;
              v.shape = checked_shape(a.t().dims(), node_label(n, i) + " value");
              v.type = *dt;
            }
          }
      }
      for (const std::string& in : n.input())
        if (!in.empty()) values[in].consumers.push_back(i);
    }
    for (auto& [name, v] : values)
      if (v.known && opt.float_type && is_float(v.type)) v.type = *opt.float_type;
  }

  // ---- small constants (Slice bounds, pattern scalars) ----
  std::optional<std::vector<double>> constant(const std::string& name, std::int64_t max_count = 64) const {
    auto it = values.find(name);
    if (it == values.end() || !it->second.init) return std::nullopt;
    const onnx::TensorProto& t = *it->second.init;
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

  // ---- which nodes compute data (vertices) rather than shapes only ----
  /// The inputs of `n` that are data; the others (Reshape's shape, Slice's bounds, ...) are
  /// read as constants or through the inferred shapes.
  static std::vector<int> data_inputs(const onnx::NodeProto& n) {
    const std::string& t = n.op_type();
    if (!default_domain(n)) return iota(n.input_size());
    if (t == "Reshape" || t == "Expand" || t == "Tile" || t == "Slice" || t == "Unsqueeze" || t == "Squeeze" ||
        t == "Split" || t == "ReduceMean" || t == "ReduceSum" || t == "Dropout" || t == "Flatten")
      return {0};
    if (t == "Shape" || t == "Size" || t == "Constant" || t == "ConstantOfShape") return {};
    return iota(n.input_size());
  }
  static std::vector<int> iota(int n) {
    std::vector<int> v;
    for (int i = 0; i < n; ++i) v.push_back(i);
    return v;
  }
  void mark_needed() {
    needed.assign(nodes.size(), 0);
    std::set<std::string> want;
    for (const auto& o : model.graph().output()) want.insert(o.name());
    for (std::size_t k = nodes.size(); k-- > 0;) {
      const onnx::NodeProto& n = *nodes[k];
      bool any = false;
      for (const std::string& o : n.output()) any = any || want.count(o);
      if (!any) continue;
      needed[k] = 1;
      for (int i : data_inputs(n))
        if (i < n.input_size() && !n.input(i).empty()) want.insert(n.input(i));
    }
  }

  // ---- fusions: patterns of several nodes that are one kind ----
  struct fusion {
    op_kind kind;
    std::vector<std::string> operands;  // value names
    op_attrs attrs;
    std::string name;
    std::string output;
  };
  std::map<int, fusion> fused;  // at the pattern's last node

  /// The single node consuming value `v`, when it has exactly one consumer and is no graph output.
  std::optional<int> only_consumer(const std::string& v) const {
    auto it = values.find(v);
    if (it == values.end() || it->second.graph_output || it->second.consumers.size() != 1) return std::nullopt;
    return it->second.consumers[0];
  }
  int producer(const std::string& v) const {
    auto it = values.find(v);
    return it == values.end() ? -1 : it->second.producer;
  }
  bool is_op(int k, std::string_view t) const { return k >= 0 && default_domain(*nodes[static_cast<std::size_t>(k)]) && nodes[static_cast<std::size_t>(k)]->op_type() == t && !absorbed[static_cast<std::size_t>(k)]; }
  const onnx::NodeProto& nd(int k) const { return *nodes[static_cast<std::size_t>(k)]; }
  /// Input / output i of node k, or "" when it has fewer (a hostile node may have any count).
  std::string in_of(int k, int i) const { return k >= 0 && i < nd(k).input_size() ? nd(k).input(i) : std::string(); }
  std::string out_of(int k, int i) const { return k >= 0 && i < nd(k).output_size() ? nd(k).output(i) : std::string(); }
  /// The operand of binary node k that is not `x` (nullopt when neither or both are).
  std::optional<std::string> other(int k, const std::string& x) const {
    const auto& n = nd(k);
    if (n.input_size() != 2) return std::nullopt;
    if (n.input(0) == x && n.input(1) != x) return n.input(1);
    if (n.input(1) == x && n.input(0) != x) return n.input(0);
    return std::nullopt;
  }
  bool is_param_vector(const std::string& v, std::int64_t h) const {
    auto it = values.find(v);
    return it != values.end() && it->second.init && it->second.known && it->second.shape == tensor_shape{h} && is_float(it->second.type);
  }
  bool reduces_last(int k, std::int64_t rank) const {
    const auto& n = nd(k);
    if (attr_int(n, "keepdims", 1) != 1) return false;
    std::optional<std::vector<std::int64_t>> axes = attr_ints(n, "axes");
    if (!axes && n.input_size() > 1) {
      auto c = constant(n.input(1));
      if (!c) return false;
      axes = std::vector<std::int64_t>();
      for (double d : *c) axes->push_back(static_cast<std::int64_t>(d));
    }
    return axes && axes->size() == 1 && ((*axes)[0] == -1 || (*axes)[0] == rank - 1);
  }
  std::string pattern_name(int k) const {
    const std::string& n = nd(k).name();
    const auto slash = n.rfind('/');
    if (slash != std::string::npos && slash > 0) return n.substr(0, slash);
    return n.empty() ? out_of(k, 0) : n;
  }
  void absorb(std::initializer_list<int> ks) {
    for (int k : ks) absorbed[static_cast<std::size_t>(k)] = 1;
  }

  /// mean = ReduceMean(x); d = Sub(x, mean); var = ReduceMean(Pow(d, 2)); s = Sqrt(Add(var, eps));
  /// y = Div(d, s) [; Mul(y, gamma) [; Add(., beta)]] -> layer_norm(x [, gamma [, beta]]).
  void fuse_layer_norm(int div) {
    const auto& dn = nd(div);
    if (dn.input_size() != 2) return;
    const int sub = producer(in_of(div, 0)), sqrt = producer(in_of(div, 1));
    if (!is_op(sub, "Sub") || !is_op(sqrt, "Sqrt")) return;
    const std::string x = in_of(sub, 0);
    const int mean = producer(in_of(sub, 1));
    auto xv = values.find(x);
    if (xv == values.end() || !xv->second.known || xv->second.shape.rank < 1) return;
    const std::int64_t rank = xv->second.shape.rank, h = xv->second.shape[xv->second.shape.rank - 1u];
    if (!is_op(mean, "ReduceMean") || in_of(mean, 0) != x || !reduces_last(mean, rank)) return;
    const int add = producer(in_of(sqrt, 0));
    if (!is_op(add, "Add") || nd(add).input_size() != 2) return;
    int var = producer(in_of(add, 0));
    std::string eps = in_of(add, 1);
    if (!is_op(var, "ReduceMean")) var = producer(in_of(add, 1)), eps = in_of(add, 0);
    if (!is_op(var, "ReduceMean") || !reduces_last(var, rank) || !scalar(eps)) return;
    const int pow = producer(in_of(var, 0));
    if (!(is_op(pow, "Pow") && in_of(pow, 0) == in_of(div, 0) && near(scalar(in_of(pow, 1)), 2.0)) &&
        !(is_op(pow, "Mul") && nd(pow).input_size() == 2 && in_of(pow, 0) == in_of(div, 0) && in_of(pow, 1) == in_of(div, 0)))
      return;
    // Every intermediate is used only inside the pattern.
    const auto uses = [&](const std::string& v) { auto it = values.find(v); return it == values.end() || it->second.graph_output ? 99 : static_cast<int>(it->second.consumers.size()); };
    if (uses(out_of(mean, 0)) != 1 || uses(out_of(sub, 0)) != 2 || uses(out_of(pow, 0)) != 1 ||
        uses(out_of(var, 0)) != 1 || uses(out_of(add, 0)) != 1 || uses(out_of(sqrt, 0)) != 1)
      return;
    fusion f{op_kind::layer_norm, {x}, {}, pattern_name(div), out_of(div, 0)};
    int last = div;
    std::vector<int> extra;
    if (auto mul = only_consumer(out_of(div, 0)); mul && is_op(*mul, "Mul")) {
      if (auto gamma = other(*mul, out_of(div, 0)); gamma && is_param_vector(*gamma, h)) {
        f.operands.push_back(*gamma);
        f.output = out_of(*mul, 0);
        last = *mul;
        extra.push_back(*mul);
        if (auto badd = only_consumer(f.output); badd && is_op(*badd, "Add")) {
          if (auto beta = other(*badd, f.output); beta && is_param_vector(*beta, h)) {
            f.operands.push_back(*beta);
            f.output = out_of(*badd, 0);
            last = *badd;
            extra.push_back(*badd);
          }
        }
      }
    }
    absorb({mean, sub, pow, var, add, sqrt, div});
    for (int e : extra) absorb({e});
    fused[last] = std::move(f);  // absorbed too: emitted through `fused`
  }

  /// The operand of Mul node k that is not the scalar constant `c` (either order); nullopt
  /// when k is no such Mul.
  std::optional<std::string> scaled_by(int k, double c) const {
    if (!is_op(k, "Mul") || nd(k).input_size() != 2) return std::nullopt;
    if (near(scalar(in_of(k, 1)), c)) return in_of(k, 0);
    if (near(scalar(in_of(k, 0)), c)) return in_of(k, 1);
    return std::nullopt;
  }
  /// The end every GELU form shares: c = Add(f, 1) (node `add`, f the erf / tanh term) and
  /// then Mul(Mul(x, c), 0.5) or Mul(Mul(x, 0.5), c). Marks the nodes (and `body`, the
  /// term's own nodes) as one fused `kind` vertex of x.
  bool fuse_gelu_tail(op_kind kind, const std::string& x, const std::string& f, std::vector<int> body, const std::string& name) {
    auto add = only_consumer(f);
    if (!add || !is_op(*add, "Add")) return false;
    auto one = other(*add, f);
    if (!one || !near(scalar(*one), 1.0)) return false;
    const std::string c = out_of(*add, 0);
    auto m1 = only_consumer(c);
    if (!m1 || !is_op(*m1, "Mul")) return false;
    auto o1 = other(*m1, c);
    if (!o1) return false;
    int last = -1;
    body.push_back(*add);
    body.push_back(*m1);
    if (*o1 == x) {  // Mul(x, c) then Mul(., 0.5)
      auto m2 = only_consumer(out_of(*m1, 0));
      if (!m2 || !scaled_by(*m2, 0.5)) return false;
      last = *m2;
    } else if (const int h = producer(*o1); only_consumer(*o1) && scaled_by(h, 0.5) == x) {  // Mul(Mul(x, 0.5), c)
      body.push_back(h);
      last = *m1;
    } else {
      return false;
    }
    body.push_back(last);
    for (int k : body) absorbed[static_cast<std::size_t>(k)] = 1;
    fused[last] = fusion{kind, {x}, {}, name, out_of(last, 0)};
    return true;
  }

  /// e = Erf(Div(x, sqrt 2) | Mul(x, 1/sqrt 2)); then the GELU tail -> gelu_erf(x) (exact GELU).
  void fuse_erf_gelu(int erf) {
    const int scale = producer(in_of(erf, 0));
    std::string x;
    if (is_op(scale, "Div") && near(scalar(in_of(scale, 1)), std::sqrt(2.0))) x = in_of(scale, 0);
    else if (auto s = scaled_by(scale, 1.0 / std::sqrt(2.0))) x = *s;
    if (x.empty() || !only_consumer(out_of(scale, 0))) return;
    fuse_gelu_tail(op_kind::gelu_erf, x, out_of(erf, 0), {scale, erf}, pattern_name(erf));
  }

  /// t = Tanh(Mul(Add(x, Mul(Pow(x, 3), 0.044715)), sqrt(2/pi))) (x^3 also as Mul(Mul(x, x), x));
  /// then the GELU tail -> gelu(x), GPT-2's gelu_new (the tanh approximation).
  void fuse_tanh_gelu(int tanh) {
    const int s = producer(in_of(tanh, 0));
    auto r = scaled_by(s, std::sqrt(2.0 / 3.141592653589793));
    if (!r || !only_consumer(out_of(s, 0)) || !only_consumer(*r)) return;
    const int add = producer(*r);
    if (!is_op(add, "Add") || nd(add).input_size() != 2) return;
    for (int side = 0; side < 2; ++side) {
      const std::string x = in_of(add, side), q = in_of(add, 1 - side);
      const int qk = producer(q);
      auto cube = scaled_by(qk, 0.044715);
      if (!cube || !only_consumer(q) || !only_consumer(*cube)) continue;
      const int pk = producer(*cube);
      std::vector<int> body{s, add, qk, pk, tanh};
      bool is_cube = false;
      if (is_op(pk, "Pow") && in_of(pk, 0) == x && near(scalar(in_of(pk, 1)), 3.0)) {
        is_cube = true;
      } else if (is_op(pk, "Mul") && nd(pk).input_size() == 2) {  // Mul(Mul(x, x), x), either order
        for (int o = 0; o < 2 && !is_cube; ++o) {
          const int sq = producer(in_of(pk, o));
          if (in_of(pk, 1 - o) == x && is_op(sq, "Mul") && in_of(sq, 0) == x && in_of(sq, 1) == x && only_consumer(in_of(pk, o))) {
            is_cube = true;
            body.push_back(sq);
          }
        }
      }
      if (is_cube && fuse_gelu_tail(op_kind::gelu, x, out_of(tanh, 0), body, pattern_name(tanh))) return;
    }
  }

  /// Mul(x, Sigmoid(x)) (either order), how torch exports SiLU (LLaMA's MLP gate) -> silu(x).
  void fuse_silu(int sig) {
    const std::string x = in_of(sig, 0), s = out_of(sig, 0);
    auto mul = only_consumer(s);
    if (x.empty() || !mul || !is_op(*mul, "Mul") || other(*mul, s) != x) return;
    absorbed[static_cast<std::size_t>(sig)] = 1;
    absorbed[static_cast<std::size_t>(*mul)] = 1;
    fused[*mul] = fusion{op_kind::silu, {x}, {}, pattern_name(sig), out_of(*mul, 0)};
  }

  /// LLaMA's RMSNorm as exported: ms = ReduceMean(Pow(x, 2) | Mul(x, x)); s = Sqrt(Add(ms, eps));
  /// y = Mul(x, Reciprocal(s)) | Mul(x, Div(1, s)) | Div(x, s) [; Cast] [; Mul(w, .)] ->
  /// rms_norm(x [, w]) (over the last dim).
  void fuse_rms_norm(int mean) {
    const int pow = producer(in_of(mean, 0));
    std::string x;
    if (is_op(pow, "Pow") && near(scalar(in_of(pow, 1)), 2.0)) x = in_of(pow, 0);
    else if (is_op(pow, "Mul") && nd(pow).input_size() == 2 && in_of(pow, 0) == in_of(pow, 1)) x = in_of(pow, 0);
    auto xv = values.find(x);
    if (x.empty() || xv == values.end() || !xv->second.known || xv->second.shape.rank < 1 || !is_float(xv->second.type)) return;
    const std::int64_t rank = xv->second.shape.rank, h = xv->second.shape[xv->second.shape.rank - 1u];
    if (!reduces_last(mean, rank) || !only_consumer(out_of(pow, 0)) || !only_consumer(out_of(mean, 0))) return;
    auto add = only_consumer(out_of(mean, 0));
    if (!add || !is_op(*add, "Add") || !other(*add, out_of(mean, 0)) || !scalar(*other(*add, out_of(mean, 0)))) return;
    auto sqrt = only_consumer(out_of(*add, 0));
    if (!sqrt || !is_op(*sqrt, "Sqrt")) return;
    auto inv = only_consumer(out_of(*sqrt, 0));
    if (!inv) return;
    std::vector<int> body{pow, mean, *add, *sqrt, *inv};
    int last = -1;
    if (is_op(*inv, "Div") && in_of(*inv, 0) == x && in_of(*inv, 1) == out_of(*sqrt, 0)) {
      last = *inv;
    } else {
      const bool recip = is_op(*inv, "Reciprocal") ||
                         (is_op(*inv, "Div") && in_of(*inv, 1) == out_of(*sqrt, 0) && near(scalar(in_of(*inv, 0)), 1.0));
      auto mul = recip ? only_consumer(out_of(*inv, 0)) : std::nullopt;
      if (!mul || !is_op(*mul, "Mul") || other(*mul, out_of(*inv, 0)) != x) return;
      last = *mul;
      body.push_back(last);
    }
    fusion f{op_kind::rms_norm, {x}, {}, pattern_name(*sqrt), out_of(last, 0)};
    std::string y = f.output;
    auto next = only_consumer(y);
    if (next && is_op(*next, "Cast")) {  // back to the input dtype, before the weight
      auto cv = values.find(out_of(*next, 0));
      if (cv != values.end() && cv->second.known && is_float(cv->second.type) && only_consumer(out_of(*next, 0))) {
        auto wm = only_consumer(out_of(*next, 0));
        auto w = wm && is_op(*wm, "Mul") ? other(*wm, out_of(*next, 0)) : std::nullopt;
        if (w && is_param_vector(*w, h) && producer(*w) < 0) {
          body.push_back(*next);
          y = out_of(*next, 0);
          next = wm;
        }
      }
    }
    if (next && is_op(*next, "Mul")) {
      if (auto w = other(*next, y); w && is_param_vector(*w, h) && producer(*w) < 0) {
        f.operands.push_back(*w);
        f.output = out_of(*next, 0);
        last = *next;
        body.push_back(last);
      }
    }
    if (f.operands.size() == 1 && y != f.output) return;  // a Cast with no weight after it: left alone
    for (int k : body) absorbed[static_cast<std::size_t>(k)] = 1;
    absorbed[static_cast<std::size_t>(last)] = 1;
    fused[last] = std::move(f);
  }

  /// A 2-D floating initializer, or Transpose(perm [1,0]) of one: the weight of a linear.
  struct weight_ref {
    std::string name;
    bool transposed_weight;  // [in,out]
    int transpose_node = -1;
  };
  std::optional<weight_ref> weight_of(const std::string& v) const {
    auto it = values.find(v);
    if (it == values.end()) return std::nullopt;
    if (it->second.init && it->second.known && it->second.shape.rank == 2 && is_float(it->second.type) &&
        producer(v) < 0)
      return weight_ref{v, true};
    const int t = producer(v);
    if (is_op(t, "Transpose") && only_consumer(v)) {
      auto perm = attr_ints(nd(t), "perm");
      const std::string w = in_of(t, 0);
      auto wi = values.find(w);
      if (wi != values.end() && wi->second.init && producer(w) < 0 && wi->second.known && wi->second.shape.rank == 2 &&
          is_float(wi->second.type) && (!perm || *perm == std::vector<std::int64_t>{1, 0}))
        return weight_ref{w, false, t};
    }
    return std::nullopt;
  }

  /// MatMul(x, W) [+ Add(., b)] with W a 2-D initializer (or its transpose) -> linear.
  void fuse_linear(int mm) {
    const auto& n = nd(mm);
    if (n.input_size() != 2) return;
    auto w = weight_of(n.input(1));
    auto xv = values.find(n.input(0));
    if (!w || xv == values.end() || !xv->second.known || xv->second.shape.rank < 1) return;
    const tensor_shape ws = values.at(w->name).shape;
    const std::int64_t out_features = w->transposed_weight ? ws[1] : ws[0];
    fusion f{op_kind::linear, {n.input(0), w->name}, {}, pattern_name(mm), n.output(0)};
    f.attrs.transposed_weight = w->transposed_weight;
    int last = mm;
    if (auto add = only_consumer(n.output(0)); add && is_op(*add, "Add")) {
      if (auto b = other(*add, n.output(0)); b && is_param_vector(*b, out_features) && producer(*b) < 0) {
        f.operands.push_back(*b);
        f.output = out_of(*add, 0);
        absorb({mm});
        last = *add;
      }
    }
    if (w->transpose_node >= 0) absorb({w->transpose_node});
    absorbed[static_cast<std::size_t>(last)] = 1;
    fused[last] = std::move(f);
  }

  /// Transpose(Reshape(x [B,S,H] -> [B,S,heads,hd]), perm): x, heads; nullopt otherwise.
  std::optional<std::pair<std::string, std::int64_t>> heads_of(const std::string& v, const std::vector<std::int64_t>& perm) const {
    const int t = producer(v);
    if (!is_op(t, "Transpose") || !only_consumer(v) || attr_ints(nd(t), "perm") != perm) return std::nullopt;
    const int r = producer(in_of(t, 0));
    if (!is_op(r, "Reshape") || !only_consumer(in_of(t, 0))) return std::nullopt;
    const std::string x = in_of(r, 0);
    auto xi = values.find(x);
    auto ri = values.find(out_of(r, 0));
    if (xi == values.end() || ri == values.end() || !xi->second.known || !ri->second.known) return std::nullopt;
    const tensor_shape& a = xi->second.shape;
    const tensor_shape& b = ri->second.shape;
    if (a.rank != 3 || b.rank != 4 || b[0] != a[0] || b[1] != a[1] || b[2] * b[3] != a[2]) return std::nullopt;
    return std::pair{x, b[2]};
  }
  /// Whether `v` is a constant causal mask for scores whose last two dims are [S, S]: an
  /// initializer [.., P, P] (or the top-left [0:S, 0:S] of it that Slices with zero starts
  /// take, as exporters cut a buffer of max_positions to the sequence) holding, on and below
  /// the diagonal / above it: with `additive`, 0 / at most -1e4 (added to the scores); else
  /// true / false (Where's condition, GPT-2's bool `bias` buffer).
  bool causal_mask(const std::string& v, const tensor_shape& scores, bool additive, std::vector<int>& nodes_used) const {
    auto vi = values.find(v);
    if (vi == values.end() || !vi->second.known || vi->second.shape.rank < 2 || scores.rank < 2) return false;
    const tensor_shape& ms = vi->second.shape;  // the mask as the scores see it: [.., S, S] exactly
    if (ms[ms.rank - 1u] != scores[scores.rank - 1u] || ms[ms.rank - 2u] != scores[scores.rank - 2u] ||
        scores[scores.rank - 1u] != scores[scores.rank - 2u])
      return false;
    std::string src = v;
    for (int sl = producer(src); sl >= 0; sl = producer(src)) {
      if (!is_op(sl, "Slice") || !only_consumer(src) || nd(sl).input_size() < 3) return false;
      auto st = constant(in_of(sl, 1));
      if (!st) return false;
      for (double x : *st)
        if (x != 0) return false;
      if (nd(sl).input_size() > 4 && !in_of(sl, 4).empty()) {
        auto steps = constant(in_of(sl, 4));
        if (!steps) return false;
        for (double x : *steps)
          if (x != 1) return false;
      }
      src = in_of(sl, 0);
      nodes_used.push_back(sl);
    }
    auto it = values.find(src);
    if (it == values.end() || !it->second.init || !it->second.known || it->second.shape.rank < 2) return false;
    const tensor_shape& s = it->second.shape;
    const std::int64_t n = s[s.rank - 1u];
    if (s[s.rank - 2u] != n || s.numel() != n * n || n > 8192) return false;
    auto m = constant(src, n * n);
    if (!m) return false;
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        const double x = (*m)[static_cast<std::size_t>(i * n + j)];
        const bool ok = additive ? (j <= i ? x == 0.0 : x <= -1e4) : (j <= i ? x != 0.0 : x == 0.0);
        if (!ok) return false;
      }
    return true;
  }
  /// Softmax(QK^T / sqrt(hd) [+ causal mask]) V over heads split from [B,S,H] by
  /// Reshape + Transpose, merged back by Transpose + Reshape -> attention(q, k, v).
  void fuse_attention(int sm) {
    const auto& n = nd(sm);
    if (n.input_size() != 1 || n.output_size() != 1) return;
    auto in = values.find(n.input(0));
    if (in == values.end() || !in->second.known || in->second.shape.rank != 4 || !only_consumer(n.input(0))) return;
    if (attr_int(n, "axis", -1) != -1 && attr_int(n, "axis", -1) != 3) return;
    std::vector<int> used{sm};
    std::string z = n.input(0);
    const tensor_shape scores = in->second.shape;
    bool causal = false;
    int p = producer(z);
    if (is_op(p, "Add")) {  // a constant additive mask
      for (int side = 0; side < 2 && !causal; ++side) {
        std::vector<int> mask_nodes;
        if (causal_mask(in_of(p, 1 - side), scores, true, mask_nodes)) {
          causal = true;
          used.push_back(p);
          used.insert(used.end(), mask_nodes.begin(), mask_nodes.end());
          z = in_of(p, side);
        }
      }
      if (!causal) return;
      if (!only_consumer(z)) return;
      p = producer(z);
    } else if (is_op(p, "Where") && nd(p).input_size() == 3) {  // Where(causal, scores, very negative): GPT-2's export
      std::vector<int> mask_nodes;
      const std::optional<double> fill = scalar(in_of(p, 2));
      if (!fill || !(*fill <= -1e4) || !causal_mask(in_of(p, 0), scores, false, mask_nodes)) return;
      causal = true;
      used.push_back(p);
      used.insert(used.end(), mask_nodes.begin(), mask_nodes.end());
      z = in_of(p, 1);
      if (!only_consumer(z)) return;
      p = producer(z);
    }
    double scale = 1.0;
    if (is_op(p, "Div") || is_op(p, "Mul")) {
      auto c = scalar(in_of(p, 1));
      if (!c || *c == 0.0) return;
      scale = nd(p).op_type() == "Div" ? 1.0 / *c : *c;
      used.push_back(p);
      z = in_of(p, 0);
      if (!only_consumer(z)) return;
      p = producer(z);
    }
    if (!is_op(p, "MatMul")) return;
    used.push_back(p);
    auto q = heads_of(in_of(p, 0), {0, 2, 1, 3});
    std::optional<std::pair<std::string, std::int64_t>> k = heads_of(in_of(p, 1), {0, 2, 3, 1});
    int kt = -1;
    if (!k) {  // Transpose(kh, [0,1,3,2]) of kh = Transpose(Reshape(k), [0,2,1,3])
      kt = producer(in_of(p, 1));
      if (!is_op(kt, "Transpose") || !only_consumer(in_of(p, 1)) || attr_ints(nd(kt), "perm") != std::vector<std::int64_t>{0, 1, 3, 2}) return;
      k = heads_of(in_of(kt, 0), {0, 2, 1, 3});
    }
    if (!q || !k || q->second != k->second) return;
    const std::int64_t heads = q->second;
    const std::int64_t hd = values.at(q->first).shape[2] / heads;
    if (std::abs(scale * std::sqrt(static_cast<double>(hd)) - 1.0) > 1e-3) return;  // the kind scales by 1/sqrt(hd)
    // probs @ vh, back to [B,S,H]
    auto pv = only_consumer(n.output(0));
    if (!pv || !is_op(*pv, "MatMul") || in_of(*pv, 0) != n.output(0)) return;
    auto v = heads_of(in_of(*pv, 1), {0, 2, 1, 3});
    if (!v || v->second != heads) return;
    auto tr = only_consumer(out_of(*pv, 0));
    if (!tr || !is_op(*tr, "Transpose") || attr_ints(nd(*tr), "perm") != std::vector<std::int64_t>{0, 2, 1, 3}) return;
    auto rs = only_consumer(out_of(*tr, 0));
    if (!rs || !is_op(*rs, "Reshape")) return;
    auto out_v = values.find(out_of(*rs, 0));
    if (out_v == values.end() || !out_v->second.known || !(out_v->second.shape == values.at(q->first).shape)) return;
    for (const std::string& x : {q->first, k->first, v->first})
      if (!values.at(x).known || values.at(x).shape.rank != 3) return;
    for (const std::string& hv : {in_of(p, 0), in_of(*pv, 1)}) {  // the Transpose and Reshape of q and v
      const int t = producer(hv);
      used.push_back(t);
      used.push_back(producer(in_of(t, 0)));
    }
    const int kh = producer(kt >= 0 ? in_of(kt, 0) : in_of(p, 1));
    used.push_back(kh);
    used.push_back(producer(in_of(kh, 0)));
    if (kt >= 0) used.push_back(kt);
    used.push_back(*pv);
    used.push_back(*tr);
    for (int u : used) absorbed[static_cast<std::size_t>(u)] = 1;
    absorbed[static_cast<std::size_t>(*rs)] = 1;
    fusion f{op_kind::attention, {q->first, k->first, v->first}, {}, pattern_name(sm), out_of(*rs, 0)};
    f.attrs.heads = static_cast<int>(heads);
    f.attrs.kv_heads = static_cast<int>(heads);
    f.attrs.causal = causal;
    fused[*rs] = std::move(f);
  }

  void find_fusions() {
    absorbed.assign(nodes.size(), 0);
    for (std::size_t k = 0; k < nodes.size(); ++k)
      if (needed[k] && is_op(static_cast<int>(k), "Div")) fuse_layer_norm(static_cast<int>(k));
    for (std::size_t k = 0; k < nodes.size(); ++k)
      if (needed[k] && is_op(static_cast<int>(k), "ReduceMean")) fuse_rms_norm(static_cast<int>(k));
    for (std::size_t k = 0; k < nodes.size(); ++k)
      if (needed[k] && is_op(static_cast<int>(k), "Erf")) fuse_erf_gelu(static_cast<int>(k));
    for (std::size_t k = 0; k < nodes.size(); ++k)
      if (needed[k] && is_op(static_cast<int>(k), "Tanh")) fuse_tanh_gelu(static_cast<int>(k));
    for (std::size_t k = 0; k < nodes.size(); ++k)
      if (needed[k] && is_op(static_cast<int>(k), "Sigmoid")) fuse_silu(static_cast<int>(k));
    for (std::size_t k = 0; k < nodes.size(); ++k)
      if (needed[k] && is_op(static_cast<int>(k), "Softmax")) fuse_attention(static_cast<int>(k));
    for (std::size_t k = 0; k < nodes.size(); ++k)
      if (needed[k] && is_op(static_cast<int>(k), "MatMul")) fuse_linear(static_cast<int>(k));
  }

  // ---- emitting vertices ----
  /// A vertex name: torch.onnx.export's node names are module paths ("/transformer/h.0/attn/
  /// c_attn/MatMul"), written with dots as the module and its parameters are
  /// ("transformer.h.0.attn.c_attn.MatMul"), so that repeated layers are recognised as such.
  std::string unique_name(std::string base) {
    if (!base.empty() && base[0] == '/' && base.size() > 1) {
      base.erase(0, 1);
      std::replace(base.begin(), base.end(), '/', '.');
    }
    if (base.empty()) base = "node";
    std::string n = base;
    for (int i = 2; used_names.count(n); ++i) n = base + "#" + std::to_string(i);
    used_names.insert(n);
    return n;
  }
  const value_info& known(const std::string& v, const std::string& who) const {
    auto it = values.find(v);
    if (it == values.end()) fail(who + ": value '" + v + "' is not defined");
    if (!it->second.known) fail(who + ": " + (it->second.unknown_why.empty() ? "the type of '" + v + "' is unknown" : it->second.unknown_why));
    return it->second;
  }
  /// The vertex of value `v`, creating the source vertex of an input, initializer or constant.
  vertex_t operand(const std::string& v, const std::string& who) {
    if (auto it = vertex_of.find(v); it != vertex_of.end()) return it->second;
    const value_info& vi = known(v, who);
    if (vi.producer >= 0 && !vi.init) {
      const int p = vi.producer;
      if (nd(p).op_type() == "Shape" && default_domain(nd(p))) return shape_value(p, v, who);
      if (!(nd(p).op_type() == "Constant" && default_domain(nd(p))))  // value_float, value_ints, ...: an input below
        fail(who + ": value '" + v + "' of " + node_label(nd(p), p) + " was not computed (an internal ordering error)");
    }
    vertex_t u;
    if (vi.init && vi.producer < 0 && is_float(vi.type))
      u = add_parameter(out.graph, unique_name(v), vi.shape, vi.type);  // a weight: the initializer's name
    else
      u = add_input(out.graph, unique_name(v), vi.shape, vi.type);  // data: graph inputs, constants, integer tables
    vertex_of[v] = u;
    return u;
  }
  /// A Shape node's output used as data: a constant input (its value is the inferred shape).
  vertex_t shape_value(int p, const std::string& v, const std::string& who) {
    const value_info& in = known(in_of(p, 0), who);
    const vertex_t u = add_input(out.graph, unique_name(v), tensor_shape{static_cast<std::int64_t>(in.shape.rank)}, dtype::i64);
    vertex_of[v] = u;
    return u;
  }

  void opaque(int k, const std::string& why) {
    const onnx::NodeProto& n = nd(k);
    const std::string who = node_label(n, k);
    std::vector<vertex_t> ops;
    for (int i : data_inputs(n))
      if (i < n.input_size() && !n.input(i).empty()) ops.push_back(operand(n.input(i), who));
    if (ops.size() > 64) fail(who + " has " + std::to_string(ops.size()) + " inputs; an opaque operator takes at most 64");
    const std::string base = n.name().empty() ? (n.output_size() ? n.output(0) : n.op_type()) : n.name();
    for (int i = 0; i < n.output_size(); ++i) {
      const std::string& o = n.output(i);
      if (o.empty() || !values.at(o).graph_output) {
        bool used = false;
        if (!o.empty())
          for (int c : values.at(o).consumers) used = used || needed[static_cast<std::size_t>(c)] || absorbed[static_cast<std::size_t>(c)];
        if (!used) continue;
      }
      const value_info& vi = known(o, who);
      op_attrs a;
      a.dims = vi.shape.to_vector();
      a.op_type = qualified(n);
      const std::string name = unique_name(n.output_size() > 1 ? base + ":" + std::to_string(i) : base);
      vertex_of[o] = add_op(out.graph, op_kind::opaque, name, ops, a, vi.type);
      out.opaque.push_back({name, a.op_type, why});
    }
  }

  /// Adds a vertex of kind `k` for output `o` of node `k_node` when the kind's shape rule
  /// gives ONNX's shape; false (nothing added) when it does not.
  bool try_emit(op_kind kind, const std::string& name, const std::vector<std::string>& ins, op_attrs a,
                const std::string& o, const std::string& who, std::string& why) {
    const value_info& ov = known(o, who);
    std::vector<tensor_shape> shapes;
    for (const std::string& in : ins) shapes.push_back(known(in, who).shape);
    tensor_shape s;
    try {
      s = infer_shape(kind, a, shapes);
    } catch (const graph_error& e) {
      why = std::string(to_string(kind)) + " does not fit: " + std::string(e.message());
      return false;
    }
    if (!(s == ov.shape)) {
      why = std::string(to_string(kind)) + " would give " + to_string(s) + ", ONNX infers " + to_string(ov.shape);
      return false;
    }
    std::vector<vertex_t> ops;
    for (const std::string& in : ins) ops.push_back(operand(in, who));
    vertex_of[o] = add_op(out.graph, kind, unique_name(name), ops, std::move(a), ov.type);
    return true;
  }

  void emit(int k) {
    const onnx::NodeProto& n = nd(k);
    const std::string who = node_label(n, k);
    // A Gemm, a LayerNormalization or a Gelu is the whole module it came from: named by the
    // module's path ("/0/Gemm" -> "0"), as the builders name linears and norms.
    const bool module_op = n.op_type() == "Gemm" || n.op_type() == "LayerNormalization" || n.op_type() == "Gelu";
    const std::string name = n.name().empty() ? (n.output_size() ? n.output(0) : n.op_type()) : module_op ? pattern_name(k) : n.name();
    std::string why = "no mapping";
    if (auto f = fused.find(k); f != fused.end()) {
      if (try_emit(f->second.kind, f->second.name, f->second.operands, f->second.attrs, f->second.output, who, why)) return;
      fail(who + ": the fused " + std::string(to_string(f->second.kind)) + " '" + f->second.name + "' does not fit: " + why);
    }
    const std::string& t = n.op_type();
    const bool std_op = default_domain(n);
    auto in = [&](int i) { return i < n.input_size() ? n.input(i) : std::string(); };
    const std::string out0 = n.output_size() ? n.output(0) : std::string();
    auto rank_of = [&](const std::string& v) { return static_cast<std::int64_t>(known(v, who).shape.rank); };
    auto norm_axis = [](std::int64_t a, std::int64_t r) { return a < 0 ? a + r : a; };
    auto single_output = [&] {
      for (int i = 1; i < n.output_size(); ++i)
        if (!n.output(i).empty() && !values.at(n.output(i)).consumers.empty()) return false;
      return true;
    };
    if (std_op) {
      static const std::map<std::string, op_kind> unary{{"Relu", op_kind::relu}, {"Tanh", op_kind::tanh}, {"Exp", op_kind::exp},
                                                        {"Identity", op_kind::dropout}};
      static const std::map<std::string, op_kind> binary{{"Add", op_kind::add}, {"Sub", op_kind::sub}, {"Mul", op_kind::mul}, {"Div", op_kind::div}};
      if (auto u = unary.find(t); u != unary.end() && n.input_size() == 1) {
        if (try_emit(u->second, name, {in(0)}, {}, out0, who, why)) return;
      } else if (t == "Gelu" && n.input_size() == 1) {  // opset 20: approximate "none" (erf) or "tanh"
        const auto* ap = attr(n, "approximate");
        const std::string approx = ap ? ap->s() : "none";
        if (approx != "none" && approx != "tanh") why = "approximate is '" + approx + "'";
        else if (try_emit(approx == "tanh" ? op_kind::gelu : op_kind::gelu_erf, name, {in(0)}, {}, out0, who, why))
          return;
      } else if (t == "Dropout" && single_output()) {
        if (try_emit(op_kind::dropout, name, {in(0)}, {}, out0, who, why)) return;
      } else if (auto b = binary.find(t); b != binary.end() && n.input_size() == 2) {
        if (try_emit(b->second, name, {in(0), in(1)}, {}, out0, who, why)) return;
      } else if (t == "MatMul" && n.input_size() == 2) {
        if (try_emit(op_kind::matmul, name, {in(0), in(1)}, {}, out0, who, why)) return;
      } else if (t == "Gemm" && n.input_size() >= 2) {
        auto w = values.find(in(1));
        const bool w_ok = w != values.end() && w->second.init && w->second.producer < 0 && w->second.known &&
                          w->second.shape.rank == 2 && is_float(w->second.type);
        const bool has_c = n.input_size() > 2 && !in(2).empty();
        op_attrs a;
        a.transposed_weight = attr_int(n, "transB", 0) == 0;
        const std::int64_t nout = w_ok ? w->second.shape[a.transposed_weight ? 1u : 0u] : 0;
        if (attr(n, "alpha") && attr(n, "alpha")->f() != 1.0f) why = "alpha is not 1";
        else if (has_c && attr(n, "beta") && attr(n, "beta")->f() != 1.0f) why = "beta is not 1";
        else if (attr_int(n, "transA", 0) != 0) why = "transA is set";
        else if (!w_ok) why = "B is not a 2-D floating initializer";
        else if (has_c && !is_param_vector(in(2), nout)) why = "C is not a 1-D initializer of " + std::to_string(nout);
        else {
          std::vector<std::string> ops{in(0), in(1)};
          if (has_c) ops.push_back(in(2));
          if (try_emit(op_kind::linear, name, ops, a, out0, who, why)) return;
        }
      } else if (t == "Softmax" && n.input_size() == 1) {
        const std::int64_t r = rank_of(in(0));
        const std::int64_t ax = norm_axis(attr_int(n, "axis", out.opset >= 13 ? -1 : 1), r);
        if (out.opset < 13 && ax != r - 1) why = "opset " + std::to_string(out.opset) + " Softmax flattens from axis " + std::to_string(ax);
        else {
          op_attrs a;
          a.axis = static_cast<int>(ax);
          if (try_emit(op_kind::softmax, name, {in(0)}, a, out0, who, why)) return;
        }
      } else if (t == "LayerNormalization" && single_output()) {
        const std::int64_t r = rank_of(in(0));
        if (norm_axis(attr_int(n, "axis", -1), r) != r - 1) why = "normalises more than the last dim";
        else {
          std::vector<std::string> ops{in(0)};
          for (int i = 1; i < n.input_size() && i < 3; ++i)
            if (!in(i).empty()) ops.push_back(in(i));
          if (ops.size() == static_cast<std::size_t>(std::min(n.input_size(), 3)) &&
              try_emit(op_kind::layer_norm, name, ops, {}, out0, who, why))
            return;
        }
      } else if (t == "Reshape" || t == "Flatten" || t == "Squeeze" || t == "Unsqueeze") {
        op_attrs a;
        a.dims = known(out0, who).shape.to_vector();
        if (try_emit(op_kind::reshape, name, {in(0)}, a, out0, who, why)) return;
      } else if (t == "Cast") {
        const value_info& src = known(in(0), who);
        const value_info& dst = known(out0, who);
        if (!is_float(src.type) || !is_float(dst.type)) why = "casts between " + std::string(to_string(src.type)) + " and " + std::string(to_string(dst.type));
        else {
          op_attrs a;
          a.dims = dst.shape.to_vector();
          if (try_emit(op_kind::reshape, name, {in(0)}, a, out0, who, why)) return;
        }
      } else if (t == "Transpose") {
        const std::int64_t r = rank_of(in(0));
        op_attrs a;
        if (auto p = attr_ints(n, "perm")) a.dims = *p;
        else
          for (std::int64_t d = r - 1; d >= 0; --d) a.dims.push_back(d);
        if (try_emit(op_kind::transpose, name, {in(0)}, a, out0, who, why)) return;
      } else if (t == "Gather" && n.input_size() == 2) {
        const value_info& table = known(in(0), who);
        const value_info& ids = known(in(1), who);
        if (attr_int(n, "axis", 0) != 0 || table.shape.rank != 2 || !is_float(table.type) || is_float(ids.type))
          why = "only a lookup of rows of a 2-D floating table maps (to embedding)";
        else if (try_emit(op_kind::embedding, name, {in(1), in(0)}, {}, out0, who, why))
          return;
      } else if (t == "Concat") {
        op_attrs a;
        a.axis = static_cast<int>(attr_int(n, "axis", 0));
        std::vector<std::string> ops;
        for (const std::string& i : n.input())
          if (!i.empty()) ops.push_back(i);
        if (try_emit(op_kind::concat, name, ops, a, out0, who, why)) return;
      } else if (t == "Split") {
        if (split(k, name, who, why)) return;
      } else if (t == "Slice") {
        if (auto s = slice(k, who, why)) {
          vertex_of[out0] = *s;
          return;
        }
      } else if ((t == "ReduceMean" || t == "ReduceSum") && n.input_size() >= 1 && n.output_size() == 1) {
        if (reduce(k, t == "ReduceMean" ? op_kind::reduce_mean : op_kind::reduce_sum, name, who, why)) return;
      } else if (t == "Where" && n.input_size() == 3) {
        const value_info& cond = known(in(0), who);
        if (is_float(cond.type) || !is_float(known(in(1), who).type) || !is_float(known(in(2), who).type))
          why = "only a select of floating values by a boolean or integer condition maps";
        else if (try_emit(op_kind::where, name, {in(0), in(1), in(2)}, {}, out0, who, why))
          return;
      } else if (t == "Expand" && n.input_size() == 2) {
        if (!is_float(known(in(0), who).type)) why = "expands " + std::string(to_string(known(in(0), who).type)) + " values";
        else {
          op_attrs a;
          a.dims = known(out0, who).shape.to_vector();
          if (try_emit(op_kind::expand, name, {in(0)}, a, out0, who, why)) return;
        }
      }
    } else if (n.domain() == "com.microsoft" && (t == "Gelu" || t == "FastGelu") && n.input_size() == 1) {
      // Gelu is the exact (erf) form, FastGelu the tanh approximation
      if (try_emit(t == "Gelu" ? op_kind::gelu_erf : op_kind::gelu, name, {in(0)}, {}, out0, who, why)) return;
    }
    opaque(k, why);
  }

  /// Split: one split vertex per used output, [start, start + length) from the inferred shapes.
  bool split(int k, const std::string& name, const std::string& who, std::string& why) {
    const onnx::NodeProto& n = nd(k);
    if (n.input_size() < 1) return why = "no input", false;
    const value_info& x = known(n.input(0), who);
    const auto r = static_cast<std::int64_t>(x.shape.rank);
    std::int64_t ax = attr_int(n, "axis", 0);
    ax = ax < 0 ? ax + r : ax;
    if (ax < 0 || ax >= r) return why = "axis " + std::to_string(ax) + " is outside " + to_string(x.shape), false;
    std::vector<op_attrs> parts;
    std::int64_t start = 0;
    for (int i = 0; i < n.output_size(); ++i) {
      const value_info& o = known(n.output(i), who);
      op_attrs a;
      a.axis = static_cast<int>(ax);
      a.start = start;
      a.length = o.shape.rank == x.shape.rank ? o.shape[static_cast<std::size_t>(ax)] : -1;
      try {
        if (!(infer_shape(op_kind::split, a, std::vector<tensor_shape>{x.shape}) == o.shape)) throw graph_error("output " + std::to_string(i) + " is " + to_string(o.shape));
      } catch (const graph_error& e) {
        return why = std::string(e.message()), false;
      }
      start += a.length;
      parts.push_back(std::move(a));
    }
    const vertex_t src = operand(n.input(0), who);
    for (int i = 0; i < n.output_size(); ++i) {
      const std::string& o = n.output(i);
      if (o.empty() || (values.at(o).consumers.empty() && !values.at(o).graph_output)) continue;
      vertex_of[o] = add_op(out.graph, op_kind::split, unique_name(name + ":" + std::to_string(i)), {src}, parts[static_cast<std::size_t>(i)],
                            values.at(o).type);
    }
    return true;
  }

  /// Slice with constant bounds and unit steps: one split vertex per sliced axis.
  std::optional<vertex_t> slice(int k, const std::string& who, std::string& why) {
    const onnx::NodeProto& n = nd(k);
    if (n.input_size() < 1 || n.output_size() != 1) return why = "not one input and one output", std::nullopt;
    const value_info& x = known(n.input(0), who);
    const value_info& o = known(n.output(0), who);
    const auto r = static_cast<std::int64_t>(x.shape.rank);
    std::vector<double> starts, ends, axes, steps;
    if (out.opset < 10) {
      auto s = attr_ints(n, "starts"), e = attr_ints(n, "ends"), a = attr_ints(n, "axes");
      if (!s || !e) return why = "starts or ends missing", std::nullopt;
      for (auto v : *s) starts.push_back(static_cast<double>(v));
      for (auto v : *e) ends.push_back(static_cast<double>(v));
      if (a) for (auto v : *a) axes.push_back(static_cast<double>(v));
    } else {
      auto s = n.input_size() > 1 ? constant(n.input(1)) : std::nullopt;
      auto e = n.input_size() > 2 ? constant(n.input(2)) : std::nullopt;
      if (!s || !e) return why = "starts and ends are not constants", std::nullopt;
      starts = *s, ends = *e;
      if (n.input_size() > 3 && !n.input(3).empty()) {
        auto a = constant(n.input(3));
        if (!a) return why = "axes are not constants", std::nullopt;
        axes = *a;
      }
      if (n.input_size() > 4 && !n.input(4).empty()) {
        auto st = constant(n.input(4));
        if (!st) return why = "steps are not constants", std::nullopt;
        steps = *st;
      }
    }
    if (axes.empty())
      for (std::size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<double>(i));
    if (starts.size() != ends.size() || starts.size() != axes.size() || (!steps.empty() && steps.size() != starts.size()))
      return why = "starts, ends, axes and steps differ in length", std::nullopt;
    for (double s : steps)
      if (s != 1.0) return why = "a step is not 1", std::nullopt;
    std::string cur = n.input(0);
    tensor_shape cur_shape = x.shape;
    std::optional<vertex_t> v;
    for (std::size_t i = 0; i < axes.size(); ++i) {
      std::int64_t ax = static_cast<std::int64_t>(axes[i]);
      ax = ax < 0 ? ax + r : ax;
      if (ax < 0 || ax >= r) return why = "axis outside the input", std::nullopt;
      const std::int64_t dim = cur_shape[static_cast<std::size_t>(ax)];
      auto clamp = [&](double b) {
        if (b < 0) b += static_cast<double>(dim);
        return static_cast<std::int64_t>(std::min(std::max(b, 0.0), static_cast<double>(dim)));
      };
      const std::int64_t s = clamp(starts[i]), e = std::max(clamp(ends[i]), s);
      if (s == 0 && e == dim) continue;
      op_attrs a;
      a.axis = static_cast<int>(ax);
      a.start = s;
      a.length = e - s;
      std::vector<tensor_shape> shapes{cur_shape};
      tensor_shape next;
      try {
        next = infer_shape(op_kind::split, a, shapes);
      } catch (const graph_error& err) {
        return why = std::string(err.message()), std::nullopt;
      }
      const vertex_t src = v ? *v : operand(cur, who);
      const std::string nm = n.name().empty() ? n.output(0) : n.name();
      v = add_op(out.graph, op_kind::split, unique_name(axes.size() > 1 ? nm + ":" + std::to_string(ax) : nm), {src}, a, o.type);
      cur_shape = next;
    }
    if (!(cur_shape == o.shape)) return why = "the slices give " + to_string(cur_shape) + ", ONNX infers " + to_string(o.shape), std::nullopt;
    if (!v) {  // slices nothing away: a view
      op_attrs a;
      a.dims = o.shape.to_vector();
      v = add_op(out.graph, op_kind::reshape, unique_name(n.name().empty() ? n.output(0) : n.name()), {operand(n.input(0), who)}, a, o.type);
    }
    return v;
  }

  /// ReduceMean / ReduceSum over constant axes; keepdims adds a reshape back to ONNX's shape.
  bool reduce(int k, op_kind kind, const std::string& name, const std::string& who, std::string& why) {
    const onnx::NodeProto& n = nd(k);
    const value_info& x = known(n.input(0), who);
    const value_info& o = known(n.output(0), who);
    const auto r = static_cast<std::int64_t>(x.shape.rank);
    std::optional<std::vector<std::int64_t>> axes = attr_ints(n, "axes");
    if (!axes && n.input_size() > 1 && !n.input(1).empty()) {
      auto c = constant(n.input(1));
      if (!c) return why = "axes are not constants", false;
      axes = std::vector<std::int64_t>();
      for (double d : *c) axes->push_back(static_cast<std::int64_t>(d));
    }
    if (!axes || axes->empty()) {
      if (attr_int(n, "noop_with_empty_axes", 0)) return why = "reduces nothing", false;
      axes = std::vector<std::int64_t>();
      for (std::int64_t d = 0; d < r; ++d) axes->push_back(d);
    }
    op_attrs a;
    for (std::int64_t d : *axes) a.dims.push_back(d < 0 ? d + r : d);
    std::sort(a.dims.begin(), a.dims.end());
    tensor_shape reduced;
    try {
      reduced = infer_shape(kind, a, std::vector<tensor_shape>{x.shape});
    } catch (const graph_error& e) {
      return why = std::string(e.message()), false;
    }
    if (reduced.numel() != o.shape.numel()) return why = "ONNX infers " + to_string(o.shape), false;
    const bool keep = !(reduced == o.shape);
    vertex_t v = add_op(out.graph, kind, unique_name(keep ? name + ":reduce" : name), {operand(n.input(0), who)}, a, o.type);
    if (keep) {
      op_attrs ra;
      ra.dims = o.shape.to_vector();
      v = add_op(out.graph, op_kind::reshape, unique_name(name), {v}, ra, o.type);
    }
    vertex_of[n.output(0)] = v;
    return true;
  }

  void build() {
    mark_needed();
    find_fusions();
    // The graph inputs first, in the model's order (as the builders add them: the memory
    // model's live ranges follow the vertex order); weights and constants come on first use.
    for (const auto& i : model.graph().input()) {
      const value_info& v = values.at(i.name());
      bool used = v.graph_output;
      for (int c : v.consumers) used = used || needed[static_cast<std::size_t>(c)];
      if (v.graph_input && used) operand(i.name(), "graph input '" + i.name() + "'");
    }
    bool any = false;
    for (std::size_t k = 0; k < nodes.size(); ++k) {
      if (!needed[k]) continue;
      if (absorbed[k] && !fused.count(static_cast<int>(k))) continue;
      const onnx::NodeProto& n = nd(static_cast<int>(k));
      if (default_domain(n) && (n.op_type() == "Constant" || n.op_type() == "Shape")) continue;  // sources, made on use
      emit(static_cast<int>(k));
      any = true;
    }
    for (const auto& o : model.graph().output()) operand(o.name(), "graph output '" + o.name() + "'");
    if (!any) fail("the graph computes its outputs with no operator autoshard could place");
    validate(out.graph);
  }
};

}  // namespace detail::onnx_in

/// Reads an ONNX model held in memory (`source` names it in messages).
inline onnx_import read_onnx(std::string_view bytes, const std::string& source = "ONNX model", const onnx_options& o = {}) {
  detail::onnx_in::reader r(o, source);
  r.parse(bytes);
  r.sort_nodes();
  r.fix_input_dims();
  r.infer_shapes();
  r.fold_shape_computations();
  r.collect_values();
  r.build();
  return std::move(r.out);
}

/// Reads an ONNX file; its size is checked against o.max_file_bytes before it is read.
inline onnx_import read_onnx_file(const std::string& path, const onnx_options& o = {}) {
  const std::string bytes = read_regular_file(path, "ONNX model", o.max_file_bytes);
  return read_onnx(bytes, "ONNX model '" + path + "'", o);
}

}  // namespace autoshard
