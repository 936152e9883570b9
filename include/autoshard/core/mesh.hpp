#pragma once
/// Device meshes: an N-D grid of ranks (1 <= N <= 4), row-major, with a link model per axis.
///   constexpr auto m = autoshard::make_mesh_2d(2, 4, 25e9, 300e9);   // 2 nodes x 4 GPUs
///   static_assert(m.rank_of({1, 2}) == 6 && m.coordinate(6)[1] == 2);
/// Sizes can also be static types, mdspan style: mesh_extents<2, dyn> stores one int.
/// Axes may carry names, as PyTorch's DeviceMesh(mesh_dim_names=...) does:
///   auto n = autoshard::parse_mesh("dp=2,tp=4");   // n.axis_name(1) == "tp", to_string(n) == "mesh(dp=2,tp=4)"
#include <algorithm>         // std::min
#include <array>             // std::array
#include <cstddef>           // std::size_t
#include <cstdint>           // std::uint8_t
#include <cstdio>            // std::snprintf
#include <initializer_list>  // std::initializer_list
#include <ostream>           // std::ostream
#include <span>              // std::dynamic_extent
#include <string>            // std::string
#include <string_view>       // std::string_view
#include <type_traits>       // std::conditional_t
#include <utility>           // std::pair
#include <vector>            // std::vector

#include "checked.hpp"  // checked_rank_count
#include "error.hpp"  // spec_error, shape_error

namespace autoshard {

inline constexpr std::size_t max_mesh_rank = 4;
/// The longest mesh axis name ("dp", "tp", "pipeline_stage"...), in characters.
inline constexpr std::size_t max_axis_name = 15;
inline constexpr std::size_t dyn = std::dynamic_extent;

/// Alpha-beta model of one mesh axis, as NCCL's tuning model has it: a collective costs
/// alpha once (launch and synchronisation), hop per step of its algorithm (a ring all-gather
/// over k ranks has k-1 steps, a ring all-reduce 2(k-1)), and its volume over beta
/// (core/cost.hpp has the formulas).
struct link_model {
  double alpha = 5e-6;   ///< latency per collective, seconds
  double beta = 100e9;   ///< bandwidth, bytes per second
  double hop = 0.0;      ///< latency per algorithm step (ring hop), seconds
  friend constexpr bool operator==(const link_model&, const link_model&) = default;
};

/// NCCL's per-step latencies of its ring algorithm with the LL protocol (its tuning table,
/// src/graph/tuning.cc, hwLat): 0.6 us over NVLink, 2.7 us over the network.
inline constexpr double nccl_intra_node_hop = 0.6e-6;
inline constexpr double nccl_inter_node_hop = 2.7e-6;

/// Axes ordered fastest first: by bandwidth, then lower latency, ties to the inner (higher)
/// axis, so that a mesh whose links are all equal puts its last axis first.
template <class Mesh>
constexpr std::array<int, max_mesh_rank> axes_fastest_first(const Mesh& m) noexcept {
  std::array<int, max_mesh_rank> order{};
  const int n = static_cast<int>(m.ndim());
  for (int i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = n - 1 - i;
  for (int i = 1; i < n; ++i)  // insertion sort: at most 4 axes
    for (int j = i; j > 0; --j) {
      const link_model& a = m.link(static_cast<std::size_t>(order[static_cast<std::size_t>(j)]));
      const link_model& b = m.link(static_cast<std::size_t>(order[static_cast<std::size_t>(j - 1)]));
      const bool faster = a.beta > b.beta || (a.beta == b.beta && a.alpha < b.alpha);
      if (!faster) break;
      const int t = order[static_cast<std::size_t>(j)];
      order[static_cast<std::size_t>(j)] = order[static_cast<std::size_t>(j - 1)];
      order[static_cast<std::size_t>(j - 1)] = t;
    }
  return order;
}

/// Mesh axis sizes, each static or std::dynamic_extent (only the dynamic ones are stored).
template <std::size_t... Sizes>
class mesh_extents {
  static_assert(sizeof...(Sizes) >= 1 && sizeof...(Sizes) <= max_mesh_rank,
                "autoshard: a device mesh has 1 to 4 axes");
  static_assert(((Sizes == dyn || Sizes >= 1) && ...),
                "autoshard: a static mesh axis size must be at least 1");
  static constexpr std::array<std::size_t, sizeof...(Sizes)> static_sizes{Sizes...};
  // A binary fold, so that mesh_extents<> reaches the static_assert above, not a fold error.
  static constexpr std::size_t n_dynamic = (std::size_t{0} + ... + (Sizes == dyn ? 1 : 0));
  static constexpr std::size_t dynamic_index(std::size_t axis) {
    std::size_t k = 0;
    for (std::size_t i = 0; i < axis; ++i) k += static_sizes[i] == dyn ? 1 : 0;
    return k;
  }
  struct no_dynamic_sizes {};
  // std::array<int, 0> is not an empty type, so an all-static mesh stores a tag instead.
  using storage = std::conditional_t<n_dynamic == 0, no_dynamic_sizes, std::array<int, n_dynamic>>;
  [[no_unique_address]] storage dynamic_{};

 public:
  static constexpr std::size_t rank() noexcept { return sizeof...(Sizes); }
  static constexpr std::size_t rank_dynamic() noexcept { return n_dynamic; }
  static constexpr std::size_t static_size(std::size_t axis) noexcept { return static_sizes[axis]; }
  static constexpr bool is_static() noexcept { return n_dynamic == 0; }

  constexpr mesh_extents() requires(n_dynamic == 0) = default;
  /// One argument per dynamic axis, in axis order.
  template <class... Ints>
    requires(sizeof...(Ints) == n_dynamic && n_dynamic > 0)
  explicit constexpr mesh_extents(Ints... dynamic_sizes) : dynamic_{static_cast<int>(dynamic_sizes)...} {
    for (int s : dynamic_)
      if (s < 1) throw shape_error("a mesh axis size must be at least 1, got " + std::to_string(s));
  }
  constexpr int size(std::size_t axis) const noexcept {
    if constexpr (n_dynamic == 0) return static_cast<int>(static_sizes[axis]);
    else return static_sizes[axis] == dyn ? dynamic_[dynamic_index(axis)] : static_cast<int>(static_sizes[axis]);
  }
};

/// The runtime mesh every area consumes: sizes, row-major rank order, one link model per axis.
class device_mesh {
 private:
  template <class It>
  constexpr void init(It first, It last, link_model link) {
    std::size_t n = 0;
    for (; first != last; ++first) {
      if (n == max_mesh_rank) too_many_axes();
      if (*first < 1) bad_size(*first);
      sizes_[n] = *first;
      links_[n] = link;
      ++n;
    }
    if (n == 0) too_many_axes();
    (void)checked_rank_count(std::span<const int>(sizes_.data(), n), "mesh");  // ranks are ints
    ndim_ = static_cast<std::uint8_t>(n);
  }
  constexpr void check_axis(std::size_t axis) const {
    // ndim_ <= max_mesh_rank always; saying so lets GCC -O3 see every checked axis index a coords.
    if (axis >= ndim_ || axis >= max_mesh_rank) out_of_range("mesh axis", static_cast<int>(axis), static_cast<int>(ndim_));
  }
  [[noreturn]] static void too_many_axes() { throw spec_error("a device mesh has 1 to 4 axes"); }
  [[noreturn]] static void bad_size(int s) {
    throw spec_error("a mesh axis size must be at least 1, got " + std::to_string(s));
  }
  static void wrong_coordinate_count(std::size_t got, std::size_t want) {
    throw spec_error("a coordinate of " + std::to_string(got) + " values on a mesh of " +
                     std::to_string(want) + " axes");
  }
  static void bad_axis_name(std::string_view name, const char* why) {
    throw spec_error("mesh axis name " + quoted_text(name) + " " + why);
  }
  [[noreturn]] static void out_of_range(const char* what, int v, int n) {
    throw spec_error(std::string(what) + " " + std::to_string(v) + " is outside [0, " +
                     std::to_string(n) + ")");
  }

 public:
  using coords = std::array<int, max_mesh_rank>;

  constexpr device_mesh() = default;
  constexpr device_mesh(std::initializer_list<int> sizes, link_model link = {}) {
    init(sizes.begin(), sizes.end(), link);
  }
  explicit device_mesh(const std::vector<int>& sizes, link_model link = {}) {
    init(sizes.begin(), sizes.end(), link);
  }
  template <std::size_t... S>
  explicit constexpr device_mesh(const mesh_extents<S...>& e, link_model link = {}) {
    ndim_ = static_cast<std::uint8_t>(e.rank());
    for (std::size_t i = 0; i < e.rank(); ++i) {
      sizes_[i] = e.size(i);
      links_[i] = link;
    }
  }

  constexpr std::size_t ndim() const noexcept { return ndim_; }
  constexpr int size(std::size_t axis) const noexcept { return sizes_[axis]; }
  constexpr int num_ranks() const noexcept {
    int n = 1;
    for (std::size_t i = 0; i < ndim_; ++i) n *= sizes_[i];
    return n;
  }
  std::vector<int> shape() const { return {sizes_.begin(), sizes_.begin() + ndim_}; }

  /// The axis' name ("" when unnamed). Names are labels: they appear in reports and files
  /// but take no part in ==, since they change nothing that is computed.
  constexpr std::string_view axis_name(std::size_t axis) const noexcept {
    const auto& n = names_[axis];
    std::size_t len = 0;
    while (len < n.size() && n[len] != '\0') ++len;
    return {n.data(), len};
  }
  constexpr bool has_axis_names() const noexcept { return ndim_ > 0 && !axis_name(0).empty(); }
  /// Names `axis`: a letter or '_' then letters, digits or '_', at most 15, unique on the mesh.
  constexpr device_mesh& set_axis_name(std::size_t axis, std::string_view name) {
    check_axis(axis);
    if (name.empty() || name.size() > max_axis_name)
      bad_axis_name(name, "must have 1 to 15 characters");
    for (std::size_t k = 0; k < name.size(); ++k) {
      const char c = name[k];
      const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
      if (!letter && !(k > 0 && c >= '0' && c <= '9'))
        bad_axis_name(name, "must be a letter or '_' followed by letters, digits or '_' (e.g. dp, tp)");
    }
    for (std::size_t i = 0; i < ndim_; ++i)
      if (i != axis && axis_name(i) == name) bad_axis_name(name, "names two axes");
    names_[axis] = {};
    for (std::size_t k = 0; k < name.size(); ++k) names_[axis][k] = name[k];
    return *this;
  }
  /// The axis whose name is `name`, or -1.
  constexpr int find_axis(std::string_view name) const noexcept {
    for (std::size_t i = 0; i < ndim_; ++i)
      if (!name.empty() && axis_name(i) == name) return static_cast<int>(i);
    return -1;
  }
  /// How reports name an axis: "mesh axis 1 (tp)", or "mesh axis 1" when unnamed.
  std::string axis_label(std::size_t axis) const {
    const std::string n(axis_name(axis));
    return "mesh axis " + std::to_string(axis) + (n.empty() ? "" : " (" + n + ")");
  }

  constexpr const link_model& link(std::size_t axis) const noexcept { return links_[axis]; }
  constexpr device_mesh& set_link(std::size_t axis, link_model l) {
    check_axis(axis);
    links_[axis] = l;
    return *this;
  }

  /// rank = sum coord[i] * prod_{j>i} size[j]
  constexpr int rank_of(std::initializer_list<int> c) const {
    if (c.size() != ndim_) wrong_coordinate_count(c.size(), ndim_);
    coords cc{};
    std::size_t i = 0;
    for (int v : c) cc[i++] = v;
    return rank_of(cc);
  }
  constexpr int rank_of(const coords& c) const {
    int r = 0;
    for (std::size_t i = 0; i < ndim_; ++i) {
      if (c[i] < 0 || c[i] >= sizes_[i]) out_of_range("coordinate", c[i], sizes_[i]);
      r = r * sizes_[i] + c[i];
    }
    return r;
  }
  constexpr coords coordinate(int rank) const {
    if (rank < 0 || rank >= num_ranks()) out_of_range("rank", rank, num_ranks());
    coords c{};
    for (std::size_t i = std::min<std::size_t>(ndim_, max_mesh_rank); i-- > 0;) {
      c[i] = rank % sizes_[i];
      rank /= sizes_[i];
    }
    return c;
  }
  /// The i-th member (coordinate i on `axis`) of the axis group that `rank` belongs to.
  constexpr int group_member(std::size_t axis, int rank, int i) const {
    check_axis(axis);
    coords c = coordinate(rank);
    c[axis] = i;
    return rank_of(c);
  }
  /// Every rank that shares `rank`'s other coordinates, ordered by coordinate `axis`.
  std::vector<int> group(std::size_t axis, int rank) const {
    check_axis(axis);
    std::vector<int> g(static_cast<std::size_t>(sizes_[axis]));
    for (int i = 0; i < sizes_[axis]; ++i) g[static_cast<std::size_t>(i)] = group_member(axis, rank, i);
    return g;
  }
  /// Index of `rank`'s group along `axis` (0 .. num_ranks/size(axis)-1), handy as a tag.
  constexpr int group_index(std::size_t axis, int rank) const {
    check_axis(axis);
    coords c = coordinate(rank);
    c[axis] = 0;
    int idx = 0;
    for (std::size_t i = 0; i < ndim_; ++i)
      if (i != axis) idx = idx * sizes_[i] + c[i];
    return idx;
  }

  friend constexpr bool operator==(const device_mesh& a, const device_mesh& b) noexcept {
    if (a.ndim_ != b.ndim_) return false;
    for (std::size_t i = 0; i < a.ndim_; ++i)
      if (a.sizes_[i] != b.sizes_[i] || !(a.links_[i] == b.links_[i])) return false;
    return true;
  }

 private:
  std::array<int, max_mesh_rank> sizes_{};
  std::array<link_model, max_mesh_rank> links_{};
  std::array<std::array<char, max_axis_name + 1>, max_mesh_rank> names_{};
  std::uint8_t ndim_ = 0;
};

/// A cluster's links in MASE's terms: on a mesh of 2+ axes, axis 0 crosses nodes and the
/// other axes stay inside a node; a 1-D mesh is one node. The one home of autoshard's
/// default link values (every command, the pass options and the tool share them).
///   auto m = autoshard::make_cluster_mesh({2, 4}, {.inter_node_bandwidth = 25e9});
struct cluster_links {
  double inter_node_bandwidth = 25e9;   ///< bytes/s on mesh axis 0 (meshes of 2+ axes)
  double intra_node_bandwidth = 300e9;  ///< bytes/s on the other axes
  double inter_node_latency = -1;       ///< seconds; < 0: the backend's (nccl 20 us, gloo 100 us)
  double intra_node_latency = -1;       ///< seconds; < 0: the backend's (nccl 5 us, gloo 50 us)
  double inter_node_hop = -1;           ///< seconds per ring step; < 0: the backend's (nccl 2.7 us, gloo 0)
  double intra_node_hop = -1;           ///< seconds per ring step; < 0: the backend's (nccl 0.6 us, gloo 0)
  /// "nccl", or "gloo" (staged through host memory: the backend's latencies, half the bandwidth).
  std::string_view communications_backend = "nccl";
};

/// The ranges a link's figures must fall in wherever they come from (flags, plan and
/// calibration files, code), so that every reader says the same range: latency per
/// collective in [0, 1000] s, latency per ring step (hop) in [0, 1] s, bandwidth in
/// [1, 1e18] bytes/s. A link slower than a byte a second priced the tool's own plans with a
/// bandwidth its plan reader refuses (`plan --intra-bw 0.5` wrote a plan that `show`, `verify`
/// and `--preload` could not read), and one of 1e-300 bytes/s steps of 1e293 s.
inline constexpr double max_link_latency_s = 1000;
inline constexpr double max_link_hop_s = 1;
inline constexpr double min_link_bandwidth = 1;
inline constexpr double max_link_bandwidth = 1e18;

/// The default mesh of every command and of autosharding_options: 2 nodes x 4 devices.
inline constexpr std::array<int, 2> default_mesh_shape{2, 4};

/// `m` (its sizes and axis names, e.g. from parse_mesh) with the links `c` describes: one
/// home for turning a mesh's shape and MASE's link options into the mesh a plan is priced on.
/// Throws spec_error for a non-positive bandwidth, a negative or non-finite latency, or an
/// unknown backend.
///   auto m = autoshard::with_cluster_links(autoshard::parse_mesh("dp=2,tp=4"), {.inter_node_bandwidth = 25e9});
inline device_mesh with_cluster_links(device_mesh m, const cluster_links& c = {}) {
  double inter_lat = 2e-5, intra_lat = 5e-6, efficiency = 1.0;
  double inter_hop = nccl_inter_node_hop, intra_hop = nccl_intra_node_hop;
  if (c.communications_backend == "gloo") {
    inter_lat = 1e-4, intra_lat = 5e-5, efficiency = 0.5;
    inter_hop = intra_hop = 0.0;
  } else if (c.communications_backend != "nccl") {
    throw spec_error("communications_backend must be \"nccl\" or \"gloo\", got " + quoted_text(c.communications_backend));
  }
  // The link a mesh gets (the backend's share of the bandwidth) must be one every reader of a
  // plan or calibration file takes back: [min_link_bandwidth, max_link_bandwidth].
  for (const auto& [name, bw] : {std::pair{"inter_node_bandwidth", c.inter_node_bandwidth},
                                 std::pair{"intra_node_bandwidth", c.intra_node_bandwidth}}) {
    char text[160];
    if (!(bw >= min_link_bandwidth && bw <= max_link_bandwidth)) {
      std::snprintf(text, sizeof text, "%s is %g bytes/s, not in [%g, %g]", name, bw, min_link_bandwidth, max_link_bandwidth);
      throw spec_error(text);
    }
    if (!(bw * efficiency >= min_link_bandwidth)) {
      std::snprintf(text, sizeof text, "%s is %g bytes/s, of which gloo achieves half, %g, below the least a link may have, %g byte/s",
                    name, bw, bw * efficiency, min_link_bandwidth);
      throw spec_error(text);
    }
  }
  if (!(c.inter_node_latency < 1e300) || !(c.intra_node_latency < 1e300))
    throw spec_error("inter_node_latency and intra_node_latency must be finite seconds");
  if (c.inter_node_latency >= 0) inter_lat = c.inter_node_latency;
  if (c.intra_node_latency >= 0) intra_lat = c.intra_node_latency;
  if (!(c.inter_node_hop < 1) || !(c.intra_node_hop < 1))
    throw spec_error("inter_node_hop and intra_node_hop must be in [0, 1) seconds");
  if (c.inter_node_hop >= 0) inter_hop = c.inter_node_hop;
  if (c.intra_node_hop >= 0) intra_hop = c.intra_node_hop;
  for (std::size_t a = 0; a < m.ndim(); ++a) {
    const bool inter = m.ndim() >= 2 && a == 0;
    m.set_link(a, inter ? link_model{inter_lat, c.inter_node_bandwidth * efficiency, inter_hop}
                        : link_model{intra_lat, c.intra_node_bandwidth * efficiency, intra_hop});
  }
  return m;
}

/// The mesh of `shape` with the links `c` describes (with_cluster_links). Throws spec_error
/// for a bad shape or bad links.
inline device_mesh make_cluster_mesh(const std::vector<int>& shape, const cluster_links& c = {}) {
  if (shape.empty() || shape.size() > max_mesh_rank)
    throw spec_error("a mesh has 1 to 4 axes, got " + std::to_string(shape.size()));
  return with_cluster_links(device_mesh(shape), c);
}

/// The 2-D case, usable in constant expressions: axis 0 crosses nodes, axis 1 stays inside.
constexpr device_mesh make_mesh_2d(int nodes, int devices_per_node, double inter_node_bandwidth,
                                   double intra_node_bandwidth, double inter_node_latency = 2e-5,
                                   double intra_node_latency = 5e-6) {
  device_mesh m{nodes, devices_per_node};
  m.set_link(0, {inter_node_latency, inter_node_bandwidth});
  m.set_link(1, {intra_node_latency, intra_node_bandwidth});
  return m;
}

/// "mesh(2,4)", or "mesh(dp=2,tp=4)" when the axes have names; parse_mesh reads both back.
inline std::string to_string(const device_mesh& m) {
  std::string s = "mesh(";
  for (std::size_t i = 0; i < m.ndim(); ++i) {
    s += i ? "," : "";
    if (!m.axis_name(i).empty()) s += std::string(m.axis_name(i)) + "=";
    s += std::to_string(m.size(i));
  }
  return s + ")";
}
inline std::ostream& operator<<(std::ostream& os, const device_mesh& m) { return os << to_string(m); }

/// The mesh's shape as `--mesh` takes it: "2x4", or "dp=2,tp=4" when the axes have names (the
/// one such formatter; parse_mesh reads it back).
inline std::string shape_text(const device_mesh& m) {
  std::string s;
  for (std::size_t i = 0; i < m.ndim(); ++i) {
    if (m.has_axis_names()) s += (i ? "," : "") + std::string(m.axis_name(i)) + "=";
    else s += i ? "x" : "";
    s += std::to_string(m.size(i));
  }
  return s;
}

/// The most ranks a mesh given as text (a flag, a file) may have: 2^20, far beyond any machine
/// built, small enough that tools which visit every rank finish.
inline constexpr std::int64_t max_parsed_mesh_ranks = std::int64_t{1} << 20;

/// Checks a mesh shape read from text (a flag, a plan file) before anything is sized by it:
/// 1 to 4 axes, each 1 to 10^6, at most max_parsed_mesh_ranks ranks in all. spec_error naming
/// `what` otherwise (a plan file's mesh [99999999,99999999] grew memory until bad_alloc).
inline void check_mesh_size(const std::vector<int>& sizes, const std::string& what) {
  if (sizes.empty() || sizes.size() > max_mesh_rank)
    throw spec_error(what + ": a mesh has 1 to 4 axes, not " + std::to_string(sizes.size()));
  std::int64_t ranks = 1;  // each axis <= 10^6 and the product so far <= 2^20: no overflow
  for (int a : sizes) {
    if (a < 1 || a > 1'000'000) throw spec_error(what + ": axis size " + std::to_string(a) + " is not in [1, 1000000]");
    if ((ranks *= a) > max_parsed_mesh_ranks)
      throw spec_error(what + " has more than " + std::to_string(max_parsed_mesh_ranks) +
                       " ranks (the most a mesh read from text may have)");
  }
}

/// Parses "2x4", "8", "2x2x2", "mesh(2,4)", or named axes "dp=2,tp=4" / "mesh(dp=2,tp=4)",
/// into a mesh with default links. Either every axis has a name or none has.
inline device_mesh parse_mesh(std::string_view s) {
  const std::string text = quoted_text(s);  // as messages quote it: cut when long, whole characters
  auto fail = [&](const std::string& why) -> void { throw spec_error("mesh shape " + text + ": " + why); };
  std::string_view body = s;
  while (!body.empty() && body.front() == ' ') body.remove_prefix(1);
  while (!body.empty() && body.back() == ' ') body.remove_suffix(1);
  char sep = 'x';
  if (body.starts_with("mesh(") && body.ends_with(")")) {
    body = body.substr(5, body.size() - 6);
    sep = ',';
  }
  if (body.find('=') != std::string_view::npos) sep = ',';
  std::vector<int> sizes;
  std::vector<std::string> names;
  std::size_t i = 0;
  while (i <= body.size()) {
    std::size_t j = i;
    while (j < body.size() && body[j] != sep && !(sep == 'x' && body[j] == 'X')) ++j;
    std::string_view tok = body.substr(i, j - i);
    while (!tok.empty() && tok.front() == ' ') tok.remove_prefix(1);
    while (!tok.empty() && tok.back() == ' ') tok.remove_suffix(1);
    std::string name;
    if (const std::size_t eq = tok.find('='); eq != std::string_view::npos) {
      name = std::string(tok.substr(0, eq));
      while (!name.empty() && name.back() == ' ') name.pop_back();
      if (name.empty()) fail("an axis name is missing before '=' (write e.g. dp=2,tp=4)");
      tok.remove_prefix(eq + 1);
      while (!tok.empty() && tok.front() == ' ') tok.remove_prefix(1);
    }
    if (tok.empty()) fail("each axis needs a size >= 1 (write e.g. 2x4 or dp=2,tp=4)");
    long long v = 0;
    for (std::size_t k = 0; k < tok.size(); ++k) {
      const char ch = tok[k];
      if (ch < '0' || ch > '9')  // a digit of another script (U+0662) is quoted whole, not as half a character
        fail("unexpected character " + quoted_char_at(tok, k) + " (write e.g. 2x4, or dp=2,tp=4 to name the axes)");
      v = v * 10 + (ch - '0');
      if (v > 1'000'000) fail("a mesh has 1 to 4 axes of size 1 to 1000000");
    }
    if (v < 1) fail("each axis needs a size >= 1 (write e.g. 2x4 or dp=2,tp=4)");
    sizes.push_back(static_cast<int>(v));
    names.push_back(name);
    if (sizes.size() > max_mesh_rank) fail("a mesh has 1 to 4 axes of size 1 to 1000000");
    i = j + 1;
  }
  std::size_t named = 0;
  for (const std::string& n : names) named += n.empty() ? 0 : 1;
  if (named != 0 && named != names.size()) fail("name every axis or none (e.g. dp=2,tp=4)");
  check_mesh_size(sizes, "mesh shape " + text);
  device_mesh m(sizes);
  try {
    for (std::size_t a = 0; a < names.size() && named; ++a) m.set_axis_name(a, names[a]);
  } catch (const spec_error& e) {
    fail(std::string(e.message()));  // said once: "mesh shape 'dp=2,dp=4': axis name 'dp' names two axes"
  }
  return m;
}

}  // namespace autoshard
