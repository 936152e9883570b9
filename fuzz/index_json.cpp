// libFuzzer target: model.safetensors.index.json (tensor/safetensors.hpp, class checkpoint).
// A scratch directory (made once) holds two valid shards, a.safetensors {w1, w2} and
// b.safetensors {w3}, plus a file that is not a safetensors file; each input is written as
// the index and opened. Only io_error may escape. An index that opens must map every name to
// a file that holds it, with a readable view.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <autoshard/tensor/safetensors.hpp>

#include "scratch.hpp"
#include "target.hpp"

namespace autoshard_fuzz::index_json_target {
namespace fs = std::filesystem;

const fs::path& scratch() {
  static const fs::path dir = [] {
    // tmpfs when there is one: the index is rewritten on every execution.
    fs::path d = autoshard_fuzz::scratch_path("autoshard-fuzz-index-");
    fs::create_directories(d);
    autoshard::host_tensor a(autoshard::dtype::f32, {2, 3}), b(autoshard::dtype::i64, {4}),
        c(autoshard::dtype::bf16, {1, 2, 2});
    autoshard::save_safetensors(d / "a.safetensors", {{"w1", a}, {"w2", b}}, {{"format", "pt"}});
    autoshard::save_safetensors(d / "b.safetensors", {{"w3", c}});
    std::ofstream(d / "not.safetensors") << "hello";
    return d;
  }();
  // Registered once `dir` is built, so it runs before `dir` is destroyed (a run that crashes
  // leaves the folder to the next run's scratch_path).
  static const bool cleanup = std::atexit([] {
    std::error_code ec;
    fs::remove_all(scratch(), ec);
  }) == 0;
  (void)cleanup;
  return dir;
}

int one_input(const std::uint8_t* data, std::size_t size) {
  const fs::path index = scratch() / "model.safetensors.index.json";
  {
    std::ofstream out(index, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    autoshard::checkpoint ck(index);
    for (const std::string& name : ck.names()) {
      const auto v = ck.view(name);
      if (v.nbytes() != ck.entry(name).nbytes()) {
        std::fprintf(stderr, "fuzz_index_json: view of '%s' has the wrong size\n", name.c_str());
        std::abort();
      }
      (void)autoshard::host_tensor::copy_of(v);
    }
  } catch (const autoshard::io_error&) {
  }
  return 0;
}

}  // namespace autoshard_fuzz::index_json_target

AUTOSHARD_FUZZ_TARGET(index_json)
