// libFuzzer target: the IOPDDL problem reader (solve/iopddl.hpp). Input: a problem file.
// The reader is fed three ways, which must agree:
//   1. read_iopddl_file on the bytes written to a file (tmpfs): what `autoshard solve` reads,
//      the streaming SAX reader on a file descriptor;
//   2. read_iopddl on a stream of the same bytes, named as the file is: the same result, or
//      the same io_error word for word;
//   3. parse_iopddl on the document parse_json_text gives (members in sorted order, duplicate
//      members collapsed to the last): whatever the text reads to, the document reads to too,
//      and when the text names no member twice (so only the members' order differs) a
//      document that reads means the text reads.
// Only io_error may escape the readers, only solver_error validate(). A valid problem must
// write back and read to an equal problem, the text written must be to_iopddl_json's dump,
// and its usage peaks, costs and the contest's evaluation must be computable. An input that is
// a JSON array is also read as a solution of a fixed 3-node problem (parse_iopddl_solution).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <autoshard/solve/iopddl.hpp>

#include "scratch.hpp"
#include "target.hpp"

namespace autoshard_fuzz::iopddl_target {
namespace fs = std::filesystem;

const fs::path& scratch_file() {
  static const fs::path file = autoshard_fuzz::scratch_path("autoshard-fuzz-iopddl-", ".json");
  return file;
}

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_iopddl: %s\n%s\n", what, detail.c_str());
  std::abort();
}

/// A read: the problem, or the io_error's message.
struct outcome {
  std::optional<autoshard::strategy_problem> problem;
  std::string error;
};

template <class Read>
outcome attempt(Read&& read) {
  outcome o;
  try {
    o.problem = read();
  } catch (const autoshard::io_error& e) {
    o.error = e.what();
  }
  return o;
}

/// Whether some object of a JSON text names a member twice (the text parses: depth <= 128).
struct duplicate_finder {
  std::vector<std::set<std::string>> keys;
  bool found = false;
  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(std::int64_t) { return true; }
  bool number_unsigned(std::uint64_t) { return true; }
  bool number_float(double, const std::string&) { return true; }
  bool string(std::string&) { return true; }
  bool binary(nlohmann::json::binary_t&) { return true; }
  bool start_object(std::size_t) {
    keys.emplace_back();
    return true;
  }
  bool key(std::string& k) {
    if (!keys.back().insert(k).second) found = true;
    return true;
  }
  bool end_object() {
    keys.pop_back();
    return true;
  }
  bool start_array(std::size_t) { return true; }
  bool end_array() { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::json::exception&) { return false; }
};

bool names_a_member_twice(const std::string& text) {
  duplicate_finder d;
  nlohmann::json::sax_parse(text, &d);
  return d.found;
}

const autoshard::strategy_problem& three_nodes() {
  static const autoshard::strategy_problem p = [] {
    autoshard::strategy_problem q;
    q.nodes = {{"a", {1}, {1}, {0, 2}}, {"", {1, 2}, {1, 2}, {1, 3}}, {"c", {1, 2, 3}, {3, 2, 1}, {2, 4}}};
    q.edges = {{0, 1, {1, 2}}};
    return q;
  }();
  return p;
}

int one_input(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const fs::path& file = scratch_file();
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
  }
  const std::string source = "IOPDDL problem '" + file.string() + "'";

  // 1 and 2: the file and the stream read alike.
  const outcome from_file = attempt([&] { return autoshard::read_iopddl_file(file); });
  {
    std::error_code ec;
    fs::remove(file, ec);  // nothing is left behind, however the run ends
  }
  const outcome from_stream = attempt([&] {
    std::istringstream in(text);
    return autoshard::read_iopddl(in, source);
  });
  if (from_file.problem.has_value() != from_stream.problem.has_value() || from_file.error != from_stream.error ||
      (from_file.problem && !(*from_file.problem == *from_stream.problem)))
    fail("the file and the stream read differently", "file: " + from_file.error + "\nstream: " + from_stream.error);

  // 3: the parsed document reads as the text does.
  std::optional<nlohmann::json> doc;
  try {
    doc = autoshard::parse_json_text(text, source);
  } catch (const autoshard::io_error&) {
  }
  if (!doc) {
    if (from_file.problem) fail("the text reads as a problem but is not JSON for parse_json_text", "");
  } else {
    const outcome from_doc = attempt([&] { return autoshard::parse_iopddl(*doc, source); });
    if (from_file.problem && (!from_doc.problem || !(*from_doc.problem == *from_file.problem)))
      fail("the text reads but its document reads differently", from_doc.error);
    if (from_doc.problem && !from_file.problem && !names_a_member_twice(text))
      fail("the document reads, the text (no member named twice) does not", from_file.error);
    if (doc->is_array()) {
      try {
        const std::vector<int> choice = autoshard::parse_iopddl_solution(*doc, three_nodes(), "solution");
        (void)three_nodes().evaluate(choice);  // a solution that reads is well-formed
      } catch (const autoshard::io_error&) {
      }
    }
  }
  if (!from_file.problem) return 0;

  const autoshard::strategy_problem& p = *from_file.problem;
  try {
    p.validate();
  } catch (const autoshard::solver_error&) {
    return 0;
  }
  std::ostringstream out;
  autoshard::write_iopddl(out, p);
  if (autoshard::to_iopddl_json(p).dump() + "\n" != out.str()) fail("write_iopddl is not to_iopddl_json's dump", out.str());
  std::istringstream again(out.str());
  autoshard::strategy_problem q;
  try {
    q = autoshard::read_iopddl(again, "written");
  } catch (const autoshard::error& e) {
    fail("written problem does not read back", std::string(e.what()) + "\n" + out.str());
  }
  if (!(p == q)) fail("round trip changed the problem", out.str());
  try {
    (void)p.min_peak_usage();
    (void)p.check_costs_can_be_finite();
  } catch (const autoshard::solver_error&) {
  }
  try {
    std::vector<int> first(p.nodes.size(), 0), last(p.nodes.size());
    for (std::size_t v = 0; v < p.nodes.size(); ++v) last[v] = static_cast<int>(p.nodes[v].costs.size()) - 1;
    for (const std::vector<int>& choice : {first, last}) {
      (void)p.peak_usage(choice);
      (void)p.cost_of(choice);
      (void)p.evaluate(choice);
    }
  } catch (const autoshard::solver_error&) {
  }
  return 0;
}

}  // namespace autoshard_fuzz::iopddl_target

AUTOSHARD_FUZZ_TARGET(iopddl)
