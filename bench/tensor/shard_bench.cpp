// Slicing and checkpoint sharding throughput, each next to its plain-copy baseline.
//
//   bench_tensor_shard_bench                         # Google Benchmark part + the side-by-side table
//   AUTOSHARD_BENCH_CKPT_MB=256 bench_tensor_shard_bench --benchmark_filter=none
//
// The Google Benchmark part sweeps the weight's size ([256,256] .. [4096,4096]); the tables
// after it use [4096,4096]. AUTOSHARD_BENCH_TABLES=0 skips the tables (scripts/plot_bench.py).
// 1. In memory: a rank's shard of a [4096, 4096] f32 weight (row split, column split, GPT-2
//    style fused QKV) against memcpy of the same number of bytes.
// 2. On disk: a GPT-2-shaped f32 checkpoint of ~1 GB (AUTOSHARD_BENCH_CKPT_MB) generated in
//    /tmp, sharded for 4 ranks by policy, against `cp` of the same file (and `cp` + fsync,
//    since the sharder fsyncs what it writes). Peak RSS of the sharding run is measured in
//    a child process (getrusage RUSAGE_CHILDREN), next to the largest single tensor.
#include <benchmark/benchmark.h>

#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <autoshard/tensor/tensor.hpp>

using namespace autoshard;
namespace fs = std::filesystem;

namespace {
constexpr std::int64_t kDim = 4096;

host_tensor make_weight(std::int64_t dim) {
  host_tensor t(dtype::f32, {dim, dim});
  float* p = t.as<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(i & 0xffff);
  return t;
}
/// The [dim, dim] f32 weight, made once per size.
const host_tensor& weight(std::int64_t dim = kDim) {
  static std::map<std::int64_t, host_tensor> ws;
  auto it = ws.find(dim);
  if (it == ws.end()) it = ws.emplace(dim, make_weight(dim)).first;
  return it->second;
}
tensor_shards plan_for(const char* which, std::int64_t dim = kDim) {
  tp_policy p{"bench", {}, {}};
  p.add("row", column()).add("col", row()).add("qkv", column(weight_layout::in_out).fused(4));
  return shards_of(p, which, weight(dim).shape(), dtype::f32, 4);
}

// Arg: the weight's dim, [256, 256] (256 KiB, cache-resident) to [4096, 4096] (64 MiB).
void BM_shard_copy(benchmark::State& state, const char* which) {
  const std::int64_t dim = state.range(0);
  const tensor_shards plan = plan_for(which, dim);
  const shard_layout& l = plan.ranks[1];
  host_tensor out(dtype::f32, l.shape);
  for (auto _ : state) {
    extract(weight(dim).view(), l, out.view());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(out.nbytes()));
}
void BM_memcpy_same_bytes(benchmark::State& state) {
  const std::int64_t dim = state.range(0);
  const std::size_t n = weight(dim).nbytes() / 4;
  std::vector<std::byte> out(n);
  for (auto _ : state) {
    std::memcpy(out.data(), weight(dim).data() + n, n);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n));
}
BENCHMARK_CAPTURE(BM_shard_copy, row_split_contiguous, "row")->RangeMultiplier(2)->Range(256, kDim)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_shard_copy, column_split_strided, "col")->RangeMultiplier(2)->Range(256, kDim)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_shard_copy, fused_4_parts_in_out, "qkv")->RangeMultiplier(2)->Range(256, kDim)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_memcpy_same_bytes)->RangeMultiplier(2)->Range(256, kDim)->Unit(benchmark::kMillisecond);

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
template <class F>
double best_of(int n, F&& f) {
  double best = 1e30;
  for (int i = 0; i < n; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

// ---- the checkpoint part ----
constexpr std::int64_t kHidden = 1024;
constexpr std::int64_t kHeads = 16;
std::vector<safetensors_tensor_info> gpt2_infos(int layers) {
  std::vector<safetensors_tensor_info> v{{"transformer.wte.weight", dtype::f32, {50257, kHidden}},
                                         {"transformer.wpe.weight", dtype::f32, {1024, kHidden}}};
  for (int i = 0; i < layers; ++i) {
    const std::string h = "transformer.h." + std::to_string(i) + ".";
    const std::vector<std::pair<std::string, tensor_shape>> ps = {
        {"ln_1.weight", {kHidden}},           {"ln_1.bias", {kHidden}},
        {"attn.c_attn.weight", {kHidden, 3 * kHidden}}, {"attn.c_attn.bias", {3 * kHidden}},
        {"attn.c_proj.weight", {kHidden, kHidden}},     {"attn.c_proj.bias", {kHidden}},
        {"ln_2.weight", {kHidden}},           {"ln_2.bias", {kHidden}},
        {"mlp.c_fc.weight", {kHidden, 4 * kHidden}},    {"mlp.c_fc.bias", {4 * kHidden}},
        {"mlp.c_proj.weight", {4 * kHidden, kHidden}},  {"mlp.c_proj.bias", {kHidden}}};
    for (const auto& [n, s] : ps) v.push_back({h + n, dtype::f32, s});
  }
  return v;
}
void generate(const fs::path& file, int layers) {
  safetensors_writer w(file, gpt2_infos(layers), {{"format", "pt"}});
  std::vector<float> chunk(std::size_t{1} << 20);
  for (std::size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<float>(i % 1000) * 1e-3f;
  for (const auto& e : w.entries()) {
    std::uint64_t left = e.nbytes();
    while (left) {
      const std::size_t k = static_cast<std::size_t>(std::min<std::uint64_t>(left, chunk.size() * 4));
      w.write({reinterpret_cast<const std::byte*>(chunk.data()), k});
      left -= k;
    }
  }
  w.commit();
}
double written_mb(const fs::path& dir) {
  double b = 0;
  for (const auto& e : fs::directory_iterator(dir)) b += static_cast<double>(fs::file_size(e.path()));
  return b / 1e6;
}
void run(const std::string& cmd) {
  if (std::system(cmd.c_str()) != 0) std::printf("  command failed: %s\n", cmd.c_str());
}
long max_rss_children_kb() {
  rusage u{};
  getrusage(RUSAGE_CHILDREN, &u);
  return u.ru_maxrss;
}
int shard_child(const char* in, const char* out) {
  checkpoint ck{fs::path(in)};
  auto r = shard_checkpoint(ck, policies::gpt2(), 4, {{"n_head", kHeads}, {"n_embd", kHidden}}, out);
  std::printf("  child: %.3f s, %.1f MB written, largest staging copy %.1f MB\n", r.seconds,
              static_cast<double>(r.bytes_written) / 1e6, static_cast<double>(r.largest_buffer) / 1e6);
  return 0;
}

void checkpoint_table() {
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  const char* env = std::getenv("AUTOSHARD_BENCH_CKPT_MB");
  const long mb = env ? std::max(60L, std::atol(env)) : 1024L;
  const int layers = std::max(1, static_cast<int>((mb - 210) / 50));  // embeddings ~210 MB, 50 MB a layer
  const fs::path dir = fs::temp_directory_path() / ("autoshard-bench-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path src = dir / "model.safetensors";
  std::printf("\n== checkpoint sharding (GPT-2 shapes, hidden %lld, %d layers, f32, tp = 4) ==\n",
              static_cast<long long>(kHidden), layers);
  generate(src, layers);
  const double file_mb = static_cast<double>(fs::file_size(src)) / 1e6;
  std::uint64_t largest = 0;
  for (const auto& i : gpt2_infos(layers)) largest = std::max<std::uint64_t>(largest, static_cast<std::uint64_t>(i.shape.numel()) * 4);
  // Warm the page cache for both, as a second run would find it.
  run("cat '" + src.string() + "' > /dev/null");
  const double t_cp = best_of(2, [&] {
    fs::remove(dir / "copy");
    run("cp '" + src.string() + "' '" + (dir / "copy").string() + "'");
  });
  const double t_cp_sync = best_of(2, [&] {
    fs::remove(dir / "copy");
    run("cp '" + src.string() + "' '" + (dir / "copy").string() + "' && sync '" + (dir / "copy").string() + "'");
  });
  fs::remove(dir / "copy");
  double t_shard = 1e30;
  for (int i = 0; i < 2; ++i) {
    fs::remove_all(dir / "out");
    auto t0 = std::chrono::steady_clock::now();
    const std::string cmd = "'" + self + "' --shard-child '" + src.string() + "' '" + (dir / "out").string() + "'";
    run(cmd);
    t_shard = std::min(t_shard, seconds_since(t0));
  }
  const double rss_mb = static_cast<double>(max_rss_children_kb()) / 1e3;
  // Replicated tensors (the embeddings) are written once per rank: compare per byte written too.
  const double out_mb = written_mb(dir / "out");
  std::printf("  %-34s %9s %11s %14s %9s %15s\n", "", "seconds", "MB written", "MB/s written", "ratio", "ratio per byte");
  std::printf("  %-34s %9.3f %11.0f %14.0f %9s %15s\n", "cp", t_cp, file_mb, file_mb / t_cp, "1.00", "1.00");
  std::printf("  %-34s %9.3f %11.0f %14.0f %9.2f %15.2f\n", "cp + fsync", t_cp_sync, file_mb, file_mb / t_cp_sync,
              t_cp_sync / t_cp, t_cp_sync / t_cp);
  std::printf("  %-34s %9.3f %11.0f %14.0f %9.2f %15.2f\n", "shard_checkpoint (4 files, fsync)", t_shard, out_mb,
              out_mb / t_shard, t_shard / t_cp, (t_shard / out_mb) / (t_cp / file_mb));
  std::printf("  file %.0f MB; largest tensor %.1f MB; peak RSS of the sharding process %.1f MB\n", file_mb,
              static_cast<double>(largest) / 1e6, rss_mb);
  fs::remove_all(dir);
}

// Thread CPU time: the machine may be shared, and being scheduled out is not copying.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}
template <class F>
double best_cpu(int n, F&& f) {
  double best = 1e30;
  for (int i = 0; i < n; ++i) {
    const double t0 = cpu_seconds();
    f();
    best = std::min(best, cpu_seconds() - t0);
  }
  return best;
}

void memory_table() {
  std::printf("\n== in-memory shard copy vs memcpy of the same bytes into the same buffer "
              "([4096, 4096] f32, rank 1 of 4; best thread CPU time of 30) ==\n");
  std::printf("  %-26s %12s %12s %10s %8s\n", "", "memcpy ms", "shard ms", "GB/s", "ratio");
  const char* which[] = {"row", "col", "qkv"};
  const char* label[] = {"row split (contiguous)", "column split (4 KB runs)", "fused 4 parts [in,out]"};
  for (int i = 0; i < 3; ++i) {
    const tensor_shards plan = plan_for(which[i]);
    host_tensor out(dtype::f32, plan.ranks[1].shape);
    const std::byte* from = weight().data() + out.nbytes();
    double t_mem = 1e30, t = 1e30;
    for (int round = 0; round < 30; ++round) {  // interleaved
      t_mem = std::min(t_mem, best_cpu(1, [&] {
        std::memcpy(out.data(), from, out.nbytes());
        benchmark::DoNotOptimize(out.data());
      }));
      t = std::min(t, best_cpu(1, [&] {
        extract(weight().view(), plan.ranks[1], out.view());
        benchmark::DoNotOptimize(out.data());
      }));
    }
    std::printf("  %-26s %12.3f %12.3f %10.2f %8.2f\n", label[i], t_mem * 1e3, t * 1e3,
                static_cast<double>(out.nbytes()) / t / 1e9, t / t_mem);
  }
}
}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], "--shard-child") == 0) return shard_child(argv[2], argv[3]);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (const char* t = std::getenv("AUTOSHARD_BENCH_TABLES"); t && std::strcmp(t, "0") == 0) return 0;
  memory_table();
  checkpoint_table();
  return 0;
}
