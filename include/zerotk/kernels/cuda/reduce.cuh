#pragma once
/// \file zerotk/kernels/cuda/reduce.cuh
/// Sums of squares and the inf/NaN flag on the GPU: the reproducible binned sum of
/// kernels/elementwise.hpp ("reproducible sum of squares"), so every result here equals the host's
/// (kernels/host/reduce.hpp) bit for bit, and does not depend on the launch shape or on the order in
/// which blocks finish: block reductions and atomics add exact fold parts.
///
///   square_bound(blocks, SquareBound* out, ...)        phase 1 over a list of device blocks
///   add_squares(blocks, grid, FoldSums* out, ...)       phase 2 over the list, on a host-made grid
///   sum_squares(x, n, double* out, ...)                 both phases, the grid from x's own max/count
///   sum_squares(tensors, double* out, ...)              both phases per tensor (grids built on the GPU)
///
/// Every kernel reads its elements as floats (4-wide where aligned) and takes magnitude keys in the
/// float domain; float, half and bfloat16 convert exactly, so the bounds equal the host's.

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
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

/// fn(value) for this thread's share of x[0..n) (strided over the block; 4-wide loads when aligned).
template <class T, class Fn>
__device__ __forceinline__ void for_each_value(const T* x, std::uint32_t n, Fn&& fn) {
  std::uint32_t done = 0;
  if (vec4_ok(x)) {
    const std::uint32_t n4 = n / 4;
    for (std::uint32_t j = threadIdx.x; j < n4; j += blockDim.x) {
      float f[4];
      load4(x + 4 * j, f);
#pragma unroll
      for (int q = 0; q < 4; ++q) fn(f[q]);
    }
    done = 4 * n4;
  }
  for (std::uint32_t i = done + threadIdx.x; i < n; i += blockDim.x) fn(to_float(x[i]));
}

struct MaxKey {
  __device__ __forceinline__ std::uint32_t operator()(std::uint32_t a, std::uint32_t b) const { return a > b ? a : b; }
};

/// The block's largest float-domain magnitude key of x[0..n) (valid in thread 0).
template <class T>
__device__ __forceinline__ std::uint32_t block_max_key(const T* x, std::uint32_t n) {
  using Reduce = cub::BlockReduce<std::uint32_t, kBlockThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  std::uint32_t m = 0;
  for_each_value(x, n, [&](float v) {
    const std::uint32_t k = magnitude_key(v);
    m = k > m ? k : m;
  });
  return Reduce(tmp).Reduce(m, MaxKey());
}

/// *out += the fold sums of x[0..n) on grid g: each thread deposits its share, the block adds the
/// threads' folds, thread 0 adds them to *out with atomics. Every addition is exact (any order).
template <class T>
__device__ __forceinline__ void block_add_squares(const T* x, std::uint32_t n, const NormGrid& g, FoldSums* out) {
  using Reduce = cub::BlockReduce<double, kBlockThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  const double c0 = g.extractor[0], c1 = g.extractor[1], c2 = g.extractor[2];
  double a0 = 0.0, a1 = 0.0, a2 = 0.0;
  for_each_value(x, n, [&](float v) { fold_deposit(exact_square(v), c0, c1, c2, a0, a1, a2); });
  const double s0 = Reduce(tmp).Sum(a0);
  __syncthreads();  // the temp storage is reused
  const double s1 = Reduce(tmp).Sum(a1);
  __syncthreads();
  const double s2 = Reduce(tmp).Sum(a2);
  if (threadIdx.x == 0) {
    if (s0 != 0.0) atomicAdd(&out->fold[0], s0);
    if (s1 != 0.0) atomicAdd(&out->fold[1], s1);
    if (s2 != 0.0) atomicAdd(&out->fold[2], s2);
  }
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

/// Phase 1: keys[per_item ? chunk's item : 0] = max(itself, the chunk's largest magnitude key).
template <class T>
__global__ void __launch_bounds__(kBlockThreads)
    square_bound_chunks_kernel(const Chunk* __restrict__ chunks, const T* const* __restrict__ ptrs, bool per_item,
                               std::uint32_t* __restrict__ keys) {
  const Chunk c = chunks[blockIdx.x];
  const std::uint32_t k = detail::block_max_key(ptrs[c.item] + c.begin, c.numel);
  if (threadIdx.x == 0 && k != 0) atomicMax(&keys[per_item ? c.item : 0], k);
}

/// *out = combine(*out, the bound whose largest float-domain key is *key). One thread.
__global__ void square_bound_finish_kernel(const std::uint32_t* __restrict__ key, SquareBound* __restrict__ out) {
  *out = combine(*out, square_bound_of_key<float>(*key));
}

/// Phase 2 on one grid for the whole list: *out += fold sums of every chunk.
template <class T>
__global__ void __launch_bounds__(kBlockThreads)
    add_squares_chunks_kernel(const Chunk* __restrict__ chunks, const T* const* __restrict__ ptrs, const NormGrid grid,
                              FoldSums* __restrict__ out) {
  const Chunk c = chunks[blockIdx.x];
  detail::block_add_squares(ptrs[c.item] + c.begin, c.numel, grid, out);
}

/// Phase 2 with a grid per item, built here from the item's key and element count (items with an
/// inf/NaN are skipped): sums[item] += fold sums of the chunk.
template <class T>
__global__ void __launch_bounds__(kBlockThreads)
    add_squares_items_kernel(const Chunk* __restrict__ chunks, const T* const* __restrict__ ptrs,
                             const std::uint64_t* __restrict__ numels, const std::uint32_t* __restrict__ keys,
                             FoldSums* __restrict__ sums) {
  const Chunk c = chunks[blockIdx.x];
  const SquareBound b = square_bound_of_key<float>(keys[c.item]);
  if (b.nonfinite) return;  // uniform over the block
  const NormGrid grid = NormGrid::build(b.max_square, numels[c.item]);
  detail::block_add_squares(ptrs[c.item] + c.begin, c.numel, grid, &sums[c.item]);
}

/// out[i] = fold_finish(sums[i]), or +inf where item i holds an inf/NaN. One thread per item.
__global__ void finish_items_kernel(const FoldSums* __restrict__ sums, const std::uint32_t* __restrict__ keys,
                                    std::uint32_t count, double* __restrict__ out) {
  const std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const SquareBound b = square_bound_of_key<float>(keys[i]);
  out[i] = b.nonfinite ? b.max_square : fold_finish(sums[i]);
}

/// out[i * out_stride + comp] = sum of partial[(first[i] .. first[i+1]) * comps + comp], one block per
/// item (blockIdx.x) and component (blockIdx.y). (LAMB's per-tensor partial sums, lamb.cuh.)
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
  const std::size_t tid = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  std::size_t done = 0;
  if constexpr (sizeof(T) == 2 || std::is_same_v<T, float>) {
    if (reinterpret_cast<std::uintptr_t>(x) % 16 == 0) {
    // 16-byte loads: the exponent field of every element in each 32-bit word, all ones = inf or NaN.
    constexpr std::uint32_t e = sizeof(T) == 4 ? 0x7f800000u
                                : std::is_same_v<T, bfloat16> ? 0x7f807f80u
                                                              : 0x7c007c00u;
    const auto word = [](std::uint32_t w) {
      if constexpr (sizeof(T) == 4) {
        return (w & e) == e;
      } else {
        return (w & (e & 0xffffu)) == (e & 0xffffu) || (w & (e & 0xffff0000u)) == (e & 0xffff0000u);
      }
    };
    const std::size_t n16 = n * sizeof(T) / 16;
    const uint4* v = reinterpret_cast<const uint4*>(x);
    for (std::size_t i = tid; i < n16; i += stride) {
      const uint4 u = v[i];
      bad |= (word(u.x) || word(u.y) || word(u.z) || word(u.w)) ? 1 : 0;
    }
    done = n16 * 16 / sizeof(T);
    }
  }
  for (std::size_t i = done + tid; i < n; i += stride) bad |= is_nonfinite(x[i]) ? 1 : 0;
  const int any = Reduce(tmp).Sum(bad);
  if (threadIdx.x == 0 && any != 0) atomicOr(flag, 1);
}

namespace detail {

/// The chunk table and pointer table of a list, staged in ws (after ws.reset()).
template <class T>
struct StagedList {
  std::vector<Chunk> chunks;
  std::size_t chunk_offset = 0, ptr_offset = 0;
};

template <class T>
StagedList<T> stage_list(std::span<const TensorRef<const T>> blocks, Workspace& ws) {
  StagedList<T> s;
  append_chunks(blocks.size(), [&](std::size_t i) { return blocks[i].numel; }, s.chunks);
  std::vector<const T*> ptrs(blocks.size());
  for (std::size_t i = 0; i < blocks.size(); ++i) ptrs[i] = blocks[i].data;
  ws.reset();
  s.chunk_offset = ws.stage(s.chunks);
  s.ptr_offset = ws.stage(ptrs);
  return s;
}

/// Both phases per item, each item its own grid: out_device[i] = the sum of squares of item i.
template <class T>
void launch_item_sums(std::span<const TensorRef<const T>> items, double* out_device, Workspace& ws,
                      cudaStream_t stream) {
  if (items.empty()) return;
  const char* where = "kernels::cuda::sum_squares";
  StagedList<T> s = stage_list(items, ws);
  std::vector<std::uint64_t> numels(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) numels[i] = items[i].numel;
  const std::size_t on = ws.stage(numels);
  const std::size_t okeys = ws.scratch(items.size() * sizeof(std::uint32_t));
  const std::size_t osums = ws.scratch(items.size() * sizeof(FoldSums));
  ws.upload(stream);
  ZEROTK_CUDA_CHECK(cudaMemsetAsync(ws.device<char>(okeys), 0, items.size() * sizeof(std::uint32_t), stream));
  ZEROTK_CUDA_CHECK(cudaMemsetAsync(ws.device<char>(osums), 0, items.size() * sizeof(FoldSums), stream));
  if (!s.chunks.empty()) {
    const unsigned grid = grid_for(s.chunks.size(), where);
    square_bound_chunks_kernel<T><<<grid, kBlockThreads, 0, stream>>>(
        ws.device<Chunk>(s.chunk_offset), ws.device<const T*>(s.ptr_offset), true, ws.device<std::uint32_t>(okeys));
    ZEROTK_CUDA_CHECK_LAUNCH();
    add_squares_items_kernel<T><<<grid, kBlockThreads, 0, stream>>>(
        ws.device<Chunk>(s.chunk_offset), ws.device<const T*>(s.ptr_offset), ws.device<std::uint64_t>(on),
        ws.device<std::uint32_t>(okeys), ws.device<FoldSums>(osums));
    ZEROTK_CUDA_CHECK_LAUNCH();
  }
  const unsigned tb = 256, tg = static_cast<unsigned>((items.size() + tb - 1) / tb);
  finish_items_kernel<<<tg, tb, 0, stream>>>(ws.device<FoldSums>(osums), ws.device<std::uint32_t>(okeys),
                                             static_cast<std::uint32_t>(items.size()), out_device);
  ZEROTK_CUDA_CHECK_LAUNCH();
}

}  // namespace detail

// ---- the two phases ---------------------------------------------------------------------------------

/// Phase 1 over every element of a list of device blocks: *out_device = combine(*out_device, their
/// bound) (initialise it to SquareBound{} once; several lists may then add to it). Asynchronous.
template <class T>
void square_bound(std::span<const TensorRef<const T>> blocks, SquareBound* out_device, Workspace& ws,
                  cudaStream_t stream = nullptr) {
  detail::StagedList<T> s = detail::stage_list(blocks, ws);
  const std::size_t okey = ws.scratch(sizeof(std::uint32_t));
  ws.upload(stream);
  ZEROTK_CUDA_CHECK(cudaMemsetAsync(ws.device<char>(okey), 0, sizeof(std::uint32_t), stream));
  if (!s.chunks.empty()) {
    square_bound_chunks_kernel<T><<<detail::grid_for(s.chunks.size(), "kernels::cuda::square_bound"), kBlockThreads, 0,
                                    stream>>>(ws.device<Chunk>(s.chunk_offset), ws.device<const T*>(s.ptr_offset),
                                              false, ws.device<std::uint32_t>(okey));
    ZEROTK_CUDA_CHECK_LAUNCH();
  }
  square_bound_finish_kernel<<<1, 1, 0, stream>>>(ws.device<std::uint32_t>(okey), out_device);
  ZEROTK_CUDA_CHECK_LAUNCH();
}

/// Phase 1 over x[0..n) (device): *out_device = combine(*out_device, its bound). Asynchronous.
template <class T>
void square_bound(const T* x, std::size_t n, SquareBound* out_device, Workspace& ws, cudaStream_t stream = nullptr) {
  const TensorRef<const T> one[1] = {{x, n}};
  square_bound<T>(std::span<const TensorRef<const T>>(one), out_device, ws, stream);
}

/// Phase 2 over every element of a list of device blocks on `grid` (made on the host from the GLOBAL
/// bound and count): *out_device += their fold sums (zero it once; several lists may add to it; the
/// sums are exact, so the result is the same for any split of the elements). Asynchronous.
template <class T>
void add_squares(std::span<const TensorRef<const T>> blocks, const NormGrid& grid, FoldSums* out_device, Workspace& ws,
                 cudaStream_t stream = nullptr) {
  detail::StagedList<T> s = detail::stage_list(blocks, ws);
  if (s.chunks.empty()) return;
  ws.upload(stream);
  add_squares_chunks_kernel<T><<<detail::grid_for(s.chunks.size(), "kernels::cuda::add_squares"), kBlockThreads, 0,
                                 stream>>>(ws.device<Chunk>(s.chunk_offset), ws.device<const T*>(s.ptr_offset), grid,
                                           out_device);
  ZEROTK_CUDA_CHECK_LAUNCH();
}

/// Phase 2 over x[0..n) (device): *out_device += its fold sums on `grid`. Asynchronous.
template <class T>
void add_squares(const T* x, std::size_t n, const NormGrid& grid, FoldSums* out_device, Workspace& ws,
                 cudaStream_t stream = nullptr) {
  const TensorRef<const T> one[1] = {{x, n}};
  add_squares<T>(std::span<const TensorRef<const T>>(one), grid, out_device, ws, stream);
}

// ---- both phases on one device ------------------------------------------------------------------------

/// *out_device = sum over i < n of x[i]^2 (both phases, the grid from x's own max and count; +inf
/// when an element is inf or NaN): kernels::host::sum_squares's bits. Asynchronous.
template <class T>
void sum_squares(const T* x, std::size_t n, double* out_device, Workspace& ws, cudaStream_t stream = nullptr) {
  const TensorRef<const T> one[1] = {{x, n}};
  detail::launch_item_sums<T>(std::span<const TensorRef<const T>>(one), out_device, ws, stream);
}

/// out_device[i] = sum of squares of tensors[i] (device tensors, each its own grid), one launch per
/// phase for the whole list: kernels::host::sum_squares(tensors, out)'s bits.
template <class T>
void sum_squares(std::span<const TensorRef<const T>> tensors, double* out_device, Workspace& ws,
                 cudaStream_t stream = nullptr) {
  detail::launch_item_sums<T>(tensors, out_device, ws, stream);
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

/// Sum of squares and the inf/NaN flag of x (device); waits for the result.
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
