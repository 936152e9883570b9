#pragma once
/// Placements, one per mesh axis: Replicate, Shard(d) and Partial(sum|max|min).
///   constexpr auto p = autoshard::Shard(1);  static_assert(p.is_shard(1));
#include <cstdint>      // std::int8_t
#include <ostream>      // std::ostream
#include <string>       // std::string
#include <string_view>  // std::string_view

namespace autoshard {

/// How a Partial placement combines the ranks' values.
enum class reduce_op : std::uint8_t { sum, max, min };

constexpr std::string_view to_string(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum: return "sum";
    case reduce_op::max: return "max";
    case reduce_op::min: return "min";
  }
  return "?";
}

/// What one mesh axis does to a tensor. Structural: usable as a template argument.
struct placement {
  enum class kind_t : std::uint8_t { replicate, shard, partial };
  kind_t kind = kind_t::replicate;
  std::int8_t dim = -1;           ///< tensor dim, for Shard only
  reduce_op op = reduce_op::sum;  ///< for Partial only

  static constexpr placement replicate() noexcept { return {}; }
  static constexpr placement shard(int d) noexcept {
    return {kind_t::shard, static_cast<std::int8_t>(d), reduce_op::sum};
  }
  static constexpr placement partial(reduce_op o = reduce_op::sum) noexcept {
    return {kind_t::partial, -1, o};
  }
  constexpr bool is_replicate() const noexcept { return kind == kind_t::replicate; }
  constexpr bool is_shard() const noexcept { return kind == kind_t::shard; }
  constexpr bool is_shard(int d) const noexcept { return kind == kind_t::shard && dim == d; }
  constexpr bool is_partial() const noexcept { return kind == kind_t::partial; }

  friend constexpr bool operator==(const placement& a, const placement& b) noexcept {
    if (a.kind != b.kind) return false;
    if (a.kind == kind_t::shard) return a.dim == b.dim;
    if (a.kind == kind_t::partial) return a.op == b.op;
    return true;
  }
};

constexpr placement Replicate() noexcept { return placement::replicate(); }
constexpr placement Shard(int d) noexcept { return placement::shard(d); }
constexpr placement Partial(reduce_op op = reduce_op::sum) noexcept { return placement::partial(op); }

/// "R", "S(1)", "P" (sum) or "P(max)"
inline std::string to_string(const placement& p) {
  switch (p.kind) {
    case placement::kind_t::replicate: return "R";
    case placement::kind_t::shard: return "S(" + std::to_string(p.dim) + ")";
    case placement::kind_t::partial:
      return p.op == reduce_op::sum ? std::string("P") : "P(" + std::string(to_string(p.op)) + ")";
  }
  return "?";
}
inline std::ostream& operator<<(std::ostream& os, const placement& p) { return os << to_string(p); }

}  // namespace autoshard
