#pragma once
/// How a step is priced: one value (step_pricing) with its defaults, `==` and one JSON spelling,
/// carried whole from the pass's options through the cost model into the plan file and back.
/// Its closed choices are enums with to_string/parse beside them.
///   autoshard::step_pricing p;                      // training, A100-class, Adam, DDP's buckets
///   p.mode = autoshard::run_mode::inference;        // forward only: serving
///   p.optimizer = *autoshard::parse_optimizer_kind("sgd");
///   nlohmann::json j = autoshard::to_json(p);       // what a plan file records
///   autoshard::step_pricing q = autoshard::step_pricing_from_json(autoshard::json_in(j, "p.json"));
///
/// Adding a setting (docs/design.md): a field here with its default, its member in to_json and
/// step_pricing_from_json (optional when read, so older files keep their meaning), and the flag
/// that sets it in tools/autoshard/cmd_plan.cpp's pricing_of; the cost model reads it from
/// strategy_options::pricing. Nothing else copies it.
#include <cctype>       // std::isdigit
#include <cstddef>      // std::size_t
#include <cstdint>      // std::int64_t, std::uint8_t
#include <iterator>     // std::size
#include <cstdio>       // std::snprintf
#include <exception>    // std::exception (std::stod's)
#include <optional>     // std::optional
#include <string>       // std::string
#include <string_view>  // std::string_view

#include <nlohmann/json.hpp>  // nlohmann::json

#include "../core/dtype.hpp"      // dtype, dtype_size, human_bytes
#include "../core/enum_text.hpp"  // parse_enum
#include "../core/error.hpp"  // spec_error
#include "../io/json.hpp"     // json_in, enum_value
#include "device.hpp"         // device_model

namespace autoshard {

/// Inference prices the forward pass; training adds backward compute and communication.
enum class run_mode : std::uint8_t { inference, training };
inline constexpr run_mode all_run_modes[] = {run_mode::inference, run_mode::training};

/// "inference" or "training": what plan files and reports write.
constexpr std::string_view to_string(run_mode m) noexcept { return m == run_mode::training ? "training" : "inference"; }
/// The mode to_string wrote, or nullopt.
constexpr std::optional<run_mode> parse_run_mode(std::string_view s) noexcept { return parse_enum(s, all_run_modes); }

/// What autoshard plans for when not told: training, what most users of an auto-sharder plan
/// and what the CLI's `--mode` defaults to. The one home of that default: step_pricing and
/// transformer_config start from it.
///   autoshard::autosharding_options o;             // o.pricing.mode == default_run_mode (training)
///   o.pricing.mode = autoshard::run_mode::inference;  // forward only: serving
inline constexpr run_mode default_run_mode = run_mode::training;

/// What the optimizer keeps per parameter in training.
enum class optimizer_kind : std::uint8_t { none, sgd, adam };  ///< none: no optimizer state (exec)
inline constexpr optimizer_kind all_optimizer_kinds[] = {optimizer_kind::none, optimizer_kind::sgd, optimizer_kind::adam};

/// "none", "sgd" or "adam".
constexpr std::string_view to_string(optimizer_kind o) noexcept {
  constexpr std::string_view names[] = {"none", "sgd", "adam"};
  return static_cast<std::size_t>(o) < std::size(names) ? names[static_cast<std::size_t>(o)] : "?";
}
/// The optimizer to_string wrote, or nullopt.
constexpr std::optional<optimizer_kind> parse_optimizer_kind(std::string_view s) noexcept {
  return parse_enum(s, all_optimizer_kinds);
}

/// Bytes per parameter element in training: weight and gradient in the parameter's dtype,
/// plus with mixed precision (a dtype narrower than f32) an f32 master copy, plus Adam's two
/// f32 moments: bf16 Adam 2 + 2 + 4 + 8 = 16 B, f32 Adam 4 + 4 + 8 = 16 B, bf16 SGD 8 B.
constexpr std::int64_t parameter_state_bytes(dtype t, optimizer_kind o) noexcept {
  const auto e = static_cast<std::int64_t>(dtype_size(t));
  return 2 * e + (e < 4 ? 4 : 0) + (o == optimizer_kind::adam ? 8 : 0);
}

/// How much of a parameter's gradient synchronisation the backward pass hides. PyTorch DDP and
/// Megatron-LM (overlap_grad_reduce) launch each bucket's reduction as soon as its gradients
/// are ready, while the backward of the layers before it still runs.
///   backward   on an edge parameter -> consumer, the sync is hidden behind one consumer's
///              worth of backward compute: exposed = max(0, sync - window), window = the
///              backward part of the consumer strategy's compute_seconds
///              (strategy::backward_compute_seconds)
///   a fraction f in [0, 1]: f of every sync is hidden, 1 - f is charged (0: all of it)
///   autoshard::step_pricing p;
///   p.gradient_overlap = 0.0;  // every byte of gradient sync on the critical path (Alpa's model)
///   p.gradient_overlap = autoshard::gradient_overlap_model::behind_backward();
struct gradient_overlap_model {
  bool backward = false;  ///< hidden behind the consumer's backward compute (fraction unused)
  double fraction = 0.0;  ///< otherwise: the share of the sync hidden, 0 to 1
  /// A fraction hidden; implicit, so `p.gradient_overlap = 0.4` reads as it means.
  constexpr gradient_overlap_model(double hidden = 0.0) noexcept : fraction(hidden) {}  // NOLINT(google-explicit-constructor)
  static constexpr gradient_overlap_model behind_backward() noexcept {
    gradient_overlap_model m;
    m.backward = true;
    return m;
  }
  /// Seconds of `sync` (a parameter's gradient synchronisation on one edge) left exposed when
  /// the consumer's backward compute takes `window` seconds.
  constexpr double exposed(double sync, double window) const noexcept {
    return backward ? (sync > window ? sync - window : 0.0) : sync * (1.0 - fraction);
  }
  friend constexpr bool operator==(const gradient_overlap_model&, const gradient_overlap_model&) = default;
};

/// "backward", or the fraction as %g ("0", "0.4"): what the CLI and plan files write.
inline std::string to_string(const gradient_overlap_model& o) {
  if (o.backward) return "backward";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", o.fraction);
  return buf;
}

/// The model `to_string` writes: "backward" or a decimal number in [0, 1]; spec_error naming
/// `what` (when not empty) and the text otherwise. Decimal only, as every real-valued flag is
/// (std::stod alone took "0x1p-1" as 0.5, and " 0.5" with its white space).
inline gradient_overlap_model parse_gradient_overlap(const std::string& text, const std::string& what = "gradient overlap") {
  if (text == "backward") return gradient_overlap_model::behind_backward();
  double f = 0.0;
  std::size_t used = 0;
  const bool decimal = !text.empty() && (std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '.') &&
                       text.find_first_not_of("0123456789.eE+-") == std::string::npos;
  try {
    if (decimal) f = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !(f >= 0.0 && f <= 1.0))
    throw spec_error((what.empty() ? std::string() : what + " ") + quoted_text(text) +
                     " is neither \"backward\" nor a decimal number in [0, 1]");
  return f;
}

/// Activation recomputation of one transformer layer (Korthikanti et al. 2022): keep every
/// activation its backward needs (none), recompute the attention core in the backward instead
/// of keeping its probabilities (selective), or keep only the layer's input and run its whole
/// forward again in the backward (full).
enum class recompute_kind : std::uint8_t { none, selective, full };
inline constexpr recompute_kind all_recompute_kinds[] = {recompute_kind::none, recompute_kind::selective, recompute_kind::full};

/// "none", "selective" or "full".
constexpr std::string_view to_string(recompute_kind r) noexcept {
  switch (r) {
    case recompute_kind::none: return "none";
    case recompute_kind::selective: return "selective";
    case recompute_kind::full: return "full";
  }
  return "?";
}
/// The kind to_string wrote, or nullopt.
constexpr std::optional<recompute_kind> parse_recompute_kind(std::string_view s) noexcept {
  return parse_enum(s, all_recompute_kinds);
}

/// What a plan may recompute: the ILP's choice per layer (`choose`: a layer recomputes only
/// when memory requires it, recomputation never making a step faster), or one kind for
/// every layer.
enum class recompute_policy : std::uint8_t { choose, none, selective, full };
inline constexpr recompute_policy all_recompute_policies[] = {recompute_policy::choose, recompute_policy::none,
                                                              recompute_policy::selective, recompute_policy::full};

/// "choose", "none", "selective" or "full".
constexpr std::string_view to_string(recompute_policy r) noexcept {
  switch (r) {
    case recompute_policy::choose: return "choose";
    case recompute_policy::none: return "none";
    case recompute_policy::selective: return "selective";
    case recompute_policy::full: return "full";
  }
  return "?";
}
/// The policy to_string wrote, or nullopt.
constexpr std::optional<recompute_policy> parse_recompute_policy(std::string_view s) noexcept {
  return parse_enum(s, all_recompute_policies);
}

/// How the attention core (softmax(QK^T) V) runs. `flash`: FlashAttention, the scores never
/// reach HBM and are recomputed block by block in the backward (a causal mask skips the masked
/// half, a sliding window every block outside it). `unfused`: as Megatron-LM ran before it (Narayanan et al. 2021, Korthikanti et al.
/// 2022): the full S x S scores, their softmax, the dropout mask and its output are written to
/// HBM and read back, and kept for the backward (the 5 a s^2 b bytes per layer) unless selective
/// recomputation recomputes them.
enum class attention_kernel : std::uint8_t { flash, unfused };
inline constexpr attention_kernel all_attention_kernels[] = {attention_kernel::flash, attention_kernel::unfused};

/// "flash" or "unfused".
constexpr std::string_view to_string(attention_kernel a) noexcept { return a == attention_kernel::flash ? "flash" : "unfused"; }
/// The kernel to_string wrote, or nullopt.
constexpr std::optional<attention_kernel> parse_attention_kernel(std::string_view s) noexcept {
  return parse_enum(s, all_attention_kernels);
}

/// What training prices when not told: gradient sync hidden behind the consumer's backward, as
/// DDP and Megatron-LM run it (step_pricing's default, the tool's too).
inline constexpr gradient_overlap_model default_gradient_overlap = gradient_overlap_model::behind_backward();

/// The gradient bucket training prices when not told: DDP's 25 MiB (step_pricing's default).
inline constexpr double default_gradient_bucket_bytes = 25.0 * (1 << 20);

/// The most micro-batches, and the largest micro-batch, a pricing may name (a plan file, a
/// flag): far above any real job, far below what would overflow a count of sequences.
inline constexpr int max_micro_batches = 1 << 24;

/// How a step is priced: the device, inference or training, and how training runs. The pass's
/// options, the cost model (strategy_options) and the plan document each hold one, whole.
struct step_pricing {
  device_model device{};              ///< compute prices, and the memory a plan must fit in
  run_mode mode = default_run_mode;   ///< training prices backward compute and gradients
  optimizer_kind optimizer = optimizer_kind::adam;  ///< training: what each parameter keeps (16 B/param for Adam)
  /// Training: gradient synchronisation of parameters in buckets of this many bytes (DDP's
  /// 25 MiB; 0 = one collective per tensor, each paying its full latency) ...
  double gradient_bucket_bytes = default_gradient_bucket_bytes;
  /// ... and how much of it the backward hides: behind each consumer's backward compute
  /// (gradient_overlap_model::behind_backward()) or a fraction (0 = none).
  gradient_overlap_model gradient_overlap = default_gradient_overlap;
  /// Training: also offer each parameter replicated on some mesh axes as ZeRO-1 (optimizer
  /// state sharded over them) and ZeRO-2 (gradient too). ZeRO-3 needs no option: it is a
  /// parameter stored sharded, gathered on use.
  bool zero = true;
  /// Training: the global batch (the graph's) runs as `micro_batches` micro-steps of
  /// `micro_batch` sequences per data-parallel rank, gradients accumulated; the gradient sync
  /// (ZeRO's reduce-scatter and all-gather too) runs once per step, overlapped with the last
  /// micro-step's backward. 0 = the planner chooses (the pass's outer search); a plan records
  /// both. The cost model prices a graph of one micro-step's batch, `micro_batches` times.
  int micro_batch = 0;
  int micro_batches = 0;
  /// Training: which activation recomputation a layer may take (recompute_policy).
  recompute_policy recompute = recompute_policy::choose;
  /// How the attention core runs (attention_kernel): its time, and in training its memory.
  attention_kernel attention = attention_kernel::flash;
  /// Compute priced at what the device achieves (device_model's achievable rates, where it
  /// has them), not at its data-sheet peaks.
  bool achievable = true;

  /// The micro-steps the cost model prices: micro_batches, 1 while the planner chooses.
  constexpr int accumulation() const noexcept { return micro_batches > 0 ? micro_batches : 1; }
  friend bool operator==(const step_pricing&, const step_pricing&) = default;
};

/// The training settings in words: "adam, gradient buckets of 25.00 MiB, gradient sync
/// overlapped with each consumer's backward, ZeRO-1/2 offered, 4 micro-batches of 2 per
/// data-parallel rank, full recomputation, flash attention, compute at achievable rates" (or
/// "0.4 of the gradient sync overlapped"; what `show --plan` and `verify` report).
inline std::string describe_training(const step_pricing& p) {
  const std::string overlap = p.gradient_overlap.backward ? std::string("gradient sync overlapped with each consumer's backward")
                                                          : to_string(p.gradient_overlap) + " of the gradient sync overlapped";
  return std::string(to_string(p.optimizer)) + ", gradient buckets of " +
         (p.gradient_bucket_bytes > 0 ? human_bytes(p.gradient_bucket_bytes) : std::string("0 (one per tensor)")) + ", " +
         overlap + ", ZeRO-1/2 " + (p.zero ? "offered" : "not offered") + ", " +
         (p.micro_batches > 0 ? std::to_string(p.micro_batches) + (p.micro_batches == 1 ? " micro-batch" : " micro-batches")
                              : std::string("micro-batches chosen by the planner")) +
         (p.micro_batch > 0 ? " of " + std::to_string(p.micro_batch) + " per data-parallel rank" : std::string()) + ", " +
         (p.recompute == recompute_policy::choose ? std::string("recomputation chosen per layer")
          : p.recompute == recompute_policy::none ? std::string("no recomputation")
                                                  : std::string(to_string(p.recompute)) + " recomputation") +
         ", " + std::string(to_string(p.attention)) + " attention, compute at " + (p.achievable ? "achievable" : "peak") + " rates";
}

// ---- the one JSON spelling -----------------------------------------------------------------

/// {"peak_flops": 3.12e14, "memory_bandwidth": 2e12, "memory_bytes": 85899345920,
///  "large_matmul_flops": 2.712e14, "sliced_matmul_flops": 0, "achievable_memory_bandwidth": 1.8e12,
///  "context_bytes": 419430400, "communicator_bytes": 721420288, "pair_communicator_bytes": 570425344}
inline nlohmann::json to_json(const device_model& d) {
  return {{"peak_flops", d.peak_flops},
          {"memory_bandwidth", d.memory_bandwidth},
          {"memory_bytes", d.memory_bytes},
          {"large_matmul_flops", d.large_matmul_flops},
          {"sliced_matmul_flops", d.sliced_matmul_flops},
          {"achievable_memory_bandwidth", d.achievable_memory_bandwidth},
          {"context_bytes", d.context_bytes},
          {"communicator_bytes", d.communicator_bytes},
          {"pair_communicator_bytes", d.pair_communicator_bytes}};
}

/// The device to_json wrote: peaks in [1, 1e30], memory_bytes >= 1, achievable figures in
/// [0, their peak] (0 or absent, as before they were recorded: none), the runtime figures in
/// [0, memory_bytes] (absent, as in files written before the runtime reserve was counted: 0).
inline device_model device_model_from_json(const json_in& j) {
  device_model d;
  d.peak_flops = j["peak_flops"].number(1.0, 1e30);
  d.memory_bandwidth = j["memory_bandwidth"].number(1.0, 1e30);
  d.memory_bytes = j["memory_bytes"].integer(1);
  if (const auto x = j.find("large_matmul_flops")) d.large_matmul_flops = x->number(0.0, d.peak_flops);
  if (const auto x = j.find("sliced_matmul_flops")) d.sliced_matmul_flops = x->number(0.0, d.peak_flops);
  if (const auto x = j.find("achievable_memory_bandwidth")) d.achievable_memory_bandwidth = x->number(0.0, d.memory_bandwidth);
  if (const auto x = j.find("context_bytes")) d.context_bytes = x->integer(0, d.memory_bytes);
  if (const auto x = j.find("communicator_bytes")) d.communicator_bytes = x->integer(0, d.memory_bytes);
  if (const auto x = j.find("pair_communicator_bytes")) d.pair_communicator_bytes = x->integer(0, d.memory_bytes);
  return d;
}

/// "backward", or the fraction as a number.
inline nlohmann::json to_json(const gradient_overlap_model& o) {
  return o.backward ? nlohmann::json("backward") : nlohmann::json(o.fraction);
}

/// "backward" or a number in [0, 1] (the only form before "backward" existed).
inline gradient_overlap_model gradient_overlap_from_json(const json_in& j) {
  if (j.raw().is_string() && j.raw().get<std::string>() == "backward") return gradient_overlap_model::behind_backward();
  if (!j.raw().is_number()) j.fail_expected("\"backward\" or a number in [0, 1]");
  return j.number(0.0, 1.0);
}

/// {"mode": "training", "device": {...}, "optimizer": "adam", "gradient_bucket_bytes": 26214400,
///  "gradient_overlap": "backward", "zero": true}
inline nlohmann::json to_json(const step_pricing& p) {
  return {{"mode", std::string(to_string(p.mode))},
          {"device", to_json(p.device)},
          {"optimizer", std::string(to_string(p.optimizer))},
          {"gradient_bucket_bytes", p.gradient_bucket_bytes},
          {"gradient_overlap", to_json(p.gradient_overlap)},
          {"zero", p.zero},
          {"micro_batch", p.micro_batch},
          {"micro_batches", p.micro_batches},
          {"recompute", std::string(to_string(p.recompute))},
          {"attention", std::string(to_string(p.attention))},
          {"achievable", p.achievable}};
}

/// How every plan was priced before micro-batches, recomputation, the attention kernel and
/// achievable compute were recorded: one step of the whole batch, nothing recomputed, the
/// attention core as the flash kernel's, compute at the peaks (step_pricing_from_json reads a
/// value without them so).
inline void set_before_micro_batches(step_pricing& p) {
  p.micro_batch = 0;
  p.micro_batches = 1;
  p.recompute = recompute_policy::none;
  p.attention = attention_kernel::flash;
  p.achievable = false;
}

/// The value to_json wrote, every member checked; io_error naming the JSON path otherwise.
inline step_pricing step_pricing_from_json(const json_in& j) {
  j.require_object();
  step_pricing p;
  p.mode = enum_value(j["mode"], all_run_modes);
  p.device = device_model_from_json(j["device"]);
  p.optimizer = enum_value(j["optimizer"], all_optimizer_kinds);
  p.gradient_bucket_bytes = j["gradient_bucket_bytes"].number(0.0, 1e18);
  p.gradient_overlap = gradient_overlap_from_json(j["gradient_overlap"]);
  p.zero = j["zero"].boolean();
  if (!j.has("micro_batches")) {  // written before they were recorded
    set_before_micro_batches(p);
    return p;
  }
  p.micro_batch = j["micro_batch"].small_integer(0, max_micro_batches);
  p.micro_batches = j["micro_batches"].small_integer(0, max_micro_batches);
  p.recompute = enum_value(j["recompute"], all_recompute_policies);
  p.attention = enum_value(j["attention"], all_attention_kernels);
  p.achievable = j["achievable"].boolean();
  return p;
}

}  // namespace autoshard
