// The doctest main of the GPU tests. Without a CUDA device (or driver) every test is
// reported as skipped: it prints why and exits with kSkip, which CTest's SKIP_RETURN_CODE
// turns into "Skipped". The test suite "no_device" runs everywhere: it checks that the
// NCCL backend reports a missing device as autoshard::device_error instead of crashing.
// Listing the tests (doctest_discover_tests does at build time) never needs a device.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>   // std::printf
#include <cstring>  // std::strncmp, std::strcmp

#include <autoshard/device/nccl.hpp>  // nccl_communicator::device_count

namespace {
constexpr int kSkip = 77;

bool has_flag(int argc, char** argv, const char* prefix) {
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], prefix, std::strlen(prefix)) == 0) return true;
  return false;
}
}  // namespace

int main(int argc, char** argv) {
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
