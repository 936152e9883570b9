#pragma once
// One check of a command's files before it reads or writes anything: inputs are regular files
// (or directories where one is allowed) — a FIFO would block the read forever, a directory
// read as a file says "Is a directory" — no output is an input (same device and inode, so
// hard links and symbolic links count) or another output (`plan --out X --dot X`), and no
// output is anything but a regular file or absent (io/atomic_file.hpp refuses the rest again
// when it writes: a FIFO, a device or a link is never replaced).
//   command_paths{}.input("--plan", plan).output("--svg", svg).check();
#include "common.hpp"

#include <sys/stat.h>
#include <unistd.h>  // access

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace autoshard::tool {

class command_paths {
 public:
  /// `follow_links`: an output that is a symbolic link is written through (the file it points
  /// to is replaced, or refused as any output is); without it a link is refused.
  explicit command_paths(bool follow_links = false) : follow_(follow_links) {}

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
  /// A file the command writes. It may exist as a regular file, which is replaced unless it is
  /// an input; anything else there (a FIFO, a device, a directory, a link unless following
  /// links) is refused by check().
  /// Its directory is one the command makes (shard's --out): it need not exist yet.
  command_paths& output(std::string what, const std::filesystem::path& p) {
    (void)output_path(std::move(what), p, /*directory_made=*/true);
    return *this;
  }
  /// output(), returning the path to write: `p`, or the file a link at `p` points to when
  /// following links. Unless `directory_made` (the command creates it, as synth's --out), the
  /// file's directory must exist and be writable: `plan --out missing/p.json` solved for
  /// minutes, `calibrate` measured, and only then failed to create the file.
  std::filesystem::path output_path(std::string what, std::filesystem::path p, bool directory_made = false) {
    if (p.empty()) return p;
    if (follow_) p = resolve_output_link(p);
    outputs_.push_back({std::move(what), p, directory_made});
    return p;
  }

  /// Throws io_error naming the flag and the path of the first conflict. Linear in the
  /// number of paths (a shard's 4,096 rank files are checked in milliseconds).
  void check() const {
    std::map<std::pair<dev_t, ino_t>, const entry*> in;
    for (const entry& e : inputs_) {
      struct stat st {};
      if (::stat(e.path.c_str(), &st) != 0)
        throw io_error("cannot open " + e.what + " " + quoted_path(e.path.string()) + ": " + std::strerror(errno));
      const bool dir = S_ISDIR(st.st_mode);
      if (!S_ISREG(st.st_mode) && !(dir && e.dir_ok))
        throw io_error(e.what + " " + quoted_path(e.path.string()) + " is " + kind(st.st_mode) + ", not a regular file");
      in.emplace(std::pair{st.st_dev, st.st_ino}, &e);
    }
    std::unordered_map<std::string, const entry*> seen;  // an output's file (device:inode) or absolute path
    for (const entry& o : outputs_) {
      struct stat st {};
      std::string key;
      if (::stat(o.path.c_str(), &st) == 0) {
        if (const auto it = in.find({st.st_dev, st.st_ino}); it != in.end())
          throw io_error(o.what + " " + quoted_path(o.path.string()) + " is the " + it->second->what + " " + quoted_path(it->second->path.string()) +
                         ": refusing to overwrite its input");
        key = std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
      } else {
        std::error_code ec;
        key = std::filesystem::weakly_canonical(o.path, ec).string();
        if (ec) key = std::filesystem::absolute(o.path, ec).string();
      }
      if (const std::string why = why_not_replaceable(o.path); !why.empty()) {
        struct stat lst {};
        const bool link = ::lstat(o.path.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode);
        throw io_error(o.what + " " + why + (link ? " (give --follow-symlinks to write the file it points to)" : ""));
      }
      if (o.dir_ok) {  // its directory is the command's to make: what of it exists must be directories
        // (`synth --out FILE`, `shard --plan PIPELINED --out FILE` failed with the file system's
        // bare `Not a directory: 'FILE/stage-0'`, naming no flag)
        for (std::filesystem::path dir = o.path.parent_path(); !dir.empty(); dir = dir.parent_path()) {
          struct stat dst {};
          if (::stat(dir.c_str(), &dst) != 0) {
            if (dir == dir.parent_path()) break;
            continue;
          }
          if (!S_ISDIR(dst.st_mode))
            throw io_error(o.what + " " + quoted_path(o.path.string()) + ": " + quoted_path(dir.string()) + " is " + kind(dst.st_mode) +
                           ", not a directory (give a directory to make or to write into)");
          break;
        }
      } else {  // for an output: its directory must exist and be writable
        const std::filesystem::path dir = o.path.parent_path().empty() ? std::filesystem::path(".") : o.path.parent_path();
        struct stat dst {};
        if (::stat(dir.c_str(), &dst) != 0)
          throw io_error(o.what + " " + quoted_path(o.path.string()) + ": cannot write into " + quoted_path(dir.string()) + ": " + std::strerror(errno));
        if (!S_ISDIR(dst.st_mode))
          throw io_error(o.what + " " + quoted_path(o.path.string()) + ": " + quoted_path(dir.string()) + " is " + kind(dst.st_mode) + ", not a directory");
        if (::access(dir.c_str(), W_OK | X_OK) != 0)
          throw io_error(o.what + " " + quoted_path(o.path.string()) + ": cannot write into " + quoted_path(dir.string()) + ": " + std::strerror(errno));
      }
      if (const auto [it, fresh] = seen.emplace(key, &o); !fresh)
        throw io_error(o.what + " " + quoted_path(o.path.string()) + " and " + it->second->what + " " + quoted_path(it->second->path.string()) +
                       " are the same file: give each output its own path");
    }
  }

 private:
  struct entry {
    std::string what;
    std::filesystem::path path;
    bool dir_ok = false;  ///< an input: may be a directory; an output: its directory is made by the command
  };
  static std::string kind(mode_t m) {
    if (S_ISFIFO(m)) return "a FIFO (reading it could wait forever)";
    return detail::file_kind(m);
  }
  bool follow_ = false;
  std::vector<entry> inputs_, outputs_;
};

}  // namespace autoshard::tool
