// Shards a Hugging Face safetensors checkpoint for tensor parallelism and checks the result.
//
//   example_tensor_slicing                         # a generated tiny LLaMA (GQA), 2 ranks
//   example_tensor_slicing MODEL_DIR TP OUT_DIR [bf16]
//
// MODEL_DIR holds config.json (its model_type picks the built-in policy: gpt2, bert, opt,
// gpt_neox, bloom, llama) and model.safetensors or model.safetensors.index.json. The
// output is OUT_DIR/rank-<r>.safetensors plus OUT_DIR/index.json; every tensor is then
// gathered back from the rank files and compared with the original bit for bit.
#include <cstdio>      // std::printf
#include <cstdlib>     // std::atoi
#include <exception>   // std::exception
#include <filesystem>  // std::filesystem
#include <fstream>     // std::ofstream
#include <string>      // std::string

#include <unistd.h>  // getpid

#include <nlohmann/json.hpp>  // config.json

#include <autoshard/tensor/tensor.hpp>  // checkpoint, policies, shard_checkpoint, sharded_checkpoint

namespace fs = std::filesystem;
using namespace autoshard;

namespace {
// A two-layer LLaMA of width 16: 4 query heads, 2 key/value heads, FFN 40, bf16.
void write_tiny_llama(const fs::path& dir) {
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"model_type": "llama", "hidden_size": 16, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 40, "num_hidden_layers": 2, "vocab_size": 30})";
  std::vector<std::pair<std::string, tensor_shape>> params = {{"model.embed_tokens.weight", {30, 16}},
                                                              {"model.norm.weight", {16}},
                                                              {"lm_head.weight", {30, 16}}};
  for (int i = 0; i < 2; ++i) {
    const std::string l = "model.layers." + std::to_string(i) + ".";
    params.insert(params.end(), {{l + "input_layernorm.weight", {16}}, {l + "self_attn.q_proj.weight", {16, 16}},
                                 {l + "self_attn.k_proj.weight", {8, 16}}, {l + "self_attn.v_proj.weight", {8, 16}},
                                 {l + "self_attn.o_proj.weight", {16, 16}}, {l + "post_attention_layernorm.weight", {16}},
                                 {l + "mlp.gate_proj.weight", {40, 16}}, {l + "mlp.up_proj.weight", {40, 16}},
                                 {l + "mlp.down_proj.weight", {16, 40}}});
  }
  std::vector<host_tensor> store;
  std::vector<std::pair<std::string, const_tensor_view>> named;
  for (const auto& [name, shape] : params) {
    host_tensor f(dtype::f32, shape);
    for (std::int64_t k = 0; k < f.numel(); ++k) f.as<float>()[k] = static_cast<float>(k % 97) / 8.f;
    store.push_back(convert(f.view(), dtype::bf16));
    named.emplace_back(name, store.back().view());
  }
  save_safetensors(dir / "model.safetensors", named, {{"format", "pt"}});
}

std::string model_type_of(const fs::path& config_json) {
  std::ifstream f(config_json);
  nlohmann::json j = nlohmann::json::parse(f);
  return j.value("model_type", std::string());
}
}  // namespace

int main(int argc, char** argv) {
  try {
    fs::path model, out;
    int tp = 2;
    bool cleanup = false;
    shard_options opts;
    if (argc >= 4) {
      model = argv[1];
      tp = std::atoi(argv[2]);
      out = argv[3];
      if (argc >= 5 && std::string(argv[4]) == "bf16") opts.convert_to = dtype::bf16;
    } else {
      const fs::path tmp = fs::temp_directory_path() / ("autoshard-example-slicing-" + std::to_string(::getpid()));
      model = tmp / "model";
      out = tmp / "tp2";
      write_tiny_llama(model);
      cleanup = true;
    }
    const std::string model_type = model_type_of(model / "config.json");
    const tp_policy policy = policies::by_model_type(model_type);
    const model_config config = load_model_config(model / "config.json");
    checkpoint in(model);
    std::printf("%s: %zu tensors in %zu file(s); policy %s over %d ranks\n", model.string().c_str(), in.size(),
                in.files().size(), policy.name.c_str(), tp);
    opts.progress = [](const shard_progress& p) {
      std::printf("\r  %6.1f%%  %8.1f MB/s  %-60s", 100.0 * static_cast<double>(p.bytes_done) /
                                                          static_cast<double>(p.bytes_total ? p.bytes_total : 1),
                  p.bytes_per_second / 1e6, std::string(p.tensor).c_str());
      std::fflush(stdout);
    };
    const shard_report report = shard_checkpoint(in, policy, tp, config, out, opts);
    std::printf("\nwrote %.1f MB in %.2f s to %s\n", static_cast<double>(report.bytes_written) / 1e6, report.seconds,
                out.string().c_str());
    for (const auto& [name, value] : report.attributes) std::printf("  per rank: %s = %lld\n", name.c_str(), static_cast<long long>(value));

    sharded_checkpoint sc(out);
    std::size_t same = 0;
    for (const auto& name : sc.names()) {
      host_tensor g = sc.gather(name);
      host_tensor original = host_tensor::copy_of(in.view(name));
      if (opts.convert_to && g.type() != original.type()) original = convert(original.view(), g.type());
      same += bitwise_equal(g.view(), original.view()) ? 1 : 0;
    }
    std::printf("gathered %zu / %zu tensors back bit for bit\n", same, sc.names().size());
    if (cleanup) fs::remove_all(model.parent_path());
    return same == sc.names().size() ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
