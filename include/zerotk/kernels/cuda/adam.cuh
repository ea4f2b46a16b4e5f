#pragma once
/// \file zerotk/kernels/cuda/adam.cuh
/// Fused Adam/AdamW on the GPU: one pass per element, the per-element math of kernels/elementwise.hpp
/// (bit-identical to the host drivers) run as an elementwise rule (AdamRule) by the generic driver of
/// kernels/cuda/elementwise_step.cuh, 4-wide vector loads where every pointer allows them.
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
#include "zerotk/kernels/cuda/elementwise_step.cuh"
#include "zerotk/kernels/cuda/multi_tensor.cuh"
#include "zerotk/kernels/elementwise.hpp"
#include "zerotk/kernels/tensor_list.hpp"

namespace zerotk::kernels::cuda {

/// Device pointers of one item of a multi-tensor Adam launch. out may be null (no working copy).
template <class G, class P>
using AdamTensor = RuleTensor<G, P>;

/// One contiguous tensor: block b processes elements [b * kChunkElements, ...).
template <class G, class P>
__global__ void __launch_bounds__(kBlockThreads)
    flat_adam_kernel(float* master, float* m, float* v, const G* grad, P* out, std::size_t n, AdamStepConsts k,
                     float scale) {
  const std::size_t begin = static_cast<std::size_t>(blockIdx.x) * kChunkElements;
  const std::size_t len = n - begin < kChunkElements ? n - begin : kChunkElements;
  P* o = nullptr;
  if constexpr (!std::is_void_v<P>) o = out ? out + begin : nullptr;
  detail::rule_chunk<AdamRule>(master + begin, m + begin, v + begin, grad + begin, o, static_cast<std::uint32_t>(len), k,
                               scale);
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
  step_tensors<AdamRule, G, P>(tensors, group_consts, grad_scale, ws, stream, "kernels::cuda::fused_adam");
}

/// Segments of flat device buffers (a ZeRO partition), as the host multi-tensor form.
template <class G, class P>
void fused_adam(std::span<const Segment> segments, std::span<const AdamStepConsts> group_consts, float* master,
                float* m, float* v, const G* grads, P* out, float grad_scale, Workspace& ws,
                cudaStream_t stream = nullptr) {
  elementwise_step<AdamRule, G, P>(segments, group_consts, master, m, v, grads, out, grad_scale, ws, stream,
                                   "kernels::cuda::fused_adam");
}

}  // namespace zerotk::kernels::cuda
