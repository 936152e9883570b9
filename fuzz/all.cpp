// The libFuzzer executable of every target (fuzz/target.hpp): fuzz/CMakeLists.txt writes the
// include of each target whose area is built, and links fuzz/fuzz_<name> to it.
// LLVMFuzzerInitialize picks the target from the name the program was run by, before libFuzzer
// reads its flags, corpus or dictionary.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "target.hpp"

// Each built target's source (fuzz/CMakeLists.txt lists them once, in autoshard_fuzz calls).
#include "autoshard_fuzz_targets.inc"

namespace {
int (*chosen)(const std::uint8_t*, std::size_t) = nullptr;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  std::string_view self = *argc > 0 ? (*argv)[0] : "";
  self = self.substr(self.find_last_of('/') == std::string_view::npos ? 0 : self.find_last_of('/') + 1);
  std::string_view name = self.substr(0, 5) == "fuzz_" ? self.substr(5) : self;
  if (name == "all") {
    const char* env = std::getenv("AUTOSHARD_FUZZ_TARGET");
    name = env != nullptr ? env : "";
  }
  for (const autoshard_fuzz::target& t : autoshard_fuzz::targets())
    if (t.name == name) chosen = t.one_input;
  if (chosen == nullptr) {
    std::string names;
    for (const autoshard_fuzz::target& t : autoshard_fuzz::targets()) names += " " + std::string(t.name);
    std::fprintf(stderr, "%.*s: no fuzz target '%.*s': run it as fuzz_<target> (a link to fuzz_all) or with "
                 "AUTOSHARD_FUZZ_TARGET=<target>; the targets built:%s\n",
                 static_cast<int>(self.size()), self.data(), static_cast<int>(name.size()), name.data(), names.c_str());
    std::exit(2);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) { return chosen(data, size); }
