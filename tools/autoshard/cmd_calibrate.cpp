// autoshard calibrate: measure each mesh axis's latency and bandwidth on Gloo (ranks as
// threads over loopback TCP, or one rank per process under torchrun, srun or mpirun with
// --from-env), fit the alpha-beta model, and write it for `autoshard plan --calibration`.
#include "common.hpp"
#include "paths.hpp"

#include <autoshard/gloo/gloo.hpp>

#include <cmath>
#include <iomanip>
#include <iostream>
#include <mutex>
#include <optional>
#include <sstream>

namespace autoshard::tool {
namespace {

struct calibrate_cli_options {
  std::string mesh = "2x2";
  std::string out = "links.json";
  double max_bytes = 4194304;
  int repeats = 7;
  bool json = false;
  bool from_env = false;
  bool follow_symlinks = false;
};

// The largest message calibrate sends; every rank holds three buffers of it (send, receive,
// and the backend's reduce-scatter staging).
constexpr double max_calibration_bytes = 1073741824;  // 1 GiB
constexpr int max_calibration_threads = 64;          // ranks as threads of this process
// Beside the three buffers, resident: a rank's Gloo pairs, samples and thread (about 3 MiB
// measured), and the process itself. (Address space a thread reserves, its stack and malloc
// arena, is run_ranks' to count: "cannot start the thread of rank ...".)
constexpr double calibration_rank_overhead = 4 << 20;
constexpr double calibration_process_overhead = 32 << 20;

/// A byte count as the messages write it: whole up to 12 digits (1073741824, not 1.07374e+09).
std::string number(double x) {
  std::ostringstream s;
  s << std::setprecision(12) << x;
  return s.str();
}

// Every limit is checked before a rank starts or a buffer is allocated.
void check_calibrate_options(const calibrate_cli_options& o, const device_mesh& m) {
  if (!std::isfinite(o.max_bytes) || o.max_bytes < 65536 || o.max_bytes > max_calibration_bytes)
    throw spec_error("--max-bytes must be a number of bytes from 65536 (64 KiB) to 1073741824 (1 GiB), got " +
                     number(o.max_bytes));
  if (o.repeats < 1 || o.repeats > 1000) throw spec_error("--repeats must be from 1 to 1000, got " + std::to_string(o.repeats));
  if (!o.from_env && m.num_ranks() > max_calibration_threads)
    throw spec_error("calibrate runs the " + std::to_string(m.num_ranks()) + " ranks of " + to_string(m) +
                     " as threads of this process: at most " + std::to_string(max_calibration_threads) +
                     "; start one process per rank with torchrun, srun or mpirun and --from-env instead");
  // The ranks' buffers, before any is allocated: `--mesh 8x8 --max-bytes 1GiB` holds 192 GiB
  // (64 ranks of three 1 GiB buffers; measured: 3 x --max-bytes and about 3 MiB a rank), filled as
  // soon as allocated, so the OOM killer ended it, or under `ulimit -v` a rank's bad_alloc
  // surfaced in its peers as "comm error: ... Connection closed by peer".
  const int ranks = o.from_env ? 1 : m.num_ranks();  // with --from-env, this process holds its own rank
  const double need = ranks * (3 * o.max_bytes + calibration_rank_overhead) + calibration_process_overhead;
  const machine_limits here = machine_limits::memory_here();
  if (need > static_cast<double>(here.memory()))
    throw resource_error("calibrate would need about " + human_bytes(need) + ": " + std::to_string(ranks) +
                         (o.from_env ? " rank" : " ranks as threads of this process") + ", each holding three buffers of " +
                         "--max-bytes " + number(o.max_bytes) + " (" + human_bytes(o.max_bytes) +
                         "); but this process can allocate " + human_bytes(static_cast<double>(here.memory())) + " more (" +
                         here.memory_source() + "): use a smaller --max-bytes" +
                         (o.from_env ? std::string() : " or a mesh of fewer ranks") +
                         (here.memory_limited() ? ", or raise the limit" : ", or free memory"));
}

// One process of a launch (torchrun, srun, mpirun): this rank only; rank 0 returns the result.
std::optional<calibration_result> calibrate_launched(const device_mesh& m, const calibration_options& co) {
  const launch_env env = read_launch_env();
  env.check_mesh(m);
  mesh_communicator mc(connect_launch(env), m);
  calibration_result r = calibrate(mc, co);  // the same on every rank
  mc.world().barrier();                      // rank 0 hosts the store: nobody leaves before everyone is done
  if (env.rank != 0) return std::nullopt;
  return r;
}

int run_calibrate(calibrate_cli_options o) {
  {  // not a directory, a FIFO or a link: found before the ranks run
    command_paths paths(o.follow_symlinks);
    o.out = paths.output_path("--out", o.out).string();
    paths.check();
  }
  const device_mesh m = parse_mesh(o.mesh);  // its sizes and axis names; the links are what is measured
  check_calibrate_options(o, m);
  calibration_options co;
  co.repeats = o.repeats;
  co.sizes.clear();
  for (double b = 4096; b <= o.max_bytes; b *= 4) co.sizes.push_back(b);
  co.holdout = o.max_bytes / 2;
  calibration_result result;
  if (o.from_env) {
    std::optional<calibration_result> r = calibrate_launched(m, co);
    if (!r) return exit_ok;  // rank 0 writes and reports
    result = std::move(*r);
  } else {
    std::mutex mu;
    run_ranks(m.num_ranks(), [&](gloo_communicator& c) {
      mesh_communicator mc(std::move(c), m);
      calibration_result r = calibrate(mc, co);  // the same on every rank
      if (mc.rank() == 0) {
        std::lock_guard<std::mutex> lock(mu);
        result = std::move(r);
      }
    });
  }
  save_calibration(result, o.out);

  if (o.json) {
    std::cout << calibration_to_json(result).dump(2) << "\n";
    return exit_ok;
  }
  std::cout << "calibrated " << to_string(m) << " on " << result.backend << " (" << m.num_ranks()
            << (m.num_ranks() == 1 ? (o.from_env ? " rank, one process" : " rank as a thread of this process")
                : (o.from_env ? " ranks, one process each" : " ranks as threads of this process"))
            << ")\n\n  axis  ranks   latency       bandwidth     held-out error\n";
  for (const auto& ax : result.axes) {
    std::cout << "  " << std::setw(4) << ax.axis << std::setw(7) << ax.group_size;
    if (!ax.measured) {
      std::cout << "   (size 1: never communicates)\n";
      continue;
    }
    const link_model& link = result.mesh.link(static_cast<std::size_t>(ax.axis));
    std::cout << "   " << std::setw(10) << human_seconds(link.alpha) << "   " << std::setw(9) << std::setprecision(3)
              << link.beta / 1e9 << " GB/s   " << std::setprecision(3) << 100.0 * ax.holdout_relative_error
              << "% at " << human_bytes(ax.holdout_bytes) << "\n";
  }
  std::cout << "\nwrote " << escaped_text(o.out) << "; use it with: autoshard plan --calibration " << escaped_text(o.out) << " ...\n";
  return exit_ok;
}

}  // namespace

void register_calibrate(CLI::App& app, action& run) {
  auto o = std::make_shared<calibrate_cli_options>();
  CLI::App* cmd = app.add_subcommand("calibrate", "measure each mesh axis's link on Gloo and fit alpha-beta");
  cmd->footer(
      "Examples:\n"
      "  autoshard calibrate --mesh 2x2 --out links.json\n"
      "  autoshard plan --model gpt2 --mesh 2x2 --calibration links.json");
  cmd->add_option("--mesh", o->mesh, "mesh shape, e.g. 2x2 (its ranks run here as threads, or are the launch's ranks)")
      ->capture_default_str();
  cmd->add_option("--out", o->out, "calibration file (JSON)")->capture_default_str();
  add_follow_symlinks(*cmd, o->follow_symlinks);
  // Out of range is a usage error (exit 2), as for every number option; run_calibrate checks again.
  // A size as every size flag reads one (byte_count: 64KiB, 4MiB, 1GiB, 4e6), a whole number of
  // bytes; CLI11 then reads the count it stands for. `--max-bytes 1GiB` (the largest allowed,
  // as the refusal itself wrote it) was refused as no number, and 65536.5 taken.
  cmd->add_option("--max-bytes", o->max_bytes, "largest message (64 KiB .. 1 GiB); sizes go 4 KiB, 16 KiB, ... up to it")
      ->capture_default_str()
      ->transform(CLI::Validator(
          [](std::string& in) -> std::string {
            const std::optional<double> v = byte_count(in);
            if (!v || !std::isfinite(*v) || *v < 65536 || *v > static_cast<double>(max_calibration_bytes))
              return "must be a number of bytes from 65536 (64 KiB) to 1073741824 (1 GiB), got " + in;
            if (const std::string f = fractional_bytes(*v); !f.empty()) return quoted_text(in) + " " + f;
            in = std::to_string(static_cast<std::int64_t>(*v));
            return {};
          },
          "BYTES in [65536, 1073741824]"));
  cmd->add_option("--repeats", o->repeats, "timed repeats per size (the median is kept)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  cmd->add_flag("--json", o->json, "write one JSON document to stdout");
  cmd->add_flag("--from-env", o->from_env,
                "this process is one rank of a launch: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun), "
                "or Slurm's or Open MPI's variables; rank 0 writes --out");
  cmd->callback([o, &run] { run = [o] { return run_calibrate(*o); }; });
}

}  // namespace autoshard::tool
