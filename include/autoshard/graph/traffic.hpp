#pragma once
/// Where a collective of a plan belongs: the site the cost model prices it at and the
/// executor charges it to, so the two can be compared site by site (exec/audit.hpp).
///   autoshard::traffic_site s = autoshard::traffic_site::edge(v, 1);   // operand 1 into v, forward
///   s.name(g);                                                       // "edge wte -> lm_head (operand 1)"
/// A site packs into 64 bits (pack/unpack): what a communicator's ledger keys by.
#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint8_t, std::uint64_t
#include <string>   // std::string

#include "../core/error.hpp"  // escaped_name
#include "model.hpp"  // model_graph, vertex_t, operands

namespace autoshard {

struct traffic_site {
  enum class phase : std::uint8_t {
    edge = 0,       ///< the forward resharding of operand `operand` of `vertex`
    gradient = 1,   ///< the backward traffic of `vertex`'s gradient: its reductions, a parameter's sync
    op = 2,         ///< an operator's own collectives (the vocab-parallel loss's row statistics)
    recompute = 3,  ///< collectives an executor repeats in a backward kernel (not priced; docs/execution.md)
    /// A pipelined step: `vertex`'s output sent point to point from stage `operand` to the next.
    transfer = 4,
    /// A pipelined step: the gradient of `vertex`'s output sent back from stage `operand` + 1 to stage `operand`.
    transfer_back = 5,
  };
  phase what = phase::edge;
  vertex_t vertex = 0;
  int operand = 0;

  static traffic_site edge(vertex_t v, std::size_t operand) { return {phase::edge, v, static_cast<int>(operand)}; }
  static traffic_site gradient(vertex_t v) { return {phase::gradient, v, 0}; }
  static traffic_site op(vertex_t v) { return {phase::op, v, 0}; }
  static traffic_site recompute(vertex_t v) { return {phase::recompute, v, 0}; }
  static traffic_site transfer(vertex_t v, int from_stage) { return {phase::transfer, v, from_stage}; }
  static traffic_site transfer_back(vertex_t v, int from_stage) { return {phase::transfer_back, v, from_stage}; }

  /// 3 bits of phase, 41 of vertex, 20 of operand (all ones is the ledger's "no site").
  std::uint64_t pack() const noexcept {
    return (static_cast<std::uint64_t>(what) << 61) | ((static_cast<std::uint64_t>(vertex) & vertex_mask) << 20) |
           (static_cast<std::uint64_t>(operand) & operand_mask);
  }
  static traffic_site unpack(std::uint64_t site) noexcept {
    return {static_cast<phase>(site >> 61), static_cast<vertex_t>((site >> 20) & vertex_mask),
            static_cast<int>(site & operand_mask)};
  }

  /// How reports name it: "edge a -> b (operand i)", "gradient of w", "operator v",
  /// "recomputed in the backward of v", "transfer of v from stage 0 to 1", "transfer of v's
  /// gradient from stage 1 to 0"; each name as a report prints it (escaped_name: the 5 MB name
  /// of a hand-edited plan's operator is cut).
  std::string name(const model_graph& g) const {
    const std::string v = escaped_name(g[vertex].name);
    switch (what) {
      case phase::edge:
        return "edge " + escaped_name(g[operands(g, vertex)[static_cast<std::size_t>(operand)]].name) + " -> " + v +
               " (operand " + std::to_string(operand) + ")";
      case phase::gradient: return "gradient of " + v;
      case phase::op: return "operator " + v;
      case phase::recompute: return "recomputed in the backward of " + v;
      case phase::transfer:
        return "transfer of " + v + " from stage " + std::to_string(operand) + " to " + std::to_string(operand + 1);
      case phase::transfer_back:
        return "transfer of " + v + "'s gradient from stage " + std::to_string(operand + 1) + " to " +
               std::to_string(operand);
    }
    return "?";
  }

  friend bool operator==(const traffic_site&, const traffic_site&) = default;

 private:
  static constexpr std::uint64_t vertex_mask = (std::uint64_t{1} << 41) - 1;
  static constexpr std::uint64_t operand_mask = (std::uint64_t{1} << 20) - 1;
};

}  // namespace autoshard
