#pragma once
/// \file zerotk/kernels/cuda/accumulate.cuh
/// The two elementwise folds of gradient accumulation on the GPU, with the host backend's rounding
/// (engine/host_backend.hpp), so host and device engines agree bit for bit:
///   accumulate:  acc[i] += float(x[i])              (fp32 accumulator over micro-steps)
///   add_rounded: slot[i] = T(float(slot[i]) + g[i])  (16-bit gradient storage from fp32 compute)

#include <cstddef>

#include <cuda_runtime.h>

#include "zerotk/core/cuda.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/kernels/cuda/cast.cuh"

namespace zerotk::kernels::cuda {

template <class T>
__global__ void accumulate_kernel(float* __restrict__ acc, const T* __restrict__ x, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(blockDim.x) * gridDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    acc[i] = __fadd_rn(acc[i], to_float(x[i]));
  }
}

template <class T>
__global__ void add_rounded_kernel(T* __restrict__ slot, const float* __restrict__ g, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(blockDim.x) * gridDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    slot[i] = from_float<T>(__fadd_rn(to_float(slot[i]), g[i]));
  }
}

/// acc[i] += float(x[i]) for n device elements, on `stream`.
template <class T>
void accumulate(float* acc, const T* x, std::size_t n, cudaStream_t stream = nullptr) {
  if (n == 0) return;
  accumulate_kernel<T><<<detail::elementwise_blocks(n), 256, 0, stream>>>(acc, x, n);
  ZEROTK_CUDA_CHECK_LAUNCH();
}

/// slot[i] = T(float(slot[i]) + g[i]) for n device elements, on `stream`.
template <class T>
void add_rounded(T* slot, const float* g, std::size_t n, cudaStream_t stream = nullptr) {
  if (n == 0) return;
  add_rounded_kernel<T><<<detail::elementwise_blocks(n), 256, 0, stream>>>(slot, g, n);
  ZEROTK_CUDA_CHECK_LAUNCH();
}

}  // namespace zerotk::kernels::cuda
