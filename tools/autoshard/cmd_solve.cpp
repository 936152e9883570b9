// autoshard solve: a solver-level problem in the IOPDDL contest's JSON format; or, with
// --evaluate, the exact contest score of any solution to it.
#include "common.hpp"
#include "paths.hpp"
#include "progress.hpp"

#include <chrono>
#include <iomanip>
#include <iostream>

namespace autoshard::tool {
namespace {

struct solve_cli_options {
  std::string file;
  double time_limit = default_time_limit_s;  // the library's, as `plan`'s
  double mip_rel_gap = 0.0;
  std::string solution_out;
  std::string evaluate;
  int threads = 0;
  unsigned seed = 0;
  std::int64_t cutoff = -1;  ///< --cutoff (-1: none)
  bool json = false;
  bool quiet = false;
  bool follow_symlinks = false;
  bool progress = false;
};

/// --evaluate: google/iopddl's Evaluate, exactly. Exit 0 when the solution is feasible, 1 when not.
int run_evaluate(const solve_cli_options& o, const strategy_problem& p) {
  const std::vector<int> choice = read_iopddl_solution_file(o.evaluate, p);
  const evaluation ev = p.evaluate(choice);
  if (o.json) {
    nlohmann::json j{{"problem", p.name},
                     {"solution", o.evaluate},
                     {"feasible", ev.feasible},
                     {"objective", ev.feasible ? nlohmann::json(ev.objective) : nlohmann::json(nullptr)},
                     {"peak_usage", ev.peak.bytes},
                     {"usage_limit", p.usage_limit ? nlohmann::json(*p.usage_limit) : nlohmann::json(nullptr)},
                     {"why", ev.why}};
    std::cout << j.dump(2) << "\n";
  } else if (ev.feasible) {
    std::cout << "feasible  objective " << ev.objective << ", peak usage " << ev.peak.bytes << " at time "
              << ev.peak.time << "\n";
  } else {
    std::cout << "infeasible: " << escaped_text(ev.why) << "\n";  // it names a node by the problem file's name
  }
  return ev.feasible ? exit_ok : exit_user_error;
}

int run_solve(solve_cli_options o) {
  {  // a directory or FIFO: a clear error, no hang; the answer never written over the problem
    command_paths paths(o.follow_symlinks);
    paths.input("problem file", o.file);
    if (!o.evaluate.empty()) paths.input("--evaluate", o.evaluate);
    o.solution_out = paths.output_path("--solution-out", o.solution_out).string();
    paths.check();
  }
  // --time-limit is the command's, as the contest timed its solvers: reading a 1.3 GB request
  // takes about 12 s, which the solve does not get on top.
  const auto t0 = std::chrono::steady_clock::now();
  const strategy_problem p = read_iopddl_file(o.file);
  if (!o.evaluate.empty()) return run_evaluate(o, p);
  const double read_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (read_seconds >= o.time_limit)
    throw solver_error::none_found("--time-limit of " + human_seconds(o.time_limit) + " passed while the problem was read (" +
                                   human_seconds(read_seconds) + "): no time was left to solve it");
  solve_options so;
  so.time_limit = o.time_limit - read_seconds;
  so.mip_rel_gap = o.mip_rel_gap;
  so.threads = o.threads;
  so.seed = o.seed;
  if (o.cutoff >= 0) so.cutoff = o.cutoff;
  // The incumbent over time: on a terminal one line redrawn, with --progress plain lines.
  progress_printer progress(!o.quiet && progress_wanted(o.progress));
  so.on_progress = [&progress](const solve_progress& s) { progress(s); };
  const solve_result r = [&] {
    try {
      return solve_ilp(p, so);
    } catch (const solver_error& e) {
      if (!e.unproven()) throw;
      // The solve's own limit is what reading left: say both, or "time_limit of 3.2 s" reads
      // as a mistake against --time-limit 20.
      throw solver_error::none_found("--time-limit of " + human_seconds(o.time_limit) + ", the problem read in " +
                                     human_seconds(read_seconds) + ": " + std::string(e.message()));
    }
  }();
  progress.finish();
  if (!o.solution_out.empty()) write_iopddl_solution_file(o.solution_out, r.choice);

  if (o.json) {
    nlohmann::json sizes = nlohmann::json::array();
    for (const auto& s : r.sizes)
      sizes.push_back({{"stage", s.stage}, {"nodes", s.nodes}, {"edges", s.edges}, {"variables", s.variables},
                       {"rows", s.rows}, {"memory_rows", s.memory_rows}});
    nlohmann::json j{{"problem", p.name},
                     {"status", to_string(r.status)},
                     {"objective", r.objective},
                     {"bound", r.bound},
                     {"gap", r.gap},
                     {"stop", to_string(r.stop)},
                     {"stopped", r.stopped},
                     {"threads", r.threads},
                     {"search_rounds", r.search_rounds},
                     {"seconds", r.seconds},
                     {"read_seconds", read_seconds},
                     {"first_feasible_seconds", r.first_feasible_seconds},
                     {"peak_usage", r.peak.bytes},
                     {"usage_limit", p.usage_limit ? nlohmann::json(*p.usage_limit) : nlohmann::json(nullptr)},
                     {"choice", r.choice},
                     {"sizes", sizes}};
    std::cout << j.dump(2) << "\n";
    return exit_ok;
  }
  std::cout << "problem  " << (p.name.empty() ? escaped_text(o.file) : escaped_name(p.name)) << ": " << p.nodes.size() << " nodes, "
            << p.edges.size() << " edges"
            << (p.usage_limit ? ", usage limit " + std::to_string(*p.usage_limit) : std::string()) << "\n";
  std::cout << "status   " << to_string(r.status);
  if (r.status == solve_status::feasible)
    std::cout << " (gap " << std::setprecision(4) << 100.0 * r.gap << "% to bound " << r.bound << ")";
  std::cout << "\nstopped  " << to_string(r.stop) << ": " << r.stopped << "\nthreads  " << r.threads;
  std::cout << "\nobjective " << r.objective << "\ntime     " << human_seconds(r.seconds) << " (first feasible after "
            << human_seconds(r.first_feasible_seconds) << "; the problem read in " << human_seconds(read_seconds)
            << ")\npeak usage " << r.peak.bytes << "\n\nILP size\n";
  for (const auto& s : r.sizes)
    std::cout << "  " << std::left << std::setw(40) << s.stage << std::right << std::setw(8) << s.variables
              << " variables " << std::setw(8) << s.rows << " rows\n";
  std::cout << "\nnode  strategy  name\n";
  for (std::size_t v = 0; v < r.choice.size(); ++v)
    std::cout << std::setw(4) << v << "  " << std::setw(8) << r.choice[v] << "  " << escaped_name(p.nodes[v].name) << "\n";
  return exit_ok;
}

}  // namespace

void register_solve(CLI::App& app, action& run) {
  auto o = std::make_shared<solve_cli_options>();
  CLI::App* cmd = app.add_subcommand("solve", "solve a strategy problem in the IOPDDL JSON format");
  cmd->footer(
      "Examples:\n"
      "  autoshard solve problem.json\n"
      "  autoshard solve problem.json --time-limit 60 --mip-rel-gap 0.01 --json\n"
      "  autoshard solve problem.json --time-limit 120 --threads 2 --progress");

  cmd->add_option("problem", o->file, "problem file (IOPDDL JSON)")->required();
  cmd->add_option("--time-limit", o->time_limit, "seconds for the whole command, reading the problem included")
      ->capture_default_str()
      ->check(finite_in(0, 1e7, true));
  cmd->add_option("--mip-rel-gap", o->mip_rel_gap, "stop within this FRACTION of the bound (0.01 = 1%)")
      ->capture_default_str()
      ->check(finite_in(0, 1));
  cmd->add_option("--solution-out", o->solution_out, "write the answer in the contest's format: [0, 2, 1, ...]");
  cmd->add_option("--evaluate", o->evaluate,
                  "do not solve: evaluate this solution file exactly (exit 1 when it is infeasible)");
  add_follow_symlinks(*cmd, o->follow_symlinks);
  cmd->add_flag("--json", o->json, "write one JSON document to stdout");
  cmd->add_option("--threads", o->threads, "search threads (0: the cores available)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1024));
  cmd->add_option("--seed", o->seed, "seed of the search threads (same seed and threads: same answers)")
      ->capture_default_str()
      ->check(seed_value(std::numeric_limits<decltype(o->seed)>::max()));
  cmd->add_option("--cutoff", o->cutoff,
                  "only answers cheaper than this (problem units) matter: stop once a proven bound shows none exists")
      ->check(whole_in(static_cast<unsigned long long>(std::numeric_limits<std::int64_t>::max()), "a cutoff", "COST"));
  cmd->add_flag("--progress", o->progress,
                "print the incumbent and the proven bound over time on stderr (one line per better answer and about "
                "one a second), even when it is not a terminal");
  cmd->add_flag("--quiet", o->quiet, "no solver progress on stderr");
  cmd->callback([o, cmd, &run] {
    // --evaluate solves nothing: a solver option was taken without a word, and --solution-out
    // wrote no file (exit 0), though a script then read it as the answer.
    if (!o->evaluate.empty())
      refuse_given(*cmd, {"--solution-out", "--time-limit", "--mip-rel-gap", "--threads", "--seed", "--cutoff", "--progress"},
                   "--evaluate solves nothing (it scores the solution file given), so this option has nothing to act on: "
                   "leave it out, or solve without --evaluate");
    run = [o] { return run_solve(*o); };
  });
}

}  // namespace autoshard::tool
