// The doctest main of the GPU tests. Without a CUDA device (or driver) every test is
// skipped: the process exits 77, which CTest (SKIP_RETURN_CODE 77) turns into "Skipped".
// The test suite "no_device" runs everywhere: the NCCL backend reports a missing device as
// autoshard::device_error instead of crashing, and the host side of uploads (staging).
// Listing the tests (doctest_discover_tests does at build time) never needs a device.
// `--autoshard-versions` prints the NCCL, CUDA runtime and driver versions as JSON.
// `--autoshard-child=<scenario>` runs one scenario that could hang (see run_child) in
// its own process for the test that spawned it.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <chrono>       // std::chrono_literals
#include <cstdio>       // std::printf
#include <cstring>      // std::strncmp, std::strlen
#include <exception>    // std::exception
#include <string_view>  // std::string_view

#include <autoshard/device/nccl.hpp>  // nccl_communicator

namespace {
constexpr int kSkip = 77;

/// Scenarios the tests run in a child process (gpu_test_util.hpp's run_child), because
/// they could hang or leave a process in a state the other tests should not share.
int run_child(std::string_view what) {
  using namespace std::chrono_literals;
  if (what == "init-timeout") {  // rank 0 of a world of 2 whose rank 1 never joins
    autoshard::nccl_memory_store store;
    try {
      (void)autoshard::nccl_communicator::connect(store, 0, 2, {.device = 0, .timeout = 2000ms});
      std::printf("connect of a world with a missing rank succeeded\n");
      return 3;
    } catch (const autoshard::comm_error& e) {
      std::printf("%s\n", e.what());
      return 0;
    } catch (const std::exception& e) {
      std::printf("not a comm_error: %s\n", e.what());
      return 4;
    }
  }
  std::printf("unknown child scenario '%.*s'\n", static_cast<int>(what.size()), what.data());
  return 2;
}

bool has_flag(int argc, char** argv, const char* prefix) {
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], prefix, std::strlen(prefix)) == 0) return true;
  return false;
}
}  // namespace

int main(int argc, char** argv) {
  if (has_flag(argc, argv, "--autoshard-versions")) {  // for scripts/gpu_check.sh's figures
    int runtime = 0, driver = 0;
    (void)cudaRuntimeGetVersion(&runtime);
    (void)cudaDriverGetVersion(&driver);
    (void)cudaGetLastError();
    std::printf("{\"nccl\": %d, \"cuda_runtime\": %d, \"cuda_driver\": %d, \"devices\": %d}\n",
                autoshard::nccl_communicator::library_version(), runtime, driver,
                autoshard::nccl_communicator::device_count());
    return 0;
  }
  constexpr std::string_view child_flag = "--autoshard-child=";
  for (int i = 1; i < argc; ++i)
    if (std::string_view(argv[i]).substr(0, child_flag.size()) == child_flag)
      return run_child(std::string_view(argv[i]).substr(child_flag.size()));
  doctest::Context context;
  context.applyCommandLine(argc, argv);
  const bool listing = has_flag(argc, argv, "--list") || has_flag(argc, argv, "-l") ||
                       has_flag(argc, argv, "--help") || has_flag(argc, argv, "-h") ||
                       has_flag(argc, argv, "--version") || has_flag(argc, argv, "-v");
  const bool no_device_suite = has_flag(argc, argv, "--autoshard-no-device");
  if (listing) return context.run();
  if (no_device_suite) {
    context.addFilter("test-suite", "no_device");
    return context.run();
  }
  if (autoshard::nccl_communicator::device_count() == 0) {
    std::printf("skipped: no CUDA device (or no driver) visible\n");
    return kSkip;
  }
  return context.run();
}
