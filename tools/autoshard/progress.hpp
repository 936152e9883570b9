#pragma once
// Solver progress on stderr: one updating line on a terminal, plain lines otherwise.
#include <autoshard/solve/solve.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdio>

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
    std::fprintf(stderr, "%ssolver: round %d  incumbent %s  bound %s  gap %s  %.1f s%s", tty_ ? "\r\033[K" : "",
                 p.round, inc, bnd, gap, p.seconds, tty_ ? "" : "\n");
    std::fflush(stderr);
    printed_ = true;
  }
  void finish() {
    if (enabled_ && tty_ && printed_) std::fputc('\n', stderr);
    printed_ = false;
  }

 private:
  static void fmt(char* buf, std::size_t n, double v) {
    if (std::isfinite(v)) std::snprintf(buf, n, "%.6g", v);
    else std::snprintf(buf, n, "-");
  }
  bool enabled_;
  bool tty_;
  bool printed_ = false;
};

}  // namespace autoshard::tool
