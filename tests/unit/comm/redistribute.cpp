// Executing redistribute plans on 8 Gloo ranks (threads): every transition kind on 1-D,
// 2-D and 3-D meshes, even and uneven shapes, Partial sources, tensor dims 0, 1 and 2.
// Each rank's result is compared with the target shard cut from a labelled global tensor
// (value = row-major global index) by an index loop written here, independent of the
// library's block copies. Each run is counted (the mesh communicator's ledger) and must
// issue what core's cost model prices for the same plan.
#include <doctest/doctest.h>

#include <autoshard/gloo/gloo.hpp>

#include <array>
#include <cmath>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

using namespace autoshard;

namespace {

struct rcase {
  const char* src;
  const char* dst;
  tensor_shape global;
};

// A rank's share of `v` on one Partial axis: the shares of a group reduce to v.
std::int64_t share(std::int64_t v, reduce_op op, int axis, int k, int c) {
  const int owner = static_cast<int>(((v % k) + k) % k);
  switch (op) {
    case reduce_op::sum: {
      if (c < k - 1) return ((v * 13 + c * 7 + axis * 5) % 9 + 9) % 9 - 4;
      std::int64_t rest = v;
      for (int j = 0; j < k - 1; ++j) rest -= ((v * 13 + j * 7 + axis * 5) % 9 + 9) % 9 - 4;
      return rest;
    }
    case reduce_op::max: return c == owner ? v : v - 1 - c;
    case reduce_op::min: return c == owner ? v : v + 1 + c;
  }
  return v;
}

// The shard of `rank` under `spec` of the labelled tensor, Partial axes split into shares.
template <class T>
std::vector<T> cut(const device_mesh& m, const sharding_spec& spec, const tensor_shape& g, int rank) {
  const shard_box b = local_box(m, spec, g, rank);
  const auto coord = m.coordinate(rank);
  std::vector<T> out;
  out.reserve(static_cast<std::size_t>(b.shape.numel()));
  std::array<std::int64_t, max_tensor_rank> idx{};
  const std::int64_t n = b.shape.numel();
  for (std::int64_t flat = 0; flat < n; ++flat) {
    // local multi-index of `flat`, then the global label
    std::int64_t rem = flat;
    for (std::size_t d = g.rank; d-- > 0;) {
      idx[d] = rem % b.shape[d];
      rem /= b.shape[d];
    }
    std::int64_t label = 0;
    for (std::size_t d = 0; d < g.rank; ++d) label = label * g[d] + (b.offset[d] + idx[d]);
    std::int64_t v = label;
    for (std::size_t a = 0; a < m.ndim(); ++a)
      if (spec[a].is_partial()) v = share(v, spec[a].op, static_cast<int>(a), m.size(a), coord[a]);
    out.push_back(static_cast<T>(v));
  }
  return out;
}

template <class T>
void run_cases(const device_mesh& mesh, const std::vector<rcase>& cases) {
  std::mutex mu;
  std::vector<std::string> failures;
  run_ranks(mesh.num_ranks(), [&](gloo_communicator& w) {
    mesh_communicator mc(std::move(w), mesh);
    for (const rcase& c : cases) {
      const auto src = parse_spec(c.src, static_cast<int>(mesh.ndim()), c.global.rank);
      const auto dst = parse_spec(c.dst, static_cast<int>(mesh.ndim()), c.global.rank);
      const std::vector<T> in = cut<T>(mesh, src, c.global, mc.rank());
      mc.ledger().clear();
      std::vector<T> got;
      {
        ledger_site counted(mc.ledger(), 0);
        got = redistribute(mc, std::span<const T>(in), c.global, src, dst);
      }
      const std::vector<T> want = cut<T>(mesh, dst, c.global, mc.rank());
      if (mc.rank() == 0) {
        // What ran is what core's cost model prices for this plan: rank 0 holds the pieces the
        // model sizes (coordinate 0), every kind and axis moved the priced elements, padding included.
        std::map<std::pair<std::string, int>, std::int64_t> priced, ran;
        for (const priced_step& p : price_plan(mesh, plan_redistribute(mesh, src, dst, c.global), c.global, dtype_of<T>()))
          if (p.bytes > 0) priced[{std::string(to_string(p.step.kind)), p.step.mesh_axis}] += p.bytes / static_cast<std::int64_t>(sizeof(T));
        for (const issued_collective& e : mc.ledger().entries()) ran[{e.kind, e.mesh_axis}] += static_cast<std::int64_t>(e.elements);
        if (priced != ran) {
          std::ostringstream os;
          os << to_string(mesh) << " " << c.src << " -> " << c.dst << " of " << c.global << ": the collectives issued differ from the priced:";
          for (const auto& [k, n] : priced) os << " priced " << k.first << "@" << k.second << "=" << n;
          for (const auto& [k, n] : ran) os << " ran " << k.first << "@" << k.second << "=" << n;
          std::lock_guard lock(mu);
          failures.push_back(os.str());
        }
      }
      if (got != want) {
        std::ostringstream os;
        os << to_string(mesh) << " " << c.src << " -> " << c.dst << " of " << c.global << ": rank " << mc.rank()
           << " got " << got.size() << " elements, want " << want.size();
        for (std::size_t i = 0; i < std::min(got.size(), want.size()); ++i)
          if (got[i] != want[i]) {
            os << "; first difference at " << i << ": " << got[i] << " vs " << want[i];
            break;
          }
        std::lock_guard lock(mu);
        failures.push_back(os.str());
      }
    }
  });
  for (const auto& f : failures) FAIL_CHECK(f);
  CHECK(failures.empty());
}

}  // namespace

TEST_CASE_TEMPLATE("1-D mesh of 8: every transition kind, even and uneven, dims 0 and 1", T, std::int64_t, float) {
  const device_mesh mesh{8};
  std::vector<rcase> cases;
  for (tensor_shape g : {tensor_shape{16, 6}, tensor_shape{13, 5}, tensor_shape{5, 11}}) {
    for (auto [s, d] : std::vector<std::pair<const char*, const char*>>{
             {"[S(0)]", "[R]"},       {"[S(1)]", "[R]"},       {"[P]", "[R]"},         {"[P(max)]", "[R]"},
             {"[P]", "[S(0)]"},       {"[P]", "[S(1)]"},       {"[P(min)]", "[S(1)]"}, {"[S(0)]", "[S(1)]"},
             {"[S(1)]", "[S(0)]"},    {"[R]", "[S(0)]"},       {"[R]", "[S(1)]"},      {"[R]", "[R]"},
             {"[S(1)]", "[S(1)]"}})
      cases.push_back({s, d, g});
  }
  run_cases<T>(mesh, cases);
}

TEST_CASE("1-D mesh: R -> P leaves the value on coordinate 0 and the identity elsewhere") {
  const device_mesh mesh{4};
  run_ranks(4, [&](gloo_communicator& w) {
    mesh_communicator mc(std::move(w), mesh);
    const tensor_shape g{3, 2};
    const auto full = cut<double>(mesh, parse_spec("[R]", 1, 2), g, mc.rank());
    for (auto [spec, ident] : {std::pair{"[P]", 0.0}, std::pair{"[P(max)]", -HUGE_VAL}, std::pair{"[P(min)]", HUGE_VAL}}) {
      auto got = redistribute(mc, std::span<const double>(full), g, parse_spec("[R]", 1, 2), parse_spec(spec, 1, 2));
      for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == (mc.rank() == 0 ? full[i] : ident));
      // and back: reducing the Partial gives the original everywhere
      auto back = redistribute(mc, std::span<const double>(got), g, parse_spec(spec, 1, 2), parse_spec("[R]", 1, 2));
      CHECK(back == full);
    }
  });
}

TEST_CASE_TEMPLATE("2-D mesh 2x4: nested, mixed and Partial transitions", T, std::int64_t, float) {
  const device_mesh mesh{2, 4};
  std::vector<rcase> cases;
  for (tensor_shape g : {tensor_shape{8, 12}, tensor_shape{7, 5}, tensor_shape{3, 10}}) {
    for (auto [s, d] : std::vector<std::pair<const char*, const char*>>{
             {"[S(0),S(1)]", "[R,R]"},      {"[S(0),S(0)]", "[R,R]"},      {"[S(0),S(0)]", "[S(1),R]"},
             {"[S(0),S(1)]", "[S(1),S(0)]"}, {"[S(1),S(0)]", "[S(0),S(1)]"}, {"[P,S(0)]", "[S(1),S(0)]"},
             {"[R,P]", "[S(0),S(1)]"},      {"[P,P]", "[R,S(1)]"},          {"[P,P]", "[S(0),S(0)]"},
             {"[R,R]", "[S(1),S(1)]"},      {"[S(1),R]", "[R,S(1)]"},       {"[S(0),S(1)]", "[S(0),S(0)]"},
             {"[P(max),S(1)]", "[S(0),R]"}, {"[R,S(0)]", "[S(0),R]"}})
      cases.push_back({s, d, g});
  }
  run_cases<T>(mesh, cases);
}

TEST_CASE("hierarchical reductions run as planned: reduce-scatter on the fast axis, all-reduce, all-gather") {
  // Equal links: the inner axis is the fast one. Swapped links: axis 0 is, and the plan
  // scatters there first. Both must give every rank its target shard.
  device_mesh inner_fast{2, 4}, outer_fast{2, 4};
  outer_fast.set_link(0, {5e-6, 300e9}).set_link(1, {2e-5, 25e9});
  const std::vector<std::pair<const char*, const char*>> pairs{
      {"[P,P]", "[R,R]"},       {"[P(max),P(max)]", "[R,R]"}, {"[P,P]", "[S(0),S(0)]"}, {"[P,P]", "[S(1),R]"},
      {"[P,P]", "[R,S(0)]"},    {"[P(min),P(min)]", "[S(0),S(1)]"}};
  for (const device_mesh& mesh : {inner_fast, outer_fast}) {
    std::vector<rcase> cases;
    for (tensor_shape g : {tensor_shape{8, 12}, tensor_shape{9, 5}})
      for (auto [s, d] : pairs) cases.push_back({s, d, g});
    // The plans really are hierarchical: the first step reduce-scatters the fast axis.
    const redist_plan p = plan_redistribute(mesh, parse_spec("[P,P]", 2, 2), parse_spec("[R,R]", 2, 2), tensor_shape{8, 12});
    REQUIRE(p.size() == 3);
    CHECK(p[0].kind == collective::reduce_scatter);
    CHECK(static_cast<int>(p[0].mesh_axis) == axes_fastest_first(mesh)[0]);
    run_cases<std::int64_t>(mesh, cases);
  }
  const device_mesh m3{2, 2, 2};
  run_cases<std::int64_t>(m3, {{"[P,P,P]", "[R,R,R]", {4, 6, 2}}, {"[P,P,R]", "[R,S(1),R]", {5, 6, 4}},
                               {"[P,R,P]", "[S(2),R,S(0)]", {4, 3, 8}}});
}

TEST_CASE("3-D mesh 2x2x2: rank-3 tensors, dims 0, 1 and 2") {
  const device_mesh mesh{2, 2, 2};
  std::vector<rcase> cases;
  for (tensor_shape g : {tensor_shape{4, 6, 2}, tensor_shape{5, 3, 7}}) {
    for (auto [s, d] : std::vector<std::pair<const char*, const char*>>{
             {"[S(0),S(1),P]", "[R,S(0),S(2)]"},     {"[S(0),S(0),S(0)]", "[R,R,R]"},
             {"[S(2),R,S(0)]", "[S(0),S(2),R]"},     {"[P,P,P]", "[S(2),S(1),S(0)]"},
             {"[R,R,R]", "[S(1),S(1),S(2)]"},        {"[S(1),S(2),S(0)]", "[S(2),S(0),S(1)]"},
             {"[S(2),S(2),R]", "[R,S(2),S(2)]"},     {"[P(max),R,S(1)]", "[S(1),R,R]"}})
      cases.push_back({s, d, g});
  }
  run_cases<std::int64_t>(mesh, cases);
}

TEST_CASE("redistribute rejects a shard of the wrong size, naming the shapes") {
  const device_mesh mesh{2};
  run_ranks(2, [&](gloo_communicator& w) {
    mesh_communicator mc(std::move(w), mesh);
    std::vector<float> wrong(5);
    CHECK_THROWS_WITH_AS(redistribute(mc, std::span<const float>(wrong), tensor_shape{4, 3}, parse_spec("[S(0)]", 1, 2),
                                      parse_spec("[R]", 1, 2)),
                         doctest::Contains("expects a local shard [2,3]"), shape_error);
  });
}
