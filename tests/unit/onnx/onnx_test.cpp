// The ONNX reader on models built here with protobuf's C++ API: what each operator maps to,
// what becomes opaque and why, the options, and hostile models (each a clear error).
// tests/tool/onnx_test.sh plans whole models written by python3-onnx.
#include <doctest/doctest.h>

#include <sys/mman.h>  // defines MAP_TYPE, as the tensor area's headers do: onnx.hpp must compile after it

#include <autoshard/graph/io.hpp>        // to_json
#include <autoshard/graph/strategy.hpp>  // enumerate_strategies
#include <autoshard/onnx/onnx.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace {
using namespace autoshard;

struct model_maker {
  onnx::ModelProto m;
  onnx::GraphProto* g = m.mutable_graph();
  model_maker(const model_maker& o) : m(o.m), g(m.mutable_graph()) {}
  model_maker& operator=(const model_maker&) = delete;
  explicit model_maker(int opset = 14) {
    m.set_ir_version(8);
    auto* o = m.add_opset_import();
    o->set_domain("");
    o->set_version(opset);
  }
  static void shape(onnx::ValueInfoProto* v, const std::string& name, int type, const std::vector<std::string>& dims) {
    v->set_name(name);
    auto* t = v->mutable_type()->mutable_tensor_type();
    t->set_elem_type(type);
    auto* s = t->mutable_shape();
    for (const std::string& d : dims) {
      auto* dim = s->add_dim();
      if (!d.empty() && (d[0] == '-' || std::isdigit(static_cast<unsigned char>(d[0])))) dim->set_dim_value(std::stoll(d));
      else dim->set_dim_param(d);
    }
  }
  model_maker& input(const std::string& name, const std::vector<std::string>& dims, int type = onnx::TensorProto::FLOAT) {
    shape(g->add_input(), name, type, dims);
    return *this;
  }
  model_maker& output(const std::string& name) {
    g->add_output()->set_name(name);
    return *this;
  }
  model_maker& weight(const std::string& name, const std::vector<std::int64_t>& dims, int type = onnx::TensorProto::FLOAT) {
    auto* t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(type);
    std::int64_t n = 1;
    for (std::int64_t d : dims) t->add_dims(d), n *= d;
    for (std::int64_t i = 0; i < n; ++i) {
      if (type == onnx::TensorProto::FLOAT) t->add_float_data(0.5f);
      else t->add_int64_data(0);
    }
    return *this;
  }
  model_maker& ints(const std::string& name, const std::vector<std::int64_t>& v) {
    auto* t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::INT64);
    t->add_dims(static_cast<std::int64_t>(v.size()));
    for (std::int64_t x : v) t->add_int64_data(x);
    return *this;
  }
  model_maker& scalar(const std::string& name, float v) {  // as torch exports constants: a 0-d initializer
    auto* t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    t->add_float_data(v);
    return *this;
  }
  onnx::NodeProto* node(const std::string& op, const std::string& name, const std::vector<std::string>& in,
                        const std::vector<std::string>& out) {
    auto* n = g->add_node();
    n->set_op_type(op);
    n->set_name(name);
    for (const auto& i : in) n->add_input(i);
    for (const auto& o : out) n->add_output(o);
    return n;
  }
  static void attr(onnx::NodeProto* n, const std::string& name, std::int64_t v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(v);
  }
  static void attr(onnx::NodeProto* n, const std::string& name, const std::vector<std::int64_t>& v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (auto x : v) a->add_ints(x);
  }
  static void attr(onnx::NodeProto* n, const std::string& name, float v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::FLOAT);
    a->set_f(v);
  }
  std::string bytes() const { return m.SerializeAsString(); }
};

template <class E>
std::string error_of(const std::string& bytes, const onnx_options& o = {}) {
  try {
    read_onnx(bytes, "m.onnx", o);
  } catch (const E& e) {
    return e.what();
  }
  return "(no error)";
}

const node& vertex(const model_graph& g, const std::string& name) {
  auto v = find_vertex(g, name);
  REQUIRE_MESSAGE(v, "no vertex " << name);
  return g[*v];
}
}  // namespace

TEST_CASE("ONNX operators map to the graph's kinds with ONNX's shapes") {
  model_maker mm;
  mm.input("x", {"batch", "seq", "16"}).weight("fc.weight", {16, 32}).weight("fc.bias", {32}).weight("proj.weight", {8, 32});
  mm.weight("proj.bias", {8}).ints("starts", {2}).ints("ends", {6}).ints("axes", {2});
  mm.node("MatMul", "/fc/MatMul", {"x", "fc.weight"}, {"a"});
  mm.node("Add", "/fc/Add", {"a", "fc.bias"}, {"b"});
  mm.node("Relu", "act", {"b"}, {"c"});
  auto* gemm_in = mm.node("Reshape", "flat", {"c", "shape"}, {"c2"});
  (void)gemm_in;
  mm.ints("shape", {-1, 32});
  auto* gemm = mm.node("Gemm", "proj", {"c2", "proj.weight", "proj.bias"}, {"d"});
  model_maker::attr(gemm, "transB", std::int64_t{1});
  mm.node("Slice", "slice", {"d", "starts", "ends", "axes_1"}, {"e"});
  mm.ints("axes_1", {1});
  auto* rm = mm.node("ReduceMean", "mean", {"e"}, {"f"});
  model_maker::attr(rm, "axes", std::vector<std::int64_t>{1});
  mm.node("Tanh", "tanh", {"f"}, {"y"});
  mm.output("y");
  onnx_options o;
  o.batch = 2;
  o.seq = 5;
  const onnx_import r = read_onnx(mm.bytes(), "m.onnx", o);
  const model_graph& g = r.graph;
  CHECK(r.opaque.empty());
  CHECK(r.opset == 14);
  // MatMul + Add of a 1-D initializer: one linear with its bias, [in,out] weight; the torch
  // module path "/fc/MatMul" names it "fc".
  const node& fc = vertex(g, "fc");
  CHECK(fc.kind == op_kind::linear);
  CHECK(fc.attrs.transposed_weight);
  CHECK(boost::in_degree(*find_vertex(g, "fc"), g) == 3);
  CHECK(fc.shape == tensor_shape{2, 5, 32});
  CHECK(vertex(g, "fc.weight").kind == op_kind::parameter);
  CHECK(vertex(g, "fc.weight").shape == tensor_shape{16, 32});
  // Reshape to [-1, 32]: the inferred [10, 32]; the shape initializer is no vertex.
  CHECK(vertex(g, "flat").kind == op_kind::reshape);
  CHECK(vertex(g, "flat").attrs.dims == std::vector<std::int64_t>{10, 32});
  CHECK_FALSE(find_vertex(g, "shape"));
  // Gemm with transB: a linear with an [out,in] weight.
  CHECK(vertex(g, "proj").kind == op_kind::linear);
  CHECK_FALSE(vertex(g, "proj").attrs.transposed_weight);
  // Slice [2, 6) of axis 1: a split.
  CHECK(vertex(g, "slice").kind == op_kind::split);
  CHECK(vertex(g, "slice").attrs.start == 2);
  CHECK(vertex(g, "slice").attrs.length == 4);
  // ReduceMean with keepdims: the reduction and a reshape back to [10, 1].
  CHECK(vertex(g, "mean:reduce").kind == op_kind::reduce_mean);
  CHECK(vertex(g, "mean").kind == op_kind::reshape);
  CHECK(vertex(g, "mean").shape == tensor_shape{10, 1});
  CHECK(vertex(g, "tanh").kind == op_kind::tanh);
  CHECK(parameter_count(g) == 16 * 32 + 32 + 8 * 32 + 8);
  // --dtype: every floating tensor in bf16, the ints untouched.
  o.float_type = dtype::bf16;
  const model_graph h = read_onnx(mm.bytes(), "m.onnx", o).graph;
  CHECK(vertex(h, "fc.weight").type == dtype::bf16);
  CHECK(vertex(h, "tanh").type == dtype::bf16);
}

TEST_CASE("ONNX operators with no mapping become opaque, with the reason") {
  model_maker mm;
  mm.input("x", {"4", "8"}).input("c", {"4", "8"}, onnx::TensorProto::BOOL).weight("w", {8, 8});
  mm.node("MatMul", "mm", {"x", "w"}, {"a"});
  mm.node("Where", "where", {"c", "a", "x"}, {"b"});
  mm.node("Where", "select_ids", {"c", "ids", "ids"}, {"ids2"});  // on integers: no kind
  mm.input("ids", {"4", "8"}, onnx::TensorProto::INT64).output("ids2");
  auto* gemm = mm.node("Gemm", "gemm", {"b", "w"}, {"d"});
  auto* alpha = gemm->add_attribute();
  alpha->set_name("alpha");
  alpha->set_type(onnx::AttributeProto::FLOAT);
  alpha->set_f(0.5f);
  auto* custom = mm.node("Frobnicate", "frob", {"d"}, {"y"});
  custom->set_domain("com.example");
  mm.output("y");
  auto* vi = mm.g->add_value_info();
  model_maker::shape(vi, "y", onnx::TensorProto::FLOAT, {"4", "8"});
  const onnx_import r = read_onnx(mm.bytes());
  REQUIRE(r.opaque.size() == 3);
  CHECK(vertex(r.graph, "where").kind == op_kind::where);  // floating values: mapped
  // In the file's order (a topologically sorted file keeps it: the vertices run as written).
  CHECK(r.opaque[0].node == "select_ids");
  CHECK(r.opaque[0].op_type == "Where");
  CHECK(r.opaque[0].why == "only a select of floating values by a boolean or integer condition maps");
  CHECK(r.opaque[1].node == "gemm");
  CHECK(r.opaque[1].why == "alpha is not 1");
  CHECK(r.opaque[2].op_type == "com.example.Frobnicate");
  const node& f = vertex(r.graph, "frob");
  CHECK(f.kind == op_kind::opaque);
  CHECK(f.attrs.op_type == "com.example.Frobnicate");
  CHECK(f.shape == tensor_shape{4, 8});
  CHECK(vertex(r.graph, "c").type == dtype::boolean);
  // Without value_info the custom operator's output has no shape: named, with the way out.
  mm.g->clear_value_info();
  CHECK(error_of<graph_error>(mm.bytes()).find("the shape of 'y' is unknown after shape inference (give it in the model's value_info)") !=
        std::string::npos);
}

TEST_CASE("ONNX GELU forms, RMSNorm, Where and Expand map to kinds with their own numerics") {
  model_maker mm;
  mm.input("x", {"2", "3", "8"}).input("keep", {"2", "3", "1"}, onnx::TensorProto::BOOL);
  mm.weight("norm.weight", {8}).weight("fill", {8}).ints("target", {2, 3, 8});
  mm.scalar("half", 0.5f).scalar("three", 3.0f).scalar("c", 0.044715f).scalar("s2pi", 0.7978845608f).scalar("one", 1.0f);
  mm.scalar("two", 2.0f).scalar("eps", 1e-6f).scalar("sqrt2", 1.4142135f);
  // gelu_new: Mul(x, 0.5) * (1 + Tanh(Mul(Add(x, Mul(Pow(x, 3), 0.044715)), sqrt(2/pi))))
  mm.node("Mul", "/t/Mul", {"half", "x"}, {"hx"});  // the constant first: either order
  mm.node("Pow", "/t/Pow", {"x", "three"}, {"x3"});
  mm.node("Mul", "/t/Mul_1", {"x3", "c"}, {"cx3"});
  mm.node("Add", "/t/Add", {"x", "cx3"}, {"in"});
  mm.node("Mul", "/t/Mul_2", {"s2pi", "in"}, {"arg"});
  mm.node("Tanh", "/t/Tanh", {"arg"}, {"th"});
  mm.node("Add", "/t/Add_1", {"th", "one"}, {"th1"});
  mm.node("Mul", "/t/Mul_3", {"hx", "th1"}, {"gt"});
  // exact GELU: Mul(Mul(y, Add(Erf(Div(y, sqrt 2)), 1)), 0.5)
  mm.node("Div", "/e/Div", {"gt", "sqrt2"}, {"e0"});
  mm.node("Erf", "/e/Erf", {"e0"}, {"e1"});
  mm.node("Add", "/e/Add", {"e1", "one"}, {"e2"});
  mm.node("Mul", "/e/Mul", {"gt", "e2"}, {"e3"});
  mm.node("Mul", "/e/Mul_1", {"e3", "half"}, {"ge"});
  // LlamaRMSNorm: w * (y * Reciprocal(Sqrt(ReduceMean(Pow(y, 2)) + eps)))
  mm.node("Pow", "/norm/Pow", {"ge", "two"}, {"sq"});
  model_maker::attr(mm.node("ReduceMean", "/norm/ReduceMean", {"sq"}, {"ms"}), "axes", std::vector<std::int64_t>{-1});
  mm.node("Add", "/norm/Add", {"ms", "eps"}, {"mse"});
  mm.node("Sqrt", "/norm/Sqrt", {"mse"}, {"rms"});
  mm.node("Reciprocal", "/norm/Reciprocal", {"rms"}, {"inv"});
  mm.node("Mul", "/norm/Mul", {"ge", "inv"}, {"yn"});
  mm.node("Mul", "/norm/Mul_1", {"norm.weight", "yn"}, {"normed"});
  // RMSNorm without a weight, divided: Div(z, Sqrt(ReduceMean(Mul(z, z)) + eps))
  mm.node("Mul", "/n2/Mul", {"normed", "normed"}, {"sq2"});
  model_maker::attr(mm.node("ReduceMean", "/n2/ReduceMean", {"sq2"}, {"ms2"}), "axes", std::vector<std::int64_t>{2});
  mm.node("Add", "/n2/Add", {"eps", "ms2"}, {"mse2"});
  mm.node("Sqrt", "/n2/Sqrt", {"mse2"}, {"rms2"});
  mm.node("Div", "/n2/Div", {"normed", "rms2"}, {"n2"});
  // SiLU as torch exports it: Mul(Sigmoid(z), z)
  mm.node("Sigmoid", "/act/Sigmoid", {"n2"}, {"sg"});
  mm.node("Mul", "/act/Mul", {"sg", "n2"}, {"si"});
  // Where(keep, si, Expand(fill, [2, 3, 8]))
  mm.node("Expand", "expand", {"fill", "target"}, {"filled"});
  mm.node("Where", "where", {"keep", "si", "filled"}, {"y"});
  mm.output("y");
  const onnx_import r = read_onnx(mm.bytes());
  const model_graph& g = r.graph;
  CHECK(r.opaque.empty());
  std::map<op_kind, int> kinds;
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) ++kinds[g[v].kind];
  // Nothing of the patterns is left: their Mul / Add / Tanh / Pow / Sqrt are fused away.
  CHECK(kinds == std::map<op_kind, int>{{op_kind::input, 2}, {op_kind::parameter, 2}, {op_kind::gelu, 1}, {op_kind::gelu_erf, 1},
                                        {op_kind::rms_norm, 2}, {op_kind::silu, 1}, {op_kind::expand, 1}, {op_kind::where, 1}});
  CHECK(vertex(g, "act").kind == op_kind::silu);
  CHECK(vertex(g, "t").kind == op_kind::gelu);  // the tanh approximation, as GPT-2 computes it
  CHECK(vertex(g, "e").kind == op_kind::gelu_erf);  // the exact form, as torch.nn.GELU()
  CHECK(vertex(g, "norm").kind == op_kind::rms_norm);
  CHECK(boost::in_degree(*find_vertex(g, "norm"), g) == 2);  // x and the weight
  CHECK(boost::in_degree(*find_vertex(g, "n2"), g) == 1);
  // Their epsilon is the constant added, as the exporter wrote it (the float32 1e-6f is 1e-06, exactly).
  CHECK(vertex(g, "norm").attrs.epsilon == 1e-6);
  CHECK(vertex(g, "n2").attrs.epsilon == 1e-6);
  CHECK(vertex(g, "expand").attrs.dims == std::vector<std::int64_t>{2, 3, 8});
  CHECK(vertex(g, "where").shape == tensor_shape{2, 3, 8});
  CHECK(vertex(g, "keep").type == dtype::boolean);
  // A wrong constant is not the pattern: 0.04 for 0.044715 leaves the tanh form unfused.
  model_maker off = mm;
  for (auto& t : *off.g->mutable_initializer())
    if (t.name() == "c") t.set_float_data(0, 0.04f);
  const model_graph h = read_onnx(off.bytes()).graph;
  CHECK_FALSE(find_vertex(h, "t"));
  CHECK(vertex(h, "t.Tanh").kind == op_kind::tanh);
  CHECK(vertex(h, "e").kind == op_kind::gelu_erf);
}

TEST_CASE("ONNX norms keep their epsilon: the fused patterns' constant, LayerNormalization's attribute") {
  // BERT's layer_norm_eps 1e-12 as torch's older exporter writes a LayerNorm (Sub, Pow, Add eps,
  // Sqrt, Div, then the weight and bias), and as opset 17's LayerNormalization.
  model_maker mm(17);
  mm.input("x", {"2", "3", "8"}).weight("ln.weight", {8}).weight("ln.bias", {8}).weight("ln2.weight", {8}).weight("ln2.bias", {8});
  mm.weight("ln3.weight", {8}).scalar("two", 2.0f).scalar("eps", 1e-12f);
  model_maker::attr(mm.node("ReduceMean", "/ln/ReduceMean", {"x"}, {"mean"}), "axes", std::vector<std::int64_t>{-1});
  mm.node("Sub", "/ln/Sub", {"x", "mean"}, {"d"});
  mm.node("Pow", "/ln/Pow", {"d", "two"}, {"d2"});
  model_maker::attr(mm.node("ReduceMean", "/ln/ReduceMean_1", {"d2"}, {"var"}), "axes", std::vector<std::int64_t>{-1});
  mm.node("Add", "/ln/Add", {"var", "eps"}, {"ve"});
  mm.node("Sqrt", "/ln/Sqrt", {"ve"}, {"sd"});
  mm.node("Div", "/ln/Div", {"d", "sd"}, {"y0"});
  mm.node("Mul", "/ln/Mul", {"y0", "ln.weight"}, {"y1"});
  mm.node("Add", "/ln/Add_1", {"y1", "ln.bias"}, {"y"});
  auto* ln2 = mm.node("LayerNormalization", "/ln2/LayerNormalization", {"y", "ln2.weight", "ln2.bias"}, {"z"});
  model_maker::attr(ln2, "epsilon", 1e-6f);
  mm.node("LayerNormalization", "/ln3/LayerNormalization", {"z", "ln3.weight"}, {"out"});  // ONNX's default, 1e-5
  mm.output("out");
  const onnx_import r = read_onnx(mm.bytes());
  CHECK(r.opaque.empty());
  CHECK(vertex(r.graph, "ln").kind == op_kind::layer_norm);
  CHECK(vertex(r.graph, "ln").attrs.epsilon == 1e-12);
  CHECK(vertex(r.graph, "ln2").kind == op_kind::layer_norm);
  CHECK(vertex(r.graph, "ln2").attrs.epsilon == 1e-6);
  CHECK(vertex(r.graph, "ln3").attrs.epsilon == default_norm_epsilon);
  // A constant that is no epsilon autoshard computes with (0 here) leaves the pattern as the
  // file computes it; such an attribute makes the LayerNormalization opaque, saying why.
  model_maker zero = mm;
  for (auto& t : *zero.g->mutable_initializer())
    if (t.name() == "eps") t.set_float_data(0, 0.0f);
  for (auto& n : *zero.g->mutable_node())
    if (n.name() == "/ln2/LayerNormalization") n.mutable_attribute(0)->set_f(-1.0f);
  const onnx_import z = read_onnx(zero.bytes());
  CHECK_FALSE(find_vertex(z.graph, "ln"));
  CHECK(vertex(z.graph, "ln.Sqrt").kind == op_kind::opaque);
  REQUIRE(z.opaque.size() >= 1);
  bool said = false;
  for (const auto& o : z.opaque) said = said || o.why.find("epsilon -1 is not a finite number in (0, 1]") != std::string::npos;
  CHECK(said);
}

TEST_CASE("hostile ONNX models are clear errors naming the numbers") {
  model_maker ok;
  ok.input("x", {"4", "8"}).weight("w", {8, 8});
  ok.node("MatMul", "first", {"x", "w"}, {"a"});
  ok.node("Relu", "second", {"a"}, {"y"});
  ok.output("y");
  const std::string good = ok.bytes();
  CHECK(parameter_count(read_onnx(good).graph) == 64);
  SUBCASE("a node with no op_type (found by fuzz_onnx: it became an opaque vertex of no operator)") {
    model_maker m = ok;
    m.g->mutable_node(1)->set_op_type("");
    auto* vi = m.g->add_value_info();
    model_maker::shape(vi, "y", onnx::TensorProto::FLOAT, {"4", "8"});
    CHECK(error_of<graph_error>(m.bytes()) == "graph error: m.onnx: node 1 'second' ('') has no op_type: every node names the operator it runs");
  }
  SUBCASE("truncated, empty, not protobuf") {
    CHECK(error_of<io_error>(good.substr(0, good.size() - 7)).find("not an ONNX model") != std::string::npos);
    CHECK(error_of<io_error>("").find("not an ONNX model: it parses as a protobuf message but holds no graph (0 bytes)") != std::string::npos);
  }
  SUBCASE("a model whose graph has no nodes is named so, not 'not an ONNX model'") {
    model_maker m = ok;
    m.g->clear_node();
    const std::string e = error_of<io_error>(m.bytes());
    CHECK(e.find("the model's graph has no nodes (graph inputs 1, outputs 1, initializers 1): it computes nothing to plan") != std::string::npos);
    CHECK(e.find("not an ONNX model") == std::string::npos);
    CHECK(error_of<io_error>("{\"not\": \"onnx\"}").find("not an ONNX model") != std::string::npos);
  }
  SUBCASE("a dim of 2^62 in an input, an initializer, a value_info") {
    model_maker m = ok;
    m.g->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(1)->set_dim_value(std::int64_t{1} << 62);
    CHECK(error_of<io_error>(m.bytes()).find("input 'x' dim 1 is 4611686018427387904, outside [0, 2^40]") != std::string::npos);
    model_maker n = ok;
    n.g->mutable_initializer(0)->set_dims(0, std::int64_t{1} << 62);
    CHECK(error_of<io_error>(n.bytes()).find("initializer 'w' dim 0 is 4611686018427387904") != std::string::npos);
    model_maker big = ok;  // each dim allowed, the product too large
    big.g->mutable_initializer(0)->set_dims(0, std::int64_t{1} << 40);
    big.g->mutable_initializer(0)->set_dims(1, std::int64_t{1} << 40);
    CHECK(error_of<io_error>(big.bytes()).find("initializer 'w' shape [1099511627776,1099511627776] has more than 2^63 bytes") != std::string::npos);
  }
  SUBCASE("an initializer whose data disagrees with its shape") {
    model_maker m = ok;
    m.g->mutable_initializer(0)->clear_float_data();
    m.g->mutable_initializer(0)->set_raw_data(std::string(4 * 63, '\0'));
    CHECK(error_of<io_error>(m.bytes()).find("initializer 'w' raw_data holds 252 bytes, but its shape [8,8] of f32 needs 256") != std::string::npos);
    m.g->mutable_initializer(0)->clear_raw_data();
    m.g->mutable_initializer(0)->add_float_data(1.0f);
    CHECK(error_of<io_error>(m.bytes()).find("initializer 'w' holds 1 values, but its shape [8,8] needs 64") != std::string::npos);
  }
  SUBCASE("a cycle, a value nobody writes, a value written twice, too many nodes, a large file") {
    model_maker m = ok;
    m.g->mutable_node(0)->set_input(0, "y");
    CHECK(error_of<graph_error>(m.bytes()).find("the graph has a cycle: 2 nodes are on it or wait on it (node 0 'first' ('MatMul'), node 1 'second' ('Relu'))") !=
          std::string::npos);
    m.g->mutable_node(0)->set_input(0, "nowhere");
    CHECK(error_of<graph_error>(m.bytes()).find("node 0 'first' ('MatMul') reads 'nowhere', which no node, graph input or initializer provides") !=
          std::string::npos);
    model_maker twice = ok;
    twice.g->mutable_node(1)->set_output(0, "a");
    CHECK(error_of<graph_error>(twice.bytes()).find("writes 'a', which node 0 'first' ('MatMul') writes too") != std::string::npos);
    onnx_options o;
    o.max_nodes = 1;
    CHECK(error_of<io_error>(good, o).find("2 nodes, more than the limit of 1") != std::string::npos);
    o.max_file_bytes = 10;
    CHECK(error_of<io_error>(good, o).find("bytes, more than the limit of 10") != std::string::npos);
  }
  SUBCASE("a name that is not valid UTF-8 (fuzz_onnx: nlohmann's dump() of the graph threw type_error 316)") {
    model_maker m = ok;
    m.g->mutable_node(0)->set_name("\xFFirst");
    CHECK(error_of<io_error>(m.bytes()).find(R"(node 0 name '\xFFirst' is not valid UTF-8 (byte 0xFF at offset 0 of 5); autoshard writes every name into JSON)") !=
          std::string::npos);
    model_maker cut = ok;  // a 3-byte character cut short, in a weight's name and every use of it
    cut.g->mutable_initializer(0)->set_name("w\xE2\x82");
    cut.g->mutable_node(0)->set_input(1, "w\xE2\x82");
    CHECK(error_of<io_error>(cut.bytes()).find(R"(node 0 input 1 'w\xE2\x82' is not valid UTF-8 (byte 0xE2 at offset 1 of 3))") != std::string::npos);
    model_maker surrogate = ok;  // U+D800 and an overlong NUL: what nlohmann refuses to write
    surrogate.g->mutable_node(1)->set_op_type("Re\xED\xA0\x80lu");
    CHECK(error_of<io_error>(surrogate.bytes()).find("node 1 op_type 'Re\\xED\\xA0\\x80lu' is not valid UTF-8 (byte 0xED at offset 2 of 7)") !=
          std::string::npos);
    surrogate.g->mutable_node(1)->set_op_type("Relu");
    surrogate.g->mutable_output(0)->set_name("y\xC0\x80");
    CHECK(error_of<io_error>(surrogate.bytes()).find("graph output 0 name 'y\\xC0\\x80' is not valid UTF-8 (byte 0xC0 at offset 1") != std::string::npos);
    model_maker fine = ok;  // UTF-8 names read and write as JSON
    fine.g->mutable_node(1)->set_name("caf\xC3\xA9 \xE5\x90\x8D \xF0\x9F\x99\x82");
    const model_graph g = read_onnx(fine.bytes()).graph;
    CHECK(vertex(g, "caf\xC3\xA9 \xE5\x90\x8D \xF0\x9F\x99\x82").kind == op_kind::relu);
    CHECK_NOTHROW((void)to_json(g).dump());
  }
  SUBCASE("names with control characters are escaped in messages: a model cannot forge terminal output") {
    const std::string hostile = "a\x1B[31mb\nc";  // valid UTF-8, so the reader takes it as a name
    model_maker m = ok;
    m.g->mutable_node(0)->set_name(hostile);
    m.g->mutable_node(0)->set_op_type("Mat\x07Mul");
    m.g->mutable_node(0)->set_input(0, hostile);
    const std::string msg = error_of<graph_error>(m.bytes());
    CHECK(msg.find("node 0 'a\\x1B[31mb\\x0Ac' ('Mat\\x07Mul') reads 'a\\x1B[31mb\\x0Ac', which no node") != std::string::npos);
    CHECK(msg.find_first_of("\x1B\n\x07") == std::string::npos);
    model_maker sym = ok;
    sym.g->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(0)->set_dim_param(hostile);
    CHECK(error_of<graph_error>(sym.bytes()).find("graph input 'x' dim 0 is symbolic ('a\\x1B[31mb\\x0Ac')") != std::string::npos);
  }
  SUBCASE("nodes out of order are sorted, a symbolic dim without a size is named") {
    model_maker m = ok;
    m.g->mutable_node()->SwapElements(0, 1);
    CHECK(vertex(read_onnx(m.bytes()).graph, "second").kind == op_kind::relu);
    m.g->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(0)->set_dim_param("rows");
    CHECK(error_of<graph_error>(m.bytes()).find("graph input 'x' dim 0 is symbolic ('rows'); give its size") != std::string::npos);
    onnx_options o;
    o.dims["rows"] = 3;
    CHECK(vertex(read_onnx(m.bytes(), "m.onnx", o).graph, "second").shape == tensor_shape{3, 8});
  }
}

TEST_CASE("the parse's memory bound covers what protobuf allocates, and charges weights their size") {
  using detail::onnx_in::parsed_bytes_bound;
  // What protobuf says the parsed message takes (SpaceUsedLong), against the bound of its bytes.
  const auto parsed = [](const std::string& bytes) {
    onnx::ModelProto p;
    REQUIRE(p.ParseFromString(bytes));
    return static_cast<std::uint64_t>(p.SpaceUsedLong());
  };
  SUBCASE("many tiny nodes, attributes and strings: about 350 bytes parsed for 14 on the wire") {
    model_maker m;
    for (int i = 0; i < 20000; ++i) m.node("Relu", "", {"x"}, {"y"});
    for (int i = 0; i < 2000; ++i) model_maker::attr(m.node("Foo", "n", {"x", "", ""}, {"y"}), "", std::vector<std::int64_t>(8, 1));
    const std::string b = m.bytes();
    CHECK(parsed_bytes_bound(b) >= parsed(b));
    CHECK(parsed_bytes_bound(b) > 20 * b.size());  // far more than the file
  }
  SUBCASE("packed varints of one byte are eight-byte elements") {
    model_maker m;
    m.ints("i", std::vector<std::int64_t>(100000, 1));
    m.node("Relu", "r", {"i"}, {"y"});
    const std::string b = m.bytes();
    CHECK(parsed_bytes_bound(b) >= parsed(b));
  }
  SUBCASE("raw_data (field 9) is charged its size, zeros or not") {
    for (char fill : {'\0', '\x3c', '\x80'}) {
      model_maker m;
      auto* t = m.g->add_initializer();
      t->set_name("w");
      t->set_data_type(onnx::TensorProto::FLOAT);
      t->add_dims(1 << 18);
      t->set_raw_data(std::string(std::size_t{4} << 18, fill));
      m.node("Relu", "r", {"w"}, {"y"});
      const std::string b = m.bytes();
      CHECK(parsed_bytes_bound(b) >= parsed(b));
      CHECK(parsed_bytes_bound(b) < b.size() + 16384);  // the messages around it: a few KiB
    }
  }
  SUBCASE("truncated, random and empty bytes end, and bound what a failed parse took") {
    model_maker m;
    for (int i = 0; i < 1000; ++i) m.node("Relu", "", {"x"}, {"y"});
    const std::string b = m.bytes();
    CHECK(parsed_bytes_bound(b.substr(0, b.size() / 2)) >= parsed_bytes_bound(b) / 3);
    std::string noise(1 << 20, '\0');
    std::uint64_t s = 1;
    for (char& c : noise) c = static_cast<char>((s = s * 6364136223846793005u + 1442695040888963407u) >> 56);
    CHECK(parsed_bytes_bound(noise) > 0);
    CHECK(parsed_bytes_bound("") == detail::onnx_in::parsed_message_bytes);
  }
}

TEST_CASE("a shape computation whose arithmetic overflows int64 is refused or left unfolded, never wrapped") {
  // Mul of 2^40 and 2^40 (each a dim's bound) wrapped to 0 (signed overflow, undefined): the
  // Reshape to [4, 0] copied the input's dim and the model planned as a view to [4, 8]. An Add
  // of -2^63 passed the bound (std::abs(-2^63) is -2^63) and wrapped to a dim of 2^63 - 8.
  auto model = [](std::int64_t a, std::int64_t b, const char* op) {
    model_maker mm;
    mm.input("x", {"4", "8"}).ints("a", {a}).ints("b", {b}).ints("four", {4});
    mm.node(op, "m", {"a", "b"}, {"c"});
    auto* cat = mm.node("Concat", "cat", {"four", "c"}, {"s"});
    model_maker::attr(cat, "axis", std::int64_t{0});
    mm.node("Reshape", "r", {"x", "s"}, {"r_out"});
    mm.node("Relu", "act", {"r_out"}, {"y"});
    mm.output("y");
    return mm.bytes();
  };
  const std::int64_t big = std::int64_t{1} << 40;
  CHECK(error_of<graph_error>(model(big, big, "Mul")) ==
        "graph error: m.onnx: node 0 'm' ('Mul'): the shape computation 1099511627776 x 1099511627776 overflows int64 (a dim is at most 2^40)");
  CHECK(error_of<graph_error>(model(big - 1, big - 1, "Mul")).find("1099511627775 x 1099511627775 overflows int64") != std::string::npos);
  const std::string low = error_of<graph_error>(model(std::numeric_limits<std::int64_t>::min(), -8, "Add"));
  CHECK(low.find("9223372036854775800") == std::string::npos);
  CHECK(low.find("node 2 'r' ('Reshape'): the shape of 'r_out' is unknown") != std::string::npos);
  // Within int64 it is folded as before: the Reshape to [4, 2 x 4] is x's own shape, a view
  // that changes nothing (no vertex: the Relu reads x).
  const model_graph g = read_onnx(model(2, 4, "Mul"), "m.onnx").graph;
  CHECK_FALSE(find_vertex(g, "r"));
  CHECK(g[operands(g, *find_vertex(g, "act"))[0]].name == "x");
  CHECK(vertex(g, "act").shape == tensor_shape{4, 8});
}

namespace {
/// Records torch.onnx.export's module path on node `n` (metadata_props, field 9 of NodeProto,
/// which Debian's ONNX 1.12 predates: written as the unknown field a newer exporter's file
/// carries), as the dynamo exporter does: "['', 'model', 'model.layers.0', ..., 'fx_name']".
void name_scopes(onnx::NodeProto* n, const std::string& list) {
  onnx::StringStringEntryProto e;
  e.set_key("pkg.torch.onnx.name_scopes");
  e.set_value(list);
  n->GetReflection()->MutableUnknownFields(n)->AddLengthDelimited(9, e.SerializeAsString());
}
}  // namespace

TEST_CASE("ONNX from torch's dynamo exporter: vertices named by module path, elementwise operators split") {
  // Two layers as the dynamo exporter writes them: nodes named by FX counters over the whole
  // model, the module path in the metadata; torch's attention guards its softmax with
  // Where(IsNaN(p), 0, p), operators with no kind of their own.
  model_maker mm(18);
  mm.input("x", {"batch", "8"}).weight("model.layers.0.fc.weight", {8, 8}).weight("model.layers.1.fc.weight", {8, 8}).scalar("zero", 0.0f);
  mm.input("keep", {"batch", "8"}, onnx::TensorProto::BOOL);
  std::string x = "x";
  int fx = 0;
  // A value every layer could read, computed from no data (the mask from positions and
  // constants) once, at its first use, early in layer 0 (as the exporter writes GPT-2's
  // attention mask): it keeps its node's name, and the layer's own Where is named as layer 1's.
  name_scopes(mm.node("Where", "node_Where_early", {"keep", "zero", "zero"}, {"early"}), "['', 'model', 'model.layers.0', 'where_early']");
  for (int i = 0; i < 2; ++i) {
    const std::string layer = "model.layers." + std::to_string(i), scopes = "['', 'model', '" + layer + "'";
    const std::string mmn = "node_MatMul_" + std::to_string(fx++), nan = "node_IsNaN_" + std::to_string(fx++),
                      sel = "node_Where_" + std::to_string(fx++);
    name_scopes(mm.node("MatMul", mmn, {x, layer + ".fc.weight"}, {layer + "_y"}), scopes + ", '" + layer + ".fc', 'linear_" + std::to_string(i) + "']");
    // A node the exporter leaves without metadata (as it does GPT-2's q/k/v Split): named in
    // the module its readers share.
    mm.node("Tanh", "node_Tanh_" + std::to_string(fx++), {layer + "_y"}, {layer + "_t"});
    name_scopes(mm.node("IsNaN", nan, {layer + "_t"}, {layer + "_nan"}), scopes + ", 'isnan_" + std::to_string(i) + "']");
    name_scopes(mm.node("Where", sel, {layer + "_nan", "zero", layer + "_t"}, {layer + "_out"}), scopes + ", 'where_" + std::to_string(i) + "']");
    x = layer + "_out";
  }
  // The exporter folds a Linear's weight.T into an initializer of its own (val_7): it takes its
  // module's weight name. Its scale is a 0-d initializer (val_8): a constant, not a weight.
  mm.weight("val_7", {8, 8}).scalar("val_8", 0.125f);
  name_scopes(mm.node("MatMul", "node_MatMul_7", {x, "val_7"}, {"head_y"}), "['', 'model', 'model.head', 'linear_2']");
  name_scopes(mm.node("Mul", "node_Mul_8", {"head_y", "val_8"}, {"scaled"}), "['', 'model', 'mul_8']");
  name_scopes(mm.node("Add", "node_Add_9", {"scaled", "early"}, {"sum"}), "['', 'model', 'add_9']");
  // A scope list that is not plain module paths (a '/' in it) keeps the node's own name.
  name_scopes(mm.node("Relu", "node_relu_9", {"sum"}, {"y"}), "['', 'a/b', 'relu_9']");
  mm.output("y");
  onnx_options o;
  o.batch = 4;
  const onnx_import r = read_onnx(mm.bytes(), "m.onnx", o);
  for (int i = 0; i < 2; ++i) {  // the same names but for the layer index: repeated layers tie
    const std::string layer = "model.layers." + std::to_string(i);
    CHECK(vertex(r.graph, layer + ".fc").kind == op_kind::linear);  // a MatMul by a weight takes its module's name
    CHECK(vertex(r.graph, layer + ".Where").kind == op_kind::where);
    CHECK(vertex(r.graph, layer + ".Tanh").kind == op_kind::tanh);
    const node& nan = vertex(r.graph, layer + ".IsNaN");
    CHECK(nan.kind == op_kind::opaque);
    CHECK(nan.attrs.elementwise);
    CHECK(nan.attrs.dims.empty());
    CHECK(nan.shape == tensor_shape{4, 8});
    CHECK(nan.type == dtype::boolean);
  }
  CHECK(vertex(r.graph, "node_relu_9").kind == op_kind::relu);
  CHECK(r.graph[operands(r.graph, *find_vertex(r.graph, "model.layers.0.Where"))[0]].name == "model.layers.0.IsNaN");
  CHECK(r.graph[operands(r.graph, *find_vertex(r.graph, "node_Where_early"))[0]].name == "keep");
  CHECK_FALSE(find_vertex(r.graph, "model.layers.0.Where_1"));
  CHECK(vertex(r.graph, "model.head").kind == op_kind::linear);
  CHECK(vertex(r.graph, "model.head.weight").kind == op_kind::parameter);
  CHECK(vertex(r.graph, "val_8").kind == op_kind::input);
  CHECK(vertex(r.graph, "val_8").attrs.held);
  CHECK(parameter_count(r.graph) == 3 * 64);
  // An elementwise opaque operator splits as its operands do: each dim of the output, or whole.
  const vertex_t v = *find_vertex(r.graph, "model.layers.1.IsNaN");
  std::vector<std::string> specs;
  for (const strategy& s : enumerate_strategies(r.graph, v, device_mesh{4})) specs.push_back(to_alpa_string(s.output));
  std::sort(specs.begin(), specs.end());
  specs.erase(std::unique(specs.begin(), specs.end()), specs.end());
  CHECK(specs == std::vector<std::string>{"RR", "RS0", "S0R"});
  // The attribute survives the model JSON, and is checked there: its shape is its operands' broadcast.
  nlohmann::json j = to_json(r.graph);
  const model_graph back = from_json(j);
  CHECK(back[*find_vertex(back, "model.layers.1.IsNaN")].attrs.elementwise);
  for (auto& n : j["nodes"])
    if (n["name"] == "model.layers.1.IsNaN") n["attrs"]["dims"] = {4, 8};
  CHECK_THROWS_WITH_AS(from_json(j), doctest::Contains("an elementwise opaque operator's shape is its operands' broadcast, not dims"), graph_error);
}

namespace {
/// A 0-d int64 initializer, as torch's dynamo exporter writes Range's bounds.
void int_scalar(model_maker& mm, const std::string& name, std::int64_t v) {
  auto* t = mm.g->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::INT64);
  t->add_int64_data(v);
}

/// The rest of the attention as torch's dynamo exporter writes it, from the heads q (`qh`) and
/// k, v [B, h, keys, hd] (`k`, `v`): k^T over a 3-D view (`flat_shape`, `kt_shape`), q and
/// k^T scaled by `c`, the scores plus the mask's `bias`, the softmax guarded by
/// Where(IsNaN(p), 0, p), times v, and the heads merged into y (`out_shape`).
void scores_to_output(model_maker& mm, const std::string& k, const std::string& v) {
  const auto perm = [&](onnx::NodeProto* n, const std::vector<std::int64_t>& p) { model_maker::attr(n, "perm", p); };
  mm.node("Reshape", "node_kflat", {k, "flat_shape"}, {"kflat"});
  perm(mm.node("Transpose", "node_kt", {"kflat"}, {"ktflat"}), {0, 2, 1});
  mm.node("Reshape", "node_kt4", {"ktflat", "kt_shape"}, {"kt"});
  mm.node("Mul", "node_mul_q", {"qh", "c"}, {"qs"});
  mm.node("Mul", "node_mul_k", {"kt", "c"}, {"ks"});
  mm.node("MatMul", "node_scores", {"qs", "ks"}, {"scores"});
  mm.node("Add", "node_masked", {"scores", "bias"}, {"masked"});
  model_maker::attr(mm.node("Softmax", "node_softmax", {"masked"}, {"p"}), "axis", std::int64_t{-1});
  mm.node("IsNaN", "node_isnan", {"p"}, {"nan"});
  mm.node("Where", "node_guard", {"nan", "zero", "p"}, {"pg"});
  mm.node("MatMul", "node_pv", {"pg", v}, {"o"});
  perm(mm.node("Transpose", "node_merge", {"o"}, {"om"}), {0, 2, 1, 3});
  mm.node("Reshape", "node_view_out", {"om", "out_shape"}, {"y"});
}

/// scaled_dot_product_attention(q, k, v, mask) of [2, 4, 8] over 2 heads as torch's dynamo
/// exporter decomposes it: q and k^T each scaled by sqrt(scale) (k^T transposed over a 3-D
/// view), the mask built at run time from positions (Range, Unsqueeze, a comparison) and
/// added as Where(mask, 0, finfo.min), the softmax guarded by Where(IsNaN(p), 0, p), and the
/// heads merged into [B*S, H] for GPT-2's Conv1D. `compare` makes the mask: LessOrEqual(col,
/// row) is causal. The positions also feed an embedding of 4 rows (GPT-2's wpe).
std::string dynamo_attention(const std::string& compare) {
  model_maker mm(18);
  mm.input("x", {"2", "4", "8"}).weight("wpe", {4, 8}).scalar("zero", 0.0f).scalar("fill", -3.4028235e38f);
  mm.scalar("c", static_cast<float>(std::sqrt(0.5)));  // sqrt(1 / sqrt(head dim 4))
  int_scalar(mm, "start", 0);
  int_scalar(mm, "limit", 4);
  int_scalar(mm, "delta", 1);
  mm.ints("heads_shape", {2, 4, 2, 4}).ints("flat_shape", {4, 4, 4}).ints("kt_shape", {2, 2, 4, 4}).ints("out_shape", {8, 8});
  mm.ints("ax0", {0}).ints("ax1", {1}).ints("mask_shape", {1, 1, 4, 4});
  const auto perm = [&](onnx::NodeProto* n, const std::vector<std::int64_t>& p) { model_maker::attr(n, "perm", p); };
  // Positions and the mask, from no input.
  mm.node("Range", "node_arange", {"start", "limit", "delta"}, {"pos"});
  mm.node("Unsqueeze", "node_unsqueeze", {"pos", "ax0"}, {"col"});
  mm.node("Unsqueeze", "node_unsqueeze_1", {"pos", "ax1"}, {"row"});
  mm.node(compare, "node_le", {"col", "row"}, {"m2"});
  mm.node("Reshape", "node_view", {"m2", "mask_shape"}, {"mask"});
  mm.node("Where", "node_where", {"mask", "zero", "fill"}, {"bias"});
  mm.node("Gather", "node_embedding", {"wpe", "col"}, {"positions"});
  mm.node("Add", "node_add", {"x", "positions"}, {"h"});
  // Heads.
  for (const char* t : {"q", "k", "v"}) {
    mm.node("Reshape", std::string("node_view_") + t, {"h", "heads_shape"}, {std::string(t) + "4"});
    perm(mm.node("Transpose", std::string("node_transpose_") + t, {std::string(t) + "4"}, {std::string(t) + "h"}), {0, 2, 1, 3});
  }
  scores_to_output(mm, "kh", "vh");
  mm.output("y");
  return mm.bytes();
}
}  // namespace

namespace {
/// GPT-2's attention of x [2, S, 8] over 2 heads of 4 in a decode step, as torch's dynamo
/// exporter writes it with transformers' DynamicCache: k and v in heads concatenated after a
/// key/value cache of P tokens on the sequence axis (graph inputs past_key_values.0.key and
/// .value, [2, 2, P, 4] unless `past_dims` says otherwise, their dim 2 symbolic "past" with
/// `symbolic`; the concatenations graph outputs present.0.key and .value), the scores
/// [2, 2, S, P + S] masked by positions: key j is seen by query i where j <= `mask_from` + i
/// (P: causal after the cache). The query positions also look up a learned table `wpe` of 16
/// rows added to x, as GPT-2's cache_position does.
std::string cached_attention(std::int64_t past, std::int64_t seq, std::int64_t mask_from, bool symbolic = false,
                             std::vector<std::string> past_dims = {}) {
  const std::int64_t keys = past + seq;
  if (past_dims.empty()) past_dims = {"2", "2", symbolic ? "past" : std::to_string(past), "4"};
  model_maker mm(18);
  mm.input("x", {"2", std::to_string(seq), "8"}).weight("wpe", {16, 8});
  mm.input("past_key_values.0.key", past_dims).input("past_key_values.0.value", past_dims);
  mm.scalar("zero", 0.0f).scalar("fill", -3.4028235e38f).scalar("c", static_cast<float>(std::sqrt(0.5)));
  int_scalar(mm, "zero_i", 0);
  int_scalar(mm, "keys", keys);
  int_scalar(mm, "from", mask_from);
  int_scalar(mm, "to", mask_from + seq);
  int_scalar(mm, "delta", 1);
  mm.ints("heads_shape", {2, seq, 2, 4}).ints("flat_shape", {4, keys, 4}).ints("kt_shape", {2, 2, 4, keys});
  mm.ints("out_shape", {2, seq, 8}).ints("ax0", {0}).ints("ax1", {1}).ints("mask_shape", {1, 1, seq, keys});
  const auto perm = [&](onnx::NodeProto* n, const std::vector<std::int64_t>& p) { model_maker::attr(n, "perm", p); };
  mm.node("Range", "node_key_positions", {"zero_i", "keys", "delta"}, {"kpos"});
  mm.node("Range", "node_query_positions", {"from", "to", "delta"}, {"qpos"});
  mm.node("Unsqueeze", "node_unsqueeze", {"kpos", "ax0"}, {"col"});
  mm.node("Unsqueeze", "node_unsqueeze_1", {"qpos", "ax1"}, {"row"});
  mm.node("LessOrEqual", "node_le", {"col", "row"}, {"m2"});
  mm.node("Reshape", "node_view", {"m2", "mask_shape"}, {"mask"});
  mm.node("Where", "node_where", {"mask", "zero", "fill"}, {"bias"});
  mm.node("Unsqueeze", "node_unsqueeze_2", {"qpos", "ax0"}, {"position_ids"});
  mm.node("Gather", "node_embedding", {"wpe", "position_ids"}, {"positions"});
  mm.node("Add", "node_add", {"x", "positions"}, {"h"});
  for (const char* t : {"q", "k", "v"}) {
    mm.node("Reshape", std::string("node_view_") + t, {"h", "heads_shape"}, {std::string(t) + "4"});
    perm(mm.node("Transpose", std::string("node_transpose_") + t, {std::string(t) + "4"}, {std::string(t) + "h"}), {0, 2, 1, 3});
  }
  model_maker::attr(mm.node("Concat", "node_cache_k", {"past_key_values.0.key", "kh"}, {"present.0.key"}), "axis", std::int64_t{2});
  model_maker::attr(mm.node("Concat", "node_cache_v", {"past_key_values.0.value", "vh"}, {"present.0.value"}), "axis", std::int64_t{2});
  scores_to_output(mm, "present.0.key", "present.0.value");
  mm.output("y").output("present.0.key").output("present.0.value");
  return mm.bytes();
}

/// The attention vertices of `g`.
std::vector<vertex_t> attentions_of(const model_graph& g) {
  std::vector<vertex_t> a;
  for (vertex_t v : boost::make_iterator_range(boost::vertices(g)))
    if (g[v].kind == op_kind::attention) a.push_back(v);
  return a;
}
}  // namespace

TEST_CASE("a decode step exported with its key/value cache: the past concatenated before the attention is its kv_cache") {
  for (const std::int64_t seq : {1, 3}) {
    CAPTURE(seq);
    const onnx_import r = read_onnx(cached_attention(5, seq, 5), "m.onnx");
    CHECK(r.opaque.empty());
    const model_graph& g = r.graph;
    const std::vector<vertex_t> att = attentions_of(g);
    REQUIRE(att.size() == 1);
    const node& a = g[att[0]];
    CHECK(a.attrs.causal);  // query i at position 5 + i
    CHECK(a.attrs.heads == 2);
    CHECK(a.shape == tensor_shape{2, seq, 8});
    const std::vector<vertex_t> ops = operands(g, att[0]);
    REQUIRE(ops.size() == 5);
    // Operands 3 and 4: the graph inputs, named as the file (and the builders) name them, in
    // the kind's layout [B, P, kv_heads*D].
    CHECK(g[ops[3]].name == "past_key_values.0.key");
    CHECK(g[ops[4]].name == "past_key_values.0.value");
    for (std::size_t i : {3u, 4u}) {
      CHECK(g[ops[i]].is_kv_cache());
      CHECK(g[ops[i]].shape == tensor_shape{2, 5, 8});
    }
    // present.0.key and .value (the cache written back) are no outputs and no vertices.
    CHECK(r.cache_outputs == std::vector<std::string>{"present.0.key", "present.0.value"});
    for (const char* gone : {"present.0.key", "present.0.value", "node_cache_k", "node_cache_v", "node_le", "bias"})
      CHECK_FALSE(find_vertex(g, gone));
    std::size_t outputs = 0;
    for (vertex_t v : boost::make_iterator_range(boost::vertices(g))) outputs += boost::out_degree(v, g) == 0;
    CHECK(outputs == 1);
    // The positions 5.. look up the table's rows from 5 on, as the builders' position_rows do.
    const node& rows = vertex(g, "wpe.past_offset");
    CHECK(rows.kind == op_kind::split);
    CHECK(rows.attrs.start == 5);
    CHECK(rows.shape == tensor_shape{11, 8});
    const vertex_t e = *find_vertex(g, "node_embedding");
    CHECK(g[operands(g, e)[1]].name == "wpe.past_offset");
  }
  // A mask counted from position 0, not the cache's 5: no causal attention after the cache;
  // the scores stay as the file computes them, and the past is a plain input in its layout.
  const onnx_import from0 = read_onnx(cached_attention(5, 3, 0), "m.onnx");
  CHECK(attentions_of(from0.graph).empty());
  CHECK(vertex(from0.graph, "node_softmax").kind == op_kind::softmax);
  CHECK_FALSE(vertex(from0.graph, "past_key_values.0.key").is_kv_cache());
  CHECK(vertex(from0.graph, "past_key_values.0.key").shape == tensor_shape{2, 2, 5, 4});
  CHECK(from0.cache_outputs.empty());
  CHECK_FALSE(find_vertex(from0.graph, "wpe.past_offset"));  // no decode step: the positions read the whole table
}

TEST_CASE("a key/value cache's symbolic past is sized by onnx_options::past, or named as the size to give") {
  const std::string file = cached_attention(5, 1, 5, true);
  const std::string e = error_of<graph_error>(file);
  CHECK(e.find("graph input 'past_key_values.0.key' dim 2 is symbolic ('past')") != std::string::npos);
  CHECK(e.find("--kv-cache dim 2 of a key/value cache [batch, kv_heads, past, head_dim]") != std::string::npos);
  onnx_options o;
  o.past = 5;
  const onnx_import r = read_onnx(file, "m.onnx", o);
  CHECK(r.past_used);
  REQUIRE(attentions_of(r.graph).size() == 1);
  CHECK(vertex(r.graph, "past_key_values.0.value").shape == tensor_shape{2, 5, 8});
  CHECK_FALSE(read_onnx(cached_attention(5, 1, 5), "m.onnx").past_used);  // a fixed past no option sized
}

TEST_CASE("a key/value cache whose heads or head size disagree with the new keys is refused, naming the numbers") {
  // 3 heads where the keys have 2; heads of 5 where they have 4.
  // (ONNX 1.12's inference leaves such a Concat's shape unknown; the reader names why.)
  const std::string tail = "which a concatenation on axis 2 keeps; a key/value cache [batch, kv_heads, past, head_dim] has its new keys' "
                           "batch, heads and head size";
  for (const auto& c : {std::pair{std::vector<std::string>{"2", "3", "5", "4"}, std::string("'past_key_values.0.key' [2,3,5,4] and "
                                                                                          "'kh' [2,2,1,4] differ in dim 1 (3 vs 2), ")},
                        std::pair{std::vector<std::string>{"2", "2", "5", "5"}, std::string("'past_key_values.0.key' [2,2,5,5] and "
                                                                                          "'kh' [2,2,1,4] differ in dim 3 (5 vs 4), ")}}) {
    const auto& [dims, want] = c;
    CAPTURE(c.second);
    const std::string e = error_of<graph_error>(cached_attention(5, 1, 5, false, dims));
    CHECK(e.find("'node_cache_k' ('Concat'): " + want + tail) != std::string::npos);
  }
}

TEST_CASE("torch's dynamo export of attention: a mask built from positions is evaluated, and a causal one fuses") {
  const onnx_import r = read_onnx(dynamo_attention("LessOrEqual"), "m.onnx");
  CHECK(r.opaque.empty());
  int attentions = 0;
  for (vertex_t v : boost::make_iterator_range(boost::vertices(r.graph))) {
    const node& n = r.graph[v];
    if (n.kind != op_kind::attention) continue;
    ++attentions;
    CHECK(n.attrs.causal);
    CHECK(n.attrs.heads == 2);
    CHECK(n.shape == tensor_shape{2, 4, 8});
  }
  CHECK(attentions == 1);
  // The heads merge into [B*S, H]: a view of the attention's [B, S, H], as the Reshape wrote it.
  const node& out = vertex(r.graph, "node_view_out");
  CHECK(out.kind == op_kind::reshape);
  CHECK(out.shape == tensor_shape{8, 8});
  CHECK(r.graph[operands(r.graph, *find_vertex(r.graph, "node_view_out"))[0]].kind == op_kind::attention);
  // Nothing of the mask is left; the positions the embedding reads are a constant input.
  for (const char* gone : {"node_arange", "node_le", "node_view", "node_where", "mask", "bias", "node_isnan", "node_guard"})
    CHECK_FALSE(find_vertex(r.graph, gone));
  CHECK(vertex(r.graph, "col").kind == op_kind::input);
  CHECK(vertex(r.graph, "col").type == dtype::i64);
  CHECK(vertex(r.graph, "node_embedding").kind == op_kind::embedding);
  CHECK(parameter_count(r.graph) == 4 * 8);

  // A mask that is not causal (each position sees itself and those after it) is what the file
  // computes, not attention as the kind expresses it: the product, softmax and guard stay, and
  // the mask, computed from no input, is one constant input.
  const onnx_import anti = read_onnx(dynamo_attention("GreaterOrEqual"), "m.onnx");
  for (vertex_t v : boost::make_iterator_range(boost::vertices(anti.graph))) CHECK(anti.graph[v].kind != op_kind::attention);
  CHECK(vertex(anti.graph, "node_softmax").kind == op_kind::softmax);
  CHECK(vertex(anti.graph, "node_isnan").kind == op_kind::opaque);
  CHECK(vertex(anti.graph, "bias").kind == op_kind::input);
  CHECK(vertex(anti.graph, "bias").shape == tensor_shape{1, 1, 4, 4});
  CHECK_FALSE(find_vertex(anti.graph, "node_le"));
}

namespace {
/// Records torch.onnx.export's kind of initializer `name` as the dynamo exporter does: a
/// value_info entry whose metadata_props (field 4 of ValueInfoProto, which Debian's ONNX 1.12
/// predates: the unknown field a newer exporter's file carries) holds
/// pkg.torch.export.graph_signature.InputSpec.kind = PARAMETER, BUFFER or CONSTANT_TENSOR.
onnx::ValueInfoProto* input_spec(model_maker& mm, const std::string& name, const std::vector<std::string>& dims, const std::string& kind) {
  onnx::ValueInfoProto* v = mm.g->add_value_info();
  model_maker::shape(v, name, onnx::TensorProto::FLOAT, dims);
  onnx::StringStringEntryProto e;
  e.set_key("pkg.torch.export.graph_signature.InputSpec.kind");
  e.set_value(kind);
  v->GetReflection()->MutableUnknownFields(v)->AddLengthDelimited(4, e.SerializeAsString());
  e.set_key("pkg.torch.export.graph_signature.InputSpec.persistent");
  e.set_value("False");
  v->GetReflection()->MutableUnknownFields(v)->AddLengthDelimited(4, e.SerializeAsString());
  return v;
}

/// x[4,8] @ fc.weight, times rot.inv_freq[8], plus a table[8], and a head: each initializer
/// marked by `mark` (nothing where it gives nothing).
model_maker marked_model(const std::function<void(model_maker&)>& mark) {
  model_maker mm(18);
  mm.input("x", {"4", "8"}).weight("model.fc.weight", {8, 8}).weight("model.rot.inv_freq", {8}).weight("model.table", {8});
  mm.weight("model.head.weight", {8, 8});
  mm.node("MatMul", "fc", {"x", "model.fc.weight"}, {"h"});
  mm.node("Mul", "rot", {"h", "model.rot.inv_freq"}, {"r"});
  mm.node("Add", "shift", {"r", "model.table"}, {"s"});
  mm.node("MatMul", "head", {"s", "model.head.weight"}, {"y"});
  mm.output("y");
  mark(mm);
  return mm;
}
}  // namespace

TEST_CASE("ONNX from torch's exporter: initializers it marks as buffers are inputs, not parameters") {
  // As torch.onnx.export(..., dynamo=True) writes them: the parameters PARAMETER, a registered
  // buffer (LLaMA's rotary inv_freq) BUFFER, a tensor constant CONSTANT_TENSOR; the head has
  // no entry (as the weights the exporter folds itself: val_166), and stays a parameter.
  const model_maker marked = marked_model([](model_maker& mm) {
    input_spec(mm, "model.fc.weight", {"8", "8"}, "PARAMETER");
    input_spec(mm, "model.rot.inv_freq", {"8"}, "BUFFER");
    input_spec(mm, "model.table", {"8"}, "CONSTANT_TENSOR");
  });
  const model_graph g = read_onnx(marked.bytes(), "m.onnx").graph;
  CHECK(vertex(g, "model.fc.weight").kind == op_kind::parameter);
  CHECK(vertex(g, "model.head.weight").kind == op_kind::parameter);
  const node& buffer = vertex(g, "model.rot.inv_freq");
  CHECK(buffer.kind == op_kind::input);
  CHECK(buffer.shape == tensor_shape{8});
  CHECK(buffer.type == dtype::f32);
  CHECK(buffer.attrs.held);  // data the model holds: no batch dim, whatever its length (with_batch_seq)
  CHECK_FALSE(vertex(g, "x").attrs.held);
  CHECK(vertex(g, "model.table").kind == op_kind::input);
  CHECK(vertex(g, "model.table").attrs.held);
  CHECK(vertex(g, "rot").kind == op_kind::mul);  // still data the forward reads
  CHECK(parameter_count(g) == 2 * 64);
  // No gradient, so no optimizer state: what a training step keeps of it is its bytes, as of
  // any input, where a parameter of the same size keeps its optimizer's state too.
  const std::vector<char> grads = detail::gradient_flags(g);
  CHECK_FALSE(grads[*find_vertex(g, "model.rot.inv_freq")]);
  CHECK_FALSE(grads[*find_vertex(g, "model.table")]);
  CHECK(grads[*find_vertex(g, "model.fc.weight")]);
  CHECK(grads[*find_vertex(g, "rot")]);
  strategy_options so;
  so.pricing.mode = run_mode::training;
  const auto replicated_bytes = [&](const std::string& name) {
    for (const strategy& s : enumerate_strategies(g, *find_vertex(g, name), device_mesh{2}, so, grads))
      if (s.output.is_replicated()) return s.memory_bytes;
    return std::int64_t{-1};
  };
  CHECK(replicated_bytes("model.rot.inv_freq") == 8 * 4);
  CHECK(replicated_bytes("model.fc.weight") > 64 * 4);
  // The same file without the entries (other exporters): every floating initializer a parameter, as before.
  const model_graph plain = read_onnx(marked_model([](model_maker&) {}).bytes(), "m.onnx").graph;
  CHECK(vertex(plain, "model.rot.inv_freq").kind == op_kind::parameter);
  CHECK(vertex(plain, "model.table").kind == op_kind::parameter);
  CHECK(parameter_count(plain) == 2 * 64 + 2 * 8);
  // Entries that disagree: PARAMETER wins (as without any).
  const model_graph both = read_onnx(marked_model([](model_maker& mm) {
                                       input_spec(mm, "model.rot.inv_freq", {"8"}, "BUFFER");
                                       input_spec(mm, "model.rot.inv_freq", {"8"}, "PARAMETER");
                                     }).bytes(),
                                     "m.onnx").graph;
  CHECK(vertex(both, "model.rot.inv_freq").kind == op_kind::parameter);
}

TEST_CASE("ONNX initializer kinds: metadata that is not a StringStringEntryProto, or names no kind, is ignored") {
  const auto kind_of_inv_freq = [](const std::function<void(onnx::ValueInfoProto*)>& mark) {
    const model_maker mm = marked_model([&](model_maker& m) {
      onnx::ValueInfoProto* v = m.g->add_value_info();
      model_maker::shape(v, "model.rot.inv_freq", onnx::TensorProto::FLOAT, {"8"});
      mark(v);
    });
    return vertex(read_onnx(mm.bytes(), "m.onnx").graph, "model.rot.inv_freq").kind;
  };
  const auto unknown = [](onnx::ValueInfoProto* v) { return v->GetReflection()->MutableUnknownFields(v); };
  const auto entry = [](const std::string& key, const std::string& value) {
    onnx::StringStringEntryProto e;
    e.set_key(key);
    e.set_value(value);
    return e.SerializeAsString();
  };
  const std::string kind = "pkg.torch.export.graph_signature.InputSpec.kind";
  // Field 4 as a varint, a fixed64, bytes that do not parse, an entry cut short, another key,
  // a kind that is not one of torch's, a kind with trailing bytes: a parameter, as without.
  CHECK(kind_of_inv_freq([&](auto* v) { unknown(v)->AddVarint(4, 7); }) == op_kind::parameter);
  CHECK(kind_of_inv_freq([&](auto* v) { unknown(v)->AddFixed64(4, 7); }) == op_kind::parameter);
  CHECK(kind_of_inv_freq([&](auto* v) { unknown(v)->AddLengthDelimited(4, std::string("\xff\xff\xff\xff\x0f", 5)); }) == op_kind::parameter);
  const std::string whole = entry(kind, "BUFFER");
  CHECK(kind_of_inv_freq([&](auto* v) { unknown(v)->AddLengthDelimited(4, whole.substr(0, whole.size() - 2)); }) == op_kind::parameter);
  CHECK(kind_of_inv_freq([&](auto* v) { unknown(v)->AddLengthDelimited(4, entry("pkg.torch.onnx.name_scopes", "BUFFER")); }) == op_kind::parameter);
  CHECK(kind_of_inv_freq([&](auto* v) { unknown(v)->AddLengthDelimited(4, entry(kind, "buffer")); }) == op_kind::parameter);
  CHECK(kind_of_inv_freq([&](auto* v) { unknown(v)->AddLengthDelimited(4, entry(kind, std::string("BUFFER\0", 7))); }) == op_kind::parameter);
  CHECK(kind_of_inv_freq([&](auto* v) { unknown(v)->AddLengthDelimited(5, whole); }) == op_kind::parameter);  // another field
  // After garbage, a good entry still counts; so does one on the graph input an initializer is listed as (IR < 4).
  CHECK(kind_of_inv_freq([&](auto* v) {
          unknown(v)->AddLengthDelimited(4, "\x0a");
          unknown(v)->AddLengthDelimited(4, whole);
        }) == op_kind::input);
  const model_maker listed = marked_model([&](model_maker& m) {
    onnx::ValueInfoProto* v = m.g->add_input();
    model_maker::shape(v, "model.rot.inv_freq", onnx::TensorProto::FLOAT, {"8"});
    unknown(v)->AddLengthDelimited(4, whole);
  });
  CHECK(vertex(read_onnx(listed.bytes(), "m.onnx").graph, "model.rot.inv_freq").kind == op_kind::input);
  // A whole file whose value_info is cut inside such an entry does not parse: a clear error.
  std::string cut = marked_model([&](model_maker& m) { input_spec(m, "model.rot.inv_freq", {"8"}, "BUFFER"); }).bytes();
  const std::size_t at = cut.rfind("BUFFER");
  REQUIRE(at != std::string::npos);
  CHECK(error_of<io_error>(cut.substr(0, at + 3)).find("the protobuf does not parse") != std::string::npos);
}

namespace {
/// LlamaAttention of x [2, 4, 16] as torch's dynamo exporter writes it: 2 query heads of 8
/// over 1 key/value head, q and k turned in the heads' layout by apply_rotary_pos_emb
/// (x * cos + rotate_half(x) * sin, the tables cos/sin of positions x the inv_freq buffer,
/// concatenated twice and unsqueezed for the heads), k and v repeated for the query heads
/// (repeat_kv: Unsqueeze, Expand, Reshape), q and k^T each scaled by sqrt(1/sqrt(8)), k^T
/// transposed over a 3-D view. `inv_freq` are the buffer's 4 frequencies; an
/// `attention_factor` other than 1 scales cos and sin (YaRN's), `first` is the first position.
/// With `turned` R below 8, a partial rotary as GPT-NeoX's and Phi-3's apply_rotary_pos_emb
/// write it: x[..., :R] turned (the buffer's R/2 frequencies), x[..., R:] concatenated after.
/// With a `past` P above 0, k (turned) and v are concatenated after a key/value cache of P
/// tokens (graph inputs past_key_values.0.key and .value [2, 1, P, 8], the concatenations
/// graph outputs present.0.key and .value), as transformers' DynamicCache exports.
std::string llama_attention(const std::vector<float>& inv_freq, float attention_factor = 1.0f, std::int64_t first = 0,
                            std::int64_t turned = 8, std::int64_t past = 0) {
  model_maker mm(18);
  mm.input("x", {"2", "4", "16"}).weight("q_proj.weight", {16, 16}).weight("k_proj.weight", {16, 8}).weight("v_proj.weight", {16, 8});
  auto* f = mm.g->add_initializer();
  f->set_name("model.rotary_emb.inv_freq");
  f->set_data_type(onnx::TensorProto::FLOAT);
  f->add_dims(static_cast<std::int64_t>(inv_freq.size()));
  for (float x : inv_freq) f->add_float_data(x);
  input_spec(mm, "model.rotary_emb.inv_freq", {std::to_string(inv_freq.size())}, "BUFFER");
  mm.scalar("c", static_cast<float>(std::sqrt(1.0 / std::sqrt(8.0))));
  int_scalar(mm, "start", first);
  int_scalar(mm, "limit", first + 4);
  int_scalar(mm, "delta", 1);
  mm.ints("ax0", {0}).ints("ax1", {1}).ints("ax2", {2}).ints("axl", {-1});
  mm.ints("lo_start", {0}).ints("half", {turned / 2}).ints("end", {std::numeric_limits<std::int64_t>::max()}).ints("rot_end", {turned});
  const std::int64_t keys = past + 4;
  mm.ints("q_shape", {2, 4, 2, 8}).ints("kv_shape", {2, 4, 1, 8}).ints("rep_shape", {2, 1, 2, keys, 8}).ints("rep_view", {2, 2, keys, 8});
  mm.ints("flat_shape", {4, keys, 8}).ints("kt_shape", {2, 2, 8, keys}).ints("out_shape", {2, 4, 16});
  const auto perm = [&](onnx::NodeProto* n, const std::vector<std::int64_t>& p) { model_maker::attr(n, "perm", p); };
  // The tables, from positions and the buffer alone.
  mm.node("Range", "node_arange", {"start", "limit", "delta"}, {"pos"});
  mm.node("Unsqueeze", "node_unsqueeze", {"pos", "ax0"}, {"pos2"});
  mm.node("Unsqueeze", "node_unsqueeze_1", {"pos2", "axl"}, {"pos3"});
  model_maker::attr(mm.node("Cast", "node_to_copy", {"pos3"}, {"posf"}), "to", std::int64_t{onnx::TensorProto::FLOAT});
  mm.node("Mul", "node_mul", {"posf", "model.rotary_emb.inv_freq"}, {"freqs"});
  model_maker::attr(mm.node("Concat", "node_cat", {"freqs", "freqs"}, {"emb"}), "axis", std::int64_t{-1});
  mm.node("Cos", "node_cos", {"emb"}, {attention_factor == 1.0f ? "cos" : "cos1"});
  mm.node("Sin", "node_sin", {"emb"}, {attention_factor == 1.0f ? "sin" : "sin1"});
  if (attention_factor != 1.0f) {
    mm.scalar("attention_factor", attention_factor);
    mm.node("Mul", "node_cos_factor", {"cos1", "attention_factor"}, {"cos"});
    mm.node("Mul", "node_sin_factor", {"sin1", "attention_factor"}, {"sin"});
  }
  mm.node("Unsqueeze", "node_unsqueeze_cos", {"cos", "ax1"}, {"cos4"});
  mm.node("Unsqueeze", "node_unsqueeze_sin", {"sin", "ax1"}, {"sin4"});
  // Heads, turned.
  for (const std::string t : {"q", "k", "v"}) {
    mm.node("MatMul", "node_" + t + "_proj", {"x", t + "_proj.weight"}, {t});
    mm.node("Reshape", "node_view_" + t, {t, t == "q" ? "q_shape" : "kv_shape"}, {t + "4"});
    perm(mm.node("Transpose", "node_transpose_" + t, {t + "4"}, {t + "h"}), {0, 2, 1, 3});
  }
  for (const std::string t : {"q", "k"}) {
    const bool part = turned < 8;
    const std::string x = part ? t + "x" : t + "h";
    if (part) {
      mm.node("Slice", "node_rot_part_" + t, {t + "h", "lo_start", "rot_end", "axl"}, {x});
      mm.node("Slice", "node_rot_pass_" + t, {t + "h", "rot_end", "end", "axl"}, {t + "pass"});
    }
    mm.node("Mul", "node_rot_cos_" + t, {x, "cos4"}, {t + "c"});
    mm.node("Slice", "node_rot_lo_" + t, {x, "lo_start", "half", "axl"}, {t + "lo"});
    mm.node("Slice", "node_rot_hi_" + t, {x, "half", "end", "axl"}, {t + "hi"});
    mm.node("Neg", "node_rot_neg_" + t, {t + "hi"}, {t + "n"});
    model_maker::attr(mm.node("Concat", "node_rot_cat_" + t, {t + "n", t + "lo"}, {t + "rh"}), "axis", std::int64_t{-1});
    mm.node("Mul", "node_rot_sin_" + t, {t + "rh", "sin4"}, {t + "sn"});
    mm.node("Add", "node_rot_" + t, {t + "c", t + "sn"}, {part ? t + "r0" : t + "r"});
    if (part)
      model_maker::attr(mm.node("Concat", "node_rot_join_" + t, {t + "r0", t + "pass"}, {t + "r"}), "axis", std::int64_t{-1});
  }
  for (const std::string t : {"k", "v"}) {  // [the cache,] repeat_kv
    std::string kv = t == "k" ? "kr" : "vh";
    if (past > 0) {
      const std::string which = t == "k" ? "key" : "value";
      mm.input("past_key_values.0." + which, {"2", "1", std::to_string(past), "8"});
      model_maker::attr(mm.node("Concat", "node_cache_" + t, {"past_key_values.0." + which, kv}, {"present.0." + which}), "axis",
                        std::int64_t{-2});
      mm.output("present.0." + which);
      kv = "present.0." + which;
    }
    mm.node("Unsqueeze", "node_rep_unsqueeze_" + t, {kv, "ax2"}, {t + "u"});
    mm.node("Expand", "node_rep_expand_" + t, {t + "u", "rep_shape"}, {t + "e"});
    mm.node("Reshape", "node_rep_view_" + t, {t + "e", "rep_view"}, {t + "rep"});
  }
  mm.node("Reshape", "node_kflat", {"krep", "flat_shape"}, {"kflat"});
  perm(mm.node("Transpose", "node_kt", {"kflat"}, {"ktflat"}), {0, 2, 1});
  mm.node("Reshape", "node_kt4", {"ktflat", "kt_shape"}, {"kt"});
  mm.node("Mul", "node_mul_q", {"qr", "c"}, {"qs"});
  mm.node("Mul", "node_mul_k", {"kt", "c"}, {"ks"});
  mm.node("MatMul", "node_scores", {"qs", "ks"}, {"scores"});
  model_maker::attr(mm.node("Softmax", "node_softmax", {"scores"}, {"p"}), "axis", std::int64_t{-1});
  mm.node("MatMul", "node_pv", {"p", "vrep"}, {"o"});
  perm(mm.node("Transpose", "node_merge", {"o"}, {"om"}), {0, 2, 1, 3});
  mm.node("Reshape", "node_view_out", {"om", "out_shape"}, {"y"});
  mm.output("y");
  return mm.bytes();
}

/// The frequencies of a rotary of base `base` over R = `turned` dims of heads of 8:
/// base^(-2i/R), as float32.
std::vector<float> frequencies(double base, int turned = 8) {
  std::vector<float> f;
  for (int i = 0; i < turned / 2; ++i) f.push_back(static_cast<float>(std::pow(base, -2.0 * i / turned)));
  return f;
}
}  // namespace

TEST_CASE("LLaMA's attention from torch's dynamo exporter: rotary in the heads' layout and repeated key/value heads fuse") {
  const onnx_import r = read_onnx(llama_attention(frequencies(500000.0)), "m.onnx");
  CHECK(r.opaque.empty());
  const model_graph& g = r.graph;
  std::vector<vertex_t> rotaries, attentions;
  for (vertex_t v : boost::make_iterator_range(boost::vertices(g))) {
    if (g[v].kind == op_kind::rotary) rotaries.push_back(v);
    if (g[v].kind == op_kind::attention) attentions.push_back(v);
  }
  REQUIRE(attentions.size() == 1);
  REQUIRE(rotaries.size() == 2);
  const node& a = g[attentions[0]];
  CHECK(a.attrs.heads == 2);
  CHECK(a.attrs.kv_heads == 1);  // the repeat is the kind's grouped-query attention
  CHECK_FALSE(a.attrs.causal);
  CHECK(a.shape == tensor_shape{2, 4, 16});
  const std::vector<vertex_t> qkv = operands(g, attentions[0]);
  // q and k: rotaries of the projections' [B,S,H] (named as the builders name them); v: its projection.
  for (int i = 0; i < 2; ++i) {
    const node& rot = g[qkv[static_cast<std::size_t>(i)]];
    CHECK(rot.kind == op_kind::rotary);
    CHECK(rot.attrs.rotary_half);
    CHECK(rot.attrs.rotary_base == doctest::Approx(500000.0).epsilon(1e-5));  // from the buffer's values
    CHECK(rot.attrs.heads == (i == 0 ? 2 : 1));
    CHECK(rot.shape == (i == 0 ? tensor_shape{2, 4, 16} : tensor_shape{2, 4, 8}));
    CHECK(g[operands(g, qkv[static_cast<std::size_t>(i)])[0]].name == (i == 0 ? "node_q_proj" : "node_k_proj"));
  }
  CHECK(g[qkv[0]].name == "node_softmax.rotary_q");
  CHECK(g[qkv[1]].name == "node_softmax.rotary_k");
  CHECK(g[qkv[2]].name == "node_v_proj");
  // Nothing of the tables, the buffer or the repeat is left.
  for (const char* gone : {"model.rotary_emb.inv_freq", "node_cos", "cos4", "sin4", "node_rep_expand_k", "node_rot_neg_q"})
    CHECK_FALSE(find_vertex(g, gone));
  CHECK(parameter_count(g) == 16 * 16 + 2 * 16 * 8);
  // LLaMA-2's base too; and a graph of the pattern splits over the heads: the strategies of
  // the attention include one with q's heads split 2 ways.
  const onnx_import r2 = read_onnx(llama_attention(frequencies(10000.0)), "m.onnx");
  for (vertex_t v : boost::make_iterator_range(boost::vertices(r2.graph)))
    if (r2.graph[v].kind == op_kind::rotary) CHECK(r2.graph[v].attrs.rotary_base == doctest::Approx(10000.0).epsilon(1e-5));
}

TEST_CASE("LLaMA's attention after a key/value cache: the rotaries turn from the past, the cache is read before the repeat") {
  // 4 tokens after a cache of 6: the tables hold positions 6..9; k is turned, then concatenated
  // after the cache's key/value head, then repeated for the 2 query heads.
  const onnx_import r = read_onnx(llama_attention(frequencies(500000.0), 1.0f, 6, 8, 6), "m.onnx");
  CHECK(r.opaque.empty());
  const model_graph& g = r.graph;
  const std::vector<vertex_t> att = attentions_of(g);
  REQUIRE(att.size() == 1);
  CHECK(g[att[0]].attrs.kv_heads == 1);
  CHECK_FALSE(g[att[0]].attrs.causal);  // unmasked: every query sees the cache and the 4 new keys
  const std::vector<vertex_t> ops = operands(g, att[0]);
  REQUIRE(ops.size() == 5);
  for (std::size_t i : {0u, 1u}) {
    CHECK(g[ops[i]].kind == op_kind::rotary);
    CHECK(g[ops[i]].attrs.rotary_offset == 6);
    CHECK(g[ops[i]].attrs.rotary_base == doctest::Approx(500000.0).epsilon(1e-5));
  }
  for (std::size_t i : {3u, 4u}) CHECK(g[ops[i]].is_kv_cache());
  CHECK(g[ops[3]].shape == tensor_shape{2, 6, 8});
  CHECK(r.cache_outputs.size() == 2);
  // Tables of positions 0..3 after a cache of 6 are another step's: nothing fuses.
  const onnx_import wrong = read_onnx(llama_attention(frequencies(500000.0), 1.0f, 0, 8, 6), "m.onnx");
  CHECK(attentions_of(wrong.graph).empty());
  CHECK(find_vertex(wrong.graph, "node_rot_neg_q"));
}

TEST_CASE("a partial rotary (GPT-NeoX's, Phi-3's apply_rotary_pos_emb) fuses as a rotary of its turned dims") {
  // x[..., :4] of heads of 8 turned by tables of width 4 (pair i at base^(-2i/4)), x[..., 4:]
  // concatenated after: a rotary with rotary_dims 4, the attention fused as with a whole head.
  for (const double base : {10000.0, 500000.0}) {
    CAPTURE(base);
    const onnx_import r = read_onnx(llama_attention(frequencies(base, 4), 1.0f, 0, 4), "m.onnx");
    CHECK(r.opaque.empty());
    const model_graph& g = r.graph;
    int rotaries = 0, attentions = 0;
    for (vertex_t v : boost::make_iterator_range(boost::vertices(g))) {
      const node& nd = g[v];
      attentions += nd.kind == op_kind::attention;
      if (nd.kind != op_kind::rotary) continue;
      ++rotaries;
      CHECK(nd.attrs.rotary_half);
      CHECK(nd.attrs.rotary_dims == 4);
      CHECK(nd.attrs.rotary_base == doctest::Approx(base).epsilon(1e-5));
      CHECK(nd.attrs.rotary_frequencies.empty());
    }
    CHECK(rotaries == 2);
    CHECK(attentions == 1);
    for (const char* gone : {"node_rot_part_q", "node_rot_pass_k", "node_rot_join_q", "node_rot_neg_k"}) CHECK_FALSE(find_vertex(g, gone));
  }
}

TEST_CASE("LLaMA's rotary tables of scaled frequencies fuse with those frequencies") {
  // Llama-3.1's rope_scaling (factor 8, low/high_freq_factor 1/4, 8192 original positions)
  // over heads of 8 at base 500000: pairs 0 and 1 kept, 2 interpolated, 3 divided by 8; and a
  // linear scaling (every frequency x 1.5). Each is cos/sin of p x f_i: a rotary with the
  // buffer's frequencies, the attention fused as at base^(-2i/D).
  rope_scaling_config l3;
  l3.type = "llama3";
  l3.factor = 8.0;
  const std::vector<double> want = rope_frequencies(500000.0, 8, l3, 16);
  REQUIRE(want.size() == 4);
  CHECK(want[2] > std::pow(500000.0, -0.5) / 8);  // interpolated: neither kept nor divided
  CHECK(want[2] < std::pow(500000.0, -0.5));
  std::vector<float> llama3, linear = frequencies(10000.0);
  for (double f : want) llama3.push_back(static_cast<float>(f));
  for (float& x : linear) x *= 1.5f;
  for (const std::vector<float>& freq : {llama3, linear}) {
    const onnx_import r = read_onnx(llama_attention(freq), "m.onnx");
    CHECK(r.opaque.empty());
    int rotaries = 0, attentions = 0;
    for (vertex_t v : boost::make_iterator_range(boost::vertices(r.graph))) {
      const node& nd = r.graph[v];
      CHECK(nd.kind != op_kind::matmul);  // no scores materialised: q k^T and p v are the attention's
      CHECK(nd.kind != op_kind::softmax);
      attentions += nd.kind == op_kind::attention;
      if (nd.kind != op_kind::rotary) continue;
      ++rotaries;
      CHECK(nd.attrs.rotary_half);
      REQUIRE(nd.attrs.rotary_frequencies.size() == 4);
      for (std::size_t i = 0; i < 4; ++i) CHECK(nd.attrs.rotary_frequencies[i] == doctest::Approx(freq[i]).epsilon(1e-5));
      if (&freq == &llama3) CHECK(nd.attrs.rotary_base == doctest::Approx(500000.0).epsilon(1e-5));  // pair 1's, kept by the scaling
    }
    CHECK(rotaries == 2);
    CHECK(attentions == 1);
    CHECK_FALSE(find_vertex(r.graph, "node_rot_neg_q"));
  }
}

TEST_CASE("LLaMA's rotary tables other than cos and sin of positions 0..S-1 x frequencies stay as the file computes them") {
  // An attention factor (YaRN's: cos and sin x 1.1), positions from 1, or a pair turning
  // backwards is not the rotary kind's turn: no rotary vertex, and with the heads turned as
  // computed, no attention either (the heads' layout is not the kind's).
  rope_scaling_config l3;
  l3.type = "llama3";
  l3.factor = 8.0;
  std::vector<float> scaled;
  for (double f : rope_frequencies(500000.0, 8, l3, 16)) scaled.push_back(static_cast<float>(f));
  std::vector<float> backwards = frequencies(10000.0);
  backwards[0] = -backwards[0];
  for (const std::string& file : {llama_attention(scaled, 1.1f), llama_attention(frequencies(10000.0), 1.1f),
                                  llama_attention(scaled, 1.0f, 1), llama_attention(backwards)}) {
    const onnx_import r = read_onnx(file, "m.onnx");
    for (vertex_t v : boost::make_iterator_range(boost::vertices(r.graph))) {
      CHECK(r.graph[v].kind != op_kind::rotary);
      CHECK(r.graph[v].kind != op_kind::attention);
    }
    CHECK(find_vertex(r.graph, "node_rot_neg_q"));  // the turn, as the file computes it
  }
}

TEST_CASE("ONNX views and dropouts that change nothing are no vertex") {
  // x -> Identity -> Dropout (eval: no training_mode) -> Reshape to its own shape -> Relu ->
  // Dropout(training_mode true) -> Identity (a graph output).
  model_maker mm;
  mm.input("x", {"4", "8"}).ints("same", {4, 8});
  auto* t = mm.g->add_initializer();
  t->set_name("train");
  t->set_data_type(onnx::TensorProto::BOOL);
  t->add_int32_data(1);
  mm.node("Identity", "id", {"x"}, {"a"});
  mm.node("Dropout", "drop_eval", {"a"}, {"b"});
  mm.node("Reshape", "view", {"b", "same"}, {"c"});
  mm.node("Relu", "act", {"c"}, {"d"});
  mm.node("Dropout", "drop_train", {"d", "", "train"}, {"e"});
  mm.node("Identity", "out", {"e"}, {"y"});
  mm.output("y");
  const model_graph g = read_onnx(mm.bytes(), "m.onnx").graph;
  for (const char* gone : {"id", "drop_eval", "view"}) CHECK_FALSE(find_vertex(g, gone));
  CHECK(g[operands(g, *find_vertex(g, "act"))[0]].name == "x");
  CHECK(vertex(g, "drop_train").kind == op_kind::dropout);  // trains: a dropout
  CHECK(vertex(g, "out").kind == op_kind::dropout);         // the graph's output keeps its vertex (the identity)
  // Before opset 12 a Dropout's mode is the runtime's: a dropout.
  model_maker old(11);
  old.input("x", {"4", "8"});
  old.node("Dropout", "drop", {"x"}, {"a"});
  old.node("Relu", "act", {"a"}, {"y"});
  old.output("y");
  CHECK(vertex(read_onnx(old.bytes(), "m.onnx").graph, "drop").kind == op_kind::dropout);
}
