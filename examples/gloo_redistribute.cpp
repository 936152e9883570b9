// Eight ranks (threads) on a 2x4 mesh over loopback Gloo: a [13, 6] weight sharded "S0R"
// (uneven: 13 rows over 2) becomes "RS1" (6 columns over 4, uneven), every rank checks its
// shard against the one cut straight from the global tensor, and a tensor-parallel layer
// pair runs forward on the 4-rank axis groups.
#include <autoshard/exec/parallel.hpp>
#include <autoshard/gloo/gloo.hpp>

#include <cstdio>
#include <mutex>
#include <vector>

using namespace autoshard;

int main() {
  const device_mesh mesh{2, 4};
  const tensor_shape global{13, 6};
  // Alpa notation: per tensor dim, the mesh axes that split it.
  const sharding_spec src = parse_spec("S0R", 2, 2), dst = parse_spec("RS1", 2, 2);
  std::printf("plan on %s:\n", to_string(mesh).c_str());
  for (const redist_step& s : plan_redistribute(mesh, src, dst))
    std::printf("  axis %d: %s %s -> %s\n", int(s.mesh_axis), std::string(to_string(s.kind)).c_str(),
                to_string(s.from).c_str(), to_string(s.to).c_str());

  // The global tensor: value = row-major index.
  auto value = [&](std::int64_t i, std::int64_t j) { return static_cast<float>(i * global[1] + j); };
  std::mutex mu;
  int wrong = 0;
  run_ranks(mesh.num_ranks(), [&](gloo_communicator& world) {
    mesh_communicator mc(std::move(world), mesh);
    auto cut = [&](const sharding_spec& s) {
      const shard_box b = local_box(mesh, s, global, mc.rank());
      std::vector<float> v;
      for (std::int64_t i = 0; i < b.shape[0]; ++i)
        for (std::int64_t j = 0; j < b.shape[1]; ++j) v.push_back(value(b.offset[0] + i, b.offset[1] + j));
      return v;
    };
    const std::vector<float> mine = cut(src);
    const std::vector<float> out = redistribute(mc, std::span<const float>(mine), global, src, dst);

    // Megatron MLP half on the 4-rank axis: column-parallel then row-parallel.
    auto& tp = mc.axis(1);
    tp_matrix<float> x = tp_matrix<float>::Constant(2, 6, 0.5f);
    tp_matrix<float> w1 = tp_matrix<float>::Identity(8, 6), w2 = tp_matrix<float>::Identity(6, 8);
    auto fc1 = column_parallel_linear<float>::from_full(w1, tp_row<float>::Zero(8), tp.rank(), tp.size());
    auto fc2 = row_parallel_linear<float>::from_full(w2, tp_row<float>::Zero(6), tp.rank(), tp.size());
    const tp_matrix<float> y = fc2.forward(tp, fc1.forward(tp, x));  // identity network: y == x

    std::lock_guard lock(mu);
    if (out != cut(dst) || !y.isApprox(x)) ++wrong;
    std::printf("rank %d: %zu -> %zu elements, %s\n", mc.rank(), mine.size(), out.size(),
                out == cut(dst) ? "matches the global tensor" : "WRONG");
  });
  std::printf("%s\n", wrong == 0 ? "all ranks correct" : "some ranks wrong");
  return wrong == 0 ? 0 : 1;
}
