#pragma once
// One check of a command's files before it reads or writes anything: inputs are regular files
// (or directories where one is allowed) — a FIFO would block the read forever, a directory
// read as a file says "Is a directory" — and no output is an input (same device and inode, so
// hard links and symbolic links count) or another output (`plan --out X --dot X`).
//   command_paths{}.input("--plan", plan).output("--svg", svg).check();
#include "common.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace autoshard::tool {

class command_paths {
 public:
  /// A file the command reads. Must exist and be a regular file (after following links).
  command_paths& input(std::string what, std::filesystem::path p) {
    inputs_.push_back({std::move(what), std::move(p), false});
    return *this;
  }
  /// A file, or a directory of files (a checkpoint directory), the command reads.
  command_paths& input_or_dir(std::string what, std::filesystem::path p) {
    inputs_.push_back({std::move(what), std::move(p), true});
    return *this;
  }
  /// A --model that is a file: a model JSON or a Hugging Face config.json, or a directory
  /// holding config.json (the file read from it is the input).
  command_paths& model(std::string what, const std::filesystem::path& p) {
    std::error_code ec;
    return std::filesystem::is_directory(p, ec) ? input(std::move(what), p / "config.json") : input(std::move(what), p);
  }
  /// A file the command writes (it may exist: it is replaced, unless it is an input).
  command_paths& output(std::string what, std::filesystem::path p) {
    if (!p.empty()) outputs_.push_back({std::move(what), std::move(p), false});
    return *this;
  }

  /// Throws io_error naming the flag and the path of the first conflict.
  void check() const {
    std::vector<std::pair<const entry*, struct stat>> in;
    for (const entry& e : inputs_) {
      struct stat st {};
      if (::stat(e.path.c_str(), &st) != 0)
        throw io_error("cannot open " + e.what + " '" + e.path.string() + "': " + std::strerror(errno));
      const bool dir = S_ISDIR(st.st_mode);
      if (!S_ISREG(st.st_mode) && !(dir && e.dir_ok))
        throw io_error(e.what + " '" + e.path.string() + "' is " + kind(st.st_mode) +
                       ", not a regular file");
      in.emplace_back(&e, st);
    }
    for (std::size_t i = 0; i < outputs_.size(); ++i) {
      const entry& o = outputs_[i];
      struct stat st {};
      if (::stat(o.path.c_str(), &st) == 0) {
        if (S_ISDIR(st.st_mode)) throw io_error(o.what + " '" + o.path.string() + "' is a directory, not a file");
        for (const auto& [ie, ist] : in)
          if (ist.st_dev == st.st_dev && ist.st_ino == st.st_ino)
            throw io_error(o.what + " '" + o.path.string() + "' is the " + ie->what + " '" + ie->path.string() +
                           "': refusing to overwrite its input");
      }
      for (std::size_t j = 0; j < i; ++j)
        if (same_place(outputs_[j].path, o.path))
          throw io_error(o.what + " '" + o.path.string() + "' and " + outputs_[j].what + " '" +
                         outputs_[j].path.string() + "' are the same file: give each output its own path");
    }
  }

 private:
  struct entry {
    std::string what;
    std::filesystem::path path;
    bool dir_ok = false;
  };
  static std::string kind(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO (reading it could wait forever)";
    if (S_ISSOCK(m)) return "a socket";
    if (S_ISCHR(m) || S_ISBLK(m)) return "a device";
    return "not a regular file";
  }
  /// Two output paths that name one file: the same inode when both exist, else the same
  /// absolute path with links in the existing part resolved.
  static bool same_place(const std::filesystem::path& a, const std::filesystem::path& b) {
    struct stat sa {}, sb {};
    if (::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0)
      return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    std::error_code ea, eb;
    const auto ca = std::filesystem::weakly_canonical(a, ea), cb = std::filesystem::weakly_canonical(b, eb);
    return !ea && !eb && ca == cb;
  }
  std::vector<entry> inputs_, outputs_;
};

}  // namespace autoshard::tool
