// libFuzzer target: the safetensors header parser and the data spans it hands out
// (tensor/safetensors.hpp). Input, two forms:
//   - starts with '{': JSON header text up to the first '\n', the rest is the data; the
//     8-byte length prefix is computed, so mutations explore the JSON, not the prefix;
//   - anything else: the raw bytes of a file, prefix included.
// Only io_error may escape. For a header that parses, every tensor's bytes must lie inside
// the file (ASan checks the reads), its size must be numel * dtype size, and the header the
// writer makes for the same tensors must parse back to the same entries.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <autoshard/tensor/safetensors.hpp>

#include "target.hpp"

namespace autoshard_fuzz::safetensors_target {
[[noreturn]] void fail(const char* what, const std::string& detail = "") {
  std::fprintf(stderr, "fuzz_safetensors: %s %s\n", what, detail.c_str());
  std::abort();
}

int one_input(const std::uint8_t* data, std::size_t size) {
  std::vector<std::byte> file;
  if (size > 0 && data[0] == '{') {
    const std::uint8_t* nl = static_cast<const std::uint8_t*>(std::memchr(data, '\n', size));
    const std::size_t hlen = nl ? static_cast<std::size_t>(nl - data) : size;
    const std::size_t rest = nl ? size - hlen - 1 : 0;
    file.resize(8 + hlen + rest);
    for (int i = 0; i < 8; ++i) file[static_cast<std::size_t>(i)] = static_cast<std::byte>((std::uint64_t{hlen} >> (8 * i)) & 0xff);
    std::memcpy(file.data() + 8, data, hlen);
    if (rest) std::memcpy(file.data() + 8 + hlen, nl + 1, rest);
  } else {
    file.resize(size);
    if (size) std::memcpy(file.data(), data, size);
  }
  autoshard::safetensors_header h;
  try {
    h = autoshard::parse_safetensors_header(file, "fuzz.safetensors");
  } catch (const autoshard::io_error&) {
    return 0;
  }
  if (h.data_start + h.data_size != file.size()) fail("data_start + data_size is not the file size");
  std::vector<autoshard::safetensors_tensor_info> infos;
  std::uint64_t total = 0;
  for (const auto& e : h.entries) {
    if (e.end > h.data_size || e.begin > e.end) fail("span outside the data:", e.name);
    const autoshard::const_tensor_view v(file.data() + h.data_start + e.begin, e.shape, e.type);
    if (v.nbytes() != e.nbytes()) fail("view size differs from the span:", e.name);
    autoshard::host_tensor copy = autoshard::host_tensor::copy_of(v);
    if (!autoshard::bitwise_equal(copy, v)) fail("copy differs:", e.name);
    infos.push_back({e.name, e.type, e.shape});
    total += e.nbytes();
  }
  // The writer's header for the same tensors, with zero data, must parse to the same entries.
  auto [header, entries] = autoshard::make_safetensors_header(infos, h.metadata);
  std::vector<std::byte> written(header.size() + total);
  std::memcpy(written.data(), header.data(), header.size());
  autoshard::safetensors_header w;
  try {
    w = autoshard::parse_safetensors_header(written, "written.safetensors");
  } catch (const autoshard::io_error& e) {
    fail("written header does not parse:", e.what());
  }
  if (w.entries.size() != h.entries.size() || w.metadata != h.metadata) fail("written header lost entries");
  for (const auto& e : w.entries) {
    auto it = std::find_if(h.entries.begin(), h.entries.end(), [&](const auto& x) { return x.name == e.name; });
    if (it == h.entries.end() || it->type != e.type || !(it->shape == e.shape) || it->nbytes() != e.nbytes())
      fail("written header changed tensor", e.name);
  }
  return 0;
}

}  // namespace autoshard_fuzz::safetensors_target

AUTOSHARD_FUZZ_TARGET(safetensors)
