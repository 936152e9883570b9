// The LP's size is counted before GLPK takes any memory (detail::lp_size_of): the count must
// be exactly the model glpk_model then builds, in both formulations, with forbidden pairs
// (no column in the marginal model) and after the reductions.
#include <doctest/doctest.h>

#include <autoshard/solve/ilp.hpp>

#include <random>

#include "brute.hpp"

namespace ad = autoshard::detail;

TEST_CASE("the LP's size counted up front is the size of the model built") {
  std::mt19937 rng(11);
  solve_test::random_spec spec;
  spec.max_nodes = 9;
  spec.max_strategies = 5;
  spec.p_inf = 0.15;
  int with_forbidden_pairs = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const autoshard::strategy_problem p = solve_test::random_problem(rng, spec);
    for (const bool reduce : {false, true}) {
      ad::reducer red(p, reduce);
      try {
        if (reduce)
          red.run();
        else
          red.update_binding();
      } catch (const autoshard::solver_error&) {
        continue;  // the reductions proved it infeasible: no model to build
      }
      const ad::reduced_view rv(red, {});
      if (rv.ilp_nodes.empty()) continue;
      for (const autoshard::ilp_formulation f : {autoshard::ilp_formulation::marginal, autoshard::ilp_formulation::naive_and}) {
        const ad::lp_size s = ad::lp_size_of(rv, f);
        const ad::glpk_model model(rv, f);
        CAPTURE(trial);
        CHECK(s.cols == static_cast<std::uint64_t>(glp_get_num_cols(model.lp.get())));
        CHECK(s.rows == static_cast<std::uint64_t>(glp_get_num_rows(model.lp.get())));
        CHECK(s.nonzeros == static_cast<std::uint64_t>(glp_get_num_nz(model.lp.get())));
        std::uint64_t entries = 0;
        for (const std::vector<int>& cols : model.pair_col) entries += cols.size();
        CHECK(s.pair_entries == entries);
        if (f == autoshard::ilp_formulation::marginal) {
          std::uint64_t node_cols = 0;
          for (std::size_t v : rv.ilp_nodes) node_cols += rv.node(v).size();
          if (s.cols < node_cols + s.pair_entries) ++with_forbidden_pairs;
        }
      }
    }
  }
  CHECK(with_forbidden_pairs > 0);  // the marginal count skipped forbidden pairs somewhere
}
