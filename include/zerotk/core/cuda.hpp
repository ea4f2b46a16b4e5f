#pragma once
/// \file zerotk/core/cuda.hpp
/// CUDA runtime error handling (target zerotk::cuda). Errors become zerotk exceptions naming the
/// call and the CUDA error; the sticky "last error" is cleared first so a previous failure is not
/// blamed on this call.

#include "zerotk/core/macros.hpp"

// nvcc always has the runtime; a host compiler only where the build says so.
#if !ZEROTK_HAS_CUDA && !defined(__CUDACC__)
#error "zerotk/core/cuda.hpp needs the CUDA runtime: link the CMake target zerotk::cuda (it defines ZEROTK_HAS_CUDA=1), or, in a vendored copy, define ZEROTK_HAS_CUDA=1, add the CUDA include path and link -lcudart"
#endif

#include <string>

#include <cuda_runtime_api.h>

#include "zerotk/core/error.hpp"

namespace zerotk::cuda {

inline void check(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();
  throw usage_error(std::string(call) + " failed: " + cudaGetErrorString(status),
                    std::string(file) + ":" + std::to_string(line), cudaGetErrorName(status));
}

/// True when at least one CUDA device can be used by this process.
inline bool device_usable() {
  int n = 0;
  cudaError_t s = cudaGetDeviceCount(&n);
  if (s != cudaSuccess) (void)cudaGetLastError();
  return s == cudaSuccess && n > 0;
}

}  // namespace zerotk::cuda

#define ZEROTK_CUDA_CHECK(expr) ::zerotk::cuda::check((expr), #expr, __FILE__, __LINE__)
/// After a kernel launch: reports launch-configuration errors at the launch site.
#define ZEROTK_CUDA_CHECK_LAUNCH() ::zerotk::cuda::check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
