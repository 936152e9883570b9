#pragma once
/// A device mesh with its links as JSON: the one spelling of the link model in every file
/// autoshard writes (plan files, calibration files, the tool's --json output).
///   {"axes": [{"size": 2, "latency_s": 2e-05, "bandwidth_Bps": 25000000000.0, "hop_s": 2.7e-06},
///             {"size": 4, "latency_s": 5e-06, "bandwidth_Bps": 300000000000.0, "hop_s": 6e-07}]}
/// Named axes (PyTorch's mesh_dim_names) add "axis_names": ["dp", "tp"], one per axis.
/// Reading bounds every size before anything is allocated (check_mesh_size: 1 to 4 axes of
/// 1 to 10^6 devices, at most 2^20 devices in all).
#include <cstdint>  // std::int64_t
#include <string>   // std::string
#include <vector>   // std::vector

#include <nlohmann/json.hpp>  // nlohmann::json

#include "../core/error.hpp"  // spec_error
#include "../core/mesh.hpp"   // device_mesh, link_model, check_mesh_size
#include "json.hpp"          // json_in

namespace autoshard {

inline nlohmann::json link_to_json(const link_model& l) {
  return {{"latency_s", l.alpha}, {"bandwidth_Bps", l.beta}, {"hop_s", l.hop}};
}

/// {"axes": [{"size": 2, "latency_s": 2e-05, "bandwidth_Bps": 25e9}, ...]}, with
/// "axis_names" when the mesh's axes have names. Without `links`, the sizes and names only
/// ({"axes": [{"size": 2}, {"size": 4}]}: where the links mean nothing, as in a shard index).
inline nlohmann::json mesh_to_json(const device_mesh& m, bool links = true) {
  nlohmann::json axes = nlohmann::json::array();
  for (std::size_t a = 0; a < m.ndim(); ++a) {
    nlohmann::json ax = links ? link_to_json(m.link(a)) : nlohmann::json::object();
    ax["size"] = m.size(a);
    axes.push_back(std::move(ax));
  }
  nlohmann::json out{{"axes", std::move(axes)}};
  if (m.has_axis_names()) {
    nlohmann::json names = nlohmann::json::array();
    for (std::size_t a = 0; a < m.ndim(); ++a) names.push_back(std::string(m.axis_name(a)));
    out["axis_names"] = std::move(names);
  }
  return out;
}

/// One link: latency in [0, 1000] s, bandwidth in [1, 1e18] B/s, hop (latency per ring
/// step) in [0, 1] s, 0 when absent (core/mesh.hpp's max_link_* ranges).
inline link_model link_from_json(const json_in& j) {
  const auto hop = j.find("hop_s");
  return {j["latency_s"].number(0.0, max_link_latency_s), j["bandwidth_Bps"].number(min_link_bandwidth, max_link_bandwidth),
          hop ? hop->number(0.0, max_link_hop_s) : 0.0};
}

/// The mesh mesh_to_json wrote; its sizes bounded by check_mesh_size before the mesh is
/// built, its axis names (when present) one valid, distinct name per axis.
inline device_mesh mesh_from_json(const json_in& j) {
  const json_in axes = j["axes"];
  const std::size_t n = axes.size(max_mesh_rank);
  if (n == 0) axes.fail("is empty: a mesh has 1 to 4 axes");
  std::vector<int> shape;
  for (std::size_t a = 0; a < n; ++a) shape.push_back(axes[a]["size"].small_integer(1, 1'000'000));
  try {
    check_mesh_size(shape, "the mesh");
  } catch (const spec_error& e) {
    axes.fail(std::string(e.message()));
  }
  device_mesh m(shape);
  for (std::size_t a = 0; a < n; ++a) m.set_link(a, link_from_json(axes[a]));
  if (const auto names = j.find("axis_names")) {
    if (names->size(max_mesh_rank) != n)
      names->fail("has " + std::to_string(names->size()) + " names for a mesh of " + std::to_string(n) + " axes");
    for (std::size_t a = 0; a < n; ++a) {
      const json_in name = (*names)[a];
      try {
        m.set_axis_name(a, name.string());
      } catch (const spec_error& e) {
        name.fail("is not a usable axis name: " + std::string(e.message()));
      }
    }
  }
  return m;
}

}  // namespace autoshard
