#pragma once
/// The one way autoshard writes a file: never a half file, never an input overwritten in
/// place. The bytes go to a temporary in the target's directory under an unpredictable name
/// (`<target>.tmp.<pid>.<16 hex digits>`, created with O_CREAT|O_EXCL|O_NOFOLLOW, mode
/// 0666 & ~umask), are fsync'd, renamed over the target, and the directory is fsync'd. On
/// any failure (or destruction without commit) the temporary is removed and the target is
/// untouched.
///   autoshard::write_file_atomically("plan.json", text);
///   autoshard::write_file_atomically("out.bin", [&](autoshard::atomic_file& f) { f.write(bytes); });
///   autoshard::atomic_file f("rank-0.safetensors");   // streaming: write(), then commit()
///
/// Every live temporary is listed in a process-wide table, so a signal handler can remove
/// them (remove_live_temporaries() is async-signal-safe).
#include <array>        // std::array
#include <atomic>       // std::atomic
#include <cerrno>       // errno
#include <cstddef>      // std::byte
#include <cstdint>      // std::uint64_t
#include <cstdio>       // std::snprintf
#include <cstring>      // std::strerror
#include <filesystem>   // std::filesystem::path
#include <functional>   // std::function
#include <random>       // std::random_device
#include <span>         // std::span
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <utility>      // std::exchange
#include <vector>       // std::vector

#include <fcntl.h>   // open, O_*
#include <unistd.h>  // write, fsync, close, unlink, getpid

#include "../core/error.hpp"  // io_error

namespace autoshard {

namespace detail {

inline std::string sys_error(const std::string& what, const std::filesystem::path& p) {
  return what + " '" + p.string() + "': " + std::strerror(errno);
}

/// The table of live temporaries: fixed slots of C strings, so that a signal handler can
/// read it without locks or allocation. A path that finds no free slot is simply not listed.
struct live_temporaries {
  static constexpr std::size_t slots = 256;
  std::array<std::atomic<const char*>, slots> path{};
  static live_temporaries& instance() {
    static live_temporaries t;
    return t;
  }
  int add(const char* p) noexcept {
    for (std::size_t i = 0; i < slots; ++i) {
      const char* expected = nullptr;
      if (path[i].compare_exchange_strong(expected, p)) return static_cast<int>(i);
    }
    return -1;
  }
  void remove(int slot) noexcept {
    if (slot >= 0) path[static_cast<std::size_t>(slot)].store(nullptr);
  }
};

}  // namespace detail

/// Removes every temporary an atomic_file of this process has open right now. Only unlink()
/// and atomic loads: safe to call from a signal handler (then re-raise the signal).
inline void remove_live_temporaries() noexcept {
  auto& t = detail::live_temporaries::instance();
  for (auto& slot : t.path)
    if (const char* p = slot.load()) ::unlink(p);
}

/// One file written atomically, streaming: write() as often as needed, then commit().
/// Destroyed without commit(), it removes its temporary.
class atomic_file {
 public:
  explicit atomic_file(std::filesystem::path target) : final_(std::move(target)) {
    std::random_device rd;
    for (int attempt = 0;; ++attempt) {
      char suffix[48];
      const std::uint64_t r = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
      std::snprintf(suffix, sizeof suffix, ".tmp.%ld.%016llx", static_cast<long>(::getpid()), static_cast<unsigned long long>(r));
      tmp_ = final_;
      tmp_ += suffix;
      // Listed before it exists: a signal between open() and the listing would leave the
      // file behind (a handler that unlinks a name not yet created does no harm).
      tmp_c_ = tmp_.string();
      slot_ = detail::live_temporaries::instance().add(tmp_c_.c_str());
      fd_ = ::open(tmp_c_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
      if (fd_ >= 0) break;
      const int err = errno;
      detail::live_temporaries::instance().remove(std::exchange(slot_, -1));  // not ours: unlisted at once
      errno = err;
      if (err != EEXIST || attempt >= 16) throw io_error(detail::sys_error("cannot create", tmp_));
    }
    buf_.reserve(buffer_size);
  }
  atomic_file(const atomic_file&) = delete;
  atomic_file& operator=(const atomic_file&) = delete;
  ~atomic_file() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_c_.c_str());
    detail::live_temporaries::instance().remove(slot_);
  }

  void write(std::span<const std::byte> data) {
    if (buf_.size() + data.size() <= buffer_size) {
      buf_.insert(buf_.end(), data.begin(), data.end());
      return;
    }
    flush_buffer();
    if (data.size() >= buffer_size) raw_write(data.data(), data.size());
    else buf_.insert(buf_.end(), data.begin(), data.end());
  }
  void write(std::string_view s) { write(std::as_bytes(std::span(s.data(), s.size()))); }
  /// Bytes written so far (buffered ones included).
  std::uint64_t written() const noexcept { return written_ + buf_.size(); }

  /// Flushes and fsyncs; the file stays under its temporary name.
  void finish() {
    if (fd_ < 0) return;  // already finished
    flush_buffer();
    if (::fsync(fd_) != 0) throw io_error(detail::sys_error("cannot fsync", tmp_));
    if (::close(std::exchange(fd_, -1)) != 0) throw io_error(detail::sys_error("cannot close", tmp_));
  }
  /// Renames over the target and fsyncs the directory.
  void commit() {
    finish();
    std::error_code ec;
    std::filesystem::rename(tmp_, final_, ec);
    if (ec) throw io_error("cannot rename '" + tmp_.string() + "' to '" + final_.string() + "': " + ec.message());
    committed_ = true;
    detail::live_temporaries::instance().remove(std::exchange(slot_, -1));
    const auto dir = final_.parent_path();
    const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {  // the rename is durable once the directory is; a failure here loses nothing written
      ::fsync(dfd);
      ::close(dfd);
    }
  }
  const std::filesystem::path& temporary_path() const noexcept { return tmp_; }
  const std::filesystem::path& target() const noexcept { return final_; }

 private:
  static constexpr std::size_t buffer_size = std::size_t{1} << 20;  // N files may be open at once
  void flush_buffer() {
    raw_write(buf_.data(), buf_.size());
    buf_.clear();
  }
  void raw_write(const std::byte* p, std::size_t n) {
    while (n > 0) {
      const ssize_t k = ::write(fd_, p, n);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) throw io_error(detail::sys_error("cannot write", tmp_));
      p += k;
      n -= static_cast<std::size_t>(k);
      written_ += static_cast<std::uint64_t>(k);
    }
  }
  std::filesystem::path final_, tmp_;
  std::string tmp_c_;  // what the live-temporaries table points at
  int fd_ = -1;
  int slot_ = -1;
  bool committed_ = false;
  std::uint64_t written_ = 0;
  std::vector<std::byte> buf_;
};

/// Writes `target` atomically with what `fill` writes into the file.
inline void write_file_atomically(const std::filesystem::path& target, const std::function<void(atomic_file&)>& fill) {
  atomic_file f(target);
  fill(f);
  f.commit();
}

/// Writes `target` atomically with `contents`.
inline void write_file_atomically(const std::filesystem::path& target, std::string_view contents) {
  atomic_file f(target);
  f.write(contents);
  f.commit();
}

}  // namespace autoshard
