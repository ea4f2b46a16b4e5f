#pragma once
/// \file zerotk/kernels/cuda/cast.cuh
/// Element-type casts on the GPU (fp32 <-> fp16/bf16). The per-element rounding is the one in
/// zerotk/core/dtype.hpp, shared with the host, so host tests check the same math.

#include <cstddef>

#include <cuda_runtime.h>

#include "zerotk/core/cuda.hpp"
#include "zerotk/core/dtype.hpp"

namespace zerotk::kernels::cuda {

/// out[i] = Dst(in[i]) for i < n; grid-stride loop.
template <class Src, class Dst>
__global__ void cast_kernel(const Src* __restrict__ in, Dst* __restrict__ out, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(blockDim.x) * gridDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = from_float<Dst>(to_float(in[i]));
  }
}

/// Launches cast_kernel on `stream`. Pointers are device pointers of n elements each.
template <class Src, class Dst>
void cast(const Src* in, Dst* out, std::size_t n, cudaStream_t stream = nullptr) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  const std::size_t want = (n + kThreads - 1) / kThreads;
  const unsigned blocks = static_cast<unsigned>(want < 65535 * 8 ? want : 65535 * 8);
  cast_kernel<Src, Dst><<<blocks, kThreads, 0, stream>>>(in, out, n);
  ZEROTK_CUDA_CHECK_LAUNCH();
}

}  // namespace zerotk::kernels::cuda
