#pragma once
/// The communication audit: the collectives a plan's execution actually issued (each rank's
/// collective_ledger, comm/ledger.hpp) against the collectives the cost model priced for
/// that plan (plan_summary::collectives), site by site (graph/traffic.hpp), kind by kind and
/// mesh axis by mesh axis, and in total. A difference is a failure unless it is one of the
/// documented approximations (docs/execution.md, "Communication audit").
///   autoshard::traffic_audit a = autoshard::audit_traffic(g, summary.collectives, ledgers, true, true);
///   if (!a.passed()) std::cout << a.lines[a.first_mismatch].site;
/// Bytes and calls are per rank over the whole step (every micro-step), in the model's dtype (what the cost model prices), whatever dtype the
/// run computed in: executed elements x the tensor's element size (4 for the f32 row
/// statistics of a vocabulary-parallel loss, as priced). The executed side is the largest
/// over the ranks; the model prices mesh coordinate 0, which holds the largest pieces.
#include <algorithm>  // std::max
#include <cmath>      // std::llround
#include <cstddef>    // std::size_t
#include <cstdint>    // std::int64_t
#include <map>        // std::map
#include <string>     // std::string
#include <tuple>      // std::tuple
#include <vector>     // std::vector

#include "../comm/ledger.hpp"    // issued_collective
#include "../core/dtype.hpp"     // dtype_size
#include "../graph/traffic.hpp"  // traffic_site
#include "../pass/autosharding.hpp"  // collective_use
#include "../pass/pipelined.hpp"     // priced_transfer

namespace autoshard {

/// One site, kind and mesh axis: what was priced and what ran.
struct traffic_line {
  traffic_site site;
  std::string where;  ///< site.name(g)
  std::string kind;   ///< "all-gather", "all-reduce", "reduce-scatter", "all-to-all", "broadcast", "send", "recv"
  int mesh_axis = 0;
  std::int64_t priced_bytes = 0, executed_bytes = 0;  ///< per rank (executed: the largest over the ranks)
  std::size_t priced_calls = 0, executed_calls = 0;
  std::string documented;  ///< why this line is expected to differ (docs/execution.md); empty: it must match
  bool matches() const noexcept { return priced_bytes == executed_bytes; }
  bool failed() const noexcept { return !matches() && documented.empty(); }
};

struct traffic_audit {
  bool checked = false;  ///< false: no pricing was given, nothing was compared
  std::vector<traffic_line> lines;  ///< by site (forward edges in vertex order, gradients, operators), kind, axis
  std::int64_t priced_bytes = 0, executed_bytes = 0;  ///< totals over every line
  std::int64_t documented_bytes = 0;                  ///< executed bytes on documented lines
  std::size_t mismatches = 0;                         ///< lines that differ and are not documented
  std::size_t first_mismatch = 0;                     ///< index into lines when mismatches > 0
  bool passed() const noexcept { return mismatches == 0; }
};

namespace detail {
/// Bytes per element the cost model prices a site's collectives in.
inline std::int64_t priced_element_bytes(const model_graph& g, const traffic_site& s) {
  switch (s.what) {
    case traffic_site::phase::edge:
      return static_cast<std::int64_t>(dtype_size(g[operands(g, s.vertex)[static_cast<std::size_t>(s.operand)]].type));
    case traffic_site::phase::gradient:
    case traffic_site::phase::transfer:
    case traffic_site::phase::transfer_back: return static_cast<std::int64_t>(dtype_size(g[s.vertex].type));
    case traffic_site::phase::op:
    case traffic_site::phase::recompute: return 4;  // row statistics in f32
  }
  return 1;
}

using audit_key = std::tuple<int, vertex_t, int, std::string, int>;  // phase, vertex, operand, kind, axis

/// The line of `by` for a site, kind and axis (made empty the first time).
inline traffic_line& audit_line(std::map<audit_key, traffic_line>& by, const traffic_site& s, const std::string& kind, int axis) {
  traffic_line& l = by[audit_key{static_cast<int>(s.what), s.vertex, s.operand, kind, axis}];
  l.site = s;
  l.kind = kind;
  l.mesh_axis = axis;
  return l;
}

/// A pipeline's priced transfers (pass/pipelined.hpp) as lines: each a "send" on the stage it
/// leaves and a "recv" on the next, every micro-step (`whole_step`) or once.
inline void price_transfers(std::map<audit_key, traffic_line>& by, const std::vector<priced_transfer>& transfers, bool backward,
                            bool whole_step) {
  for (const priced_transfer& t : transfers) {
    if (!backward && t.site.what == traffic_site::phase::transfer_back) continue;
    const int times = whole_step ? t.repeats : 1;
    for (const char* kind : {"send", "recv"}) {
      traffic_line& l = audit_line(by, t.site, kind, t.mesh_axis);
      l.priced_bytes += t.bytes * times;
      l.priced_calls += static_cast<std::size_t>(times);
    }
  }
}

inline bool backward_site(const traffic_site& s) {
  return s.what == traffic_site::phase::gradient || s.what == traffic_site::phase::recompute ||
         s.what == traffic_site::phase::transfer_back;
}
}  // namespace detail

/// Compares `priced` (the cost model's collectives of the plan) with `executed` (each rank's
/// ledger entries, keyed by packed traffic_site). `backward`: compare the backward's sites
/// too (gradients, recomputations); without it both sides' backward is left out.
/// `whole_step`: the ranks ran the plan's whole training step (every micro-step, each
/// priced collective as many times as it runs: collective_use::repeats); else one forward of
/// the plan's graph (each priced collective once). `transfers`: a pipelined plan's
/// point-to-point transfers (pipeline_traffic_of), each a send and a receive.
inline traffic_audit audit_traffic(const model_graph& g, const std::vector<collective_use>& priced,
                                   const std::vector<std::vector<issued_collective>>& executed, bool backward,
                                   bool whole_step, const std::vector<priced_transfer>& transfers = {}) {
  traffic_audit a;
  a.checked = true;
  using key = detail::audit_key;
  std::map<key, traffic_line> by;
  std::map<key, double> priced_share;  // priced bytes x share, rounded once per line
  std::map<key, std::int64_t> unshared;  // lines with reductions shared by consumer edges: their full bytes
  // Gradient lines priced as one conversion per consumer edge, all of the same size: the bytes
  // of one (-1 when the edges' conversions differ).
  std::map<key, std::int64_t> per_edge;
  std::map<key, std::size_t> entries;  // collective_use entries per line (consumer edges), whatever their repeats
  const auto line = [&](const traffic_site& s, const std::string& kind, int axis) -> traffic_line& {
    return detail::audit_line(by, s, kind, axis);
  };
  detail::price_transfers(by, transfers, backward, whole_step);
  for (const collective_use& c : priced) {
    if (!backward && detail::backward_site(c.site)) continue;
    traffic_line& l = line(c.site, std::string(to_string(c.kind)), c.mesh_axis);
    const key k{static_cast<int>(c.site.what), c.site.vertex, c.site.operand, l.kind, l.mesh_axis};
    // Over the step: a micro-step's collectives run every micro-step (twice into a fully
    // recomputed layer), a gradient sync once.
    const int times = whole_step ? c.repeats : 1;
    priced_share[k] += static_cast<double>(c.bytes) * c.share * times;
    if (c.share < 1.0) unshared[k] += c.bytes * times;
    if (c.share >= 1.0 && c.site.what == traffic_site::phase::gradient) {
      const auto [it, fresh] = per_edge.emplace(k, c.bytes);
      if (!fresh && it->second != c.bytes) it->second = -1;
    }
    l.priced_calls += static_cast<std::size_t>(times);
    ++entries[k];
  }
  for (const auto& [k, b] : priced_share) by[k].priced_bytes = std::llround(b);
  for (const std::vector<issued_collective>& rank : executed) {
    std::map<key, std::pair<std::int64_t, std::size_t>> mine;  // this rank's bytes and calls per line
    for (const issued_collective& e : rank) {
      const traffic_site s = traffic_site::unpack(e.site);
      if (!backward && detail::backward_site(s)) continue;
      auto& [bytes, calls] = mine[key{static_cast<int>(s.what), s.vertex, s.operand, e.kind, e.mesh_axis}];
      bytes += static_cast<std::int64_t>(e.elements) * detail::priced_element_bytes(g, s);
      calls += e.calls;
      (void)line(s, e.kind, e.mesh_axis);
    }
    for (const auto& [k, bc] : mine) {
      traffic_line& l = by[k];
      l.executed_bytes = std::max(l.executed_bytes, bc.first);
      l.executed_calls = std::max(l.executed_calls, bc.second);
    }
  }
  for (auto& [k, l] : by) {
    l.where = l.site.name(g);
    if (l.site.what == traffic_site::phase::recompute)
      l.documented = "the loss's backward recomputes its row max and sum over the vocabulary-parallel axes "
                     "instead of keeping the softmax (docs/execution.md)";
    const auto sh = unshared.find(k);
    if (sh != unshared.end() && l.executed_bytes > l.priced_bytes && l.executed_bytes <= sh->second)
      l.documented = "consumers hand this gradient back in different specs: each spec's sum is reduced once, "
                     "where the model charges every consumer edge 1/c of its reduction (docs/execution.md)";
    const auto pe = per_edge.find(k);
    if (pe != per_edge.end() && pe->second > 0 && entries[k] > 1 && l.executed_bytes > 0 &&
        l.executed_bytes < l.priced_bytes && l.executed_bytes % pe->second == 0)
      l.documented = "consumers hand this gradient back in the same spec: their sum is converted once, where the "
                     "model charges every consumer edge its own conversion (docs/execution.md)";
    a.priced_bytes += l.priced_bytes;
    a.executed_bytes += l.executed_bytes;
    if (!l.documented.empty()) a.documented_bytes += l.executed_bytes;
    if (l.failed() && a.mismatches++ == 0) a.first_mismatch = a.lines.size();
    a.lines.push_back(std::move(l));
  }
  return a;
}

}  // namespace autoshard
