// Builders, validation, JSON and Graphviz output of the model graph.
#include <doctest/doctest.h>

#include <autoshard/graph/graph.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>  // getpid

namespace {
using namespace autoshard;

std::int64_t params_named_like(const model_graph& g, const std::string& prefix) {
  std::int64_t n = 0;
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
    if (g[v].is_parameter() && g[v].name.rfind(prefix, 0) == 0) n += g[v].shape.numel();
  return n;
}

// The exception's message, so a CHECK can look for names in it.
template <class E, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(no exception)";
}

std::string expect_io_error(const std::string& json) {
  std::istringstream in(json);
  return error_of<io_error>([&] { read_json(in); });
}
std::string expect_graph_error(const std::string& json) {
  std::istringstream in(json);
  return error_of<graph_error>([&] { read_json(in); });
}
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("builders: parameter counts equal the published models'") {
  // GPT2LMHeadModel (wte tied to lm_head, counted once), as model.num_parameters() reports.
  CHECK(parameter_count(build_gpt2(transformer_config::gpt2_124m())) == 124'439'808);
  CHECK(parameter_count(build_gpt2(transformer_config::gpt2_355m())) == 354'823'168);
  CHECK(parameter_count(build_gpt2(transformer_config::gpt2_774m())) == 774'030'080);
  CHECK(parameter_count(build_gpt2(transformer_config::gpt2_1_5b())) == 1'557'611'200);
  // BertModel of bert-base-uncased / bert-large-uncased, pooler included: the inference graph.
  transformer_config bert_model = transformer_config::bert_base();
  bert_model.mode = run_mode::inference;
  CHECK(parameter_count(build_bert(bert_model)) == 109'482'240);
  bert_model = transformer_config::bert_large();
  bert_model.mode = run_mode::inference;
  CHECK(parameter_count(build_bert(bert_model)) == 335'141'888);
  // Training: BertForMaskedLM (no pooler; the masked-LM head, its decoder tied to the word embeddings).
  transformer_config bert_mlm = transformer_config::bert_base();
  bert_mlm.mode = run_mode::training;
  CHECK(parameter_count(build_bert(bert_mlm)) == 109'514'298);
  bert_mlm = transformer_config::bert_large();
  bert_mlm.mode = run_mode::training;
  CHECK(parameter_count(build_bert(bert_mlm)) == 335'174'458);
  // LlamaForCausalLM, untied lm_head: LLaMA-7B (Llama-2-7b) and the 70B shape (Llama-2-70b, GQA 8).
  CHECK(parameter_count(build_llama(transformer_config::llama_7b())) == 6'738'415'616);
  CHECK(parameter_count(build_llama(transformer_config::llama_70b())) == 68'976'648'192);

  const model_graph g = build_gpt2(transformer_config::gpt2_124m());
  CHECK(params_named_like(g, "transformer.h.0.") == 7'087'872);  // one block
  CHECK(params_named_like(g, "transformer.wte.") == 50257LL * 768);
}

TEST_CASE("builders: Hugging Face names and the weights of each linear") {
  transformer_config tiny = transformer_config::gpt2(2, 64, 4);
  tiny.seq = 16;
  tiny.batch = 2;
  tiny.mode = run_mode::training;
  const model_graph g = build_gpt2(tiny);
  validate(g);
  auto c_attn = find_vertex(g, "transformer.h.0.attn.c_attn");
  REQUIRE(c_attn);
  CHECK(g[*c_attn].kind == op_kind::linear);
  CHECK(g[*c_attn].attrs.transposed_weight);
  CHECK(g[*c_attn].shape == tensor_shape{2, 16, 192});
  CHECK(parameter_names(g, *c_attn) ==
        std::vector<std::string>{"transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_attn.bias"});
  CHECK(g[*find_vertex(g, "transformer.h.0.attn.c_attn.weight")].shape == tensor_shape{64, 192});  // Conv1D [in,out]
  CHECK(parameter_names(g, *find_vertex(g, "lm_head")) == std::vector<std::string>{"transformer.wte.weight"});
  CHECK(find_vertex(g, "loss"));
  CHECK(g[*find_vertex(g, "loss")].shape.rank == 0);
  const auto lw = linear_weights(g);
  CHECK(lw.size() == 2 * 4 + 1);  // c_attn, c_proj, c_fc, mlp.c_proj per block, and lm_head

  transformer_config bt = transformer_config::bert(1, 64, 4);
  bt.seq = 8;
  const model_graph b = build_bert(bt);
  validate(b);
  CHECK(parameter_names(b, *find_vertex(b, "bert.encoder.layer.0.attention.self.query")) ==
        std::vector<std::string>{"bert.encoder.layer.0.attention.self.query.weight",
                                 "bert.encoder.layer.0.attention.self.query.bias"});
  CHECK(g[*find_vertex(g, "transformer.h.1.attn.attention")].attrs.causal);
  CHECK_FALSE(b[*find_vertex(b, "bert.encoder.layer.0.attention.self.attention")].attrs.causal);

  transformer_config lt = transformer_config::llama(1, 64, 8, 2, 96);
  lt.seq = 8;
  const model_graph l = build_llama(lt);
  validate(l);
  CHECK(g[*c_attn].type == dtype::bf16);
  CHECK(l[*find_vertex(l, "model.layers.0.self_attn.k_proj.weight")].shape == tensor_shape{16, 64});  // 2 kv heads x 8
  CHECK(parameter_names(l, *find_vertex(l, "model.layers.0.mlp.gate_proj")) ==
        std::vector<std::string>{"model.layers.0.mlp.gate_proj.weight"});
  CHECK(l[*find_vertex(l, "model.layers.0.self_attn.attention")].attrs.kv_heads == 2);

  transformer_config bad = tiny;
  bad.heads = 5;
  CHECK(contains(error_of<graph_error>([&] { build_gpt2(bad); }), "hidden 64 is not a multiple of heads 5"));
  // A layer count no model has is refused before anything is built (the graph grows with it).
  transformer_config deep = tiny;
  deep.layers = max_transformer_layers + 1;
  for (auto build : {build_gpt2, build_llama, build_bert})
    CHECK(contains(error_of<graph_error>([&] { build(deep); }), "layers 4097 exceeds 4096"));
}

TEST_CASE("JSON round-trip of every builder's graph") {
  std::vector<std::pair<std::string, model_graph>> graphs;
  transformer_config small = transformer_config::gpt2(2, 64, 4);
  small.mode = run_mode::training;
  graphs.emplace_back("gpt2-train", build_gpt2(small));
  const auto inference = [](transformer_config c) {  // the forward-only graphs too: no labels, no loss
    c.mode = run_mode::inference;
    return c;
  };
  graphs.emplace_back("gpt2-124m", build_gpt2(inference(transformer_config::gpt2_124m())));
  graphs.emplace_back("bert-base", build_bert(transformer_config::bert_base()));
  transformer_config l70 = transformer_config::llama_70b();
  l70.layers = 2;  // the 70B shape, two layers, keeps the test fast
  l70.mode = run_mode::training;
  graphs.emplace_back("llama-70b-shape", build_llama(l70));
  graphs.emplace_back("llama-7b", build_llama(inference(transformer_config::llama_7b())));
  for (const auto& item : graphs) {
    const std::string& name = item.first;  // not a structured binding: CAPTURE needs a variable
    const model_graph& g = item.second;
    CAPTURE(name);
    std::ostringstream out;
    write_json(out, g);
    std::istringstream in(out.str());
    const model_graph h = read_json(in);
    REQUIRE(boost::num_vertices(h) == boost::num_vertices(g));
    REQUIRE(boost::num_edges(h) == boost::num_edges(g));
    for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
      CHECK(h[v].name == g[v].name);
      CHECK(h[v].kind == g[v].kind);
      CHECK(h[v].shape == g[v].shape);
      CHECK(h[v].type == g[v].type);
      CHECK(h[v].attrs == g[v].attrs);
      CHECK(operands(h, v) == operands(g, v));
    }
    CHECK(parameter_count(h) == parameter_count(g));
    std::ostringstream again;
    write_json(again, h);
    CHECK(again.str() == out.str());
  }
}

TEST_CASE("JSON errors name the JSON path or the vertex") {
  const std::string head = R"({"format": "autoshard.graph", "version": 1, "nodes": [)";
  const std::string x = R"({"name": "x", "kind": "input", "shape": [4, 8], "dtype": "f32"},)";
  const std::string w = R"({"name": "w", "kind": "parameter", "shape": [6, 8], "dtype": "f32"},)";
  CHECK(contains(expect_io_error(head + x + w +
                                 R"({"name": "fc", "kind": "linear", "shape": [4, -6], "dtype": "f32", "inputs": ["x", "w"]}]})"),
                 "nodes[2].shape[1] is -6, not an integer in [0, "));
  CHECK(contains(expect_io_error(head + x + R"({"name": "fc", "kind": "linear", "shape": [4, 6], "dtype": "f32", "inputs": ["x", "nope"]}]})"),
                 "nodes[1].inputs[1] names 'nope', but no node is called that"));
  CHECK(contains(expect_io_error(head + R"({"name": "x", "kind": "input", "shape": [4], "dtype": "f33"}]})"),
                 "nodes[0].dtype is 'f33', not a dtype"));
  CHECK(contains(expect_io_error(head + R"({"kind": "input", "shape": [4], "dtype": "f32"}]})"),
                 "nodes[0] has no member \"name\""));
  CHECK(contains(expect_io_error(head + x + w +
                                 R"({"name": "fc", "kind": "linear", "shape": [4, 6], "dtype": "f32", "inputs": ["x", "w"], "attrs": {"heads": "two"}}]})"),
                 "nodes[2].attrs.heads is \"two\", not an integer in [0, 1000000000]"));
  CHECK(contains(expect_io_error(R"({"nodes": 3})"), "nodes is 3, not an array"));
  CHECK(contains(expect_io_error(R"({"nodes": [)"), "not valid JSON"));
  CHECK(contains(expect_graph_error(head + R"({"name": "y", "kind": "conv9", "shape": [4], "dtype": "f32"}]})"),
                 "vertex 'y' (nodes[0].kind): unknown operator kind 'conv9'"));
  // well-formed JSON, invalid graph: the shape check names the vertex
  CHECK(contains(expect_graph_error(head + x + w +
                                    R"({"name": "fc", "kind": "linear", "shape": [4, 7], "dtype": "f32", "inputs": ["x", "w"]}]})"),
                 "vertex 'fc' (linear): output shape [4,7] does not match [4,6]"));
  const std::string path = "/nonexistent/model.json";
  CHECK(contains(error_of<io_error>([&] { read_json_file(path); }), "cannot open model file '/nonexistent/model.json'"));
}

namespace {
/// A graph file of an input x [3, W] and a rotary of 2 heads over it, with more attributes `attrs`.
std::string rotary_graph_text(int W, const std::string& attrs) {
  const std::string w = std::to_string(W);
  return R"({"format": "autoshard.graph", "version": 1, "nodes": [{"name": "x", "kind": "input", "shape": [3, )" + w +
         R"(], "dtype": "f32"}, {"name": "r", "kind": "rotary", "shape": [3, )" + w +
         R"(], "dtype": "f32", "inputs": ["x"], "attrs": {"heads": 2, )" + attrs + "}}]}";
}
}  // namespace

TEST_CASE("JSON: a rotary's explicit frequencies round-trip exactly and bad ones are refused") {
  const auto rot = [](const std::string& attrs) { return rotary_graph_text(8, attrs); };  // 2 heads of 4
  model_graph g;
  op_attrs a;
  a.heads = 2;
  a.rotary_half = true;
  a.rotary_frequencies = {0.1 + 0.2, 1.0 / 3.0};  // doubles that print long
  add_op(g, op_kind::rotary, "r", {add_input(g, "x", {3, 8}, dtype::f32)}, a);
  std::ostringstream out;
  write_json(out, g);
  CHECK(contains(out.str(), "\"rotary_frequencies\""));
  std::istringstream in(out.str());
  const model_graph h = read_json(in);
  CHECK(h[1].attrs == g[1].attrs);  // bit for bit
  std::ostringstream plain;  // the default (base^(-2i/D)) writes no list
  a.rotary_frequencies.clear();
  model_graph p;
  add_op(p, op_kind::rotary, "r", {add_input(p, "x", {3, 8}, dtype::f32)}, a);
  write_json(plain, p);
  CHECK(!contains(plain.str(), "rotary_frequencies"));
  CHECK(!contains(plain.str(), "\"scale\""));  // a scale of 1 (no YaRN attention_factor) writes none

  // YaRN's attention_factor: the rotary's scale, written when not 1, read back bit for bit, and refused unless above 0.
  a.scale = 1.0 / 3.0 + 1.0;
  model_graph y;
  add_op(y, op_kind::rotary, "r", {add_input(y, "x", {3, 8}, dtype::f32)}, a);
  std::ostringstream scaled;
  write_json(scaled, y);
  CHECK(contains(scaled.str(), "\"scale\""));
  std::istringstream scaled_in(scaled.str());
  CHECK(read_json(scaled_in)[1].attrs == y[1].attrs);
  CHECK(contains(expect_graph_error(rot(R"("scale": 0)")), "vertex 'r': rotary: scale 0 (its cos and sin times it) is not a finite number above 0"));
  CHECK(contains(expect_graph_error(rot(R"("scale": -1.5)")), "rotary: scale -1.5 (its cos and sin times it) is not a finite number above 0"));

  CHECK(contains(expect_graph_error(rot(R"("rotary_frequencies": [1.0, 0.5, 0.25])")),
                 "vertex 'r': rotary: 3 rotary_frequencies for heads of 4: one a pair, 2, is needed"));
  CHECK(contains(expect_io_error(rot(R"("rotary_frequencies": [1.0, 0])")), "nodes[1].attrs.rotary_frequencies[1] is 0, not a number in ["));
  CHECK(contains(expect_io_error(rot(R"("rotary_frequencies": [-1.0, 0.5])")), "nodes[1].attrs.rotary_frequencies[0] is -1"));
  CHECK(contains(expect_io_error(rot(R"("rotary_frequencies": [1.0, "fast"])")), "nodes[1].attrs.rotary_frequencies[1] is \"fast\""));
  CHECK(contains(expect_io_error(rot(R"("rotary_frequencies": 1.0)")), "nodes[1].attrs.rotary_frequencies is 1.0, not an array"));
  std::string many = "[1";  // refused by its count before any element is kept
  for (std::size_t i = 0; i < max_rotary_frequencies; ++i) many += ",1";
  CHECK(contains(expect_io_error(rot(R"("rotary_frequencies": )" + many + "]")),
                 "nodes[1].attrs.rotary_frequencies has 65537 elements; at most 65536 are allowed"));
}

TEST_CASE("JSON: a rotary's rope rule (dynamic, longrope) round-trips exactly and a malformed one is refused, naming the numbers") {
  const auto rot = [](const std::string& attrs) { return rotary_graph_text(8, attrs); };  // 2 heads of 4 (R 4), sequence 3 (dim -2)
  const auto round_trip = [](const rope_rule& rule) {
    model_graph g;
    op_attrs a;
    a.heads = 2;
    a.rotary_half = true;
    a.rotary_rule = rule;
    a.rotary_frequencies = rope_rule_frequencies(a.rotary_base, 4, rule, 3);
    add_op(g, op_kind::rotary, "r", {add_input(g, "x", {3, 8}, dtype::f32)}, a);
    std::ostringstream out;
    write_json(out, g);
    CHECK(contains(out.str(), "\"rotary_rule\""));
    std::istringstream in(out.str());
    CHECK(read_json(in)[1].attrs == g[1].attrs);  // the rule and its frequencies, bit for bit
  };
  round_trip(rope_rule{rope_rule_kind::dynamic, 1.0 / 3.0 + 1.0, 2, {}, {}});  // past its threshold: a grown base
  round_trip(rope_rule{rope_rule_kind::dynamic, 2.0, 8, {}, {}});              // within it: the default, no list
  round_trip(rope_rule{rope_rule_kind::longrope, 1.0, 2, {1.0, 0.1 + 0.2}, {2.0, 1.0 / 3.0}});
  round_trip(rope_rule{rope_rule_kind::longrope, 1.0, 8, {1.0, 0.1 + 0.2}, {2.0, 1.0 / 3.0}});

  // Malformed in the file (io_error naming the JSON path) ...
  const std::string at = "nodes[1].attrs.rotary_rule";
  CHECK(contains(expect_io_error(rot(R"("rotary_rule": {"type": "yarn", "threshold": 8})")), at + ".type is \"yarn\""));
  CHECK(contains(expect_io_error(rot(R"("rotary_rule": {"type": "none", "threshold": 8})")), at + ".type is \"none\": a rotary without a rule"));
  CHECK(contains(expect_io_error(rot(R"("rotary_rule": {"type": "dynamic", "threshold": 0, "factor": 2})")),
                 at + ".threshold is 0, not an integer in [1, 1099511627776]"));
  CHECK(contains(expect_io_error(rot(R"("rotary_rule": {"type": "dynamic", "threshold": 8})")), at + " has no \"factor\", which a dynamic rule needs"));
  CHECK(contains(expect_io_error(rot(R"("rotary_rule": {"type": "dynamic", "threshold": 8, "factor": 0})")), at + ".factor is 0, not a number in [1e-06"));
  CHECK(contains(expect_io_error(rot(R"("rotary_rule": {"type": "dynamic", "threshold": 8, "factor": 2, "long_factor": [1, 1]})")),
                 at + ".long_factor is not a member of a dynamic rule (type, threshold, factor)"));
  CHECK(contains(expect_io_error(rot(R"("rotary_rule": {"type": "longrope", "threshold": 8, "short_factor": [1, 1]})")),
                 at + " has no \"long_factor\", which a longrope rule needs"));
  CHECK(contains(expect_io_error(rot(R"("rotary_rule": {"type": "longrope", "threshold": 8, "factor": 2, "short_factor": [1, 1], "long_factor": [1, 1]})")),
                 at + ".factor is not a member of a longrope rule"));
  CHECK(contains(expect_io_error(rot(R"("rotary_rule": {"type": "longrope", "threshold": 8, "short_factor": [1, 0], "long_factor": [1, 1]})")),
                 at + ".short_factor[1] is 0, not a number in ["));
  std::string many = "[1";  // refused by its count before any element is kept
  for (std::size_t i = 0; i < max_rotary_frequencies; ++i) many += ",1";
  CHECK(contains(expect_io_error(rot(R"("rotary_rule": {"type": "longrope", "threshold": 8, "short_factor": [1, 1], "long_factor": )" + many + "]}")),
                 at + ".long_factor has 65537 elements; at most 65536 are allowed"));
  // ... and well-formed but not the rotary's (graph_error naming the vertex and the numbers).
  CHECK(contains(expect_graph_error(rot(R"("rotary_rule": {"type": "longrope", "threshold": 8, "short_factor": [1], "long_factor": [1, 1]})")),
                 "vertex 'r': rotary: rotary_rule longrope (original_max_position_embeddings 8): 1 short_factors for 4 turned dims: one a pair, 2, is needed"));
  CHECK(contains(expect_graph_error(rot(R"("rotary_dims": 2, "rotary_rule": {"type": "dynamic", "threshold": 8, "factor": 2})")),
                 "rotary_rule dynamic (factor 2, max_position_embeddings 8): turns 2 dims: its base's power R / (R - 2) needs R above 2"));
  // Its frequencies must be the rule's at the sequence (3, dim 0 of [3, 8]): past a dynamic threshold of 2 a grown base, ...
  CHECK(contains(expect_graph_error(rot(R"("rotary_rule": {"type": "dynamic", "threshold": 2, "factor": 2})")),
                 "rotary_rule dynamic (factor 2, max_position_embeddings 2) at sequence 3 (dim 0 of [3,8]) gives 2 rotary_frequencies, but 0 are given"));
  // ... within a threshold of 8, none (the default), ...
  CHECK(contains(expect_graph_error(rot(R"("rotary_frequencies": [1.0, 0.5], "rotary_rule": {"type": "dynamic", "threshold": 8, "factor": 2})")),
                 "at sequence 3 (dim 0 of [3,8]) gives the default base^(-2i/R), but 2 are given"));
  // ... and longrope's short factors within its threshold (the long ones' frequencies refused).
  CHECK(contains(expect_graph_error(rot(R"("rotary_frequencies": [0.5, 0.005], "rotary_rule": {"type": "longrope", "threshold": 8, "short_factor": [1, 1], "long_factor": [2, 2]})")),
                 "rotary_frequencies[0] 0.5 is not 1, what rotary_rule longrope (original_max_position_embeddings 8) gives at sequence 3 (dim 0 of [3,8])"));
  std::istringstream fits(rot(R"("rotary_frequencies": [0.5, 0.005], "rotary_rule": {"type": "longrope", "threshold": 2, "short_factor": [1, 1], "long_factor": [2, 2]})"));
  CHECK(read_json(fits)[1].attrs.rotary_frequencies == std::vector<double>{0.5, 0.005});  // past 2: the long ones
}

TEST_CASE("JSON: a partial rotary's rotary_dims round-trips, is checked against the head, and prices its turned dims") {
  // GPT-NeoX's rotary_pct, Phi's partial_rotary_factor: the first R dims of each head turn.
  const auto rot = [](const std::string& attrs) { return rotary_graph_text(16, attrs); };  // 2 heads of 8
  model_graph g;
  op_attrs a;
  a.heads = 2;
  a.rotary_half = true;
  a.rotary_dims = 4;
  a.rotary_frequencies = {0.5, 0.25};  // R/2 of them
  const vertex_t r = add_op(g, op_kind::rotary, "r", {add_input(g, "x", {3, 16}, dtype::f32)}, a);
  std::ostringstream out;
  write_json(out, g);
  CHECK(contains(out.str(), "\"rotary_dims\": 4"));
  std::istringstream in(out.str());
  CHECK(read_json(in)[1].attrs == g[1].attrs);
  // 3 FLOPs a turned element: 4 of each head's 8 here, the other half copied.
  CHECK(detail::op_flops(g[r], {g[0].shape}, g[r].shape) == 3.0 * 48 * 4 / 8);
  op_attrs whole = a;  // 0, the default, is the whole head, and is not written
  whole.rotary_dims = 0;
  whole.rotary_frequencies.clear();
  model_graph p;
  const vertex_t w = add_op(p, op_kind::rotary, "r", {add_input(p, "x", {3, 16}, dtype::f32)}, whole);
  std::ostringstream plain;
  write_json(plain, p);
  CHECK(!contains(plain.str(), "rotary_dims"));
  CHECK(detail::op_flops(p[w], {p[0].shape}, p[w].shape) == 3.0 * 48);
  CHECK(rotary_frequency(a, 1, 8) == 0.25);
  a.rotary_frequencies.clear();  // base^(-2i/R), not base^(-2i/D)
  CHECK(rotary_frequency(a, 1, 8) == std::pow(10000.0, -2.0 / 4.0));
  CHECK(rotary_width(a, 8) == 4);
  CHECK(rotary_width(whole, 8) == 8);

  CHECK(contains(expect_graph_error(rot(R"("rotary_dims": 3)")), "vertex 'r': rotary: rotary_dims 3 is not an even number of dims in 1..8, the head size"));
  CHECK(contains(expect_graph_error(rot(R"("rotary_dims": 10)")), "rotary_dims 10 is not an even number of dims in 1..8"));
  CHECK(contains(expect_graph_error(rot(R"("rotary_dims": 4, "rotary_frequencies": [1.0, 0.5, 0.25, 0.125])")),
                 "4 rotary_frequencies for 4 turned dims of heads of 8: one a pair, 2, is needed"));
  CHECK(contains(expect_io_error(rot(R"("rotary_dims": -2)")), "nodes[1].attrs.rotary_dims is -2, not an integer in [0, 131072]"));
  CHECK(contains(expect_io_error(rot(R"("rotary_dims": 2.5)")), "nodes[1].attrs.rotary_dims is 2.5, not an integer"));
  std::istringstream full(rot(R"("rotary_dims": 8)"));  // R = D reads as given, and turns as 0 does
  CHECK(read_json(full)[1].attrs.rotary_dims == 8);
}

TEST_CASE("JSON: a norm's epsilon round-trips exactly, is written only where it is not the default, and is checked") {
  const auto norm = [](const std::string& kind, const std::string& attrs) {
    return R"({"format": "autoshard.graph", "version": 1, "nodes": [{"name": "x", "kind": "input", "shape": [3, 8], "dtype": "f32"},)"
           R"({"name": "ln", "kind": ")" + kind + R"(", "shape": [3, 8], "dtype": "f32", "inputs": ["x"], "attrs": {)" + attrs + "}}]}";
  };
  model_graph g;
  op_attrs a;
  a.epsilon = 1e-6;  // Qwen2's rms_norm_eps
  const vertex_t x = add_input(g, "x", {3, 8}, dtype::f32);
  add_op(g, op_kind::rms_norm, "rms", {x}, a);
  a.epsilon = 1e-12;  // BERT's layer_norm_eps
  add_op(g, op_kind::layer_norm, "ln", {x}, a);
  add_op(g, op_kind::layer_norm, "plain", {x});  // default_norm_epsilon: not written
  CHECK(g[3].attrs.epsilon == default_norm_epsilon);
  CHECK(default_norm_epsilon == 1e-5);
  std::ostringstream out;
  write_json(out, g);
  CHECK(contains(out.str(), "\"epsilon\": 1e-06"));
  CHECK(contains(out.str(), "\"epsilon\": 1e-12"));
  CHECK(!contains(out.str().substr(out.str().find("\"plain\"")), "epsilon"));
  std::istringstream in(out.str());
  const model_graph back = read_json(in);
  CHECK(back[1].attrs.epsilon == 1e-6);
  CHECK(back[2].attrs.epsilon == 1e-12);
  CHECK(back[3].attrs.epsilon == default_norm_epsilon);
  for (vertex_t v = 1; v < 4; ++v) CHECK(back[v].attrs == g[v].attrs);
  op_attrs other = g[1].attrs;  // operator== sees it
  other.epsilon = 1e-5;
  CHECK_FALSE(other == g[1].attrs);

  std::istringstream top(norm("layer_norm", R"("epsilon": 1)"));  // the bound itself is an epsilon
  CHECK(read_json(top)[1].attrs.epsilon == 1.0);
  CHECK(contains(expect_graph_error(norm("layer_norm", R"("epsilon": 0)")), "vertex 'ln': layer_norm: epsilon 0 is not a finite number in (0, 1]"));
  CHECK(contains(expect_graph_error(norm("rms_norm", R"("epsilon": -1e-05)")), "vertex 'ln': rms_norm: epsilon -1e-05 is not a finite number in (0, 1]"));
  CHECK(contains(expect_graph_error(norm("rms_norm", R"("epsilon": 1.5)")), "vertex 'ln': rms_norm: epsilon 1.5 is not a finite number in (0, 1]"));
  CHECK(contains(expect_io_error(norm("rms_norm", R"("epsilon": "1e-5")")), "nodes[1].attrs.epsilon is \"1e-5\", not a number"));
}

TEST_CASE("JSON: Gemma's scaling, a norm's weight_offset and an embedding's scale, round-trips and is checked") {
  model_graph g;
  const vertex_t ids = add_input(g, "ids", {2, 3}, dtype::i64);
  const vertex_t table = add_parameter(g, "table", {16, 8}, dtype::f32);
  op_attrs e;
  e.scale = 2.8284271247461903;  // sqrt(8)
  const vertex_t x = add_op(g, op_kind::embedding, "embed", {ids, table}, e);
  const vertex_t w = add_parameter(g, "norm.weight", {8}, dtype::f32);
  op_attrs n;
  n.weight_offset = 1.0;
  add_op(g, op_kind::rms_norm, "norm", {x, w}, n);
  add_op(g, op_kind::rms_norm, "plain", {x, w});
  std::ostringstream out;
  write_json(out, g);
  CHECK(contains(out.str(), "\"scale\": 2.8284271247461903"));
  CHECK(contains(out.str(), "\"weight_offset\": 1.0"));
  CHECK(!contains(out.str().substr(out.str().find("\"plain\"")), "weight_offset"));
  std::istringstream in(out.str());
  const model_graph back = read_json(in);
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) CHECK(back[v].attrs == g[v].attrs);
  op_attrs other = g[2].attrs;
  other.scale = 1.0;
  CHECK_FALSE(other == g[2].attrs);

  const std::string head = R"({"format": "autoshard.graph", "version": 1, "nodes": [{"name": "x", "kind": "input", "shape": [3, 8], "dtype": "f32"},)";
  CHECK(contains(expect_graph_error(head + R"({"name": "ln", "kind": "rms_norm", "shape": [3, 8], "dtype": "f32", "inputs": ["x"], "attrs": {"weight_offset": 1}}]})"),
                 "vertex 'ln': rms_norm: weight_offset 1 without a weight"));
  CHECK(contains(expect_io_error(head + R"({"name": "ln", "kind": "rms_norm", "shape": [3, 8], "dtype": "f32", "inputs": ["x"], "attrs": {"weight_offset": "1"}}]})"),
                 "nodes[1].attrs.weight_offset is \"1\", not a number"));
  CHECK(contains(expect_io_error(head + R"({"name": "e", "kind": "embedding", "shape": [3, 8, 8], "dtype": "f32", "inputs": ["x", "x"], "attrs": {"scale": true}}]})"),
                 "nodes[1].attrs.scale is true, not a number"));
}

TEST_CASE("JSON: an attention's sliding window round-trips, is checked, and prices only the pairs it keeps") {
  const auto att = [](const std::string& attrs) {
    return std::string(R"({"format": "autoshard.graph", "version": 1, "nodes": [)") +
           R"({"name": "q", "kind": "input", "shape": [2, 8, 16], "dtype": "f32"},)"
           R"({"name": "a", "kind": "attention", "shape": [2, 8, 16], "dtype": "f32", "inputs": ["q", "q", "q"],)"
           R"( "attrs": {"heads": 2, )" + attrs + "}}]}";
  };
  std::istringstream in(att(R"("causal": true, "window": 3)"));
  const model_graph g = read_json(in);
  CHECK(g[1].attrs.window == 3);
  std::ostringstream out;
  write_json(out, g);
  CHECK(contains(out.str(), "\"window\": 3"));
  std::istringstream back(out.str());
  CHECK(read_json(back)[1].attrs == g[1].attrs);
  op_attrs other = g[1].attrs;  // operator== sees it
  other.window = 4;
  CHECK(!(other == g[1].attrs));
  std::istringstream none(att(R"("causal": true)"));
  std::ostringstream plain;
  write_json(plain, read_json(none));
  CHECK(!contains(plain.str(), "window"));  // 0, no window, is not written

  CHECK(contains(expect_graph_error(att(R"("window": 3)")),
                 "vertex 'a': attention: window 3 is a causal sliding window, but the attention is not causal"));
  CHECK(contains(expect_io_error(att(R"("causal": true, "window": -1)")), "nodes[1].attrs.window is -1, not an integer in [0, 1099511627776]"));
  CHECK(contains(expect_io_error(att(R"("causal": true, "window": 1099511627777)")), "nodes[1].attrs.window is 1099511627777"));
  model_graph h;  // built in code past the reader, the shape check still bounds it
  op_attrs bad;
  bad.heads = 2;
  bad.causal = true;
  bad.window = -2;
  const vertex_t q = add_input(h, "q", {2, 8, 16}, dtype::f32);
  CHECK_THROWS_WITH_AS(add_op(h, op_kind::attention, "a", {q, q, q}, bad), doctest::Contains("window -2 is not a key count"), graph_error);

  // FLOPs: 4 x batch x pairs x width; causal over 8 positions keeps 36 pairs, a window of 3 keeps
  // 1 + 2 + 3 x 6 = 21, a window of 8 or more all 36. The unfused kernel computes all 64 either way.
  const auto flops = [&](std::int64_t w, attention_kernel k) {
    node nd = g[1];
    nd.attrs.window = w;
    return detail::op_flops(nd, {g[0].shape, g[0].shape, g[0].shape}, nd.shape, k);
  };
  CHECK(flops(0, attention_kernel::flash) == 4.0 * 2 * 36 * 16);
  CHECK(flops(3, attention_kernel::flash) == 4.0 * 2 * 21 * 16);
  CHECK(flops(1, attention_kernel::flash) == 4.0 * 2 * 8 * 16);
  CHECK(flops(8, attention_kernel::flash) == flops(0, attention_kernel::flash));
  CHECK(flops(100, attention_kernel::flash) == flops(0, attention_kernel::flash));
  CHECK(flops(3, attention_kernel::unfused) == 4.0 * 2 * 64 * 16);
  CHECK(flops(3, attention_kernel::unfused) == flops(0, attention_kernel::unfused));
}

TEST_CASE("ALiBi: the slopes and biases transformers computes, the attr read, written and checked") {
  // The numbers are transformers' (5.25.0, CPU torch 2.15): modeling_bloom.py _get_alibi_slopes(n)
  // and the build_alibi_tensor of modeling_bloom.py and modeling_falcon.py on an all-ones mask,
  // printed with float.hex and copied here.
  const auto slopes = [](std::int64_t n) {
    std::vector<double> s;
    for (std::int64_t h = 0; h < n; ++h) s.push_back(static_cast<double>(alibi_slope(n, h)));
    return s;
  };
  CHECK(slopes(4) == std::vector<double>{0x1p-2, 0x1p-4, 0x1p-6, 0x1p-8});
  CHECK(slopes(8) == std::vector<double>{0x1p-1, 0x1p-2, 0x1p-3, 0x1p-4, 0x1p-5, 0x1p-6, 0x1p-7, 0x1p-8});
  // 12 is no power of two: the 8 of 8 heads, then every other slope of 16 heads from 2^-1/2.
  CHECK(slopes(12) == std::vector<double>{0x1p-1, 0x1p-2, 0x1p-3, 0x1p-4, 0x1p-5, 0x1p-6, 0x1p-7, 0x1p-8, 0x1.6a09e6p-1,
                                          0x1.6a09e6p-2, 0x1.6a09e4p-3, 0x1.6a09e4p-4});
  // torch's vectorised pow is within an ulp of the nearest float, which alibi_slope takes:
  // 32 heads' head 14 is 0x1.306fe4p-4 in transformers, one ulp below.
  CHECK(static_cast<double>(alibi_slope(32, 14)) == 0x1.306fe6p-4);
  CHECK(static_cast<double>(alibi_slope(32, 13)) == 0x1.6a09ecp-4);
  CHECK_THROWS_WITH_AS(alibi_slope(12, 12), doctest::Contains("ALiBi: head 12 of 12 heads does not exist"), graph_error);
  CHECK_THROWS_AS(alibi_slope(0, 0), graph_error);

  // BLOOM: float32 slope x position, added to the scaled scores as it is. Falcon: bfloat16 slope
  // x bfloat16 position in bfloat16 (257 is 256 there), then over sqrt(D) (D = 1 leaves it be).
  const std::vector<std::int64_t> keys{0, 1, 7, 255, 257, 300, 1000};
  const auto biases = [&](alibi_rule r, std::int64_t h, std::int64_t D) {
    std::vector<double> b;
    for (std::int64_t k : keys) b.push_back(alibi_bias(r, 12, h, k, D));
    return b;
  };
  CHECK(biases(alibi_rule::bloom, 0, 64) == std::vector<double>{0, 0x1p-1, 0x1.cp+1, 0x1.fep+6, 0x1.01p+7, 0x1.2cp+7, 0x1.f4p+8});
  CHECK(biases(alibi_rule::bloom, 8, 64) ==
        std::vector<double>{0, 0x1.6a09e6p-1, 0x1.3cc8aap+2, 0x1.689fdcp+7, 0x1.6b73fp+7, 0x1.a8439ap+7, 0x1.618daap+9});
  CHECK(biases(alibi_rule::bloom, 11, 64) ==
        std::vector<double>{0, 0x1.6a09e4p-4, 0x1.3cc8a8p-1, 0x1.689fdap+4, 0x1.6b73eep+4, 0x1.a84398p+4, 0x1.618da8p+6});
  CHECK(biases(alibi_rule::falcon, 0, 1) == std::vector<double>{0, 0.5, 3.5, 127.5, 128.0, 150.0, 500.0});
  CHECK(biases(alibi_rule::falcon, 8, 1) == std::vector<double>{0, 0.70703125, 4.9375, 180.0, 181.0, 212.0, 708.0});
  CHECK(biases(alibi_rule::falcon, 11, 1) == std::vector<double>{0, 0.08837890625, 0.6171875, 22.5, 22.625, 26.5, 88.5});
  CHECK(alibi_bias(alibi_rule::falcon, 12, 8, 300, 16) == 212.0 / 4);  // divided by sqrt(16)
  CHECK(alibi_bias(alibi_rule::none, 12, 8, 300, 16) == 0.0);

  // The attr: read, written only when set, checked.
  const auto att = [](const std::string& attrs) {
    return std::string(R"({"format": "autoshard.graph", "version": 1, "nodes": [)") +
           R"({"name": "q", "kind": "input", "shape": [2, 8, 16], "dtype": "f32"},)"
           R"({"name": "a", "kind": "attention", "shape": [2, 8, 16], "dtype": "f32", "inputs": ["q", "q", "q"],)"
           R"( "attrs": {"heads": 2, "causal": true)" + attrs + "}}]}";
  };
  for (const alibi_rule r : {alibi_rule::bloom, alibi_rule::falcon}) {
    std::istringstream in(att(R"(, "alibi": ")" + std::string(to_string(r)) + "\""));
    const model_graph g = read_json(in);
    CHECK(g[1].attrs.alibi == r);
    std::ostringstream out;
    write_json(out, g);
    CHECK(contains(out.str(), "\"alibi\": \"" + std::string(to_string(r)) + "\""));
    std::istringstream back(out.str());
    CHECK(read_json(back)[1].attrs == g[1].attrs);
  }
  std::istringstream none(att(R"(, "alibi": "none")"));
  const model_graph plain = read_json(none);
  CHECK(plain[1].attrs.alibi == alibi_rule::none);
  std::ostringstream plain_out;
  write_json(plain_out, plain);
  CHECK(!contains(plain_out.str(), "alibi"));  // none is not written
  CHECK(contains(expect_io_error(att(R"(, "alibi": "mpt")")), R"(nodes[1].attrs.alibi is "mpt", not "none", "bloom" or "falcon")"));
  CHECK(contains(expect_io_error(att(R"(, "alibi": true)")), "nodes[1].attrs.alibi is true, not a string"));
  model_graph h;  // built in code past the reader, the shape check still bounds it
  op_attrs bad;
  bad.heads = 2;
  bad.alibi = static_cast<alibi_rule>(7);
  const vertex_t q = add_input(h, "q", {2, 8, 16}, dtype::f32);
  CHECK_THROWS_WITH_AS(add_op(h, op_kind::attention, "a", {q, q, q}, bad), doctest::Contains("alibi 7 is not an ALiBi rule (none, bloom, falcon)"),
                       graph_error);
}

TEST_CASE("faults: a model with a cycle or a dangling operand never reaches the solver") {
  const std::string head = R"({"format": "autoshard.graph", "version": 1, "nodes": [)";
  SUBCASE("cycle: graph_error naming the vertices") {
    const std::string m = expect_graph_error(head + R"({"name": "a", "kind": "gelu", "shape": [4], "dtype": "f32", "inputs": ["b"]},)"
                                                    R"({"name": "b", "kind": "gelu", "shape": [4], "dtype": "f32", "inputs": ["a"]}]})");
    CHECK(m.find("graph error: the graph has a cycle through vertex ") == 0);
    CHECK(m.find("'a'") != std::string::npos);
    CHECK(m.find("'b'") != std::string::npos);
  }
  SUBCASE("dangling operand: io_error naming the JSON path and the missing name") {
    CHECK(expect_io_error(head + R"({"name": "x", "kind": "input", "shape": [4, 8], "dtype": "f32"},)"
                                 R"({"name": "fc", "kind": "linear", "shape": [4, 6], "dtype": "f32", "inputs": ["x", "nope"]}]})") ==
          "io error: model JSON: nodes[1].inputs[1] names 'nope', but no node is called that");
  }
}

TEST_CASE("validation names the vertex: cycle, operand shape, unknown kind, missing operand") {
  model_graph g;
  auto x = add_input(g, "x", {4, 8}, dtype::f32);
  auto w = add_parameter(g, "fc.weight", {6, 8}, dtype::f32);
  auto fc = add_op(g, op_kind::linear, "fc", {x, w});
  auto act = add_op(g, op_kind::relu, "act", {fc});
  validate(g);
  CHECK(topological_order(g).front() < topological_order(g).back());

  SUBCASE("operand shape that does not fit, at construction") {
    auto w2 = add_parameter(g, "fc2.weight", {6, 5}, dtype::f32);
    CHECK(contains(error_of<graph_error>([&] { add_op(g, op_kind::linear, "fc2", {act, w2}); }),
                   "vertex 'fc2': linear: input [4,6] has 6 features but weight [6,5] [out,in] expects 5"));
    CHECK(contains(error_of<graph_error>([&] { add_op(g, op_kind::matmul, "mm", {x, x}); }),
                   "vertex 'mm': matmul: contraction sizes differ: [4,8] @ [4,8]"));
  }
  SUBCASE("operand shape that does not fit, in an edited graph") {
    g[x].shape = {4, 9};
    CHECK(contains(error_of<graph_error>([&] { validate(g); }), "vertex 'fc': linear: input [4,9] has 9 features"));
  }
  SUBCASE("cycle") {
    boost::add_edge(act, fc, edge{2}, g);  // fc -> act -> fc
    const std::string e = error_of<graph_error>([&] { validate(g); });
    CHECK(contains(e, "cycle"));
    CHECK(contains(e, "'fc'"));
    CHECK(contains(e, "'act'"));
  }
  SUBCASE("unknown operator kind") {
    g[act].kind = static_cast<op_kind>(200);
    CHECK(contains(error_of<graph_error>([&] { validate(g); }), "vertex 'act': unknown operator kind 200"));
  }
  SUBCASE("missing operand") {
    boost::remove_edge(x, fc, g);
    CHECK(contains(error_of<graph_error>([&] { validate(g); }), "vertex 'fc' (linear): operand 0 is missing"));
  }
  SUBCASE("operand given twice") {
    boost::add_edge(x, act, edge{0}, g);
    CHECK(contains(error_of<graph_error>([&] { validate(g); }), "vertex 'act' (relu): operand 0 is given twice"));
  }
}

TEST_CASE("Graphviz output parses with dot and carries the chosen specs") {
  transformer_config tiny = transformer_config::gpt2(1, 64, 4);
  tiny.seq = 16;
  const model_graph g = build_gpt2(tiny);
  const std::map<std::string, std::string> plan{{"transformer.h.0.attn.c_attn", "RRS1"},
                                                {"transformer.h.0.attn.c_proj", "RRRP1"}};
  std::ostringstream out;
  write_dot(out, g, plan);
  const std::string dot = out.str();
  CHECK(contains(dot, "digraph G {"));
  CHECK(contains(dot, "transformer.h.0.attn.c_attn\\nlinear [8,16,192] bf16\\nRRS1"));
  CHECK(contains(dot, "fillcolor="));
  CHECK(contains(dot, "[label=\"1\"]"));  // operand indices on edges
  if (std::system("command -v dot > /dev/null 2>&1") != 0) {
    MESSAGE("graphviz 'dot' not found: skipping the dot -Tsvg parse check");
    return;
  }
  const auto path = std::filesystem::temp_directory_path() / ("autoshard_graph_test_" + std::to_string(::getpid()) + ".dot");
  {
    std::ofstream f(path);
    f << dot;
  }
  const std::string cmd = "dot -Tsvg '" + path.string() + "' -o /dev/null";
  CHECK(std::system(cmd.c_str()) == 0);
  std::filesystem::remove(path);
}

TEST_CASE("every vertex of every builder's graph has valid, finite strategies and edge costs") {
  transformer_config gpt = transformer_config::gpt2(1, 64, 4);
  gpt.seq = 16;
  gpt.batch = 4;
  gpt.vocab = 96;
  gpt.mode = run_mode::training;
  transformer_config bert = transformer_config::bert(1, 64, 4);
  bert.seq = 16;
  bert.batch = 4;
  bert.vocab = 96;
  transformer_config llama = transformer_config::llama(1, 64, 8, 2, 96);
  llama.seq = 16;
  llama.batch = 4;
  llama.vocab = 96;
  llama.mode = run_mode::training;
  const device_mesh m = make_mesh_2d(2, 4, 25e9, 300e9);
  for (const model_graph& g : {build_gpt2(gpt), build_bert(bert), build_llama(llama)}) {
    strategy_options opt;
    opt.pricing.mode = find_vertex(g, "loss") ? run_mode::training : run_mode::inference;
    const auto all = enumerate_all_strategies(g, m, opt);
    for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
      CAPTURE(g[v].name);
      REQUIRE(!all[v].empty());
      const auto ops = operands(g, v);
      for (const strategy& s : all[v]) {
        REQUIRE(s.inputs.size() == ops.size());
        for (std::size_t i = 0; i < ops.size(); ++i) check_spec(s.inputs[i], m, g[ops[i]].shape, g[ops[i]].name);
        check_spec(s.output, m, g[v].shape, g[v].name);
        CHECK(no_empty_shards(m, s.output, g[v].shape));
        CHECK((std::isfinite(s.seconds()) && s.compute_seconds >= 0 && s.comm_seconds >= 0));
        CHECK(s.memory_bytes >= 0);
      }
      // the fully replicated strategy always exists and needs no communication
      bool replicated = false;
      for (const strategy& s : all[v])
        replicated = replicated || (s.output.is_replicated() && s.comm_seconds == 0.0);
      CHECK(replicated);
    }
    for (auto [it, end] = boost::edges(g); it != end; ++it) {
      const cost_matrix c = resharding_costs(g, *it, all[boost::source(*it, g)], all[boost::target(*it, g)], m, opt);
      for (double x : c.values) REQUIRE((std::isfinite(x) && x >= 0));
    }
  }
}

TEST_CASE("with_batch_seq gives the graph the builders make at those sizes, vertex by vertex") {
  const auto small = [](transformer_config c, int batch, int seq) {
    c.layers = 2;
    c.hidden = 32;
    c.heads = 4;
    c.ffn = 64;
    c.vocab = 96;
    c.max_positions = 32;
    c.batch = batch;
    c.seq = seq;
    c.mode = run_mode::training;
    return c;
  };
  transformer_config llama = transformer_config::llama_7b();
  llama.kv_heads = 2;
  transformer_config bert = transformer_config::bert_base();
  for (const auto& [name, build, base] : std::vector<std::tuple<std::string, model_graph (*)(const transformer_config&), transformer_config>>{
           {"gpt2", build_gpt2, transformer_config::gpt2_124m()}, {"bert", build_bert, bert}, {"llama", build_llama, llama}}) {
    const std::string model = name;  // CAPTURE cannot take a structured binding (Clang)
    CAPTURE(model);
    const model_graph g = build(small(base, 8, 16));
    for (const auto& [batch, seq] : {std::pair{2, 8}, std::pair{8, 4}, std::pair{3, 16}}) {
      const int b = batch, s = seq;  // CAPTURE cannot take a structured binding (Clang)
      CAPTURE(b);
      CAPTURE(s);
      const model_graph want = build(small(base, b, s));
      const model_graph got = with_batch_seq(g, b, s);
      REQUIRE(boost::num_vertices(got) == boost::num_vertices(want));
      for (vertex_t v = 0; v < boost::num_vertices(want); ++v) {
        CAPTURE(want[v].name);
        CHECK(got[v].name == want[v].name);
        CHECK(got[v].shape == want[v].shape);
        CHECK(got[v].attrs == want[v].attrs);  // a reshape's target follows (BERT's pooler)
      }
    }
    CHECK(to_json(with_batch_seq(g, 0, 0)) == to_json(g));  // 0 keeps a size
  }
  // An expand's target follows the dims it carries and broadcasts to the new batch / sequence.
  model_graph e;
  const vertex_t ex = add_input(e, "x", {4, 8, 6}, dtype::f32);
  const vertex_t em = add_input(e, "m", {4, 1, 6}, dtype::f32);
  const vertex_t fill = add_parameter(e, "fill", {6}, dtype::f32);
  op_attrs to;
  to.dims = {4, 8, 6};
  const vertex_t e1 = add_op(e, op_kind::expand, "e1", {fill}, to);
  const vertex_t e2 = add_op(e, op_kind::expand, "e2", {em}, to);
  add_op(e, op_kind::where, "w", {add_input(e, "keep", {4, 8, 1}, dtype::boolean), add_op(e, op_kind::add, "a", {ex, e1}), e2});
  const model_graph e23 = with_batch_seq(e, 2, 3);
  CHECK(e23[e1].shape == tensor_shape{2, 3, 6});
  CHECK(e23[e2].shape == tensor_shape{2, 3, 6});
  CHECK(e23[e2].attrs.dims == std::vector<std::int64_t>{2, 3, 6});
  CHECK(e23[*find_vertex(e23, "w")].shape == tensor_shape{2, 3, 6});
  // A reshape whose target cannot follow: the batch merged with another dim and cut into two
  // other dims.
  model_graph r;
  const vertex_t x = add_input(r, "x", {8, 6}, dtype::f32);
  op_attrs a;
  a.dims = {4, 12};
  add_op(r, op_kind::reshape, "mix", {x}, a);
  CHECK_THROWS_WITH_AS(with_batch_seq(r, 2, 0), doctest::Contains("reshape 'mix' from [8,6] to [4,12]"), graph_error);
  // The batch merged with the heads and split apart again (torch's dynamo export transposes k
  // over a [B*heads, S, D] view): the split gives the new batch the dim that had the old one.
  model_graph h;
  const vertex_t hx = add_input(h, "x", {4, 3, 8}, dtype::f32);
  op_attrs heads, perm, merged, split;
  heads.dims = {4, 3, 2, 4};
  perm.dims = {0, 2, 1, 3};
  merged.dims = {8, 3, 4};
  split.dims = {4, 2, 3, 4};
  const vertex_t h1 = add_op(h, op_kind::reshape, "heads", {hx}, heads);
  const vertex_t h2 = add_op(h, op_kind::transpose, "perm", {h1}, perm);
  const vertex_t h3 = add_op(h, op_kind::reshape, "merged", {h2}, merged);
  const vertex_t h4 = add_op(h, op_kind::reshape, "split", {h3}, split);
  const model_graph h2x = with_batch_seq(h, 2, 0);
  CHECK(h2x[h3].shape == tensor_shape{4, 3, 4});
  CHECK(h2x[h4].shape == tensor_shape{2, 2, 3, 4});
  CHECK(with_batch_seq(h, 0, 5)[h4].shape == tensor_shape{4, 2, 5, 4});
  model_graph ids;
  add_input(ids, "ids", {8}, dtype::i64);
  CHECK_THROWS_WITH_AS(with_batch_seq(ids, 0, 5), doctest::Contains("no input with a sequence dim"), graph_error);
  CHECK(with_batch_seq(ids, 3, 0)[0].shape == tensor_shape{3});
  // The sizes it re-sizes: dim 0 of the first input, dim 1 of the first of rank >= 2.
  CHECK(graph_batch(e) == 4);
  CHECK(graph_sequence(e) == 8);
  CHECK(graph_batch(ids) == 8);
  CHECK(graph_sequence(ids) == 0);
  CHECK(graph_batch(model_graph{}) == 0);
  // An operator of fixed shape (opaque) is named before anything is re-sized, whatever comes first.
  model_graph o = r;
  op_attrs fixed;
  fixed.dims = {8, 2};
  fixed.op_type = "com.example.Fixed";
  add_op(o, op_kind::opaque, "fixed", {*find_vertex(o, "x")}, fixed);
  CHECK(fixed_shape_operator(o) == "fixed");
  CHECK(fixed_shape_operator(r).empty());
  CHECK_THROWS_WITH_AS(with_batch_seq(o, 2, 0), "graph error: opaque operator 'fixed' keeps a fixed output shape; the graph cannot be re-sized",
                       graph_error);
}

TEST_CASE("an input the model holds keeps its shape at another batch or sequence, and in the JSON") {
  // An ONNX file's buffer (LLaMA's rotary inv_freq) whose length is the batch's, and a table
  // whose dim 1 is the sequence's, both before the fed input: neither gives the batch or the
  // sequence, and neither is re-sized.
  model_graph g;
  const vertex_t freq = add_held_input(g, "rotary.inv_freq", {8}, dtype::f32);
  const vertex_t table = add_held_input(g, "table", {3, 16}, dtype::f32);
  const vertex_t x = add_input(g, "x", {8, 16, 8}, dtype::f32);
  add_op(g, op_kind::mul, "rot", {x, freq});
  add_op(g, op_kind::tanh, "t", {table});
  CHECK(g[freq].attrs.held);
  CHECK_FALSE(g[freq].is_fed_input());
  CHECK(g[x].is_fed_input());
  CHECK(graph_batch(g) == 8);
  CHECK(graph_sequence(g) == 16);
  const model_graph h = with_batch_seq(g, 2, 4);
  CHECK(h[freq].shape == tensor_shape{8});
  CHECK(h[table].shape == tensor_shape{3, 16});
  CHECK(h[x].shape == tensor_shape{2, 4, 8});
  CHECK(h[*find_vertex(h, "rot")].shape == tensor_shape{2, 4, 8});
  // A model without the flag: the same buffer is taken for the batch and re-sized with it.
  model_graph fed = g;
  fed[freq].attrs.held = false;
  CHECK_THROWS_AS(with_batch_seq(fed, 2, 0), graph_error);
  // The JSON says it, and reads it back; on an input only.
  const nlohmann::json j = to_json(g);
  CHECK(j["nodes"][0]["attrs"] == nlohmann::json{{"held", true}});
  CHECK_FALSE(j["nodes"][2].contains("attrs"));
  const model_graph back = from_json(j);
  CHECK(back[freq].attrs.held);
  CHECK_FALSE(back[x].attrs.held);
  CHECK(to_json(back) == j);
}
