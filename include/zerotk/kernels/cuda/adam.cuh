#pragma once
/// \file zerotk/kernels/cuda/adam.cuh
/// Fused Adam/AdamW on the GPU: one pass per element, the per-element math of kernels/elementwise.hpp
/// (bit-identical to the host drivers), 4-wide vector loads where every pointer allows them.
///
///   cuda::fused_adam(master, m, v, grad16, param16, n, AdamStepConsts::make(h, t), 1 / scale, stream);
///   cuda::fused_adam<half, half>(segments, group_consts, master, m, v, grads, params, factor, ws, stream);

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <cuda_runtime.h>

#include "zerotk/core/cuda.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/kernels/cuda/multi_tensor.cuh"
#include "zerotk/kernels/elementwise.hpp"
#include "zerotk/kernels/tensor_list.hpp"

namespace zerotk::kernels::cuda {

/// Device pointers of one item of a multi-tensor Adam launch. out may be null (no working copy).
template <class G, class P>
struct AdamTensor {
  float* master;
  float* m;
  float* v;
  const G* grad;
  P* out;
  std::size_t numel;
  std::uint32_t group;  ///< index into the launch's constants
};

namespace detail {

/// The block's threads update n elements (one chunk). A chunk whose pointers share one misalignment
/// (a segment starting at an element offset not divisible by 4) does its first elements one at a time
/// and the rest 4-wide; pointers misaligned differently take the scalar path throughout.
template <class G, class P>
__device__ __forceinline__ void adam_chunk(float* p, float* m, float* v, const G* g, P* out, std::uint32_t n,
                                           const AdamStepConsts& k, float scale) {
  const auto scalar = [&](std::uint32_t i) {
    float pp = p[i], mm = m[i], vv = v[i];
    adam_update(pp, mm, vv, unscale(to_float(g[i]), scale), k);
    p[i] = pp;
    m[i] = mm;
    v[i] = vv;
    if constexpr (!std::is_void_v<P>) {
      if (out) out[i] = from_float<P>(pp);
    }
  };
  std::uint32_t head = static_cast<std::uint32_t>((16 - reinterpret_cast<std::uintptr_t>(p) % 16) % 16 / sizeof(float));
  head = head < n ? head : n;
  P* out_h = nullptr;
  if constexpr (!std::is_void_v<P>) out_h = out ? out + head : nullptr;
  if (!(aligned<16>(m + head) && aligned<16>(v + head) && vec4_ok(g + head) && vec4_ok(out_h))) {
    for (std::uint32_t i = threadIdx.x; i < n; i += blockDim.x) scalar(i);
    return;
  }
  if (threadIdx.x < head) scalar(threadIdx.x);
  const std::uint32_t n4 = (n - head) / 4;
  for (std::uint32_t j = threadIdx.x; j < n4; j += blockDim.x) {
    const std::uint32_t i = head + 4 * j;
    float pp[4], mm[4], vv[4], gg[4];
    load4(p + i, pp);
    load4(m + i, mm);
    load4(v + i, vv);
    load4(g + i, gg);
#pragma unroll
    for (int q = 0; q < 4; ++q) adam_update(pp[q], mm[q], vv[q], unscale(gg[q], scale), k);
    store4(p + i, pp);
    store4(m + i, mm);
    store4(v + i, vv);
    if constexpr (!std::is_void_v<P>) {
      if (out) store4(out + i, pp);
    }
  }
  for (std::uint32_t i = head + 4 * n4 + threadIdx.x; i < n; i += blockDim.x) scalar(i);
}

}  // namespace detail

/// One block per chunk of one tensor of the list.
template <class G, class P>
__global__ void __launch_bounds__(kBlockThreads)
    multi_tensor_adam_kernel(const Chunk* __restrict__ chunks, const AdamTensor<G, P>* __restrict__ tensors,
                             const AdamStepConsts* __restrict__ consts, float scale) {
  const Chunk c = chunks[blockIdx.x];
  const AdamTensor<G, P> t = tensors[c.item];
  P* out = nullptr;
  if constexpr (!std::is_void_v<P>) out = t.out ? t.out + c.begin : nullptr;
  detail::adam_chunk(t.master + c.begin, t.m + c.begin, t.v + c.begin, t.grad + c.begin, out, c.numel, consts[t.group],
                     scale);
}

/// One contiguous tensor: block b processes elements [b * kChunkElements, ...).
template <class G, class P>
__global__ void __launch_bounds__(kBlockThreads)
    flat_adam_kernel(float* master, float* m, float* v, const G* grad, P* out, std::size_t n, AdamStepConsts k,
                     float scale) {
  const std::size_t begin = static_cast<std::size_t>(blockIdx.x) * kChunkElements;
  const std::size_t len = n - begin < kChunkElements ? n - begin : kChunkElements;
  P* o = nullptr;
  if constexpr (!std::is_void_v<P>) o = out ? out + begin : nullptr;
  detail::adam_chunk(master + begin, m + begin, v + begin, grad + begin, o, static_cast<std::uint32_t>(len), k, scale);
}

/// One fused step over n elements of device memory (the host fused_adam's contract; out may be null).
template <class G, class P>
void fused_adam(float* master, float* m, float* v, const G* grad, P* out, std::size_t n, const AdamStepConsts& k,
                float grad_scale, cudaStream_t stream = nullptr) {
  if (n == 0) return;
  const unsigned blocks = detail::grid_for((n + kChunkElements - 1) / kChunkElements, "kernels::cuda::fused_adam");
  flat_adam_kernel<G, P><<<blocks, kBlockThreads, 0, stream>>>(master, m, v, grad, out, n, k, grad_scale);
  ZEROTK_CUDA_CHECK_LAUNCH();
}
template <class G>
void fused_adam(float* master, float* m, float* v, const G* grad, std::nullptr_t, std::size_t n,
                const AdamStepConsts& k, float grad_scale, cudaStream_t stream = nullptr) {
  fused_adam<G, void>(master, m, v, grad, nullptr, n, k, grad_scale, stream);
}

/// One launch over a list of tensors (any count, any sizes); item i uses group_consts[items[i].group].
template <class G, class P>
void fused_adam(std::span<const AdamTensor<G, P>> tensors, std::span<const AdamStepConsts> group_consts,
                float grad_scale, Workspace& ws, cudaStream_t stream = nullptr) {
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].group >= group_consts.size()) {
      throw usage_error("tensor names a group without step constants", "kernels::cuda::fused_adam: tensor " + std::to_string(i),
                        std::to_string(tensors[i].group) + " >= " + std::to_string(group_consts.size()));
    }
  }
  std::vector<Chunk> chunks;
  append_chunks(tensors.size(), [&](std::size_t i) { return tensors[i].numel; }, chunks);
  if (chunks.empty()) return;
  ws.reset();
  const std::size_t oc = ws.stage(chunks), ot = ws.stage(tensors.data(), tensors.size()),
                    ok = ws.stage(group_consts.data(), group_consts.size());
  ws.upload(stream);
  multi_tensor_adam_kernel<G, P><<<detail::grid_for(chunks.size(), "kernels::cuda::fused_adam"), kBlockThreads, 0, stream>>>(
      ws.device<Chunk>(oc), ws.device<AdamTensor<G, P>>(ot), ws.device<AdamStepConsts>(ok), grad_scale);
  ZEROTK_CUDA_CHECK_LAUNCH();
}

/// Segments of flat device buffers (a ZeRO partition), as the host multi-tensor form.
template <class G, class P>
void fused_adam(std::span<const Segment> segments, std::span<const AdamStepConsts> group_consts, float* master,
                float* m, float* v, const G* grads, P* out, float grad_scale, Workspace& ws,
                cudaStream_t stream = nullptr) {
  std::vector<AdamTensor<G, P>> items;
  items.reserve(segments.size());
  for (const Segment& s : segments) {
    P* o = nullptr;
    if constexpr (!std::is_void_v<P>) o = out ? out + s.out_at() : nullptr;
    items.push_back({master + s.offset, m + s.offset, v + s.offset, grads + s.grad_at(), o, s.numel, s.group});
  }
  fused_adam<G, P>(std::span<const AdamTensor<G, P>>(items), group_consts, grad_scale, ws, stream);
}

}  // namespace zerotk::kernels::cuda
