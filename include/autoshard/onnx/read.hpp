#pragma once
/// The ONNX reader's first phases: every count, shape and payload the file gives bounded
/// before use, the protobuf parsed, the nodes in topological order, symbolic input dims
/// sized and ONNX's shape inference run, then every value's type, producer and consumers.
#include "reader.hpp"

namespace autoshard::detail::onnx_in {

// ---- bounds on everything the file says, before it is used ----
inline void reader::check_count(std::int64_t n, const char* what) const {
  if (n > opt.max_nodes)
    fail_io(std::to_string(n) + " " + what + ", more than the limit of " + std::to_string(opt.max_nodes));
}

inline tensor_shape reader::checked_shape(const google::protobuf::RepeatedField<std::int64_t>& dims, const std::string& who) const {
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

inline void reader::check_initializer(const onnx::TensorProto& t, const std::string& who) const {
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

inline void reader::check_type(const onnx::TypeProto& t, const std::string& who) const {
  if (!t.has_tensor_type() || !t.tensor_type().has_shape()) return;
  const auto& dims = t.tensor_type().shape().dim();
  if (dims.size() > static_cast<int>(max_tensor_rank))
    fail_io(who + " has " + std::to_string(dims.size()) + " dims; at most " + std::to_string(max_tensor_rank) + " are supported");
  for (int i = 0; i < dims.size(); ++i)
    if (dims[i].has_dim_value() && (dims[i].dim_value() < 0 || dims[i].dim_value() > max_dim))
      fail_io(who + " dim " + std::to_string(i) + " is " + std::to_string(dims[i].dim_value()) + ", outside [0, 2^40]");
}

// ---- the memory protobuf's parse may take, bounded before it runs ----
// The parsed model is not proportional to the file: a node of 14 bytes on the wire ("x" ->
// Relu -> "y") is a NodeProto of about 350 bytes with its strings, so a 56 MiB file of them
// took 1.4 GiB (a 2 GiB one would take 53 GiB: the OOM killer), and a packed varint of one
// byte is an int64 of eight. The bound walks the wire format once, without the schema: every
// length-delimited field is tried as a message, charged parsed_message_bytes and its fields;
// where that fails it is a string or bytes, charged its bytes or the packed varints they may
// hold (or, if more, what the try had counted: a parse that fails part-way has allocated it).
// In ONNX's schema a field numbered 9 that is not a message is bytes (TensorProto.raw_data,
// AttributeProto.strings), never packed varints: the weights are charged their size, so a real
// model's bound is about twice its file (measured: 1.06 GB for a 512 MiB MatMul weight).
inline constexpr std::uint64_t parsed_message_bytes = 512;  // the largest ONNX message with its allocation, pointer and slack
inline constexpr std::uint64_t parsed_field_bytes = 16;     // one repeated scalar, its array doubled as it grows
inline constexpr std::uint64_t parsed_string_bytes = 64;    // a std::string, its allocation and pointer
inline constexpr std::size_t parsed_max_depth = 100;        // protobuf's own recursion limit
inline constexpr std::uint64_t raw_bytes_field = 9;         // TensorProto.raw_data, AttributeProto.strings

/// An upper bound of the bytes `ParseFromArray` allocates for `bytes` (any message type), in
/// one pass over them.
inline std::uint64_t parsed_bytes_bound(std::string_view bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  std::size_t at = 0;
  std::uint64_t ends = 0;  // the bytes below 0x80 before `at`: where a varint may end
  const auto advance_to = [&](std::size_t to) {
    for (; at < to; ++at) ends += p[at] < 0x80 ? 1 : 0;
  };
  const auto as_bytes = [](std::uint64_t number, std::uint64_t length, std::uint64_t varint_ends) {
    return parsed_string_bytes + (number == raw_bytes_field ? length : std::max(length, varint_ends * parsed_field_bytes));
  };
  struct frame {
    std::size_t start, end;
    std::uint64_t number, ends_at_start, bytes;  ///< the field's number; `bytes`: what its fields take, as far as read
  };
  std::vector<frame> stack{{0, bytes.size(), 0, 0, 0}};
  const auto varint = [&](std::size_t end, std::uint64_t& v) {
    v = 0;
    for (int shift = 0; shift < 64 && at < end; shift += 7) {
      const unsigned char b = p[at];
      advance_to(at + 1);
      v |= std::uint64_t{b & 0x7fu} << shift;
      if (b < 0x80) return true;
    }
    return false;
  };
  // Reads one field of the innermost message (a length-delimited one starts a message to try);
  // false where there is none: that message is not one.
  const auto field = [&] {
    frame& f = stack.back();
    std::uint64_t key = 0, n = 0;
    if (!varint(f.end, key) || (key >> 3) == 0) return false;
    const std::uint64_t wire = key & 7;
    if (wire == 0 || wire == 1 || wire == 5) {  // a scalar
      f.bytes += parsed_field_bytes;
      if (wire == 0) return varint(f.end, n);
      const std::size_t width = wire == 1 ? 8 : 4;
      if (f.end - at < width) return false;
      advance_to(at + width);
      return true;
    }
    if (wire != 2 || !varint(f.end, n)) return false;  // groups (ONNX has none), no wire type
    // A field cut short by the end of its message is read to there: protobuf parses that much
    // before it fails, and has allocated it.
    const std::size_t end = n > f.end - at ? f.end : at + static_cast<std::size_t>(n);
    if (stack.size() < parsed_max_depth) {
      stack.push_back({at, end, key >> 3, ends, 0});  // `f` is not used again
      return true;
    }
    const std::uint64_t before = ends, length = end - at;
    advance_to(end);
    f.bytes += as_bytes(key >> 3, length, ends - before);
    return true;
  };
  for (;;) {
    const bool whole = at == stack.back().end;
    if (!whole && field()) continue;
    const frame done = stack.back();
    if (stack.size() == 1) return parsed_message_bytes + done.bytes;  // protobuf stops where this did
    stack.pop_back();
    advance_to(done.end);
    stack.back().bytes += whole ? parsed_message_bytes + done.bytes
                                : std::max(as_bytes(done.number, done.end - done.start, ends - done.ends_at_start),
                                           parsed_message_bytes + done.bytes);
  }
}

/// Refuses `bytes` whose parse may not fit what this process can still allocate.
inline void check_parse_memory(std::string_view bytes, const std::string& source) {
  const std::uint64_t need = parsed_bytes_bound(bytes);
  if (need < (std::uint64_t{64} << 20)) return;  // small models: no /proc read
  const machine_limits m = machine_limits::memory_here();
  if (need <= m.memory()) return;
  throw resource_error(source + ": parsing its " + human_bytes(static_cast<double>(bytes.size())) +
                       " of protobuf may take up to " + human_bytes(static_cast<double>(need)) + " (" +
                       std::to_string(need) + " bytes, counted on its wire format); this process can allocate " +
                       human_bytes(static_cast<double>(m.memory())) + " more (" + m.memory_source() +
                       (m.memory_limited() ? "): free memory or raise the limit" : "): free memory"));
}

/// Every name the graph, the plan file and the tool's JSON may carry (node names, operator
/// types and domains, value names) must be valid UTF-8: protobuf does not check the strings
/// of ONNX's proto2 schema, and nlohmann's dump() throws type_error on such a string when the
/// plan is written, long after the model was read.
inline void reader::check_names() const {
  const auto check = [&](const std::string& s, const std::string& who) {
    const std::size_t at = invalid_utf8_at(s);
    if (at == std::string::npos) return;
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02X", static_cast<unsigned char>(s[at]));
    fail_io(who + " " + quoted_text(s) + " is not valid UTF-8 (byte " + hex + " at offset " + std::to_string(at) +
            " of " + std::to_string(s.size()) + "); autoshard writes every name into JSON");
  };
  const onnx::GraphProto& g = model.graph();
  for (int i = 0; i < g.node_size(); ++i) {
    const onnx::NodeProto& n = g.node(i);
    const std::string who = "node " + std::to_string(i);
    check(n.name(), who + " name");
    check(n.op_type(), who + " op_type");
    check(n.domain(), who + " domain");
    for (int k = 0; k < n.input_size(); ++k) check(n.input(k), who + " input " + std::to_string(k));
    for (int k = 0; k < n.output_size(); ++k) check(n.output(k), who + " output " + std::to_string(k));
  }
  for (int i = 0; i < g.initializer_size(); ++i) check(g.initializer(i).name(), "initializer " + std::to_string(i) + " name");
  for (int i = 0; i < g.input_size(); ++i) check(g.input(i).name(), "graph input " + std::to_string(i) + " name");
  for (int i = 0; i < g.output_size(); ++i) check(g.output(i).name(), "graph output " + std::to_string(i) + " name");
  for (int i = 0; i < g.value_info_size(); ++i) check(g.value_info(i).name(), "value_info " + std::to_string(i) + " name");
}

inline void reader::parse(std::string_view bytes) {
  if (bytes.size() > opt.max_file_bytes)
    fail_io(std::to_string(bytes.size()) + " bytes, more than the limit of " + std::to_string(opt.max_file_bytes));
  check_parse_memory(bytes, source);
  if (bytes.size() > static_cast<std::size_t>(std::numeric_limits<int>::max()) ||
      !model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    fail_io("not an ONNX model: the protobuf does not parse (" + std::to_string(bytes.size()) + " bytes; truncated, or another format?)");
  if (!model.has_graph())  // protobuf's wire format reads many a file (an empty one too) as an empty message
    fail_io("not an ONNX model: it parses as a protobuf message but holds no graph (" + std::to_string(bytes.size()) + " bytes)");
  if (model.graph().node_size() == 0)
    fail_io("the model's graph has no nodes (graph inputs " + std::to_string(model.graph().input_size()) + ", outputs " +
            std::to_string(model.graph().output_size()) + ", initializers " + std::to_string(model.graph().initializer_size()) +
            "): it computes nothing to plan");
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
  check_names();
  for (const auto& t : g.initializer()) check_initializer(t, "initializer " + quoted_text(t.name()));
  if (g.sparse_initializer_size() > 0) fail_io("sparse initializers are not supported (" + quoted_text(g.sparse_initializer(0).values().name()) + ")");
  for (const auto& v : g.input()) check_type(v.type(), "input " + quoted_text(v.name()));
  for (const auto& v : g.output()) check_type(v.type(), "output " + quoted_text(v.name()));
  for (const auto& v : g.value_info()) check_type(v.type(), "value_info " + quoted_text(v.name()));
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

// ---- names from the exporter's module scopes ----
/// The metadata_props fields (repeated StringStringEntryProto) of the messages the exporter
/// annotates: NodeProto's (field 9: pkg.torch.onnx.name_scopes) and ValueInfoProto's (field 4:
/// pkg.torch.export.graph_signature.InputSpec.kind), both IR 10 (ONNX 1.16).
inline constexpr int node_metadata_field = 9;
inline constexpr int value_info_metadata_field = 4;

/// torch.onnx.export's graph (the dynamo exporter, the default since PyTorch 2.9) names its
/// nodes after the FX graph ("node_view_3", "node_MatMul_201": counters over the whole model),
/// and records each node's module path in its metadata: pkg.torch.onnx.name_scopes, a Python
/// list whose last entry is the FX node and the one before it the innermost module,
/// "['', 'transformer', 'transformer.h.0', 'transformer.h.0.attn', 'view_3']". Per node:
/// "/MODULE/OP" for the last node of its op type in that module, "/MODULE/OP_1" for the one
/// before, ... (as the TorchScript exporter named nodes, "/transformer/h.0/attn/MatMul_1", but
/// counted from the end: the exporter computes what every layer reads once, at its first use,
/// early in the first layer, and counting from the end keeps that layer's own nodes named as
/// every other layer's), so that the layers' nodes have
/// the same names but for the layer index (and repeated layers are recognised and tied), and a
/// Gemm takes its module's name (pattern_name). Only nodes that compute on the model's data
/// (`on_data`: a floating graph input, a weight, or what is computed from them) are named so:
/// a value the exporter derives from positions and constants alone, such as the attention mask
/// it builds once in the first layer, keeps its node's own name, outside the layers. A node
/// on the data with no entry (the exporter writes none on the Split of GPT-2's fused q/k/v)
/// takes the module its readers share, the longest dotted prefix of theirs, when every reader
/// has one. Empty where a node has no such entry, or an entry that is not a plain dotted
/// module path, and nothing to take it from.
inline std::vector<std::string> reader::scoped_names(const onnx::GraphProto& g, const std::vector<char>& on_data) {
  std::vector<std::string> names(static_cast<std::size_t>(g.node_size())), modules(names.size());
  std::map<std::pair<std::string, std::string>, int> seen;
  std::unordered_map<std::string, std::vector<int>> readers;
  for (int i = 0; i < g.node_size(); ++i)
    for (const std::string& in : g.node(i).input())
      if (!in.empty()) readers[in].push_back(i);
  const auto shared_module = [&](int i) -> std::string {  // of node i's readers (later in the order: named already)
    std::optional<std::string> common;
    for (const std::string& o : g.node(i).output())
      for (int r : readers[o]) {
        const std::string& m = modules[static_cast<std::size_t>(r)];
        if (m.empty()) return {};
        if (!common) {
          common = m;
          continue;
        }
        std::size_t n = 0;  // the longest common prefix that ends at a dot or a whole path
        for (std::size_t j = 0; j <= std::min(common->size(), m.size()); ++j) {
          const bool end_a = j == common->size() || (*common)[j] == '.', end_b = j == m.size() || m[j] == '.';
          if (end_a && end_b) n = j;
          if (j == common->size() || j == m.size() || (*common)[j] != m[j]) break;
        }
        common = common->substr(0, n);
        if (common->empty()) return {};
      }
    return common.value_or(std::string());
  };
  const auto module_of = [](const std::string& list) -> std::string {
    if (list.size() > 4096 || list.size() < 2 || list.front() != '[' || list.back() != ']') return {};
    std::vector<std::string> items;
    for (std::size_t i = 1; i + 1 < list.size();) {
      if (list[i] == ' ' || list[i] == ',') {
        ++i;
        continue;
      }
      if (list[i] != '\'') return {};
      const std::size_t end = list.find('\'', i + 1);
      if (end == std::string::npos || end + 1 >= list.size()) return {};
      items.push_back(list.substr(i + 1, end - i - 1));
      i = end + 1;
    }
    if (items.size() < 2) return {};
    const std::string& m = items[items.size() - 2];
    if (m.empty() || m.front() == '_' || m.front() == '.' || m.back() == '.') return {};
    for (char c : m)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.')) return {};
    return m;
  };
  for (int i = g.node_size() - 1; i >= 0; --i) {
    const onnx::NodeProto& n = g.node(i);
    if (!default_domain(n) || n.op_type().empty() || !on_data[static_cast<std::size_t>(i)]) continue;
    std::string m = module_of(metadata(n, node_metadata_field, "pkg.torch.onnx.name_scopes"));
    if (m.empty()) m = shared_module(i);
    if (m.empty()) continue;
    modules[static_cast<std::size_t>(i)] = m;
    const int k = seen[{m, n.op_type()}]++;
    names[static_cast<std::size_t>(i)] = "/" + m + "/" + n.op_type() + (k ? "_" + std::to_string(k) : std::string());
  }
  return names;
}

/// The value of message `m`'s metadata entry `key`, held in its field number `field` (one of
/// the above), or "". Debian's ONNX 1.12 predates those fields: protobuf keeps them among the
/// message's unknown fields, each entry a StringStringEntryProto; a newer ONNX has them as
/// fields. What is not such an entry (another wire type, bytes that do not parse) is skipped.
inline std::string reader::metadata(const google::protobuf::Message& m, int field, std::string_view key) {
  const google::protobuf::Reflection* r = m.GetReflection();
  if (const google::protobuf::FieldDescriptor* f = m.GetDescriptor()->FindFieldByNumber(field)) {
    if (!f->is_repeated() || f->type() != google::protobuf::FieldDescriptor::TYPE_MESSAGE) return {};
    for (int i = 0; i < r->FieldSize(m, f); ++i) {
      const google::protobuf::Message& e = r->GetRepeatedMessage(m, f, i);
      const google::protobuf::FieldDescriptor* k = e.GetDescriptor()->FindFieldByName("key");
      const google::protobuf::FieldDescriptor* v = e.GetDescriptor()->FindFieldByName("value");
      if (k && v && k->type() == google::protobuf::FieldDescriptor::TYPE_STRING &&
          v->type() == google::protobuf::FieldDescriptor::TYPE_STRING && e.GetReflection()->GetString(e, k) == key)
        return e.GetReflection()->GetString(e, v);
    }
    return {};
  }
  const google::protobuf::UnknownFieldSet& u = r->GetUnknownFields(m);
  for (int i = 0; i < u.field_count(); ++i) {
    const google::protobuf::UnknownField& x = u.field(i);
    if (x.number() != field || x.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) continue;
    onnx::StringStringEntryProto e;
    if (e.ParseFromString(x.length_delimited()) && e.key() == key) return e.value();
  }
  return {};
}

// ---- which initializers train ----
/// The core fields of an ONNX file do not say which initializers are trained; torch's exporter
/// (torch.onnx.export(..., dynamo=True)) records it in each initializer's value_info metadata:
/// pkg.torch.export.graph_signature.InputSpec.kind, PARAMETER for a parameter, BUFFER for a
/// registered buffer (LLaMA's rotary inv_freq), CONSTANT_TENSOR for a tensor constant. The
/// last two are data the forward reads, with no gradient and no optimizer state: `buffers`,
/// made inputs (operand). An initializer with no such entry (other exporters; the ones torch's
/// exporter computes itself, val_166), or with any other value, is a parameter; where entries
/// disagree, PARAMETER wins.
inline void reader::mark_buffers() {
  const onnx::GraphProto& g = model.graph();
  std::set<std::string> inits, trained;
  for (const auto& t : g.initializer()) inits.insert(t.name());
  const auto mark = [&](const onnx::ValueInfoProto& v) {
    if (!inits.count(v.name())) return;
    const std::string kind = metadata(v, value_info_metadata_field, "pkg.torch.export.graph_signature.InputSpec.kind");
    if (kind == "BUFFER" || kind == "CONSTANT_TENSOR") buffers.insert(v.name());
    else if (kind == "PARAMETER") trained.insert(v.name());
  };
  for (const auto& v : g.value_info()) mark(v);
  for (const auto& v : g.input()) mark(v);  // an initializer listed as an input too (IR < 4)
  for (const std::string& n : trained) buffers.erase(n);
}

// ---- topological order (Kahn), a cycle or a dangling value is an error ----
inline void reader::sort_nodes() {
  onnx::GraphProto& g = *model.mutable_graph();
  std::unordered_map<std::string, int> producer;
  std::set<std::string> available;
  for (const auto& t : g.initializer()) available.insert(t.name());
  for (const auto& v : g.input()) available.insert(v.name());
  for (int i = 0; i < g.node_size(); ++i) {
    if (g.node(i).op_type().empty())  // ONNX requires one; reports and opaque vertices name it
      fail(node_label(g.node(i), i) + " has no op_type: every node names the operator it runs");
    for (const std::string& o : g.node(i).output()) {
      if (o.empty()) continue;
      if (available.count(o)) fail(node_label(g.node(i), i) + " writes " + quoted_text(o) + ", which is already a graph input or initializer");
      if (!producer.emplace(o, i).second)
        fail(node_label(g.node(i), i) + " writes " + quoted_text(o) + ", which " + node_label(g.node(producer[o]), producer[o]) + " writes too");
    }
  }
  std::vector<int> missing(static_cast<std::size_t>(g.node_size()), 0);
  std::vector<std::vector<int>> users(static_cast<std::size_t>(g.node_size()));
  for (int i = 0; i < g.node_size(); ++i)
    for (const std::string& in : g.node(i).input()) {
      if (in.empty() || available.count(in)) continue;
      auto p = producer.find(in);
      if (p == producer.end())
        fail(node_label(g.node(i), i) + " reads " + quoted_text(in) + ", which no node, graph input or initializer provides");
      ++missing[static_cast<std::size_t>(i)];
      users[static_cast<std::size_t>(p->second)].push_back(i);
    }
  // The ready node that comes first in the file, each time: a file in topological order (as
  // ONNX requires, and exporters write the program's order) keeps its order, which the
  // vertices follow (the memory model's live ranges are that order's); another is sorted
  // with the least reordering.
  std::vector<int> order;
  std::priority_queue<int, std::vector<int>, std::greater<>> ready;
  for (int i = 0; i < g.node_size(); ++i)
    if (missing[static_cast<std::size_t>(i)] == 0) ready.push(i);
  while (!ready.empty()) {
    const int i = ready.top();
    ready.pop();
    order.push_back(i);
    for (int u : users[static_cast<std::size_t>(i)])
      if (--missing[static_cast<std::size_t>(u)] == 0) ready.push(u);
  }
  if (static_cast<int>(order.size()) != g.node_size()) {
    std::string left;
    int shown = 0;
    for (int i = 0; i < g.node_size() && shown < 4; ++i)
      if (missing[static_cast<std::size_t>(i)] > 0) left += (shown++ ? ", " : "") + node_label(g.node(i), i);
    fail("the graph has a cycle: " + std::to_string(g.node_size() - static_cast<int>(order.size())) +
         " nodes are on it or wait on it (" + left + ")");
  }
  // Which nodes compute on the model's data (scoped_names): in topological order, a node
  // reading a floating graph input, a weight (a floating initializer but the 0-d constants an
  // exporter lifts) or such a node's output.
  std::set<std::string> data;
  for (const auto& v : g.input())
    if (v.type().tensor_type().has_elem_type() && to_dtype(v.type().tensor_type().elem_type()) &&
        is_float(*to_dtype(v.type().tensor_type().elem_type())))
      data.insert(v.name());
  for (const auto& t : g.initializer())
    if (to_dtype(t.data_type()) && is_float(*to_dtype(t.data_type())) && !lifted_constant(t.name(), static_cast<std::size_t>(t.dims_size())))
      data.insert(t.name());
  std::vector<char> on_data(static_cast<std::size_t>(g.node_size()), 0);
  for (int i : order) {
    const onnx::NodeProto& n = g.node(i);
    for (const std::string& in : n.input()) on_data[static_cast<std::size_t>(i)] |= static_cast<char>(!in.empty() && data.count(in));
    if (on_data[static_cast<std::size_t>(i)])
      for (const std::string& o : n.output()) data.insert(o);
  }
  const std::vector<std::string> names = scoped_names(g, on_data);
  google::protobuf::RepeatedPtrField<onnx::NodeProto> sorted;
  sorted.Reserve(g.node_size());
  scoped.clear();
  for (int i : order) {
    *sorted.Add() = g.node(i);
    scoped.push_back(names[static_cast<std::size_t>(i)]);
  }
  g.mutable_node()->Swap(&sorted);
}

// ---- symbolic dims of the graph inputs get sizes; then ONNX infers the rest ----
inline void reader::fix_input_dims() {
  onnx::GraphProto& g = *model.mutable_graph();
  std::set<std::string> inits;
  for (const auto& t : g.initializer()) inits.insert(t.name());
  std::map<std::string, std::int64_t> named = opt.dims;
  for (auto& v : *g.mutable_input()) {
    if (inits.count(v.name()) || !v.type().has_tensor_type()) continue;
    auto* tt = v.mutable_type()->mutable_tensor_type();
    if (!tt->has_shape()) fail("graph input " + quoted_text(v.name()) + " has no shape; give the model one (every input needs its rank)");
    auto& dims = *tt->mutable_shape()->mutable_dim();
    for (int i = 0; i < dims.size(); ++i) {
      auto& d = dims[i];
      if (d.has_dim_value()) {
        if (i == 0 && opt.batch > 0 && d.dim_value() == opt.batch) out.batch_used = true;
        if (i == 1 && opt.seq > 0 && d.dim_value() == opt.seq) out.seq_used = true;
        if (i == 2 && dims.size() == 4 && opt.past > 0 && d.dim_value() == opt.past) out.past_used = true;
        continue;
      }
      const std::string sym = d.has_dim_param() ? d.dim_param() : std::string();
      std::int64_t size = 0;
      if (auto it = named.find(sym); !sym.empty() && it != named.end()) size = it->second;
      else if (i == 0 && opt.batch > 0) size = opt.batch, out.batch_used = true;
      else if (i == 1 && opt.seq > 0) size = opt.seq, out.seq_used = true;
      else if (i == 2 && dims.size() == 4 && opt.past > 0) size = opt.past, out.past_used = true;
      if (size <= 0)
        fail("graph input " + quoted_text(v.name()) + " dim " + std::to_string(i) + " is symbolic" +
             (sym.empty() ? std::string() : " (" + quoted_text(sym) + ")") + "; give its size (--batch sizes dim 0, --seq dim 1" +
             (i == 2 && dims.size() == 4 ? ", --kv-cache dim 2 of a key/value cache [batch, kv_heads, past, head_dim]" : "") + ")");
      if (size > max_dim) fail("graph input " + quoted_text(v.name()) + " dim " + std::to_string(i) + " is " + std::to_string(size) + ", more than 2^40");
      if (!sym.empty()) named.emplace(sym, size);
      d.set_dim_value(size);
    }
  }
  // A sum of sized symbols and integers, each term maybe times an integer, as torch's exporter
  // names a dim it derives ("past + sequence": a key/value cache's keys with the step's); nullopt
  // where a term is anything else, names an unsized symbol, or the sum leaves 1..2^40.
  const auto sum_of = [&](const std::string& e) -> std::optional<std::int64_t> {
    std::int64_t total = 0;
    std::size_t at = 0;
    while (at <= e.size()) {
      std::size_t plus = e.find('+', at);
      if (plus == std::string::npos) plus = e.size();
      std::string term = e.substr(at, plus - at);
      term.erase(0, term.find_first_not_of(' '));
      term.erase(term.find_last_not_of(' ') + 1);
      std::int64_t factor = 1;
      if (const std::size_t star = term.find('*'); star != std::string::npos) {
        const std::string k = term.substr(0, star);
        const auto r = std::from_chars(k.data(), k.data() + k.size(), factor);
        if (r.ec != std::errc() || r.ptr != k.data() + k.size() || factor < 1 || factor > max_dim) return std::nullopt;
        term.erase(0, star + 1);
      }
      std::int64_t v = 0;
      if (auto it = named.find(term); it != named.end()) v = it->second;
      else if (const auto r = std::from_chars(term.data(), term.data() + term.size(), v);
               term.empty() || r.ec != std::errc() || r.ptr != term.data() + term.size() || v < 0 || v > max_dim)
        return std::nullopt;
      if (v > 0 && factor > max_dim / v) return std::nullopt;
      total += factor * v;  // each term and the total so far at most 2^40: no overflow
      if (total > max_dim) return std::nullopt;
      at = plus + 1;
    }
    return total >= 1 ? std::optional<std::int64_t>(total) : std::nullopt;
  };
  // The same symbol elsewhere (outputs, value_info) takes the same size, and a sum of them theirs.
  auto fix = [&](onnx::ValueInfoProto& v) {
    if (!v.type().has_tensor_type() || !v.type().tensor_type().has_shape()) return;
    for (auto& d : *v.mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim())
      if (d.has_dim_param()) {
        if (auto it = named.find(d.dim_param()); it != named.end()) d.set_dim_value(it->second);
        else if (const std::optional<std::int64_t> n = sum_of(d.dim_param())) d.set_dim_value(*n);
      }
  };
  for (auto& v : *g.mutable_output()) fix(v);
  for (auto& v : *g.mutable_value_info()) fix(v);
}

/// ONNX's shape inference over the model. A failure names the node (ONNX's own message
/// names it by its name only, "node name: " for the many exporters leave unnamed): unnamed
/// nodes carry a name of their index while inference runs.
inline void reader::infer_shapes() {
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
  std::string shown;  // ONNX's message holds the model's names raw: escaped as quoted_text escapes
  autoshard::detail::append_escaped(shown, failure, 0, failure.size());
  fail((culprit >= 0 ? node_label(g.node(culprit), culprit) + ": " : std::string()) + "ONNX shape inference failed: " + shown);
}

// ---- the values: types, producers, consumers ----
inline void reader::set_type(value_info& v, const onnx::TypeProto& t, const std::string& name) {
  if (t.value_case() == onnx::TypeProto::VALUE_NOT_SET) {
    v.unknown_why = "the shape of " + quoted_text(name) + " is unknown after shape inference (give it in the model's value_info)";
    return;
  }
  if (!t.has_tensor_type()) {
    v.unknown_why = quoted_text(name) + " is not a tensor";
    return;
  }
  const auto& tt = t.tensor_type();
  const std::optional<dtype> dt = to_dtype(tt.elem_type());
  if (!dt) {
    v.unknown_why = quoted_text(name) + " has element type " + std::to_string(tt.elem_type()) + ", which autoshard has no dtype for";
    return;
  }
  if (!tt.has_shape()) {
    v.unknown_why = "the shape of " + quoted_text(name) + " is unknown after shape inference (give it in the model's value_info)";
    return;
  }
  tensor_shape s;
  if (tt.shape().dim_size() > static_cast<int>(max_tensor_rank)) {
    v.unknown_why = quoted_text(name) + " has " + std::to_string(tt.shape().dim_size()) + " dims; at most 8 are supported";
    return;
  }
  for (const auto& d : tt.shape().dim()) {
    if (!d.has_dim_value()) {
      v.unknown_why = "dim " + std::to_string(s.rank) + " of " + quoted_text(name) + " is " +
                      (d.has_dim_param() ? "symbolic (" + quoted_text(d.dim_param()) + ")" : std::string("unknown")) +
                      " after shape inference (data-dependent, or the model leaves it open)";
      return;
    }
    if (d.dim_value() < 0 || d.dim_value() > max_dim) {
      v.unknown_why = "dim " + std::to_string(s.rank) + " of " + quoted_text(name) + " is " + std::to_string(d.dim_value()) + ", outside [0, 2^40]";
      return;
    }
    s.dims[s.rank++] = d.dim_value();
  }
  v.known = true;
  v.unknown_why.clear();
  v.shape = s;
  v.type = *dt;
}

inline void reader::collect_values() {
  const onnx::GraphProto& g = model.graph();
  for (const auto& t : g.initializer()) {
    value_info& v = values[t.name()];
    v.init = &t;
    const std::optional<dtype> dt = to_dtype(t.data_type());
    if (dt) {
      v.known = true;
      v.shape = checked_shape(t.dims(), "initializer " + quoted_text(t.name()));
      v.type = *dt;
    } else {
      v.unknown_why = "initializer " + quoted_text(t.name()) + " has element type " + std::to_string(t.data_type()) + ", which autoshard has no dtype for";
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

}  // namespace autoshard::detail::onnx_in
