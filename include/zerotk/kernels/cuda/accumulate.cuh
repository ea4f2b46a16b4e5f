#pragma once
/// \file zerotk/kernels/cuda/accumulate.cuh
/// Gradient accumulation on the GPU, rounded as on the host (kernels/host/accumulate.hpp), so host
/// and device engines agree bit for bit: acc[i] = A(float(acc[i]) + float(x[i])) — an fp32
/// accumulator (A = float), accumulation in the working precision (A = 16-bit), or 16-bit gradient
/// storage filled from a float compute copy (X = float).

#include <cstddef>

#include <cuda_runtime.h>

#include "zerotk/core/cuda.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/kernels/cuda/cast.cuh"

namespace zerotk::kernels::cuda {

template <class A, class X>
__global__ void accumulate_kernel(A* __restrict__ acc, const X* __restrict__ x, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(blockDim.x) * gridDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    acc[i] = from_float<A>(__fadd_rn(to_float(acc[i]), to_float(x[i])));
  }
}

/// acc[i] = A(float(acc[i]) + float(x[i])) for n device elements, on `stream`.
template <class A, class X>
void accumulate(A* acc, const X* x, std::size_t n, cudaStream_t stream = nullptr) {
  if (n == 0) return;
  accumulate_kernel<A, X><<<detail::elementwise_blocks(n), 256, 0, stream>>>(acc, x, n);
  ZEROTK_CUDA_CHECK_LAUNCH();
}

}  // namespace zerotk::kernels::cuda
