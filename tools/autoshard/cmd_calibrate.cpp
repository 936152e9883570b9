// autoshard calibrate: measure each mesh axis's latency and bandwidth on Gloo (ranks as
// threads over loopback TCP, or this machine's interface), fit the alpha-beta model, and
// write it for `autoshard plan --calibration` to use.
#include "common.hpp"

#include <autoshard/gloo/gloo.hpp>

#include <iomanip>
#include <iostream>
#include <mutex>

namespace autoshard::tool {
namespace {

struct calibrate_cli_options {
  std::string mesh = "2x2";
  std::string out = "links.json";
  double max_bytes = 4194304;
  int repeats = 7;
  bool json = false;
};

int run_calibrate(const calibrate_cli_options& o) {
  const device_mesh m(parse_mesh_shape(o.mesh));
  if (m.num_ranks() > 64) throw spec_error("calibrate runs every rank on this machine: at most 64 ranks");
  if (o.max_bytes < 65536) throw spec_error("--max-bytes must be at least 65536");
  if (o.repeats < 1) throw spec_error("--repeats must be at least 1");
  calibration_options co;
  co.repeats = o.repeats;
  co.sizes.clear();
  for (double b = 4096; b <= o.max_bytes; b *= 4) co.sizes.push_back(b);
  co.holdout = o.max_bytes / 2;
  calibration_result result;
  std::mutex mu;
  run_ranks(m.num_ranks(), [&](gloo_communicator& c) {
    mesh_communicator mc(std::move(c), m);
    calibration_result r = calibrate(mc, co);  // the same on every rank
    if (mc.rank() == 0) {
      std::lock_guard<std::mutex> lock(mu);
      result = std::move(r);
    }
  });
  save_calibration(result, o.out);

  if (o.json) {
    std::cout << calibration_to_json(result).dump(2) << "\n";
    return exit_ok;
  }
  std::cout << "calibrated " << to_string(m) << " on " << result.backend << " (" << m.num_ranks()
            << " ranks as threads of this process)\n\n  axis  ranks   latency       bandwidth     held-out error\n";
  for (const auto& ax : result.axes) {
    std::cout << "  " << std::setw(4) << ax.axis << std::setw(7) << ax.group_size;
    if (!ax.measured) {
      std::cout << "   (size 1: never communicates)\n";
      continue;
    }
    std::cout << "   " << std::setw(10) << human_seconds(ax.link.alpha) << "   " << std::setw(9) << std::setprecision(3)
              << ax.link.beta / 1e9 << " GB/s   " << std::setprecision(3) << 100.0 * ax.holdout_relative_error
              << "% at " << human_bytes(ax.holdout_bytes) << "\n";
  }
  std::cout << "\nwrote " << o.out << "; use it with: autoshard plan --calibration " << o.out << " ...\n";
  return exit_ok;
}

}  // namespace

void register_calibrate(CLI::App& app, action& run) {
  auto o = std::make_shared<calibrate_cli_options>();
  CLI::App* cmd = app.add_subcommand("calibrate", "measure each mesh axis's link on Gloo and fit alpha-beta");
  cmd->add_option("--mesh", o->mesh, "mesh shape, e.g. 2x2 (every rank runs here)")->capture_default_str();
  cmd->add_option("--out", o->out, "calibration file (JSON)")->capture_default_str();
  cmd->add_option("--max-bytes", o->max_bytes, "largest message; sizes go 4 KiB, 16 KiB, ... up to it")
      ->capture_default_str();
  cmd->add_option("--repeats", o->repeats, "timed repeats per size (the median is kept)")->capture_default_str();
  cmd->add_flag("--json", o->json, "write one JSON document to stdout");
  cmd->callback([o, &run] { run = [o] { return run_calibrate(*o); }; });
}

}  // namespace autoshard::tool
