#pragma once
/// \file zerotk/context/cuda/block_sparse.cuh
/// Block-sparse attention on the GPU (nvcc only; docs/context.md): the per-row definitions of
/// context/block_sparse_rows.hpp, one thread per (row, head): the forward and the query gradient
/// per query row, the key and value gradients per key row (each a plain loop in the host's order,
/// so no atomics and the same sums as the host's; exp and log are the device's, within a few ulp of
/// the host's). Pointers are device pointers, `rows::MaskView::mask` a device copy of
/// BlockLayout::mask_data(), `rows::Rows::key_blocks` device memory when given; every launcher takes
/// a stream and returns without waiting. Compiled here; not run without a GPU.
///
///   const zerotk::context::rows::Rows r = attn.shape(q_n, k_n, v_n, o_n, lse_n, window, "forward");
///   zerotk::context::cuda::forward(mask_on_device, r, q, k, v, o, lse, stream);
///   zerotk::context::cuda::backward(mask_on_device, r, q, k, v, o, lse, d_o, dq, dk, dv, stream);  // adds

#include <cstddef>

#include <cuda_runtime.h>

#include "zerotk/context/block_sparse_rows.hpp"
#include "zerotk/core/cuda.hpp"

namespace zerotk::context::cuda {

namespace kernel {

inline constexpr int kThreads = 128;

__global__ void forward(rows::MaskView m, rows::Rows r, const float* __restrict__ q, const float* __restrict__ k,
                        const float* __restrict__ v, float* __restrict__ o, float* __restrict__ lse) {
  const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= r.nq * r.heads) return;
  rows::forward_row(m, r, q, k, v, o, lse, i / r.heads, i % r.heads);
}

__global__ void dq(rows::MaskView m, rows::Rows r, const float* __restrict__ q, const float* __restrict__ k,
                   const float* __restrict__ v, const float* __restrict__ o, const float* __restrict__ lse,
                   const float* __restrict__ d_o, float* __restrict__ dq) {
  const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= r.nq * r.heads) return;
  rows::dq_row(m, r, q, k, v, o, lse, d_o, dq, i / r.heads, i % r.heads);
}

__global__ void dkv(rows::MaskView m, rows::Rows r, const float* __restrict__ q, const float* __restrict__ k,
                    const float* __restrict__ v, const float* __restrict__ o, const float* __restrict__ lse,
                    const float* __restrict__ d_o, float* __restrict__ dk, float* __restrict__ dv) {
  const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= r.nk * r.heads) return;
  rows::dkv_row(m, r, q, k, v, o, lse, d_o, dk, dv, i / r.heads, i % r.heads);
}

inline unsigned blocks_for(std::size_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

}  // namespace kernel

/// o and lse of every held query row and head (o normalized over the held keys).
inline void forward(const rows::MaskView& m, const rows::Rows& r, const float* q, const float* k, const float* v, float* o,
                    float* lse, cudaStream_t stream) {
  const std::size_t n = r.nq * r.heads;
  if (n == 0) return;
  kernel::forward<<<kernel::blocks_for(n), kernel::kThreads, 0, stream>>>(m, r, q, k, v, o, lse);
  ZEROTK_CUDA_CHECK(cudaGetLastError());
}

/// Adds the gradients of q (per query row) and of k and v (per key row), given the final o and lse.
inline void backward(const rows::MaskView& m, const rows::Rows& r, const float* q, const float* k, const float* v,
                     const float* o, const float* lse, const float* d_o, float* dq, float* dk, float* dv,
                     cudaStream_t stream) {
  if (r.nq * r.heads > 0) {
    kernel::dq<<<kernel::blocks_for(r.nq * r.heads), kernel::kThreads, 0, stream>>>(m, r, q, k, v, o, lse, d_o, dq);
    ZEROTK_CUDA_CHECK(cudaGetLastError());
  }
  if (r.nk * r.heads > 0) {
    kernel::dkv<<<kernel::blocks_for(r.nk * r.heads), kernel::kThreads, 0, stream>>>(m, r, q, k, v, o, lse, d_o, dk, dv);
    ZEROTK_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace zerotk::context::cuda
