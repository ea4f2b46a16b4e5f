#pragma once
/// \file zerotk/kernels/cuda/elementwise_step.cuh
/// One fused optimizer step of any elementwise rule on the GPU (kernels/host/elementwise_step.hpp
/// says what a rule is): one multi-tensor launch over the segments, the rule's ZEROTK_HD update per
/// element, so the bits are the host driver's. 4-wide loads where every pointer allows them.
///
///   cuda::elementwise_step<Rule, G, P>(segments, group_consts, master, m, v, grads, out, scale, ws, stream);

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

/// Device pointers of one item of a rule's launch (v unused by one-moment rules; out may be null).
template <class G, class P>
struct RuleTensor {
  float* master;
  float* m;
  float* v;
  const G* grad;
  P* out;
  std::size_t numel;
  std::uint32_t group;  ///< index into the launch's constants
};

namespace detail {

template <class Rule, class G, class P>
__device__ __forceinline__ void rule_chunk(float* p, float* m, float* v, const G* g, P* out, std::uint32_t n,
                                           const typename Rule::Consts& k, float scale) {
  constexpr bool kV = Rule::kMoments >= 2;
  const auto scalar = [&](std::uint32_t i) {
    float pp = p[i], mm = m[i], vv = kV ? v[i] : 0.0f;
    Rule::update(pp, mm, vv, unscale(to_float(g[i]), scale), k);
    p[i] = pp;
    m[i] = mm;
    if constexpr (kV) v[i] = vv;
    if constexpr (!std::is_void_v<P>) {
      if (out) out[i] = from_float<P>(pp);
    }
  };
  std::uint32_t head = static_cast<std::uint32_t>((16 - reinterpret_cast<std::uintptr_t>(p) % 16) % 16 / sizeof(float));
  head = head < n ? head : n;
  P* out_h = nullptr;
  if constexpr (!std::is_void_v<P>) out_h = out ? out + head : nullptr;
  if (!(aligned<16>(m + head) && (!kV || aligned<16>(v + head)) && vec4_ok(g + head) && vec4_ok(out_h))) {
    for (std::uint32_t i = threadIdx.x; i < n; i += blockDim.x) scalar(i);
    return;
  }
  if (threadIdx.x < head) scalar(threadIdx.x);
  const std::uint32_t n4 = (n - head) / 4;
  for (std::uint32_t j = threadIdx.x; j < n4; j += blockDim.x) {
    const std::uint32_t i = head + 4 * j;
    float pp[4], mm[4], vv[4] = {0.0f, 0.0f, 0.0f, 0.0f}, gg[4];
    load4(p + i, pp);
    load4(m + i, mm);
    if constexpr (kV) load4(v + i, vv);
    load4(g + i, gg);
#pragma unroll
    for (int q = 0; q < 4; ++q) Rule::update(pp[q], mm[q], vv[q], unscale(gg[q], scale), k);
    store4(p + i, pp);
    store4(m + i, mm);
    if constexpr (kV) store4(v + i, vv);
    if constexpr (!std::is_void_v<P>) {
      if (out) store4(out + i, pp);
    }
  }
  for (std::uint32_t i = head + 4 * n4 + threadIdx.x; i < n; i += blockDim.x) scalar(i);
}

}  // namespace detail

/// One block per chunk of one tensor of the list.
template <class Rule, class G, class P>
__global__ void __launch_bounds__(kBlockThreads)
    multi_tensor_rule_kernel(const Chunk* __restrict__ chunks, const RuleTensor<G, P>* __restrict__ tensors,
                             const typename Rule::Consts* __restrict__ consts, float scale) {
  const Chunk c = chunks[blockIdx.x];
  const RuleTensor<G, P> t = tensors[c.item];
  P* out = nullptr;
  if constexpr (!std::is_void_v<P>) out = t.out ? t.out + c.begin : nullptr;
  float* v = Rule::kMoments >= 2 ? t.v + c.begin : nullptr;
  detail::rule_chunk<Rule>(t.master + c.begin, t.m + c.begin, v, t.grad + c.begin, out, c.numel, consts[t.group], scale);
}

/// One launch of `Rule` over a list of tensors (any count, any sizes); item i uses
/// group_consts[items[i].group].
template <class Rule, class G, class P>
void step_tensors(std::span<const RuleTensor<G, P>> items, std::span<const typename Rule::Consts> group_consts,
                  float grad_scale, Workspace& ws, cudaStream_t stream, const char* where) {
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (items[i].group >= group_consts.size()) {
      throw usage_error("tensor names a group without step constants", std::string(where) + ": tensor " + std::to_string(i),
                        std::to_string(items[i].group) + " >= " + std::to_string(group_consts.size()));
    }
  }
  std::vector<Chunk> chunks;
  append_chunks(items.size(), [&](std::size_t i) { return items[i].numel; }, chunks);
  if (chunks.empty()) return;
  ws.reset();
  const std::size_t oc = ws.stage(chunks), ot = ws.stage(items.data(), items.size()),
                    ok = ws.stage(group_consts.data(), group_consts.size());
  ws.upload(stream);
  multi_tensor_rule_kernel<Rule, G, P><<<detail::grid_for(chunks.size(), where), kBlockThreads, 0, stream>>>(
      ws.device<Chunk>(oc), ws.device<RuleTensor<G, P>>(ot), ws.device<typename Rule::Consts>(ok), grad_scale);
  ZEROTK_CUDA_CHECK_LAUNCH();
}

/// One step of `Rule` over segments of flat device buffers (the host elementwise_step's contract).
template <class Rule, class G, class P>
void elementwise_step(std::span<const Segment> segments, std::span<const typename Rule::Consts> group_consts,
                      float* master, float* m, float* v, const G* grads, P* out, float grad_scale, Workspace& ws,
                      cudaStream_t stream = nullptr, const char* where = "kernels::cuda::elementwise_step") {
  std::vector<RuleTensor<G, P>> items;
  items.reserve(segments.size());
  for (const Segment& s : segments) {
    P* o = nullptr;
    if constexpr (!std::is_void_v<P>) o = out ? out + s.out_at() : nullptr;
    items.push_back({master + s.offset, m + s.offset, Rule::kMoments >= 2 ? v + s.offset : nullptr, grads + s.grad_at(),
                     o, s.numel, s.group});
  }
  step_tensors<Rule, G, P>(std::span<const RuleTensor<G, P>>(items), group_consts, grad_scale, ws, stream, where);
}

}  // namespace zerotk::kernels::cuda
