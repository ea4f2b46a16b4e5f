#pragma once
/// \file zerotk/kernels/host/onebit_adam.hpp
/// The two halves of a 1-bit Adam step in its compressed phase, on the host, over segments of flat
/// buffers (optim/onebit_adam.hpp): the local momentum update before the momentum is exchanged, and
/// the parameter step with the frozen second moment after it. Both are kernels/elementwise.hpp's
/// per-element Adam pieces (adam_momentum, adam_apply), so an element gets the same bits as in the
/// fused Adam pass, on any thread count.
///
///   kernels::host::momentum_update(segments, consts, m, grads, grad_scale);   // m = b1 m + (1 - b1) g
///   ... exchange m ...
///   kernels::host::frozen_variance_step(segments, consts, master, m, v, param_out);

#include <cstddef>
#include <span>
#include <type_traits>

#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/kernels/elementwise.hpp"
#include "zerotk/kernels/host/adam.hpp"
#include "zerotk/kernels/host/parallel.hpp"
#include "zerotk/kernels/tensor_list.hpp"

namespace zerotk::kernels::host {

/// m[i] = beta1 m[i] + (1 - beta1) grads[i] * grad_scale over every segment (m by partition offset,
/// grads by grad_at()); segment s uses group_consts[s.group].
template <FloatingElement G>
void momentum_update(std::span<const Segment> segments, std::span<const AdamStepConsts> group_consts, float* m,
                     const G* grads, float grad_scale) {
  detail::check_segment_groups(segments, group_consts.size(), "kernels::host::momentum_update");
  for_each_segment_piece(segments, [&](const Segment& s, std::size_t b, std::size_t e) {
    const AdamStepConsts& k = group_consts[s.group];
    float* mm = m + s.offset;
    const G* g = grads + s.grad_at();
    for (std::size_t j = b; j < e; ++j) adam_momentum(mm[j], unscale(to_float(g[j]), grad_scale), k);
  });
}

/// master[i] -= lr (m[i] / (sqrt(v[i]) + eps) + wd master[i]) (the constants' bias correction and
/// decay mode apply as in Adam), then param_out[out_at() + j] = P(master[i]) when param_out is not null.
template <ParamOutElement P>
void frozen_variance_step(std::span<const Segment> segments, std::span<const AdamStepConsts> group_consts,
                          float* master, const float* m, const float* v, P* param_out) {
  detail::check_segment_groups(segments, group_consts.size(), "kernels::host::frozen_variance_step");
  for_each_segment_piece(segments, [&](const Segment& s, std::size_t b, std::size_t e) {
    const AdamStepConsts& k = group_consts[s.group];
    float* p = master + s.offset;
    const float* mm = m + s.offset;
    const float* vv = v + s.offset;
    for (std::size_t j = b; j < e; ++j) {
      float x = p[j];
      adam_apply(x, mm[j], vv[j], k);
      p[j] = x;
      if constexpr (!std::is_void_v<P>) {
        if (param_out != nullptr) param_out[s.out_at() + j] = from_float<P>(x);
      }
    }
  });
}

}  // namespace zerotk::kernels::host
