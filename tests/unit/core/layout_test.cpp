// Meshes, the split rule, local shards, and both spec notations, each checked against an
// independent computation: torch.chunk / numpy.array_split simulated on index lists, and
// row-major coordinates found by counting.
#include <doctest/doctest.h>

#include <autoshard/autoshard.hpp>

#include <algorithm>  // std::max, std::sort
#include <map>        // std::map
#include <sstream>    // std::ostringstream
#include <string>     // std::string
#include <vector>     // std::vector

#include "core_test_util.hpp"

using namespace autoshard;
using namespace autoshard::literals;
namespace at = autoshard_test;

namespace {

device_mesh mesh_of(const std::vector<int>& sizes) { return device_mesh(sizes); }

std::string spec_name(const sharding_spec& s) { return to_string(s); }

/// The exception message of `f`, which must throw spec_error (empty if it did not).
template <class F>
std::string spec_error_of(F&& f) {
  try {
    f();
  } catch (const spec_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("split rule: the worked numbers of the design") {
  const std::vector<std::pair<std::int64_t, std::int64_t>> five_over_four{{0, 2}, {2, 2}, {4, 1}, {5, 0}};
  const std::vector<std::pair<std::int64_t, std::int64_t>> six_over_four{{0, 2}, {2, 2}, {4, 2}, {6, 0}};
  const std::vector<std::pair<std::int64_t, std::int64_t>> six_balanced{{0, 2}, {2, 2}, {4, 1}, {5, 1}};
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r);
    auto u = static_cast<std::size_t>(r);
    CHECK(split_range(5, 4, r) == dim_range{five_over_four[u].first, five_over_four[u].second});
    CHECK(split_range(6, 4, r) == dim_range{six_over_four[u].first, six_over_four[u].second});
    CHECK(split_range(6, 4, r, split_rule::balanced) == dim_range{six_balanced[u].first, six_balanced[u].second});
    CHECK(split_range(8, 4, r) == dim_range{2 * r, 2});
  }
  CHECK(padded_piece(5, 4) == 2);
  CHECK(padded_piece(6, 4) == 2);
  CHECK(padded_piece(8, 4) == 2);
  CHECK(padded_piece(9, 4) == 3);
  CHECK(padded_piece(0, 4) == 0);
  // An empty shard sits at the end of the dim.
  CHECK(split_range(1, 3, 2) == dim_range{1, 0});
  CHECK(split_range(0, 3, 0) == dim_range{0, 0});
}

TEST_CASE("split rule: chunk and balanced against torch.chunk and array_split on index lists") {
  for (std::int64_t n = 0; n <= 40; ++n)
    for (int k = 1; k <= 9; ++k) {
      const auto chunks = at::torch_chunk(at::iota_piece(n), k);
      const auto splits = at::array_split(at::iota_piece(n), k);
      REQUIRE(chunks.size() == static_cast<std::size_t>(k));
      std::int64_t largest = 0;
      for (int r = 0; r < k; ++r) {
        CAPTURE(n);
        CAPTURE(k);
        CAPTURE(r);
        const auto& c = chunks[static_cast<std::size_t>(r)];
        const auto& b = splits[static_cast<std::size_t>(r)];
        CHECK(split_range(n, k, r) == dim_range{c.offset(), static_cast<std::int64_t>(c.idx.size())});
        CHECK(split_range(n, k, r, split_rule::balanced) ==
              dim_range{b.offset(), static_cast<std::int64_t>(b.idx.size())});
        largest = std::max(largest, static_cast<std::int64_t>(c.idx.size()));
      }
      CHECK(padded_piece(n, k) == largest);
    }
}

TEST_CASE("mesh: rank <-> coordinate is row-major, found by counting") {
  for (const std::vector<int>& sizes : std::vector<std::vector<int>>{
           {4}, {1}, {2, 4}, {3, 2}, {1, 4}, {2, 2, 2}, {2, 3, 4}, {2, 1, 3}, {2, 2, 2, 2}, {3, 1, 2, 2}}) {
    const device_mesh m = mesh_of(sizes);
    CAPTURE(to_string(m));
    const auto coords = at::all_coordinates(sizes);
    REQUIRE(m.num_ranks() == static_cast<int>(coords.size()));
    REQUIRE(m.ndim() == sizes.size());
    for (int r = 0; r < m.num_ranks(); ++r) {
      const auto& want = coords[static_cast<std::size_t>(r)];
      const auto got = m.coordinate(r);
      device_mesh::coords c{};
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        CHECK(got[i] == want[i]);
        c[i] = want[i];
      }
      CHECK(m.rank_of(c) == r);
    }
    // Axis groups: every rank with the same other coordinates, ordered by this axis.
    for (std::size_t axis = 0; axis < sizes.size(); ++axis) {
      std::map<std::vector<int>, std::vector<int>> groups;  // other coords -> ranks in counting order
      for (int r = 0; r < m.num_ranks(); ++r) {
        auto key = coords[static_cast<std::size_t>(r)];
        key[axis] = -1;
        groups[key].push_back(r);
      }
      std::vector<int> tags;
      for (const auto& [key, ranks] : groups) {
        REQUIRE(ranks.size() == static_cast<std::size_t>(sizes[axis]));
        for (std::size_t i = 0; i < ranks.size(); ++i) {
          CHECK(coords[static_cast<std::size_t>(ranks[i])][axis] == static_cast<int>(i));
          CHECK(m.group_member(axis, ranks[0], static_cast<int>(i)) == ranks[i]);
        }
        for (int r : ranks) {
          CHECK(m.group(axis, r) == ranks);
          CHECK(m.group_index(axis, r) == m.group_index(axis, ranks[0]));
        }
        tags.push_back(m.group_index(axis, ranks[0]));
      }
      std::sort(tags.begin(), tags.end());
      for (std::size_t i = 0; i < tags.size(); ++i) CHECK(tags[i] == static_cast<int>(i));
    }
  }
  const device_mesh m{2, 4};
  CHECK(m.rank_of({1, 2}) == 6);
  CHECK(m.coordinate(6)[0] == 1);
  CHECK(m.coordinate(6)[1] == 2);
  CHECK(m.group(0, 6) == std::vector<int>{2, 6});
  CHECK(m.group(1, 6) == std::vector<int>{4, 5, 6, 7});
}

TEST_CASE("mesh: errors, links, printing, parsing") {
  const device_mesh m{2, 4};
  CHECK_THROWS_AS(m.coordinate(8), spec_error);
  CHECK_THROWS_AS(m.coordinate(-1), spec_error);
  CHECK_THROWS_AS(m.rank_of({2, 0}), spec_error);
  CHECK_THROWS_AS(m.rank_of({0, -1}), spec_error);
  CHECK(spec_error_of([&] { (void)m.rank_of({1, 2, 0}); }).find("3 values on a mesh of 2 axes") != std::string::npos);
  CHECK_THROWS_AS((void)m.rank_of({1}), spec_error);
  CHECK(spec_error_of([&] { (void)m.group(2, 0); }).find("mesh axis 2 is outside [0, 2)") != std::string::npos);
  CHECK_THROWS_AS((void)m.group_member(4, 0, 0), spec_error);
  CHECK_THROWS_AS((void)m.group_index(3, 0), spec_error);
  CHECK_THROWS_AS(device_mesh(std::initializer_list<int>{}), spec_error);
  CHECK_THROWS_AS((device_mesh{1, 2, 3, 4, 5}), spec_error);
  CHECK(spec_error_of([] { (void)device_mesh{2, 0}; }).find("at least 1, got 0") != std::string::npos);
  CHECK_THROWS_AS(device_mesh(std::vector<int>{}), spec_error);

  const device_mesh d = make_mesh_2d(2, 8, 25e9, 300e9);
  CHECK(d.size(0) == 2);
  CHECK(d.size(1) == 8);
  CHECK(d.link(0) == link_model{2e-5, 25e9});
  CHECK(d.link(1) == link_model{5e-6, 300e9});
  device_mesh e{2, 8};
  CHECK_FALSE(e == d);
  e.set_link(0, {2e-5, 25e9}).set_link(1, {5e-6, 300e9});
  CHECK(e == d);
  CHECK_THROWS_AS(e.set_link(2, {}), spec_error);

  CHECK(to_string(device_mesh{2, 4}) == "mesh(2,4)");
  CHECK(to_string(device_mesh{8}) == "mesh(8)");
  CHECK(parse_mesh("2x4").shape() == std::vector<int>{2, 4});
  CHECK(parse_mesh("8").shape() == std::vector<int>{8});
  CHECK(parse_mesh("2X2x2").shape() == std::vector<int>{2, 2, 2});
  CHECK(parse_mesh("mesh(2,4)").shape() == std::vector<int>{2, 4});
  CHECK(parse_mesh("mesh(2, 4)").shape() == std::vector<int>{2, 4});
  for (const device_mesh& x : {device_mesh{3}, device_mesh{2, 4}, device_mesh{2, 1, 3}, device_mesh{2, 2, 2, 2}}) {
    CHECK(parse_mesh(to_string(x)) == x);
    CHECK(parse_mesh(shape_text(x)) == x);  // "2x1x3": the spelling --mesh takes
  }
  CHECK(shape_text(device_mesh{2, 1, 3}) == "2x1x3");
  for (const char* bad : {"", "x", "2x", "2x0", "2xx4", "2x4a", "1x2x3x4x5", "mesh(2,)", "99999999", "-2"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(parse_mesh(bad).shape(), spec_error);
  }
}

TEST_CASE("quoted_text: whole characters, a cut with the length, stray bytes and control characters as \\xHH") {
  CHECK(quoted_text("h.0.attn") == "'h.0.attn'");
  CHECK(quoted_text("") == "''");
  CHECK(quoted_text(std::string(100000, 'x')) == "'" + std::string(80, 'x') + "...' (100000 bytes)");
  CHECK(quoted_text(std::string(80, 'x')) == "'" + std::string(80, 'x') + "'");
  CHECK(quoted_text(std::string(79, 'x') + "\xD9\xA2") == "'" + std::string(79, 'x') + "...' (81 bytes)");  // not half of U+0662
  CHECK(quoted_text("a\xD9" "b\x1B[0m") == "'a\\xD9b\\x1B[0m'");
  CHECK(quoted_char_at("2x\xD9\xA2", 2) == "'\xD9\xA2'");
  CHECK(quoted_char_at("2x\xD9", 2) == "'\\xD9'");
  CHECK(quoted_char_at("2x", 2) == "the end");
  const auto error_of = [](auto f) -> std::string {
    try {
      f();
    } catch (const error& e) {
      return e.what();
    }
    return {};
  };
  // A digit of another script is quoted whole (it was quoted as its first byte).
  CHECK(error_of([] { (void)parse_mesh("2x\xD9\xA2"); }) ==
        "spec error: mesh shape '2x\xD9\xA2': unexpected character '\xD9\xA2' (write e.g. 2x4, or dp=2,tp=4 to name the axes)");
  CHECK(error_of([] { (void)parse_mesh("2x\xEF\xBC\x92"); }).find("unexpected character '\xEF\xBC\x92'") != std::string::npos);
  CHECK(error_of([] { (void)parse_spec("S\xD9\xA0R", 2, 2); }) == "spec error: 'S\xD9\xA0R' at position 1: unexpected character '\xD9\xA0'");
  CHECK(error_of([] { (void)parse_mesh(std::string(100000, '7')); }).size() < 300);
  // A spec from a plan file with an ESC or a newline: escaped, whole or in the window around the error.
  CHECK(error_of([] { (void)parse_spec("S\x1B[31m\n", 2, 2); }) == "spec error: 'S\\x1B[31m\\x0A' at position 1: unexpected character '\\x1B'");
  const std::string cut = error_of([] { (void)parse_spec("S\x1B[31m\n" + std::string(100, 'R'), 2, 2); });
  CHECK(cut.find("spec error: 'S\\x1B[31m\\x0ARRR") == 0);
  CHECK(cut.find("RRR...' (107 characters) at position 1") != std::string::npos);
  CHECK(cut.find_first_of("\x1B\n") == std::string::npos);
}

TEST_CASE("escaped_name: a file's name as a report prints it, whole up to 256 bytes, then cut with its length") {
  // solve echoed a 5 MB IOPDDL problem name whole; show --plan padded every row to a 5 MB name.
  CHECK(escaped_name("transformer.h.0.attn") == "transformer.h.0.attn");
  CHECK(escaped_name(std::string(256, 'x')) == std::string(256, 'x'));
  CHECK(escaped_name(std::string(5000000, 'x')) == std::string(256, 'x') + "... (5000000 bytes)");
  CHECK(escaped_name(std::string(255, 'x') + "\xD9\xA2") == std::string(255, 'x') + "... (257 bytes)");  // not half of U+0662
  CHECK(escaped_name("a\x1B[31mb\nc") == "a\\x1B[31mb\\x0Ac");  // escaped as escaped_text escapes
}

TEST_CASE("escaped_text: escaped as quoted_text escapes, without quotes and never cut (a report's columns)") {
  CHECK(escaped_text("transformer.h.0.attn") == "transformer.h.0.attn");  // an ordinary name reads as it is
  CHECK(escaped_text("") == "");
  CHECK(escaped_text("\xD9\xA2") == "\xD9\xA2");  // a valid character stays
  CHECK(escaped_text("a\x1B[31mb\nc") == "a\\x1B[31mb\\x0Ac");
  CHECK(escaped_text("a\xD9" "b\x7F") == "a\\xD9b\\x7F");
  const std::string hostile = "a\x1B[31mb\nc\xFF";
  CHECK("'" + escaped_text(hostile) + "'" == quoted_text(hostile));  // the one escaper, quoted_text's
  CHECK(escaped_text(std::string(100000, 'x')) == std::string(100000, 'x'));  // a table cuts nothing
  // C1 controls (U+0080..U+009F) are controls too: U+009B is CSI to a terminal that obeys C1.
  CHECK(escaped_text("a\xC2\x9B" "31mb\xC2\x85" "c") == "a\\xC2\\x9B31mb\\xC2\\x85c");
  CHECK(escaped_text("\xC2\xA0\xC2\xA9") == "\xC2\xA0\xC2\xA9");  // NBSP and (c) are no controls
  CHECK(quoted_text(std::string(79, 'x') + "\xC2\x9B") == "'" + std::string(79, 'x') + "...' (81 bytes)");  // not half of it
}

TEST_CASE("count_noun: a count and its noun, singular at 1 (a message read \"its 1 tensors\")") {
  CHECK(count_noun(1, "tensor") == "1 tensor");
  CHECK(count_noun(std::size_t{16}, "tensor") == "16 tensors");
  CHECK(count_noun(0, "rank file") == "0 rank files");
  CHECK(count_noun(std::uint64_t{1}, "shard entry", "shard entries") == "1 shard entry");
  CHECK(count_noun(std::int64_t{2}, "shard entry", "shard entries") == "2 shard entries");
  CHECK(count_noun(-1, "layer") == "-1 layers");
}

TEST_CASE("quoted_path: escaped always, whole up to 4096 bytes, a longer one cut in the middle") {
  // Paths were quoted raw: a newline or an ESC in a file name reached the terminal as is.
  CHECK(quoted_path("/data/model.safetensors") == "'/data/model.safetensors'");
  CHECK(quoted_path("/tmp/a\nb\x1B[31m\xFF.json") == "'/tmp/a\\x0Ab\\x1B[31m\\xFF.json'");
  CHECK(quoted_path("/tmp/\xD9\xA2.json") == "'/tmp/\xD9\xA2.json'");  // a valid character stays
  // Whole far beyond quoted_text's 80 bytes: a cut path names no file.
  const std::string long_dir = "/" + std::string(4000, 'd') + "/model.safetensors";
  CHECK(quoted_path(long_dir) == "'" + long_dir + "'");
  const std::string whole(max_quoted_path_bytes, 'p');
  CHECK(quoted_path(whole) == "'" + whole + "'");
  // Longer: its start and its end (the file's name), the length said.
  const std::string huge = "/" + std::string(9000, 'h') + "/end.json";
  const std::string q = quoted_path(huge);
  CHECK(q.rfind("'/hhh", 0) == 0);
  CHECK(q.find("...") != std::string::npos);
  CHECK(q.find("/end.json' (9010 bytes)") != std::string::npos);
  CHECK(q.size() < max_quoted_path_bytes + 40);
  // The cut falls between characters: no half of a two-byte one at the end's start.
  std::string wide = "/" + std::string(4100, 'x');
  for (int i = 0; i < 1100; ++i) wide += "\xD9\xA2";  // U+0662, two bytes
  wide += "z";  // the end's 2048 bytes start inside a character
  const std::string qw = quoted_path(wide);
  CHECK(qw.find("...\xD9\xA2") != std::string::npos);
  CHECK(qw.find("\\x") == std::string::npos);
}

TEST_CASE("mesh axis names: parsed, printed, round-tripped, and labels only") {
  const device_mesh n = parse_mesh("dp=2,tp=4");
  CHECK(n.shape() == std::vector<int>{2, 4});
  CHECK(n.axis_name(0) == "dp");
  CHECK(n.axis_name(1) == "tp");
  CHECK(n.has_axis_names());
  CHECK(n.find_axis("tp") == 1);
  CHECK(n.find_axis("pp") == -1);
  CHECK(n.axis_label(1) == "mesh axis 1 (tp)");
  CHECK(device_mesh{2, 4}.axis_label(1) == "mesh axis 1");
  CHECK(to_string(n) == "mesh(dp=2,tp=4)");
  CHECK(parse_mesh("mesh( dp = 2 , tp=4 )").axis_name(1) == "tp");
  CHECK(parse_mesh("dp=2,tp=4").shape() == std::vector<int>{2, 4});
  // Names are labels: equal to the unnamed mesh of the same sizes and links.
  CHECK(n == device_mesh{2, 4});
  CHECK_FALSE(device_mesh{2, 4}.has_axis_names());
  // Every spelling prints and parses back to the same sizes and names.
  for (const char* text : {"dp=2,tp=4", "pp=2,dp=2,tp=2", "x=8", "a1=1,_b=3,c_c=2,d=1", "mesh(2,4)", "2x2x2"}) {
    CAPTURE(text);
    const device_mesh m = parse_mesh(text);
    const device_mesh back = parse_mesh(to_string(m));
    CHECK(back == m);
    for (std::size_t i = 0; i < m.ndim(); ++i) CHECK(back.axis_name(i) == m.axis_name(i));
  }
  // Bad names and mixtures: one clear error each.
  for (const char* bad : {"dp=2,4", "dp=2,dp=4", "1a=2", "d-p=2", "dp=,tp=4", "=2", "a_name_too_long_x=2", "dp=0",
                          "dp=2,tp=4,pp=1,ep=1,sp=1"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(parse_mesh(bad), spec_error);
  }
  CHECK(spec_error_of([] { (void)parse_mesh("dp=2,4"); }).find("name every axis or none") != std::string::npos);
  CHECK(spec_error_of([] { (void)parse_mesh("dp=2,dp=4"); }).find("'dp' names two axes") != std::string::npos);
  // The message says "spec error" once (the inner one's label was stripped by a prefix that no
  // longer existed: "spec error: mesh shape 'dp=2,dp=4': spec error: ...").
  const std::string twice = spec_error_of([] { (void)parse_mesh("dp=2,dp=4"); });
  CHECK(twice.rfind("spec error: mesh shape 'dp=2,dp=4': ", 0) == 0);
  CHECK(twice.find("spec error", 1) == std::string::npos);
  CHECK(shape_text(parse_mesh("dp=2,tp=4")) == "dp=2,tp=4");
  // One place gives a parsed mesh its links, keeping its names.
  const device_mesh linked = with_cluster_links(parse_mesh("dp=2,tp=4"), {.inter_node_bandwidth = 10e9});
  CHECK(linked.axis_name(1) == "tp");
  CHECK(linked.link(0).beta == 10e9);
  CHECK(linked == make_cluster_mesh({2, 4}, {.inter_node_bandwidth = 10e9}));
  device_mesh m{2, 4};
  CHECK_THROWS_AS(m.set_axis_name(2, "pp"), spec_error);
  m.set_axis_name(0, "nodes").set_axis_name(1, "gpus");
  CHECK(to_string(m) == "mesh(nodes=2,gpus=4)");
}

TEST_CASE("mesh_extents: static sizes are free, dynamic ones are stored") {
  using S = mesh_extents<2, 4>;
  using D = mesh_extents<2, dyn>;
  using DD = mesh_extents<dyn, 3, dyn>;
  CHECK(S::rank() == 2);
  CHECK(S::rank_dynamic() == 0);
  CHECK(S::is_static());
  CHECK(S{}.size(1) == 4);
  CHECK(D::rank_dynamic() == 1);
  CHECK_FALSE(D::is_static());
  CHECK(D::static_size(1) == dyn);
  const D d(8);
  CHECK(d.size(0) == 2);
  CHECK(d.size(1) == 8);
  const DD dd(5, 7);
  CHECK(dd.size(0) == 5);
  CHECK(dd.size(1) == 3);
  CHECK(dd.size(2) == 7);
  CHECK(sizeof(DD) == 2 * sizeof(int));
  CHECK(device_mesh(dd) == device_mesh{5, 3, 7});
  CHECK(device_mesh(S{}) == device_mesh{2, 4});
  CHECK(device_mesh(d, link_model{1e-6, 1e9}).link(1) == link_model{1e-6, 1e9});
  CHECK_THROWS_AS(D(0), shape_error);
  CHECK_THROWS_AS(DD(2, -1), shape_error);
}

TEST_CASE("local_box: every rank, spec and shape against chunking index lists") {
  struct mesh_case {
    std::vector<int> sizes;
    std::vector<tensor_shape> shapes;
  };
  // Even, uneven (5 and 6 over 4), empty-shard and nested cases, tensors of rank 1 to 3.
  const std::vector<mesh_case> cases{
      {{4}, {{8}, {5}, {6}, {3}, {0}, {8, 4}, {5, 6}, {6, 5}, {3, 2, 5}}},
      {{3}, {{6}, {7}, {2, 9}}},
      {{2, 4}, {{16}, {5}, {10}, {3}, {8, 12}, {5, 6}, {6, 5}, {2, 3}, {4, 6, 3}}},
      {{2, 3}, {{12}, {7}, {12, 6}, {5, 7}, {1, 4}, {3, 4, 5}}},
      {{1, 4}, {{6, 5}}},
      {{2, 2, 2}, {{8}, {5}, {3}, {8, 8}, {5, 6}, {3, 2}, {2, 3, 5}}},
      {{2, 1, 3}, {{6, 5}, {7, 2, 4}}},
      {{2, 2, 2, 2}, {{16}, {9, 4}}},
  };
  int checked = 0;
  for (const auto& mc : cases) {
    const device_mesh m = mesh_of(mc.sizes);
    const auto coords = at::all_coordinates(mc.sizes);
    for (const tensor_shape& g : mc.shapes) {
      const int t = static_cast<int>(g.rank);
      for (const sharding_spec& s : at::all_specs(static_cast<int>(mc.sizes.size()), t, {reduce_op::sum})) {
        CAPTURE(to_string(m));
        CAPTURE(to_string(g));
        CAPTURE(spec_name(s));
        // How many ranks hold each global element: the product of the axes that do not shard.
        int copies = 1;
        for (std::size_t i = 0; i < mc.sizes.size(); ++i)
          if (!s[i].is_shard()) copies *= mc.sizes[i];
        std::vector<int> holders(static_cast<std::size_t>(g.numel()), 0);
        tensor_shape largest = g;
        for (int d = 0; d < t; ++d) largest[static_cast<std::size_t>(d)] = 0;
        bool all_equal = true, none_empty = true;
        std::vector<tensor_shape> leaves;
        for (int r = 0; r < m.num_ranks(); ++r) {
          const auto& c = coords[static_cast<std::size_t>(r)];
          const shard_box box = local_box(m, s, g, r);
          const shard_box bal = local_box(m, s, g, r, split_rule::balanced);
          REQUIRE(box.shape.rank == g.rank);
          REQUIRE(box.offset.rank == g.rank);
          CHECK(local_shape(m, s, g, r) == box.shape);
          for (int d = 0; d < t; ++d) {
            const auto u = static_cast<std::size_t>(d);
            const auto p = at::brute_dim_piece(mc.sizes, c, s, d, g[u]);
            const auto q = at::brute_dim_piece(mc.sizes, c, s, d, g[u], true);
            CHECK(box.shape[u] == static_cast<std::int64_t>(p.idx.size()));
            CHECK(box.offset[u] == p.offset());
            CHECK(bal.shape[u] == static_cast<std::int64_t>(q.idx.size()));
            CHECK(bal.offset[u] == q.offset());
            largest[u] = std::max(largest[u], box.shape[u]);
            if (s.is_sharded(d) && box.shape[u] == 0) none_empty = false;
          }
          leaves.push_back(box.shape);
          // Mark the elements this rank holds.
          std::vector<std::int64_t> idx(g.rank, 0);
          if (!box.empty())
            for (;;) {
              std::int64_t flat = 0;
              for (std::size_t d = 0; d < g.rank; ++d) flat = flat * g[d] + box.offset[d] + idx[d];
              ++holders[static_cast<std::size_t>(flat)];
              std::size_t d = g.rank;
              while (d > 0 && ++idx[d - 1] == box.shape[d - 1]) idx[--d] = 0;
              if (d == 0) break;
            }
          ++checked;
        }
        for (const auto& l : leaves) all_equal = all_equal && l == leaves.front();
        for (int h : holders) CHECK(h == copies);
        CHECK(max_local_shape(m, s, g) == largest);
        CHECK(max_local_shape(m, s, g) == local_shape(m, s, g, 0));  // rank 0 holds the largest shard
        CHECK(divides_evenly(m, s, g) == all_equal);
        CHECK(no_empty_shards(m, s, g) == none_empty);
        if (all_equal) {
          CHECK_NOTHROW(require_even(m, s, g, "w"));
        } else {
          CHECK_THROWS_AS(require_even(m, s, g, "w"), shape_error);
        }
      }
    }
  }
  CHECK(checked > 10000);
}

TEST_CASE("no_empty_shards: the same verdicts as visiting every rank, without visiting them") {
  // The oracle: every rank's box, as no_empty_shards once computed it (2^20 ranks took 20 s).
  const auto every_rank = [](const device_mesh& m, const sharding_spec& s, const tensor_shape& g, split_rule rule) {
    for (int r = 0; r < m.num_ranks(); ++r) {
      const tensor_shape local = local_box(m, s, g, r, rule).shape;
      for (int d = 0; d < s.tensor_rank; ++d)
        if (s.is_sharded(d) && local[static_cast<std::size_t>(d)] == 0) return false;
    }
    return true;
  };
  // Every spec of these meshes over dims 0..13 (rank 1) and a few rank-2 shapes: the sizes
  // where nesting empties a piece (10 over 2 then 4, 9 over 4) and where it does not.
  const std::vector<std::vector<int>> meshes{{4}, {3}, {2, 4}, {4, 3}, {3, 2, 2}, {2, 3, 2, 2}, {5, 1, 3}};
  int checked = 0, empty = 0;
  for (const auto& sizes : meshes) {
    const device_mesh m = mesh_of(sizes);
    std::vector<tensor_shape> shapes;
    for (std::int64_t n = 0; n <= 13; ++n) shapes.push_back(tensor_shape{n});
    for (std::int64_t a : {1, 5, 7, 12})
      for (std::int64_t b : {2, 6, 9}) shapes.push_back(tensor_shape{a, b});
    for (const tensor_shape& g : shapes)
      for (const sharding_spec& s : at::all_specs(static_cast<int>(sizes.size()), static_cast<int>(g.rank), {}))
        for (split_rule rule : {split_rule::chunk, split_rule::balanced}) {
          CAPTURE(to_string(m));
          CAPTURE(to_string(g));
          CAPTURE(spec_name(s));
          const bool want = every_rank(m, s, g, rule);
          CHECK(no_empty_shards(m, s, g, rule) == want);
          ++checked;
          empty += want ? 0 : 1;
        }
  }
  CHECK(checked > 5000);
  CHECK(empty > 500);  // the sweep reaches both verdicts
  // Errors are local_box's: a spec for another mesh, a Shard outside the tensor.
  CHECK_THROWS_AS((void)no_empty_shards(device_mesh{2, 2}, parse_spec("S0", 1, 1), {4}), shape_error);
  // 2^20 ranks: four axes of 32, a dim split by all four. Once 2^20 boxes, now a few divisions.
  const device_mesh big{32, 32, 32, 32};
  const auto s0123 = parse_spec("S0123", 4, 1);
  const std::int64_t mi = std::int64_t{1} << 20;
  CHECK(no_empty_shards(big, s0123, {mi}));
  CHECK(no_empty_shards(big, s0123, {mi}, split_rule::balanced));
  CHECK(no_empty_shards(big, s0123, {3 * mi - 1}));
  // 2^20 + 1: the blocks of 33 on the third level end in one of 2, whose split over 32 is 1,1,0,...
  CHECK_FALSE(no_empty_shards(big, s0123, {mi + 1}));
  CHECK(no_empty_shards(big, s0123, {mi + 1}, split_rule::balanced));
  CHECK_FALSE(no_empty_shards(big, s0123, {mi - 1}));
  CHECK_FALSE(no_empty_shards(big, s0123, {mi - 1}, split_rule::balanced));  // 31 of the last level over 32
  const auto s01_23 = parse_spec("S01S23", 4, 2);
  CHECK(no_empty_shards(big, s01_23, {1024, 1024}));
  CHECK_FALSE(no_empty_shards(big, s01_23, {1024, 1000}));  // 1000 over 32 -> 32 x 31, 8; 32 over 32 -> 1; 8 over 32 -> 1 x 8, 0
}

TEST_CASE("local_box: nested splits go outer axis first, with worked numbers") {
  const device_mesh m{2, 4};
  // 10 over 2 -> [0,5) [5,10); each over 4 -> 2,2,1,0: rank 5 = (1,1) holds [7,9).
  const auto s01 = parse_spec("S01R", 2, 2);
  CHECK(local_box(m, s01, {10, 3}, 5) == shard_box{{2, 3}, {7, 0}});
  CHECK(local_box(m, s01, {10, 3}, 7) == shard_box{{0, 3}, {10, 0}});  // empty: offset at the end
  CHECK(local_box(m, s01, {10, 3}, 3) == shard_box{{0, 3}, {5, 0}});   // empty inside the first half
  // The same axes in the other order is a different layout: Alpa writes S01, never S10,
  // and the DTensor spelling [S(0),S(0)] is the only nesting order there is.
  CHECK(parse_spec("[S(0),S(0)]", 2, 2) == s01);
  const auto rs = parse_spec("[S(1),S(0)]", 2, 2);
  // Rank 7 = (1,3): dim 1 over axis 0 -> [3,5); dim 0 over axis 1 -> 2,2,2,0, the last empty.
  CHECK(local_box(m, rs, {6, 5}, 7) == shard_box{{0, 2}, {6, 3}});
  CHECK(local_box(m, rs, {6, 5}, 5) == shard_box{{2, 2}, {2, 3}});
  CHECK(local_box(m, rs, {6, 5}, 0) == shard_box{{2, 3}, {0, 0}});
  // Errors: the spec must fit the mesh and the tensor.
  CHECK_THROWS_AS(local_box(m, s01, {10}, 0), shape_error);
  CHECK_THROWS_AS(local_box(device_mesh{8}, s01, {10, 3}, 0), shape_error);
  CHECK_THROWS_AS(local_box(m, s01, {10, 3}, 8), spec_error);
  sharding_spec bad = s01;
  bad.placements[1] = Shard(5);
  CHECK(spec_error_of([&] { (void)local_box(m, bad, {10, 3}, 0); }).find("Shard(5) is outside a tensor of rank 2") !=
        std::string::npos);
  try {
    require_even(m, parse_spec("RS1", 2, 2), {8, 6}, "c_attn.weight");
    FAIL("require_even accepted 6 over 4");
  } catch (const shape_error& e) {
    CHECK(std::string(e.what()) ==
          "shape error: c_attn.weight: dim 1 of size 6 does not divide over 4 ranks of mesh axis 1");
  }
}

TEST_CASE("specs: both notations round-trip over every spec of small meshes") {
  int n = 0;
  for (int mr = 1; mr <= 4; ++mr)
    for (int tr = 1; tr <= 3; ++tr)
      for (const sharding_spec& s : at::all_specs(mr, tr)) {
        const std::string dt = to_string(s), alpa = to_alpa_string(s);
        CAPTURE(dt);
        CAPTURE(alpa);
        CHECK(parse_spec(dt, mr, tr) == s);
        CHECK(parse_spec(alpa, mr, tr) == s);
        CHECK(parse_spec(alpa, -1, tr) == parse_spec(alpa, -1, -1));
        CHECK(parse_spec(dt, mr) == parse_spec(dt));
        // Without context each notation infers what it can: DTensor the mesh rank,
        // Alpa the tensor rank.
        CHECK(parse_spec(dt).mesh_rank == mr);
        CHECK(parse_spec(alpa).tensor_rank == tr);
        CHECK(parse_spec(alpa, mr).tensor_rank == tr);
        // Printing is canonical: what parses prints back the same.
        CHECK(to_string(parse_spec(alpa, mr, tr)) == dt);
        CHECK(to_alpa_string(parse_spec(dt, mr, tr)) == alpa);
        ++n;
      }
  CHECK(n == 5 + 25 + 125 + 625 + 6 + 36 + 216 + 1296 + 7 + 49 + 343 + 2401);
}

TEST_CASE("specs: the two notations name the same placements") {
  struct eq {
    const char* dtensor;
    const char* alpa;
    int mesh_rank;
    int tensor_rank;
  };
  for (const eq& e : {eq{"[S(0),R]", "S0R", 2, 2}, eq{"[R,S(0)]", "S1R", 2, 2}, eq{"[S(0),S(0)]", "S01R", 2, 2},
                      eq{"[R,S(1)]", "RS1", 2, 2}, eq{"[S(1),S(0)]", "S1S0", 2, 2}, eq{"[R,R]", "RR", 2, 2},
                      eq{"[P,R]", "RRP0", 2, 2}, eq{"[R,P(max)]", "RRPmax1", 2, 2}, eq{"[S(2),P(min),S(0)]", "S2RS0Pmin1", 3, 3},
                      eq{"[P,P(max),R,S(1)]", "RS3P0Pmax1", 4, 2}, eq{"[S(0)]", "S0", 1, 1}}) {
    CAPTURE(e.dtensor);
    CHECK(parse_spec(e.dtensor, e.mesh_rank, e.tensor_rank) == parse_spec(e.alpa, e.mesh_rank, e.tensor_rank));
    CHECK(to_string(parse_spec(e.alpa, e.mesh_rank, e.tensor_rank)) == e.dtensor);
    CHECK(to_alpa_string(parse_spec(e.dtensor, e.mesh_rank, e.tensor_rank)) == e.alpa);
  }
  // The long DTensor spellings, spaces, and Partial's spellings.
  CHECK(parse_spec("[Shard(0), Replicate()]") == parse_spec("[S(0),R]"));
  CHECK(parse_spec("[Shard(0), Replicate]") == parse_spec("[S(0),R]"));
  CHECK(parse_spec(" [ S( 1 ) , Partial( max ) ] ") == make_spec(2, {Shard(1), Partial(reduce_op::max)}));
  CHECK(parse_spec("[Partial(sum),P(),P,Partial]", 4, 1) == make_spec(1, {Partial(), Partial(), Partial(), Partial()}));
  CHECK(parse_spec("[P(min)]", 1, 1)[0] == Partial(reduce_op::min));
  CHECK(parse_spec("RPsum0", 1) == parse_spec("RP0", 1));
  CHECK(parse_spec("S0R ", 2) == parse_spec("S0R", 2));
  // Inferred ranks.
  CHECK(parse_spec("[S(2),R]").tensor_rank == 3);
  CHECK(parse_spec("[R,R]").tensor_rank == 0);
  CHECK(parse_spec("S1R").mesh_rank == 2);
  CHECK(parse_spec("RR").mesh_rank == 1);
  // Compile-time spellings agree with the runtime parser.
  constexpr sharding_spec lit = "S01R"_spec;
  CHECK(lit == parse_spec("S01R"));
  constexpr spec_literal sl = "[S(0),R]";
  CHECK(sharding_spec(sl) == parse_spec("[S(0),R]"));
  CHECK(make_spec(2, {Shard(0), Replicate()}) == parse_spec("S0R", 2));
  CHECK_THROWS_AS(make_spec(2, {Shard(2)}), spec_error);
  CHECK_THROWS_AS(make_spec(2, {Replicate(), Replicate(), Replicate(), Replicate(), Replicate()}), spec_error);
  std::ostringstream os;
  os << parse_spec("S0R", 2) << " " << Partial(reduce_op::max) << " " << tensor_shape{4, 2};
  CHECK(os.str() == "[S(0),R] P(max) [4,2]");
}

TEST_CASE("specs: every parse error names the problem and the position") {
  struct bad {
    const char* text;
    int mesh_rank;
    int tensor_rank;
    const char* message;  // after "spec error: "
  };
  const bad cases[] = {
      {"", -1, -1, "'' at position 0: the spec is empty"},
      {"   ", -1, -1, "'   ' at position 3: the spec is empty"},
      {"[]", -1, -1, "'[]' at position 1: the spec is empty"},
      {"[ ]", -1, -1, "'[ ]' at position 2: the spec is empty"},
      {"S0X", -1, -1, "'S0X' at position 2: unexpected character 'X'"},
      {"s0R", -1, -1, "'s0R' at position 0: unexpected character 's'"},
      {"S0 R", -1, -1, "'S0 R' at position 3: unexpected character 'R'"},
      {"SR", -1, -1, "'SR' at position 1: unexpected character 'R'"},
      {"S", -1, -1, "'S' at position 1: unexpected end of the spec"},
      {"RP", -1, -1, "'RP' at position 2: unexpected end of the spec"},
      {"RPavg0", -1, -1, "'RPavg0' at position 2: unexpected character 'a'"},
      {"[S(0),R", -1, -1, "'[S(0),R' at position 7: expected ']' or ','"},
      {"[S(0) R]", -1, -1, "'[S(0) R]' at position 6: expected ']' or ','"},
      {"[S(0),,]", -1, -1, "'[S(0),,]' at position 6: unexpected character ','"},
      {"[S(0),R] x", -1, -1, "'[S(0),R] x' at position 9: unexpected character 'x'"},
      {"[S(x)]", -1, -1, "'[S(x)]' at position 3: unexpected character 'x'"},
      {"[S(0]", -1, -1, "'[S(0]' at position 4: unexpected character ']'"},
      {"[Shard(1]", -1, -1, "'[Shard(1]' at position 8: unexpected character ']'"},
      {"[P(avg)]", -1, -1, "'[P(avg)]' at position 3: Partial(avg) is not supported: the supported reduce ops are sum, max and min (PyTorch's avg and product have no counterpart here)"},
      {"[P(max]", -1, -1, "'[P(max]' at position 6: unexpected character ']'"},
      {"[S(", -1, -1, "'[S(' at position 3: unexpected end of the spec"},
      {"[S(100)]", -1, -1, "'[S(100)]' at position 6: number too large"},
      {"[S(9)]", -1, -1, "'[S(9)]' at position 1: Shard(9) is outside a tensor of rank 8"},
      {"[R,S(2)]", -1, 2, "'[R,S(2)]' at position 3: Shard(2) is outside a tensor of rank 2"},
      {"[R,R,R,R,R]", -1, -1, "'[R,R,R,R,R]' at position 9: more than 4 placements (a mesh has at most 4 axes)"},
      {"[S(0),R]", 3, -1, "'[S(0),R]' at position 0: has 2 placements but the mesh has 3 axes"},
      {"S00", -1, -1, "'S00' at position 2: mesh axis 0 used twice"},
      {"S0S0", -1, -1, "'S0S0' at position 3: mesh axis 0 used twice"},
      {"S1P1", -1, -1, "'S1P1' at position 3: mesh axis 1 used twice"},
      {"S10", -1, -1, "'S10' at position 2: mesh axes splitting one tensor dim must be listed outer first (S01, not S10)"},
      {"S4", -1, -1, "'S4' at position 1: mesh axis 4 is outside a mesh of 4 axes"},
      {"RS2", 2, -1, "'RS2' at position 2: mesh axis 2 is outside a mesh of 2 axes"},
      {"RRP1", 1, -1, "'RRP1' at position 3: mesh axis 1 is outside a mesh of 1 axes"},
      {"S0R", -1, 3, "'S0R' at position 0: describes 2 tensor dims but the tensor has rank 3"},
      {"RRRRRRRRR", -1, -1, "'RRRRRRRRR' at position 8: more than 8 tensor dims (a tensor has at most 8)"},
      {"RRRRRRRRS0", -1, -1, "'RRRRRRRRS0' at position 8: more than 8 tensor dims (a tensor has at most 8)"},
  };
  for (const bad& b : cases) {
    CAPTURE(b.text);
    CHECK(spec_error_of([&] { (void)parse_spec(b.text, b.mesh_rank, b.tensor_rank); }) ==
          std::string("spec error: ") + b.message);
  }
  // Contexts that are out of range are errors too (no position: the text is not at fault).
  CHECK(spec_error_of([] { (void)parse_spec("S0R", 5); }).find("at most 4 mesh axes") != std::string::npos);
  CHECK(spec_error_of([] { (void)parse_spec("S0R", -1, 9); }).find("at most 8 dims") != std::string::npos);
  CHECK(spec_error_of([] { (void)parse_spec("RR", 0); }).find("at least one axis") != std::string::npos);
  CHECK(spec_error_of([] { (void)parse_spec("[R]", 0); }).find("at least one axis") != std::string::npos);
  // Every spec_error is an autoshard::error.
  CHECK_THROWS_AS((void)parse_spec("S0X"), autoshard::error);
}

TEST_CASE("specs: a long spec is quoted around the position, not whole") {
  // A 10 MB spec string in a plan file made a 20 MB error line (the text quoted whole, twice).
  const std::string dims(100000, 'R');
  const std::string msg = spec_error_of([&] { (void)parse_spec("S0" + dims); });
  CHECK(msg.size() < 200);
  CHECK(msg == "spec error: 'S0RRRRRRRRRRRRRRRRRRRRRRRRRRRRRRRRRRRRRRRRRRRRRRRRRRRRRRRRRR...' (100002 characters) at position 9: "
               "more than 8 tensor dims (a tensor has at most 8)");
  // The window follows the position: the middle of a long text is quoted between two "...".
  const std::string mid = spec_error_of([&] { (void)parse_spec(std::string(50, ' ') + "S0S0" + std::string(50, ' ')); });
  CHECK(mid.find("'...") != std::string::npos);
  CHECK(mid.find("S0S0") != std::string::npos);
  CHECK(mid.find("...' (104 characters) at position 53: mesh axis 0 used twice") != std::string::npos);
  // Up to 80 characters the text is quoted whole, as before.
  const std::string eighty = std::string(76, ' ') + "S0S0";
  CHECK(spec_error_of([&] { (void)parse_spec(eighty); }) == "spec error: '" + eighty + "' at position 79: mesh axis 0 used twice");
}

namespace {
using typed_rs1 = sharded_tensor<float, mesh_extents<2, 4>, "RS1", 768, 2304>;
using typed_nested = sharded_tensor<bf16_t, mesh_extents<2, 4>, "S01R", 10, 3>;
using typed_cube = sharded_tensor<std::int32_t, mesh_extents<2, 2, 2>, "[S(1),S(0),S(1)]", 5, 6, 3>;
using typed_thin = sharded_tensor<double, mesh_extents<1, 4>, "S1R", 6, 5>;
using typed_partial = sharded_tensor<std::uint8_t, mesh_extents<3>, "[P(max)]", 7>;
}  // namespace

TEST_CASE_TEMPLATE("typed tensors agree with the runtime layout and with chunked index lists", T, typed_rs1,
                   typed_nested, typed_cube, typed_thin, typed_partial) {
  using M = typename T::mesh_type;
  const device_mesh m{M{}};
  std::vector<int> sizes;
  for (std::size_t i = 0; i < M::rank(); ++i) sizes.push_back(M{}.size(i));
  const auto coords = at::all_coordinates(sizes);
  CHECK(T::spec.mesh_rank == M::rank());
  CHECK(T::spec.tensor_rank == T::global_shape.rank);
  CHECK(T::lower() == sharded_desc{T::global_shape, T::type, T::spec});
  std::int64_t largest = 0;
  for (int r = 0; r < m.num_ranks(); ++r) {
    const shard_box b = T::local_box(r);
    CHECK(b == local_box(m, T::spec, T::global_shape, r));
    CHECK(b == T::local_box(M{}, r));
    CHECK(T::local_shape(r) == b.shape);
    for (int d = 0; d < static_cast<int>(T::global_shape.rank); ++d) {
      const auto p = at::brute_dim_piece(sizes, coords[static_cast<std::size_t>(r)], T::spec, d,
                                         T::global_shape[static_cast<std::size_t>(d)]);
      CHECK(b.shape[static_cast<std::size_t>(d)] == static_cast<std::int64_t>(p.idx.size()));
      CHECK(b.offset[static_cast<std::size_t>(d)] == p.offset());
    }
    largest = std::max(largest, b.shape.numel());
  }
  CHECK(T::max_local_elements() == largest);
}

TEST_CASE("check_spec names the tensor and the mismatch") {
  const device_mesh m{2, 4};
  CHECK_NOTHROW(check_spec(parse_spec("S0R", 2), m, {8, 4}, "wte"));
  CHECK(spec_error_of([&] { check_spec(parse_spec("S0R"), m, {8, 4}, "wte"); }) ==
        "spec error: wte: spec has 1 mesh axes but the mesh mesh(2,4) has 2");
  CHECK(spec_error_of([&] { check_spec(parse_spec("S0R", 2), m, {8, 4, 2}, "wte"); }) ==
        "spec error: wte: spec is for a tensor of rank 2 but the tensor [8,4,2] has rank 3");
  sharding_spec bad = parse_spec("S0R", 2);
  bad.placements[1] = Shard(3);
  CHECK(spec_error_of([&] { check_spec(bad, m, {8, 4}); }) ==
        "spec error: Shard(3) is outside a tensor of rank 2");
}

TEST_CASE("specs: PyTorch's printed spellings parse to the same values") {
  // What `print(dtensor.placements)` shows: a tuple of reprs (Shard's with dim=, Partial's op bare).
  CHECK(parse_spec("(Replicate(), Shard(dim=1))", 2, 2) == make_spec(2, {Replicate(), Shard(1)}));
  CHECK(parse_spec("(Shard(dim=0), Replicate())") == parse_spec("[S(0),R]"));
  CHECK(parse_spec("(Shard(dim=0),)", 1, 1) == parse_spec("S0", 1, 1));  // Python's one-element tuple
  CHECK(parse_spec("[S(0),]", 1, 1) == parse_spec("S0", 1, 1));          // and a list's trailing comma
  CHECK(parse_spec("[Shard(0), Partial()]", 2, 1) == make_spec(1, {Shard(0), Partial()}));
  CHECK(parse_spec("(Partial(sum), Partial(max))", 2, 1) == parse_spec("[P,P(max)]", 2, 1));
  CHECK(parse_spec("[ Shard( dim = 2 ) , R ]") == parse_spec("[S(2),R]"));
  // Partial's reduce op as a Python string, positional or by keyword.
  CHECK(parse_spec("[Partial(\"max\")]", 1, 1)[0] == Partial(reduce_op::max));
  CHECK(parse_spec("[Partial('min')]", 1, 1)[0] == Partial(reduce_op::min));
  CHECK(parse_spec("[Partial(reduce_op=\"sum\")]", 1, 1)[0] == Partial());
  // Negative dims count from the end of the tensor's dims, resolved against its rank.
  CHECK(parse_spec("[Shard(-1), R]", 2, 3) == parse_spec("[S(2),R]", 2, 3));
  CHECK(parse_spec("(Shard(dim=-2),)", 1, 2) == parse_spec("S0R", 1, 2));
  CHECK(parse_spec("[S(-3)]", 1, 3)[0] == Shard(0));
  CHECK(to_string(parse_spec("[S(-1)]", 1, 2)) == "[S(1)]");  // prints the resolved dim
  // ... and need that rank: an error that says so, and one naming the range when it is out.
  CHECK(spec_error_of([] { (void)parse_spec("[Shard(-1), R]"); }).find("needs the tensor's rank") != std::string::npos);
  CHECK(spec_error_of([] { (void)parse_spec("[S(-3)]", 1, 2); })
            .find("Shard(-3) counts from the end but the tensor has rank 2 (dims -1 to -2)") != std::string::npos);
  CHECK_THROWS_AS(parse_spec("[S(-0)]", 1, 2), spec_error);
  // Reduce ops PyTorch has and this model does not: refused, naming the supported ones.
  for (const char* bad : {"[Partial(\"avg\")]", "[P(avg)]", "[Partial(product)]", "[P('avg')]", "[P(maximum)]"}) {
    CAPTURE(bad);
    const std::string msg = spec_error_of([&] { (void)parse_spec(bad, 1, 1); });
    CHECK(msg.find("is not supported: the supported reduce ops are sum, max and min") != std::string::npos);
  }
  CHECK(spec_error_of([] { (void)parse_spec("[P(avg)]"); }).find("Partial(avg) is not supported") != std::string::npos);
  // A bare placement is not a spec: the message says what to write instead.
  for (const char* bare : {"S(0)", "Shard(0)", "Replicate()", "P(max)", "Partial()", " S(1)"}) {
    CAPTURE(bare);
    const std::string msg = spec_error_of([&] { (void)parse_spec(bare); });
    CHECK(msg.find("a bare placement is not a spec") != std::string::npos);
    CHECK(msg.find("[S(0)]") != std::string::npos);
  }
  // Brackets must match, a lone trailing comma needs a placement before it.
  CHECK(spec_error_of([] { (void)parse_spec("(S(0), R]"); }).find("expected ')'") != std::string::npos);
  CHECK(spec_error_of([] { (void)parse_spec("[S(0), R)"); }).find("expected ']'") != std::string::npos);
  CHECK_THROWS_AS(parse_spec("(,)"), spec_error);
  CHECK_THROWS_AS(parse_spec("()"), spec_error);
  CHECK_THROWS_AS(parse_spec("(S(0),,)"), spec_error);
  CHECK_THROWS_AS(parse_spec("(Shard(dim 1),)"), spec_error);
  CHECK(spec_error_of([] { (void)parse_spec("(_StridedShard(dim=0, sf=2), Shard(dim=0))"); }).find("_StridedShard") !=
        std::string::npos);
  // Every printed spec of a small mesh, respelled as PyTorch prints it, parses back to itself.
  int n = 0;
  for (const sharding_spec& s : at::all_specs(3, 2)) {
    std::string py = "(";
    for (std::size_t i = 0; i < s.mesh_rank; ++i) {
      const placement& p = s[i];
      py += p.is_replicate() ? std::string("Replicate()")
            : p.is_shard()   ? "Shard(dim=" + std::to_string(p.dim - s.tensor_rank) + ")"  // negative on purpose
                             : "Partial(" + std::string(to_string(p.op)) + ")";
      py += ", ";
    }
    py += ")";
    CAPTURE(py);
    CHECK(parse_spec(py, s.mesh_rank, s.tensor_rank) == s);
    ++n;
  }
  CHECK(n == 6 * 6 * 6);
}
