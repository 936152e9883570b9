#pragma once
/// dtype conversion on a CUDA device, for a header-only library: the kernel is PTX text
/// below, which the driver compiles for the device in hand the first time it is needed
/// (cudaLibraryLoadData; no nvcc in the user's build). Conversions between f32, f16 and
/// bf16, bit for bit the host's (convert_into: round to nearest even, overflow to
/// infinity; a NaN becomes the quiet NaN of its sign, 0x7e00 / 0x7fc0 with the sign bit;
/// f16 and bf16 NaNs widen with their payloads).
///   if (autoshard::device_converts(dtype::f32, dtype::bf16))
///     autoshard::convert_on_device(src, dtype::f32, dst, dtype::bf16, n, stream);
/// Uploads (device/placement.hpp) use it to move the source bytes over PCIe and convert
/// in device memory, where that is faster than converting on the host.
#include <algorithm>  // std::min
#include <cstddef>    // std::size_t
#include <string>     // std::string

#include <cuda_runtime_api.h>  // cudaLibraryLoadData, cudaLibraryGetKernel, cudaLaunchKernel

#include "../core/dtype.hpp"  // dtype

namespace autoshard {

namespace detail {

/// autoshard_convert(src, dst, n, from, to): dst[i] = src[i] converted, i < n, in a grid-
/// stride loop; dtype codes 0 = f32, 1 = f16, 2 = bf16. Every element goes through its
/// float bits: f16 widens by cvt.f32.f16 (exact) except NaNs, which keep their payload
/// (sign | 0x7f800000 | mantissa << 13, as the host does); bf16 widens by a shift; to bf16
/// rounds the bits to nearest even (x + 0x7fff + lsb) >> 16, NaN -> sign | 0x7fc0; to f16
/// is cvt.rn.f16.f32, NaN -> sign | 0x7e00. Targets sm_70 and newer (PTX ISA 7.0).
inline constexpr const char* convert_ptx = R"ptx(
.version 7.0
.target sm_70
.address_size 64

.visible .entry autoshard_convert(
  .param .u64 p_src, .param .u64 p_dst, .param .u64 p_n, .param .u32 p_from, .param .u32 p_to)
{
  .reg .pred %p<2>;
  .reg .b16 %h<3>;
  .reg .b32 %r<8>;
  .reg .f32 %f<2>;
  .reg .b64 %d<6>;

  ld.param.u64 %d0, [p_src];
  ld.param.u64 %d1, [p_dst];
  ld.param.u64 %d2, [p_n];
  ld.param.u32 %r0, [p_from];
  ld.param.u32 %r1, [p_to];
  cvta.to.global.u64 %d0, %d0;
  cvta.to.global.u64 %d1, %d1;
  mov.u32 %r2, %ctaid.x;
  mov.u32 %r3, %ntid.x;
  mul.wide.u32 %d3, %r2, %r3;
  mov.u32 %r2, %tid.x;
  cvt.u64.u32 %d4, %r2;
  add.u64 %d3, %d3, %d4;          // i
  mov.u32 %r2, %nctaid.x;
  mul.wide.u32 %d4, %r2, %r3;     // the grid's stride
LOOP:
  setp.ge.u64 %p0, %d3, %d2;
  @%p0 bra DONE;
  // element i as float bits in %r4
  setp.eq.u32 %p0, %r0, 0;
  @!%p0 bra LOAD16;
  shl.b64 %d5, %d3, 2;
  add.u64 %d5, %d0, %d5;
  ld.global.u32 %r4, [%d5];
  bra STORE;
LOAD16:
  shl.b64 %d5, %d3, 1;
  add.u64 %d5, %d0, %d5;
  ld.global.u16 %h0, [%d5];
  cvt.u32.u16 %r5, %h0;
  shl.b32 %r4, %r5, 16;           // bf16: the float's high half
  setp.eq.u32 %p0, %r0, 2;
  @%p0 bra STORE;
  cvt.f32.f16 %f0, %h0;           // f16: exact, but a NaN keeps its payload
  mov.b32 %r4, %f0;
  and.b32 %r6, %r5, 0x7fff;
  setp.gt.u32 %p1, %r6, 0x7c00;
  and.b32 %r6, %r5, 0x8000;
  shl.b32 %r6, %r6, 16;
  and.b32 %r7, %r5, 0x3ff;
  shl.b32 %r7, %r7, 13;
  or.b32 %r6, %r6, %r7;
  or.b32 %r6, %r6, 0x7f800000;
  selp.b32 %r4, %r6, %r4, %p1;
STORE:
  setp.eq.u32 %p0, %r1, 0;
  @!%p0 bra STORE16;
  shl.b64 %d5, %d3, 2;
  add.u64 %d5, %d1, %d5;
  st.global.u32 [%d5], %r4;
  bra NEXT;
STORE16:
  and.b32 %r5, %r4, 0x7fffffff;
  setp.gt.u32 %p1, %r5, 0x7f800000; // NaN
  shr.u32 %r6, %r4, 16;
  and.b32 %r6, %r6, 0x8000;         // its sign, as 16 bits
  setp.eq.u32 %p0, %r1, 2;
  @!%p0 bra F16;
  shr.u32 %r7, %r4, 16;             // bf16: round the bits to nearest even
  and.b32 %r7, %r7, 1;
  add.u32 %r7, %r7, 0x7fff;
  add.u32 %r7, %r4, %r7;
  shr.u32 %r7, %r7, 16;
  or.b32 %r5, %r6, 0x7fc0;
  selp.b32 %r7, %r5, %r7, %p1;
  cvt.u16.u32 %h1, %r7;
  bra ST16;
F16:
  mov.b32 %f1, %r4;
  cvt.rn.f16.f32 %h1, %f1;
  or.b32 %r5, %r6, 0x7e00;
  cvt.u16.u32 %h2, %r5;
  selp.b16 %h1, %h2, %h1, %p1;
ST16:
  shl.b64 %d5, %d3, 1;
  add.u64 %d5, %d1, %d5;
  st.global.u16 [%d5], %h1;
NEXT:
  add.u64 %d3, %d3, %d4;
  bra LOOP;
DONE:
  ret;
}
)ptx";

/// The kernel's code for `t`; -1 for a dtype it does not convert.
constexpr int convert_code(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return 0;
    case dtype::f16: return 1;
    case dtype::bf16: return 2;
    default: return -1;
  }
}

struct conversion_kernel {
#if CUDART_VERSION >= 12000
  cudaKernel_t kernel = nullptr;
#else
  const void* kernel = nullptr;
#endif
  std::string unavailable;  ///< why not, when kernel is null
};

/// The kernel, loaded once per process (the driver compiles the PTX for each device on
/// first launch there); a failure is kept with its reason, and conversions stay on the host.
inline const conversion_kernel& device_conversion_kernel() {
  static const conversion_kernel k = [] {
    conversion_kernel r;
#if CUDART_VERSION >= 12000
    cudaLibrary_t lib = nullptr;
    cudaError_t e = cudaLibraryLoadData(&lib, convert_ptx, nullptr, nullptr, 0, nullptr, nullptr, 0);
    const char* step = "cudaLibraryLoadData";
    if (e == cudaSuccess) {
      step = "cudaLibraryGetKernel";
      e = cudaLibraryGetKernel(&r.kernel, lib, "autoshard_convert");
    }
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      r.kernel = nullptr;
      r.unavailable = std::string(step) + " of the conversion kernel failed (" + cudaGetErrorName(e) + ": " +
                      cudaGetErrorString(e) + ")";
    }
#else
    r.unavailable = "the CUDA runtime is older than 12.0 (no cudaLibraryLoadData)";
#endif
    return r;
  }();
  return k;
}

}  // namespace detail

/// True when the device can convert `from` to `to` (both f32, f16 or bf16, and the
/// kernel loaded); device_conversion_error() says why not when the kernel did not.
inline bool device_converts(dtype from, dtype to) {
  return detail::convert_code(from) >= 0 && detail::convert_code(to) >= 0 &&
         detail::device_conversion_kernel().kernel != nullptr;
}

/// Why the conversion kernel is not available ("" when it is).
inline const std::string& device_conversion_error() { return detail::device_conversion_kernel().unavailable; }

/// Queues the conversion of `n` elements at `src` (device memory, `from`) into `dst`
/// (device memory, `to`, not overlapping) on `stream`, whose device must be current.
/// Returns the launch's error; cudaErrorNotSupported when !device_converts(from, to).
inline cudaError_t convert_on_device(const void* src, dtype from, void* dst, dtype to, std::size_t n,
                                     cudaStream_t stream) {
  if (!device_converts(from, to)) return cudaErrorNotSupported;
  if (n == 0) return cudaSuccess;
  unsigned long long count = n;
  unsigned from_code = static_cast<unsigned>(detail::convert_code(from));
  unsigned to_code = static_cast<unsigned>(detail::convert_code(to));
  void* args[] = {const_cast<void*>(static_cast<const void*>(&src)), static_cast<void*>(&dst), &count, &from_code,
                  &to_code};
  const unsigned threads = 256;
  const auto blocks = static_cast<unsigned>(std::min<std::size_t>((n + threads - 1) / threads, 4096));
  return cudaLaunchKernel(static_cast<const void*>(detail::device_conversion_kernel().kernel), dim3(blocks),
                          dim3(threads), args, 0, stream);
}

}  // namespace autoshard
