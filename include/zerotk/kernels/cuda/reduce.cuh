#pragma once
/// \file zerotk/kernels/cuda/reduce.cuh
/// Sums of squares in fp64 (global and per tensor) and the inf/NaN flag on the GPU. CUB block
/// reductions; no atomics on the sums, so results are deterministic run to run: each chunk's partial
/// sum lands in its own slot and a second kernel adds the slots of each tensor in a fixed pattern.
/// (The order differs from the host drivers', so host and GPU sums agree to rounding, not bitwise.)
///
/// As on the host, the fp64 sum of squares is non-finite exactly when an element is inf or NaN.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <cub/block/block_reduce.cuh>
#include <cuda_runtime.h>

#include "zerotk/core/cuda.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/kernels/cuda/multi_tensor.cuh"
#include "zerotk/kernels/elementwise.hpp"
#include "zerotk/kernels/tensor_list.hpp"

namespace zerotk::kernels::cuda {

namespace detail {

/// This thread's share of sum x^2 over n elements (strided over the block; 4-wide when aligned).
template <class T>
__device__ __forceinline__ double thread_sum_squares(const T* x, std::uint32_t n) {
  double s = 0.0;
  std::uint32_t done = 0;
  if (vec4_ok(x)) {
    const std::uint32_t n4 = n / 4;
    for (std::uint32_t j = threadIdx.x; j < n4; j += blockDim.x) {
      float f[4];
      load4(x + 4 * j, f);
#pragma unroll
      for (int q = 0; q < 4; ++q) s += static_cast<double>(f[q]) * static_cast<double>(f[q]);
    }
    done = 4 * n4;
  }
  for (std::uint32_t i = done + threadIdx.x; i < n; i += blockDim.x) {
    const double f = to_float(x[i]);
    s += f * f;
  }
  return s;
}

/// Sums `count` consecutive doubles at `stride` (thread j takes j, j + blockDim, ...) across the block.
__device__ __forceinline__ double block_sum_strided(const double* a, std::uint32_t count, std::uint32_t stride) {
  using Reduce = cub::BlockReduce<double, kBlockThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  double s = 0.0;
  for (std::uint32_t j = threadIdx.x; j < count; j += blockDim.x) s += a[static_cast<std::size_t>(j) * stride];
  return Reduce(tmp).Sum(s);
}

}  // namespace detail

/// partial[chunk] = sum of squares over the chunk.
template <class T>
__global__ void __launch_bounds__(kBlockThreads)
    sum_squares_chunks_kernel(const Chunk* __restrict__ chunks, const T* const* __restrict__ ptrs,
                              double* __restrict__ partial) {
  using Reduce = cub::BlockReduce<double, kBlockThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  const Chunk c = chunks[blockIdx.x];
  const double s = Reduce(tmp).Sum(detail::thread_sum_squares(ptrs[c.item] + c.begin, c.numel));
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

/// out[i * out_stride + comp] = sum of partial[(first[i] .. first[i+1]) * comps + comp], one block per
/// item (blockIdx.x) and component (blockIdx.y).
__global__ void __launch_bounds__(kBlockThreads)
    sum_partials_kernel(const double* __restrict__ partial, const std::uint32_t* __restrict__ first,
                        std::uint32_t comps, double* __restrict__ out) {
  const std::uint32_t i = blockIdx.x, comp = blockIdx.y;
  const double s = detail::block_sum_strided(partial + static_cast<std::size_t>(first[i]) * comps + comp,
                                             first[i + 1] - first[i], comps);
  if (threadIdx.x == 0) out[static_cast<std::size_t>(i) * comps + comp] = s;
}

/// *flag = 1 when an element is inf or NaN (never cleared here: zero it once, check many buffers).
template <class T>
__global__ void __launch_bounds__(kBlockThreads) nonfinite_kernel(const T* __restrict__ x, std::size_t n, int* flag) {
  using Reduce = cub::BlockReduce<int, kBlockThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  int bad = 0;
  const std::size_t stride = static_cast<std::size_t>(blockDim.x) * gridDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    bad |= is_nonfinite(x[i]) ? 1 : 0;
  }
  const int any = Reduce(tmp).Sum(bad);
  if (threadIdx.x == 0 && any != 0) atomicOr(flag, 1);
}

namespace detail {

template <class T>
void launch_item_sums(std::span<const T* const> ptrs, std::span<const std::size_t> numels, double* out_device,
                      Workspace& ws, cudaStream_t stream) {
  std::vector<Chunk> chunks;
  std::vector<std::uint32_t> first;
  append_chunks(numels.size(), [&](std::size_t i) { return numels[i]; }, chunks, &first);
  if (numels.empty()) return;
  ws.reset();
  const std::size_t oc = ws.stage(chunks), op = ws.stage(ptrs.data(), ptrs.size()), of = ws.stage(first);
  const std::size_t opart = ws.scratch((chunks.empty() ? 1 : chunks.size()) * sizeof(double));
  ws.upload(stream);
  if (!chunks.empty()) {
    sum_squares_chunks_kernel<T><<<grid_for(chunks.size(), "kernels::cuda::sum_squares"), kBlockThreads, 0, stream>>>(
        ws.device<Chunk>(oc), ws.device<const T*>(op), ws.device<double>(opart));
    ZEROTK_CUDA_CHECK_LAUNCH();
  }
  sum_partials_kernel<<<dim3(grid_for(numels.size(), "kernels::cuda::sum_squares"), 1), kBlockThreads, 0, stream>>>(
      ws.device<double>(opart), ws.device<std::uint32_t>(of), 1, out_device);
  ZEROTK_CUDA_CHECK_LAUNCH();
}

}  // namespace detail

/// *out_device = sum over i < n of x[i]^2 in fp64 (x and out are device pointers). Asynchronous.
template <class T>
void sum_squares(const T* x, std::size_t n, double* out_device, Workspace& ws, cudaStream_t stream = nullptr) {
  const T* ptrs[1] = {x};
  const std::size_t numels[1] = {n};
  detail::launch_item_sums<T>(ptrs, numels, out_device, ws, stream);
}

/// out_device[i] = sum of squares of tensors[i] (device tensors), one launch for the whole list.
template <class T>
void sum_squares(std::span<const TensorRef<const T>> tensors, double* out_device, Workspace& ws,
                 cudaStream_t stream = nullptr) {
  std::vector<const T*> ptrs;
  std::vector<std::size_t> numels;
  for (const auto& t : tensors) {
    ptrs.push_back(t.data);
    numels.push_back(t.numel);
  }
  detail::launch_item_sums<T>(ptrs, numels, out_device, ws, stream);
}

/// Sets *flag_device to 1 if any of x[0..n) is inf or NaN. Asynchronous.
template <class T>
void has_nonfinite(const T* x, std::size_t n, int* flag_device, cudaStream_t stream = nullptr) {
  if (n == 0) return;
  const std::size_t want = (n + kBlockThreads - 1) / kBlockThreads;
  const unsigned blocks = static_cast<unsigned>(want < 4096 ? want : 4096);
  nonfinite_kernel<T><<<blocks, kBlockThreads, 0, stream>>>(x, n, flag_device);
  ZEROTK_CUDA_CHECK_LAUNCH();
}

/// Sum of squares and the inf/NaN flag of x (device) in one pass; waits for the result.
struct DeviceNormCheck {
  double sum_squares = 0.0;
  bool nonfinite = false;
};
template <class T>
DeviceNormCheck norm_and_check(const T* x, std::size_t n, Workspace& ws, cudaStream_t stream = nullptr) {
  DeviceNormCheck r;
  if (n == 0) return r;
  double* result = nullptr;
  ZEROTK_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&result), sizeof(double), stream));
  sum_squares(x, n, result, ws, stream);
  ZEROTK_CUDA_CHECK(cudaMemcpyAsync(&r.sum_squares, result, sizeof(double), cudaMemcpyDeviceToHost, stream));
  ZEROTK_CUDA_CHECK(cudaFreeAsync(result, stream));
  ZEROTK_CUDA_CHECK(cudaStreamSynchronize(stream));
  r.nonfinite = is_nonfinite(r.sum_squares);
  return r;
}

}  // namespace zerotk::kernels::cuda
