// libFuzzer target: the IOPDDL problem reader (solve/iopddl.hpp). Input: a problem file.
// Only io_error may escape the reader, only solver_error validate(). A valid problem must
// write back and read to an equal problem, and its usage peaks must be computable.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include <autoshard/solve/iopddl.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  autoshard::strategy_problem p;
  try {
    p = autoshard::read_iopddl(in, "fuzz");
  } catch (const autoshard::io_error&) {
    return 0;
  }
  try {
    p.validate();
  } catch (const autoshard::solver_error&) {
    return 0;
  }
  std::ostringstream out;
  autoshard::write_iopddl(out, p);
  std::istringstream again(out.str());
  autoshard::strategy_problem q;
  try {
    q = autoshard::read_iopddl(again, "written");
  } catch (const autoshard::error& e) {
    std::fprintf(stderr, "fuzz_iopddl: written problem does not read back: %s\n%s\n", e.what(), out.str().c_str());
    std::abort();
  }
  if (!(p == q)) {
    std::fprintf(stderr, "fuzz_iopddl: round trip changed the problem\n%s\n", out.str().c_str());
    std::abort();
  }
  try {
    (void)p.min_peak_usage();
    std::vector<int> first(p.nodes.size(), 0);
    (void)p.peak_usage(first);
    (void)p.cost_of(first);
  } catch (const autoshard::solver_error&) {
  }
  return 0;
}
