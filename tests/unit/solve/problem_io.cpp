// strategy_problem evaluation and the IOPDDL reader/writer.
#include <doctest/doctest.h>

#include <autoshard/solve/solve.hpp>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "brute.hpp"
#include "unit/scratch.hpp"

namespace {

constexpr std::int64_t infinite_cost_minus_one() { return autoshard::infinite_cost - 1; }

autoshard::strategy_problem example() {
  return autoshard::read_iopddl_file(AUTOSHARD_TEST_DATA_DIR "/solve/example.json");
}

// Parse `text`; expect an io_error whose message contains `needle`.
void expect_io_error(const std::string& text, const std::string& needle) {
  CAPTURE(text);
  std::istringstream in(text);
  CHECK_THROWS_WITH_AS(autoshard::read_iopddl(in, "doc.json"), doctest::Contains(needle.c_str()),
                       autoshard::io_error);
}

const char* const good_prefix = R"({"problem":{"name":"x","nodes":{"intervals":[[0,2],[1,3]],)";

// A problem of two nodes (1 and 2 strategies) whose `edges` member comes before `nodes`:
// `edges` is spliced in.
std::string edges_first(const std::string& edges) {
  return R"({"problem":{"edges":)" + edges +
         R"(,"nodes":{"intervals":[[0,2],[1,3]],"costs":[[1],[2,3]],"usages":[[0],[0,0]]}}})";
}

// `text` read by read_iopddl, and the same text parsed by nlohmann and read by parse_iopddl:
// one reader, so both give the same problem or the same message.
autoshard::strategy_problem read_both(const std::string& text) {
  std::istringstream in(text);
  const autoshard::strategy_problem p = autoshard::read_iopddl(in, "doc.json");
  CHECK(autoshard::parse_iopddl(nlohmann::json::parse(text), "doc.json") == p);
  return p;
}

}  // namespace

TEST_CASE("the IOPDDL example reads as the contest README describes") {
  const autoshard::strategy_problem p = example();
  CHECK(p.name == "example");
  REQUIRE(p.nodes.size() == 5);
  CHECK(p.nodes[2].costs == std::vector<std::int64_t>{25, 45, 35});
  CHECK(p.nodes[2].usages == std::vector<std::int64_t>{15, 20, 15});
  CHECK(p.nodes[2].live == autoshard::live_interval{50, 120});
  REQUIRE(p.edges.size() == 5);
  CHECK(p.edges[2].from == 1);
  CHECK(p.edges[2].to == 3);
  CHECK(p.usage_limit == 50);
  // The README's answer [0, 0, 2, 1, 0]: 15+55+35+75+95 node, 30+40+10+30+60 edge costs.
  CHECK(p.cost_of({0, 0, 2, 1, 0}) == 445);
  // Peak at [50, 70): nodes 0, 1, 2 live = 10 + 25 + 15.
  const autoshard::usage_peak pk = p.peak_usage(std::vector<int>{0, 0, 2, 1, 0});
  CHECK(pk.bytes == 50);
  CHECK(pk.time == 50);
  // Half-open intervals: nodes 3, 4 start at 110 while node 2 ends at 120: 15 + 10 + 15.
  CHECK(p.peak_usage(std::vector<int>{0, 0, 1, 0, 0}).bytes == 55);
}

TEST_CASE("IOPDDL round trip: write then read gives the same problem") {
  std::mt19937 rng(42);
  solve_test::random_spec spec;
  spec.p_inf = 0.1;  // "inf" extension
  for (int k = 0; k < 20; ++k) {
    autoshard::strategy_problem p = solve_test::random_problem(rng, spec);
    p.name = "random " + std::to_string(k);
    if (k % 2) p.usage_limit = 17;
    if (k % 3 == 0) p.nodes[0].name = "layer.0/attn";
    std::ostringstream out;
    autoshard::write_iopddl(out, p);
    std::istringstream in(out.str());
    CHECK(autoshard::read_iopddl(in) == p);
  }
  // Forbidden costs are written as the integers they are (the contest's 1e18, or larger).
  autoshard::strategy_problem q = example();
  q.nodes[1].costs[0] = autoshard::infinite_cost;
  q.nodes[1].costs[1] = autoshard::infinite_cost + 5;
  const nlohmann::json j = autoshard::to_iopddl_json(q);
  CHECK(j["problem"]["nodes"]["costs"][1][0].get<std::int64_t>() == 1000000000000000000);
  CHECK(autoshard::parse_iopddl(j) == q);
  // Through a file as well.
  const auto file = autoshard_test::unique_temp_path("solve_roundtrip.json");
  autoshard::write_iopddl_file(file, q);
  CHECK(autoshard::read_iopddl_file(file) == q);
  std::filesystem::remove(file);
}

TEST_CASE("malformed IOPDDL documents name the JSON path") {
  expect_io_error("{", "doc.json is not valid JSON");
  expect_io_error("[]", "doc.json: the document is [], not an object");
  expect_io_error(R"({"problem":{}})", "doc.json: problem has no member \"nodes\"");
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],[2]],"usages":[[0],[0]]}}})",
                  "doc.json: problem has no member \"edges\"");
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],"two"],"usages":[[0],[0]]},"edges":{"nodes":[],"costs":[]}}})",
                  "problem.nodes.costs[1] is \"two\", not an array");
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],[true]],"usages":[[0],[0]]},"edges":{"nodes":[],"costs":[]}}})",
                  "problem.nodes.costs[1][0] is true, not a cost");
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],[2,3]],"usages":[[0],[0]]},"edges":{"nodes":[],"costs":[]}}})",
                  "problem.nodes.usages[1] has 1 usages for 2 strategies");
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],[2]],"usages":[[0],[-4]]},"edges":{"nodes":[],"costs":[]}}})",
                  "problem.nodes.usages[1][0] is -4, not an integer in [0, ");
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],[]],"usages":[[0],[]]},"edges":{"nodes":[],"costs":[]}}})",
                  "problem.nodes.costs[1] is empty; a node needs at least one strategy");
  expect_io_error(R"({"problem":{"nodes":{"intervals":[[3,2]],"costs":[[1]],"usages":[[0]]},"edges":{"nodes":[],"costs":[]}}})",
                  "problem.nodes.intervals[0] ends before it begins: [3,2]");
  expect_io_error(R"({"problem":{"nodes":{"intervals":[[0,1.5]],"costs":[[1]],"usages":[[0]]},"edges":{"nodes":[],"costs":[]}}})",
                  "problem.nodes.intervals[0][1] is 1.5, not an integer");
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],[2,3]],"usages":[[0],[0,0]]},"edges":{"nodes":[[0,2]],"costs":[[1,2]]}}})",
                  "problem.edges.nodes[0][1] is 2, not an integer in [0, 1]");
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],[2,3]],"usages":[[0],[0,0]]},"edges":{"nodes":[[0,1]],"costs":[[1,2,3]]}}})",
                  "problem.edges.costs[0] has 3 costs for edge [0, 1], expected 1x2 = 2");
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],[2,3]],"usages":[[0],[0,0]]},"edges":{"nodes":[[0,1]],"costs":[]}}})",
                  "problem.edges has 1 node pairs but 0 cost lists");
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],[2]],"usages":[[0],[0]]},"edges":{"nodes":[],"costs":[]},"usage_limit":"lots"}})",
                  "problem.usage_limit is \"lots\", not an integer");
  CHECK_THROWS_WITH_AS(autoshard::read_iopddl_file("/nonexistent/x.json"),
                       doctest::Contains("cannot open IOPDDL problem '/nonexistent/x.json'"), autoshard::io_error);
  // A null usage_limit means none.
  std::istringstream ok(std::string(good_prefix) +
                        R"("costs":[[1],[2]],"usages":[[0],[0]]},"edges":{"nodes":[],"costs":[]},"usage_limit":null}})");
  CHECK_FALSE(autoshard::read_iopddl(ok).usage_limit.has_value());
}

TEST_CASE("IOPDDL members come in any order, unknown ones are skipped, a repeated one is refused") {
  const autoshard::strategy_problem want = example();
  // The contest's own files list "edges" before "nodes" (sorted keys); here every list comes
  // in another order, with unknown members at every level and big unknown subtrees (nested
  // 122 deep with brackets inside strings, 100,000 numbers long) skipped without being stored.
  std::string deep;
  for (int i = 0; i < 60; ++i) deep += R"({"k":[")" + std::string(i % 7, ']') + R"(",)";
  deep += "1";
  for (int i = 0; i < 60; ++i) deep += "]}";
  std::string wide = "[";
  for (int i = 0; i < 100000; ++i) wide += (i ? "," : "") + std::to_string(i);
  wide += "]";
  const std::string text = R"({"meta":{"x":[1,2,{"y":null}]},"problem":{"usage_limit":50,"unknown":)" + deep +
                           R"(,"edges":{"costs":[[30,40],[50,10,40],[90,10,20,80],[60,20,30],[70,60]],)"
                           R"("extra":)" + wide + R"(,"nodes":[[0,1],[0,2],[1,3],[2,4],[3,4]]},"name":"example",)"
                           R"("nodes":{"usages":[[10],[25,25],[15,20,15],[10,10],[15]],"names":null,)"
                           R"("costs":[[15],[55,65],[25,45,35],[85,75],[95]],"odd":true,)"
                           R"("intervals":[[30,70],[40,70],[50,120],[110,140],[110,150]]}},"more":[]})";
  CHECK(read_both(text) == want);
  // A member named twice is refused (nlohmann's tree kept the last without a word), at any
  // depth, with the object's path, the member and where the second one ends.
  const std::string twice = R"({"problem":{"usage_limit":7,"name":"a",)"
                            R"("nodes":{"intervals":[[0,1]],"costs":[[9]],"usages":[[9]]},"edges":{"nodes":[],"costs":[]},)"
                            R"("nodes":{"intervals":[[0,2]],"costs":[[1]],"usages":[[3]]}}})";
  std::istringstream twice_in(twice);
  CHECK_THROWS_WITH_AS(autoshard::read_iopddl(twice_in, "doc.json"),
                       "io error: doc.json: problem has the member 'nodes' twice (the second ends at line 1, column 137); an "
                       "object names each member once: remove one of them",
                       autoshard::io_error);
  std::istringstream inner(R"({"problem":{"nodes":{"intervals":[[0,1]],"costs":[[1]],"costs":[[2]],"usages":[[3]]}}})");
  CHECK_THROWS_WITH_AS(autoshard::read_iopddl(inner, "doc.json"), doctest::Contains("problem.nodes has the member 'costs' twice"),
                       autoshard::io_error);
  // Each is checked as it is read: an edge to node 5 after two nodes is refused before the
  // second "edges" is seen; a tree parsed without the check keeps only the last.
  const std::string early = R"({"problem":{"nodes":{"intervals":[[0,1],[0,1]],"costs":[[1],[2]],"usages":[[1],[1]]},)"
                            R"("edges":{"nodes":[[5,6]],"costs":[[1]]},"edges":{"nodes":[[1,0]],"costs":[[3]]}}})";
  std::istringstream in(early);
  CHECK_THROWS_WITH_AS(autoshard::read_iopddl(in), doctest::Contains("problem.edges.nodes[0][0] is 5, not an integer in [0, 1]"),
                       autoshard::io_error);
  CHECK(autoshard::parse_iopddl(nlohmann::json::parse(early)).edges.size() == 1);
}

TEST_CASE("IOPDDL costs and integers: what is accepted, as what") {
  // Integral floats are integers; 1e18 or more (beyond int64 and beyond uint64 too), "inf" and
  // "Infinity" forbid the choice; a value between 1e18 and 2^63 - 1 is kept as written.
  const autoshard::strategy_problem p = read_both(
      R"({"problem":{"nodes":{"intervals":[[0,2.0]],"costs":[[3.0,1e18,9223372036854775808,18446744073709551616,)"
      R"("inf","Infinity",1000000000000000005,-0,1e30]],"usages":[[1,2,3,4,5,6,7,8.0,9]]},)"
      R"("edges":{"nodes":[[0,0.0]],"costs":[[0,1,2,3,4,5,6,7,8,"inf",10,11,12,13,14,15,16,17,18,19,20,21,22,23,)"
      R"(24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,48,49,50,51,52,53,54,55,56,57,)"
      R"(58,59,60,61,62,63,64,65,66,67,68,69,70,71,72,73,74,75,76,77,78,79,80]]},"usage_limit":2.0}})");
  const std::int64_t inf = autoshard::infinite_cost;
  CHECK(p.nodes[0].costs == std::vector<std::int64_t>{3, inf, inf, inf, inf, inf, 1000000000000000005, 0, inf});
  CHECK(p.nodes[0].usages[7] == 8);
  CHECK(p.nodes[0].live == autoshard::live_interval{0, 2});
  CHECK(p.edges[0].costs[9] == inf);
  CHECK(p.usage_limit == 2);
}

TEST_CASE("malformed IOPDDL documents: every check names the path and the numbers") {
  // The document and its members.
  expect_io_error("5", "doc.json: the document is 5, not an object");
  expect_io_error(R"({"x":1})", "doc.json: the document has no member \"problem\"");
  expect_io_error(R"({"problem":[1,2]})", "doc.json: problem is [1,2], not an object");
  expect_io_error(R"({"problem":{"nodes":null}})", "doc.json: problem.nodes is null, not an object");
  expect_io_error(R"({"problem":{"name":5}})", "doc.json: problem.name is 5, not a string");
  expect_io_error(R"({"problem":{"nodes":{"costs":[],"usages":[]}}})", "doc.json: problem.nodes has no member \"intervals\"");
  expect_io_error(R"({"problem":{"nodes":{"intervals":[],"usages":[]}}})", "doc.json: problem.nodes has no member \"costs\"");
  expect_io_error(R"({"problem":{"nodes":{"intervals":[],"costs":[]}}})", "doc.json: problem.nodes has no member \"usages\"");
  expect_io_error(R"({"problem":{"edges":{"costs":[]}}})", "doc.json: problem.edges has no member \"nodes\"");
  expect_io_error(R"({"problem":{"edges":{"nodes":[]}}})", "doc.json: problem.edges has no member \"costs\"");
  expect_io_error(R"({"problem":{"nodes":{"intervals":{}}}})", "doc.json: problem.nodes.intervals is {}, not an array");
  // Nodes.
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],[2]],"usages":[[0]]},"edges":{"nodes":[],"costs":[]}}})",
                  "doc.json: problem.nodes has 2 intervals, 2 costs and 1 usages; all three must match");
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],[2]],"usages":[[0],[0]],"names":["a"]},"edges":{"nodes":[],"costs":[]}}})",
                  "doc.json: problem.nodes.names has 1 names for 2 nodes");
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],[2]],"usages":[[0],[0]],"names":["a",3]},"edges":{"nodes":[],"costs":[]}}})",
                  "doc.json: problem.nodes.names[1] is 3, not a string");
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],[2]],"usages":[[0],[0]],"names":7},"edges":{"nodes":[],"costs":[]}}})",
                  "doc.json: problem.nodes.names is 7, not an array");
  expect_io_error(R"({"problem":{"nodes":{"intervals":[[0]]}}})", "doc.json: problem.nodes.intervals[0] is [0], not [begin, end]");
  expect_io_error(R"({"problem":{"nodes":{"intervals":[[0,1,[2]]]}}})",
                  "doc.json: problem.nodes.intervals[0] is [0,1,[2]], not [begin, end]");
  expect_io_error(R"({"problem":{"nodes":{"intervals":[5]}}})", "doc.json: problem.nodes.intervals[0] is 5, not [begin, end]");
  expect_io_error(R"({"problem":{"nodes":{"intervals":[[0,{"a":1}]]}}})",
                  "doc.json: problem.nodes.intervals[0][1] is {\"a\":1}, not an integer in [0, 9223372036854775807]");
  expect_io_error(R"({"problem":{"nodes":{"usages":[[9.3e18]]}}})",
                  "doc.json: problem.nodes.usages[0][0] is 9.3e+18, not an integer in [0, 9223372036854775807]");
  expect_io_error(R"({"problem":{"nodes":{"costs":[[-1]]}}})", "doc.json: problem.nodes.costs[0][0] is -1, not a cost");
  expect_io_error(R"({"problem":{"nodes":{"costs":[[2.5]]}}})", "doc.json: problem.nodes.costs[0][0] is 2.5, not a cost");
  expect_io_error(R"({"problem":{"nodes":{"costs":[["lots"]]}}})", "doc.json: problem.nodes.costs[0][0] is \"lots\", not a cost");
  // Edges, with the nodes read first (checked as they come) and after them (checked at the end).
  expect_io_error(edges_first(R"({"nodes":[[0,2]],"costs":[[1,2]]})"),
                  "doc.json: problem.edges.nodes[0][1] is 2, not an integer in [0, 1]");
  expect_io_error(edges_first(R"({"nodes":[[0,-1]],"costs":[[1,2]]})"),
                  "doc.json: problem.edges.nodes[0][1] is -1, not a node index (a non-negative integer)");
  expect_io_error(edges_first(R"({"nodes":[[0,1]],"costs":[[1,2,3]]})"),
                  "doc.json: problem.edges.costs[0] has 3 costs for edge [0, 1], expected 1x2 = 2");
  expect_io_error(edges_first(R"({"nodes":[[0,1],[1,1]],"costs":[[1,2]]})"),
                  "doc.json: problem.edges has 2 node pairs but 1 cost lists");
  expect_io_error(edges_first(R"({"nodes":[[0]],"costs":[]})"), "doc.json: problem.edges.nodes[0] is [0], not [from, to]");
  expect_io_error(edges_first(R"({"nodes":[[0,1,1]],"costs":[]})"), "doc.json: problem.edges.nodes[0] is [0,1,1], not [from, to]");
  expect_io_error(R"({"problem":{"nodes":{"intervals":[],"costs":[],"usages":[]},"edges":{"nodes":[[0,0]],"costs":[[]]}}})",
                  "doc.json: problem.edges.nodes[0] names a node, but the problem has none");
  expect_io_error(R"({"problem":{"edges":{"nodes":[[0,0]],"costs":[[]]},"nodes":{"intervals":[],"costs":[],"usages":[]}}})",
                  "doc.json: problem.edges.nodes[0] names a node, but the problem has none");
  expect_io_error(R"({"problem":{"usage_limit":-1}})", "doc.json: problem.usage_limit is -1, not an integer in [0, ");
  // A wrong value's excerpt is cut at 60 characters, read no further than that.
  expect_io_error(R"({"problem":{"nodes":[)" + std::string(100000, '[') + "1",
                  "doc.json: problem.nodes is " + std::string(57, '[') + "..., not an object");
  expect_io_error(R"({"problem":{"nodes":{"costs":[[[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24]]]}}})",
                  "doc.json: problem.nodes.costs[0][0] is [0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,..., not a cost");
  // Syntax: the source and the byte; a gzip file says so.
  expect_io_error(R"({"problem":{"nodes":x})", "doc.json is not valid JSON at byte 21: ");
  expect_io_error(R"({"problem":{"usage_limit":1e999}})", "doc.json is not valid JSON at byte 31: ");
  expect_io_error(std::string("\x1f\x8b\x08\x00", 4), "doc.json is gzip-compressed, not JSON");
  // parse_iopddl, fed a tree, is the same reader: the same messages.
  CHECK_THROWS_WITH_AS(autoshard::parse_iopddl(nlohmann::json::parse(edges_first(R"({"nodes":[[0,1]],"costs":[[1,2,3]]})")), "t"),
                       "io error: t: problem.edges.costs[0] has 3 costs for edge [0, 1], expected 1x2 = 2", autoshard::io_error);
  CHECK_THROWS_WITH_AS(autoshard::parse_iopddl(nlohmann::json::array(), "t"), "io error: t: the document is [], not an object",
                       autoshard::io_error);
}

TEST_CASE("IOPDDL nesting: the format's depth, and 128 levels inside unknown members") {
  // Inside an unknown member a text may nest as deep as every reader allows (max_json_depth,
  // the document's own levels included), and no deeper: the reader counts as it streams.
  const auto nested = [](int levels) {
    return R"({"problem":{"nodes":{"intervals":[],"costs":[],"usages":[]},"edges":{"nodes":[],"costs":[]},"x":)" +
           std::string(static_cast<std::size_t>(levels), '[') + std::string(static_cast<std::size_t>(levels), ']') + "}}";
  };
  CHECK(read_both(nested(autoshard::max_json_depth - 2)).nodes.empty());
  expect_io_error(nested(autoshard::max_json_depth - 1),
                  "doc.json: nested deeper than 128 levels (arrays and objects) at problem.x[0][0][0]");
  // Bombs 100,000 deep: refused as soon as the depth or the excerpt is known, without recursion
  // (the unit tests run on an 8 MiB stack, the fuzzer on 512 KiB).
  expect_io_error(std::string(100000, '[') + std::string(100000, ']'), "doc.json: the document is [[[[[[[[");
  std::string objects;
  for (int i = 0; i < 100000; ++i) objects += R"({"a":)";
  expect_io_error(objects + "1" + std::string(100000, '}'), "doc.json: nested deeper than 128 levels (arrays and objects) at a.a.a.a");
  // A tree built in memory may nest deeper than any text: parse_iopddl walks it without recursion.
  nlohmann::json deep = nlohmann::json::array();
  for (int i = 0; i < 20000; ++i) {  // moved, never copied: nlohmann's copy recurses
    nlohmann::json outer = nlohmann::json::array();
    outer.push_back(std::move(deep));
    deep = std::move(outer);
  }
  nlohmann::json doc;
  doc["problem"]["x"] = std::move(deep);
  CHECK_THROWS_WITH_AS(autoshard::parse_iopddl(doc, "t"),
                       doctest::Contains("io error: t: nested deeper than 128 levels (arrays and objects) at problem.x[0][0]"),
                       autoshard::io_error);
}

TEST_CASE("IOPDDL files: read as they stream, a gzip file and a syntax error refused with the file named") {
  const autoshard_test::scratch_dir d;
  // A gzip file is refused as every JSON reader refuses it.
  const unsigned char gz[] = {0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03};
  std::ofstream(d / "p.json.gz", std::ios::binary).write(reinterpret_cast<const char*>(gz), sizeof gz);
  CHECK_THROWS_WITH_AS(autoshard::read_iopddl_file(d / "p.json.gz"),
                       ("io error: IOPDDL problem '" + (d / "p.json.gz").string() +
                        "' is gzip-compressed, not JSON: decompress it first (gunzip -k FILE, or zcat FILE > FILE.json)")
                           .c_str(),
                       autoshard::io_error);
  // A syntax error names the file and the byte.
  std::ofstream(d / "cut.json") << R"({"problem":{"nodes":)";
  CHECK_THROWS_WITH_AS(autoshard::read_iopddl_file(d / "cut.json"),
                       doctest::Contains(("IOPDDL problem '" + (d / "cut.json").string() + "' is not valid JSON at byte 21: ").c_str()),
                       autoshard::io_error);
  CHECK_THROWS_WITH_AS(autoshard::read_iopddl_file(d.path), doctest::Contains("is a directory, not a file"), autoshard::io_error);
}

TEST_CASE("IOPDDL example.json: the streamed read equals the tree's, and the text written is dump()'s") {
  const std::string file = AUTOSHARD_TEST_DATA_DIR "/solve/example.json";
  const autoshard::strategy_problem p = example();
  CHECK(autoshard::parse_iopddl(autoshard::load_json_file(file)) == p);
  std::ostringstream out;
  autoshard::write_iopddl(out, p);
  CHECK(nlohmann::json::parse(out.str()).dump() + "\n" == out.str());  // compact, members sorted
  CHECK(out.str().rfind(R"({"problem":{"edges":{"costs":[[30,40],)", 0) == 0);
  // Names only when some node has one; a text longer than the writer's 64 KiB pieces.
  autoshard::strategy_problem big = p;
  big.nodes[3].name = "layer.3/\"mlp\"";
  for (int k = 0; k < 12; ++k) {
    const std::vector<autoshard::strategy_edge> copy = big.edges;
    big.edges.insert(big.edges.end(), copy.begin(), copy.end());
  }
  for (auto& e : big.edges) e.costs[0] = 1000000000000000000;
  std::ostringstream big_out;
  autoshard::write_iopddl(big_out, big);
  CHECK(big_out.str().size() > (std::size_t{1} << 16));
  CHECK(nlohmann::json::parse(big_out.str()).dump() + "\n" == big_out.str());
  CHECK(read_both(big_out.str()) == big);
  CHECK(autoshard::to_iopddl_json(big) == nlohmann::json::parse(big_out.str()));
}

TEST_CASE("validate and cost_of reject malformed problems and choices") {
  autoshard::strategy_problem p = example();
  CHECK_THROWS_WITH_AS(p.cost_of({0, 0, 3, 0, 0}), doctest::Contains("node 2: strategy 3 out of range [0, 3)"),
                       autoshard::solver_error);
  CHECK_THROWS_WITH_AS(p.cost_of({0, 0}), doctest::Contains("2 entries for 5 nodes"), autoshard::solver_error);
  p.nodes[1].usages.push_back(3);
  CHECK_THROWS_WITH_AS(p.validate(), doctest::Contains("node 1 has 2 costs but 3 usages"), autoshard::solver_error);
  p = example();
  p.edges[4].to = 9;
  CHECK_THROWS_WITH_AS(p.validate(), doctest::Contains("edge 4 [3, 9] names a node beyond the 5 nodes"),
                       autoshard::solver_error);
  p = example();
  p.nodes[0].costs[0] = -1;
  CHECK_THROWS_WITH_AS(p.validate(), doctest::Contains("node 0 strategy 0 has negative cost -1"),
                       autoshard::solver_error);
  // A node's name comes from the file: escaped and quoted, never raw control bytes.
  p.nodes[0].name = "a\x1b[31mb\nc";
  CHECK_THROWS_WITH_AS(p.validate(), doctest::Contains("node 0 'a\\x1B[31mb\\x0Ac' strategy 0 has negative cost -1"),
                       autoshard::solver_error);
}

TEST_CASE("evaluate is the contest's Evaluate: forbidden picks, the limit at every time point, exact totals") {
  autoshard::strategy_problem p = example();
  const std::vector<int> answer{0, 0, 2, 1, 0};
  autoshard::evaluation ev = p.evaluate(answer);
  CHECK(ev.feasible);
  CHECK(ev.objective == 445);
  CHECK(ev.peak.bytes == 50);
  // Over the limit: [0, 0, 1, 0, 0] reaches 55 at time 50 (nodes 0, 1, 2 live: 10 + 25 + 20).
  ev = p.evaluate(std::vector<int>{0, 0, 1, 0, 0});
  CHECK_FALSE(ev.feasible);
  CHECK(ev.why == "summed usage 55 at time 50 exceeds usage_limit 50");
  // A node cost of 1e18 is a forbidden pick, not a term; so is an edge entry above it.
  p.nodes[2].costs[2] = autoshard::infinite_cost;
  ev = p.evaluate(answer);
  CHECK_FALSE(ev.feasible);
  CHECK(ev.why == "node 2 strategy 2 is forbidden (cost 1000000000000000000 >= 1e18)");
  p = example();
  p.edges[2].costs[1] = autoshard::infinite_cost + 1;  // edge [1, 3]: node 1 at 0, node 3 at 1
  ev = p.evaluate(answer);
  CHECK_FALSE(ev.feasible);
  CHECK(ev.why.find("edge 2 [1, 3] pair (0, 1) is forbidden") == 0);
  // Finite costs whose total reaches 1e18 (int64 sums would overflow past 2^63): infeasible.
  p = example();
  for (auto& n : p.nodes)
    for (auto& c : n.costs) c = infinite_cost_minus_one();
  ev = p.evaluate(answer);
  CHECK_FALSE(ev.feasible);
  CHECK(ev.why == "the total cost 5000000000000000165 reaches the contest's infinity 1e18");
  CHECK(p.cost_of(answer) == autoshard::infinite_cost);
}

TEST_CASE("solution files: the contest's list of indices, written then read, and clear errors") {
  const autoshard::strategy_problem p = example();
  const auto file = autoshard_test::unique_temp_path("solve_solution.json");
  autoshard::write_iopddl_solution_file(file, {0, 0, 2, 1, 0});
  CHECK(autoshard::read_iopddl_solution_file(file, p) == std::vector<int>{0, 0, 2, 1, 0});
  CHECK_THROWS_WITH_AS(autoshard::parse_iopddl_solution(nlohmann::json::parse("[0, 0, 3, 1, 0]"), p, "s.json"),
                       doctest::Contains("s.json: [2] is 3, not a strategy index in [0, 3) of node 2"),
                       autoshard::io_error);
  CHECK_THROWS_WITH_AS(autoshard::parse_iopddl_solution(nlohmann::json::parse("[0, 0]"), p, "s.json"),
                       doctest::Contains("2 strategy indices for 5 nodes"), autoshard::io_error);
  CHECK_THROWS_WITH_AS(autoshard::parse_iopddl_solution(nlohmann::json::parse("[0, 0, 18446744073709551615, 1, 0]"), p),
                       doctest::Contains("not a strategy index"), autoshard::io_error);
  // A file too long for the problem is refused from its size, before any tree of it is built;
  // a list within it longer than the nodes by the tree's count.
  {
    std::ofstream(file) << "[" << std::string(autoshard::iopddl_solution_max_bytes(5), ' ') << "0]";
  }
  CHECK_THROWS_WITH_AS(autoshard::read_iopddl_solution_file(file, p),
                       doctest::Contains("but a solution of the problem's 5 nodes, one strategy index each, has at most 1048896 bytes"),
                       autoshard::io_error);
  {
    std::ofstream(file) << "[0, 0, 2, 1, 0, 0]";
  }
  CHECK_THROWS_WITH_AS(autoshard::read_iopddl_solution_file(file, p),
                       doctest::Contains("has 6 strategy indices for 5 nodes"), autoshard::io_error);
  {
    std::ofstream(file) << "[0, [0], 2, 1, 0]";
  }
  CHECK_THROWS_WITH_AS(autoshard::read_iopddl_solution_file(file, p), doctest::Contains("[1]"), autoshard::io_error);
  std::filesystem::remove(file);
}
