#pragma once
/// \file zerotk/kernels/host/elementwise_step.hpp
/// One fused optimizer step of any elementwise rule on the host: the generic driver a new
/// optimizer gets without writing a kernel (optim/run.hpp runs it for every optimizer that names
/// a `rule`; kernels/cuda/elementwise_step.cuh is the GPU's). A rule is the per-element update,
/// written once as ZEROTK_HD code over a float-like type F (float on the GPU and in the host's tail,
/// a SIMD vector in the host's body), so host and device compute the same bits:
///
///   struct Rule {
///     using Consts = ...;                        // per parameter group, trivially copyable
///     static constexpr int kMoments = 1;         // 1: m only; 2: m and v
///     template <class F>
///     ZEROTK_HD static void update(F& p, F& m, F& v, const F& g, const Consts& k);  // v unused when 1
///   };
///
/// The driver reads the gradient (fp32, fp16 or bf16) times `grad_scale`, updates the fp32 master
/// and the moments in place and writes the working copy (optional), one pass, segment by segment
/// (master and moments at the segment's offset, gradients and output at grad_at() / out_at()).
/// elementwise_values computes the same step's working copy with master and moments only read.

#include <cstddef>
#include <span>
#include <string>
#include <type_traits>

#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/kernels/elementwise.hpp"
#include "zerotk/kernels/host/parallel.hpp"
#include "zerotk/kernels/host/simd.hpp"
#include "zerotk/kernels/tensor_list.hpp"

namespace zerotk::kernels::host {

/// Element types of a 16-bit (or fp32) working copy written by fused optimizers; void means none.
template <class P>
concept ParamOutElement = FloatingElement<P> || std::is_void_v<P>;

namespace detail {

/// Every segment's group has step constants (`groups` of them); `where` names the kernel.
inline void check_segment_groups(std::span<const Segment> segments, std::size_t groups, const char* where) {
  for (const Segment& s : segments) {
    if (s.group >= groups) {
      throw usage_error("segment names a group without step constants", where,
                        std::to_string(s.group) + " >= " + std::to_string(groups));
    }
  }
}


/// kState: master and moments are written back (a step); else only read (its values).
template <class Rule, bool kState>
struct RuleSpanKernel {
  template <class S, class G, class P>
  static ZEROTK_FORCEINLINE void run(float* p, float* m, float* v, const G* g, P* out, std::size_t n,
                                     typename Rule::Consts k, float scale) {
    using V = typename S::F32;
    constexpr bool kV = Rule::kMoments >= 2;
    std::size_t i = 0;
    if constexpr (S::width > 1) {
      for (; i + S::width <= n; i += S::width) {
        V pp = S::load(p + i), mm = S::load(m + i), vv = kV ? S::load(v + i) : V(0.0f);
        Rule::update(pp, mm, vv, unscale(S::load(g + i), scale), k);
        if constexpr (kState) {
          S::store(p + i, pp);
          S::store(m + i, mm);
          if constexpr (kV) S::store(v + i, vv);
        }
        if constexpr (!std::is_void_v<P>) S::store(out + i, pp);
      }
    }
    for (; i < n; ++i) {  // tail: the same rule on floats, the same bits
      float pp = p[i], mm = m[i], vv = kV ? v[i] : 0.0f;
      Rule::update(pp, mm, vv, unscale(to_float(g[i]), scale), k);
      if constexpr (kState) {
        p[i] = pp;
        m[i] = mm;
        if constexpr (kV) v[i] = vv;
      }
      if constexpr (!std::is_void_v<P>) out[i] = from_float<P>(pp);
    }
  }
};

/// One range of one span kernel on `isa`, with or without a working copy.
template <class Kernel, class G, class P, class Consts>
void rule_range(simd::Isa isa, float* p, float* m, float* v, const G* g, P* out, std::size_t n, const Consts& k,
                float scale) {
  if constexpr (std::is_void_v<P>) {
    simd::dispatch<Kernel>(isa, p, m, v, g, static_cast<void*>(nullptr), n, k, scale);
  } else if (out == nullptr) {
    simd::dispatch<Kernel>(isa, p, m, v, g, static_cast<void*>(nullptr), n, k, scale);
  } else {
    simd::dispatch<Kernel>(isa, p, m, v, g, out, n, k, scale);
  }
}

/// The segments form of a rule's step or values (Kernel: RuleSpanKernel<Rule, true / false>).
template <class Kernel, class Rule, class G, class P>
void rule_segments(std::span<const Segment> segments, std::span<const typename Rule::Consts> group_consts,
                   float* master, float* m, float* v, const G* grads, P* param_out, float grad_scale, const char* where) {
  check_segment_groups(segments, group_consts.size(), where);
  const simd::Isa isa = simd::active_isa();
  for_each_piece(
      segments.size(), [&](std::size_t i) { return segments[i].numel; },
      [&](std::size_t i, std::size_t b, std::size_t e) {
        const Segment& s = segments[i];
        const std::size_t at = s.offset + b;
        P* out = nullptr;
        if constexpr (!std::is_void_v<P>) out = param_out ? param_out + s.out_at() + b : nullptr;
        rule_range<Kernel>(isa, master + at, m + at, Rule::kMoments >= 2 ? v + at : nullptr, grads + s.grad_at() + b, out,
                           e - b, group_consts[s.group], grad_scale);
      });
}

}  // namespace detail

/// One step of `Rule` over the segments of flat buffers (a ZeRO partition); segment s uses
/// group_consts[s.group]. `v` is read only when the rule has two moments. One parallel pass.
template <class Rule, FloatingElement G, ParamOutElement P>
void elementwise_step(std::span<const Segment> segments, std::span<const typename Rule::Consts> group_consts,
                      float* master, float* m, float* v, const G* grads, P* param_out, float grad_scale) {
  detail::rule_segments<detail::RuleSpanKernel<Rule, true>, Rule>(segments, group_consts, master, m, v, grads, param_out,
                                                                  grad_scale, "kernels::host::elementwise_step");
}

/// The working copy elementwise_step would write with the same arguments, bit for bit, with master
/// and the moments only read.
template <class Rule, FloatingElement G, FloatingElement P>
void elementwise_values(std::span<const Segment> segments, std::span<const typename Rule::Consts> group_consts,
                        const float* master, const float* m, const float* v, const G* grads, P* param_out,
                        float grad_scale) {
  // The kernel never writes through these: RuleSpanKernel<Rule, false> only loads them.
  detail::rule_segments<detail::RuleSpanKernel<Rule, false>, Rule>(
      segments, group_consts, const_cast<float*>(master), const_cast<float*>(m), const_cast<float*>(v), grads,
      param_out, grad_scale, "kernels::host::elementwise_values");
}

}  // namespace zerotk::kernels::host
