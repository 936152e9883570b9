// Redistributing host tensors (exec/redistribute.hpp) on 4 Gloo ranks: for every dtype, the
// result equals the tensor area's own cut (shard_of) of the global tensor.
#include <doctest/doctest.h>

#include <autoshard/exec/exec.hpp>
#include <autoshard/gloo/gloo.hpp>
#include <autoshard/tensor/tensor.hpp>

#include <mutex>
#include <string>
#include <utility>
#include <vector>

using namespace autoshard;

TEST_CASE("host tensors of any dtype: the result equals the tensor area's own cut of the global tensor") {
  const device_mesh mesh{2, 2};
  const tensor_shape g{7, 5};
  host_tensor global32(dtype::f32, g);
  for (std::int64_t i = 0; i < g.numel(); ++i) global32.as<float>()[i] = static_cast<float>(i);  // exact in bf16
  for (dtype t : {dtype::f32, dtype::bf16, dtype::f16, dtype::f64}) {
    const host_tensor global = convert(global32.view(), t);
    std::mutex mu;
    std::vector<std::string> failures;
    run_ranks(4, [&](gloo_communicator& w) {
      mesh_communicator mc(std::move(w), mesh);
      for (auto [s, d] : {std::pair{"S01R", "RS01"}, std::pair{"S1S0", "S0S1"}, std::pair{"RS0", "S1R"}}) {
        const auto src = parse_spec(s, 2, 2), dst = parse_spec(d, 2, 2);
        const host_tensor in = shard_of(global.view(), mesh, src, mc.rank());
        const host_tensor out = redistribute(mc, in.view(), g, src, dst);
        if (!bitwise_equal(out.view(), shard_of(global.view(), mesh, dst, mc.rank()).view())) {
          std::lock_guard l(mu);
          failures.push_back(std::string(to_string(t)) + " " + s + " -> " + d + " on rank " + std::to_string(mc.rank()));
        }
      }
    });
    for (const auto& f : failures) FAIL_CHECK(f);
    CHECK(failures.empty());
  }
}
