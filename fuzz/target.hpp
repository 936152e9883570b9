// How a fuzz target names its entry. Every target is built into one libFuzzer executable,
// fuzz_all (fuzz/all.cpp includes each target's source): the headers the targets share are
// compiled once, not once a target (the CI smoke's build took 119 CPU seconds as nine
// executables). A target's source defines
//   namespace autoshard_fuzz::<name>_target { int one_input(const std::uint8_t*, std::size_t); }
// with its helpers in the same namespace, and ends with AUTOSHARD_FUZZ_TARGET(<name>). The
// executable runs the target its own name says: fuzz/fuzz_<name> is a link to fuzz_all
// (fuzz/CMakeLists.txt), or AUTOSHARD_FUZZ_TARGET=<name> for fuzz_all itself.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace autoshard_fuzz {

/// One target: its name (fuzz_<name>, fuzz/corpus/<name>, fuzz/dict/<name>.dict) and entry.
struct target {
  std::string_view name;
  int (*one_input)(const std::uint8_t* data, std::size_t size);
};

/// Every target built in, in the order their sources are included.
inline std::vector<target>& targets() {
  static std::vector<target> all;
  return all;
}

/// Adds a target to targets() when the program starts.
struct registration {
  registration(std::string_view name, int (*one_input)(const std::uint8_t*, std::size_t)) {
    targets().push_back({name, one_input});
  }
};

}  // namespace autoshard_fuzz

#define AUTOSHARD_FUZZ_TARGET(name)                                                              \
  namespace autoshard_fuzz::name##_target {                                                      \
  [[maybe_unused]] const registration registered{#name, &one_input};                             \
  }
