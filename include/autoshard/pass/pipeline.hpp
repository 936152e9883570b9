#pragma once
/// Pipeline parallelism without a graph: the order each stage runs its micro-batches' passes
/// in (1F1B, or GPipe's all-forwards-then-all-backwards), the step that order takes when each
/// stage's passes and each boundary's transfer take given times, and the partition of a
/// sequence of layers into stages that balances their cost under a memory budget.
///   using namespace autoshard;
///   std::vector<pipeline_pass> order = schedule_passes(pipeline_schedule::one_f_one_b, 4, 0, 8);
///   // stage 0 of 4, 8 micro-batches: F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7
///   pipeline_timeline t = simulate_pipeline(pipeline_schedule::one_f_one_b, {{1, 2}, {1, 2}}, {0.0}, 8);
///   t.seconds;  // (m + p - 1)(f + b) = 9 x 3 = 27 for equal stages and free transfers
///   std::optional<stage_partition> s = partition_stages(units, 4, pipeline_schedule::one_f_one_b, 8, budget);
///
/// The schedules (Narayanan et al. 2021, section 2.2): in 1F1B stage s of p first runs
/// min(p - s - 1, m) forwards (the warm-up), then alternates one forward and one backward
/// until every forward has run, then runs the backwards left (the cool-down); so stage s holds
/// the activations of at most min(p - s, m) micro-batches at once, p on the first stage. GPipe
/// runs every forward and then every backward, holding all m. Both take (m + p - 1)(f + b)
/// for p equal stages of forward f and backward b per micro-batch when transfers are free:
/// the ideal m (f + b) and a bubble of (p - 1)/m of it.
///
/// The simulation walks exactly the orders schedule_passes gives (the executor runs the same
/// ones): a stage starts its next pass when it has finished the one before and the pass's
/// input has arrived: a forward's activation from the stage before, a backward's gradient
/// from the stage after, each a point-to-point transfer on the pipeline axis's link taking
/// the boundary's seconds (they delay the receiver; the sender goes on with its next pass).
///
/// The partition (Alpa's inter-operator dynamic programme, Zheng et al. 2022, section 5.2, for
/// stages on sub-meshes of one shape): consecutive units (a model's embedding, its layers, its
/// head) go to p non-empty stages. A stage's time per micro-batch is the sum of its units',
/// so the sum over stages is the same for every partition and Alpa's objective, the sum of
/// the stage times plus (m - 1) times the slowest, is least where the slowest stage is
/// fastest: partition_stages finds that partition exactly (the least cap over every segment
/// sum at which a partition exists, each tried in O(p L)), among those whose every stage fits
/// the budget with the activations its schedule keeps in flight. Repeated layers make it cheap:
/// the candidate caps are few distinct sums.
#include <algorithm>    // std::min, std::max, std::sort, std::unique, std::lower_bound
#include <cstdint>      // std::int64_t, std::uint8_t
#include <limits>       // std::numeric_limits
#include <optional>     // std::optional
#include <string>       // std::string, std::to_string
#include <string_view>  // std::string_view
#include <vector>       // std::vector

#include "../core/error.hpp"      // solver_error
#include "../plan/pipeline.hpp"   // pipeline_schedule (a plan file records it)

namespace autoshard {

/// One pass of one micro-batch through one stage.
struct pipeline_pass {
  bool backward = false;
  int micro_batch = 0;
  friend constexpr bool operator==(const pipeline_pass&, const pipeline_pass&) = default;
};

/// "F3" or "B3".
inline std::string to_string(const pipeline_pass& p) { return (p.backward ? "B" : "F") + std::to_string(p.micro_batch); }

/// The most stage micro-steps (stages x micro-batches) a pipeline's schedule is built and
/// simulated for: its timeline takes 32 bytes each (2^22: 128 MiB), far above any schedule run
/// (Megatron-LM's largest, 128 stages of 2,048 micro-batches, is 2^18). A global batch of 2^30
/// sequences made `plan --pp auto` simulate 2^27 micro-batches per stage and run out of memory.
inline constexpr std::int64_t max_pipeline_micro_steps = std::int64_t{1} << 22;

namespace detail {
inline void check_pipeline_shape(int stages, std::int64_t micro_batches) {
  if (stages < 1 || micro_batches < 1)
    throw solver_error("a pipeline needs at least one stage and one micro-batch, got " + std::to_string(stages) + " stages and " +
                       std::to_string(micro_batches) + " micro-batches");
  if (micro_batches > max_pipeline_micro_steps / stages)
    throw solver_error("a pipeline of " + std::to_string(stages) + " stages and " + std::to_string(micro_batches) +
                       " micro-batches has more than " + std::to_string(max_pipeline_micro_steps) +
                       " stage micro-steps (max_pipeline_micro_steps), which its schedule is not simulated for: "
                       "use larger micro-batches or a smaller global batch");
}
}  // namespace detail

/// The passes stage `stage` of `stages` runs, in order, for `micro_batches` micro-batches
/// (see the header comment): 2 m passes, every micro-batch's forward before its backward.
inline std::vector<pipeline_pass> schedule_passes(pipeline_schedule s, int stages, int stage, int micro_batches) {
  detail::check_pipeline_shape(stages, micro_batches);
  if (stage < 0 || stage >= stages)
    throw solver_error("stage " + std::to_string(stage) + " is not one of the pipeline's " + std::to_string(stages));
  const int m = micro_batches;
  std::vector<pipeline_pass> out;
  out.reserve(2 * static_cast<std::size_t>(m));
  const int warm = s == pipeline_schedule::gpipe ? m : std::min(stages - stage - 1, m);
  for (int j = 0; j < warm; ++j) out.push_back({false, j});
  for (int j = 0; j < m - warm; ++j) {  // the steady state: one forward, one backward
    out.push_back({false, warm + j});
    out.push_back({true, j});
  }
  for (int j = m - warm; j < m; ++j) out.push_back({true, j});
  return out;
}

/// The bubble of p equal stages over m micro-batches, as a fraction of the ideal step
/// m (f + b): (p - 1) / m (Narayanan et al. 2021, section 2.2.1; the same for GPipe).
constexpr double bubble_fraction(int stages, int micro_batches) noexcept {
  return micro_batches > 0 ? static_cast<double>(stages - 1) / micro_batches : 0.0;
}

/// What one stage's passes take per micro-batch (seconds; the backward includes any
/// recomputation of the forward).
struct stage_seconds {
  double forward = 0.0;
  double backward = 0.0;
};

/// A pipeline's step as simulated.
struct pipeline_timeline {
  double seconds = 0.0;               ///< from the first forward's start to the last backward's end
  std::vector<double> finish;         ///< per stage: when its last pass ends
  std::vector<double> busy;           ///< per stage: m (f + b)
  std::vector<int> in_flight;         ///< per stage: the most micro-batches held at once
  double ideal = 0.0;                 ///< m times the slowest stage's f + b
  /// seconds / ideal - 1: (p - 1)/m for equal stages and free transfers.
  double bubble_fraction = 0.0;
};

/// The step of `stages.size()` stages running `micro_batches` micro-batches under `s`, where
/// `boundary[k]` is the seconds of one point-to-point transfer between stages k and k + 1 (an
/// activation forward, its gradient back: the same bytes). See the header comment.
inline pipeline_timeline simulate_pipeline(pipeline_schedule s, const std::vector<stage_seconds>& stages,
                                           const std::vector<double>& boundary, int micro_batches) {
  const int p = static_cast<int>(stages.size());
  detail::check_pipeline_shape(p, micro_batches);
  if (boundary.size() + 1 != stages.size())
    throw solver_error("a pipeline of " + std::to_string(p) + " stages has " + std::to_string(p - 1) + " boundaries, got " +
                       std::to_string(boundary.size()) + " transfer times");
  for (const stage_seconds& x : stages)
    if (!(x.forward >= 0 && x.backward >= 0 && x.forward < 1e30 && x.backward < 1e30))
      throw solver_error("a stage's pass takes a finite time >= 0, got forward " + std::to_string(x.forward) + " s and backward " +
                         std::to_string(x.backward) + " s");
  for (double c : boundary)
    if (!(c >= 0 && c < 1e30)) throw solver_error("a transfer takes a finite time >= 0, got " + std::to_string(c) + " s");
  const auto m = static_cast<std::size_t>(micro_batches);
  constexpr double unknown = -1.0;
  // done[stage][pass kind][micro-batch]: when it finished (unknown until it has).
  std::vector<std::vector<double>> fwd(stages.size(), std::vector<double>(m, unknown)), bwd = fwd;
  std::vector<std::vector<pipeline_pass>> order(stages.size());
  std::vector<std::size_t> next(stages.size(), 0);
  std::vector<double> free_at(stages.size(), 0.0);
  pipeline_timeline t;
  t.in_flight.assign(stages.size(), 0);
  for (int k = 0; k < p; ++k) {
    order[static_cast<std::size_t>(k)] = schedule_passes(s, p, k, micro_batches);
    int held = 0;
    for (const pipeline_pass& x : order[static_cast<std::size_t>(k)])
      t.in_flight[static_cast<std::size_t>(k)] = std::max(t.in_flight[static_cast<std::size_t>(k)], held += x.backward ? -1 : 1);
  }
  std::size_t left = 2 * m * stages.size();
  while (left > 0) {
    bool moved = false;
    for (std::size_t k = 0; k < stages.size(); ++k)
      while (next[k] < order[k].size()) {
        const pipeline_pass& x = order[k][next[k]];
        const auto j = static_cast<std::size_t>(x.micro_batch);
        double ready = 0.0;  // when its input is here
        if (!x.backward && k > 0) ready = fwd[k - 1][j] == unknown ? unknown : fwd[k - 1][j] + boundary[k - 1];
        if (x.backward && k + 1 < stages.size()) ready = bwd[k + 1][j] == unknown ? unknown : bwd[k + 1][j] + boundary[k];
        if (ready == unknown) break;
        const double start = std::max(ready, free_at[k]);
        free_at[k] = start + (x.backward ? stages[k].backward : stages[k].forward);
        (x.backward ? bwd : fwd)[k][j] = free_at[k];
        ++next[k];
        --left;
        moved = true;
      }
    if (!moved) throw solver_error("the pipeline schedule " + std::string(to_string(s)) + " deadlocks");  // cannot happen
  }
  double slowest = 0.0;
  for (std::size_t k = 0; k < stages.size(); ++k) {
    t.finish.push_back(free_at[k]);
    t.busy.push_back(static_cast<double>(m) * (stages[k].forward + stages[k].backward));
    t.seconds = std::max(t.seconds, free_at[k]);
    slowest = std::max(slowest, stages[k].forward + stages[k].backward);
  }
  t.ideal = static_cast<double>(m) * slowest;
  // Never below the ideal: a negative fraction is the rounding of m additions against a product.
  t.bubble_fraction = t.ideal > 0 ? std::max(0.0, t.seconds / t.ideal - 1.0) : 0.0;
  return t;
}

// ---- stages: the partition of consecutive units ---------------------------------------------

/// One unit of a model the partition keeps whole (an embedding, a layer, a head), per device
/// of the sub-mesh a stage runs on.
struct stage_unit {
  double seconds = 0.0;                ///< forward and backward of one micro-batch
  std::int64_t state_bytes = 0;        ///< held throughout: parameters, gradients, optimizer state
  std::int64_t activation_bytes = 0;   ///< kept for the backward per micro-batch in flight
  std::int64_t transient_bytes = 0;    ///< live only while it runs (a recomputed layer's working set)
};

/// Stages of consecutive units.
struct stage_partition {
  std::vector<int> first;              ///< per stage: the index of its first unit (first[0] == 0)
  std::vector<int> count;              ///< per stage: how many units it has
  std::vector<double> seconds;         ///< per stage: its units' seconds per micro-batch
  std::vector<std::int64_t> memory;    ///< per stage: its peak bytes per device under the schedule
  double slowest = 0.0;                ///< the largest of `seconds`
};

/// The bytes a stage of units [first, first + count) needs as stage `stage` of `stages` under
/// schedule `s` with `micro_batches` micro-batches: its state, its activations times the
/// micro-batches it holds in flight, and its largest transient.
inline std::int64_t stage_memory(const std::vector<stage_unit>& units, int first, int count, pipeline_schedule s, int stages,
                                 int stage, int micro_batches) {
  std::int64_t state = 0, act = 0, transient = 0;
  for (int i = first; i < first + count; ++i) {
    const stage_unit& u = units[static_cast<std::size_t>(i)];
    state += u.state_bytes;
    act += u.activation_bytes;
    transient = std::max(transient, u.transient_bytes);
  }
  return state + in_flight_micro_batches(s, stages, stage, micro_batches) * act + transient;
}

namespace detail {
/// Range sums of units in O(1): prefix sums of times and bytes, and a sparse table of the
/// largest transient.
class unit_sums {
 public:
  explicit unit_sums(const std::vector<stage_unit>& units) {
    const std::size_t n = units.size();
    time_.assign(n + 1, 0.0);
    state_.assign(n + 1, 0);
    act_.assign(n + 1, 0);
    for (std::size_t i = 0; i < n; ++i) {
      time_[i + 1] = time_[i] + units[i].seconds;
      state_[i + 1] = state_[i] + units[i].state_bytes;
      act_[i + 1] = act_[i] + units[i].activation_bytes;
    }
    peak_.emplace_back();
    for (const stage_unit& u : units) peak_[0].push_back(u.transient_bytes);
    for (std::size_t w = 1; 2 * w <= n; w *= 2) {
      const std::vector<std::int64_t>& prev = peak_.back();
      std::vector<std::int64_t> level(n - 2 * w + 1);
      for (std::size_t i = 0; i < level.size(); ++i) level[i] = std::max(prev[i], prev[i + w]);
      peak_.push_back(std::move(level));
    }
  }
  /// Seconds of units [i, j).
  double seconds(int i, int j) const { return time_[static_cast<std::size_t>(j)] - time_[static_cast<std::size_t>(i)]; }
  /// Bytes of units [i, j) (j > i) holding `in_flight` micro-batches of activations.
  std::int64_t memory(int i, int j, int in_flight) const {
    const auto a = static_cast<std::size_t>(i), b = static_cast<std::size_t>(j);
    std::size_t level = 0;
    while ((std::size_t{2} << level) <= b - a) ++level;
    const std::int64_t transient = std::max(peak_[level][a], peak_[level][b - (std::size_t{1} << level)]);
    return state_[b] - state_[a] + in_flight * (act_[b] - act_[a]) + transient;
  }

 private:
  std::vector<double> time_;
  std::vector<std::int64_t> state_, act_;
  std::vector<std::vector<std::int64_t>> peak_;  // peak_[k][i]: the largest of units [i, i + 2^k)
};
}  // namespace detail

/// The partition of `units` into `stages` non-empty stages of consecutive units whose slowest
/// stage is fastest, among those whose every stage fits `budget` bytes per device under
/// schedule `s` (see the header comment); nullopt when none fits (or there are fewer units
/// than stages). Ties go to the partition with the latest boundaries.
inline std::optional<stage_partition> partition_stages(const std::vector<stage_unit>& units, int stages, pipeline_schedule s,
                                                       int micro_batches, std::optional<std::int64_t> budget = std::nullopt) {
  detail::check_pipeline_shape(stages, micro_batches);
  const int L = static_cast<int>(units.size());
  if (L < stages) return std::nullopt;
  for (const stage_unit& u : units)
    if (!(u.seconds >= 0 && u.seconds < 1e30) || u.state_bytes < 0 || u.activation_bytes < 0 || u.transient_bytes < 0)
      throw solver_error("a stage unit needs a finite time >= 0 and byte counts >= 0");
  const detail::unit_sums sums(units);
  const auto sum = [&sums](int i, int j) { return sums.seconds(i, j); };
  const auto fits = [&](int stage, int i, int j) {
    return !budget || sums.memory(i, j, in_flight_micro_batches(s, stages, stage, micro_batches)) <= *budget;
  };
  // pred[stage + 1][j]: the start of the last stage of a partition of units [0, j) into stage + 1
  // stages under `cap`, or -1 when there is none.
  std::vector<std::vector<int>> pred;
  const auto feasible = [&](double cap) {
    pred.assign(static_cast<std::size_t>(stages) + 1, std::vector<int>(static_cast<std::size_t>(L) + 1, -1));
    pred[0][0] = 0;
    for (int k = 0; k < stages; ++k) {
      // reach(i): the last end j such that [i, j) fits as stage k; nondecreasing in i, since a
      // stage's time and memory only grow with its units. Sweep j keeping the latest reachable
      // start before it: the one that reaches furthest.
      const auto& from = pred[static_cast<std::size_t>(k)];
      auto& to = pred[static_cast<std::size_t>(k) + 1];
      int start = -1, reach = 0;
      const int last_end = L - (stages - k - 1);  // leave a unit for every later stage
      for (int j = k + 1; j <= last_end; ++j) {
        if (from[static_cast<std::size_t>(j) - 1] >= 0) {
          start = j - 1;
          reach = std::max(reach, start);
        }
        if (start < 0) continue;
        while (reach < last_end && sum(start, reach + 1) <= cap && fits(k, start, reach + 1)) ++reach;
        if (reach >= j) to[static_cast<std::size_t>(j)] = start;
      }
    }
    return pred[static_cast<std::size_t>(stages)][static_cast<std::size_t>(L)] >= 0;
  };
  std::vector<double> caps;
  caps.reserve(static_cast<std::size_t>(L) * static_cast<std::size_t>(L + 1) / 2);
  for (int i = 0; i < L; ++i)
    for (int j = i + 1; j <= L; ++j) caps.push_back(sum(i, j));
  std::sort(caps.begin(), caps.end());
  caps.erase(std::unique(caps.begin(), caps.end()), caps.end());
  // The least feasible cap: feasibility only grows with the cap.
  std::size_t lo = 0, hi = caps.size();
  while (lo < hi) {
    const std::size_t mid = lo + (hi - lo) / 2;
    if (feasible(caps[mid])) hi = mid;
    else lo = mid + 1;
  }
  if (lo == caps.size() || !feasible(caps[lo])) return std::nullopt;
  stage_partition out;
  out.first.assign(static_cast<std::size_t>(stages), 0);
  int end = L;
  for (int k = stages; k > 0; --k) {
    const int start = pred[static_cast<std::size_t>(k)][static_cast<std::size_t>(end)];
    out.first[static_cast<std::size_t>(k) - 1] = start;
    end = start;
  }
  for (int k = 0; k < stages; ++k) {
    const int a = out.first[static_cast<std::size_t>(k)];
    const int b = k + 1 < stages ? out.first[static_cast<std::size_t>(k) + 1] : L;
    out.count.push_back(b - a);
    out.seconds.push_back(sum(a, b));
    out.memory.push_back(stage_memory(units, a, b - a, s, stages, k, micro_batches));
    out.slowest = std::max(out.slowest, out.seconds.back());
  }
  return out;
}

}  // namespace autoshard
