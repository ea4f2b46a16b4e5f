#pragma once
/// \file zerotk/kernels/cuda/cast.cuh
/// Element-type casts (fp32 <-> fp16/bf16), in-place scaling and division on the GPU. The per-element rounding
/// is the one in zerotk/core/dtype.hpp, shared with the host, so host tests check the same math.
/// 4 elements per thread and iteration with vector loads when both pointers allow it.

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "zerotk/core/cuda.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/kernels/cuda/multi_tensor.cuh"

namespace zerotk::kernels::cuda {

/// out[i] = Dst(in[i]) for i < n; grid-stride loop.
template <class Src, class Dst>
__global__ void cast_kernel(const Src* __restrict__ in, Dst* __restrict__ out, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(blockDim.x) * gridDim.x;
  const std::size_t tid = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  std::size_t done = 0;
  if (detail::vec4_ok(in) && detail::vec4_ok(out)) {
    const std::size_t n4 = n / 4;
    for (std::size_t j = tid; j < n4; j += stride) {
      float f[4];
      detail::load4(in + 4 * j, f);
      detail::store4(out + 4 * j, f);
    }
    done = 4 * n4;
  }
  for (std::size_t i = done + tid; i < n; i += stride) out[i] = from_float<Dst>(to_float(in[i]));
}

/// x[i] = T(float(x[i]) * factor).
template <class T>
__global__ void scale_kernel(T* __restrict__ x, std::size_t n, float factor) {
  const std::size_t stride = static_cast<std::size_t>(blockDim.x) * gridDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    x[i] = from_float<T>(to_float(x[i]) * factor);
  }
}

/// x[i] = T(float(x[i]) / divisor), the division rounded to nearest as on the host
/// (comm::detail::divide_in_place: an average after a sum).
template <class T>
__global__ void divide_kernel(T* __restrict__ x, std::size_t n, float divisor) {
  const std::size_t stride = static_cast<std::size_t>(blockDim.x) * gridDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    x[i] = from_float<T>(__fdiv_rn(to_float(x[i]), divisor));
  }
}

namespace detail {
inline unsigned elementwise_blocks(std::size_t work_items) {
  constexpr std::size_t kThreads = 256, kMaxBlocks = 65535 * 8;
  const std::size_t want = (work_items + kThreads - 1) / kThreads;
  return static_cast<unsigned>(want < kMaxBlocks ? want : kMaxBlocks);
}
}  // namespace detail

/// Launches cast_kernel on `stream`. Pointers are device pointers of n elements each.
template <class Src, class Dst>
void cast(const Src* in, Dst* out, std::size_t n, cudaStream_t stream = nullptr) {
  if (n == 0) return;
  cast_kernel<Src, Dst><<<detail::elementwise_blocks((n + 3) / 4), 256, 0, stream>>>(in, out, n);
  ZEROTK_CUDA_CHECK_LAUNCH();
}

/// In-place scaling of n device elements.
template <class T>
void scale(T* x, std::size_t n, float factor, cudaStream_t stream = nullptr) {
  if (n == 0) return;
  scale_kernel<T><<<detail::elementwise_blocks(n), 256, 0, stream>>>(x, n, factor);
  ZEROTK_CUDA_CHECK_LAUNCH();
}

/// In-place division of n device elements by `divisor` (fp32, fp16, bf16).
template <class T>
void divide(T* x, std::size_t n, int divisor, cudaStream_t stream = nullptr) {
  if (n == 0) return;
  divide_kernel<T><<<detail::elementwise_blocks(n), 256, 0, stream>>>(x, n, static_cast<float>(divisor));
  ZEROTK_CUDA_CHECK_LAUNCH();
}

}  // namespace zerotk::kernels::cuda
