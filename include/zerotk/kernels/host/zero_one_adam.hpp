#pragma once
/// \file zerotk/kernels/host/zero_one_adam.hpp
/// The passes of 0/1 Adam's steps on the host, over segments of flat buffers (optim/zero_one_adam.hpp;
/// per-element math in kernels/elementwise.hpp, so an element gets the same bits on any thread count):
///
///   grad step (W > 1)   scaled_gradient (u := g * grad_scale), the all-reduce of u, momentum_from,
///                       zero(u), then onebit_adam.hpp's frozen_variance_step (v unchanged)
///   local step          frozen_local(..., sync = false)           m, p, u; writes param_out
///   sync step           frozen_local(..., sync = true)            m, p, u, then p -= u, u *= den
///                       ... all-reduce of u ...
///                       sync_finish                               m = -(u / L), p += u / den, u = 0;
///                                                                 writes param_out
///
/// m, v, u and master are indexed by partition offset, grads by grad_at(), param_out by out_at().

#include <algorithm>
#include <cstddef>
#include <span>
#include <type_traits>

#include "zerotk/core/dtype.hpp"
#include "zerotk/kernels/elementwise.hpp"
#include "zerotk/kernels/host/adam.hpp"
#include "zerotk/kernels/host/parallel.hpp"
#include "zerotk/kernels/tensor_list.hpp"

namespace zerotk::kernels::host::zero_one {

/// u[i] = grads[i] * grad_scale (fp32): the gradient the grad step all-reduces, in u's storage
/// (u is zero throughout the variance phase).
template <FloatingElement G>
void scaled_gradient(std::span<const Segment> segments, float* u, const G* grads, float grad_scale) {
  for_each_segment_piece(segments, [&](const Segment& s, std::size_t b, std::size_t e) {
    float* uu = u + s.offset;
    const G* g = grads + s.grad_at();
    for (std::size_t j = b; j < e; ++j) uu[j] = unscale(to_float(g[j]), grad_scale);
  });
}

/// m = b1 m + (1 - b1) u[i] (the all-reduced gradient of a grad step, indexed like m).
inline void momentum_from(std::span<const Segment> segments, std::span<const AdamStepConsts> group_consts, float* m,
                          const float* u) {
  host::detail::check_segment_groups(segments, group_consts.size(), "kernels::host::zero_one::momentum_from");
  for_each_segment_piece(segments, [&](const Segment& s, std::size_t b, std::size_t e) {
    const AdamStepConsts& k = group_consts[s.group];
    float* mm = m + s.offset;
    const float* uu = u + s.offset;
    for (std::size_t j = b; j < e; ++j) adam_momentum(mm[j], uu[j], k);
  });
}

/// u = 0 over every segment.
inline void zero(std::span<const Segment> segments, float* u) {
  for_each_segment_piece(segments, [&](const Segment& s, std::size_t b, std::size_t e) {
    std::fill(u + s.offset + b, u + s.offset + e, 0.0f);
  });
}

/// A frozen-phase local step (zero_one_local); with `sync`, also the first half of the sync
/// (zero_one_sync_out) and no param_out (the values change again in sync_finish).
template <FloatingElement G, ParamOutElement P>
void frozen_local(std::span<const Segment> segments, std::span<const AdamStepConsts> group_consts, float* master,
                  float* m, const float* v, float* u, const G* grads, float grad_scale, bool sync, P* param_out) {
  host::detail::check_segment_groups(segments, group_consts.size(), "kernels::host::zero_one::frozen_local");
  for_each_segment_piece(segments, [&](const Segment& s, std::size_t b, std::size_t e) {
    const AdamStepConsts& k = group_consts[s.group];
    float* p = master + s.offset;
    float* mm = m + s.offset;
    float* uu = u + s.offset;
    const float* vv = v + s.offset;
    const G* g = grads + s.grad_at();
    for (std::size_t j = b; j < e; ++j) {
      float x = p[j];
      zero_one_local(x, mm[j], uu[j], vv[j], unscale(to_float(g[j]), grad_scale), k);
      if (sync) {
        zero_one_sync_out(x, uu[j], vv[j], k);
      } else if constexpr (!std::is_void_v<P>) {
        if (param_out != nullptr) param_out[s.out_at() + j] = from_float<P>(x);
      }
      p[j] = x;
    }
  });
}

/// The second half of a sync (zero_one_sync_in) with group g's lr sum lr_sums[g], then param_out.
template <ParamOutElement P>
void sync_finish(std::span<const Segment> segments, std::span<const AdamStepConsts> group_consts,
                 std::span<const float> lr_sums, float* master, float* m, const float* v, float* u, P* param_out) {
  host::detail::check_segment_groups(segments, std::min(group_consts.size(), lr_sums.size()),
                                     "kernels::host::zero_one::sync_finish");
  for_each_segment_piece(segments, [&](const Segment& s, std::size_t b, std::size_t e) {
    const AdamStepConsts& k = group_consts[s.group];
    const float lr_sum = lr_sums[s.group];
    const bool lr_sum_zero = lr_sum == 0.0f;
    float* p = master + s.offset;
    float* mm = m + s.offset;
    float* uu = u + s.offset;
    const float* vv = v + s.offset;
    for (std::size_t j = b; j < e; ++j) {
      float x = p[j];
      zero_one_sync_in(x, mm[j], uu[j], vv[j], lr_sum, k, lr_sum_zero);
      p[j] = x;
      if constexpr (!std::is_void_v<P>) {
        if (param_out != nullptr) param_out[s.out_at() + j] = from_float<P>(x);
      }
    }
  });
}

}  // namespace zerotk::kernels::host::zero_one
