#pragma once
/// \file zerotk/kernels/cuda/lamb.cuh
/// Fused LAMB on the GPU, the two phases of kernels/host/lamb.hpp:
///   1. per chunk: moments, direction u, CUB block sums of p^2 and u^2 -> partial[chunk][2]
///   2. per item: its chunks' partials in a fixed order; per tensor id: its items in list order
///   [the caller's reducer sums the per-tensor sums over ranks, e.g. ncclAllReduce on `stream`]
///   3. per chunk: trust ratio of its tensor, p -= step_size * ratio * u, working copy.
/// m and v are bit-identical to the host's; the norms are summed in another order, so parameters
/// agree with the host to about one rounding of the trust ratio.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <cub/block/block_reduce.cuh>
#include <cuda_runtime.h>

#include "zerotk/core/cuda.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/kernels/cuda/multi_tensor.cuh"
#include "zerotk/kernels/cuda/reduce.cuh"
#include "zerotk/kernels/elementwise.hpp"
#include "zerotk/kernels/tensor_list.hpp"

namespace zerotk::kernels::cuda {

/// Device pointers of one item of a LAMB launch; `tensor` is the global tensor id its norms add to.
template <class G, class P>
struct LambTensor {
  float* master;
  float* m;
  float* v;
  const G* grad;
  P* out;
  std::size_t numel;
  std::uint32_t group;
  std::uint32_t tensor;
};

/// Phase 1: moments and the chunk's partial sums (partial[2 * chunk] = ||p||^2, [2 * chunk + 1] = ||u||^2).
template <class G, class P>
__global__ void __launch_bounds__(kBlockThreads)
    lamb_moments_kernel(const Chunk* __restrict__ chunks, const LambTensor<G, P>* __restrict__ items,
                        const LambStepConsts* __restrict__ consts, float scale, double* __restrict__ partial) {
  using Reduce = cub::BlockReduce<double, kBlockThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  const Chunk c = chunks[blockIdx.x];
  const LambTensor<G, P> t = items[c.item];
  const LambStepConsts k = consts[t.group];
  const float* p = t.master + c.begin;
  float* m = t.m + c.begin;
  float* v = t.v + c.begin;
  const G* g = t.grad + c.begin;
  const std::uint32_t n = c.numel;
  double sp = 0.0, su = 0.0;
  std::uint32_t done = 0;
  if (detail::aligned<16>(p) && detail::aligned<16>(m) && detail::aligned<16>(v) && detail::vec4_ok(g)) {
    const std::uint32_t n4 = n / 4;
    for (std::uint32_t j = threadIdx.x; j < n4; j += blockDim.x) {
      float pp[4], mm[4], vv[4], gg[4];
      detail::load4(p + 4 * j, pp);
      detail::load4(m + 4 * j, mm);
      detail::load4(v + 4 * j, vv);
      detail::load4(g + 4 * j, gg);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float u = lamb_moments(pp[q], mm[q], vv[q], unscale(gg[q], scale), k);
        sp += static_cast<double>(pp[q]) * pp[q];
        su += static_cast<double>(u) * u;
      }
      detail::store4(m + 4 * j, mm);
      detail::store4(v + 4 * j, vv);
    }
    done = 4 * n4;
  }
  for (std::uint32_t i = done + threadIdx.x; i < n; i += blockDim.x) {
    float mm = m[i], vv = v[i];
    const float u = lamb_moments(p[i], mm, vv, unscale(to_float(g[i]), scale), k);
    m[i] = mm;
    v[i] = vv;
    sp += static_cast<double>(p[i]) * p[i];
    su += static_cast<double>(u) * u;
  }
  const double bp = Reduce(tmp).Sum(sp);
  __syncthreads();  // the temp storage is reused
  const double bu = Reduce(tmp).Sum(su);
  if (threadIdx.x == 0) {
    partial[2 * static_cast<std::size_t>(blockIdx.x)] = bp;
    partial[2 * static_cast<std::size_t>(blockIdx.x) + 1] = bu;
  }
}

/// tensor_sums[2 t + comp] = sum over the items of tensor t (CSR: tensor_first/tensor_items, in list
/// order) of item_sums[2 item + comp]. One thread per (tensor, component).
__global__ void lamb_tensor_sums_kernel(const double* __restrict__ item_sums, const std::uint32_t* __restrict__ tensor_first,
                                        const std::uint32_t* __restrict__ tensor_items, std::uint32_t tensors,
                                        double* __restrict__ tensor_sums) {
  const std::uint32_t id = blockIdx.x * blockDim.x + threadIdx.x;
  if (id >= 2 * tensors) return;
  const std::uint32_t t = id / 2, comp = id % 2;
  double s = 0.0;
  for (std::uint32_t j = tensor_first[t]; j < tensor_first[t + 1]; ++j) s += item_sums[2 * tensor_items[j] + comp];
  tensor_sums[id] = s;
}

/// Phase 2: the trust-ratio step.
template <class G, class P>
__global__ void __launch_bounds__(kBlockThreads)
    lamb_apply_kernel(const Chunk* __restrict__ chunks, const LambTensor<G, P>* __restrict__ items,
                      const LambStepConsts* __restrict__ consts, const double* __restrict__ tensor_sums) {
  const Chunk c = chunks[blockIdx.x];
  const LambTensor<G, P> t = items[c.item];
  const LambStepConsts k = consts[t.group];
  const float scaled = k.step_size * lamb_trust_ratio(tensor_sums[2 * t.tensor], tensor_sums[2 * t.tensor + 1], k);
  float* p = t.master + c.begin;
  const float* m = t.m + c.begin;
  const float* v = t.v + c.begin;
  P* out = nullptr;
  if constexpr (!std::is_void_v<P>) out = t.out ? t.out + c.begin : nullptr;
  const std::uint32_t n = c.numel;
  std::uint32_t done = 0;
  if (detail::aligned<16>(p) && detail::aligned<16>(m) && detail::aligned<16>(v) && detail::vec4_ok(out)) {
    const std::uint32_t n4 = n / 4;
    for (std::uint32_t j = threadIdx.x; j < n4; j += blockDim.x) {
      float pp[4], mm[4], vv[4];
      detail::load4(p + 4 * j, pp);
      detail::load4(m + 4 * j, mm);
      detail::load4(v + 4 * j, vv);
#pragma unroll
      for (int q = 0; q < 4; ++q) lamb_apply(pp[q], lamb_direction(pp[q], mm[q], vv[q], k), scaled);
      detail::store4(p + 4 * j, pp);
      if constexpr (!std::is_void_v<P>) {
        if (out) detail::store4(out + 4 * j, pp);
      }
    }
    done = 4 * n4;
  }
  for (std::uint32_t i = done + threadIdx.x; i < n; i += blockDim.x) {
    float pp = p[i];
    lamb_apply(pp, lamb_direction(pp, m[i], v[i], k), scaled);
    p[i] = pp;
    if constexpr (!std::is_void_v<P>) {
      if (out) out[i] = from_float<P>(pp);
    }
  }
}

/// One LAMB step over a list of device tensors. `tensor_count` >= 1 + the largest tensor id (use the
/// model's tensor count so every rank reduces equal lengths). Between the phases,
/// reduce(double* sums_device, std::size_t count, cudaStream_t) must sum the [tensor][2] partial sums
/// over ranks in place, ordered on `stream` (a no-op on one GPU).
template <class G, class P, class ReduceFn>
void fused_lamb(std::span<const LambTensor<G, P>> items, std::span<const LambStepConsts> group_consts, float grad_scale,
                std::size_t tensor_count, Workspace& ws, cudaStream_t stream, ReduceFn&& reduce) {
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (items[i].group >= group_consts.size() || items[i].tensor >= tensor_count) {
      throw usage_error("item names a group or tensor id out of range", "kernels::cuda::fused_lamb: item " + std::to_string(i),
                        "group " + std::to_string(items[i].group) + ", tensor " + std::to_string(items[i].tensor));
    }
  }
  if (tensor_count == 0) return;
  std::vector<Chunk> chunks;
  std::vector<std::uint32_t> first;
  append_chunks(items.size(), [&](std::size_t i) { return items[i].numel; }, chunks, &first);
  // CSR: the items of each tensor id, in list order.
  std::vector<std::uint32_t> tensor_first(tensor_count + 1, 0), tensor_items(items.size());
  for (const auto& it : items) ++tensor_first[it.tensor + 1];
  for (std::size_t t = 0; t < tensor_count; ++t) tensor_first[t + 1] += tensor_first[t];
  {
    std::vector<std::uint32_t> fill(tensor_first.begin(), tensor_first.end() - 1);
    for (std::size_t i = 0; i < items.size(); ++i) tensor_items[fill[items[i].tensor]++] = static_cast<std::uint32_t>(i);
  }
  ws.reset();
  const std::size_t oc = ws.stage(chunks), oi = ws.stage(items.data(), items.size()),
                    ok = ws.stage(group_consts.data(), group_consts.size()), of = ws.stage(first),
                    otf = ws.stage(tensor_first), oti = ws.stage(tensor_items);
  const std::size_t opart = ws.scratch(2 * (chunks.empty() ? 1 : chunks.size()) * sizeof(double));
  const std::size_t oitem = ws.scratch(2 * (items.empty() ? 1 : items.size()) * sizeof(double));
  const std::size_t osum = ws.scratch(2 * tensor_count * sizeof(double));
  ws.upload(stream);
  const char* where = "kernels::cuda::fused_lamb";
  if (!chunks.empty()) {
    lamb_moments_kernel<G, P><<<detail::grid_for(chunks.size(), where), kBlockThreads, 0, stream>>>(
        ws.device<Chunk>(oc), ws.device<LambTensor<G, P>>(oi), ws.device<LambStepConsts>(ok), grad_scale,
        ws.device<double>(opart));
    ZEROTK_CUDA_CHECK_LAUNCH();
  }
  if (!items.empty()) {
    sum_partials_kernel<<<dim3(detail::grid_for(items.size(), where), 2), kBlockThreads, 0, stream>>>(
        ws.device<double>(opart), ws.device<std::uint32_t>(of), 2, ws.device<double>(oitem));
    ZEROTK_CUDA_CHECK_LAUNCH();
  }
  const unsigned tb = 256, tg = static_cast<unsigned>((2 * tensor_count + tb - 1) / tb);
  lamb_tensor_sums_kernel<<<tg, tb, 0, stream>>>(ws.device<double>(oitem), ws.device<std::uint32_t>(otf),
                                                 ws.device<std::uint32_t>(oti), static_cast<std::uint32_t>(tensor_count),
                                                 ws.device<double>(osum));
  ZEROTK_CUDA_CHECK_LAUNCH();
  reduce(ws.device<double>(osum), 2 * tensor_count, stream);
  if (!chunks.empty()) {
    lamb_apply_kernel<G, P><<<detail::grid_for(chunks.size(), where), kBlockThreads, 0, stream>>>(
        ws.device<Chunk>(oc), ws.device<LambTensor<G, P>>(oi), ws.device<LambStepConsts>(ok), ws.device<double>(osum));
    ZEROTK_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace zerotk::kernels::cuda
