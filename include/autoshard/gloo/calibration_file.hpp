#pragma once
/// The calibration file: comm's calibration_result as JSON (what `autoshard calibrate`
/// writes and `autoshard plan --calibration` reads).
///   autoshard::save_calibration(autoshard::calibrate(mc), "links.json");
///   device_mesh m{2, 4};  autoshard::apply_calibration(m, autoshard::load_calibration("links.json"));
/// It lives beside the Gloo backend, not in comm/, because comm/ needs nothing but the
/// standard library and this file needs nlohmann-json (through the io area).
#include <cstdint>  // std::int64_t
#include <string>   // std::string
#include <vector>   // std::vector

#include <nlohmann/json.hpp>  // nlohmann::json

#include "../comm/calibrate.hpp"     // calibration_result
#include "../core/error.hpp"         // io_error
#include "../core/mesh.hpp"          // max_mesh_rank
#include "../core/redistribute.hpp"  // collective, to_string
#include "../io/atomic_file.hpp"     // write_file_atomically
#include "../io/json.hpp"            // json_in, load_json_file
#include "../io/mesh_json.hpp"       // link_from_json

namespace autoshard {

/// The calibration file format this build writes and reads (version 2: links spelled
/// latency_s / bandwidth_Bps / hop_s, as in every autoshard file).
inline constexpr int calibration_format_version = 2;

/// The result as JSON (what save_calibration writes).
inline nlohmann::json calibration_to_json(const calibration_result& r) {
  nlohmann::json j;
  j["format"] = "autoshard-calibration";
  j["version"] = calibration_format_version;
  j["backend"] = r.backend;
  j["mesh"] = r.mesh_shape;
  j["axes"] = nlohmann::json::array();
  for (const auto& a : r.axes) {
    nlohmann::json ja{{"axis", a.axis},
                      {"group_size", a.group_size},
                      {"measured", a.measured},
                      {"latency_s", a.link.alpha},
                      {"bandwidth_Bps", a.link.beta},
                      {"hop_s", a.link.hop},
                      {"holdout_bytes", a.holdout_bytes},
                      {"holdout_relative_error", a.holdout_relative_error}};
    ja["samples"] = nlohmann::json::array();
    for (const auto& s : a.samples)
      ja["samples"].push_back(
          {{"kind", std::string(to_string(s.kind))}, {"bytes", s.bytes}, {"seconds", s.seconds}, {"held_out", s.held_out}});
    j["axes"].push_back(ja);
  }
  return j;
}

/// Reads what calibration_to_json wrote; io_error naming the file and the JSON path otherwise.
inline calibration_result calibration_from_json(const nlohmann::json& doc, const std::string& what = "calibration") {
  const json_in j(doc, what);
  calibration_result r;
  j["format"].one_of({"autoshard-calibration"});
  if (const std::int64_t v = j["version"].integer(0, 1 << 30); v != calibration_format_version)
    j["version"].fail("is " + std::to_string(v) + "; this build reads version " + std::to_string(calibration_format_version) +
                      (v == 1 ? " (version 1 spelled the links alpha_s/beta_bytes_per_s): run autoshard calibrate again" : ""));
  r.backend = j.has("backend") ? j["backend"].string() : std::string("?");
  for (std::int64_t s : j["mesh"].integers(1, 1 << 20, max_mesh_rank)) r.mesh_shape.push_back(static_cast<int>(s));
  const json_in axes = j["axes"];
  if (axes.size() != r.mesh_shape.size())
    axes.fail("has " + std::to_string(axes.size()) + " axes for a mesh of " + std::to_string(r.mesh_shape.size()));
  for (const json_in& ja : axes.elements()) {
    axis_calibration a;
    a.axis = ja["axis"].small_integer(0, static_cast<int>(r.mesh_shape.size()) - 1);
    a.group_size = ja["group_size"].small_integer(1, 1 << 20);
    a.measured = ja["measured"].boolean();
    a.link = link_from_json(ja);
    if (auto h = ja.find("holdout_bytes")) a.holdout_bytes = h->number();
    if (auto h = ja.find("holdout_relative_error")) a.holdout_relative_error = h->number();
    if (auto samples = ja.find("samples"))
      for (const json_in& js : samples->elements()) {
        calibration_sample s;
        const std::string kind = js["kind"].one_of({"all-reduce", "all-gather", "reduce-scatter", "all-to-all"});
        s.kind = kind == "all-reduce"     ? collective::all_reduce
                 : kind == "all-gather"   ? collective::all_gather
                 : kind == "reduce-scatter" ? collective::reduce_scatter
                                            : collective::all_to_all;
        s.bytes = js["bytes"].number(0.0);
        s.seconds = js["seconds"].number(0.0);
        if (auto h = js.find("held_out")) s.held_out = h->boolean();
        a.samples.push_back(s);
      }
    r.axes.push_back(a);
  }
  return r;
}

/// Writes a calibration file (atomically: never a half file).
inline void save_calibration(const calibration_result& r, const std::string& path) {
  write_file_atomically(path, calibration_to_json(r).dump(2) + "\n");
}

inline calibration_result load_calibration(const std::string& path) {
  return calibration_from_json(load_json_file(path, "calibration file"), "calibration file '" + path + "'");
}

}  // namespace autoshard
