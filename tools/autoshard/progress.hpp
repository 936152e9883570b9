#pragma once
// Progress on stderr: one updating line on a terminal, plain lines otherwise. The solver's
// rounds (progress_printer) and the phases of a long command (phase_printer).
#include <autoshard/solve/solve.hpp>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

namespace autoshard::tool {

class progress_printer {
 public:
  explicit progress_printer(bool enabled) : enabled_(enabled), tty_(::isatty(STDERR_FILENO) == 1) {}
  ~progress_printer() { finish(); }
  progress_printer(const progress_printer&) = delete;
  progress_printer& operator=(const progress_printer&) = delete;

  void operator()(const solve_progress& p) {
    if (!enabled_) return;
    char inc[32], bnd[32], gap[32];
    fmt(inc, sizeof inc, p.incumbent);
    fmt(bnd, sizeof bnd, p.bound);
    if (std::isfinite(p.gap)) std::snprintf(gap, sizeof gap, "%.3f%%", 100.0 * p.gap);
    else std::snprintf(gap, sizeof gap, "-");
    std::fprintf(stderr, "%ssolver: %.1f s  incumbent %s  bound %s  gap %s  (%s)%s", tty_ ? "\r\033[K" : "", p.seconds,
                 inc, bnd, gap, p.phase.c_str(), tty_ ? "" : "\n");
    std::fflush(stderr);
    printed_ = true;
  }
  void finish() {
    if (enabled_ && tty_ && printed_) std::fputc('\n', stderr);
    printed_ = false;
  }

 private:
  static void fmt(char* buf, std::size_t n, double v) {
    if (std::isfinite(v)) std::snprintf(buf, n, "%.0f", v);
    else std::snprintf(buf, n, "-");
  }
  bool enabled_;
  bool tty_;
  bool printed_ = false;
};

/// Whether phase progress is shown: asked for (--progress), or stderr is a terminal.
inline bool progress_wanted(bool asked) { return asked || ::isatty(STDERR_FILENO) == 1; }

/// The phases of a long command, each with a count: "verify: ranks: 96/312 pieces compared
/// (1.4 s)". On a terminal one line redrawn in place (at most 10 times a second); otherwise
/// plain lines: a phase's start, its end, and at most one a second between. Never on stdout,
/// so a --json document stays one document.
class phase_printer {
 public:
  phase_printer(bool enabled, std::string command) : enabled_(enabled), tty_(::isatty(STDERR_FILENO) == 1), command_(std::move(command)) {}
  ~phase_printer() { finish(); }
  phase_printer(const phase_printer&) = delete;
  phase_printer& operator=(const phase_printer&) = delete;

  /// `phase` at `done` of `total` `what` (e.g. "pieces compared"), `seconds` since the start.
  void operator()(const std::string& phase, std::size_t done, std::size_t total, const std::string& what, double seconds) {
    if (!enabled_) return;
    const auto now = std::chrono::steady_clock::now();
    const bool edge = phase != phase_ || done == 0 || done >= total;
    if (!edge && now - last_ < (tty_ ? std::chrono::milliseconds(100) : std::chrono::milliseconds(1000))) return;
    if (tty_ && printed_ && phase != phase_) std::fputc('\n', stderr);  // keep the finished phase's last line
    phase_ = phase;
    last_ = now;
    std::fprintf(stderr, "%s%s: %s: %zu/%zu %s (%.1f s)%s", tty_ ? "\r\033[K" : "", command_.c_str(), phase.c_str(), done,
                 total, what.c_str(), seconds, tty_ ? "" : "\n");
    std::fflush(stderr);
    printed_ = true;
  }
  void finish() {
    if (enabled_ && tty_ && printed_) std::fputc('\n', stderr);
    printed_ = false;
    phase_.clear();
  }

 private:
  bool enabled_;
  bool tty_;
  bool printed_ = false;
  std::string command_, phase_;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace autoshard::tool
