// Gloo collectives on loopback TCP: bus bandwidth of all-reduce, all-gather and
// reduce-scatter over message sizes, next to the calibrated alpha-beta model's prediction
// (measured / predicted) and memcpy bandwidth of the same bytes.
//
//   bench_comm_collectives                                   # 4 ranks, 4 KiB .. 256 MiB
//   AUTOSHARD_BENCH_RANKS=8 AUTOSHARD_BENCH_MAX_BYTES=16777216 bench_comm_collectives
//   AUTOSHARD_CALIBRATION=links.json bench_comm_collectives  # model from a saved calibration
//
// Ranks are threads of this process (rank 0 is the benchmark thread, the others follow
// the same loop); without AUTOSHARD_CALIBRATION the model is fitted at start-up on sizes
// up to 4 MiB and its held-out error is printed. B follows core/cost.hpp: the buffer for
// all-reduce, the gathered size for all-gather, the input size for reduce-scatter; bus
// bandwidth is nccl-tests' (2(k-1)/k for all-reduce, (k-1)/k for the others) * B / time.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <autoshard/gloo/gloo.hpp>

using namespace autoshard;

namespace {

/// Ranks 1..n-1 as threads waiting for jobs; rank 0 stays with the caller.
class rank_pool {
 public:
  explicit rank_pool(int n) : n_(n) {
    gloo_store store = gloo_store::in_process();
    gloo_options o;
    o.timeout = std::chrono::seconds(120);
    o.verify = false;  // raw Gloo: no per-call agreement check
    for (int r = 1; r < n; ++r)
      threads_.emplace_back([this, store, r, o] {
        gloo_communicator c = gloo_communicator::connect(store, r, n_, o);
        worker(c);
      });
    main_ = gloo_communicator::connect(store, 0, n, o);
  }
  ~rank_pool() {
    {
      std::lock_guard l(mu_);
      stop_ = true;
      ++gen_;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  int size() const { return n_; }
  gloo_communicator& main() { return main_; }
  /// Starts `job` on ranks 1..n-1; the caller runs rank 0's part, then wait().
  void post(std::function<void(gloo_communicator&)> job) {
    {
      std::lock_guard l(mu_);
      job_ = std::move(job);
      done_ = 0;
      ++gen_;
    }
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock l(mu_);
    cv_.wait(l, [&] { return done_ == n_ - 1; });
  }
  /// Runs `job` on every rank, rank 0 on this thread.
  void run_all(const std::function<void(gloo_communicator&)>& job) {
    post(job);
    job(main_);
    wait();
  }

 private:
  void worker(gloo_communicator& c) {
    std::uint64_t seen = 0;
    for (;;) {
      std::function<void(gloo_communicator&)> job;
      {
        std::unique_lock l(mu_);
        cv_.wait(l, [&] { return gen_ != seen; });
        seen = gen_;
        if (stop_) return;
        job = job_;
      }
      job(c);
      {
        std::lock_guard l(mu_);
        ++done_;
      }
      cv_.notify_all();
    }
  }
  int n_;
  gloo_communicator main_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void(gloo_communicator&)> job_;
  std::uint64_t gen_ = 0;
  int done_ = 0;
  bool stop_ = false;
};

/// A 1-D mesh over one communicator, for calibrate().
struct line_mesh {
  device_mesh m;
  gloo_communicator* c;
  const device_mesh& mesh() const { return m; }
  int rank() const { return c->rank(); }
  gloo_communicator& axis(std::size_t) { return *c; }
};

int env_int(const char* k, long long dflt) {
  const char* v = std::getenv(k);
  return static_cast<int>(v ? std::atoll(v) : dflt);
}
long long env_ll(const char* k, long long dflt) {
  const char* v = std::getenv(k);
  return v ? std::atoll(v) : dflt;
}

rank_pool* pool = nullptr;
link_model model;

// One collective of B bytes (core's definition) on f32 buffers.
struct op_buffers {
  std::vector<float> a, b;
  std::size_t per_rank = 0, total = 0;
  op_buffers(collective kind, std::int64_t bytes, int k) {
    total = static_cast<std::size_t>(bytes) / 4;
    per_rank = total / static_cast<std::size_t>(k);
    total = per_rank * static_cast<std::size_t>(k);
    a.assign(total, 1.0f);
    b.assign(kind == collective::all_reduce ? 0 : total, 0.0f);
  }
  void run(gloo_communicator& c, collective kind) {
    switch (kind) {
      case collective::all_reduce: c.all_reduce(a.data(), total, dtype::f32, reduce_op::sum); break;
      case collective::all_gather: c.all_gather(a.data(), b.data(), per_rank, dtype::f32); break;
      default: c.reduce_scatter(a.data(), b.data(), per_rank, dtype::f32, reduce_op::sum); break;
    }
  }
};

double memcpy_gbps(std::int64_t bytes) {
  std::vector<char> src(static_cast<std::size_t>(bytes), 1), dst(static_cast<std::size_t>(bytes));
  const int reps = static_cast<int>(std::max<std::int64_t>(3, std::min<std::int64_t>(1000, (256 << 20) / bytes)));
  const auto s = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) {
    std::memcpy(dst.data(), src.data(), src.size());
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count() / reps;
  return static_cast<double>(bytes) / t / 1e9;
}

void BM_collective(benchmark::State& state, collective kind) {
  const std::int64_t bytes = state.range(0);
  const int k = pool->size();
  const auto iters = static_cast<int>(state.max_iterations);
  // Every rank does one warm-up call and then exactly `iters`, as rank 0's loop does.
  pool->post([&](gloo_communicator& c) {
    op_buffers buf(kind, bytes, k);
    for (int i = 0; i <= iters; ++i) buf.run(c, kind);
  });
  op_buffers buf(kind, bytes, k);
  buf.run(pool->main(), kind);
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) buf.run(pool->main(), kind);
  const double per_call = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
  pool->wait();
  const double moved = static_cast<double>(buf.total) * 4.0;  // B after rounding to whole pieces
  const double frac = static_cast<double>(k - 1) / k;
  const double bus = (kind == collective::all_reduce ? 2 * frac : frac) * moved;
  state.counters["B"] = moved;
  state.counters["busbw_GBps"] = benchmark::Counter(bus / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  const double predicted = collective_time(kind, model, k, moved);
  state.counters["model_us"] = predicted * 1e6;
  state.counters["measured/model"] = per_call / predicted;
  state.counters["memcpy_GBps"] = memcpy_gbps(static_cast<std::int64_t>(moved));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(moved));
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  const int ranks = env_int("AUTOSHARD_BENCH_RANKS", 4);
  const long long max_bytes = env_ll("AUTOSHARD_BENCH_MAX_BYTES", 256LL << 20);
  rank_pool p(ranks);
  pool = &p;

  if (const char* path = std::getenv("AUTOSHARD_CALIBRATION")) {
    model = load_calibration(path).mesh.link(0);
    std::printf("model from %s: alpha %.2f us, beta %.3f GB/s\n", path, model.alpha * 1e6, model.beta / 1e9);
  } else {
    calibration_result cal;
    p.run_all([&](gloo_communicator& c) {
      line_mesh lm{device_mesh{ranks}, &c};
      calibration_result r = calibrate(lm);
      if (c.rank() == 0) cal = r;
    });
    model = cal.mesh.link(0);
    std::printf("calibrated on %d ranks (sizes 4 KiB..4 MiB): alpha %.2f us, beta %.3f GB/s, held-out (%.0f B) error %.1f%%\n",
                ranks, model.alpha * 1e6, model.beta / 1e9, cal.axes[0].holdout_bytes,
                100.0 * cal.axes[0].holdout_relative_error);
  }

  for (auto [kind, name] : {std::pair{collective::all_reduce, "all_reduce"}, std::pair{collective::all_gather, "all_gather"},
                            std::pair{collective::reduce_scatter, "reduce_scatter"}})
    for (long long b = 4096; b <= max_bytes; b *= 4) {
      // Enough calls for ~0.2 s at 1 GB/s, at least 3.
      const auto iters = std::max<long long>(3, std::min<long long>(500, (200LL << 20) / b));
      benchmark::RegisterBenchmark((std::string("gloo_") + name).c_str(), BM_collective, kind)
          ->Arg(b)
          ->Iterations(iters)
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  pool = nullptr;
  return 0;
}
