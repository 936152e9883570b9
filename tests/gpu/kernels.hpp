#pragma once
// Device kernels of the GPU tests, behind host functions: the .cu file holds no doctest,
// the test files hold no CUDA C++.
#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint16_t

#include <cuda_runtime_api.h>  // cudaStream_t, cudaError_t

namespace autoshard::gpu_test {

/// d[i] = (offset + i) * scale, as float, on `stream`.
cudaError_t fill_labels_f32(float* d, std::size_t n, float offset, float scale, cudaStream_t stream);

/// d[i] = the binary16 (bf16 == false) or bfloat16 bits of (offset + i) * scale, rounded
/// on the device by CUDA's own conversions (__float2half_rn, __float2bfloat16_rn).
cudaError_t fill_labels_half(std::uint16_t* d, std::size_t n, float offset, float scale, bool bf16,
                             cudaStream_t stream);

}  // namespace autoshard::gpu_test
