#pragma once
/// The one way autoshard writes a file: never a half file, never an input overwritten in
/// place, never anything but a regular file replaced. The bytes go to a temporary in the
/// target's directory under an unpredictable name (`<target>.tmp.<pid>.<16 hex digits>`,
/// created with O_CREAT|O_EXCL|O_NOFOLLOW, mode 0666 & ~umask), are fsync'd, renamed over the
/// target, and the directory is fsync'd. On any failure (or destruction without commit) the
/// temporary is removed and the target is untouched.
///   autoshard::write_file_atomically("plan.json", text);
///   autoshard::write_file_atomically("out.bin", [&](autoshard::atomic_file& f) { f.write(bytes); });
///   autoshard::atomic_file f("rank-0.safetensors");   // streaming: write(), then commit()
///
/// - A target that exists and is not a regular file (a FIFO, a device, a socket, a directory,
///   or a symbolic link, which is never followed) is refused before anything is written and
///   again at the rename: renaming over it would destroy the node (as root, a device's).
///   A caller that means a link's target resolves it first (resolve_output_link).
/// - A name too long for a temporary's suffix (names may have 255 bytes) gets a temporary of
///   a shortened stem (`<first bytes>~<8 hex of the name's hash>.tmp.<pid>.<16 hex>`).
/// - Temporaries that a killed writer left (its pid gone) under the target's temporary names
///   are removed when the next writer of that target starts (remove_stale_temporaries).
/// - Every live temporary is listed in a process-wide table without a size limit, so a
///   signal handler can remove them (remove_live_temporaries() is async-signal-safe).
#include <algorithm>    // std::min, std::max
#include <array>        // std::array
#include <atomic>       // std::atomic
#include <cerrno>       // errno
#include <chrono>       // std::chrono::steady_clock
#include <cstddef>      // std::byte
#include <cstdint>      // std::uint64_t
#include <cstdio>       // std::snprintf, std::rename
#include <cstring>      // std::strerror, std::memcpy
#include <filesystem>   // std::filesystem::path
#include <functional>   // std::function
#include <limits>       // std::numeric_limits
#include <mutex>        // std::mutex
#include <random>       // std::random_device
#include <span>         // std::span
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <unordered_map>  // std::unordered_map
#include <utility>      // std::exchange
#include <vector>       // std::vector

#include <fcntl.h>     // open, O_*, AT_FDCWD, renameat2 (glibc)
#include <signal.h>    // kill
#include <sys/stat.h>  // lstat, S_IS*
#include <unistd.h>    // write, fsync, close, unlink, getpid, rmdir

#include "../core/dtype.hpp"  // human_bytes_exact
#include "../core/error.hpp"  // io_error

namespace autoshard {

namespace detail {

inline std::string sys_error(const std::string& what, const std::filesystem::path& p) {
  return what + " " + quoted_path(p.string()) + ": " + std::strerror(errno);
}

/// What a file mode is, as a message says it.
inline std::string file_kind(mode_t m) {
  if (S_ISREG(m)) return "a regular file";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISLNK(m)) return "a symbolic link";
  return "not a regular file";
}

/// The table of live temporaries: chunks of 256 slots of C strings, linked, so that a signal
/// handler can walk it without locks or allocation. A chunk is added when every slot is taken
/// (any number of files may be open at once: a 4,096-rank shard) and is never freed, since a
/// handler may be walking it; at most the peak number of live temporaries is ever allocated.
struct live_temporaries {
  static constexpr std::size_t chunk_slots = 256;
  struct chunk {
    std::array<std::atomic<const char*>, chunk_slots> path{};
    std::atomic<std::size_t> used{0};
    std::atomic<chunk*> next{nullptr};
  };
  using slot = std::atomic<const char*>;
  chunk first;
  std::atomic<std::size_t> count{0};  ///< live temporaries (what the write buffers share)

  static live_temporaries& instance() {
    static live_temporaries t;
    return t;
  }
  struct handle {
    chunk* c = nullptr;
    slot* s = nullptr;
  };
  handle add(const char* p) {
    for (chunk* c = &first;;) {
      if (c->used.load() < chunk_slots)
        for (slot& s : c->path) {
          const char* expected = nullptr;
          if (s.compare_exchange_strong(expected, p)) {
            c->used.fetch_add(1);
            count.fetch_add(1);
            return {c, &s};
          }
        }
      chunk* n = c->next.load();
      if (n == nullptr) {
        auto* fresh = new chunk;  // never deleted (see above)
        if (c->next.compare_exchange_strong(n, fresh)) n = fresh;
        else delete fresh;  // another thread linked one first: n is it
      }
      c = n;
    }
  }
  static void remove(handle& h) noexcept {
    if (h.s == nullptr) return;
    h.s->store(nullptr);
    h.c->used.fetch_sub(1);
    instance().count.fetch_sub(1);
    h = {};
  }
  /// Only atomic loads, unlink() and rmdir(): async-signal-safe. The second pass removes the
  /// listed directories (an atomic_file_set's stage) that the first one emptied.
  void unlink_all() noexcept {
    for (chunk* c = &first; c != nullptr; c = c->next.load())
      for (slot& s : c->path)
        if (const char* p = s.load()) ::unlink(p);
    for (chunk* c = &first; c != nullptr; c = c->next.load())
      for (slot& s : c->path)
        if (const char* p = s.load()) ::rmdir(p);
  }
};

/// The longest file name Linux file systems take (NAME_MAX).
inline constexpr std::size_t max_file_name = 255;
/// ".tmp." + pid (at most 10 digits) + "." + 16 hex digits.
inline constexpr std::size_t temporary_suffix_max = 5 + 10 + 1 + 16;

/// The stem of `name`'s temporaries: the name itself, or, when the name leaves no room for the
/// suffix, its first bytes (not cut inside a UTF-8 character) + "~" + 8 hex digits of its hash,
/// so that two long names that share their first bytes still get different stems.
inline std::string temporary_stem(const std::string& name) {
  if (name.size() + temporary_suffix_max <= max_file_name) return name;
  std::uint32_t h = 2166136261u;  // FNV-1a
  for (const unsigned char c : name) h = (h ^ c) * 16777619u;
  char tag[16];
  std::snprintf(tag, sizeof tag, "~%08x", static_cast<unsigned>(h));
  std::size_t keep = max_file_name - temporary_suffix_max - 9;
  while (keep > 0 && (static_cast<unsigned char>(name[keep]) & 0xc0) == 0x80) --keep;
  return name.substr(0, keep) + tag;
}

/// The stem and writer's pid of a temporary's file name `<stem>.tmp.<pid>.<16 hex>` (what
/// atomic_file creates) or `<stem>.tmp.<pid>` (what earlier versions wrote), with a positive
/// decimal pid of at most 9 digits; pid 0 when `name` is not one.
struct temporary_name {
  std::string stem;
  pid_t pid = 0;
};
inline temporary_name parse_temporary_name(std::string_view name) {
  if (name.size() > 17 && name[name.size() - 17] == '.') {
    const std::string_view hex = name.substr(name.size() - 16);
    if (hex.find_first_not_of("0123456789abcdef") == std::string_view::npos) name.remove_suffix(17);
  }
  const std::size_t at = name.rfind(".tmp.");
  if (at == std::string_view::npos || at == 0) return {};
  const std::string_view digits = name.substr(at + 5);
  if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string_view::npos) return {};
  pid_t pid = 0;
  for (const char c : digits) pid = pid * 10 + (c - '0');
  return {std::string(name.substr(0, at)), pid};
}

/// The stale temporaries of the directory scanned last, by stem: one scan serves every file a
/// writer then creates there (a shard's thousands of rank files), not one scan per file.
struct stale_temporaries {
  std::mutex mu;
  std::filesystem::path dir;
  std::chrono::steady_clock::time_point scanned;
  std::unordered_map<std::string, std::vector<std::string>> by_stem;
  static stale_temporaries& instance() {
    static stale_temporaries s;
    return s;
  }
};

}  // namespace detail

/// Removes, from `dir`, the temporaries of the files named `names` that a killed writer left:
/// regular files named as atomic_file names them (`<name>.tmp.<pid>.<16 hex>`, or
/// `<name>.tmp.<pid>` as earlier versions did) whose writer is gone (kill(pid, 0) fails with
/// ESRCH). Nothing else is touched: not another name, a live (or another user's) pid, this
/// process's own, a link or a directory. Best effort: a file that cannot be removed stays.
/// Returns the removed. One scan of the directory serves calls for 5 s (atomic_file calls
/// this for its target). In a directory shared with another machine or pid namespace a live
/// writer's pid may look gone; that writer then fails with io_error (`cannot rename ...`),
/// never a half file.
inline std::vector<std::filesystem::path> remove_stale_temporaries(const std::filesystem::path& dir,
                                                                   const std::vector<std::string>& names) {
  namespace fs = std::filesystem;
  auto& cache = detail::stale_temporaries::instance();
  const std::lock_guard<std::mutex> lock(cache.mu);
  const auto now = std::chrono::steady_clock::now();
  const fs::path d = dir.empty() ? fs::path(".") : dir;
  if (cache.dir != d || now - cache.scanned > std::chrono::seconds(5)) {
    cache.dir = d;
    cache.scanned = now;
    cache.by_stem.clear();
    std::error_code ec;
    for (fs::directory_iterator it(d, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string n = it->path().filename().string();
      const detail::temporary_name t = detail::parse_temporary_name(n);
      if (t.pid <= 0 || t.pid == ::getpid()) continue;
      std::error_code sec;
      if (!fs::is_regular_file(it->symlink_status(sec))) continue;  // a link or a directory: not ours
      if (::kill(t.pid, 0) == 0 || errno != ESRCH) continue;          // alive, or not ours to judge (EPERM)
      cache.by_stem[t.stem].push_back(n);
    }
  }
  std::vector<fs::path> removed;
  for (const std::string& name : names) {
    const auto it = cache.by_stem.find(detail::temporary_stem(name));
    if (it == cache.by_stem.end()) continue;
    for (const std::string& n : it->second)
      if (::unlink((d / n).c_str()) == 0) removed.push_back(dir / n);
    cache.by_stem.erase(it);
  }
  return removed;
}

/// Why `target` may not be replaced by a new file ("" when it may): it names no file (it ends
/// in `/`, `.` or `..`: a name derived from it, `plan`'s `.dot` beside `--out dir/`, would be
/// a hidden file in that directory), or it exists and is not a regular file. A symbolic link
/// is not followed: it is refused as a link, whatever it points to.
inline std::string why_not_replaceable(const std::filesystem::path& target) {
  if (const std::filesystem::path f = target.filename(); f.empty() || f == "." || f == "..")
    return quoted_path(target.string()) + " names a directory, not a file: give the file's name";
  struct stat st {};
  if (::lstat(target.c_str(), &st) != 0 || S_ISREG(st.st_mode)) return {};  // absent (or unreadable: the create says why)
  std::string what = detail::file_kind(st.st_mode);
  if (S_ISLNK(st.st_mode)) {
    std::error_code ec;
    const auto to = std::filesystem::read_symlink(target, ec);
    if (!ec) what += " to " + quoted_path(to.string());
  }
  return quoted_path(target.string()) + " is " + what + ", not a regular file: refusing to replace it";
}

/// Throws io_error unless `target` is absent or a regular file (why_not_replaceable).
inline void check_replaceable(const std::filesystem::path& target) {
  if (std::string why = why_not_replaceable(target); !why.empty()) throw io_error(why);
}

/// Refuses, before a byte is written, `bytes` of output into directory `dir` (when it does not
/// exist yet, its nearest existing ancestor) whose file system has less space available to
/// this process (statvfs's f_bavail): io_error "<what> needs <n> but the file system of '<dir>'
/// has <m> available". A write into a full disk fails with ENOSPC and its temporaries are
/// removed, but meanwhile the disk was full for every program (synth filled a 50 MiB file system
/// before failing). A file system that cannot say is not refused: the writes report it.
inline void check_free_space(const std::filesystem::path& dir, std::uint64_t bytes, const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path at = fs::absolute(dir, ec);
  if (ec) return;
  while (!fs::exists(at, ec) && at.has_relative_path()) at = at.parent_path();
  const fs::space_info s = fs::space(at, ec);
  if (ec || s.available == static_cast<std::uintmax_t>(-1)) return;
  if (s.available < bytes)
    throw io_error(what + " needs " + human_bytes_exact(static_cast<std::int64_t>(std::min<std::uint64_t>(bytes, std::numeric_limits<std::int64_t>::max()))) +
                   " but the file system of " + quoted_path(at.string()) + " has " + human_bytes_exact(static_cast<std::int64_t>(s.available)) +
                   " available");
}

/// The file a symbolic link `p` points to, through up to 40 links (relative links resolved
/// against the link's directory); `p` itself when it is not a link. For a caller that was
/// asked to write through a link: the result is then replaced (or refused) as any target is.
inline std::filesystem::path resolve_output_link(std::filesystem::path p) {
  namespace fs = std::filesystem;
  for (int hops = 0;; ++hops) {
    std::error_code ec;
    if (!fs::is_symlink(fs::symlink_status(p, ec))) return p;
    if (hops == 40) throw io_error(quoted_path(p.string()) + ": too many levels of symbolic links");
    const fs::path to = fs::read_symlink(p, ec);
    if (ec) throw io_error("cannot read the symbolic link " + quoted_path(p.string()) + ": " + ec.message());
    p = to.is_absolute() ? to : p.parent_path() / to;
  }
}

/// Removes every temporary an atomic_file of this process has open right now. Only unlink()
/// and atomic loads: safe to call from a signal handler (then re-raise the signal).
inline void remove_live_temporaries() noexcept { detail::live_temporaries::instance().unlink_all(); }

/// One file written atomically, streaming: write() as often as needed, then commit().
/// Destroyed without commit(), it removes its temporary.
class atomic_file {
 public:
  explicit atomic_file(std::filesystem::path target) : final_(std::move(target)) {
    check_replaceable(final_);  // before a byte is written: a FIFO or a link is never replaced
    const std::string stem = detail::temporary_stem(final_.filename().string());
    (void)remove_stale_temporaries(final_.parent_path(), {final_.filename().string()});
    std::random_device rd;
    for (int attempt = 0;; ++attempt) {
      char suffix[48];
      const std::uint64_t r = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
      std::snprintf(suffix, sizeof suffix, ".tmp.%ld.%016llx", static_cast<long>(::getpid()), static_cast<unsigned long long>(r));
      tmp_ = final_.parent_path() / (stem + suffix);
      // Listed before it exists: a signal between open() and the listing would leave the
      // file behind (a handler that unlinks a name not yet created does no harm).
      tmp_c_ = tmp_.string();
      slot_ = detail::live_temporaries::instance().add(tmp_c_.c_str());
      fd_ = ::open(tmp_c_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
      if (fd_ >= 0) break;
      const int err = errno;
      detail::live_temporaries::remove(slot_);  // not ours: unlisted at once
      errno = err;
      if (err != EEXIST || attempt >= 16) throw io_error(detail::sys_error("cannot create", tmp_));
    }
  }
  atomic_file(const atomic_file&) = delete;
  atomic_file& operator=(const atomic_file&) = delete;
  ~atomic_file() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_c_.c_str());
    detail::live_temporaries::remove(slot_);
  }

  void write(std::span<const std::byte> data) {
    const std::size_t limit = buffer_limit();
    if (buf_.size() + data.size() <= limit) {
      buffer(data);
      return;
    }
    flush_buffer();
    if (data.size() >= limit) raw_write(data.data(), data.size());
    else buffer(data);
  }
  void write(std::string_view s) { write(std::as_bytes(std::span(s.data(), s.size()))); }
  /// Bytes written so far (buffered ones included; not what another program wrote to fd()).
  std::uint64_t written() const noexcept { return written_ + buf_.size(); }
  /// The temporary's descriptor, what write() buffered flushed first: for a program that
  /// writes the contents itself (Graphviz's output as its stdout). -1 once finished.
  int fd() {
    if (fd_ >= 0) flush_buffer();
    return fd_;
  }

  /// Flushes and fsyncs; the file stays under its temporary name.
  void finish() {
    if (fd_ < 0) return;  // already finished
    flush_buffer();
    if (::fsync(fd_) != 0) throw io_error(detail::sys_error("cannot fsync", tmp_));
    if (::close(std::exchange(fd_, -1)) != 0) throw io_error(detail::sys_error("cannot close", tmp_));
  }
  /// Renames over the target (only a regular file, or none, is replaced: checked again, and
  /// a target that appears after the check is not replaced unless it is a regular file) and
  /// fsyncs the directory.
  void commit() {
    finish();
    rename_over_target();
    committed_ = true;
    detail::live_temporaries::remove(slot_);
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
  /// The write buffers of all open files share 64 MiB: 1 MiB each for up to 64 files, down to
  /// 16 KiB each (a 4,096-rank shard held 1.9 GB of buffers at 1 MiB a file).
  static std::size_t buffer_limit() noexcept {
    const std::size_t open = std::max<std::size_t>(detail::live_temporaries::instance().count.load(), 1);
    return std::clamp((std::size_t{64} << 20) / open, std::size_t{16} << 10, std::size_t{1} << 20);
  }
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
  void rename_over_target() {
    auto fail = [&](int err) {
      errno = err;
      throw io_error("cannot rename " + quoted_path(tmp_.string()) + " to " + quoted_path(final_.string()) + ": " + std::strerror(err));
    };
    for (int attempt = 0; attempt < 4; ++attempt) {
      check_replaceable(final_);  // replaced by a FIFO or a link since the constructor: refused
      struct stat st {};
      if (::lstat(final_.c_str(), &st) == 0) {  // a regular file: replaced
        if (::rename(tmp_c_.c_str(), final_.c_str()) != 0) fail(errno);
        return;
      }
#if defined(RENAME_NOREPLACE)
      // None there: created only if still none, so nothing planted since the check is replaced.
      if (::renameat2(AT_FDCWD, tmp_c_.c_str(), AT_FDCWD, final_.c_str(), RENAME_NOREPLACE) == 0) return;
      if (errno == EEXIST) continue;  // something appeared: look again
      if (errno != EINVAL && errno != ENOSYS) fail(errno);
#endif
      if (::rename(tmp_c_.c_str(), final_.c_str()) != 0) fail(errno);  // no RENAME_NOREPLACE here
      return;
    }
    check_replaceable(final_);
    fail(EEXIST);
  }
  std::filesystem::path final_, tmp_;
  std::string tmp_c_;  // what the live-temporaries table points at
  int fd_ = -1;
  detail::live_temporaries::handle slot_;
  bool committed_ = false;
  std::uint64_t written_ = 0;
  std::vector<std::byte> buf_;
  /// Appends to the buffer. (resize + memcpy: GCC 12 at -O3 reports vector::insert of a span as
  /// writing out of bounds, a false positive that fails -Werror builds.)
  void buffer(std::span<const std::byte> data) {
    if (data.empty()) return;
    const std::size_t at = buf_.size();
    buf_.resize(at + data.size());
    std::memcpy(buf_.data() + at, data.data(), data.size());
  }
};

/// The directories a writer makes for its output, undone when it fails: create() makes a
/// directory and every missing one above it, one level at a time, and lists each it made
/// itself; destroyed without keep(), it removes them, deepest first, each only when it is
/// empty (rmdir): a directory that was there before, or that holds anything (another
/// program's file, an earlier run's output), stays. `synth --out a/b/c` or `shard --out
/// a/b/c` that failed mid-write left a/b/c (or a/b) behind, empty.
///   made_directories dirs;
///   dirs.create(out);             // as std::filesystem::create_directories
///   ... write, commit ...
///   dirs.keep();                  // succeeded: they stay
class made_directories {
 public:
  made_directories() = default;
  made_directories(made_directories&& o) noexcept : made_(std::exchange(o.made_, {})) {}
  made_directories& operator=(made_directories&&) = delete;
  made_directories(const made_directories&) = delete;
  made_directories& operator=(const made_directories&) = delete;
  ~made_directories() { remove(); }

  /// Makes `dir` and the directories above it that are missing (std::filesystem's error
  /// otherwise, as create_directories throws it).
  void create(const std::filesystem::path& dir) {
    namespace fs = std::filesystem;
    std::vector<fs::path> missing;
    std::error_code ec;
    for (fs::path p = dir; !p.empty() && !fs::exists(fs::symlink_status(p, ec)); p = p.parent_path()) {
      missing.push_back(p);
      if (p == p.parent_path() || !p.has_relative_path()) break;
    }
    if (missing.empty()) {
      fs::create_directories(dir);  // there (or a link to one): its own error when it is no directory
      return;
    }
    for (auto it = missing.rbegin(); it != missing.rend(); ++it)
      if (fs::create_directory(*it)) made_.push_back(*it);  // false: another program made it meanwhile
  }
  /// The output is in place: the directories made stay.
  void keep() noexcept { made_.clear(); }
  /// Removes the directories made (deepest first, each only when empty) now.
  void remove() noexcept {
    for (auto it = made_.rbegin(); it != made_.rend(); ++it) (void)::rmdir(it->c_str());
    made_.clear();
  }
  const std::vector<std::filesystem::path>& made() const noexcept { return made_; }

 private:
  std::vector<std::filesystem::path> made_;
};

/// Files that appear in a directory together, or not at all (synth's model.safetensors and
/// config.json: a reader of one without the other, or of one beside an earlier run's other,
/// reads a model that was never written). The caller writes each file under its name into
/// stage() by the ordinary means (atomic_file, safetensors_writer) and commits it there; then
/// commit() puts the set in `dir`:
///   atomic_file_set set(out, {"model.safetensors", "config.json"});  // the last name last
///   write_file_atomically(set.stage() / "config.json", text);  ...
///   set.commit();
/// - `dir` missing: the stage is a fresh directory beside it (`<dir>.tmp.<pid>.<16 hex>`, in
///   the directories made above it), renamed to `dir` only if `dir` is still missing: one
///   rename, the set appears whole or not at all.
/// - `dir` a directory (not a link, nor a mount point, nor this process's working directory or
///   one above it) that holds nothing but files of these names (an earlier run's set, whole or
///   not): the stage beside it takes `dir`'s owner and mode and is exchanged with it in one
///   rename (RENAME_EXCHANGE); the earlier files, now under the stage's name, are removed with it. A
///   crash at any point leaves `dir` as it was, or with the new set whole. (`dir` is then
///   another directory of the same name: a program working in the earlier one, another shell,
///   sees it emptied and finds the set by its path again.)
/// - otherwise (`dir` holds other files, is a link, a mount point, its parent cannot be
///   written, the file system exchanges no directories, or `follow_symlinks` and a file's name
///   there is a link, whose file is replaced where it is): the stage is inside `dir` and the
///   files are moved out one by one, the last name last, and an earlier file of the last name
///   that differs from the new one is removed before any. A crash between these renames
///   (metadata only) leaves the new files without the last one, which readers of the set must
///   refuse (every reader refuses weights without a config.json), never new files beside an
///   earlier last one; the next run repairs it.
/// Uncommitted, it removes its stage with what was written into it, then the directories it
/// made above `dir`; a signal handler's remove_live_temporaries() removes the stage too (when
/// only temporaries were in it). A stage that a killed run left (its pid gone) is removed by the
/// next set written to `dir`: the set's files and their temporaries in it, then the stage if
/// that empties it. `before_step`, when set, is called before each step of commit() with its
/// name ("rename", "exchange", "clean", "remove <name>", "move <name>"): the tests' fault hook.
class atomic_file_set {
 public:
  atomic_file_set(const std::filesystem::path& dir, std::vector<std::string> names, bool follow_symlinks = false)
      : names_(std::move(names)) {
    namespace fs = std::filesystem;
    if (names_.empty()) throw io_error("atomic_file_set: no file names");
    fs::path abs = fs::absolute(dir).lexically_normal();
    if (!abs.has_filename() && abs.has_relative_path()) abs = abs.parent_path();  // "a/b/" names "a/b"
    dir_ = abs;
    for (const std::string& n : names_) targets_.push_back(abs / n);
    if (follow_symlinks && follow_links(dir)) {  // each file to where its link points: moved one by one
      how_ = how::move;
      make_stage(abs, detail::temporary_stem(abs.filename().string()), true);
      return;
    }
    const std::string base = detail::temporary_stem(abs.filename().empty() ? std::string("out") : abs.filename().string());
    const fs::path parent = abs.parent_path();
    struct stat st {};
    if (::lstat(abs.c_str(), &st) != 0) {
      if (errno != ENOENT) throw io_error(detail::sys_error("cannot look at", abs));
      dirs_.create(parent);
      remove_stale_stages(parent, base);
      how_ = how::create;
      make_stage(parent, base, true);
      return;
    }
    if (S_ISDIR(st.st_mode)) {
      remove_stale_stages(abs, base);
      (void)remove_stale_temporaries(abs, names_);
      struct stat pst {};
      if (holds_only_names(abs) && ::stat(parent.c_str(), &pst) == 0 && pst.st_dev == st.st_dev && !holds_working_directory(abs)) {
        remove_stale_stages(parent, base);
        if (make_stage(parent, base, false)) {
          how_ = how::exchange;
          mode_ = st.st_mode & 07777;
          uid_ = st.st_uid;
          gid_ = st.st_gid;
          return;
        }
      }
    } else if (!S_ISLNK(st.st_mode)) {
      throw io_error(quoted_path(dir.string()) + " is " + detail::file_kind(st.st_mode) + ", not a directory");
    } else {  // a link (to a directory, or the stage's mkdir fails below): the stage inside it
      remove_stale_stages(abs, base);
      (void)remove_stale_temporaries(abs, names_);
    }
    how_ = how::move;
    make_stage(abs, base, true);
  }
  atomic_file_set(const atomic_file_set&) = delete;
  atomic_file_set& operator=(const atomic_file_set&) = delete;
  ~atomic_file_set() {
    if (!committed_) remove_stage(stage_, names_);
    detail::live_temporaries::remove(slot_);
  }

  /// Where to write the files, each under its name.
  const std::filesystem::path& stage() const noexcept { return stage_; }
  /// The directory the set is put in.
  const std::filesystem::path& directory() const noexcept { return dir_; }

  /// Puts the set in place (see the class); every file must be in the stage under its name.
  void commit() {
    for (const std::string& n : names_) {
      struct stat st {};
      if (::lstat((stage_ / n).c_str(), &st) != 0 || !S_ISREG(st.st_mode))
        throw io_error("atomic_file_set: " + quoted_path((stage_ / n).string()) + " was not written");
    }
    sync_directory(stage_);
    if (how_ == how::create) {
      step("rename");
      if (rename_noreplace(stage_, dir_)) {
        done(dir_.parent_path());
        return;
      }
      how_ = how::move;  // `dir` appeared meanwhile: moved into one by one
    }
#if defined(RENAME_EXCHANGE)
    if (how_ == how::exchange) {
      // The directory keeps its owner (`sudo synth --out` over a user's directory left it
      // root's) and its mode, the mode after (chown may clear set-id bits); best effort.
      if (::chown(stage_.c_str(), uid_, gid_) != 0) { /* not permitted: the stage stays this process's */ }
      ::chmod(stage_.c_str(), mode_);
      step("exchange");
      if (::renameat2(AT_FDCWD, stage_.c_str(), AT_FDCWD, dir_.c_str(), RENAME_EXCHANGE) == 0) {
        done(dir_.parent_path());
        step("clean");
        remove_stage(stage_, names_);  // the earlier set, now under the stage's name
        return;
      }
    }
#endif
    move_out();
    done(dir_);
  }

  /// For tests: called before each step of commit() with its name.
  std::function<void(const std::string& step)> before_step;

 private:
  enum class how { create, exchange, move };
  std::vector<std::string> names_;
  made_directories dirs_;
  std::filesystem::path dir_, stage_;
  std::string stage_c_;  // what the live-temporaries table points at
  detail::live_temporaries::handle slot_;
  std::vector<std::filesystem::path> targets_;  // where each file goes: dir_ / name, or where its link points
  how how_ = how::move;
  mode_t mode_ = 0;
  uid_t uid_ = 0;
  gid_t gid_ = 0;
  bool committed_ = false;

  void step(const std::string& s) {
    if (before_step) before_step(s);
  }
  void done(const std::filesystem::path& synced) {
    committed_ = true;
    detail::live_temporaries::remove(slot_);
    dirs_.keep();
    sync_directory(synced);
  }
  static void sync_directory(const std::filesystem::path& d) noexcept {
    const int dfd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }
  /// Whether `name` is one of the set's files or a temporary of one.
  static bool of_set(const std::string& name, const std::vector<std::string>& names) {
    const detail::temporary_name t = detail::parse_temporary_name(name);
    for (const std::string& n : names)
      if (name == n || (t.pid > 0 && t.stem == detail::temporary_stem(n))) return true;
    return false;
  }
  /// Whether `d` holds nothing but regular files of the set's names.
  bool holds_only_names(const std::filesystem::path& d) const {
    namespace fs = std::filesystem;
    std::error_code ec;
    for (fs::directory_iterator it(d, ec), end; it != end; it.increment(ec)) {
      if (ec) return false;
      const std::string n = it->path().filename().string();
      if (std::find(names_.begin(), names_.end(), n) == names_.end() || !fs::is_regular_file(it->symlink_status(ec))) return false;
    }
    return !ec;
  }
  /// Whether this process works in `d` or below it: an exchange would leave it in the removed
  /// directory (`cd out && synth --out .` did, and the shell saw an empty one).
  static bool holds_working_directory(const std::filesystem::path& d) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path cwd = fs::current_path(ec), dir = fs::canonical(d, ec);
    if (ec) return true;  // unknown: not exchanged
    const fs::path rel = cwd.lexically_relative(dir);
    return !rel.empty() && *rel.begin() != "..";
  }
  /// Removes the set's files and their temporaries from the stage `d`, then `d` if that empties it.
  static void remove_stage(const std::filesystem::path& d, const std::vector<std::string>& names) noexcept {
    namespace fs = std::filesystem;
    if (d.empty()) return;
    try {
      std::error_code ec;
      std::vector<fs::path> gone;
      for (fs::directory_iterator it(d, ec), end; !ec && it != end; it.increment(ec))
        if (of_set(it->path().filename().string(), names) && !fs::is_directory(it->symlink_status(ec))) gone.push_back(it->path());
      for (const fs::path& p : gone) ::unlink(p.c_str());
    } catch (...) {  // an allocation: what is left stays for the next run
    }
    ::rmdir(d.c_str());
  }
  /// Removes the stages (`<base>.tmp.<pid>.<16 hex>` directories in `where`) of killed runs.
  void remove_stale_stages(const std::filesystem::path& where, const std::string& base) const {
    namespace fs = std::filesystem;
    std::error_code ec;
    std::vector<fs::path> stale;
    for (fs::directory_iterator it(where, ec), end; !ec && it != end; it.increment(ec)) {
      const detail::temporary_name t = detail::parse_temporary_name(it->path().filename().string());
      if (t.pid <= 0 || t.pid == ::getpid() || t.stem != base) continue;
      std::error_code sec;
      if (!fs::is_directory(it->symlink_status(sec))) continue;  // a file or a link: not a stage
      if (::kill(t.pid, 0) == 0 || errno != ESRCH) continue;      // alive, or not ours to judge
      stale.push_back(it->path());
    }
    for (const fs::path& p : stale) remove_stage(p, names_);
  }
  /// Makes a fresh stage in `where`; false when `where` may not be written and `must` is false.
  bool make_stage(const std::filesystem::path& where, const std::string& base, bool must) {
    std::random_device rd;
    for (int attempt = 0;; ++attempt) {
      char suffix[48];
      const std::uint64_t r = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
      std::snprintf(suffix, sizeof suffix, ".tmp.%ld.%016llx", static_cast<long>(::getpid()), static_cast<unsigned long long>(r));
      stage_ = where / (base + suffix);
      stage_c_ = stage_.string();
      slot_ = detail::live_temporaries::instance().add(stage_c_.c_str());  // listed first, as atomic_file does
      if (::mkdir(stage_c_.c_str(), 0777) == 0) return true;
      const int err = errno;
      detail::live_temporaries::remove(slot_);
      if (err == EEXIST && attempt < 16) continue;
      const std::filesystem::path tried = stage_;
      stage_.clear();
      stage_c_.clear();
      if (!must && (err == EACCES || err == EPERM || err == EROFS)) return false;
      errno = err;
      throw io_error(detail::sys_error("cannot create", tried));
    }
  }
  /// Renames `from` to `to` only if `to` is missing; false when it is there.
  static bool rename_noreplace(const std::filesystem::path& from, const std::filesystem::path& to) {
#if defined(RENAME_NOREPLACE)
    if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return true;
    if (errno == EEXIST) return false;
    if (errno != EINVAL && errno != ENOSYS) throw io_error(rename_error(from, to, errno));
#endif
    struct stat st {};
    if (::lstat(to.c_str(), &st) == 0) return false;
    if (::rename(from.c_str(), to.c_str()) != 0) throw io_error(rename_error(from, to, errno));
    return true;
  }
  static std::string rename_error(const std::filesystem::path& from, const std::filesystem::path& to, int err) {
    return "cannot rename " + quoted_path(from.string()) + " to " + quoted_path(to.string()) + ": " + std::strerror(err);
  }
  /// Whether files `a` and `b` hold the same bytes (false when either cannot be read).
  static bool same_bytes(const std::filesystem::path& a, const std::filesystem::path& b) {
    struct stat sa {}, sb {};
    if (::lstat(a.c_str(), &sa) != 0 || ::lstat(b.c_str(), &sb) != 0 || !S_ISREG(sa.st_mode) || sa.st_size != sb.st_size) return false;
    const int fa = ::open(a.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW), fb = ::open(b.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    bool same = fa >= 0 && fb >= 0;
    std::vector<char> ba(1 << 16), bb(1 << 16);
    while (same) {
      const ssize_t ka = ::read(fa, ba.data(), ba.size());
      const ssize_t kb = ka > 0 ? ::read(fb, bb.data(), static_cast<std::size_t>(ka)) : 0;
      if (ka <= 0) break;
      same = kb == ka && std::memcmp(ba.data(), bb.data(), static_cast<std::size_t>(ka)) == 0;
    }
    if (fa >= 0) ::close(fa);
    if (fb >= 0) ::close(fb);
    return same;
  }
  /// With --follow-symlinks: the files whose names in the directory are links go where the
  /// links point (resolve_output_link). Renamed there from the stage, they must be on its file
  /// system: refused before anything is written otherwise. Whether any was a link.
  bool follow_links(const std::filesystem::path& dir) {
    bool any = false;
    struct stat ds {};
    for (std::size_t i = 0; i < names_.size(); ++i) {
      struct stat st {};
      if (::lstat(targets_[i].c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) continue;
      targets_[i] = resolve_output_link(targets_[i]);
      any = true;
      struct stat ts {};
      const std::filesystem::path at = targets_[i].parent_path().empty() ? std::filesystem::path(".") : targets_[i].parent_path();
      if (::stat(dir_.c_str(), &ds) == 0 && ::stat(at.c_str(), &ts) == 0 && ts.st_dev != ds.st_dev)
        throw io_error(quoted_path((dir / names_[i]).string()) + " is a symbolic link to " + quoted_path(targets_[i].string()) +
                       ", on another file system than " + quoted_path(dir.string()) +
                       ": the files are put in place by renames from there; write them elsewhere and copy");
    }
    return any;
  }
  /// The files moved out of the stage one by one, the last name last (see the class).
  void move_out() {
    const std::string& last = names_.back();
    const std::filesystem::path older = targets_.back();
    struct stat st {};
    if (::lstat(older.c_str(), &st) == 0 && !same_bytes(older, stage_ / last)) {
      check_replaceable(older);
      step("remove " + last);
      if (::unlink(older.c_str()) != 0 && errno != ENOENT)
        throw io_error(detail::sys_error("cannot remove the earlier", older) + " before the new set is put in place");
    }
    for (std::size_t i = 0; i < names_.size(); ++i) {
      const std::string& n = names_[i];
      const std::filesystem::path& to = targets_[i];
      check_replaceable(to);
      step("move " + n);
      if (::rename((stage_ / n).c_str(), to.c_str()) != 0) throw io_error(rename_error(stage_ / n, to, errno));
    }
    ::rmdir(stage_.c_str());
  }
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
