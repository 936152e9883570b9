// Pipeline stages without a graph: the 1F1B and GPipe orders, the step they take (the bubble
// and the in-flight activations against their closed forms and hand-simulated cases), and the
// stage partition against every partition of small cases.
#include <doctest/doctest.h>

#include <autoshard/pass/pipeline.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace {

std::string order_text(autoshard::pipeline_schedule s, int stages, int stage, int m) {
  std::string out;
  for (const autoshard::pipeline_pass& p : autoshard::schedule_passes(s, stages, stage, m))
    out += (out.empty() ? "" : " ") + autoshard::to_string(p);
  return out;
}

/// The least slowest stage over every partition of `units` into `stages` that fits (brute force).
std::optional<double> brute_slowest(const std::vector<autoshard::stage_unit>& units, int stages, autoshard::pipeline_schedule s,
                                    int m, std::optional<std::int64_t> budget) {
  const int L = static_cast<int>(units.size());
  std::optional<double> best;
  std::vector<int> first(static_cast<std::size_t>(stages), 0);
  // Every choice of stages - 1 cut points among the L - 1 gaps, by bit mask.
  for (unsigned mask = 0; mask < (1u << (L - 1)); ++mask) {
    if (__builtin_popcount(mask) != stages - 1) continue;
    std::vector<int> starts{0};
    for (int g = 0; g < L - 1; ++g)
      if ((mask >> g) & 1u) starts.push_back(g + 1);
    double slowest = 0;
    bool ok = true;
    for (int k = 0; k < stages; ++k) {
      const int a = starts[static_cast<std::size_t>(k)], b = k + 1 < stages ? starts[static_cast<std::size_t>(k) + 1] : L;
      double t = 0;
      for (int i = a; i < b; ++i) t += units[static_cast<std::size_t>(i)].seconds;
      slowest = std::max(slowest, t);
      ok = ok && (!budget || autoshard::stage_memory(units, a, b - a, s, stages, k, m) <= *budget);
    }
    if (ok && (!best || slowest < *best)) best = slowest;
  }
  return best;
}

}  // namespace

TEST_CASE("pipeline: the 1F1B order is Megatron-LM's (Narayanan et al. 2021, figure 4: 4 stages, 8 micro-batches)") {
  using autoshard::pipeline_schedule;
  CHECK(order_text(pipeline_schedule::one_f_one_b, 4, 0, 8) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  CHECK(order_text(pipeline_schedule::one_f_one_b, 4, 1, 8) == "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
  CHECK(order_text(pipeline_schedule::one_f_one_b, 4, 3, 8) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
  // Fewer micro-batches than stages: the warm-up is every forward.
  CHECK(order_text(pipeline_schedule::one_f_one_b, 4, 0, 2) == "F0 F1 B0 B1");
  CHECK(order_text(pipeline_schedule::gpipe, 3, 1, 3) == "F0 F1 F2 B0 B1 B2");
  CHECK(autoshard::parse_pipeline_schedule("1f1b") == pipeline_schedule::one_f_one_b);
  CHECK(autoshard::parse_pipeline_schedule("gpipe") == pipeline_schedule::gpipe);
  CHECK_FALSE(autoshard::parse_pipeline_schedule("zb-h1"));
  CHECK_THROWS_AS(autoshard::schedule_passes(pipeline_schedule::one_f_one_b, 0, 0, 4), autoshard::solver_error);
  CHECK_THROWS_AS(autoshard::schedule_passes(pipeline_schedule::one_f_one_b, 2, 2, 4), autoshard::solver_error);
}

TEST_CASE("pipeline: a schedule of more than max_pipeline_micro_steps stage micro-steps is refused before it is sized") {
  // 2 stages of 2^30 micro-batches once took 4 GiB per simulated configuration (plan --pp auto
  // --batch 1073741824 ran out of memory); the bound is checked before any vector is sized.
  using autoshard::pipeline_schedule;
  const int m = 1 << 30;
  CHECK_THROWS_WITH_AS(autoshard::schedule_passes(pipeline_schedule::one_f_one_b, 2, 0, m),
                       doctest::Contains("a pipeline of 2 stages and 1073741824 micro-batches has more than 4194304 stage micro-steps"),
                       autoshard::solver_error);
  CHECK_THROWS_AS(autoshard::simulate_pipeline(pipeline_schedule::gpipe, {{1, 2}, {1, 2}}, {0.5}, m), autoshard::solver_error);
  CHECK_THROWS_AS(autoshard::partition_stages({}, 4, pipeline_schedule::one_f_one_b, 1 << 21), autoshard::solver_error);
  // The bound itself still runs.
  CHECK(autoshard::schedule_passes(pipeline_schedule::one_f_one_b, 2, 1, static_cast<int>(autoshard::max_pipeline_micro_steps / 2))
            .size() == static_cast<std::size_t>(autoshard::max_pipeline_micro_steps));
}

TEST_CASE("pipeline: equal stages take (m + p - 1)(f + b), a bubble of (p - 1)/m, and hold min(p - s, m) micro-batches") {
  using autoshard::pipeline_schedule;
  for (pipeline_schedule s : autoshard::all_pipeline_schedules)
    for (int p = 1; p <= 8; ++p)
      for (int m = 1; m <= 24; ++m) {
        CAPTURE(p);
        CAPTURE(m);
        const double f = 1.25, b = 2.5;  // exact in binary: the sums compare exactly
        const autoshard::pipeline_timeline t =
            autoshard::simulate_pipeline(s, std::vector<autoshard::stage_seconds>(static_cast<std::size_t>(p), {f, b}),
                                         std::vector<double>(static_cast<std::size_t>(p - 1), 0.0), m);
        CHECK(t.seconds == (m + p - 1) * (f + b));
        CHECK(t.ideal == m * (f + b));
        CHECK(t.bubble_fraction == doctest::Approx(autoshard::bubble_fraction(p, m)).epsilon(1e-12));
        CHECK(autoshard::bubble_fraction(p, m) == static_cast<double>(p - 1) / m);
        for (int k = 0; k < p; ++k) {
          const int closed = s == pipeline_schedule::gpipe ? m : std::min(p - k, m);
          CHECK(t.in_flight[static_cast<std::size_t>(k)] == closed);
          CHECK(autoshard::in_flight_micro_batches(s, p, k, m) == closed);
        }
      }
}

TEST_CASE("pipeline: transfers and unequal stages, simulated by hand") {
  using autoshard::pipeline_schedule;
  // p = 2, m = 2, f = 1, b = 2, a transfer 0.5. Stage 0 runs F0 F1 B0 B1, stage 1 F0 B0 F1 B1:
  // s0 F0 [0,1] F1 [1,2]; s1 F0 [1.5,2.5] B0 [2.5,4.5]; s0 B0 [5,7]; s1 F1 [4.5,5.5] B1 [5.5,7.5];
  // s0 B1 [8,10].
  autoshard::pipeline_timeline t = autoshard::simulate_pipeline(pipeline_schedule::one_f_one_b, {{1, 2}, {1, 2}}, {0.5}, 2);
  CHECK(t.seconds == 10.0);
  CHECK(t.finish == std::vector<double>{10.0, 7.5});
  // Equal stages with a transfer c on each boundary: every micro-batch's round trip pays 2 (p - 1) c
  // once, on the critical path of the first forward and the last backward.
  for (int p = 2; p <= 6; ++p)
    for (int m = p; m <= 12; ++m) {
      t = autoshard::simulate_pipeline(pipeline_schedule::one_f_one_b,
                                       std::vector<autoshard::stage_seconds>(static_cast<std::size_t>(p), {1, 2}),
                                       std::vector<double>(static_cast<std::size_t>(p - 1), 0.25), m);
      CHECK(t.seconds >= (m + p - 1) * 3.0 + 2 * (p - 1) * 0.25);
    }
  // Unequal stages: between the slowest stage's work and every pass run one after another (Alpa's
  // sum + (m - 1) max is not a bound for 1F1B: stages of f + b = 2+5, 4+2, 4+3, 1+6, 1+1 take 86 > 85 at m = 9).
  std::mt19937 rng(7);
  for (int it = 0; it < 300; ++it) {
    const int p = 1 + static_cast<int>(rng() % 6), m = 1 + static_cast<int>(rng() % 12);
    std::vector<autoshard::stage_seconds> st;
    double sum = 0, slowest = 0;
    for (int k = 0; k < p; ++k) {
      st.push_back({1.0 + rng() % 4, 1.0 + rng() % 6});
      sum += st.back().forward + st.back().backward;
      slowest = std::max(slowest, st.back().forward + st.back().backward);
    }
    t = autoshard::simulate_pipeline(pipeline_schedule::one_f_one_b, st, std::vector<double>(static_cast<std::size_t>(p - 1), 0.0), m);
    CHECK(t.seconds <= m * sum);
    CHECK(t.seconds >= m * slowest);
    for (int k = 0; k < p; ++k) CHECK(t.finish[static_cast<std::size_t>(k)] >= t.busy[static_cast<std::size_t>(k)]);
  }
  CHECK_THROWS_AS(autoshard::simulate_pipeline(pipeline_schedule::one_f_one_b, {{1, 2}, {1, 2}}, {}, 2), autoshard::solver_error);
  CHECK_THROWS_AS(autoshard::simulate_pipeline(pipeline_schedule::one_f_one_b, {{-1, 2}}, {}, 2), autoshard::solver_error);
}

TEST_CASE("pipeline: stage partition is the least slowest stage over every partition that fits") {
  using autoshard::pipeline_schedule;
  using autoshard::stage_unit;
  // 1..9 into 3 stages: [1..5] = 15, [6 7] = 13, [8 9] = 17; no partition has a slowest stage below 17.
  std::vector<stage_unit> units;
  for (int i = 1; i <= 9; ++i) units.push_back({static_cast<double>(i), 0, 0, 0});
  std::optional<autoshard::stage_partition> s = autoshard::partition_stages(units, 3, pipeline_schedule::one_f_one_b, 4);
  REQUIRE(s);
  CHECK(s->slowest == 17.0);
  CHECK(s->first == std::vector<int>{0, 5, 7});
  CHECK(s->count == std::vector<int>{5, 2, 2});
  // Equal layers and a memory budget: 1F1B keeps 2 micro-batches on stage 0 of 2 and 1 on stage 1,
  // so a budget of 60 for layers of 10 bytes each puts at most 3 layers first.
  units.assign(8, {1.0, 0, 10, 0});
  s = autoshard::partition_stages(units, 2, pipeline_schedule::one_f_one_b, 8);
  REQUIRE(s);
  CHECK(s->count == std::vector<int>{4, 4});
  s = autoshard::partition_stages(units, 2, pipeline_schedule::one_f_one_b, 8, 60);
  REQUIRE(s);
  CHECK(s->count == std::vector<int>{3, 5});
  CHECK(s->memory == std::vector<std::int64_t>{60, 50});
  CHECK(s->slowest == 5.0);
  // GPipe holds all 8 micro-batches: 80 bytes a layer, and no stage fits 60.
  CHECK_FALSE(autoshard::partition_stages(units, 2, pipeline_schedule::gpipe, 8, 60));
  CHECK_FALSE(autoshard::partition_stages(units, 9, pipeline_schedule::one_f_one_b, 8));  // more stages than units
  // Random cases against every partition.
  std::mt19937 rng(11);
  for (int it = 0; it < 400; ++it) {
    const int L = 1 + static_cast<int>(rng() % 9), p = 1 + static_cast<int>(rng() % L), m = 1 + static_cast<int>(rng() % 6);
    const pipeline_schedule sch = rng() % 2 ? pipeline_schedule::one_f_one_b : pipeline_schedule::gpipe;
    std::vector<stage_unit> u;
    for (int i = 0; i < L; ++i)
      u.push_back({static_cast<double>(rng() % 7), static_cast<std::int64_t>(rng() % 5), static_cast<std::int64_t>(rng() % 4),
                   static_cast<std::int64_t>(rng() % 6)});
    const std::optional<std::int64_t> budget =
        rng() % 3 ? std::optional<std::int64_t>(static_cast<std::int64_t>(rng() % 40)) : std::nullopt;
    CAPTURE(it);
    const std::optional<double> want = brute_slowest(u, p, sch, m, budget);
    const std::optional<autoshard::stage_partition> got = autoshard::partition_stages(u, p, sch, m, budget);
    REQUIRE(want.has_value() == got.has_value());
    if (!got) continue;
    CHECK(got->slowest == *want);
    int total = 0;
    for (int k = 0; k < p; ++k) {
      CHECK(got->count[static_cast<std::size_t>(k)] >= 1);
      CHECK(got->first[static_cast<std::size_t>(k)] == total);
      total += got->count[static_cast<std::size_t>(k)];
      if (budget) CHECK(got->memory[static_cast<std::size_t>(k)] <= *budget);
    }
    CHECK(total == L);
  }
}

TEST_CASE("pipeline: one stage has no bubble, whatever the rounding of its micro-batches' sum") {
  // 0.1 + 0.2 is not exact in binary: m additions of it differ from m times it in the last bit,
  // once above and once below; the bubble is never negative.
  for (int m = 1; m <= 64; ++m) {
    CAPTURE(m);
    const autoshard::pipeline_timeline t = autoshard::simulate_pipeline(
        autoshard::pipeline_schedule::one_f_one_b, std::vector<autoshard::stage_seconds>(1, {0.1, 0.2}), {}, m);
    CHECK(t.bubble_fraction >= 0.0);
    CHECK(t.bubble_fraction == doctest::Approx(0.0).epsilon(1e-12));
  }
}
