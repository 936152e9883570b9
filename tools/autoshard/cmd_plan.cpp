// autoshard plan: auto-shard a model on a mesh, print the plan with the baselines side by
// side, and write the plan JSON, a Graphviz DOT and (where `dot` is installed) an SVG.
#include "common.hpp"
#include "paths.hpp"
#include "model_options.hpp"
#include "progress.hpp"
#include "tensor_names.hpp"
#include "plan_pipeline.hpp"
#include "export_verdicts.hpp"

#include <autoshard/pass/pass.hpp>
#if defined(AUTOSHARD_TOOL_HAVE_GLOO)
#include <autoshard/gloo/gloo.hpp>
#endif

#include <sys/stat.h>  // lstat
#include <unistd.h>    // unlink

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <regex>
#include <sstream>

namespace autoshard::tool {
namespace {

struct plan_cli_options {
  model_options model;
  mesh_options mesh;
  std::string algo{to_string(autosharding_options{}.algo)};
  std::string backend = "nccl";
  bool backend_given = false;
  std::string device;         ///< a preset name (device_presets), "" = device_model's defaults
  std::string memory_budget;  ///< "" = the device's memory, "none" = no budget
  std::string calibration;
  bool force = false;
  std::string optimizer{to_string(step_pricing{}.optimizer)};
  double gradient_bucket = step_pricing{}.gradient_bucket_bytes;
  std::string gradient_overlap = to_string(step_pricing{}.gradient_overlap);  // "backward" or a fraction
  double time_limit = default_time_limit_s;
  double mip_rel_gap = autosharding_options{}.mip_rel_gap;
  bool skip_fully_replicated = false;
  bool run_checks = false;
  bool preload = false;
  bool no_tie_layers = false;
  bool no_zero = false;
  int micro_batch = 0;     ///< 0: the planner chooses
  int micro_batches = 0;   ///< 0: the planner chooses
  std::string recompute{to_string(step_pricing{}.recompute)};
  std::string attention{to_string(step_pricing{}.attention)};
  bool peak_compute = false;
  int tensor_parallel = 0;  ///< megatron's --tp; 0: devices per node
  std::string pipeline_stages;  ///< --pp: "" (no pipeline), "auto" or a stage count
  std::string schedule = "1f1b";
  std::vector<std::string> pins;
  std::string out = "plan.json";
  std::string dot;
  std::string svg;  ///< set by check_plan_paths: the SVG beside the DOT
  std::string svg_beside;  ///< set by check_plan_paths: the SVG's path whether drawn or not (a stale one is removed)
  bool no_svg = false;
  bool follow_symlinks = false;
  bool json = false;
  bool quiet = false;
  bool progress = false;
};

/// "transformer.h.7.attn" -> "transformer.h.#.attn"; and the layer index (or -1). An index of
/// more than 9 digits is no layer, as the pass reads it (pass/layers.hpp): a model file's
/// "h.99999999999.fc" made std::stoi throw, "internal error: stoi" after the plan was written.
std::pair<std::string, int> layer_of(const std::string& name) {
  static const std::regex re(R"(\.([0-9]{1,9})\.)");
  std::smatch m;
  if (!std::regex_search(name, m, re)) return {name, -1};
  return {m.prefix().str() + ".#." + m.suffix().str(), std::stoi(m[1].str())};
}

std::string spec_list(const std::vector<sharding_spec>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + to_alpa_string(v[i]);
  return s.empty() ? "-" : s;
}

nlohmann::json summary_json(const plan_summary& s) {
  nlohmann::json j{{"algo", std::string(to_string(s.algo))},
                   {"feasible", s.feasible},
                   {"why_not", s.why_not},
                   {"step_seconds", s.step_seconds},
                   {"compute_seconds", s.compute_seconds},
                   {"communication_seconds", s.communication_seconds},
                   {"resharding_seconds", s.resharding_seconds},
                   {"peak_memory_bytes", s.peak_memory_bytes},
                   {"runtime_reserve", runtime_json(s.runtime)},
                   {"fits", s.fits},
                   {"tried", s.tried}};
  if (!s.feasible) return j;
  nlohmann::json layers = nlohmann::json::object();
  for (const auto& [i, r] : s.recompute) layers[std::to_string(i)] = std::string(to_string(r));
  j["parallelism"] = {{"tp", s.par.tp},
                      {"dp", s.par.dp},
                      {"pp", s.par.pp},
                      {"micro_batch", s.par.micro_batch},
                      {"micro_batches", s.par.micro_batches},
                      {"recompute", s.par.recompute},
                      {"recompute_layers", layers},
                      {"zero", s.par.zero},
                      {"zero_elements", s.par.zero_elements},
                      {"sp", s.par.sp},
                      {"replicas", s.par.replicas}};
  j["mesh"] = to_json(s.mesh);
  j["flops"] = {{"megatron", s.flops.megatron}, {"model", s.flops.model}};
  j["tflops_per_device"] = s.tflops_per_device;
  j["mfu"] = s.mfu;
  return j;
}

void print_summary_row(const plan_summary& s, bool chosen) {
  std::cout << "  " << (chosen ? "* " : "  ") << std::left << std::setw(18) << to_string(s.algo) << std::right;
  if (!s.feasible) {
    std::cout << "  not feasible: " << s.why_not << "\n";
    return;
  }
  std::cout << std::setw(12) << human_seconds(s.step_seconds) << std::setw(12) << human_seconds(s.compute_seconds)
            << std::setw(12) << human_seconds(s.communication_seconds) << std::setw(12)
            << human_seconds(s.resharding_seconds) << std::setw(14)
            << human_bytes(static_cast<double>(s.peak_memory_bytes)) << (s.fits ? "" : "  DOES NOT FIT") << "\n";
}

/// The mesh to plan on: the --mesh and link options, or the links a calibration file measured
/// (on the same mesh shape and backend, unless --force).
device_mesh plan_mesh(const plan_cli_options& o) {
  if (o.calibration.empty()) return o.mesh.build(o.backend);
#if defined(AUTOSHARD_TOOL_HAVE_GLOO)
  const calibration_result cal = load_calibration(o.calibration);
  // Its measured links replace the link options on every axis it measured: beside a calibration
  // of the mesh's shape that measured each axis of more than one rank, a link option was read
  // (`--intra-bw 1` even refused, in gloo's words) and then replaced without a word.
  if (const char* flag = o.mesh.given_link_flag(); flag && !o.force) {
    const device_mesh shape = parse_mesh(o.mesh.mesh);
    bool covered = cal.measured_on(shape);
    for (std::size_t a = 0; covered && a < shape.ndim(); ++a)
      covered = shape.size(a) < 2 || std::any_of(cal.axes.begin(), cal.axes.end(), [a](const axis_calibration& x) {
                  return x.measured && x.axis == static_cast<int>(a);
                });
    if (covered)
      throw spec_error(std::string(flag) + ": the links measured in --calibration " + quoted_path(o.calibration) + " replace it on every axis of " +
                       to_string(shape) + ": leave it out, or plan without --calibration to price the links you give");
  }
  const std::string backend = o.backend_given ? o.backend : cal.backend_family();
  device_mesh m = o.mesh.build(backend);
  cal.check_fits(m, backend, o.force);
  if (o.force && (!cal.measured_on(m) || backend != cal.backend_family()))
    std::cerr << "autoshard: note: --force: using links measured on " << to_string(cal.mesh) << " with " << cal.backend
              << " for " << to_string(m) << " with " << backend << "\n";
  return apply_calibration(m, cal, o.force);  // measured links replace the bandwidth and latency options
#else
  throw spec_error("--calibration needs a build with Gloo");
#endif
}

/// No output may replace an input (`plan --model M.json --out M.json`), another output, or
/// anything but a regular file. Sets the paths to write: --out, --dot (default: beside --out)
/// and the SVG beside the DOT (the files links point to, with --follow-symlinks).
void check_plan_paths(plan_cli_options& o) {
  namespace fs = std::filesystem;
  const fs::path dot = o.dot.empty() ? fs::path(o.out).replace_extension(".dot") : fs::path(o.dot);
  const fs::path svg = fs::path(dot).replace_extension(".svg");
  command_paths paths(o.follow_symlinks);
  if (!o.model.is_preset()) paths.model("--model", o.model.model);
  if (!o.calibration.empty()) paths.input("--calibration", o.calibration);
  if (o.preload) paths.input("--out (with --preload)", o.out);
  else o.out = paths.output_path("--out", o.out).string();
  o.dot = paths.output_path("--dot", dot).string();
  o.svg = o.no_svg ? std::string() : paths.output_path("the SVG beside --dot", svg).string();
  o.svg_beside = svg.string();
  paths.check();
#if defined(AUTOSHARD_TOOL_HAVE_TENSOR)
  // A Hugging Face model's checkpoint is read too (checked against its config), once the config
  // is known to be a regular file that can be read without blocking.
  for (const fs::path& f : o.model.checkpoint_files()) paths.input("--model's checkpoint file", f);
  paths.check();
#endif
}

/// How a step is priced, from the flags: built here once and carried whole (graph/pricing.hpp).
step_pricing pricing_of(const plan_cli_options& o) {
  step_pricing p;
  if (const device_preset* d = find_device_preset(o.device)) p.device = d->device;
  p.mode = o.model.run();
  p.optimizer = *parse_optimizer_kind(o.optimizer);
  p.gradient_bucket_bytes = o.gradient_bucket;
  p.gradient_overlap = parse_gradient_overlap(o.gradient_overlap, "--gradient-overlap");
  p.zero = !o.no_zero;
  p.micro_batch = o.micro_batch;
  p.micro_batches = o.micro_batches;
  p.recompute = *parse_recompute_policy(o.recompute);
  p.attention = *parse_attention_kernel(o.attention);
  p.achievable = !o.peak_compute;
  return p;
}

autosharding_options pass_options(const plan_cli_options& o, const model_graph& g, const device_mesh& m) {
  autosharding_options po;
  po.mesh = m;
  po.algo = *parse_algo(o.algo);
  po.pricing = pricing_of(o);
  po.skip_fully_replicated = o.skip_fully_replicated;
  po.time_limit = o.time_limit;
  po.mip_rel_gap = o.mip_rel_gap;
  po.run_checks = o.run_checks;
  po.preload_solution = o.preload;
  po.ilp_solution_file = o.out;
  po.tie_layers = !o.no_tie_layers;
  po.tensor_parallel = o.tensor_parallel;
  // The budget is what the plan's tensors may use: by default the device's memory less what the
  // process holds beside them (its CUDA context and NCCL communicators); said otherwise, what
  // the user states (whether the peak and that reserve fit the device is reported either way).
  if (o.memory_budget.empty()) po.memory_budget = default_memory_budget(po);
  else if (o.memory_budget != "none") po.memory_budget = parse_bytes(o.memory_budget, "memory budget");
  std::map<std::string, std::string> pinned_by;  // tensor -> the --pin that pinned it
  for (const std::string& pin : o.pins) {
    const auto eq = pin.find('=');
    const std::string name = pin.substr(0, eq);
    std::string tied;  // a name as users write it: checkpoint spelling, a tied weight's state-dict name
    const std::optional<vertex_t> v = find_tensor(g, name, &tied);
    if (!v) throw graph_error("--pin: the model has no tensor named " + quoted_text(name) + did_you_mean(g, name));
    if (!tied.empty()) std::cerr << "note: --pin " << tied << "\n";
    // Named: the spec's own words ("'S01' at position 0: describes 1 tensor dims ...") name
    // neither the --pin nor the tensor, of several.
    sharding_spec spec;
    try {
      spec = parse_spec(pin.substr(eq + 1), static_cast<int>(m.ndim()), static_cast<int>(g[*v].shape.rank));
    } catch (const spec_error& e) {
      throw spec_error("--pin " + quoted_text(pin) + ": " + std::string(e.message()) + " (" + quoted_text(g[*v].name) + " is " +
                       to_string(g[*v].shape) + " on " + to_string(m) + ")");
    }
    // Two names of one tensor (an alias, the tied lm_head.weight / wte.weight) pinned apart:
    // the last one used to win without a word.
    const auto [it, fresh] = pinned_by.emplace(g[*v].name, pin);
    if (!fresh && !(po.pinned.at(g[*v].name) == spec))
      throw spec_error("--pin " + quoted_text(pin) + " and --pin " + quoted_text(it->second) + " pin one tensor, " + quoted_text(g[*v].name) +
                       ", to different specs: give one");
    po.pinned[g[*v].name] = spec;
  }
  return po;
}

/// The most operators a DOT may draw for Graphviz to lay it out into the SVG: layout time grows
/// faster than the drawing (a 32,768-operator chain took 83 s, ten times its planning).
inline constexpr std::size_t max_svg_nodes = 2000;

/// The operators a plan's DOT draws (write_plan_dot: one `    v<N> [label=...` line each).
std::size_t dot_nodes(const std::string& dot) {
  std::size_t n = 0;
  for (std::size_t at = dot.find("\n    v"); at != std::string::npos; at = dot.find("\n    v", at + 1)) {
    std::size_t k = at + 6;
    while (k < dot.size() && std::isdigit(static_cast<unsigned char>(dot[k]))) ++k;
    n += dot.compare(k, 2, " [") == 0;
  }
  return n;
}

/// The first `n` bytes of `p` (fewer when it is shorter) when it is a regular file (a link is
/// never one), nullopt otherwise: what is_plan_svg and is_plan_dot read.
std::optional<std::string> regular_file_head(const std::filesystem::path& p, std::size_t n) {
  struct stat st {};
  if (::lstat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  std::ifstream in(p, std::ios::binary);
  std::string head(n, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<std::size_t>(std::max<std::streamsize>(in.gcount(), 0)));
  return head;
}

/// Whether `p` is a picture `plan` drew: a regular file that begins as Graphviz writes the SVG
/// of write_plan_dot's `digraph plan` (its generator comment and the title "plan" within the
/// first KiB).
bool is_plan_svg(const std::filesystem::path& p) {
  const std::optional<std::string> head = regular_file_head(p, 1024);
  return head && head->rfind("<?xml", 0) == 0 && head->find("<!-- Generated by graphviz") != std::string::npos &&
         head->find("<!-- Title: plan Pages:") != std::string::npos;
}

/// Whether `p` is a DOT `plan` wrote: a regular file that begins as write_plan_dot's
/// `digraph plan {`.
bool is_plan_dot(const std::filesystem::path& p) {
  const std::string start = "digraph plan {\n";
  return regular_file_head(p, start.size()) == start;
}

/// A plan written without a picture (`why`): the picture `path` an earlier plan's run drew
/// would describe another plan beside the new one. It is removed when it is provably one
/// `plan` drew (`ours`: is_plan_svg, is_plan_dot); anything else at that name is left, with a note.
void remove_stale_picture(const std::string& path, bool (*ours)(const std::filesystem::path&), const std::string& what,
                          const std::string& why) {
  std::error_code ec;
  if (path.empty() || !std::filesystem::exists(std::filesystem::symlink_status(path, ec))) return;
  if (ours(path) && ::unlink(path.c_str()) == 0)
    std::cerr << "autoshard: note: removed " << quoted_path(path) << ", an earlier plan's " << what << " (" << why
              << "): it would have described another plan\n";
  else
    std::cerr << "autoshard: note: " << quoted_path(path) << " is left as it is (" << why
              << "), and is not a picture of this plan: it is not one `plan` drew\n";
}

/// A plan written without its SVG (`why`): the SVG beside the DOT an earlier run drew goes
/// (remove_stale_picture).
void remove_stale_svg(const plan_cli_options& o, const std::string& why) {
  remove_stale_picture(o.svg_beside, is_plan_svg, "picture beside the DOT", why);
}

/// The plan's pictures: a DOT (tied layers once, a legend, resharding edges with their
/// collectives and time; pass/plan_dot.hpp), and an SVG where Graphviz is installed, unless
/// --no-svg or the drawing has more than max_svg_nodes operators (then a note says why).
/// Where no SVG is drawn, an earlier plan's beside the DOT is removed (remove_stale_svg).
/// Returns {dot, svg}; svg is empty when none was written.
std::pair<std::filesystem::path, std::filesystem::path> write_pictures(const plan_cli_options& o,
                                                                       const autosharding_result& r) {
  namespace fs = std::filesystem;
  std::ostringstream dot_text;
  write_plan_dot(dot_text, r.graph, r.report.mesh, r.strategies, r.report.pricing);
  write_file_atomically(o.dot, dot_text.str());
  if (o.svg.empty()) {
    remove_stale_svg(o, "--no-svg draws none");
    return {o.dot, {}};
  }
  if (const std::size_t nodes = dot_nodes(dot_text.str()); nodes > max_svg_nodes) {
    std::cerr << "autoshard: note: no SVG: the plan's drawing has " << nodes << " operators (tied layers drawn once), more than "
              << max_svg_nodes << " that Graphviz lays out in seconds; the DOT is in " << o.dot
              << " (`dot -Tsvg` draws it, slowly), and `autoshard show --plan` lists every tensor\n";
    remove_stale_svg(o, "no SVG is drawn of " + std::to_string(nodes) + " operators");
    return {o.dot, {}};
  }
  // Graphviz's dot, run without a shell, writing into an exclusive temporary (atomic_file: a
  // link planted at any name is never followed), renamed into place only when dot succeeded.
  {
    atomic_file svg(o.svg);
    if (run_program({"dot", "-Tsvg", o.dot}, svg.fd()) == 0) {
      svg.commit();
      return {o.dot, fs::path(o.svg)};
    }
  }
  remove_stale_svg(o, "Graphviz's dot did not draw one");  // no Graphviz: no SVG
  return {o.dot, {}};
}

/// Collectives per step, by (kind, mesh axis): count, bytes, seconds.
using collective_totals = std::map<std::pair<std::string, int>, std::tuple<int, double, double>>;
collective_totals total_collectives(const plan_summary& plan) {
  collective_totals agg;
  for (const collective_use& c : plan.collectives) {
    auto& [n, bytes, secs] = agg[{std::string(to_string(c.kind)), c.mesh_axis}];
    n += c.repeats;
    bytes += static_cast<double>(c.bytes) * c.repeats;
    secs += c.seconds;
  }
  return agg;
}

/// The device line of the report: the preset (or the default model) and the budget.
std::string device_line(const plan_cli_options& o, const autosharding_options& po) {
  std::ostringstream s;
  const device_preset* p = find_device_preset(o.device);
  s << (p ? std::string(p->name) + " (" + std::string(p->description) + ")" : std::string("default (A100-class)")) << ": "
    << po.pricing.device.peak_flops / 1e12 << " TFLOP/s, " << po.pricing.device.memory_bandwidth / 1e12 << " TB/s, "
    << human_bytes(static_cast<double>(po.pricing.device.memory_bytes)) << "; budget "
    << (po.memory_budget ? human_bytes(static_cast<double>(*po.memory_budget)) + " per device" : std::string("none"));
  if (o.memory_budget.empty() && po.memory_budget && *po.memory_budget < po.pricing.device.memory_bytes)
    s << " (the memory less the runtime reserve)";
  return s.str();
}

/// A fraction as a percentage of three significant digits: "100 %", "0.0123 %".
std::string percent_text(double fraction) {
  std::ostringstream os;
  os << std::setprecision(3) << 100.0 * fraction << " %";
  return os.str();
}

/// --json: one document with the plan, the baselines, the collectives and the files.
/// A decode step's figures (an inference plan whose graph has a key/value cache): its batch,
/// new tokens per sequence and past, the tokens it makes a second, and the cache's bytes per
/// device as the plan stores it. None for any other plan.
struct decode_figures {
  std::int64_t batch = 0, seq = 0, past = 0, cache_bytes = 0;
  double tokens_per_second = 0;
};
std::optional<decode_figures> decode_of(const model_graph& g, const autosharding_result& r) {
  const plan_summary& p = r.report.plan;
  if (!p.feasible || p.step_seconds <= 0 || r.report.pricing.mode != run_mode::inference) return std::nullopt;
  decode_figures d;
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
    if (g[v].is_kv_cache()) d.past = g[v].shape[1], d.cache_bytes += r.strategies[v].memory_bytes;
  if (d.past == 0) return std::nullopt;
  d.batch = graph_batch(g);
  d.seq = graph_sequence(g);
  d.tokens_per_second = static_cast<double>(d.batch * d.seq) / p.step_seconds;
  return d;
}

void print_plan_json(const plan_cli_options& o, const autosharding_options& po, const model_graph& g, const autosharding_result& r,
                     const collective_totals& agg, const std::filesystem::path& dot, const std::filesystem::path& svg,
                     const std::vector<export_verdict>& exports) {
  const autosharding_report& rep = r.report;
  const device_mesh& m = rep.mesh;
  nlohmann::json ops = nlohmann::json::array();
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
    ops.push_back({{"name", g[v].name},
                   {"kind", std::string(to_string(g[v].kind))},
                   {"strategy", r.strategies[v].name},
                   {"inputs", spec_list(r.strategies[v].inputs)},
                   {"output", to_alpa_string(r.strategies[v].output)}});
  nlohmann::json opaque = nlohmann::json::array();  // imported operators with no mapping (only Replicate)
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
    if (g[v].kind == op_kind::opaque)
      opaque.push_back({{"name", g[v].name}, {"op_type", g[v].attrs.op_type}, {"elementwise", g[v].attrs.elementwise}});
  nlohmann::json coll = nlohmann::json::array();
  for (const auto& [k, v] : agg)
    coll.push_back({{"collective", k.first}, {"mesh_axis", k.second}, {"count", std::get<0>(v)},
                    {"bytes", std::get<1>(v)}, {"seconds", std::get<2>(v)}});
  nlohmann::json base = nlohmann::json::array();
  for (const plan_summary& b : rep.baselines) base.push_back(summary_json(b));
  nlohmann::json device = to_json(po.pricing.device);  // the one spelling of a device, plus its preset's name
  device["name"] = o.device.empty() ? nlohmann::json(nullptr) : nlohmann::json(o.device);
  nlohmann::json j{{"model", o.model.model},
                   {"parameters", parameter_count(g)},
                   {"mesh", to_json(m)},
                   {"mode", o.model.mode},
                   {"device", device},
                   {"memory_budget", po.memory_budget ? nlohmann::json(*po.memory_budget) : nlohmann::json(nullptr)},
                   {"plan", summary_json(rep.plan)},
                   {"baselines", base},
                   {"collectives", coll},
                   {"operators", ops},
                   {"opaque", opaque},
                   {"files", {{"plan", o.out}, {"dot", dot.string()}, {"svg", svg.string()}}}};
  if (!o.preload)
    j["solver"] = {{"status", to_string(rep.solver.status)}, {"objective", rep.solver.objective_value()},
                   {"bound", rep.solver.bound_value()}, {"gap", rep.solver.gap}, {"seconds", rep.solver.seconds},
                   {"ilp_nodes", rep.tied_classes}, {"stopped", rep.solver.stopped}};
  if (o.run_checks) j["checks"] = "passed";  // a failed check is an error before any output
  j["decode"] = nullptr;  // a decode step's figures, as the report's decode line says them
  if (const std::optional<decode_figures> d = decode_of(g, r))
    j["decode"] = {{"batch", d->batch}, {"tokens", d->seq}, {"past", d->past}, {"tokens_per_second", d->tokens_per_second},
                   {"cache_bytes_per_device", d->cache_bytes}};
  j["exports"] = export_verdicts_json(exports);
  std::cout << j.dump(2) << "\n";
}

/// Per-layer table: operators outside the repeated layers, and layer 0 for the layers,
/// noting whether every other layer chose the same.
void print_chosen_specs(const model_graph& g, const autosharding_result& r) {
  std::map<std::string, std::string> first_choice;
  std::map<std::string, bool> uniform;
  int max_layer = -1;
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
    auto [key, layer] = layer_of(g[v].name);
    if (layer < 0) continue;
    max_layer = std::max(max_layer, layer);
    auto it = first_choice.find(key);
    if (it == first_choice.end()) first_choice[key] = r.strategies[v].name, uniform[key] = true;
    else if (it->second != r.strategies[v].name) uniform[key] = false;
  }
  bool all_uniform = true;
  for (const auto& [k, u] : uniform) all_uniform = all_uniform && u;
  std::cout << "\nchosen specs (operands -> output; "
            << (max_layer < 0 ? std::string("no repeated layers")
                : all_uniform ? "layer 0 shown, layers 1.." + std::to_string(max_layer) + " chose the same"
                              : std::string("every layer shown where they differ"))
            << ")\n";
  // The operator column fits the longest name shown (up to 80 characters; a longer one runs
  // over), and every column ends in a space.
  const auto shown = [&](vertex_t v) {
    auto [key, layer] = layer_of(g[v].name);
    return !is_source(g[v].kind) && !(layer > 0 && uniform[key]);
  };
  std::size_t width = 43;
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
    if (shown(v) || g[v].kind == op_kind::opaque) width = std::max(width, std::min<std::size_t>(80, escaped_name(g[v].name).size()));
  const int col = static_cast<int>(width);
  std::cout << "  " << std::left << std::setw(col) << "operator" << ' ' << std::setw(15) << "kind" << ' ' << "specs\n";
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
    if (!shown(v)) continue;
    std::cout << "  " << std::setw(col) << escaped_name(g[v].name) << ' ' << std::setw(15) << to_string(g[v].kind) << ' '
              << spec_list(r.strategies[v].inputs) << " -> " << to_alpa_string(r.strategies[v].output) << "\n";
  }
  // Imported operators with no mapping: they only offer Replicate (elementwise ones split as
  // add does), and the plan says so.
  std::size_t n_opaque = 0;
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
    if (g[v].kind == op_kind::opaque) {
      if (n_opaque++ == 0)
        std::cout << "\nopaque operators (no mapping: replicated, every operand whole; elementwise ones split as add does)\n";
      std::cout << "  " << std::setw(col) << escaped_name(g[v].name) << ' ' << escaped_name(g[v].attrs.op_type)
                << (g[v].attrs.elementwise ? " (elementwise)" : "") << " -> " << to_alpa_string(r.strategies[v].output) << "\n";
    }
}

/// The terminal report: model and mesh (as priced), solver, chosen specs per layer,
/// collectives, and the plan next to the baselines.
void print_plan_report(const plan_cli_options& o, const autosharding_options& po, const model_graph& g, const autosharding_result& r,
                       const collective_totals& agg, const std::filesystem::path& dot, const std::filesystem::path& svg,
                       const std::vector<export_verdict>& exports) {
  const autosharding_report& rep = r.report;
  const device_mesh& m = rep.mesh;
  const run_mode mode = o.model.run();
  std::cout << "model   " << escaped_text(o.model.model) << ": " << boost::num_vertices(g) << " operators, "
            << parameter_count(g) << " parameters, " << to_string(mode)
            << "\nmesh    " << to_string(m);
  for (std::size_t a = 0; a < m.ndim(); ++a)
    std::cout << (a ? ", " : "  (") << "axis " << a << ": " << m.size(a) << (m.size(a) == 1 ? " rank, " : " ranks, ") << m.link(a).beta / 1e9
              << " GB/s, " << human_seconds(m.link(a).alpha);
  std::cout << ")\ndevice  " << device_line(o, po) << "\n";
  if (o.preload) std::cout << "plan    preloaded from " << escaped_text(o.out) << "\n";
  else
    std::cout << "solver  " << to_string(rep.solver.status) << " in " << human_seconds(rep.solver.seconds) << " ("
              << rep.tied_classes << " ILP nodes for " << rep.vertices << " operators"
              << (rep.solver.status == solve_status::feasible ? ", gap " + percent_text(rep.solver.gap) : std::string()) << ")"
              // Not proven optimal: why (a time limit, mip_rel_gap, costs rounded too coarsely).
              << (rep.solver.status == solve_status::feasible && !rep.solver.stopped.empty()
                      ? "\n        " + escaped_text(rep.solver.stopped)
                      : std::string())
              << "\n";
  if (rep.plan.feasible && rep.plan.runtime.bytes() > 0)  // the peak beside what the process holds
    std::cout << "memory  " << describe_peak(rep.plan.peak_memory_bytes, rep.plan.runtime, po.pricing.device)
              << (rep.plan.fits ? "" : "  DOES NOT FIT") << "\n";
  if (const std::optional<decode_figures> d = decode_of(g, r))
    std::cout << "decode  " << d->batch << (d->batch == 1 ? " sequence x " : " sequences x ") << d->seq << (d->seq == 1 ? " token" : " tokens")
              << " after " << d->past << " cached: " << std::fixed << std::setprecision(0) << d->tokens_per_second << std::defaultfloat
              << std::setprecision(6) << " tokens/s (a step " << human_seconds(rep.plan.step_seconds) << "); the key/value cache "
              << human_bytes(static_cast<double>(d->cache_bytes)) << " per device\n";
  if (o.run_checks)  // a failed check is an error before any output
    std::cout << "checks  passed: the plan is consistent and re-priced from scratch to the same step time\n";
  if (mode == run_mode::training) {
    const plan_summary& p = rep.plan;
    std::cout << "step    " << to_string(p.par) << " (global batch " << p.par.micro_batch * p.par.dp * p.par.micro_batches
              << ")\n        " << std::fixed << std::setprecision(1) << p.tflops_per_device
              << " TFLOP/s per device as Megatron-LM counts them (Narayanan et al. 2021, eq. 3), MFU "
              << 100.0 * p.mfu << " %" << std::defaultfloat << std::setprecision(6) << "\n";
    // eq. 3 counts every S x S attention pair: at long sequences more than the device could
    // compute in the step. MFU counts the pairs a causal mask keeps, so it stays below 100 %.
    if (p.tflops_per_device * 1e12 > po.pricing.device.peak_flops)
      std::cout << "        (above the device's peak of " << std::fixed << std::setprecision(1)
                << po.pricing.device.peak_flops / 1e12 << std::defaultfloat << std::setprecision(6)
                << " TFLOP/s: eq. 3 counts all S x S attention pairs, which a causal kernel halves)\n";
    for (const std::string& t : p.tried) std::cout << "search  " << t << "\n";
  }

  print_chosen_specs(g, r);
  std::cout << std::right << "\ncollectives per step\n";
  if (agg.empty()) std::cout << "  none\n";
  for (const auto& [k, v] : agg)
    std::cout << "  " << std::left << std::setw(16) << k.first << std::right << " " << m.axis_label(static_cast<std::size_t>(k.second)) << ": "
              << std::setw(5) << std::get<0>(v) << " x, " << std::setw(12) << human_bytes(std::get<1>(v))
              << " in all, " << human_seconds(std::get<2>(v)) << "\n";
  std::cout << "\nmodeled step time and memory per device (* = this plan)\n  " << std::string(20, ' ') << std::setw(12)
            << "step" << std::setw(12) << "compute" << std::setw(12) << "comm" << std::setw(12) << "reshard"
            << std::setw(14) << "peak memory" << "\n";
  print_summary_row(rep.plan, true);
  for (const plan_summary& b : rep.baselines) print_summary_row(b, false);
  if (mode == run_mode::training) {
    std::cout << "\ntraining step of each (TFLOP/s per device as Megatron-LM counts them, MFU)\n";
    const auto line = [](const plan_summary& s, bool chosen) {
      if (!s.feasible) return;
      std::cout << "  " << (chosen ? "* " : "  ") << std::left << std::setw(18) << to_string(s.algo) << std::right << std::fixed
                << std::setprecision(1) << std::setw(8) << s.tflops_per_device << std::setw(7) << 100.0 * s.mfu << " %  "
                << std::defaultfloat << std::setprecision(6) << to_string(s.par) << "\n";
    };
    line(rep.plan, true);
    for (const plan_summary& b : rep.baselines) line(b, false);
  }
  print_export_verdicts(exports, o.out);
  // With --preload the plan is read from --out, not written: "wrote p.json (plan)" said it was.
  std::cout << "\nwrote " << (o.preload ? std::string() : escaped_text(o.out) + " (plan), ") << escaped_text(dot.string())
            << (svg.empty() ? "" : ", " + escaped_text(svg.string()))
            << (o.preload ? " (the plan preloaded from " + escaped_text(o.out) + " is as it was)" : std::string()) << "\n";
}

int run_plan(plan_cli_options o) {
  if (const device_preset* p = find_device_preset(o.device))  // its links (what NCCL achieves on them), unless given
    if (o.calibration.empty()) o.mesh.default_bandwidths(p->inter_node_link(!o.peak_compute), p->intra_node_link(!o.peak_compute));
  check_plan_paths(o);
  const model_graph g = o.model.build();
  autosharding_options po = pass_options(o, g, plan_mesh(o));
  if (!o.pipeline_stages.empty()) {  // pipeline stages: plan_pipeline.hpp
    // Each configuration's stages may use the device's memory less its own runtime reserve (its
    // communicators depend on pp, tp and dp); a budget the user gives tightens that.
    if (o.memory_budget == "none")
      throw spec_error("--memory-budget none does not apply with --pp: the search chooses among configurations that fit the "
                       "device (its memory less each one's runtime reserve); give a budget to tighten that, or leave the flag out");
    if (o.memory_budget.empty()) po.memory_budget.reset();
    // The search splits the ranks into stages, tensor- and data-parallel ranks of its own choosing
    // and writes a stage mesh without names: `--mesh tp=2,dp=2 --pp 2` put the stages on the axis
    // named tp, without a word.
    if (po.mesh.has_axis_names())
      throw spec_error("--mesh " + escaped_text(o.mesh.mesh) + ": with --pp the search chooses which ranks are pipeline stages, tensor- and "
                       "data-parallel (pp x tp x dp), whatever the axes are named, and writes a stage mesh without names: give the "
                       "shape alone (--mesh " + shape_text(device_mesh(po.mesh.shape())) + ")");
    po.on_progress = nullptr;
    const bool fits =
        run_pipelined_plan(g, po, {o.pipeline_stages, o.schedule, o.tensor_parallel, o.micro_batch, po.pricing.recompute, o.json});
    if (!o.preload) {  // a pipelined plan has no pictures: an earlier unpipelined plan's would describe another
      remove_stale_picture(o.dot, is_plan_dot, "DOT", "a pipelined plan draws none");
      remove_stale_svg(o, "a pipelined plan draws none");
    }
    return fits ? exit_ok : exit_does_not_fit;
  }
  progress_printer progress(!o.quiet && !o.preload);
  po.on_progress = [&progress](const solve_progress& p) { progress(p); };
  // The phases around the solve (strategies, pricing every edge, the baselines): long on
  // large models, shown on a terminal or with --progress.
  phase_printer phases(!o.quiet && progress_wanted(o.progress), "plan");
  const auto started = std::chrono::steady_clock::now();
  po.on_phase = [&phases, started](const char* phase, std::size_t done, std::size_t total) {
    const std::string p = phase;
    phases(p, done, total, p == "strategies" ? "operators' strategies enumerated"
                           : p == "pricing"  ? "edges' resharding costs priced"
                                             : "baseline algos solved",
           std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    if (p == "pricing" && done == total) phases.finish();  // the solver's own line comes next
  };
  const autosharding_result r = autosharding_analysis_pass(g, po);
  phases.finish();
  progress.finish();
  const auto [dot, svg] = write_pictures(o, r);
  const collective_totals agg = total_collectives(r.report.plan);
  // Whether each export writes the plan just written (a user learns it here, not at export).
  const std::vector<export_verdict> exports = export_verdicts(o.out);
  if (o.json) print_plan_json(o, po, g, r, agg, dot, svg, exports);
  else print_plan_report(o, po, g, r, agg, dot, svg, exports);
  if (!r.report.plan.fits) {  // said loudly, after the files are written
    const runtime_reserve& rr = r.report.plan.runtime;
    std::cerr << "autoshard: the plan does not fit: its peak memory is "
              << human_bytes_exact(r.report.plan.peak_memory_bytes) << " per device"
              << (rr.bytes() > 0 ? " + " + to_string(rr) : std::string()) << ", the device has "
              << human_bytes_exact(po.pricing.device.memory_bytes) << " (budget: "
              << (po.memory_budget ? human_bytes_exact(*po.memory_budget) : std::string("none"))
              << "); leave --memory-budget at its default, the device's memory"
              << (rr.bytes() > 0 ? " less the runtime" : "") << ", to find a plan that fits\n";
    return exit_does_not_fit;
  }
  return exit_ok;
}

}  // namespace

void register_plan(CLI::App& app, action& run) {
  auto o = std::make_shared<plan_cli_options>();
  CLI::App* cmd = app.add_subcommand("plan", "auto-shard a model on a mesh and write the plan");
  cmd->footer(
      "Examples:\n"
      "  autoshard plan --model gpt2 --mesh 2x4 --out plan.json\n"
      "  autoshard plan --model llama-7b --mesh dp=2,tp=4 --mode infer --memory-budget 40GiB --out plan.json --json");

  o->model.add_to(*cmd, true);
  o->mesh.add_to(*cmd);
  std::vector<std::string> algos;
  for (algo a : all_algos) algos.emplace_back(to_string(a));
  cmd->add_option("--algo", o->algo, "alpa (the ILP), megatron, data_parallel, zero3 or fully_replicated")
      ->check(CLI::IsMember(algos))
      ->capture_default_str();
  CLI::Option* backend = cmd->add_option("--backend", o->backend, "communications backend whose costs to use (with --calibration: the file's)")
      ->check(CLI::IsMember({"nccl", "gloo"}))
      ->capture_default_str();
  cmd->add_option("--device", o->device, "device preset: its FLOP/s, HBM bandwidth and memory (the default budget), "
                  "and its NVLink and network bandwidths unless --intra-bw/--inter-bw are given")
      ->check(CLI::Validator(
          [](std::string& v) {
            return find_device_preset(v) ? std::string() : "unknown device " + quoted_text(v) + "; presets: " + device_preset_names();
          },
          "{" + device_preset_names() + "}"));
  cmd->add_option("--memory-budget", o->memory_budget,
                  "bytes per device, e.g. 16GiB or 8e9; default the device's memory less its runtime reserve; none = no "
                  "budget (not with --pp, where a budget only tightens the device's)")
      ->check(CLI::Validator(
          [](std::string& v) { return v == "none" ? std::string() : byte_size()(v); }, "BYTES|none"));
  cmd->add_option("--calibration", o->calibration, "links measured by `autoshard calibrate` (replace --*-bw/--*-lat)");
  cmd->add_flag("--force", o->force, "use a calibration measured on another mesh shape or backend (and say so)");
  cmd->add_option("--time-limit", o->time_limit, "seconds per ILP solve")->capture_default_str()->check(finite_in(0, 1e7, true));
  cmd->add_option("--optimizer", o->optimizer, "training: adam (16 B per parameter, mixed precision) or sgd (8 B)")
      ->check(CLI::IsMember({"adam", "sgd"}))
      ->capture_default_str();
  cmd->add_option("--gradient-bucket", o->gradient_bucket, "training: gradient bucket bytes, DDP's 25 MiB; 0 = per tensor")
      ->capture_default_str()
      ->check(finite_in(0, 1e18));
  cmd->add_option("--gradient-overlap", o->gradient_overlap,
                  "training: gradient sync hidden behind each consumer's backward compute (backward), "
                  "or this fraction of it, 0 to 1")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& v) {
            try {
              (void)parse_gradient_overlap(v, "");  // CLI11 names the flag
              return std::string();
            } catch (const spec_error& e) {
              return std::string(e.message());
            }
          },
          "backward|FRACTION"));
  cmd->add_option("--mip-rel-gap", o->mip_rel_gap, "stop within this FRACTION of the bound (0.01 = 1%)")
      ->capture_default_str()
      ->check(finite_in(0, 1));
  cmd->add_flag("--skip-fully-replicated", o->skip_fully_replicated, "never choose an all-replicated strategy");
  cmd->add_flag("--run-checks", o->run_checks, "check the plan's consistency and re-price it from scratch");
  cmd->add_flag("--preload", o->preload, "read the plan from --out instead of solving");
  cmd->add_flag("--no-tie-layers", o->no_tie_layers, "let identical layers choose differently");
  cmd->add_flag("--no-zero", o->no_zero, "training: offer no ZeRO-1/2 storage of parameters (ZeRO-3, stored sharded, stays)");
  cmd->add_option("--micro-batch", o->micro_batch,
                  "training: sequences per data-parallel rank per micro-step (Megatron-LM's --micro-batch-size); "
                  "default: the planner chooses")
      ->check(CLI::Range(1, max_micro_batches));
  cmd->add_option("--micro-batches", o->micro_batches,
                  "training: micro-steps per step, gradients accumulated over them; default: the planner chooses")
      ->check(CLI::Range(1, max_micro_batches));
  cmd->add_option("--recompute", o->recompute,
                  "training: activation recomputation per layer: choose (the planner, when memory needs it), none, "
                  "selective (the attention core) or full")
      ->check(CLI::IsMember({"choose", "none", "selective", "full"}))
      ->capture_default_str();
  cmd->add_option("--attention", o->attention,
                  "the attention core's kernel: flash (FlashAttention) or unfused (scores in memory, as Megatron-LM "
                  "ran before FlashAttention)")
      ->check(CLI::IsMember({"flash", "unfused"}))
      ->capture_default_str();
  cmd->add_flag("--peak-compute", o->peak_compute,
                "price compute and a preset's links at the data-sheet peaks, not at what GEMMs, copies and NCCL "
                "were measured to achieve");
  cmd->add_option("--tp", o->tensor_parallel,
                  "--algo megatron: tensor-parallel size (a divisor of the devices per node; 1 = data parallel "
                  "only); default: the devices per node, or with --pp auto every divisor, searched")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--pp", o->pipeline_stages,
                  "training: pipeline stages: auto (search stages, tensor and data parallel sizes, micro-batch and "
                  "recomputation; with --algo megatron, in Megatron-LM's layout with the layers split as its arguments can) or a "
                  "stage count; with --algo megatron --tp T, the configuration Megatron-LM runs (docs/pipelines.md)")
      ->check(CLI::Validator(  // its form is a usage error, as every number's (it was exit 1)
          [](std::string& in) -> std::string {
            const bool count = !in.empty() && in.size() <= 7 && in.find_first_not_of("0123456789") == std::string::npos &&
                               in.find_first_not_of('0') != std::string::npos;
            return in == "auto" || count ? "" : quoted_text(in) + " is not \"auto\" or a stage count from 1 to 9999999";
          },
          "auto|STAGES"));
  cmd->add_option("--schedule", o->schedule, "with --pp: the pipeline schedule, 1f1b or gpipe")
      ->check(CLI::IsMember({"1f1b", "gpipe"}))
      ->capture_default_str();
  cmd->add_option("--pin", o->pins, "NAME=SPEC: the output spec a tensor must have (repeatable)")
      ->check(CLI::Validator(
          [](std::string& v) {
            const auto eq = v.find('=');
            return eq == std::string::npos || eq == 0 || eq + 1 == v.size()
                       ? quoted_text(v) + " is not NAME=SPEC (e.g. input_ids=S0R)"
                       : std::string();
          },
          "NAME=SPEC"));
  cmd->add_option("--out", o->out, "plan file (JSON)")->capture_default_str();
  cmd->add_option("--dot", o->dot, "Graphviz file (default: the plan's name with .dot)");
  cmd->add_flag("--no-svg", o->no_svg, "write no SVG beside the DOT (Graphviz is skipped)");
  add_follow_symlinks(*cmd, o->follow_symlinks);
  cmd->add_flag("--json", o->json, "write one JSON document to stdout");
  cmd->add_flag("--quiet", o->quiet, "no progress on stderr (solver, phases)");
  cmd->add_flag("--progress", o->progress,
                "progress of the phases (strategies, pricing, baselines) on stderr even when it is not a terminal");
  cmd->callback([o, cmd, backend, &run] {
    o->model.check_flags();
    // A training option under --mode infer priced nothing and was dropped without a word
    // (`--mode infer --micro-batches 2` planned one forward pass).
    if (o->model.run() == run_mode::inference)
      refuse_given(*cmd, {"--optimizer", "--gradient-bucket", "--gradient-overlap", "--no-zero", "--micro-batch", "--micro-batches", "--recompute"},
                   "prices a training step (gradients, optimizer state, micro-steps, recomputation); --mode infer has none: "
                   "leave it out, or plan with --mode train");
    // Options of one way of planning, taken without a word by another: `--schedule gpipe`
    // without --pp planned no pipeline, `--force` without --calibration forced nothing, and
    // with --pp (whose stages tie their layers, are checked as they are priced, and draw no
    // picture) `--run-checks` ran no check, `--no-tie-layers` untied nothing and `--dot` wrote no file.
    if (o->pipeline_stages.empty())
      refuse_given(*cmd, {"--schedule"}, "the pipeline schedule applies with --pp: plan pipeline stages with --pp, or leave it out");
    if (o->calibration.empty())
      refuse_given(*cmd, {"--force"}, "forces the use of a --calibration measured on another mesh or backend; there is no "
                                      "--calibration: leave it out");
    if (!o->pipeline_stages.empty()) {
      refuse_given(*cmd, {"--run-checks"}, "re-checks a plan of one mesh; a pipelined plan's stages are not re-checked: "
                                           "leave it out, or plan without --pp");
      refuse_given(*cmd, {"--no-tie-layers"}, "with --pp every layer of a stage takes the stage's one strategy for it: "
                                              "leave it out, or plan without --pp");
      refuse_given(*cmd, {"--dot"}, "a pipelined plan draws no picture: leave it out, or plan without --pp");
    }
    // Under --pp the micro-steps are the global batch over the data-parallel ranks and the
    // micro-batch: a --micro-batches of its own was dropped without a word (`--pp 2
    // --micro-batches 3` planned 2).
    if (!o->pipeline_stages.empty() && cmd->get_option("--micro-batches")->count() > 0)
      throw CLI::ValidationError("--micro-batches", "with --pp the micro-steps are the global batch over the data-parallel ranks "
                                                    "and the micro-batch the search chooses (or --micro-batch): leave it out");
    // A pin is a spec over --mesh's axes; under --pp each stage is planned on a sub-mesh of the
    // search's (pp x tp x dp split), which it does not name: every configuration failed.
    if (!o->pipeline_stages.empty() && cmd->get_option("--pin")->count() > 0)
      throw CLI::ValidationError("--pin", "with --pp each stage is planned on a sub-mesh the search chooses (its split of --mesh "
                                          "into stages, tensor- and data-parallel ranks), which a spec over --mesh's axes does not "
                                          "name: leave it out, or plan without --pp");
    if (o->tensor_parallel != 0 && o->algo != to_string(algo::megatron))
      throw CLI::ValidationError("--tp", "the tensor-parallel size is megatron's (--algo megatron); the other algos choose theirs");
    o->backend_given = backend->count() > 0;
    run = [o] { return run_plan(*o); };
  });
}

}  // namespace autoshard::tool
