// The NCCL backend on shards the device area placed (autoshard::upload): one rank per
// visible GPU gathers, reduces and scatters real shards, and the results equal the host
// tensor's shards (tensor/slice.hpp) bit for bit.
#include <doctest/doctest.h>

#include <cstring>  // std::memcpy
#include <string>   // std::string
#include <vector>   // std::vector

#include <autoshard/autoshard.hpp>          // device_mesh, parse_spec
#include <autoshard/device/nccl.hpp>        // nccl_communicator
#include <autoshard/device/placement.hpp>   // upload, device_tensor
#include <autoshard/tensor/tensor.hpp>      // host_tensor, shard_of

#include "gpu_test_util.hpp"  // run_device_ranks, first_error, test_ranks

using namespace autoshard;
using namespace autoshard::gpu_test;

namespace {
host_tensor labelled(dtype t, tensor_shape s, float scale) {
  host_tensor f(dtype::f32, s);
  float* p = f.as<float>();
  for (std::int64_t i = 0; i < f.numel(); ++i) p[i] = static_cast<float>(i) * scale;
  return t == dtype::f32 ? std::move(f) : convert(f.view(), t);
}
}  // namespace

TEST_CASE("nccl + placement: uneven S0 shards all-gather back into the global tensor on every device") {
  const int n = test_ranks();
  const device_mesh mesh{n};
  const sharding_spec spec = parse_spec("S0R", 1, 2);
  for (dtype t : {dtype::f32, dtype::bf16, dtype::f16}) {
    CAPTURE(to_string(t));
    const host_tensor global = labelled(t, {3 * n + 2, 5}, 0.5f);  // rows do not divide: the last ranks hold fewer
    const std::int64_t c = (global.shape()[0] + n - 1) / n;        // padded rows per rank, as the plans pad
    auto errors = run_device_ranks(n, [&](nccl_communicator& comm) {
      const host_tensor shard = shard_of(global.view(), mesh, spec, comm.rank());
      host_tensor padded(t, {c, 5});
      std::memcpy(padded.data(), shard.data(), shard.nbytes());
      const device_tensor in = upload(padded.view(), comm.device());
      if (!bitwise_equal(in.download().view(), padded.view())) throw device_error(comm.who() + ": upload differs");
      const device_tensor out(comm.device(), t, {c * n, 5});
      comm.all_gather(in.data(), out.data(), static_cast<std::size_t>(padded.numel()), t);
      const host_tensor back = out.download();
      if (std::memcmp(back.data(), global.data(), global.nbytes()) != 0)
        throw comm_error(comm.who() + ": the gathered tensor differs from the global one");
    });
    CHECK_MESSAGE(first_error(errors).empty(), first_error(errors));
  }
}

TEST_CASE("nccl + placement: Partial(sum) replicas reduce-scatter into the S0 shards of the sum") {
  const int n = test_ranks();
  const device_mesh mesh{n};
  const sharding_spec spec = parse_spec("S0R", 1, 2);
  const tensor_shape shape{4 * static_cast<std::int64_t>(n), 6};
  // Rank r holds (r + 1) * labels: small integers, so every sum is exact in f32.
  std::vector<host_tensor> partial;
  for (int r = 0; r < n; ++r) partial.push_back(labelled(dtype::f32, shape, static_cast<float>(r + 1)));
  const host_tensor sum = labelled(dtype::f32, shape, static_cast<float>(n * (n + 1) / 2));
  auto errors = run_device_ranks(n, [&](nccl_communicator& comm) {
    const device_tensor in = upload(partial[static_cast<std::size_t>(comm.rank())].view(), comm.device());
    const host_tensor want = shard_of(sum.view(), mesh, spec, comm.rank());
    const device_tensor out(comm.device(), dtype::f32, want.shape());
    comm.reduce_scatter(in.data(), out.data(), static_cast<std::size_t>(want.numel()), dtype::f32, reduce_op::sum);
    if (!bitwise_equal(out.download().view(), want.view()))
      throw comm_error(comm.who() + ": the reduce-scattered shard differs from the host shard of the sum");
  });
  CHECK_MESSAGE(first_error(errors).empty(), first_error(errors));
}
