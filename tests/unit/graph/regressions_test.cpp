// Inputs the fuzzers (fuzz/, docs/fuzzing.md) found crashing, each fed to the library and
// required to give a clean error.
#include <doctest/doctest.h>

#include <autoshard/graph/graph.hpp>

#include <sstream>
#include <string>

TEST_CASE("regression: fuzz_model_json, a number too large for a double") {
  // fuzz_model_json crash-e6ec9065: "301e40072" made nlohmann::json throw out_of_range (406),
  // which read_json did not turn into io_error: std::terminate.
  std::istringstream in(R"({"nodes": [{"name": "x", "kind": "input", "shape": [301e40072], "dtype": "f32"}]})");
  std::string msg;
  try {
    (void)autoshard::read_json(in);
  } catch (const autoshard::io_error& e) {
    msg = e.what();
  }
  CHECK(msg.find("io error: model JSON is not valid JSON") == 0);
  CHECK(msg.find("number overflow") != std::string::npos);
}
