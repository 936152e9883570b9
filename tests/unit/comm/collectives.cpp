// Gloo collectives on real ranks (threads over loopback TCP), every dtype and op, and
// what happens when a peer dies or never joins.
#include <doctest/doctest.h>

#include <autoshard/gloo/gloo.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

using namespace autoshard;
using namespace std::chrono_literals;

namespace {

gloo_options fast_fail() {
  gloo_options o;
  o.timeout = 3000ms;
  return o;
}

// Rank r's value of element i, exactly representable in every dtype tested.
double value_of(int r, std::size_t i) { return static_cast<double>((r * 7 + static_cast<int>(i) * 3) % 23) - 11.0; }

template <class T>
std::vector<T> rank_values(int r, std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<T>(value_of(r, i));
  return v;
}

// Threads of this process right now (gloo's device loops included).
std::size_t live_threads() {
  std::size_t n = 0;
  for ([[maybe_unused]] auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
}

}  // namespace

TEST_CASE_TEMPLATE("all-reduce sum/max/min over 8 ranks", T, float, double, std::int32_t, std::int64_t) {
  constexpr int n = 8;
  constexpr std::size_t len = 37;
  run_ranks(n, [&](gloo_communicator& c) {
    for (reduce_op op : {reduce_op::sum, reduce_op::max, reduce_op::min}) {
      auto v = rank_values<T>(c.rank(), len);
      all_reduce(c, std::span<T>(v), op);
      for (std::size_t i = 0; i < len; ++i) {
        double expect = value_of(0, i);
        for (int r = 1; r < n; ++r) {
          const double x = value_of(r, i);
          expect = op == reduce_op::sum ? expect + x : op == reduce_op::max ? std::max(expect, x) : std::min(expect, x);
        }
        REQUIRE(static_cast<double>(v[i]) == expect);
      }
    }
  });
}

TEST_CASE("all-reduce of f16 and bf16 reduces through float") {
  run_ranks(4, [](gloo_communicator& c) {
    for (dtype t : {dtype::f16, dtype::bf16}) {
      auto to = t == dtype::f16 ? float_to_f16 : float_to_bf16;
      auto from = t == dtype::f16 ? f16_to_float : bf16_to_float;
      std::vector<std::uint16_t> v(19);
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = to(static_cast<float>(value_of(c.rank(), i)) * 0.5f);
      c.all_reduce(v.data(), v.size(), t, reduce_op::sum);
      for (std::size_t i = 0; i < v.size(); ++i) {
        float expect = 0;
        for (int r = 0; r < 4; ++r) expect += static_cast<float>(value_of(r, i)) * 0.5f;
        REQUIRE(from(v[i]) == expect);
      }
    }
  });
}

TEST_CASE("half conversions round to nearest even") {
  CHECK(float_to_f16(1.0f) == 0x3c00);
  CHECK(float_to_f16(-2.0f) == 0xc000);
  CHECK(float_to_f16(65504.0f) == 0x7bff);
  CHECK(float_to_f16(1e6f) == 0x7c00);
  CHECK(float_to_f16(1.0f + 1.0f / 2048.0f) == 0x3c00);               // tie, to even
  CHECK(float_to_f16(1.0f + 3.0f / 2048.0f) == 0x3c02);               // tie, to even (up)
  CHECK(f16_to_float(0x0001) == std::ldexp(1.0f, -24));                 // smallest subnormal
  CHECK(float_to_f16(std::ldexp(1.0f, -24)) == 0x0001);
  CHECK(float_to_f16(std::ldexp(3.0f, -16)) == f16_t{0x0300}.bits);     // subnormal 3*2^-16
  for (std::uint32_t h = 0; h < 0x7c00u; ++h) REQUIRE(float_to_f16(f16_to_float(static_cast<std::uint16_t>(h))) == h);
  CHECK(float_to_bf16(1.0f) == 0x3f80);
  CHECK(bf16_to_float(float_to_bf16(3.140625f)) == 3.140625f);
  CHECK(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
}

TEST_CASE("all-gather, reduce-scatter, all-to-all, broadcast, barrier") {
  constexpr int n = 6;
  run_ranks(n, [](gloo_communicator& c) {
    const int r = c.rank();
    const std::size_t len = 5;
    auto mine = rank_values<std::int64_t>(r, len);

    std::vector<std::int64_t> gathered(len * n);
    all_gather(c, std::span<const std::int64_t>(mine), std::span<std::int64_t>(gathered));
    for (int q = 0; q < n; ++q)
      for (std::size_t i = 0; i < len; ++i) REQUIRE(gathered[static_cast<std::size_t>(q) * len + i] == value_of(q, i));

    auto big = rank_values<double>(r, len * n);
    std::vector<double> block(len);
    reduce_scatter(c, std::span<const double>(big), std::span<double>(block), reduce_op::max);
    for (std::size_t i = 0; i < len; ++i) {
      double expect = -1e9;
      for (int q = 0; q < n; ++q) expect = std::max(expect, value_of(q, static_cast<std::size_t>(r) * len + i));
      REQUIRE(block[i] == expect);
    }

    // Block j of rank q's input is 100*q + j; rank r receives 100*q + r from each q.
    std::vector<std::int32_t> in(len * n), out(len * n);
    for (int j = 0; j < n; ++j)
      for (std::size_t i = 0; i < len; ++i) in[static_cast<std::size_t>(j) * len + i] = 100 * r + j + 1000 * static_cast<int>(i);
    all_to_all(c, std::span<const std::int32_t>(in), std::span<std::int32_t>(out));
    for (int q = 0; q < n; ++q)
      for (std::size_t i = 0; i < len; ++i) REQUIRE(out[static_cast<std::size_t>(q) * len + i] == 100 * q + r + 1000 * static_cast<int>(i));

    std::vector<float> b(len, static_cast<float>(r));
    broadcast(c, std::span<float>(b), 3);
    for (float x : b) REQUIRE(x == 3.0f);
    c.barrier();
  });
}

TEST_CASE("axis sub-communicators of a 2x2x2 mesh hold the device_mesh groups") {
  const device_mesh mesh{2, 2, 2};
  run_ranks(8, [&](gloo_communicator& w) {
    mesh_communicator mc(std::move(w), mesh);
    for (std::size_t a = 0; a < 3; ++a) {
      auto& c = mc.axis(a);
      REQUIRE(c.size() == 2);
      REQUIRE(c.members() == mesh.group(a, mc.rank()));
      REQUIRE(c.rank() == mesh.coordinate(mc.rank())[a]);
      std::int64_t g[2] = {0, 0};
      const std::int64_t me = mc.rank();
      c.all_gather(&me, g, 1, dtype::i64);
      CHECK(g[0] == mesh.group(a, mc.rank())[0]);
      CHECK(g[1] == mesh.group(a, mc.rank())[1]);
    }
  });
}

TEST_CASE("a rank that dies mid-collective makes the others fail with comm_error") {
  constexpr int n = 4;
  const std::size_t threads_before = live_threads();
  const auto start = std::chrono::steady_clock::now();
  auto results = run_ranks_collect(
      n,
      [](gloo_communicator& c) {
        std::vector<float> v(1000, 1.0f);
        c.all_reduce(v.data(), v.size(), dtype::f32, reduce_op::sum);  // everyone is connected
        if (c.rank() == 2) return;  // leaves: its communicator (and sockets) go away
        for (int i = 0; i < 3; ++i) c.all_reduce(v.data(), v.size(), dtype::f32, reduce_op::sum);
      },
      fast_fail());
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(took < 6s);
  CHECK(live_threads() == threads_before);  // rank threads and gloo's loops are all gone
  CHECK_FALSE(results[2]);
  for (int r : {0, 1, 3}) {
    REQUIRE(results[static_cast<std::size_t>(r)]);
    const std::string m = message_of(results[static_cast<std::size_t>(r)]);
    CHECK_THROWS_AS(std::rethrow_exception(results[static_cast<std::size_t>(r)]), comm_error);
    CHECK(m.find("rank " + std::to_string(r)) != std::string::npos);
    CHECK(m.find("all-reduce") != std::string::npos);
  }
}

TEST_CASE("a rank that never joins makes the others fail with comm_error within the timeout") {
  const auto start = std::chrono::steady_clock::now();
  auto results = run_ranks_collect(
      3,
      [](int rank, const gloo_store& store, const gloo_options& opts) {
        if (rank == 1) return;
        auto c = gloo_communicator::connect(store, rank, 3, opts);
        c.barrier();
      },
      fast_fail());
  CHECK(std::chrono::steady_clock::now() - start < 6s);  // 3 s timeout, plus a loaded machine's slack
  CHECK_FALSE(results[1]);
  for (int r : {0, 2}) {
    REQUIRE(results[static_cast<std::size_t>(r)]);
    CHECK_THROWS_AS(std::rethrow_exception(results[static_cast<std::size_t>(r)]), comm_error);
    const std::string m = message_of(results[static_cast<std::size_t>(r)]);
    CHECK(m.find("rank " + std::to_string(r) + ": connecting 3 ranks") != std::string::npos);
    CHECK(m.find("rank(s) [1] did not join") != std::string::npos);
    // The whole time-out, not the store's words for its last 100 ms wait ("timed out after 0.03 s").
    CHECK(m.find(" ms (") == std::string::npos);
    CHECK(m.find("timed out after") == std::string::npos);
  }
}

TEST_CASE("a rank that stops calling (but stays connected) times out the others") {
  const auto start = std::chrono::steady_clock::now();
  auto results = run_ranks_collect(
      3,
      [](gloo_communicator& c) {
        c.barrier();
        if (c.rank() == 0) {
          std::this_thread::sleep_for(2500ms);  // alive, but silent past the others' timeout
          return;
        }
        std::vector<double> v(10, 1.0);
        c.all_gather(v.data(), std::vector<double>(30).data(), 10, dtype::f64);
      },
      [] { auto o = fast_fail(); o.timeout = 1000ms; return o; }());
  CHECK(std::chrono::steady_clock::now() - start < 6s);
  for (int r : {1, 2}) {
    REQUIRE(results[static_cast<std::size_t>(r)]);
    CHECK(message_of(results[static_cast<std::size_t>(r)]).find("all-gather") != std::string::npos);
  }
}

TEST_CASE("ranks as forked processes meet through a FileStore named by the environment") {
  // Every child checks its own result and exits 0 only if it is right.
  const int failed = spawn_ranks(4, [](int rank) {
    gloo_communicator c = connect_from_env();
    if (c.rank() != rank || c.size() != 4) return 2;
    std::vector<std::int32_t> v(100, rank + 1);
    all_reduce(c, std::span<std::int32_t>(v));
    for (auto x : v)
      if (x != 1 + 2 + 3 + 4) return 3;
    c.barrier();
    return 0;
  });
  CHECK(failed == 0);
}

TEST_CASE("a process that exits mid-run makes the other processes fail with comm_error") {
  const int failed = spawn_ranks(
      3,
      [](int rank) {
        gloo_options o;
        o.timeout = 3000ms;
        gloo_communicator c = connect_from_env(o);
        std::vector<float> v(4096, 1.0f);
        if (rank == 1) {
          c.all_reduce(v.data(), v.size(), dtype::f32, reduce_op::sum);
          std::_Exit(0);  // dies without closing anything
        }
        const auto start = std::chrono::steady_clock::now();
        try {
          // The first all-reduce is in the try too: rank 1 may exit while its last bytes of
          // that one are still on their way (its socket then resets), so it can fail as well.
          for (int i = 0; i < 101; ++i) c.all_reduce(v.data(), v.size(), dtype::f32, reduce_op::sum);
        } catch (const comm_error& e) {
          const std::string m = e.what();
          const bool named = m.find("rank " + std::to_string(rank)) != std::string::npos &&
                             m.find("all-reduce") != std::string::npos;
          if (!named) std::fprintf(stderr, "rank %d: comm_error without its rank and 'all-reduce': %s\n", rank, m.c_str());
          return named && std::chrono::steady_clock::now() - start < 6s ? 0 : 4;
        }
        return 5;  // no error: wrong
      },
      30s);
  CHECK(failed == 0);
}

TEST_CASE("connect_from_env names what is missing") {
  unsetenv("AUTOSHARD_STORE");
  unsetenv("MASTER_ADDR");
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "x2", 1);
  CHECK_THROWS_WITH_AS(connect_from_env(), doctest::Contains("WORLD_SIZE='x2' is not an integer"), comm_error);
  setenv("WORLD_SIZE", "2", 1);
  CHECK_THROWS_WITH_AS(connect_from_env(), doctest::Contains("MASTER_ADDR is not set"), comm_error);
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
}

TEST_CASE("the alpha-beta fit recovers a known link exactly") {
  const link_model truth{7e-6, 3e9};
  std::vector<calibration_sample> s;
  for (collective kind : {collective::all_reduce, collective::all_gather, collective::reduce_scatter})
    for (double b : {4096.0, 65536.0, 1048576.0}) s.push_back({kind, b, collective_time(kind, truth, 4, b), false});
  s.push_back({collective::all_reduce, 1e9, 123.0, true});  // held out: ignored by the fit
  const link_model fit = detail::fit_alpha_beta(s, 4);
  CHECK(fit.alpha == doctest::Approx(truth.alpha).epsilon(1e-9));
  CHECK(fit.beta == doctest::Approx(truth.beta).epsilon(1e-9));
  CHECK(fit.hop == doctest::Approx(0.0));
}

TEST_CASE("the fit separates the per-collective alpha from the per-step hop") {
  // All-reduce has 2(k-1) ring steps, all-gather and reduce-scatter k-1: mixing them pins both.
  const link_model truth{6e-6, 40e9, 1.5e-6};
  std::vector<calibration_sample> s;
  for (collective kind : {collective::all_reduce, collective::all_gather, collective::reduce_scatter})
    for (double b : {4096.0, 65536.0, 1048576.0}) s.push_back({kind, b, collective_time(kind, truth, 8, b), false});
  const link_model fit = detail::fit_alpha_beta(s, 8);
  CHECK(fit.alpha == doctest::Approx(truth.alpha).epsilon(1e-6));
  CHECK(fit.hop == doctest::Approx(truth.hop).epsilon(1e-6));
  CHECK(fit.beta == doctest::Approx(truth.beta).epsilon(1e-6));
  // One kind alone cannot tell alpha from hop: hop is 0 and alpha absorbs the steps.
  std::vector<calibration_sample> ag;
  for (const auto& x : s)
    if (x.kind == collective::all_gather) ag.push_back(x);
  const link_model one = detail::fit_alpha_beta(ag, 8);
  CHECK(one.hop == 0.0);
  CHECK(one.alpha == doctest::Approx(truth.alpha + 7 * truth.hop).epsilon(1e-6));
}

TEST_CASE("numbers: the fit is a link a plan prices and a calibration file holds") {
  const auto samples = [](double alpha, double seconds_per_byte) {
    std::vector<calibration_sample> s;
    for (double b : {4096.0, 32768.0, 262144.0, 1048576.0, 4194304.0})
      s.push_back({collective::all_reduce, b, alpha + b * seconds_per_byte, false});
    return s;
  };
  // A fast link whose bytes the latency swamps: a slope of 1e-20 s a byte was a bandwidth of
  // about 1e20 B/s, and the file calibrate wrote was refused by its reader ("bandwidth_Bps is
  // 1e+20, not a number in [1, 1e+18]").
  const link_model fast = detail::fit_alpha_beta(samples(1e-3, 1e-20), 2);
  CHECK(fast.beta == max_link_bandwidth);
  CHECK(fast.alpha == doctest::Approx(1e-3));
  calibration_result r;
  r.mesh = device_mesh{2};
  r.mesh.set_link(0, fast);
  r.axes.push_back({0, 2, true, 0, 0, samples(1e-3, 1e-20)});
  CHECK(calibration_from_json(calibration_to_json(r)).mesh.link(0) == fast);
  // Slower than any link a plan prices (half a byte a second; a latency of 2000 s): an error, not a file.
  CHECK_THROWS_WITH_AS(detail::fit_alpha_beta(samples(1e-3, 2.0), 2),
                       doctest::Contains("bandwidth 0.5 bytes/s, outside what a plan prices"), comm_error);
  CHECK_THROWS_WITH_AS(detail::fit_alpha_beta(samples(2000, 1e-9), 2), doctest::Contains("a link of latency 2000 s"), comm_error);
}

TEST_CASE("calibration on a 2x2 mesh: every rank agrees, the file round-trips and loads into a mesh") {
  calibration_options opts;
  opts.sizes = {1024, 16384, 131072};
  opts.holdout = 65536;
  opts.warmup = 1;
  opts.repeats = 3;
  std::vector<calibration_result> results(4);
  run_ranks(4, [&](gloo_communicator& w) {
    mesh_communicator mc(std::move(w), device_mesh{2, 2});
    results[static_cast<std::size_t>(mc.rank())] = calibrate(mc, opts);
  });
  const auto& r = results[0];
  REQUIRE(r.axes.size() == 2);
  for (const auto& a : r.axes) {
    CHECK(a.measured);
    CHECK(a.group_size == 2);
    CHECK(a.samples.size() == 3 * 4);
    const link_model& link = r.mesh.link(static_cast<std::size_t>(a.axis));
    CHECK(link.alpha >= 0);
    CHECK(link.beta > 0);
    CHECK(a.holdout_bytes == 65536);
    CHECK(std::isfinite(a.holdout_relative_error));
    for (const auto& s : a.samples) CHECK(s.seconds > 0);
  }
  for (const auto& other : results)  // the slowest rank's medians: the same numbers everywhere
    for (std::size_t a = 0; a < 2; ++a) CHECK(other.mesh.link(a) == r.mesh.link(a));

  temp_dir dir;
  const std::string path = dir.path() + "/links.json";
  save_calibration(r, path);
  const calibration_result back = load_calibration(path);
  REQUIRE(back.axes.size() == 2);
  CHECK(back.mesh == r.mesh);  // the sizes and every axis's fitted link, through the one mesh spelling
  CHECK(back.mesh.link(1) == r.mesh.link(1));
  CHECK(back.axes[0].samples.size() == r.axes[0].samples.size());
  // The axis names travel with the mesh; a version-2 file (the mesh as its sizes, each axis's
  // link beside its fit, as calibrate wrote it before) reads as the same result.
  calibration_result named = r;
  named.mesh.set_axis_name(0, "dp").set_axis_name(1, "tp");
  CHECK(calibration_from_json(calibration_to_json(named)).mesh.axis_name(1) == "tp");
  nlohmann::json v2 = calibration_to_json(r);
  v2["version"] = 2;
  v2["mesh"] = nlohmann::json{2, 2};
  for (std::size_t a = 0; a < 2; ++a) {
    v2["axes"][a]["latency_s"] = r.mesh.link(a).alpha;
    v2["axes"][a]["bandwidth_Bps"] = r.mesh.link(a).beta;
    v2["axes"][a]["hop_s"] = r.mesh.link(a).hop;
  }
  CHECK(calibration_from_json(v2, "v2").mesh == r.mesh);
  v2["version"] = 4;
  CHECK_THROWS_WITH_AS(calibration_from_json(v2, "v4"), doctest::Contains("this build reads versions 2 and 3"), io_error);
  // A backend no plan prices is refused with the file's name, not later as an unnamed
  // communications_backend ("spec error: communications_backend must be ... got \"mpi\"").
  nlohmann::json mpi = calibration_to_json(r);
  mpi["backend"] = "mpi";
  CHECK_THROWS_WITH_AS(calibration_from_json(mpi, "calibration file 'links.json'"),
                       "io error: calibration file 'links.json': backend is 'mpi', not a backend autoshard prices "
                       "(its family, before any \"-\", must be \"gloo\" or \"nccl\")",
                       io_error);
  mpi["backend"] = "nccl-ib";
  CHECK_NOTHROW((void)calibration_from_json(mpi, "calibration file 'links.json'"));
  device_mesh m{2, 2};
  apply_calibration(m, back);
  CHECK(m.link(0) == r.mesh.link(0));
  device_mesh wrong{4};
  CHECK_THROWS_WITH_AS(apply_calibration(wrong, back), "spec error: the calibration was measured on mesh 2x2, not 4 (--force uses it anyway)",
                       spec_error);
  apply_calibration(wrong, back, /*force=*/true);  // the axes both meshes have: axis 0 only
  CHECK(wrong.link(0) == r.mesh.link(0));
  {
    std::ofstream(dir.path() + "/bad.json") << R"({"format":"autoshard-calibration","mesh":[2],"axes":[{"axis":0}]})";
  }
  CHECK_THROWS_WITH_AS(load_calibration(dir.path() + "/bad.json"), doctest::Contains("bad.json"), io_error);
  CHECK_THROWS_AS(load_calibration(dir.path() + "/missing.json"), io_error);
}

// fuzz_readers (2026-12-05): a calibration file without "backend" read as backend "?", which
// plan then refused without naming the file (`spec error: the calibration was measured on ?,
// not gloo`, or communications_backend's) and which, written back, did not read. Every file
// calibrate writes has one, so it is required where the file is read.
TEST_CASE("a calibration file without a backend is refused where it is read") {
  calibration_result r;
  r.mesh = device_mesh{2};
  r.axes.push_back({0, 2, true, 0, 0, {}});
  nlohmann::json j = calibration_to_json(r);
  CHECK_NOTHROW((void)calibration_from_json(j, "calibration file 'links.json'"));
  j.erase("backend");
  CHECK_THROWS_WITH_AS(calibration_from_json(j, "calibration file 'links.json'"),
                       "io error: calibration file 'links.json': the document has no member \"backend\"", io_error);
  // What it read is what it writes: the result written back reads to the same JSON.
  j["backend"] = "nccl-ib";
  const nlohmann::json written = calibration_to_json(calibration_from_json(j, "c"));
  CHECK(calibration_to_json(calibration_from_json(written, "written")) == written);
}

// Hardening round ten: a calibration file of 2 million samples (171 MB) was parsed whole (5.4 s,
// 1.4 GB) and every sample taken; holdout_relative_error was read unbounded (1e300, -5).
TEST_CASE("hardening: a calibration's samples per fit and its held-out error are bounded") {
  calibration_result r;
  r.mesh = device_mesh{2};
  r.axes.push_back({0, 2, true, 2097152, 0.07, {}});
  for (std::size_t i = 0; i < max_calibration_samples; ++i)
    r.axes[0].samples.push_back({collective::all_reduce, 4096.0 * static_cast<double>(i + 1), 1e-4, false});
  nlohmann::json j = calibration_to_json(r);
  CHECK(calibration_from_json(j, "c").axes[0].samples.size() == max_calibration_samples);  // the limit itself reads
  j["axes"][0]["samples"].push_back(j["axes"][0]["samples"][0]);
  CHECK_THROWS_WITH_AS(calibration_from_json(j, "calibration file 'links.json'"),
                       "io error: calibration file 'links.json': axes[0].samples has 1025 samples, but a fit takes at most 1024 "
                       "(max_calibration_samples; calibrate writes at most 44 an axis)",
                       io_error);
  j = calibration_to_json(r);
  for (double bad : {1e300, -5.0, 100.5}) {
    j["axes"][0]["holdout_relative_error"] = bad;
    CHECK_THROWS_WITH_AS(calibration_from_json(j, "c"), doctest::Contains("axes[0].holdout_relative_error is "), io_error);
  }
  j["axes"][0]["holdout_relative_error"] = 1e300;
  CHECK_THROWS_WITH_AS(calibration_from_json(j, "c"), "io error: c: axes[0].holdout_relative_error is 1e+300, not a number in [0, 100]",
                       io_error);
  j["axes"][0]["holdout_relative_error"] = max_holdout_relative_error;
  CHECK_NOTHROW((void)calibration_from_json(j, "c"));
  j["axes"][0]["holdout_bytes"] = -1;
  CHECK_THROWS_WITH_AS(calibration_from_json(j, "c"), doctest::Contains("axes[0].holdout_bytes is -1, not a number in [0, "), io_error);
  // A file too large to hold max_calibration_samples an axis is refused from its size, unread.
  temp_dir dir;
  const std::string big = dir.path() + "/big.json";
  std::ofstream(big) << std::string(static_cast<std::size_t>(max_calibration_file_bytes), ' ') << "{}";
  const std::string too_big =
      "has " + std::to_string(max_calibration_file_bytes + 2) + " bytes; at most " + std::to_string(max_calibration_file_bytes) + " are read";
  CHECK_THROWS_WITH_AS(load_calibration(big), doctest::Contains(too_big.c_str()), io_error);
  // calibrate() counts its samples before it measures any.
  calibration_options opts;
  opts.sizes.assign(400, 4096.0);
  auto results = run_ranks_collect(
      2, [&](gloo_communicator& w) {
        mesh_communicator mc(std::move(w), device_mesh{2});
        (void)calibrate(mc, opts);
      },
      fast_fail());
  for (const auto& e : results) {
    REQUIRE(e);
    CHECK_THROWS_AS(std::rethrow_exception(e), spec_error);
    CHECK(message_of(e) == "spec error: calibration_options: 3 kinds x 401 sizes (400 and the held-out one) are more samples an axis "
                           "than a fit takes: at most 1024 (max_calibration_samples)");
  }
}

TEST_CASE("ranks that call different sizes or collectives get comm_error, not an abort") {
  std::vector<std::string> msgs(2);
  run_ranks(
      2,
      [&](gloo_communicator& c) {
        std::vector<float> v(c.rank() == 0 ? 1000 : 1200, 1.0f), out(2400);
        try {
          c.all_reduce(v.data(), v.size(), dtype::f32, reduce_op::sum);
        } catch (const comm_error& e) {
          msgs[static_cast<std::size_t>(c.rank())] = e.what();
        }
        try {  // a different collective on each rank
          if (c.rank() == 0)
            c.all_gather(v.data(), out.data(), 10, dtype::f32);
          else
            c.broadcast(v.data(), 10, dtype::f32, 0);
          msgs[static_cast<std::size_t>(c.rank())] += " | no error";
        } catch (const comm_error& e) {
          msgs[static_cast<std::size_t>(c.rank())] += std::string(" | ") + e.what();
        }
        c.barrier();  // still usable: the check failed before any data moved
      },
      fast_fail());
  for (int r = 0; r < 2; ++r) {
    const std::string& m = msgs[static_cast<std::size_t>(r)];
    CHECK(m.find("rank " + std::to_string(r) + ": all-reduce: the ranks called different") != std::string::npos);
    CHECK(m.find("rank 0: all-reduce of 1000 f32; rank 1: all-reduce of 1200 f32") != std::string::npos);
    CHECK(m.find("rank 0: all-gather of 10 f32; rank 1: broadcast of 10 f32 from root 0") != std::string::npos);
    CHECK(m.find("no error") == std::string::npos);
  }
}
