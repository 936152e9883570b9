// The GPU tests' kernels (see kernels.hpp). No doctest here.
#include <cuda_bf16.h>  // __float2bfloat16_rn, __bfloat16_as_ushort
#include <cuda_fp16.h>  // __float2half_rn, __half_as_ushort

#include "kernels.hpp"

namespace autoshard::gpu_test {
namespace {

__global__ void fill_f32_kernel(float* d, std::size_t n, float offset, float scale) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    d[i] = (offset + static_cast<float>(i)) * scale;
}

__global__ void fill_half_kernel(std::uint16_t* d, std::size_t n, float offset, float scale, bool bf16) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float v = (offset + static_cast<float>(i)) * scale;
    d[i] = bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(v)) : __half_as_ushort(__float2half_rn(v));
  }
}

unsigned grid_for(std::size_t n) {
  const std::size_t blocks = (n + 255) / 256;
  return static_cast<unsigned>(blocks < 4096 ? (blocks == 0 ? 1 : blocks) : 4096);
}

}  // namespace

cudaError_t fill_labels_f32(float* d, std::size_t n, float offset, float scale, cudaStream_t stream) {
  fill_f32_kernel<<<grid_for(n), 256, 0, stream>>>(d, n, offset, scale);
  return cudaGetLastError();
}

cudaError_t fill_labels_half(std::uint16_t* d, std::size_t n, float offset, float scale, bool bf16,
                             cudaStream_t stream) {
  fill_half_kernel<<<grid_for(n), 256, 0, stream>>>(d, n, offset, scale, bf16);
  return cudaGetLastError();
}

}  // namespace autoshard::gpu_test
