// Inputs the fuzzers (fuzz/, docs/fuzzing.md) found crashing, each fed to the library and
// required to give a clean io_error.
#include <autoshard/tensor/tensor.hpp>
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

using namespace autoshard;

namespace {
// A safetensors file: 8-byte little-endian header length, the header, `data` zero bytes.
std::vector<std::byte> regression_file(const std::string& header, std::size_t data = 0) {
  std::vector<std::byte> f(8 + header.size() + data, std::byte{0});
  for (std::size_t i = 0; i < 8; ++i) f[i] = static_cast<std::byte>((header.size() >> (8 * i)) & 0xff);
  for (std::size_t i = 0; i < header.size(); ++i) f[8 + i] = static_cast<std::byte>(header[i]);
  return f;
}
std::string header_error(const std::vector<std::byte>& f) {
  try {
    (void)parse_safetensors_header(f, "crash.safetensors");
  } catch (const io_error& e) {
    return e.what();
  }
  return "(no error)";
}
}  // namespace

TEST_CASE("regression: fuzz_safetensors, shape whose prefix product overflows int64 before a 0 dim") {
  // fuzz_safetensors crash-800d7053: [2^62, 2, 0] has 0 elements, but tensor_shape::numel()
  // multiplied 2^62 * 2 in int64 (UBSan: signed integer overflow in shape.hpp).
  const auto f = regression_file(R"({"a":{"dtype":"F32","shape":[4611686018427387904,2,0],"data_offsets":[0,0]}})");
  const std::string msg = header_error(f);
  CHECK(msg.find("crash.safetensors") != std::string::npos);
  CHECK(msg.find("tensor 'a'") != std::string::npos);
  CHECK(msg.find("more than 2^64") != std::string::npos);
  // The same dims with the 0 first stay valid: every prefix product is 0.
  CHECK_NOTHROW((void)parse_safetensors_header(
      regression_file(R"({"a":{"dtype":"F32","shape":[0,4611686018427387904,2],"data_offsets":[0,0]}})"), "ok"));
}

TEST_CASE("regression: a safetensors header padded with NUL bytes, which nlohmann's parser took for the end of the text") {
  // The format pads a header with spaces (0x20) after its JSON; a NUL ended the parse, so a
  // header padded with NULs, or a NUL and then anything, was read as the JSON before it.
  const std::string json = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  CHECK(header_error(regression_file(json + std::string(8, '\0'), 4)) ==
        "io error: safetensors file 'crash.safetensors': header byte 54 of its 62 is a NUL (0x00): a header is JSON, padded at its end "
        "with spaces (0x20) only");
  CHECK(header_error(regression_file(json + std::string("\0{\"b\": 1}", 9), 4)).find("header byte 54 of its 63 is a NUL (0x00)") !=
        std::string::npos);
  CHECK(header_error(regression_file(json + "        ", 4)) == "(no error)");  // spaces, as the format pads
}
