// The io area: checked JSON reading and atomic file writing.
#include <autoshard/io/io.hpp>

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include "unit/scratch.hpp"

namespace fs = std::filesystem;
using namespace autoshard;

namespace {

using io_dir = autoshard_test::scratch_dir;

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const io_error& e) {
    return e.what();
  }
  return "(no io_error)";
}

}  // namespace

TEST_CASE("json_in: integers are checked against their bounds before conversion, and errors name the path and the value") {
  const nlohmann::json j = nlohmann::json::parse(R"({"mesh": {"axes": [{"size": 2}, {"size": 4}, {"size": 1e30},
      {"size": 18446744073709551615}, {"size": -3}, {"size": 3.0}, {"size": "8"}]}, "n": 9223372036854775807})");
  const json_in in(j, "plan file 'p.json'");
  CHECK(in["mesh"]["axes"][0]["size"].integer(1, 8) == 2);
  CHECK(in["mesh"]["axes"][1]["size"].small_integer(1, 8) == 4);
  CHECK(in["n"].integer() == std::numeric_limits<std::int64_t>::max());
  CHECK(error_of([&] { in["mesh"]["axes"][2]["size"].integer(1, 8); }) ==
        "io error: plan file 'p.json': mesh.axes[2].size is 1e+30, not an integer in [1, 8]");
  CHECK(error_of([&] { in["mesh"]["axes"][3]["size"].integer(); }) ==
        "io error: plan file 'p.json': mesh.axes[3].size is 18446744073709551615, not an integer in "
        "[-9223372036854775808, 9223372036854775807]");
  CHECK(error_of([&] { in["mesh"]["axes"][4]["size"].integer(1, 8); }).find("mesh.axes[4].size is -3, not an integer in [1, 8]") !=
        std::string::npos);
  CHECK(error_of([&] { in["mesh"]["axes"][5]["size"].integer(1, 8); }).find("mesh.axes[5].size is 3.0, not an integer") !=
        std::string::npos);
  CHECK(error_of([&] { in["mesh"]["axes"][6]["size"].integer(1, 8); }).find("mesh.axes[6].size is \"8\", not an integer") !=
        std::string::npos);
  CHECK(error_of([&] { in["mesh"]["axes"][7]; }) ==
        "io error: plan file 'p.json': mesh.axes has 7 elements, none at index 7");
  CHECK(error_of([&] { in["mesh"]["links"]; }) == "io error: plan file 'p.json': mesh has no member \"links\"");
  CHECK(error_of([&] { in["mesh"]["axes"]["size"]; }).find("mesh.axes is [{\"size\":2}") != std::string::npos);
  CHECK(error_of([&] { in["mesh"]["axes"].size(3); }) ==
        "io error: plan file 'p.json': mesh.axes has 7 elements; at most 3 are allowed");
  // A long value is cut to 57 bytes, never inside a character: "x" then two-byte 'é's put a
  // character across byte 57, which is cut before it.
  nlohmann::json accents = {{"name", "x"}};
  std::string e = "x";
  for (int k = 0; k < 40; ++k) e += "\xC3\xA9";
  accents["name"] = e;
  const std::string msg = error_of([&] { json_in(accents, "m.json")["name"].integer(); });
  CHECK(autoshard::detail::invalid_utf8_at(msg) == std::string::npos);
  CHECK(msg.find("...") != std::string::npos);
}

TEST_CASE("json paths escape a file's keys: an ESC or a newline in a key never reaches a message raw") {
  const nlohmann::json j = nlohmann::json::parse(R"({"a\u001b[31mb\nc": {"n": "x"}})");
  std::string msg;
  for (const auto& m : json_in(j, "f.json").members()) msg = error_of([&] { (void)m.second["n"].integer(); });
  CHECK(msg.find("io error: f.json: a\\x1B[31mb\\x0Ac.n is \"x\", not an integer") == 0);
  CHECK(msg.find_first_of("\x1B\n") == std::string::npos);
  // The depth check reads the text before it parses: a raw ESC in a key is escaped there too.
  std::string deep = "{\"a\x1B[31mb\": [[[1]]]}";
  std::string depth_msg;
  try {
    check_json_depth(deep, "f.json", 2);
  } catch (const io_error& e) {
    depth_msg = e.what();
  }
  CHECK(depth_msg.find("levels (arrays and objects) at a\\x1B[31mb") != std::string::npos);
  CHECK(depth_msg.find('\x1B') == std::string::npos);
}

TEST_CASE("invalid_utf8_at accepts exactly the strings nlohmann's dump() writes, and utf8_escaped shows the rest") {
  const auto dumps = [](const std::string& s) {
    try {
      (void)nlohmann::json(s).dump();
      return true;
    } catch (const nlohmann::json::type_error&) {
      return false;
    }
  };
  const auto agree = [&](const std::string& s) {
    const bool valid = detail::invalid_utf8_at(s) == std::string_view::npos;
    if (valid != dumps(s)) FAIL_CHECK("disagree on " << detail::utf8_escaped(s) << ": invalid_utf8_at says " << valid);
  };
  for (int a = 0; a < 256; ++a)  // every 1- and 2-byte string
    for (int b = -1; b < 256; ++b) agree(b < 0 ? std::string(1, static_cast<char>(a)) : std::string{static_cast<char>(a), static_cast<char>(b)});
  for (int a = 0xE0; a <= 0xF4; ++a)  // 3- and 4-byte forms: every second byte, the edges of the rest
    for (int b = 0; b < 256; ++b)
      for (int c : {0x41, 0x7F, 0x80, 0xBF, 0xC0})
        for (int d : {-1, 0x80, 0xC0}) {
          std::string s{static_cast<char>(a), static_cast<char>(b), static_cast<char>(c)};
          if (d >= 0) s += static_cast<char>(d);
          agree(s);
        }
  CHECK(detail::invalid_utf8_at("caf\xC3\xA9") == std::string_view::npos);
  CHECK(detail::invalid_utf8_at("ab\xE2\x82") == 2);       // cut short
  CHECK(detail::invalid_utf8_at("\xED\xA0\x80") == 0);    // a surrogate
  CHECK(detail::invalid_utf8_at("x\xF4\x90\x80\x80") == 1);  // above U+10FFFF
  CHECK(detail::utf8_escaped("w\xE2\x82!") == "w\\xE2\\x82!");
  CHECK(detail::utf8_escaped(std::string(100, 'a')) == std::string(57, 'a') + "...");
  CHECK(detail::utf8_escaped(std::string(56, 'a') + "\xC3\xA9\xC3\xA9\xC3\xA9") == std::string(56, 'a') + "...");  // not cut inside a character
}

namespace {
/// A streaming reader that keeps nothing, and the error each JSON reader gives for a text
/// ("(no io_error)" when it reads): the tree parser's and the streaming one's.
struct null_sax {
  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(std::int64_t) { return true; }
  bool number_unsigned(std::uint64_t) { return true; }
  bool number_float(double, const std::string&) { return true; }
  bool string(std::string&) { return true; }
  bool binary(nlohmann::json::binary_t&) { return true; }
  bool start_object(std::size_t) { return true; }
  bool end_object() { return true; }
  bool start_array(std::size_t) { return true; }
  bool end_array() { return true; }
  bool key(std::string&) { return true; }
  bool parse_error(std::size_t b, const std::string&, const nlohmann::json::exception& e) { throw json_syntax_error("s", b, e); }
};
std::string tree(const std::string& t) { return error_of([&] { (void)parse_json_text(t, "doc"); }); }
std::string stream(const std::string& t) {
  return error_of([&] {
    std::istringstream in(t);
    null_sax sax;
    sax_parse_json(in, "doc", sax, {});
  });
}
}  // namespace

TEST_CASE("every JSON reader refuses an object that names a member twice, saying which, in which object and where") {
  const std::string tail = "; an object names each member once: remove one of them";
  for (const auto& read : {std::function<std::string(const std::string&)>(tree), std::function<std::string(const std::string&)>(stream)}) {
    CHECK(read(R"({"a":1,"a":2})") == "io error: doc: the document has the member 'a' twice (the second ends at line 1, column 10)" + tail);
    CHECK(read("{\"x\": [1, {\"b\": 1},\n {\"c\": 1,\n  \"c\": {}}]}") ==
          "io error: doc: x[2] has the member 'c' twice (the second ends at line 3, column 5)" + tail);
    CHECK(read(R"({"\u0061":1,"a":2})").find("the member 'a' twice") != std::string::npos);  // the key, not its spelling
    CHECK(read(R"({"a":{"x":1},"b":{"x":1,"y":[{"x":2},{"x":3}]}})") == "(no io_error)");  // one name in many objects
    CHECK(read(R"({"a":1,"b":[1,2})").find("is not valid JSON") != std::string::npos);
  }
  // The tree is the one nlohmann's parse builds.
  const std::string doc = R"({"b":[1,-2,3.5,"s",true,null,{"c":{}},[]],"a":{"z":18446744073709551615}})";
  CHECK(parse_json_text(doc, "doc") == nlohmann::json::parse(doc));
}

TEST_CASE("every JSON reader refuses a NUL byte, which nlohmann's parser took for the end of the text") {
  const std::string what = "io error: doc is not valid JSON: a NUL byte (0x00) at offset ";
  const std::string tail = ", which no JSON text holds (a string writes it \\u0000)";
  for (const auto& read : {std::function<std::string(const std::string&)>(tree), std::function<std::string(const std::string&)>(stream)}) {
    // After the document: read as {"a": 1} before, whatever followed (padding, or another document).
    CHECK(read(std::string("{\"a\": 1}\0\0\0", 11)) == what + "8 (line 1, column 9)" + tail);
    CHECK(read(std::string("{\"a\": 1}\n\0{\"a\": 2}", 18)) == what + "9 (line 2, column 1)" + tail);
    // Inside it: the parser's "unexpected end of input" would have blamed a text that goes on.
    CHECK(read(std::string("{\"a\":\0 1}", 9)) == what + "5 (line 1, column 6)" + tail);
    CHECK(read("{\"a\": \"\\u0000\"}") == "(no io_error)");  // the escape is a string's NUL
    // Past the first 64 KiB a stream reads: the offset counts from the start of the text.
    std::string big = "[" + std::string(70000, ' ') + "1]";
    big += '\0';
    CHECK(read(big) == what + "70003 (line 1, column 70004)" + tail);
  }
  // A file is read the same way.
  const io_dir d;
  std::ofstream(d.path / "p.json", std::ios::binary) << std::string("{\"version\": 1}\0junk", 19);
  CHECK(error_of([&] { (void)load_json_file((d.path / "p.json").string(), "plan file"); }) ==
        "io error: plan file '" + (d.path / "p.json").string() + "' is not valid JSON: a NUL byte (0x00) at offset 14 (line 1, column 15)" + tail);
}

TEST_CASE("json_int64 and json_uint64: the one range check of a raw JSON integer") {
  const nlohmann::json j = nlohmann::json::parse(
      R"([0, -3, 9223372036854775807, 9223372036854775808, 18446744073709551615, 3.0, 1e30, "8", null, -9223372036854775808])");
  CHECK(json_int64(j[0]) == 0);
  CHECK(json_int64(j[1]) == -3);
  CHECK(json_int64(j[2]) == std::numeric_limits<std::int64_t>::max());
  CHECK_FALSE(json_int64(j[3]).has_value());  // 2^63 parses unsigned: get<int64_t> would wrap it negative
  CHECK_FALSE(json_int64(j[4]).has_value());
  CHECK(json_int64(j[9]) == std::numeric_limits<std::int64_t>::min());
  CHECK(json_uint64(j[4]) == std::numeric_limits<std::uint64_t>::max());
  CHECK(json_uint64(j[2]) == static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()));
  CHECK_FALSE(json_uint64(j[1]).has_value());
  CHECK(json_uint64(nlohmann::json(std::int64_t{7})) == 7u);  // built in code: a signed integer, non-negative
  for (std::size_t i : {5u, 6u, 7u, 8u}) {  // a float (even an integral one), a string, null
    CAPTURE(i);
    CHECK_FALSE(json_int64(j[i]).has_value());
    CHECK_FALSE(json_uint64(j[i]).has_value());
  }
}

TEST_CASE("json_in: doubles are finite and in range, strings, booleans, optional members and choices") {
  const nlohmann::json j = nlohmann::json::parse(R"({"bw": 2.5e10, "lat": -1, "big": 1e308, "i": 7, "s": "nccl", "b": true,
      "z": null, "arr": [1, 2, 3]})");
  const json_in in(j, "calibration file 'c.json'");
  CHECK(in["bw"].number(1e-300, 1e300) == 2.5e10);
  CHECK(in["i"].number() == 7.0);
  CHECK(error_of([&] { in["lat"].number(0.0, 1.0); }) ==
        "io error: calibration file 'c.json': lat is -1, not a number in [0, 1]");
  CHECK(error_of([&] { in["big"].number(0.0, 1e300); }).find("big is 1e+308, not a number") != std::string::npos);
  CHECK(in["s"].string() == "nccl");
  CHECK(in["s"].one_of({"nccl", "gloo"}) == "nccl");
  CHECK(error_of([&] { in["s"].one_of({"gloo", "mpi"}); }) ==
        "io error: calibration file 'c.json': s is \"nccl\", not \"gloo\" or \"mpi\"");
  CHECK(in["b"].boolean());
  CHECK(error_of([&] { in["s"].boolean(); }).find("s is \"nccl\", not true or false") != std::string::npos);
  CHECK(!in.find("z"));
  CHECK(!in.find("absent"));
  CHECK(in.find("i")->integer() == 7);
  CHECK(in["arr"].integers(0, 5) == std::vector<std::int64_t>{1, 2, 3});
  CHECK(error_of([&] { in["arr"].integers(0, 2); }).find("arr[2] is 3, not an integer in [0, 2]") != std::string::npos);
  CHECK(error_of([&] { json_in(j, "")["s"].integer(); }).rfind("io error: s is \"nccl\"", 0) == 0);
  const nlohmann::json arr = nlohmann::json::array();
  CHECK(error_of([&] { json_in(arr, "x")["k"]; }) == "io error: x: the document is [], not an object");
}

TEST_CASE("load_json_file: names the file, refuses directories and FIFOs without hanging, rejects bad JSON") {
  io_dir d;
  std::ofstream(d.path / "ok.json") << R"({"a": [1, 2]})";
  CHECK(load_json_file((d.path / "ok.json").string(), "plan file")["a"][1] == 2);
  std::ofstream(d.path / "bad.json") << R"({"a": [1, 2)";
  const std::string bad = error_of([&] { load_json_file((d.path / "bad.json").string(), "plan file"); });
  CHECK(bad.find("plan file '" + (d.path / "bad.json").string() + "' is not valid JSON") != std::string::npos);
  std::ofstream(d.path / "huge.json") << R"({"a": 1e999})";
  CHECK(error_of([&] { load_json_file((d.path / "huge.json").string()); }).find("is not valid JSON") != std::string::npos);
  // A gzip file (the contest ships its requests as .json.gz) says so instead of "not valid JSON".
  const unsigned char gz[] = {0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03};
  std::ofstream(d.path / "p.json.gz", std::ios::binary).write(reinterpret_cast<const char*>(gz), sizeof gz);
  CHECK(error_of([&] { load_json_file((d.path / "p.json.gz").string(), "IOPDDL problem"); }) ==
        "io error: IOPDDL problem '" + (d.path / "p.json.gz").string() +
            "' is gzip-compressed, not JSON: decompress it first (gunzip -k FILE, or zcat FILE > FILE.json)");
  CHECK(error_of([&] { load_json_file((d.path / "missing.json").string(), "plan file"); }).find(
            "cannot open plan file '" + (d.path / "missing.json").string() + "': No such file") != std::string::npos);
  CHECK(error_of([&] { load_json_file(d.path.string(), "plan file"); }).find("is a directory") != std::string::npos);
  const fs::path fifo = d.path / "fifo.json";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(error_of([&] { load_json_file(fifo.string(), "plan file"); }).find("is not a regular file") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  CHECK(error_of([&] { read_regular_file((d.path / "ok.json").string(), "file", 4); }).find("at most 4 are read") !=
        std::string::npos);
}

namespace {
// Writes every SAX event it gets on one line; a syntax error throws as a reader's should.
struct event_log : nlohmann::json_sax<nlohmann::json> {
  std::string text;
  std::size_t numbers = 0;
  bool log(const std::string& event) {
    text += event + " ";
    return true;
  }
  bool number(const std::string& event) {
    ++numbers;
    return log(event);
  }
  bool null() override { return log("n"); }
  bool boolean(bool b) override { return log(b ? "t" : "f"); }
  bool number_integer(std::int64_t i) override { return number("i" + std::to_string(i)); }
  bool number_unsigned(std::uint64_t u) override { return number("u" + std::to_string(u)); }
  bool number_float(double d, const std::string&) override { return number("d" + std::to_string(d)); }
  bool string(std::string& s) override { return log("s" + s); }
  bool binary(nlohmann::json::binary_t&) override { return log("b"); }
  bool start_object(std::size_t) override { return log("{"); }
  bool key(std::string& k) override { return log("k" + k); }
  bool end_object() override { return log("}"); }
  bool start_array(std::size_t) override { return log("["); }
  bool end_array() override { return log("]"); }
  bool parse_error(std::size_t byte, const std::string&, const nlohmann::json::exception& e) override {
    throw json_syntax_error("t.json", byte, e);
  }
};

// A stream that cannot seek (a pipe's): `[0,0,...,0]` of `n` zeros, made as it is read.
struct zeros_stream : std::streambuf {
  std::size_t left;
  std::string piece;
  explicit zeros_stream(std::size_t n) : left(n), piece("[") {}
  int_type underflow() override {
    if (gptr() != nullptr && gptr() < egptr()) return traits_type::to_int_type(*gptr());
    if (piece.empty() && left == 0) return traits_type::eof();
    if (piece.empty()) {
      const std::size_t k = std::min<std::size_t>(left, 4096);
      for (std::size_t i = 0; i < k; ++i) piece += --left ? "0," : "0]";
    }
    buf.swap(piece);
    piece.clear();
    setg(buf.data(), buf.data(), buf.data() + buf.size());
    return traits_type::to_int_type(buf[0]);
  }
  std::string buf;
};
}  // namespace

TEST_CASE("load_json_file: a file whose tree may not fit is refused from its size, before a byte is read") {
  // A sparse file just above what this process can hold as a tree (32 bytes a byte): read
  // whole before, it took its size in memory and seconds before the refusal. Past 4 GiB the
  // size bound of read_regular_file refuses it first, also before reading.
  io_dir d;
  const std::uint64_t have = machine_limits::memory_here().memory();
  const std::uint64_t size = std::min<std::uint64_t>(have / json_tree_bytes_per_byte + (std::uint64_t{64} << 20),
                                                     std::uint64_t{8} << 30);
  const auto big = d.path / "big.json";
  std::ofstream(big).put('{');
  REQUIRE(::truncate(big.c_str(), static_cast<off_t>(size)) == 0);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string why = [&] {
    try {
      load_json_file(big.string(), "plan file");
    } catch (const autoshard::error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  }();
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(500));
  const bool by_memory = why.find("resource error: plan file '" + big.string() + "' has ") == 0 &&
                         why.find(" of JSON, whose tree may take up to ") != std::string::npos;
  const bool by_size = why.find(" bytes; at most 4294967296 are read") != std::string::npos;
  CHECK_MESSAGE((by_memory || by_size), why);
  CHECK(by_memory == (size <= (std::uint64_t{1} << 32)));
}

TEST_CASE("sax_parse_json: streams a text to a handler, refusing what may not fit before it is read") {
  // The events are nlohmann's sax_parse's; sax_walk_json gives the same for the parsed tree
  // (keys sorted here, as a tree keeps them).
  const std::string text = R"({"a":[1,-2,2.5,"x",true,false,null,{}],"b":{"c":[[]]}})";
  event_log streamed, walked;
  std::istringstream in(text);
  sax_parse_json(in, "t.json", streamed, {});
  CHECK(sax_walk_json(nlohmann::json::parse(text), walked));
  CHECK(streamed.text == "{ ka [ u1 i-2 d2.500000 sx t f n { } ] kb { kc [ [ ] ] } } ");
  CHECK(walked.text == streamed.text);
  // A syntax error names the source and the byte; a gzip text is refused as parse_json_text does.
  std::istringstream cut(R"({"a":[1,)");
  CHECK(error_of([&] { sax_parse_json(cut, "t.json", streamed, {}); }).rfind("io error: t.json is not valid JSON at byte 9: ", 0) == 0);
  std::istringstream gz(std::string("\x1f\x8b\x08", 3));
  CHECK(error_of([&] { sax_parse_json(gz, "t.json", streamed, {}); }).find("t.json is gzip-compressed, not JSON") != std::string::npos);
  // A real gzip header holds NUL bytes: still refused as gzip, not as a NUL (json_nul_byte).
  std::istringstream gz0(std::string("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03", 10));
  CHECK(error_of([&] { sax_parse_json(gz0, "t.json", streamed, {}); }).find("t.json is gzip-compressed, not JSON") != std::string::npos);
  // A handler that keeps 2^40 bytes a byte: past the 2 MiB not checked, the reading stops
  // before the next 64 KiB, whose worst case no memory can hold, with the sizes read and left
  // when the stream can seek; the numbers read before it are the handler's.
  const text_memory_bound huge{std::uint64_t{1} << 40, "index"};
  std::istringstream seekable("[" + std::string(3 << 20, ' ') + "0]");
  event_log none;
  const auto refusal = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const resource_error& e) {
      return std::string(e.what());
    }
    return std::string("(no resource_error)");
  };
  const std::string seek = refusal([&] { sax_parse_json(seekable, "s.json", none, huge); });
  CHECK(seek.rfind("resource error: s.json: reading stopped after 2.06 MiB of its 3.00 MiB of JSON: the index read so far "
                   "leaves this process ", 0) == 0);
  CHECK(seek.find("less than the 32.00 MiB kept free and the 65536.00 TiB the next 64.00 KiB may take, and the 960.00 KiB left "
                  "may take up to ") != std::string::npos);
  CHECK(seek.find(" (1099511627776 bytes a byte)") != std::string::npos);
  CHECK(none.numbers == 0);
  zeros_stream pipe(2 << 20);  // 4 MiB of text
  std::istream piped(&pipe);
  const std::string piped_refusal = refusal([&] { sax_parse_json(piped, "p.json", none, huge); });
  CHECK(piped_refusal.rfind("resource error: p.json: reading stopped after 2.06 MiB of JSON: the index read so far leaves "
                            "this process ", 0) == 0);
  CHECK(piped_refusal.find("left may take") == std::string::npos);  // a pipe's rest is not known
  CHECK(none.numbers > 0);
  CHECK(none.numbers < (std::size_t{2} << 20));
  // The same stream read whole with an ordinary bound.
  zeros_stream again(2 << 20);
  std::istream piped_again(&again);
  event_log all;
  sax_parse_json(piped_again, "p.json", all, {16, "index"});
  CHECK(all.numbers == (std::size_t{2} << 20));
}

TEST_CASE("check_free_space: more bytes than the file system has available are refused before anything is written") {
  // synth and shard wrote into a full file system until ENOSPC (50 MiB of tmpfs filled, then
  // cleaned up); now they are refused up front, naming both sizes.
  io_dir d;
  const fs::path out = d.path / "not" / "yet" / "made";  // measured at its nearest existing ancestor
  CHECK_NOTHROW(autoshard::check_free_space(out, 1, "a tiny output"));
  const std::string msg = error_of([&] { autoshard::check_free_space(out, std::uint64_t{1} << 62, "a huge output"); });
  CHECK(msg.rfind("io error: a huge output needs 4194304.00 TiB (4611686018427387904 bytes) but the file system of '" +
                      d.path.string() + "' has ", 0) == 0);
  CHECK(msg.find(" available") != std::string::npos);
  CHECK_FALSE(fs::exists(d.path / "not"));
}

TEST_CASE("atomic_file: writes the whole file, replaces the target, leaves no temporary and honours the umask") {
  io_dir d;
  const fs::path target = d.path / "plan.json";
  std::ofstream(target) << "old contents";
  write_file_atomically(target, std::string_view("new contents\n"));
  CHECK(slurp(target) == "new contents\n");
  const mode_t old = ::umask(027);
  write_file_atomically(d.path / "b.bin", [](atomic_file& f) {
    f.write(std::string_view("ab"));
    f.write(std::string(3 << 20, 'x'));  // beyond the buffer: written straight through
    CHECK(f.written() == 2 + (3u << 20));
  });
  ::umask(old);
  CHECK(fs::file_size(d.path / "b.bin") == 2 + (3u << 20));
  CHECK((fs::status(d.path / "b.bin").permissions() & fs::perms::all) ==
        (fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read));
  int files = 0;
  for (const auto& e : fs::directory_iterator(d.path)) {
    ++files;
    CHECK(e.path().filename().string().find(".tmp.") == std::string::npos);
  }
  CHECK(files == 2);
}

TEST_CASE("atomic_file: a failure or an abandoned file leaves the target untouched and no temporary") {
  io_dir d;
  const fs::path target = d.path / "out.json";
  std::ofstream(target) << "keep me";
  fs::path tmp;
  {
    atomic_file f(target);
    tmp = f.temporary_path();
    // The temporary sits next to the target under an unpredictable name: <target>.tmp.<pid>.<16 hex>.
    const std::string name = tmp.filename().string();
    const std::string prefix = "out.json.tmp." + std::to_string(::getpid()) + ".";
    REQUIRE(name.rfind(prefix, 0) == 0);
    CHECK(name.size() == prefix.size() + 16);
    CHECK(tmp.parent_path() == d.path);
    atomic_file g(target);
    CHECK(g.temporary_path() != tmp);  // two writers never share a temporary
    f.write(std::string_view("half a fi"));
    CHECK(fs::exists(tmp));
  }  // destroyed without commit
  CHECK(!fs::exists(tmp));
  CHECK(slurp(target) == "keep me");
  CHECK_THROWS_WITH_AS(write_file_atomically(target, [](atomic_file& f) {
                         f.write(std::string_view("partial"));
                         throw io_error("the writer failed");
                       }),
                       "io error: the writer failed", io_error);
  CHECK(slurp(target) == "keep me");
  // A directory that cannot be written: the error names the temporary's directory and nothing changes.
  if (::geteuid() != 0) {
    fs::permissions(d.path, fs::perms::owner_write, fs::perm_options::remove);
    CHECK(error_of([&] { write_file_atomically(target, std::string_view("x")); }).find("cannot create '" + target.string() + ".tmp.") !=
          std::string::npos);
    fs::permissions(d.path, fs::perms::owner_write, fs::perm_options::add);
    CHECK(slurp(target) == "keep me");
  }
  int files = 0;
  for (const auto& e : fs::directory_iterator(d.path)) files += e.path() == target ? 0 : 1;
  CHECK(files == 0);
}

TEST_CASE("remove_live_temporaries removes exactly the temporaries still open") {
  io_dir d;
  atomic_file a(d.path / "a.bin");
  a.write(std::string_view("a"));
  {
    atomic_file done(d.path / "done.bin");
    done.write(std::string_view("done"));
    done.commit();
  }
  const fs::path ta = a.temporary_path();
  CHECK(fs::exists(ta));
  remove_live_temporaries();  // what a SIGINT handler does before re-raising
  CHECK(!fs::exists(ta));
  CHECK(slurp(d.path / "done.bin") == "done");
}

TEST_CASE("check_json_depth: a text nested deeper than max_json_depth is refused before parsing, naming the path") {
  // 100,000 levels of [ or { once overflowed the stack (nlohmann's dump() of the value in the
  // error message, and its copies, recurse once per level).
  const std::string arrays = std::string(100000, '[') + std::string(100000, ']');
  CHECK(error_of([&] { parse_json_text(arrays, "plan file 'p.json'"); }).rfind(
            "io error: plan file 'p.json': nested deeper than 128 levels (arrays and objects) at [0][0][0]", 0) == 0);
  std::string objects;
  for (int i = 0; i < 100000; ++i) objects += "{\"a\":";
  objects += "1" + std::string(100000, '}');
  const std::string why = error_of([&] { parse_json_text(objects, "model file 'm.json'"); });
  CHECK(why.rfind("io error: model file 'm.json': nested deeper than 128 levels (arrays and objects) at a.a.a.a", 0) == 0);
  // The path follows keys and indices, and brackets inside strings (escaped quotes too) do not count.
  std::string mixed = R"({"x": "[[[[\"{{{", "mesh": {"axes": [1, 2, )";
  for (int i = 0; i < 200; ++i) mixed += "[";
  CHECK(error_of([&] { check_json_depth(mixed, "f"); }).find("at mesh.axes[2][0][0]") != std::string::npos);
  // Exactly the limit is fine; one more is not.
  const std::string at_limit = std::string(max_json_depth, '[') + std::string(max_json_depth, ']');
  CHECK(parse_json_text(at_limit, "f").is_array());
  CHECK(error_of([&] { parse_json_text("[" + at_limit + "]", "f"); }).find("nested deeper than 128") != std::string::npos);
  // A message's excerpt of a deep in-memory value stays short (no recursive dump() of it all).
  nlohmann::json deep = nlohmann::json::array();
  for (int i = 0; i < 20; ++i) deep = nlohmann::json::array({deep, 1});
  CHECK(error_of([&] { json_in(deep, "x").integer(); }) == "io error: x: the document is " + deep.dump().substr(0, 57) +
                                                              "..., not an integer in [-9223372036854775808, 9223372036854775807]");
}

TEST_CASE("atomic_file: an output that is not a regular file is refused before anything is written, and kept") {
  io_dir d;
  const fs::path victim = d.path / "victim.json";
  std::ofstream(victim) << "precious";
  const fs::path fifo = d.path / "out.fifo", link = d.path / "out.link", dir = d.path / "out.dir";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  fs::create_symlink(victim, link);
  fs::create_directories(dir);
  // Renaming over them (what every writer did) destroyed the FIFO, the link, or as root a device node.
  CHECK(error_of([&] { write_file_atomically(fifo, std::string_view("x")); }) ==
        "io error: '" + fifo.string() + "' is a FIFO, not a regular file: refusing to replace it");
  CHECK(error_of([&] { write_file_atomically(link, std::string_view("x")); }) ==
        "io error: '" + link.string() + "' is a symbolic link to '" + victim.string() +
            "', not a regular file: refusing to replace it");
  CHECK(error_of([&] { write_file_atomically(dir, std::string_view("x")); }).find("is a directory, not a regular file") !=
        std::string::npos);
  CHECK(fs::is_fifo(fifo));
  CHECK(fs::is_symlink(link));
  CHECK(slurp(victim) == "precious");
  // A character device is named as one (only checked: nothing is written near /dev/null).
  CHECK(why_not_replaceable("/dev/null") == "'/dev/null' is a character device, not a regular file: refusing to replace it");
  CHECK(why_not_replaceable(victim).empty());
  CHECK(why_not_replaceable(d.path / "absent").empty());
  // A path that names no file (`plan --out dir/`) wrote a hidden `.tmp.*` there, and plan its
  // picture as `dir/.dot` and `dir/.dot.svg`: refused, whether the directory exists or not.
  for (const char* tail : {"/", "/.", "/..", "/new/"}) {
    const fs::path p = d.path.string() + tail;
    CHECK(error_of([&] { write_file_atomically(p, std::string_view("x")); }) ==
          "io error: '" + p.string() + "' names a directory, not a file: give the file's name");
  }
  // A FIFO planted while the file was written (after the first check) is refused at the rename.
  const fs::path late = d.path / "late.json";
  {
    atomic_file f(late);
    f.write(std::string_view("x"));
    REQUIRE(::mkfifo(late.c_str(), 0600) == 0);
    CHECK(error_of([&] { f.commit(); }).find("is a FIFO, not a regular file") != std::string::npos);
  }
  CHECK(fs::is_fifo(late));
  // Asked to (resolve_output_link), a link is written through: the file it points to is replaced.
  write_file_atomically(resolve_output_link(link), std::string_view("new"));
  CHECK(fs::is_symlink(link));
  CHECK(slurp(victim) == "new");
  int files = 0;
  for (const auto& e : fs::directory_iterator(d.path)) files += e.path().filename().string().find(".tmp.") != std::string::npos;
  CHECK(files == 0);
}

TEST_CASE("atomic_file: a 255-byte name gets a temporary that fits, and two long names never share one") {
  io_dir d;
  const std::string stem(240, 'a');
  for (const std::string& name : {stem + ".json", std::string(255, 'b'), std::string(240, 'a') + "." + std::string(14, 'c')}) {
    CAPTURE(name.size());
    atomic_file f(d.path / name);
    CHECK(f.temporary_path().filename().string().size() <= 255);
    f.write(std::string_view("ok"));
    f.commit();
    CHECK(slurp(d.path / name) == "ok");
  }
  atomic_file a(d.path / (stem + ".x1")), b(d.path / (stem + ".x2"));
  const std::string ta = a.temporary_path().filename().string(), tb = b.temporary_path().filename().string();
  CHECK(ta.substr(0, ta.find(".tmp.")) != tb.substr(0, tb.find(".tmp.")));  // the stems differ (a hash of the name)
}

TEST_CASE("atomic_file: the temporaries a killed writer left are removed by the next writer of that file only") {
  io_dir d;
  const pid_t dead = autoshard_test::dead_pid();
  REQUIRE(dead > 0);
  const std::string pid = std::to_string(dead);
  const std::string long_name(250, 'n');
  const std::string long_stem = detail::temporary_stem(long_name);
  const std::vector<std::string> stale = {"plan.json.tmp." + pid + ".0123456789abcdef", "plan.json.tmp." + pid,
                                          long_stem + ".tmp." + pid + ".00000000000000ff"};
  const std::vector<std::string> keep = {"plan.json.tmp.1.0123456789abcdef",       // pid 1 is alive
                                         "other.json.tmp." + pid + ".0123456789abcdef",  // another file's
                                         "plan.json.tmp." + pid + ".0123"};             // not a temporary's name
  for (const auto& n : stale) std::ofstream(d.path / n) << "half";
  for (const auto& n : keep) std::ofstream(d.path / n) << "not ours";
  write_file_atomically(d.path / "plan.json", std::string_view("{}"));
  write_file_atomically(d.path / long_name, std::string_view("{}"));
  for (const auto& n : stale) CHECK(!fs::exists(d.path / n));
  for (const auto& n : keep) CHECK(fs::exists(d.path / n));
}

TEST_CASE("remove_live_temporaries covers any number of open files (the table once had 256 slots)") {
  io_dir d;
  std::vector<std::unique_ptr<atomic_file>> open;
  for (int i = 0; i < 600; ++i) {
    open.push_back(std::make_unique<atomic_file>(d.path / ("rank-" + std::to_string(i) + ".safetensors")));
    open.back()->write(std::string_view("x"));
    (void)open.back()->fd();  // flushed: the temporary holds a byte
  }
  CHECK(std::distance(fs::directory_iterator(d.path), fs::directory_iterator()) == 600);
  remove_live_temporaries();
  CHECK(fs::directory_iterator(d.path) == fs::directory_iterator());
  open.clear();  // their destructors find nothing left to remove
  atomic_file again(d.path / "rank-0.safetensors");  // slots are reused after the 600 are gone
  again.write(std::string_view("y"));
  again.commit();
  CHECK(slurp(d.path / "rank-0.safetensors") == "y");
}

TEST_CASE("file paths in messages are escaped: a newline, an ESC or a stray byte never reaches the terminal raw") {
  const std::string path = "/nonexistent-autoshard/a\nb\x1B[31m\xFF.json";
  std::string msg;
  try {
    (void)autoshard::load_json_file(path, "plan file");
  } catch (const autoshard::io_error& e) {
    msg = e.what();
  }
  CHECK(msg.find("cannot open plan file '/nonexistent-autoshard/a\\x0Ab\\x1B[31m\\xFF.json': ") != std::string::npos);
  CHECK(msg.find('\n') == std::string::npos);
  CHECK(msg.find('\x1B') == std::string::npos);
}

// Hardening round ten: synth wrote its pair (weights and config) by two renames in the output
// directory; a kill between them left weights without a config, and the older config was gone
// already. atomic_file_set puts a set in place by one rename (or one exchange of directories);
// `before_step` is its fault hook: a child _exits there (no destructor runs, as under SIGKILL).
namespace {

const std::vector<std::string> pair_names{"w.bin", "c.json"};

void write_pair(const fs::path& dir, const std::string& tag, const std::function<void(const std::string&)>& hook = {}) {
  atomic_file_set set(dir, pair_names);
  set.before_step = hook;
  write_file_atomically(set.stage() / "w.bin", "weights " + tag);
  write_file_atomically(set.stage() / "c.json", "config " + tag);
  set.commit();
}

/// The directory's files (not its stages), name -> contents.
std::map<std::string, std::string> files_in(const fs::path& dir) {
  std::map<std::string, std::string> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) out[e.path().filename().string()] = slurp(e.path());
  return out;
}

/// Entries of `where` whose name holds ".tmp.": stages and temporaries.
std::vector<std::string> leftovers(const fs::path& where) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(where))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) out.push_back(e.path().string());
  return out;
}

/// Runs write_pair in a child that dies (_exit, no destructors) before commit()'s `step`.
void killed_at(const fs::path& dir, const std::string& step) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    try {
      write_pair(dir, "new", [&](const std::string& s) {
        if (s == step) ::_exit(9);
      });
    } catch (...) {
    }
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 9);  // it reached the step
}

}  // namespace

TEST_CASE("atomic_file_set: a set killed before any step of its commit is there whole, old or new, and a rerun cleans up") {
  io_dir d;
  const std::map<std::string, std::string> old_pair{{"c.json", "config old"}, {"w.bin", "weights old"}};
  const std::map<std::string, std::string> new_pair{{"c.json", "config new"}, {"w.bin", "weights new"}};
  SUBCASE("a new directory: one rename") {
    const fs::path out = d.path / "a" / "out";
    killed_at(out, "rename");
    CHECK(!fs::exists(out));
    CHECK(leftovers(d.path).size() == 1);  // the killed run's stage (its files committed in it)
    write_pair(out, "new");
    CHECK(files_in(out) == new_pair);
    CHECK(leftovers(d.path).empty());  // the stale stage is removed: its pid is gone
  }
  SUBCASE("over an earlier pair: one exchange of directories") {
    const fs::path out = d.path / "out";
    write_pair(out, "old");
    ::chmod(out.c_str(), 0750);
    killed_at(out, "exchange");
    CHECK(files_in(out) == old_pair);
    killed_at(out, "clean");
    CHECK(files_in(out) == new_pair);
    struct stat st {};
    REQUIRE(::stat(out.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0750);  // the directory keeps its mode
    CHECK(leftovers(d.path).size() == 1);  // the stage, holding the earlier pair
    write_pair(out, "again");
    CHECK(files_in(out) == std::map<std::string, std::string>{{"c.json", "config again"}, {"w.bin", "weights again"}});
    CHECK(leftovers(d.path).empty());
    if (::geteuid() == 0) {  // and its owner: `sudo synth` over a user's directory left it root's
      REQUIRE(::chown(out.c_str(), 65534, 65534) == 0);
      write_pair(out, "owned");  // exchanged again
      REQUIRE(::stat(out.c_str(), &st) == 0);
      CHECK(st.st_uid == 65534);
      CHECK(st.st_gid == 65534);
    }
  }
  SUBCASE("over an earlier pair in the working directory: moved in, the directory kept") {
    // An exchange would leave this process in the removed directory (`cd out && synth --out .`).
    const fs::path out = d.path / "out";
    write_pair(out, "old");
    struct stat before {}, after {};
    REQUIRE(::stat(out.c_str(), &before) == 0);
    const fs::path was = fs::current_path();
    fs::current_path(out);
    write_pair(".", "new");
    const bool cwd_there = fs::exists(fs::current_path() / "c.json");
    fs::current_path(was);
    CHECK(cwd_there);
    REQUIRE(::stat(out.c_str(), &after) == 0);
    CHECK(after.st_ino == before.st_ino);
    CHECK(files_in(out) == new_pair);
    CHECK(leftovers(d.path).empty());
  }
  SUBCASE("beside another file: moved one by one, the last name last, never beside an earlier last one") {
    const fs::path out = d.path / "out";
    write_pair(out, "old");
    { std::ofstream(out / "notes.txt") << "mine"; }
    for (const std::string step : {"remove c.json", "move w.bin", "move c.json"}) {
      CAPTURE(step);
      write_pair(out, "old");
      killed_at(out, step);
      auto got = files_in(out);
      CHECK(got["notes.txt"] == "mine");
      got.erase("notes.txt");
      if (step == "remove c.json") CHECK(got == old_pair);
      else if (step == "move w.bin") CHECK(got == std::map<std::string, std::string>{{"w.bin", "weights old"}});
      else CHECK(got == std::map<std::string, std::string>{{"w.bin", "weights new"}});  // readers refuse weights alone
    }
    write_pair(out, "new");
    auto got = files_in(out);
    CHECK(got["notes.txt"] == "mine");
    got.erase("notes.txt");
    CHECK(got == new_pair);
    CHECK(leftovers(d.path).empty());
  }
}

TEST_CASE("atomic_file_set: a failure leaves the directory as it was, no stage and no directory made") {
  io_dir d;
  const fs::path out = d.path / "made" / "out";
  CHECK_THROWS_WITH_AS(write_pair(out, "new", [](const std::string&) { throw io_error("stop"); }), "io error: stop", io_error);
  CHECK(!fs::exists(d.path / "made"));
  write_pair(out, "old");
  CHECK_THROWS_AS(write_pair(out, "new", [](const std::string& s) { if (s == "exchange") throw io_error("stop"); }), io_error);
  CHECK(files_in(out) == std::map<std::string, std::string>{{"c.json", "config old"}, {"w.bin", "weights old"}});
  CHECK(leftovers(d.path).empty());
  {  // a file the caller did not write: refused, nothing moved
    atomic_file_set set(out, pair_names);
    write_file_atomically(set.stage() / "w.bin", "weights half");
    CHECK_THROWS_WITH_AS(set.commit(), doctest::Contains("c.json' was not written"), io_error);
  }
  CHECK(files_in(out).at("w.bin") == "weights old");
  // A signal handler's remove_live_temporaries() removes the stage with the temporaries in it.
  atomic_file_set set(d.path / "sig", pair_names);
  atomic_file w(set.stage() / "w.bin");
  w.write(std::string_view("half"));
  remove_live_temporaries();
  CHECK(!fs::exists(set.stage()));
  CHECK(!fs::exists(d.path / "sig"));
}
