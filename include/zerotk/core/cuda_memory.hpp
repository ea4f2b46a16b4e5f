#pragma once
/// \file zerotk/core/cuda_memory.hpp
/// TrackedDeviceBuffer<T>: BasicTrackedBuffer (core/memory.hpp) in GPU memory, recorded in a
/// MemoryLedger category for its lifetime. Host code only (CUDA runtime API); the Engine's CUDA
/// backend allocates everything through it, so the ledger reports per-GPU model-state bytes exactly
/// as it reports host bytes.

#include <cstddef>
#include <string>

#include <cuda_runtime_api.h>

#include "zerotk/core/cuda.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/core/memory.hpp"

namespace zerotk {

/// Device memory of the current CUDA device (cudaMalloc, zero-filled; cudaFree synchronizes the
/// device, so no kernel may still use a buffer being freed).
struct CudaSpace {
  static constexpr bool host_accessible = false;
  static constexpr MemorySpace memory_space = MemorySpace::device;
  template <class T>
  static T* allocate(std::size_t n, MemoryCategory cat) {
    if (n == 0) return nullptr;
    T* p = nullptr;
    const cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T));
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      throw usage_error(std::string("cudaMalloc failed: ") + cudaGetErrorString(e),
                        std::string("TrackedDeviceBuffer (") + std::string(to_string(cat)) + ")",
                        std::to_string(n * sizeof(T)) + " bytes");
    }
    const cudaError_t z = cudaMemset(p, 0, n * sizeof(T));
    if (z != cudaSuccess) {
      cudaFree(p);
      ZEROTK_CUDA_CHECK(z);
    }
    return p;
  }
  template <class T>
  static void deallocate(T* p, std::size_t) noexcept {
    cudaFree(p);
  }
};

/// Device pointers only: data() is not readable by the host.
template <class T>
using TrackedDeviceBuffer = BasicTrackedBuffer<T, CudaSpace>;

}  // namespace zerotk
