// Shared helpers of the tensor tests.
#pragma once
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>

namespace autoshard_test {

/// A fresh directory under the system temp dir, removed with everything in it.
struct scratch_dir {
  std::filesystem::path path;
  scratch_dir() {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           ("autoshard-tensor-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::filesystem::path operator/(const std::string& name) const { return path / name; }
};

}  // namespace autoshard_test
