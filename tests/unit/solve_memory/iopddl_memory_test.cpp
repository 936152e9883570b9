// The IOPDDL reader's memory bound (iopddl_bytes_per_byte, solve/iopddl.hpp), measured: the
// heap a read holds at its peak, per byte of text, for the worst shapes the bound's derivation
// names. An executable of its own, because it replaces the global operator new to count: the
// other unit tests keep ASan's own new and delete (and its checks that they pair up).
#include <doctest/doctest.h>

#include <autoshard/solve/iopddl.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <sstream>
#include <string>

namespace {

std::atomic<bool> counting{false};
std::atomic<std::uint64_t> live{0}, peak{0};

/// What glibc's malloc takes for a request of n bytes on 64-bit Linux: n + 8 rounded up to 16,
/// at least 32; from 128 KiB (its mmap threshold) n + 16 rounded up to a page. The bound is
/// about the heap of a build without sanitizers, whatever allocator runs this test.
constexpr std::uint64_t chunk(std::size_t n) {
  if (n >= (std::size_t{128} << 10)) return (n + 16 + 4095) & ~std::uint64_t{4095};
  return std::max<std::uint64_t>(32, (n + 8 + 15) & ~std::uint64_t{15});
}

/// Before each block: its size and whether it was counted (16 bytes keep new's alignment).
struct header {
  std::size_t size;
  std::size_t counted;
};
static_assert(sizeof(header) == 16);

void* allocate(std::size_t n) {
  for (;;) {
    if (void* p = std::malloc(n + sizeof(header))) {
      const bool c = counting.load();
      *static_cast<header*>(p) = {n, c ? std::size_t{1} : std::size_t{0}};
      if (c) {
        const std::uint64_t now = live.fetch_add(chunk(n)) + chunk(n);
        std::uint64_t seen = peak.load();
        while (now > seen && !peak.compare_exchange_weak(seen, now)) {
        }
      }
      return static_cast<header*>(p) + 1;
    }
    if (std::new_handler h = std::get_new_handler()) h();
    else throw std::bad_alloc();
  }
}

void release(void* q) noexcept {
  if (q == nullptr) return;
  header* h = static_cast<header*>(q) - 1;
  if (h->counted != 0) live.fetch_sub(chunk(h->size));
  std::free(h);
}

/// The peak of the counted heap while `read` runs (what it returns included), per byte of `text`.
template <class Read>
double peak_per_byte(const std::string& text, Read read) {
  std::istringstream in(text);  // its copy of the text is the caller's, not the reader's
  live = 0;
  peak = 0;
  counting = true;
  try {
    const autoshard::strategy_problem p = read(in);
    counting = false;
  } catch (...) {
    counting = false;
    throw;
  }
  return static_cast<double>(peak.load()) / static_cast<double>(text.size());
}

double read_peak(const std::string& text) {
  return peak_per_byte(text, [](std::istream& in) { return autoshard::read_iopddl(in, "worst"); });
}

/// An invalid text's peak until the reader refuses it (at the end, where counts are compared).
double refused_peak(const std::string& text) {
  return peak_per_byte(text, [](std::istream& in) {
    CHECK_THROWS_AS((void)autoshard::read_iopddl(in, "worst"), autoshard::io_error);
    return autoshard::strategy_problem{};
  });
}

std::string repeat(const std::string& item, std::size_t n) {
  std::string s = "[";
  s.reserve(n * (item.size() + 1) + 2);
  for (std::size_t i = 0; i < n; ++i) (s += i ? "," : "") += item;
  return s + "]";
}

constexpr std::size_t many = 60000;  // about 840 KB of text a shape

}  // namespace

void* operator new(std::size_t n) { return allocate(n); }
void* operator new[](std::size_t n) { return allocate(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return allocate(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return allocate(n);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { release(p); }
void operator delete[](void* p) noexcept { release(p); }
void operator delete(void* p, std::size_t) noexcept { release(p); }
void operator delete[](void* p, std::size_t) noexcept { release(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { release(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { release(p); }

TEST_CASE("IOPDDL reads keep at most iopddl_bytes_per_byte bytes a byte of text, measured on the worst shapes") {
  const auto bound = static_cast<double>(autoshard::iopddl_bytes_per_byte);
  const std::string no_edges = R"("edges":{"nodes":[],"costs":[]})";
  const std::string intervals = R"("intervals":)" + repeat("[0,0]", many), costs = R"("costs":)" + repeat("[0]", many),
                    usages = R"("usages":)" + repeat("[0]", many);
  // One-strategy nodes in the fewest bytes: the worst shape, which the bound is derived from.
  const double tiny_nodes = read_peak(R"({"problem":{"nodes":{)" + costs + "," + intervals + "," + usages + "}," + no_edges + "}}");
  const double reversed = read_peak(R"({"problem":{)" + no_edges + R"(,"nodes":{)" + usages + "," + intervals + "," + costs + "}}}");
  const double named = read_peak(R"({"problem":{"nodes":{)" + costs + "," + intervals + R"(,"names":)" + repeat(R"("")", many) +
                                 "," + usages + "}," + no_edges + "}}");
  // One-strategy edges of one node, and one node of many one-digit strategies.
  const double tiny_edges = read_peak(R"({"problem":{"edges":{"nodes":)" + repeat("[0,0]", many) + R"(,"costs":)" +
                                      repeat("[0]", many) + R"(},"nodes":{"intervals":[[0,1]],"costs":[[0]],"usages":[[0]]}}})");
  const std::string digits = repeat("0", 4 * many);
  const double long_arrays = read_peak(R"({"problem":{"nodes":{"intervals":[[0,1]],"costs":[)" + digits + R"(],"usages":[)" +
                                       digits + "]}," + no_edges + "}}");
  // Lists refused only when the document ends (their counts disagree): what they held until then.
  const double names_only = refused_peak(R"({"problem":{"nodes":{"names":)" + repeat(R"("")", many) + "}}}");
  const double usages_only = refused_peak(R"({"problem":{"nodes":{"usages":)" + repeat("[0]", many) + "}}}");
  const double empty_lists = refused_peak(R"({"problem":{"edges":{"costs":)" + repeat("[]", many) + "}}}");
  MESSAGE("peak heap per byte of text: tiny nodes " << tiny_nodes << " (lists reversed " << reversed << ", named " << named
                                                    << "), tiny edges " << tiny_edges << ", long arrays " << long_arrays
                                                    << ", names only " << names_only << ", usages only " << usages_only
                                                    << ", empty cost lists " << empty_lists << "; the bound " << bound);
  for (const double r : {tiny_nodes, reversed, named, tiny_edges, long_arrays, names_only, usages_only, empty_lists}) CHECK(r <= bound);
  // The bound is the worst shape's, not far above it: a looser one refuses files that fit.
  CHECK(std::max(tiny_nodes, reversed) > bound - 1.5);
}
