# Helpers for the project's own CUDA code (tests/gpu, bench/device, examples): never
# installed, never needed by consumers of the header-only library.
#   include(AutoshardCuda)
#   autoshard_enable_cuda()                  # CUDA language, H100/H200 by default
#   autoshard_cuda_kernels(my_kernels)       # shared cudart, warnings as the C++ code
#   target_link_libraries(x PRIVATE ${AUTOSHARD_DEVICE_DEPS})

# CUDA as a language in the calling directory. sm_90 (Hopper: H100, H200) plus its PTX
# unless the caller chose architectures (-DCMAKE_CUDA_ARCHITECTURES=80;90, "native", ...).
macro(autoshard_enable_cuda)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
    set(CMAKE_CUDA_ARCHITECTURES 90)
  endif()
  enable_language(CUDA)
endmacro()

# A target with .cu sources: the shared CUDA runtime (one runtime per process, the one
# CUDA::cudart and NCCL's users link), C++17 device code, and host-compiler warnings.
function(autoshard_cuda_kernels target)
  set_target_properties(${target} PROPERTIES CUDA_RUNTIME_LIBRARY Shared CUDA_STANDARD 17
                        CUDA_STANDARD_REQUIRED ON POSITION_INDEPENDENT_CODE ON)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>
    $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${AUTOSHARD_WERROR}>>:-Werror=all-warnings>)
  target_link_libraries(${target} PUBLIC CUDA::cudart)
endfunction()

# What code using include/autoshard/device needs: the cuda area target where the tensor
# area created it, else the pieces it is made of.
set(AUTOSHARD_DEVICE_DEPS autoshard autoshard_comm CUDA::cudart autoshard_nccl_lib)
foreach(_t autoshard_tensor autoshard_cuda)
  if(TARGET ${_t})
    list(APPEND AUTOSHARD_DEVICE_DEPS ${_t})
  endif()
endforeach()
