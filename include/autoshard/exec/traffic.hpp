#pragma once
/// Charging an executor's collectives: each resharding, gradient reduction and operator
/// collective runs under its traffic_site (graph/traffic.hpp) in the mesh communicator's
/// ledger (comm/ledger.hpp), so what ran can be compared with what the cost model priced
/// (exec/audit.hpp).
///   { const auto s = autoshard::detail::charge(mc, autoshard::traffic_site::edge(v, 0)); reshard(...); }
#include <concepts>  // std::same_as
#include <cstdint>   // std::uint64_t
#include <optional>  // std::optional
#include <utility>   // std::in_place

#include "../comm/ledger.hpp"     // collective_ledger, ledger_site
#include "../graph/traffic.hpp"   // traffic_site

namespace autoshard::detail {

/// Charges `mc`'s collectives to `site` (a packed traffic_site, or collective_ledger::no_site
/// to stop counting) while the result lives; nothing for a mesh communicator without a ledger.
template <class M>
std::optional<ledger_site> charge(M& mc, std::uint64_t site) {
  if constexpr (requires { { mc.ledger() } -> std::same_as<collective_ledger&>; })
    return std::optional<ledger_site>(std::in_place, mc.ledger(), site);
  else
    return std::nullopt;
}
template <class M>
std::optional<ledger_site> charge(M& mc, const traffic_site& site) {
  return charge(mc, site.pack());
}

}  // namespace autoshard::detail
