#pragma once
// The search threads of solve_ilp and what they share. Thread 0 runs the exact pipeline (the
// heuristic, the LP relaxation, branch and bound, the exact search) and, when the LP relaxation
// cannot finish in its share of the time, the Lagrangian search; threads 1, 2, ... run the
// Lagrangian search (detail/lagrangian_search.hpp) from the start, each with its own seed. They
// work on one snapshot of the reduced problem taken before thread 0 tightens it (its tables
// shared read-only), each with its own state, and share nothing else while they search: each
// thread's sequence of answers depends only on its seed, so with the same seed and thread count
// the answers are the same, and thread k does the same with any thread count, so more threads
// never give a worse answer (the answer is the cheapest over the threads, ties to the lowest
// thread). Only the stop flag and the progress reports cross threads.
#if defined(__linux__)
#include <sys/resource.h>  // getpriority, setpriority

#include <cerrno>  // errno
#endif

#include <algorithm>  // std::max, std::min
#include <atomic>     // std::atomic
#include <chrono>     // std::chrono::steady_clock
#include <cstddef>    // std::size_t
#include <cstdint>    // std::int64_t
#include <exception>  // std::exception_ptr
#include <functional>  // std::function
#include <limits>     // std::numeric_limits
#include <mutex>      // std::mutex
#include <optional>   // std::optional
#include <string>     // std::string
#include <system_error>  // std::system_error
#include <thread>     // std::thread
#include <vector>     // std::vector

#include "../problem.hpp"        // strategy_problem, evaluation
#include "lagrangian_search.hpp"  // lagrangian_search
#include "message_passing.hpp"    // mrf_tables
#include "reduce.hpp"             // reducer
#include "reduced_view.hpp"       // reduced_view

namespace autoshard::detail {

/// One line of progress as the threads see it, serialised: `report` is called under a lock.
class progress_hub {
 public:
  using clock = std::chrono::steady_clock;
  /// value: exact objective (problem units, integer); bound: proven lower bound.
  using sink = std::function<void(double incumbent, double bound, double seconds, const std::string& phase)>;

  progress_hub(sink s, double interval, clock::time_point t0) : sink_(std::move(s)), interval_(interval), t0_(t0) {}

  /// A feasible answer of exact objective `value` was found in `phase`: reported when cheaper.
  void incumbent(std::int64_t value, const std::string& phase) {
    std::lock_guard<std::mutex> lock(m_);
    if (value >= best_) return;
    if (best_ == std::numeric_limits<std::int64_t>::max())
      first_ = std::chrono::duration<double>(clock::now() - t0_).count();
    best_ = value;
    emit(phase, true);
  }
  /// A proven lower bound; reported with the next line.
  void bound(std::int64_t b) {
    std::lock_guard<std::mutex> lock(m_);
    bound_ = std::max(bound_, b);
  }
  /// A line when `interval` seconds have passed since the last one.
  void tick(const std::string& phase) {
    std::lock_guard<std::mutex> lock(m_);
    emit(phase, false);
  }
  std::int64_t best() const {
    std::lock_guard<std::mutex> lock(m_);
    return best_;
  }
  /// Seconds from the start to the first feasible answer of any thread (0 when none yet).
  double first_seconds() const {
    std::lock_guard<std::mutex> lock(m_);
    return first_;
  }
  std::int64_t proven_bound() const {
    std::lock_guard<std::mutex> lock(m_);
    return bound_;
  }
  /// The first exception a callback threw (the solve rethrows it once the threads have stopped).
  std::exception_ptr error() const {
    std::lock_guard<std::mutex> lock(m_);
    return error_;
  }

 private:
  sink sink_;
  double interval_;
  clock::time_point t0_;
  mutable std::mutex m_;
  std::int64_t best_ = std::numeric_limits<std::int64_t>::max();
  std::int64_t bound_ = std::numeric_limits<std::int64_t>::min();
  double last_ = -std::numeric_limits<double>::infinity();
  double first_ = 0.0;
  std::exception_ptr error_;

  void emit(const std::string& phase, bool force) {
    if (!sink_ || error_) return;
    const double now = std::chrono::duration<double>(clock::now() - t0_).count();
    if (!force && now - last_ < interval_) return;
    last_ = now;
    const double inc = best_ == std::numeric_limits<std::int64_t>::max() ? std::numeric_limits<double>::infinity()
                                                                          : static_cast<double>(best_);
    const double b = bound_ == std::numeric_limits<std::int64_t>::min() ? -std::numeric_limits<double>::infinity()
                                                                         : static_cast<double>(std::min(bound_, best_));
    try {
      sink_(inc, b, now, phase);
    } catch (...) {
      error_ = std::current_exception();
    }
  }
};

/// How a search thread ended.
enum class search_end { running, time_limit, work_limit, stalled, stopped };

/// The snapshot of the reduced problem the Lagrangian searches share, and their threads.
class search_pool {
 public:
  using clock = std::chrono::steady_clock;

  struct limits {
    clock::time_point deadline;
    std::size_t work_limit = 0;    ///< rounds per thread (0: none)
    std::size_t stall_rounds = 0;  ///< rounds without a cheaper answer that end a thread (0: never)
    unsigned seed = 0;
    /// solve_options::cutoff: once any proven bound reaches it, every thread stops (an answer
    /// found after that would cost the cutoff or more).
    std::optional<std::int64_t> cutoff;
  };

  /// One thread's outcome: its best answer (original choice, exact evaluation) and how it ended.
  struct result {
    std::optional<std::vector<int>> choice;
    std::int64_t objective = std::numeric_limits<std::int64_t>::max();
    std::size_t rounds = 0;
    search_end end = search_end::running;
    std::optional<std::int64_t> bound;  ///< proven lower bound (problem units)
  };

  /// Copies the reduced problem as it is now (its live tables only).
  search_pool(const strategy_problem& p, const reducer& red, std::vector<std::int64_t> candidate_times,
              progress_hub& hub, limits lim)
      : p_(p), red_(red, reducer::for_reading{}), view_(red_, std::move(candidate_times)), tables_(view_), hub_(hub), lim_(lim) {}

  search_pool(const search_pool&) = delete;
  search_pool& operator=(const search_pool&) = delete;
  ~search_pool() { stop(); }

  /// Start threads for search indices [first, first + count); returns how many started (a
  /// thread the system cannot create leaves the search to the threads that did start).
  std::size_t start(std::size_t first, std::size_t count) {
    std::size_t started = 0;
    for (std::size_t k = first; k < first + count; ++k) {
      slot(k);
      try {
        threads_.emplace_back([this, k] { run(k); });
        ++started;
      } catch (const std::system_error&) {
        std::lock_guard<std::mutex> lock(m_);
        results_.resize(k);  // never started: no result
        break;
      }
    }
    return started;
  }

  /// Run search index k on the calling thread until its limits (or `stop`).
  void run_here(std::size_t k, clock::time_point deadline) {
    slot(k);
    run(k, deadline);
  }

  /// Ask every thread to stop and wait for them.
  void stop() {
    stop_ = true;
    for (std::thread& t : threads_)
      if (t.joinable()) t.join();
    threads_.clear();
  }

  /// Wait for the threads without stopping them (they end at their own limits).
  void join() {
    for (std::thread& t : threads_)
      if (t.joinable()) t.join();
    threads_.clear();
  }

  /// Whether every started thread has ended (by its limits).
  bool all_ended() const {
    std::lock_guard<std::mutex> lock(m_);
    for (const result& r : results_)
      if (r.end == search_end::running) return false;
    return true;
  }

  /// The results per search index (after stop or join).
  const std::vector<result>& results() const { return results_; }
  /// Search index k's result once it has ended (run_here's, while the others still run).
  result result_of(std::size_t k) const {
    std::lock_guard<std::mutex> lock(m_);
    return k < results_.size() ? results_[k] : result{};
  }
  const reduced_view& view() const { return view_; }

 private:
  const strategy_problem& p_;
  reducer red_;
  reduced_view view_;
  mrf_tables tables_;
  progress_hub& hub_;
  limits lim_;
  std::atomic<bool> stop_{false};
  mutable std::mutex m_;
  std::vector<result> results_;
  std::vector<std::thread> threads_;

  void slot(std::size_t k) {
    std::lock_guard<std::mutex> lock(m_);
    if (results_.size() <= k) results_.resize(k + 1);
    results_[k].end = search_end::running;
  }

  /// A search thread started here runs at a lower priority (nice + 5, where threads have their
  /// own, as on Linux): on an idle machine it still gets its core, and on a busy one the ILP's
  /// thread keeps its share (B, G and P are proven on thread 0 alone).
  void run(std::size_t k) {
#if defined(__linux__)
    errno = 0;
    const int now = ::getpriority(PRIO_PROCESS, 0);
    if (errno == 0) (void)::setpriority(PRIO_PROCESS, 0, std::min(now + 5, 19));
#endif
    run(k, lim_.deadline);
  }

  void run(std::size_t k, clock::time_point deadline) {
    lagrangian_search s(tables_, lim_.seed * 1000003u + static_cast<unsigned>(k), {}, &stop_);
    search_end end = search_end::time_limit;
    result mine;
    s.start_from_greedy(deadline);
    for (;;) {
      if (stop_ || (lim_.cutoff && hub_.proven_bound() >= *lim_.cutoff)) {
        end = search_end::stopped;
        break;
      }
      if (clock::now() >= deadline) break;
      if (lim_.work_limit && s.rounds() >= lim_.work_limit) {
        end = search_end::work_limit;
        break;
      }
      if (lim_.stall_rounds && s.rounds_since_improvement() >= lim_.stall_rounds) {
        end = search_end::stalled;
        break;
      }
      const std::optional<wcost> before = s.bound();
      const bool better = s.round(deadline);
      if (s.bound() && (!before || *s.bound() > *before)) {
        const wcost b = wadd(red_.offset, *s.bound());
        mine.bound = b >= infinite_cost ? infinite_cost : static_cast<std::int64_t>(b);
        hub_.bound(*mine.bound);
      }
      if (better && s.best()) {
        std::vector<int> c(p_.nodes.size(), -1);
        for (std::size_t v : view_.ilp_nodes) c[v] = red_.nodes[v].strat[(*s.best())[v]];
        red_.unfold(c);
        evaluation ev = p_.evaluate(c);
        if (ev.feasible && ev.objective < mine.objective) {
          mine.objective = ev.objective;
          mine.choice = std::move(c);
          hub_.incumbent(ev.objective, "search " + std::to_string(k));
        }
      }
      hub_.tick("search " + std::to_string(k));
    }
    mine.rounds = s.rounds();
    mine.end = end;
    std::lock_guard<std::mutex> lock(m_);
    results_[k] = std::move(mine);
  }
};

}  // namespace autoshard::detail
