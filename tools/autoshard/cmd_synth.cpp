// autoshard synth: write a checkpoint with the exact parameter names, shapes and layouts of a
// model preset or of a Hugging Face config.json (seeded values) plus its config.json — for
// demos and tests, and to try sharding without downloading a model.
#include "common.hpp"
#include "model_options.hpp"
#include "paths.hpp"

#include <autoshard/exec/executor.hpp>  // detail::name_seed: one keyed hash of a name
#include <autoshard/tensor/tensor.hpp>


#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

namespace autoshard::tool {
namespace {

/// Value k of tensor `name` under `seed`: `centre` plus a uniform value in [-0.125, 0.125) on a
/// grid of 2^-26. Counter-based (SplitMix64, Steele, Lea and Flood 2014, over the tensor's
/// key and k), so a value depends on the seed, the name and k alone: not on the file order,
/// nor on the standard library (std::hash and std::uniform_real_distribution are
/// implementation-defined), and it costs a few multiplications where mt19937_64 and a
/// distribution took most of the time of a large synth (a 190 MB checkpoint: 14 s of a
/// sanitizer build's 15). The offset is an integer times a power of two, exact in a float, so
/// adding the centre rounds once whether or not the compiler fuses it into an FMA: the same
/// bytes on every machine and compiler.
void fill_synth_values(float* p, std::int64_t n, std::uint64_t seed, const std::string& name, float centre) {
  const auto mix = [](std::uint64_t x) {
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  constexpr std::uint64_t gamma = 0x9e3779b97f4a7c15ull;
  const std::uint64_t key = mix(autoshard::detail::name_seed(seed, name));
  for (std::int64_t k = 0; k < n; ++k) {
    const auto step = static_cast<std::int32_t>(mix(key + static_cast<std::uint64_t>(k + 1) * gamma) >> 40) - (1 << 23);
    p[k] = centre + static_cast<float>(step) * 0x1p-26f;  // [-2^23, 2^23) steps of 2^-26
  }
}

struct synth_options {
  model_options model;
  std::string out;
  std::uint64_t seed = 1;
  bool json = false;
  bool follow_symlinks = false;
};

/// A template's config.json with only what the options changed written over it: every other
/// field (rope_theta, sliding_window, rms_norm_eps, the token ids, max_position_embeddings, ...)
/// as the template has it, so that the synthesized model computes what the planned one does.
/// `wrote` is the config autoshard writes for `m`; a field of it is written where it differs
/// from what autoshard writes for the template as read (at the same sequence and dtype: --seq is
/// the plan's sequence, not the model's context).
nlohmann::json keep_template(const model_options& mo, const hf_model& m, const nlohmann::json& wrote) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p = fs::is_directory(mo.model, ec) ? fs::path(mo.model) / "config.json" : fs::path(mo.model);
  const nlohmann::json tmpl =
      parse_json_text(read_regular_file(p.string(), "Hugging Face config", hf_config_max_bytes), quoted_path(p.string()));
  hf_model as_read = read_hf_config(tmpl, p.string());
  as_read.config.seq = m.config.seq;
  as_read.config.type = m.config.type;
  const nlohmann::json before = to_hf_config(as_read);
  // transformers' other spellings of one attribute (read_hf_config reads each list in order): a
  // field written under one is not left beside it under another.
  static const std::vector<std::vector<std::string>> spellings{
      {"hidden_size", "n_embd", "n_embed", "d_model"}, {"num_hidden_layers", "n_layer", "num_layers"},
      {"num_attention_heads", "n_head", "num_heads"}, {"num_key_value_heads", "num_kv_heads", "n_head_kv"},
      {"max_position_embeddings", "n_positions", "seq_length"}};
  nlohmann::json out = tmpl;
  for (const auto& [k, v] : wrote.items()) {
    if (before.contains(k) && before[k] == v) continue;
    out[k] = v;
    for (const auto& names : spellings)
      if (std::find(names.begin(), names.end(), k) != names.end())
        for (const std::string& other : names)
          if (other != k && out.contains(other) && !wrote.contains(other)) out.erase(other);
  }
  out["torch_dtype"] = wrote["torch_dtype"];  // the dtype of the weights written
  if (tmpl.contains("dtype")) out["dtype"] = wrote["torch_dtype"];
  return out;
}

/// The name Hugging Face's files use: GPT-2's drop the "transformer." prefix.
std::string file_name(const std::string& family, const std::string& n) {
  const std::string p = "transformer.";
  return family == "gpt2" && n.rfind(p, 0) == 0 ? n.substr(p.size()) : n;
}

int run_synth(const synth_options& o) {
  namespace fs = std::filesystem;
  // A preset is its family's Hugging Face model; a config.json (or directory) is used as the template.
  // `synth --model DIR --out DIR` would replace the config it reads
  command_paths paths(o.follow_symlinks);
  if (!o.model.is_preset()) paths.model("--model", o.model.model);
  // Checked as outputs (not a FIFO, a link, an input); written through the stage below.
  (void)paths.output_path("--out checkpoint", fs::path(o.out) / "model.safetensors", /*directory_made=*/true);
  (void)paths.output_path("--out config", fs::path(o.out) / "config.json", /*directory_made=*/true);
  paths.check();
  // Every reader takes a directory's model.safetensors.index.json before its model.safetensors
  // (checkpoint_file_in): written beside one, the new weights were never read, and the directory
  // read as the index's old weights under the new config.json, without a word.
  if (const std::optional<fs::path> index = checkpoint_file_in(o.out); index && index->filename() != "model.safetensors")
    throw io_error("--out " + quoted_path(o.out) + " holds a sharded checkpoint's index, " + quoted_path(index->string()) +
                   ", which every reader takes before the model.safetensors synth writes: the directory would read as the "
                   "index's weights under the new config.json; give another directory, or remove the index and the files it names");
  hf_model m;
  if (std::optional<hf_model> h = o.model.hf()) {
    m = *h;
  } else {
    if (!o.model.is_preset()) throw spec_error("synth needs a preset or a Hugging Face config --model, not a model JSON or ONNX file");
    auto [family, cfg] = o.model.preset();
    m = hf_model{family, cfg, !o.model.dtype_name.empty(), {}};
  }
  const std::string family = m.model_type;
  // f32 unless --dtype: the written config.json names the dtype the weights have.
  const dtype t = o.model.dtype_name.empty() ? dtype::f32 : m.config.type;
  m.config.type = t;
  const model_graph g = build_hf(m);

  std::vector<safetensors_tensor_info> infos;
  std::map<std::string, std::string> source;  // file name -> graph name
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
    if (g[v].is_parameter()) {
      const std::string n = file_name(family, g[v].name);
      infos.push_back({n, t, g[v].shape});
      source[n] = g[v].name;
    }
  // The size is summed in double before any int64 sum: each tensor is at most 2^53 bytes (graph
  // validation), but 1,024 layers of them wrapped past 2^63 to a negative total that passed the
  // limit (the directory was made, then the first tensor's allocation failed).
  constexpr std::int64_t limit = std::int64_t{8} << 30;
  double estimate = 0;
  for (const auto& i : infos) estimate += static_cast<double>(i.shape.numel()) * static_cast<double>(dtype_size(t));
  if (estimate > static_cast<double>(limit))
    throw spec_error("synth would write " + human_bytes(estimate) + "; use --hidden/--layers/--vocab to make a smaller model (limit 8 GiB)");
  std::int64_t total = 0;  // at most the limit: no overflow
  for (const auto& i : infos) total += i.shape.numel() * static_cast<std::int64_t>(dtype_size(t));
  // One tensor at a time is held: its values in f32, and their conversion to --dtype. Under a
  // memory limit a large one ran out of memory after the directory was made (`--vocab 4000000
  // --hidden 64` under `ulimit -v 400000`: "resource error: out of memory", an empty directory
  // left); without one, the OOM killer could end it.
  std::int64_t largest = 0;
  std::string largest_name;
  for (const auto& i : infos)
    if (i.shape.numel() > largest) largest = i.shape.numel(), largest_name = i.name;
  const std::uint64_t held = static_cast<std::uint64_t>(largest) * (4 + (t == dtype::f32 ? 0 : dtype_size(t))) + (std::uint64_t{64} << 20);
  if (const machine_limits here = machine_limits::memory_here(); held > here.memory())
    throw resource_error("synth would hold about " + human_bytes(static_cast<double>(held)) + " at once: its largest tensor, " +
                         quoted_text(largest_name) + ", " + count_noun(largest, "value") + " in f32" +
                         (t == dtype::f32 ? std::string() : " and in " + std::string(to_string(t))) +
                         "; but this process can allocate " + human_bytes(static_cast<double>(here.memory())) + " more (" +
                         here.memory_source() + "): use --hidden/--vocab/--ffn to make it smaller" +
                         (here.memory_limited() ? ", or raise the limit" : ", or free memory"));
  check_free_space(o.out, static_cast<std::uint64_t>(total), "synth's checkpoint");

  std::error_code ec;
  if (!o.model.is_preset() && fs::exists(fs::path(o.out) / "config.json", ec) &&
      fs::equivalent(fs::path(o.out) / "config.json",
                     fs::is_directory(o.model.model, ec) ? fs::path(o.model.model) / "config.json" : fs::path(o.model.model), ec))
    throw spec_error("--out " + quoted_path(o.out) + " holds the --model config.json; synth would overwrite its input");
  // The config is made before anything is written: it was built (the template read a second
  // time) after the weights were in place, so an error there, or a failed write of it, left the
  // new weights under the old config.json.
  nlohmann::json config = to_hf_config(m);
  if (!o.model.is_preset()) config = keep_template(o.model, m, config);
  const std::string config_text = config.dump(2) + "\n";
  // The pair appears together or not at all (atomic_file_set, io/atomic_file.hpp): both files
  // are written into a fresh stage directory beside --out and put in place by one rename (or,
  // over an earlier run's pair, one exchange of the directories), so a crash leaves --out as it
  // was or with the new pair whole. Only where --out holds other files too are they moved in
  // one by one, config.json last, an older one that differs removed first: a crash between
  // leaves weights without a config.json, which every reader refuses naming it. On failure the
  // stage and the directories made above --out are removed.
  atomic_file_set pair(o.out, {"model.safetensors", "config.json"}, o.follow_symlinks);
  atomic_file config_out(pair.stage() / "config.json");
  config_out.write(config_text);
  config_out.finish();
  safetensors_writer w(pair.stage() / "model.safetensors", infos, {{"format", "pt"}});
  for (const auto& e : w.entries()) {
    const bool norm_weight = e.name.find("ln") != std::string::npos || e.name.find("norm") != std::string::npos;
    host_tensor f(dtype::f32, e.shape);
    fill_synth_values(f.as<float>(), f.numel(), o.seed, e.name, norm_weight ? 1.0f : 0.0f);
    if (t == dtype::f32) w.write(f.view().bytes());
    else w.write(convert(f.view(), t).view().bytes());
  }
  w.finish();
  w.commit();  // into the stage: both whole before either is
  config_out.commit();
  pair.commit();

  if (o.json) {
    std::cout << nlohmann::json{{"checkpoint", (fs::path(o.out) / "model.safetensors").string()},
                                {"config", (fs::path(o.out) / "config.json").string()},
                                {"tensors", infos.size()},
                                {"parameters", parameter_count(g)},
                                {"bytes", total}}
                     .dump(2)
              << "\n";
  } else {
    std::cout << "wrote " << escaped_text((fs::path(o.out) / "model.safetensors").string()) << ": " << infos.size() << " tensors, "
              << parameter_count(g) << " parameters, " << human_bytes(static_cast<double>(total)) << " ("
              << family << " layout, " << to_string(t) << ", seed " << o.seed << ")\n"
              << "      " << escaped_text((fs::path(o.out) / "config.json").string()) << "\n";
  }
  return exit_ok;
}

}  // namespace

void register_synth(CLI::App& app, action& run) {
  auto o = std::make_shared<synth_options>();
  CLI::App* cmd = app.add_subcommand(
      "synth", "write a seeded checkpoint with the parameter names and shapes of a preset or a Hugging Face config");
  cmd->footer(
      "Examples:\n"
      "  autoshard synth --model gpt2 --layers 2 --hidden 256 --heads 8 --vocab 8192 --out ckpt\n"
      "  autoshard synth --model llama-7b --layers 1 --dtype bf16 --out ckpt");
  o->model.add_to(*cmd);
  cmd->get_option("--dtype")
      ->description("dtype of the written tensors: f32 (the default), bf16, f16 or f64")
      ->check(dtype_value(true));  // a usage error before the output directory is made
  for (const char* unused : {"--batch", "--mode"})  // no parameter depends on them (--seq can widen GPT-2's wpe):
    cmd->get_option(unused)->group("");           // accepted, as plan takes them, but not shown
  cmd->add_option("--out", o->out, "output directory (model.safetensors and config.json)")->required();
  cmd->add_option("--seed", o->seed, "random seed")->capture_default_str()->check(seed_value());
  add_follow_symlinks(*cmd, o->follow_symlinks);
  cmd->add_flag("--json", o->json, "write one JSON document to stdout");
  cmd->callback([o, &run] { run = [o] { return run_synth(*o); }; });
}

}  // namespace autoshard::tool
