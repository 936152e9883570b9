// Moving shards to CUDA devices with explicit device ids, then reassembling them with NCCL.
//
//   example_cuda_placement [device ids...]     e.g.  example_cuda_placement 0 0 1 1
//
// A [12, 8] f32 weight labelled with its global indices is cut for a 2x2 mesh with spec
// "S0S1" (rows over mesh axis 0, columns over axis 1). Rank r's shard goes to the device
// named by the r-th id on the command line (default: r % device count); several ranks may
// share a device for placement (autoshard::upload: pinned staging, one stream per device).
// Each shard is copied back and compared bit for bit.
// Then one rank per device (up to 8) joins an NCCL world, uploads its row block of a
// "S0R" weight to its own device and all-gathers the full weight there, which must equal
// the host tensor. Without a CUDA device or driver it says so and exits 0.
#include <cstdio>     // std::printf
#include <cstdlib>    // std::strtol
#include <cstring>    // std::memcmp
#include <exception>  // std::exception
#include <string>     // std::string
#include <thread>     // std::thread
#include <vector>     // std::vector

#include <autoshard/autoshard.hpp>          // device_mesh, parse_spec
#include <autoshard/device/nccl.hpp>        // nccl_communicator, nccl_memory_store
#include <autoshard/device/placement.hpp>   // upload, device_tensor
#include <autoshard/tensor/tensor.hpp>      // host_tensor, shard_of

namespace {

autoshard::host_tensor labelled(std::int64_t rows, std::int64_t cols) {
  autoshard::host_tensor t(autoshard::dtype::f32, {rows, cols});
  float* p = t.as<float>();
  for (std::int64_t i = 0; i < rows * cols; ++i) p[i] = static_cast<float>(i);
  return t;
}

int place_shards(int devices, const std::vector<int>& ids) {
  using namespace autoshard;
  const device_mesh mesh{2, 2};
  const sharding_spec spec = parse_spec("S0S1", static_cast<int>(mesh.ndim()), 2);
  const host_tensor global = labelled(12, 8);
  std::printf("placing %s shards of a [12, 8] f32 weight on %s:\n", to_string(spec).c_str(), to_string(mesh).c_str());
  for (int r = 0; r < mesh.num_ranks(); ++r) {
    const int device = r < static_cast<int>(ids.size()) ? ids[static_cast<std::size_t>(r)] : r % devices;
    if (device < 0 || device >= devices)
      throw device_error("rank " + std::to_string(r) + ": device id " + std::to_string(device) + " asked for, but " +
                         std::to_string(devices) + " CUDA devices are visible");
    const host_tensor shard = shard_of(global.view(), mesh, spec, r);
    const device_tensor on_device = upload(shard.view(), device);  // explicit device id
    const bool same = bitwise_equal(on_device.download().view(), shard.view());
    std::printf("  rank %d -> cuda:%d  shard %s, first label %g: %s\n", r, device, to_string(shard.shape()).c_str(),
                static_cast<double>(shard.as<float>()[0]), same ? "identical after the round trip" : "DIFFERENT");
    if (!same) return 1;
  }
  return 0;
}

int gather_with_nccl(int devices) {
  using namespace autoshard;
  const int n = devices < 8 ? devices : 8;
  const device_mesh mesh{n};
  const sharding_spec spec = parse_spec("S0R", 1, 2);
  const host_tensor global = labelled(4 * n + 1, 8);  // uneven on purpose: the last rank holds fewer rows
  const std::int64_t rows_per_rank = (global.shape()[0] + n - 1) / n;
  std::printf("all-gathering a [%lld, 8] f32 weight sharded %s over %d rank(s), one per device:\n",
              static_cast<long long>(global.shape()[0]), to_string(spec).c_str(), n);
  nccl_memory_store store;
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r)
    ranks.emplace_back([&, r] {
      try {
        nccl_communicator comm = nccl_communicator::connect(store, r, n, {.device = r});
        // Pad each shard to ceil(rows / n) rows for the collective, as the redistribute plans do.
        const host_tensor shard = shard_of(global.view(), mesh, spec, r);
        host_tensor padded(dtype::f32, {rows_per_rank, 8});
        std::memcpy(padded.data(), shard.data(), shard.nbytes());
        const device_tensor in = upload(padded.view(), comm.device());
        const device_tensor out(comm.device(), dtype::f32, {rows_per_rank * n, 8});
        comm.all_gather(in.data(), out.data(), static_cast<std::size_t>(padded.numel()), dtype::f32);
        const host_tensor back = out.download();
        if (std::memcmp(back.data(), global.data(), global.nbytes()) != 0)
          throw comm_error("rank " + std::to_string(r) + ": the gathered weight differs from the host weight");
        std::printf("  rank %d on cuda:%d: gathered weight identical to the host weight\n", r, comm.device());
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  for (const auto& e : errors)
    if (!e.empty()) {
      std::fprintf(stderr, "%s\n", e.c_str());
      return 1;
    }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int devices = autoshard::nccl_communicator::device_count();
  if (devices == 0) {
    std::printf("no CUDA device (or driver) is visible: nothing to place. This example moves shards to GPUs "
                "and exits 0 here.\n");
    return 0;
  }
  std::vector<int> ids;
  for (int i = 1; i < argc; ++i) {
    char* end = nullptr;
    const long v = std::strtol(argv[i], &end, 10);
    if (end == argv[i] || *end != '\0') {
      std::fprintf(stderr, "usage: %s [device id for rank 0] [rank 1] ...  ('%s' is not a device id)\n", argv[0], argv[i]);
      return 2;
    }
    ids.push_back(static_cast<int>(v));
  }
  try {
    std::printf("%d CUDA device(s) visible, NCCL %d\n", devices, autoshard::nccl_communicator::library_version());
    if (int rc = place_shards(devices, ids); rc != 0) return rc;
    return gather_with_nccl(devices);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
