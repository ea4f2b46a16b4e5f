#pragma once
/// \file zerotk/kernels/host/adam.hpp
/// Fused Adam/AdamW on the host: one pass reads the gradient (fp32, fp16 or bf16) with the combined
/// unscale * clip factor folded in, updates the fp32 master and m, v in place, and writes the working
/// copy of the parameter (fp16, bf16 or fp32; optional). 28 bytes per parameter all in fp32.
///
///   kernels::host::fused_adam(master, m, v, grad16, param16, n, AdamStepConsts::make(h, t), 1 / scale);
///
/// fused_adam_values computes the same step's working copy without writing master, m or v (16 bytes
/// read, the working copy written): a step whose values must be out before its state may change
/// (offload/writer_passes.hpp) runs it, then fused_adam with no output.
///
/// Element i's result does not depend on n, on where the call's range starts, on the thread count or
/// on the ISA chosen (see kernels/elementwise.hpp), so any partitioning of a buffer gives the same bits.

#include <cstddef>
#include <span>
#include <string>
#include <type_traits>

#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/kernels/elementwise.hpp"
#include "zerotk/kernels/host/elementwise_step.hpp"
#include "zerotk/kernels/host/parallel.hpp"
#include "zerotk/kernels/host/simd.hpp"
#include "zerotk/kernels/tensor_list.hpp"

namespace zerotk::kernels::host {

/// Pointers of one tensor for the list form of fused_adam (torch's "foreach" shape).
template <class G, class P = void>
struct AdamTensor {
  float* master;
  float* m;
  float* v;
  const G* grad;
  P* param_out;  ///< nullptr (or P = void) for no working copy
  std::size_t numel;
};

namespace detail {

/// kState: master, m and v are written back (fused_adam); else only read (fused_adam_values, which
/// hands them in cast from const). Adam is an elementwise rule: the generic span kernel runs it.
template <bool kState>
using AdamSpanKernelOf = RuleSpanKernel<AdamRule, kState>;
using AdamSpanKernel = AdamSpanKernelOf<true>;

}  // namespace detail

/// One fused Adam/AdamW step over n elements: g = grad[i] * grad_scale, update master[i], m[i], v[i]
/// and, when param_out is not null, param_out[i] = P(master[i]) rounded to nearest even.
/// The arrays must not overlap (param_out may not alias master).
template <FloatingElement G, ParamOutElement P>
void fused_adam(float* master, float* m, float* v, const G* grad, P* param_out, std::size_t n,
                const AdamStepConsts& k, float grad_scale) {
  const simd::Isa isa = simd::active_isa();
  for_each_share(n, [&](std::size_t b, std::size_t e) {
    P* out = nullptr;
    if constexpr (!std::is_void_v<P>) out = param_out ? param_out + b : nullptr;
    detail::rule_range<detail::AdamSpanKernel>(isa, master + b, m + b, v + b, grad + b, out, e - b, k, grad_scale);
  });
}

/// fused_adam without a working copy.
template <FloatingElement G>
void fused_adam(float* master, float* m, float* v, const G* grad, std::nullptr_t, std::size_t n,
                const AdamStepConsts& k, float grad_scale) {
  fused_adam<G, void>(master, m, v, grad, nullptr, n, k, grad_scale);
}


/// Multi-tensor form over segments of flat buffers (a ZeRO partition): master, m, v are indexed by
/// partition offset, grads and param_out by the segment's grad_at() / out_at(); segment s uses
/// group_consts[s.group]. One parallel pass.
template <FloatingElement G, ParamOutElement P>
void fused_adam(std::span<const Segment> segments, std::span<const AdamStepConsts> group_consts, float* master,
                float* m, float* v, const G* grads, P* param_out, float grad_scale) {
  detail::rule_segments<detail::AdamSpanKernel, AdamRule>(segments, group_consts, master, m, v, grads, param_out,
                                                         grad_scale, "kernels::host::fused_adam");
}

/// The working copy fused_adam would write with the same arguments, bit for bit, with master, m and
/// v only read: the step's values before its state changes. One parallel pass.
template <FloatingElement G, FloatingElement P>
void fused_adam_values(std::span<const Segment> segments, std::span<const AdamStepConsts> group_consts,
                       const float* master, const float* m, const float* v, const G* grads, P* param_out,
                       float grad_scale) {
  // The kernel never writes through these: AdamSpanKernelOf<false> only loads them.
  detail::rule_segments<detail::AdamSpanKernelOf<false>, AdamRule>(segments, group_consts, const_cast<float*>(master),
                                                         const_cast<float*>(m), const_cast<float*>(v), grads, param_out,
                                                         grad_scale, "kernels::host::fused_adam_values");
}

/// Multi-tensor form over separate tensors, all with the same constants. One parallel pass.
template <FloatingElement G, ParamOutElement P>
void fused_adam(std::span<const AdamTensor<G, P>> tensors, const AdamStepConsts& k, float grad_scale) {
  const simd::Isa isa = simd::active_isa();
  for_each_piece(
      tensors.size(), [&](std::size_t i) { return tensors[i].numel; },
      [&](std::size_t i, std::size_t b, std::size_t e) {
        const AdamTensor<G, P>& t = tensors[i];
        P* out = nullptr;
        if constexpr (!std::is_void_v<P>) out = t.param_out ? t.param_out + b : nullptr;
        detail::rule_range<detail::AdamSpanKernel>(isa, t.master + b, t.m + b, t.v + b, t.grad + b, out, e - b, k, grad_scale);
      });
}

}  // namespace zerotk::kernels::host
