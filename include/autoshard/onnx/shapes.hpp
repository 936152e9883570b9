#pragma once
/// Shape computations (Shape -> Slice/Gather -> Concat -> Reshape) evaluated on the inferred
/// shapes and folded into constants, and which nodes compute data (vertices) rather than
/// shapes only.
#include "read.hpp"

namespace autoshard::detail::onnx_in {

// ---- shape computations folded into constants, so that inference sees through them ----
inline std::unordered_map<std::string, tensor_shape> reader::inferred_shapes() const {
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

inline std::optional<reader::int_value> reader::int_tensor(const onnx::TensorProto& t) {
  if (t.dims_size() > 1 || t.data_location() == onnx::TensorProto::EXTERNAL) return std::nullopt;
  const std::int64_t n = t.dims_size() ? t.dims(0) : 1;
  if (n < 0 || n > 64) return std::nullopt;
  int_value r;
  r.scalar = t.dims_size() == 0;
  // raw_data holds n little-endian elements of E; otherwise the typed field holds them.
  const auto read = [&](auto tag, const auto& field) {
    using E = decltype(tag);
    const std::string& raw = t.raw_data();
    if (!t.has_raw_data()) {
      r.v.assign(field.begin(), field.end());
      return true;
    }
    if (raw.size() != static_cast<std::size_t>(n) * sizeof(E)) return false;
    for (std::int64_t i = 0; i < n; ++i) {
      E e;
      std::memcpy(&e, raw.data() + static_cast<std::size_t>(i) * sizeof(E), sizeof(E));
      r.v.push_back(e);
    }
    return true;
  };
  bool ok = false;
  if (t.data_type() == onnx::TensorProto::INT64) ok = read(std::int64_t{}, t.int64_data());
  else if (t.data_type() == onnx::TensorProto::INT32) ok = read(std::int32_t{}, t.int32_data());
  if (!ok) return std::nullopt;
  if (static_cast<std::int64_t>(r.v.size()) != n) return std::nullopt;
  return r;
}

/// Evaluates node `n` (the graph's node `index`) on known integer inputs; nullopt when it is not
/// a shape computation.
inline std::optional<reader::int_value> reader::fold(const onnx::NodeProto& n, int index, const std::unordered_map<std::string, int_value>& known_ints,
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
      // Values beyond a dim's bound are no shape's: not folded. (std::abs of -2^63 is itself
      // undefined, and passed as -2^63; -2^63 + -8 wrapped to a dim of 2^63 - 8.)
      if (x < -max_dim || x > max_dim || y < -max_dim || y > max_dim) return std::nullopt;
      // Sums of two such values fit in int64; a product may not (2^40 x 2^40 = 2^80 wrapped to
      // 0, and a Reshape to [4, 0] copied the input's dim: a view ONNX's arithmetic does not give).
      std::int64_t z = 0;
      if (t == "Mul" ? __builtin_mul_overflow(x, y, &z) : (z = t == "Add" ? x + y : x - y, false))
        fail(node_label(n, index) + ": the shape computation " + std::to_string(x) + " x " + std::to_string(y) +
             " overflows int64 (a dim is at most 2^40)");
      r.v.push_back(z);
    }
    r.scalar = a->scalar && b->scalar;
    return r;
  }
  return std::nullopt;
}

inline void reader::fold_shape_computations() {
  for (int round = 0; round < 8; ++round) {
    const std::unordered_map<std::string, tensor_shape> shapes = inferred_shapes();
    std::unordered_map<std::string, int_value> ints;
    for (const auto& t : model.graph().initializer())
      if (auto v = int_tensor(t)) ints[t.name()] = *v;
    int folded = 0, index = -1;
    for (auto& n : *model.mutable_graph()->mutable_node()) {
      ++index;
      if (n.op_type() == "Constant" && default_domain(n) && n.output_size() == 1) {
        for (const auto& a : n.attribute())
          if (a.name() == "value" && a.has_t())
            if (auto v = int_tensor(a.t())) ints[n.output(0)] = *v;
        continue;
      }
      std::optional<int_value> v = fold(n, index, ints, shapes);
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

// ---- which nodes compute data (vertices) rather than shapes only ----
/// The inputs of `n` that are data; the others (Reshape's shape, Slice's bounds, ...) are
/// read as constants or through the inferred shapes.
inline std::vector<int> reader::data_inputs(const onnx::NodeProto& n) {
  const std::string& t = n.op_type();
  if (!default_domain(n)) return iota(n.input_size());
  if (t == "Reshape" || t == "Expand" || t == "Tile" || t == "Slice" || t == "Unsqueeze" || t == "Squeeze" ||
      t == "Split" || t == "ReduceMean" || t == "ReduceSum" || t == "Dropout" || t == "Flatten")
    return {0};
  if (t == "Shape" || t == "Size" || t == "Constant" || t == "ConstantOfShape") return {};
  return iota(n.input_size());
}

inline std::vector<int> reader::iota(int n) {
  std::vector<int> v;
  for (int i = 0; i < n; ++i) v.push_back(i);
  return v;
}

/// The nodes the graph's outputs need, walking back from them over data inputs. Run twice by
/// build(): before the fusions, over every node; and after them, within that first answer,
/// where a fused pattern needs its operands (not what its absorbed nodes read) and a value
/// computed from constants alone needs nothing: it becomes a constant input where it is read
/// (operand), as a mask builder's output does once the attention that reads it is fused, or a
/// Range of positions an embedding reads.
inline void reader::mark_needed() {
  const bool after_fusions = !needed.empty();
  std::vector<char> now(nodes.size(), 0);
  std::set<std::string> want;
  for (const auto& o : model.graph().output()) want.insert(o.name());
  for (std::size_t k = nodes.size(); k-- > 0;) {
    const onnx::NodeProto& n = *nodes[k];
    bool any = false;
    for (const std::string& o : n.output()) any = any || want.count(o);
    if (!any || (after_fusions && !needed[k])) continue;
    const auto f = fused.find(static_cast<int>(k));
    const bool plain = f == fused.end();
    if (plain && k < absorbed.size() && absorbed[k]) continue;
    const bool source = default_domain(n) && (n.op_type() == "Constant" || n.op_type() == "Shape");
    if (plain && !source && n.output_size() == 1 && computed_from_constants.count(n.output(0))) continue;
    now[k] = 1;
    if (!plain)
      want.insert(f->second.operands.begin(), f->second.operands.end());
    else
      for (int i : data_inputs(n))
        if (i < n.input_size() && !n.input(i).empty()) want.insert(n.input(i));
  }
  needed = std::move(now);
}

}  // namespace autoshard::detail::onnx_in
