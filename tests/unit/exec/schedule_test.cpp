// The liveness schedule the executor runs and the memory estimate walks (exec/schedule.hpp):
// every value is freed, none before its last reader has run, a parameter is finished at the
// backward of its first use, and GPT-2's MLP activation is computed again for its reader.
#include <doctest/doctest.h>

#include <autoshard/exec/exec.hpp>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

namespace schedule_test {
using namespace autoshard;

model_graph small_gpt2() {
  transformer_config c = transformer_config::gpt2(2, 64, 4);
  c.vocab = 128;
  c.max_positions = c.seq = 16;
  c.batch = 4;
  c.mode = run_mode::training;  // with its loss
  return build_gpt2(c);
}

/// Each vertex's position in the schedule's order.
std::vector<std::size_t> positions(const liveness_schedule& s) {
  std::vector<std::size_t> at(s.order.size());
  for (std::size_t i = 0; i < s.order.size(); ++i) at[s.order[i]] = i;
  return at;
}

/// How often each vertex's value is freed by the forward half, and where (the last place).
struct forward_frees {
  std::vector<int> count;
  std::vector<vertex_t> where;
};
forward_frees freed_in_forward(const model_graph& g, const liveness_schedule& s) {
  const std::size_t n = boost::num_vertices(g);
  forward_frees f{std::vector<int>(n, 0), std::vector<vertex_t>(n, 0)};
  for (vertex_t v : s.order) {
    for (vertex_t u : s.forward_frees[v]) {
      ++f.count[u];
      f.where[u] = v;
    }
    if (s.forward_frees_itself[v]) {
      ++f.count[v];
      f.where[v] = v;
    }
  }
  return f;
}

TEST_CASE("inference: every value, a source's too, is freed once, right after its last consumer") {
  const model_graph g = small_gpt2();
  const liveness_schedule s = make_liveness_schedule(g, nullptr, run_mode::inference);
  const std::vector<std::size_t> at = positions(s);
  const forward_frees f = freed_in_forward(g, s);
  for (vertex_t u = 0; u < boost::num_vertices(g); ++u) {
    CAPTURE(g[u].name);
    CHECK(f.count[u] == 1);
    std::size_t last = at[u];  // no consumer: freed once it has run
    for (auto [e, end] = boost::out_edges(u, g); e != end; ++e) last = std::max(last, at[boost::target(*e, g)]);
    CHECK(at[f.where[u]] == last);
  }
}

TEST_CASE("training: values a backward reads live until it has run, GPT-2's gelu is recomputed, parameters finish at their first use") {
  const model_graph g = small_gpt2();
  const std::size_t n = boost::num_vertices(g);
  const liveness_schedule s = make_liveness_schedule(g, nullptr, run_mode::training);
  const std::vector<std::size_t> at = positions(s);
  const forward_frees f = freed_in_forward(g, s);
  std::vector<int> backward_freed(n, 0), finished(n, 0);
  std::vector<vertex_t> backward_where(n, 0);
  for (vertex_t v = 0; v < n; ++v) {
    const std::vector<vertex_t> ops = operands(g, v);
    for (vertex_t u : s.backward_frees[v]) {
      CHECK(std::find(ops.begin(), ops.end(), u) != ops.end());  // only an operand's value
      ++backward_freed[u];
      backward_where[u] = v;
    }
    for (vertex_t u : s.finished[v]) ++finished[u];
    for (vertex_t u : s.recomputed[v]) CHECK(std::find(ops.begin(), ops.end(), u) != ops.end());
  }
  std::size_t recomputed = 0;
  for (vertex_t u = 0; u < n; ++u) {
    CAPTURE(g[u].name);
    if (!g[u].is_operator()) {
      CHECK(f.count[u] == 0);  // sources stay: the step's parameters and inputs
      CHECK(finished[u] == (g[u].is_parameter() ? 1 : 0));
      continue;
    }
    // Freed by the forward or by the backward that reads it last; a recomputed value both times
    // (after its consumers' forwards, and the copy computed again after its reader's backward);
    // the loss never (a scalar, the step's result).
    const bool again = std::any_of(s.recomputed.begin(), s.recomputed.end(),
                                   [&](const std::vector<vertex_t>& r) { return std::find(r.begin(), r.end(), u) != r.end(); });
    recomputed += again ? 1 : 0;
    CHECK(f.count[u] + backward_freed[u] == (detail::is_training_loss(g, u) ? 0 : again ? 2 : 1));
    if (backward_freed[u] == 1) {  // the backward running last (earliest in the order) of its in-place readers
      for (auto [e, end] = boost::out_edges(u, g); e != end; ++e) {
        const vertex_t w = boost::target(*e, g);
        const std::vector<vertex_t> ops = operands(g, w);
        for (std::size_t i = 0; i < ops.size(); ++i)
          if (ops[i] == u && detail::backward_reads_operand(g[w].kind, i)) CHECK(at[w] >= at[backward_where[u]]);
      }
    }
  }
  std::size_t gelus = 0;
  for (vertex_t u = 0; u < n; ++u) gelus += g[u].is_operator() && g[u].kind == op_kind::gelu ? 1 : 0;
  CHECK(gelus == 2);
  CHECK(recomputed == gelus);  // one MLP activation a layer
  // A parameter is finished after the backward of its first use in the forward (the last backward to reach it).
  for (vertex_t v = 0; v < n; ++v)
    for (vertex_t p : s.finished[v]) {
      std::size_t first = n;
      for (auto [e, end] = boost::out_edges(p, g); e != end; ++e) first = std::min(first, at[boost::target(*e, g)]);
      CHECK(at[v] == first);
    }
  // The loss is the last reader of the logits: its backward may write d logits over them.
  for (vertex_t v = 0; v < n; ++v)
    if (g[v].is_operator() && g[v].kind == op_kind::cross_entropy) CHECK(s.last_reader_of_first[v] == 1);
}

TEST_CASE("a plan of the wrong size is refused with the counts") {
  const model_graph g = small_gpt2();
  const std::vector<strategy> plan(3);
  CHECK_THROWS_WITH_AS(make_liveness_schedule(g, &plan, run_mode::training),
                       doctest::Contains("the plan has 3 strategies for a graph of"), exec_error);
}

}  // namespace schedule_test
