// The scratch files of the fuzz targets that read from files (tmpfs when there is one), named
// by the process id. A run that crashes, times out or is killed removes nothing, and the
// targets' exit handlers once removed nothing either (registered inside the initializer of the
// static path they removed, they ran after its destructor): 41 scratch files and folders
// had piled up in /dev/shm. So each start removes what runs whose processes are gone left.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace autoshard_fuzz {

/// The folder scratch files go in.
inline std::filesystem::path scratch_base() {
  std::error_code ec;
  return std::filesystem::is_directory("/dev/shm", ec) ? std::filesystem::path("/dev/shm")
                                                       : std::filesystem::temp_directory_path();
}

/// `scratch_base()/<prefix><pid><suffix>`, after removing every `<prefix><pid>...` there whose
/// process no longer runs.
inline std::filesystem::path scratch_path(const std::string& prefix, const std::string& suffix = {}) {
  namespace fs = std::filesystem;
  const fs::path base = scratch_base();
  std::error_code ec;
  for (fs::directory_iterator it(base, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string pid = name.substr(prefix.size(), name.find_first_not_of("0123456789", prefix.size()) - prefix.size());
    std::error_code gone;
    if (!pid.empty() && !fs::exists("/proc/" + pid, gone)) fs::remove_all(it->path(), gone);
  }
  return base / (prefix + std::to_string(::getpid()) + suffix);
}

}  // namespace autoshard_fuzz
