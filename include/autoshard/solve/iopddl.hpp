#pragma once
/// Read and write the ASPLOS 2025 IOPDDL contest format (google/iopddl):
///   {"problem": {"name": "example",
///                "nodes": {"intervals": [[30, 70], ...], "costs": [[15], ...], "usages": [[10], ...]},
///                "edges": {"nodes": [[0, 1], ...], "costs": [[30, 40], ...]},
///                "usage_limit": 50}}
/// Edge costs are the row-major |S_from| x |S_to| matrix. Intervals are half-open. Costs and
/// usages are int64 as in the contest; a cost >= 1e18 (the contest's infinity) forbids a choice,
/// and so does any larger integer. Two extensions, both optional and ignored by contest tools:
/// "nodes": {"names": [...]}, and the string "inf" for a forbidden cost (read as 1e18). A
/// missing or null usage_limit means none. Members may come in any order; unknown ones are
/// skipped. Solutions are the contest's list of strategy indices.
///   auto p = autoshard::read_iopddl_file("example.json");
///   autoshard::write_iopddl_file("copy.json", p);
///   std::vector<int> s = autoshard::read_iopddl_solution_file("answer.json", p);   // [0, 0, 2, 1, 0]
///   autoshard::write_iopddl_solution_file("answer.json", s);
/// Malformed input throws io_error naming the JSON path, e.g. "problem.edges.costs[2]".
///
/// The contest's requests reach 1.3 GB of JSON, so a problem is read as a stream (nlohmann's
/// SAX parser) straight into its vectors: neither the text nor a JSON tree is held, and the
/// reading stops with a resource_error before the most the rest can take (iopddl_bytes_per_byte
/// a byte of text) may not fit what is left (sax_parse_json). Writing streams the text out the
/// same way.
#include <array>        // std::array
#include <charconv>     // std::to_chars
#include <cmath>        // std::trunc
#include <cstdint>      // std::int64_t
#include <deque>        // std::deque
#include <filesystem>   // std::filesystem::path
#include <istream>      // std::istream
#include <limits>       // std::numeric_limits
#include <optional>     // std::optional
#include <ostream>      // std::ostream
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <system_error>  // std::error_code
#include <utility>      // std::move
#include <vector>       // std::vector

#include <nlohmann/json.hpp>  // nlohmann::json

#include "../core/error.hpp"       // io_error, solver_error
#include "../io/atomic_file.hpp"   // write_file_atomically
#include "../io/json.hpp"          // sax_parse_json, json_in, load_json_file
#include "problem.hpp"             // strategy_problem

namespace autoshard {

/// The most memory reading an IOPDDL text keeps, per byte of text: the bound a file is checked
/// against before it is read. The worst text is many one-strategy nodes, each written in the
/// fewest bytes: `[0,0],` in intervals, `[0],` in costs and `[0],` in usages, 14 bytes. While
/// the three lists are read (in any order, so none can go straight into its node) each is a
/// column: 16 bytes of interval, and a 24-byte vector header plus a 32-byte malloc chunk for
/// the one cost and again for the one usage (glibc's smallest chunk; deque blocks add 2-3%):
/// about 130 bytes. When the document ends the nodes are built (96 bytes each, allocated at
/// once) while the columns still hold what is moved into them: about 226 bytes for 14 bytes of
/// text, 16.2 a byte. Everything else stores less per byte: an edge's `[0,0],` and `[0],` (10
/// bytes) about 113 bytes, a name's `"",` (3 bytes) a 32-byte string, a long array of one-digit
/// costs (`0,`, 2 bytes for 8 stored) at most 24 bytes a cost while its array grows (12 a
/// byte), a list of `[],` 24 bytes for 3. nlohmann's lexer keeps the text since the last number
/// or string (for its messages), up to 3 bytes a byte of a stretch of brackets, commas,
/// literals and blanks, which store little. tests/unit/solve_memory measures the shapes: 16.2
/// for the worst, 11.4 for one-strategy edges, 14.3 for usages alone.
inline constexpr std::uint64_t iopddl_bytes_per_byte = 17;

namespace detail::iopddl {

constexpr std::int64_t int64_max = std::numeric_limits<std::int64_t>::max();

/// What the value at some place of the document must be.
enum class slot : unsigned char {
  document, problem, nodes, edges,                       // objects
  intervals, node_costs, usages, names, pairs, edge_costs,  // the lists, one entry per node or edge
  interval, pair, node_cost_list, edge_cost_list, usage_list,  // the entries that are arrays
  bound, cost, usage, name, problem_name, usage_limit,   // numbers and strings
  skip,                                                  // inside an unknown member: not stored
};
static_assert(static_cast<unsigned>(slot::skip) < 32, "a slot is a bit of reader::seen_");

/// The members the format knows: the object they are in, their key, what their value is, and
/// whether that object must have them (absences are reported in this order).
struct member {
  slot object;
  std::string_view key;
  slot value;
  bool required;
};
inline constexpr member members[] = {
    {slot::document, "problem", slot::problem, true},
    {slot::problem, "nodes", slot::nodes, true},
    {slot::problem, "edges", slot::edges, true},
    {slot::problem, "name", slot::problem_name, false},
    {slot::problem, "usage_limit", slot::usage_limit, false},
    {slot::nodes, "intervals", slot::intervals, true},
    {slot::nodes, "costs", slot::node_costs, true},
    {slot::nodes, "usages", slot::usages, true},
    {slot::nodes, "names", slot::names, false},
    {slot::edges, "nodes", slot::pairs, true},
    {slot::edges, "costs", slot::edge_costs, true},
};

/// What a message says a value at `s` should have been.
inline const char* expected(slot s) {
  switch (s) {
    case slot::document:
    case slot::problem:
    case slot::nodes:
    case slot::edges:
      return "an object";
    case slot::interval:
      return "[begin, end]";
    case slot::pair:
      return "[from, to]";
    case slot::cost:
      return "a cost (a non-negative integer; 1e18 or more, or \"inf\", forbids the choice)";
    case slot::bound:
    case slot::usage:
    case slot::usage_limit:
      return "an integer in [0, 9223372036854775807]";
    case slot::name:
    case slot::problem_name:
      return "a string";
    default:
      return "an array";
  }
}

/// The SAX handler that reads an IOPDDL document into a strategy_problem: one implementation of
/// the format's rules, fed by a text (read_iopddl, read_iopddl_file) or by a parsed document
/// (parse_iopddl). Each value is checked where it is read; what needs two members (the counts
/// of the node lists, edge endpoints against the node count, an edge's costs against its
/// nodes' strategies) is checked by finish(), as members may come in any order. The lists are
/// kept as columns until then (see iopddl_bytes_per_byte). Members named twice: the last wins,
/// but each is checked as it is read, an edge's ends against the nodes' costs read so far, so
/// `"edges": {"nodes": [[5, 6]]}` after two nodes is refused even when a later "nodes" or
/// "edges" would replace them (parse_iopddl of a tree sees only the last; fuzz_iopddl allows
/// the two to differ only for a text that names a member twice).
class reader {
 public:
  explicit reader(std::string source) : source_(std::move(source)) { frames_.push_back({slot::skip, slot::document, false, 0, {}}); }

  // nlohmann's SAX interface. Every error throws; a handler that returned false would leave
  // the caller to guess why.
  bool null() { return scalar(nlohmann::json(nullptr)); }
  bool boolean(bool b) { return scalar(nlohmann::json(b)); }
  bool number_integer(std::int64_t i) { return scalar(nlohmann::json(i)); }
  bool number_float(double d, const std::string& /*text*/) { return scalar(nlohmann::json(d)); }
  bool binary(nlohmann::json::binary_t& b) { return scalar(nlohmann::json(b)); }
  /// The common value by far (every cost and usage): stored without a detour.
  bool number_unsigned(std::uint64_t u) {
    frame& f = frames_.back();
    const bool fits = u <= static_cast<std::uint64_t>(int64_max);
    if (!capturing() && f.element == slot::cost) return stored(f, fits ? static_cast<std::int64_t>(u) : infinite_cost);
    if (!capturing() && f.element == slot::usage && fits) return stored(f, static_cast<std::int64_t>(u));
    return scalar(nlohmann::json(u));
  }
  bool string(std::string& s) {
    frame& f = frames_.back();
    if (capturing()) return scalar(cut(s));
    switch (f.element) {
      case slot::skip:
        break;
      case slot::name:
        names_.push_back(s);
        break;
      case slot::problem_name:
        name_ = s;
        break;
      case slot::cost:
        if (s == "inf" || s == "Infinity") return stored(f, infinite_cost);
        return scalar(cut(s));
      default:
        return scalar(cut(s));  // an error: nothing else is a string
    }
    return next(f);
  }

  bool start_object(std::size_t /*size*/) {
    if (capturing()) return capture_open('{', true);
    const slot s = frames_.back().element;
    switch (s) {
      case slot::skip:
      case slot::document:
        break;
      case slot::problem:  // a member named twice: the last one counts, as in a JSON tree
        reset_nodes(), reset_edges();
        name_.clear(), usage_limit_.reset();
        forget(slot::nodes), forget(slot::edges);
        break;
      case slot::nodes:
        reset_nodes();
        break;
      case slot::edges:
        reset_edges();
        break;
      case slot::bound:
        if (frames_.back().count >= 2) return wrong_size(), capture_open('{', true);
        return begin_capture('{', true, s);
      default:
        return begin_capture('{', true, s);
    }
    seen_ |= bit(s);
    return push(s, slot::skip, true);  // a member's slot comes with its key
  }
  bool key(std::string& k) {
    if (capturing()) return capture_key(k);
    frame& f = frames_.back();
    f.key.assign(k, 0, 40);  // for a message's path only
    f.element = slot::skip;
    for (const member& m : members)
      if (m.object == f.kind && m.key == k) f.element = m.value;
    return true;
  }
  bool end_object() { return end('}'); }

  bool start_array(std::size_t /*size*/) {
    if (capturing()) return capture_open('[', false);
    frame& f = frames_.back();
    const slot s = f.element;
    slot element = slot::skip;
    switch (s) {
      case slot::skip:
        break;
      case slot::intervals:
        intervals_.clear(), element = slot::interval;
        break;
      case slot::node_costs:
        node_costs_.clear(), nodes_known_ = false, element = slot::node_cost_list;
        break;
      case slot::usages:
        usages_.clear(), element = slot::usage_list;
        break;
      case slot::names:
        names_.clear(), element = slot::name;
        break;
      case slot::pairs:
        pairs_.clear(), element = slot::pair;
        break;
      case slot::edge_costs:
        edge_costs_.clear(), element = slot::edge_cost_list;
        break;
      case slot::interval:
      case slot::pair:
        element = slot::bound;
        break;
      case slot::node_cost_list:
      case slot::edge_cost_list:
        scratch_.clear(), element = slot::cost;
        break;
      case slot::usage_list:
        scratch_.clear(), element = slot::usage;
        break;
      case slot::bound:
        if (f.count >= 2) return wrong_size(), capture_open('[', false);
        return begin_capture('[', false, s);
      default:
        return begin_capture('[', false, s);
    }
    seen_ |= bit(s);
    return push(s, element, false);
  }
  bool end_array() { return end(']'); }

  bool parse_error(std::size_t byte, const std::string& /*token*/, const nlohmann::json::exception& e) {
    throw json_syntax_error(source_, byte, e);
  }

  /// The checks that need more than one member, then the problem. Call once the document ended.
  strategy_problem finish() {
    const std::size_t n = node_costs_.size();
    if (intervals_.size() != n || usages_.size() != n)
      fail_at("problem.nodes", "has " + std::to_string(intervals_.size()) + " intervals, " + std::to_string(n) +
                                   " costs and " + std::to_string(usages_.size()) + " usages; all three must match");
    const bool named = seen(slot::names);
    if (named && names_.size() != n)
      fail_at("problem.nodes.names", "has " + std::to_string(names_.size()) + " names for " + std::to_string(n) + " nodes");
    for (std::size_t v = 0; v < n; ++v)
      if (usages_[v].size() != node_costs_[v].size())
        fail_at("problem.nodes.usages[" + std::to_string(v) + "]", "has " + std::to_string(usages_[v].size()) +
                                                                       " usages for " + std::to_string(node_costs_[v].size()) +
                                                                       " strategies");
    if (pairs_.size() != edge_costs_.size())
      fail_at("problem.edges", "has " + std::to_string(pairs_.size()) + " node pairs but " +
                                   std::to_string(edge_costs_.size()) + " cost lists");
    for (std::size_t e = 0; e < pairs_.size(); ++e) {
      const std::string at = "problem.edges.nodes[" + std::to_string(e) + "]";
      if (n == 0) fail_at(at, "names a node, but the problem has none");
      for (std::size_t side = 0; side < 2; ++side)
        if (pairs_[e][side] >= n)
          fail_at(at + "[" + std::to_string(side) + "]", "is " + std::to_string(pairs_[e][side]) +
                                                             ", not an integer in [0, " + std::to_string(n - 1) + "]");
      const std::size_t su = node_costs_[pairs_[e][0]].size(), sv = node_costs_[pairs_[e][1]].size();
      if (edge_costs_[e].size() != su * sv)
        fail_at("problem.edges.costs[" + std::to_string(e) + "]",
                "has " + std::to_string(edge_costs_[e].size()) + " costs for edge [" + std::to_string(pairs_[e][0]) + ", " +
                    std::to_string(pairs_[e][1]) + "], expected " + std::to_string(su) + "x" + std::to_string(sv) + " = " +
                    std::to_string(su * sv));
    }
    strategy_problem p;
    p.name = std::move(name_);
    p.usage_limit = usage_limit_;
    // The columns are moved into the nodes and edges front first, so each deque block is freed
    // as soon as it is used up.
    p.nodes.reserve(n);
    for (std::size_t v = 0; v < n; ++v) {
      p.nodes.push_back({named ? std::move(names_.front()) : std::string(), std::move(node_costs_.front()),
                         std::move(usages_.front()), intervals_.front()});
      if (named) names_.pop_front();
      node_costs_.pop_front(), usages_.pop_front(), intervals_.pop_front();
    }
    p.edges.reserve(pairs_.size());
    while (!pairs_.empty()) {
      p.edges.push_back({pairs_.front()[0], pairs_.front()[1], std::move(edge_costs_.front())});
      pairs_.pop_front(), edge_costs_.pop_front();
    }
    return p;
  }

 private:
  /// An open array or object (the document's own level is frames_[0]).
  struct frame {
    slot kind;          ///< what this array or object is
    slot element;       ///< what the value read next in it must be (an object's: its key's)
    bool object;
    std::size_t count;  ///< the values read so far (arrays)
    std::string key;    ///< the member being read (objects), cut to 40 characters
  };
  struct capture_level {
    bool object;
    bool comma;  ///< a value came before: the next one needs a comma
  };

  bool capturing() const noexcept { return !capture_.empty(); }

  static constexpr std::uint32_t bit(slot s) noexcept { return std::uint32_t{1} << static_cast<unsigned>(s); }
  bool seen(slot s) const noexcept { return (seen_ & bit(s)) != 0; }
  void forget(slot s) noexcept { seen_ &= ~bit(s); }

  void reset_nodes() {
    intervals_.clear(), node_costs_.clear(), usages_.clear(), names_.clear();
    forget(slot::intervals), forget(slot::node_costs), forget(slot::usages), forget(slot::names);
    nodes_known_ = false;
  }
  void reset_edges() {
    pairs_.clear(), edge_costs_.clear();
    forget(slot::pairs), forget(slot::edge_costs);
  }

  /// The path of the value read next in frames_[0, depth), as json_in spells it.
  std::string where(std::size_t depth) const {
    std::string path;
    for (std::size_t i = 1; i < depth; ++i) detail::json_path_step(path, frames_[i].object, frames_[i].key, frames_[i].count);
    return path;
  }
  std::string where() const { return where(frames_.size()); }

  [[noreturn]] void fail_at(const std::string& path, const std::string& why) const {
    throw io_error(source_ + ": " + (path.empty() ? std::string("the document") : path) + " " + why);
  }
  [[noreturn]] void fail_value(const nlohmann::json& v, slot s) const {
    fail_at(where(), "is " + detail::json_excerpt(v) + ", not " + expected(s));
  }

  /// A string value as an excerpt needs it: the first 64 bytes are all a message shows.
  static nlohmann::json cut(const std::string& s) { return nlohmann::json(s.substr(0, 64)); }

  bool next(frame& f) {
    if (!f.object) ++f.count;
    return true;
  }
  bool stored(frame& f, std::int64_t x) {
    scratch_.push_back(x);
    return next(f);
  }

  /// Every value that is not an unsigned number for a list of costs or usages.
  bool scalar(const nlohmann::json& v) {
    if (capturing()) return capture_scalar(v);
    frame& f = frames_.back();
    switch (f.element) {
      case slot::skip:
        break;
      case slot::cost:
        scratch_.push_back(cost(v));
        break;
      case slot::usage:
        scratch_.push_back(whole(v, f.element));
        break;
      case slot::bound:
        if (f.count >= 2) return wrong_size(), capture_scalar(v);
        held_[f.count] = v;
        bound_[f.count] = f.kind == slot::pair ? node_index(v) : whole(v, f.element);
        break;
      case slot::usage_limit:
        if (v.is_null()) usage_limit_.reset();
        else usage_limit_ = whole(v, f.element);
        break;
      case slot::problem_name:
        if (!v.is_null()) fail_value(v, f.element);  // a string came through string()
        name_.clear();
        break;
      case slot::names:
        if (!v.is_null()) fail_value(v, f.element);
        names_.clear(), forget(slot::names);  // null: none
        break;
      default:
        fail_value(v, f.element);
    }
    return next(f);
  }

  /// An int64 in [0, int64_max] (an integral float, 3.0, too), else `otherwise`.
  static std::int64_t whole_or(const nlohmann::json& v, std::int64_t otherwise) {
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (std::trunc(d) == d && d >= 0.0 && d < 9.2e18) return static_cast<std::int64_t>(d);
      return otherwise;
    }
    const std::optional<std::int64_t> i = json_int64(v);
    return i && *i >= 0 ? *i : otherwise;
  }
  std::int64_t whole(const nlohmann::json& v, slot s) const {
    const std::int64_t i = whole_or(v, -1);
    if (i < 0) fail_value(v, s);
    return i;
  }
  /// An edge's end: checked against the node count here when the nodes came first, else by
  /// finish().
  std::int64_t node_index(const nlohmann::json& v) const {
    if (!nodes_known_) {
      const std::int64_t i = whole_or(v, -1);
      if (i < 0) fail_at(where(), "is " + detail::json_excerpt(v) + ", not a node index (a non-negative integer)");
      return i;
    }
    const std::int64_t n = static_cast<std::int64_t>(node_costs_.size());
    if (n == 0) fail_at(where(frames_.size() - 1), "names a node, but the problem has none");
    const std::int64_t i = whole_or(v, -1);
    if (i < 0 || i >= n) fail_at(where(), "is " + detail::json_excerpt(v) + ", not an integer in [0, " + std::to_string(n - 1) + "]");
    return i;
  }
  /// A cost: a non-negative integer (an integral float too); 1e18 or more, beyond int64
  /// included, and the string "inf" (or "Infinity") forbid the choice.
  std::int64_t cost(const nlohmann::json& v) const {
    if (const std::optional<std::uint64_t> u = json_uint64(v))
      return *u > static_cast<std::uint64_t>(int64_max) ? infinite_cost : static_cast<std::int64_t>(*u);
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (d >= 0.0 && std::trunc(d) == d) return d >= 1e18 ? infinite_cost : static_cast<std::int64_t>(d);
    }
    if (v.is_string() && (v.get<std::string>() == "inf" || v.get<std::string>() == "Infinity")) return infinite_cost;
    fail_value(v, slot::cost);
  }

  bool push(slot kind, slot element, bool object) {
    if (frames_.size() - 1 >= static_cast<std::size_t>(max_json_depth)) throw json_too_deep(source_, max_json_depth, where());
    frames_.push_back({kind, element, object, 0, {}});
    return true;
  }

  bool end(char close) {
    if (capturing()) return capture_close(close);
    const frame done = std::move(frames_.back());
    frames_.pop_back();
    switch (done.kind) {
      case slot::interval:
        if (done.count != 2) short_list(done);
        if (bound_[1] < bound_[0]) fail_at(where(), "ends before it begins: [" + held_[0].dump() + "," + held_[1].dump() + "]");
        intervals_.push_back({bound_[0], bound_[1]});
        break;
      case slot::pair:
        if (done.count != 2) short_list(done);
        pairs_.push_back({static_cast<std::size_t>(bound_[0]), static_cast<std::size_t>(bound_[1])});
        break;
      case slot::node_cost_list:
        if (scratch_.empty()) fail_at(where(), "is empty; a node needs at least one strategy");
        node_costs_.emplace_back(scratch_.begin(), scratch_.end());  // exactly its size
        break;
      case slot::edge_cost_list:
        edge_costs_.emplace_back(scratch_.begin(), scratch_.end());
        break;
      case slot::usage_list:
        usages_.emplace_back(scratch_.begin(), scratch_.end());
        break;
      case slot::node_costs:
        nodes_known_ = true;
        break;
      default:
        break;
    }
    if (done.object)
      for (const member& m : members)
        if (m.object == done.kind && m.required && !seen(m.value))
          fail_at(where(), "has no member \"" + std::string(m.key) + "\"");
    return next(frames_.back());
  }

  /// An interval or a pair that closed with fewer than 2 numbers.
  [[noreturn]] void short_list(const frame& done) const {
    std::string text = "[";
    for (std::size_t i = 0; i < done.count; ++i) text += (i ? "," : "") + held_[i].dump();
    fail_at(where(), "is " + text + "], not " + expected(done.kind));
  }
  /// A third value in an interval or a pair: the excerpt goes on from its first two.
  void wrong_size() {
    begin_capture('[', false, frames_.back().kind, frames_.size() - 1);
    capture_text_ += held_[0].dump() + "," + held_[1].dump();
    capture_.back().comma = true;
  }

  // A value of the wrong kind that is an array or an object is read on until its excerpt is
  // known (60 characters, or its end), then refused as json_in refuses one: "<path> is
  // [[1],[2]], not a cost". That takes at most 61 more values, however deep or long the value.
  bool begin_capture(char open, bool object, slot s, std::size_t depth = 0) {
    capture_head_ = source_ + ": ";
    const std::string path = where(depth == 0 ? frames_.size() : depth);
    capture_head_ += (path.empty() ? std::string("the document") : path) + " is ";
    capture_expected_ = expected(s);
    capture_text_ = open;
    capture_.push_back({object, false});
    return capture_full();
  }
  bool capture_open(char open, bool object) {
    capture_comma();
    capture_text_ += open;
    capture_.push_back({object, false});
    return capture_full();
  }
  bool capture_key(const std::string& k) {
    if (capture_.back().comma) capture_text_ += ',';
    capture_text_ += cut(k).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + ":";
    capture_.back().comma = false;
    return capture_full();
  }
  bool capture_scalar(const nlohmann::json& v) {
    capture_comma();
    capture_text_ += v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    capture_.back().comma = true;
    return capture_full();
  }
  bool capture_close(char close) {
    capture_text_ += close;
    capture_.pop_back();
    if (capture_.empty()) throw io_error(capture_head_ + capture_text_ + ", not " + capture_expected_);
    capture_.back().comma = true;
    return capture_full();
  }
  void capture_comma() {
    if (!capture_.back().object && capture_.back().comma) capture_text_ += ',';
  }
  bool capture_full() const {
    if (capture_text_.size() > 60) throw io_error(capture_head_ + capture_text_.substr(0, 57) + "..., not " + capture_expected_);
    return true;
  }

  std::string source_;
  std::vector<frame> frames_;
  std::vector<std::int64_t> scratch_;  ///< the array of costs or usages being read
  std::array<nlohmann::json, 2> held_;  ///< the interval's or pair's numbers as written (messages)
  std::array<std::int64_t, 2> bound_{};
  std::vector<capture_level> capture_;
  std::string capture_text_, capture_head_, capture_expected_;

  // The columns (one entry per node or edge) and what was seen, until finish().
  std::string name_;
  std::optional<std::int64_t> usage_limit_;
  std::deque<live_interval> intervals_;
  std::deque<std::vector<std::int64_t>> node_costs_, usages_, edge_costs_;
  std::deque<std::string> names_;
  std::deque<std::array<std::size_t, 2>> pairs_;
  std::uint32_t seen_ = 0;     ///< a bit per slot: the members met (and not dropped for a later one)
  bool nodes_known_ = false;  ///< the nodes' costs were read: edge ends are checked as they come
};

/// Writes `p` as compact JSON, exactly what nlohmann's dump() of its document gives (members in
/// sorted order, numbers as integers, a trailing newline), in pieces of about 64 KiB handed to
/// `put`: no second copy of a large problem is made.
template <class Put>
void write_text(const strategy_problem& p, Put&& put) {
  p.validate();
  constexpr std::size_t piece = std::size_t{1} << 16;
  std::string buf;
  buf.reserve(piece + 64);
  const auto flush = [&] {
    if (buf.size() < piece) return;
    put(std::string_view(buf));
    buf.clear();
  };
  const auto number = [&](auto x) {
    char digits[24];
    buf.append(digits, std::to_chars(digits, digits + sizeof digits, x).ptr);
  };
  const auto numbers = [&](const std::vector<std::int64_t>& xs) {
    buf += '[';
    for (std::size_t i = 0; i < xs.size(); ++i) {
      if (i) buf += ',';
      number(xs[i]);
      flush();
    }
    buf += ']';
  };
  const auto each = [&](const auto& items, const auto& write) {
    buf += '[';
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (i) buf += ',';
      write(items[i]);
      flush();
    }
    buf += ']';
  };
  bool any_name = false;
  for (const strategy_node& n : p.nodes) any_name = any_name || !n.name.empty();
  buf += R"({"problem":{"edges":{"costs":)";
  each(p.edges, [&](const strategy_edge& e) { numbers(e.costs); });
  const auto two = [&](auto a, auto b) {
    buf += '[';
    number(a);
    buf += ',';
    number(b);
    buf += ']';
  };
  buf += R"(,"nodes":)";
  each(p.edges, [&](const strategy_edge& e) { two(e.from, e.to); });
  buf += R"(},"name":)" + nlohmann::json(p.name).dump() + R"(,"nodes":{"costs":)";
  each(p.nodes, [&](const strategy_node& n) { numbers(n.costs); });
  buf += R"(,"intervals":)";
  each(p.nodes, [&](const strategy_node& n) { two(n.live.begin, n.live.end); });
  if (any_name) {
    buf += R"(,"names":)";
    each(p.nodes, [&](const strategy_node& n) { buf += nlohmann::json(n.name).dump(); });
  }
  buf += R"(,"usages":)";
  each(p.nodes, [&](const strategy_node& n) { numbers(n.usages); });
  buf += '}';
  if (p.usage_limit) {
    buf += R"(,"usage_limit":)";
    number(*p.usage_limit);
  }
  buf += "}}\n";
  put(std::string_view(buf));
}
}  // namespace detail::iopddl

/// Parse an IOPDDL document already parsed as JSON; `source` names it in messages ("IOPDDL
/// problem 'x.json'"). The same reader as read_iopddl's, fed the document's values.
inline strategy_problem parse_iopddl(const nlohmann::json& doc, const std::string& source = "IOPDDL document") {
  detail::iopddl::reader r(source);
  sax_walk_json(doc, r);
  return r.finish();
}

/// Read an IOPDDL document from a stream; `source` names it in messages. A syntax error names
/// the byte it was found at.
inline strategy_problem read_iopddl(std::istream& in, const std::string& source = "<stream>") {
  detail::iopddl::reader r(source);
  sax_parse_json(in, source, r, {iopddl_bytes_per_byte, "problem"});
  return r.finish();
}

/// Read an IOPDDL file (a regular file: a FIFO or a directory is refused without waiting). A
/// file whose problem may not fit the memory left (iopddl_bytes_per_byte) is refused with a
/// resource_error before it is read.
inline strategy_problem read_iopddl_file(const std::filesystem::path& file) {
  const std::string what = "IOPDDL problem";
  detail::iopddl::reader r(what + " " + quoted_path(file.string()));
  sax_parse_json_file(file.string(), what, r, {iopddl_bytes_per_byte, "problem"});
  return r.finish();
}

/// Write a problem as IOPDDL JSON (compact, one line).
inline void write_iopddl(std::ostream& out, const strategy_problem& p) {
  detail::iopddl::write_text(p, [&](std::string_view s) { out.write(s.data(), static_cast<std::streamsize>(s.size())); });
  if (!out) throw io_error("writing the IOPDDL document failed");
}

/// Write a problem to an IOPDDL file, atomically (write_file_atomically).
inline void write_iopddl_file(const std::filesystem::path& file, const strategy_problem& p) {
  write_file_atomically(file, [&](atomic_file& f) { detail::iopddl::write_text(p, [&](std::string_view s) { f.write(s); }); });
}

/// The IOPDDL document of a problem (names only when some node has one): write_iopddl's text,
/// parsed.
inline nlohmann::json to_iopddl_json(const strategy_problem& p) {
  std::string text;
  detail::iopddl::write_text(p, [&](std::string_view s) { text += s; });
  return nlohmann::json::parse(text);
}

/// Parse a solution in the contest's format, a JSON list of strategy indices, one per node of `p`.
inline std::vector<int> parse_iopddl_solution(const nlohmann::json& doc, const strategy_problem& p,
                                              const std::string& source = "<solution>") {
  const json_in in(doc, source);
  if (!doc.is_array()) in.fail_expected("a list of strategy indices");
  if (doc.size() != p.nodes.size())
    in.fail("has " + std::to_string(doc.size()) + " strategy indices for " + std::to_string(p.nodes.size()) + " nodes");
  std::vector<int> choice(doc.size());
  for (std::size_t v = 0; v < doc.size(); ++v) {
    const std::int64_t count = static_cast<std::int64_t>(p.nodes[v].costs.size());
    const json_in x = in[v];
    const std::optional<std::int64_t> c = json_int64(x.raw());
    if (!c || *c < 0 || *c >= count) x.fail_expected("a strategy index in [0, " + std::to_string(count) + ") of " + p.node_label(v));
    choice[v] = static_cast<int>(*c);
  }
  return choice;
}

/// The most bytes a solution file of a problem of `nodes` nodes may have: 64 an index, and
/// 1 MiB. The contest's `[0, 2, 1]` takes 2 to 12 bytes an index, and a pretty-printed one
/// (an index a line, indented) a few more; the tree of 1 MiB of JSON takes at most 32 MiB.
inline std::uint64_t iopddl_solution_max_bytes(std::size_t nodes) {
  return 64 * static_cast<std::uint64_t>(nodes) + (std::uint64_t{1} << 20);
}

/// Read a solution file for `p` (see parse_iopddl_solution). Its size is checked first, at
/// most iopddl_solution_max_bytes, which bounds the tree parse_iopddl_solution reads: a
/// solution of 5 * 10^7 indices for a problem of 5 nodes took 1.5 GB and 5 s before "has
/// 50000001 strategy indices for 5 nodes"; it is now refused at once, from its size.
inline std::vector<int> read_iopddl_solution_file(const std::filesystem::path& file, const strategy_problem& p) {
  const std::string what = "solution", name = what + " " + quoted_path(file.string());
  const std::size_t nodes = p.nodes.size();
  std::error_code ec;
  if (std::filesystem::is_regular_file(file, ec)) {
    const std::uintmax_t size = std::filesystem::file_size(file, ec);
    if (!ec && size > iopddl_solution_max_bytes(nodes))
      throw io_error(name + " has " + human_bytes(static_cast<double>(size)) + " (" + std::to_string(size) +
                     " bytes), but a solution of the problem's " + std::to_string(nodes) +
                     " nodes, one strategy index each, has at most " + std::to_string(iopddl_solution_max_bytes(nodes)) +
                     " bytes (64 an index and 1 MiB): it is not a solution to this problem");
  }
  return parse_iopddl_solution(load_json_file(file.string(), what), p, name);
}

/// Write a solution in the contest's format: `[0, 0, 2, 1, 0]`.
inline void write_iopddl_solution_file(const std::filesystem::path& file, const std::vector<int>& choice) {
  write_file_atomically(file, nlohmann::json(choice).dump() + "\n");
}

}  // namespace autoshard
