#pragma once
/// \file zerotk/parallel/cuda/kernels.cuh
/// The tensor-parallel layers' local work on the GPU, from the per-element definitions the host loops
/// use (split.hpp's full_index, elementwise.hpp, rng.hpp): taking / placing shards, the reordering
/// after an all-gather along the last dim, the vocab-parallel cross-entropy gradient, and dropout
/// drawn by full-tensor index. Collectives go through the NCCL communicator as on the host; these
/// kernels are what runs between them. Pointers are device pointers; every launch is on `stream`.

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "zerotk/core/cuda.hpp"
#include "zerotk/parallel/elementwise.hpp"
#include "zerotk/parallel/rng.hpp"
#include "zerotk/parallel/split.hpp"

namespace zerotk::parallel::cuda {

namespace detail {
constexpr unsigned kThreads = 256;
inline unsigned blocks(std::size_t n) {
  const std::size_t want = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(want < 65535 * 8 ? want : 65535 * 8);
}
#define ZEROTK_PARALLEL_GRID_STRIDE(i, n)                                                               \
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<std::size_t>(blockDim.x) * gridDim.x)

template <class T>
__global__ void take_shard_kernel(const T* full, MatrixShape shape, TensorSplit split, int rank, int size, T* shard,
                                  std::size_t n) {
  ZEROTK_PARALLEL_GRID_STRIDE(i, n) { shard[i] = full[full_index(i, shape, split, rank, size)]; }
}
template <class T>
__global__ void put_shard_kernel(const T* shard, MatrixShape shape, TensorSplit split, int rank, int size, T* full,
                                 std::size_t n) {
  ZEROTK_PARALLEL_GRID_STRIDE(i, n) { full[full_index(i, shape, split, rank, size)] = shard[i]; }
}
template <class T>
__global__ void ungather_kernel(const T* gathered, T* full, std::size_t rows, std::size_t cols, int size) {
  ZEROTK_PARALLEL_GRID_STRIDE(i, rows * cols) { full[i] = gathered[gathered_index(i, rows, cols, size)]; }
}
// Templates (instantiated with float) so that a header may define them in every translation unit.
template <class T>
__global__ void xent_grad_kernel(const T* logits, const std::int32_t* targets, VocabRange range, std::size_t v,
                                 const T* max, const T* sum, const T* dloss, T* dlogits, std::size_t n) {
  ZEROTK_PARALLEL_GRID_STRIDE(e, n * v) {
    const std::size_t i = e / v, j = e % v;
    const bool is_target = range.owns(targets[i]) && static_cast<std::int64_t>(j) == targets[i] - range.begin;
    dlogits[e] = xent_grad(logits[e], max[i], sum[i], is_target, dloss[i]);
  }
}
template <class T>
__global__ void dropout_split_cols_kernel(RngStream s, T* x, std::size_t n, float p, std::size_t cols, int rank,
                                          int size) {
  ZEROTK_PARALLEL_GRID_STRIDE(i, n) { x[i] = dropout_value(x[i], s.keep(split_cols_index(i, cols, rank, size), p), p); }
}
#undef ZEROTK_PARALLEL_GRID_STRIDE
}  // namespace detail

/// shard = rank `rank`'s shard of `full` (check_split first; shard_shape(shape, split, size) elements).
template <class T>
void take_shard(const T* full, MatrixShape shape, TensorSplit split, int rank, int size, T* shard,
                cudaStream_t stream = nullptr) {
  const std::size_t n = shard_shape(shape, split, size).numel();
  if (n == 0) return;
  detail::take_shard_kernel<<<detail::blocks(n), detail::kThreads, 0, stream>>>(full, shape, split, rank, size, shard, n);
  ZEROTK_CUDA_CHECK_LAUNCH();
}

/// Places rank `rank`'s shard into `full` (a merge: once per rank).
template <class T>
void put_shard(const T* shard, MatrixShape shape, TensorSplit split, int rank, int size, T* full,
               cudaStream_t stream = nullptr) {
  const std::size_t n = shard_shape(shape, split, size).numel();
  if (n == 0) return;
  detail::put_shard_kernel<<<detail::blocks(n), detail::kThreads, 0, stream>>>(shard, shape, split, rank, size, full, n);
  ZEROTK_CUDA_CHECK_LAUNCH();
}

/// full [rows, cols] from the all-gathered column blocks ([size][rows][cols / size]): GatherLastDim's
/// local step after the all-gather.
template <class T>
void ungather_last_dim(const T* gathered, T* full, std::size_t rows, std::size_t cols, int size,
                       cudaStream_t stream = nullptr) {
  if (rows * cols == 0) return;
  detail::ungather_kernel<<<detail::blocks(rows * cols), detail::kThreads, 0, stream>>>(gathered, full, rows, cols, size);
  ZEROTK_CUDA_CHECK_LAUNCH();
}

/// dlogits [n, range.size()] of the vocab-parallel cross-entropy from the forward's per-token max
/// and sum (already reduced over the tensor group).
inline void xent_grad(const float* logits, const std::int32_t* targets, VocabRange range, const float* max,
                      const float* sum, const float* dloss, float* dlogits, std::size_t n,
                      cudaStream_t stream = nullptr) {
  const auto v = static_cast<std::size_t>(range.size());
  if (n * v == 0) return;
  detail::xent_grad_kernel<float><<<detail::blocks(n * v), detail::kThreads, 0, stream>>>(logits, targets, range, v, max, sum,
                                                                                  dloss, dlogits, n);
  ZEROTK_CUDA_CHECK_LAUNCH();
}

/// In place over rank `rank`'s column block x ([n / (cols / size), cols / size]) of a [rows, cols]
/// activation: the same mask as the host's dropout_split_cols, whatever the split.
inline void dropout_split_cols(RngStream s, float* x, std::size_t n, float p, std::size_t cols, int rank, int size,
                               cudaStream_t stream = nullptr) {
  if (n == 0) return;
  detail::dropout_split_cols_kernel<float><<<detail::blocks(n), detail::kThreads, 0, stream>>>(s, x, n, p, cols, rank, size);
  ZEROTK_CUDA_CHECK_LAUNCH();
}

}  // namespace zerotk::parallel::cuda
