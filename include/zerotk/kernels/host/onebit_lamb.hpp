#pragma once
/// \file zerotk/kernels/host/onebit_lamb.hpp
/// The passes of a 1-bit LAMB step in its compression phase on the host (optim/onebit_lamb.hpp),
/// over segments of flat buffers. The warm-up phase is LAMB's own passes (kernels/host/lamb.hpp).
///
///   tensor_sumsq(segments, m, sums)                  per tensor ||m||^2 (the scaling coefficients)
///   scaled_momentum(segments, consts, k, m, a, g, s) a = m_prev = m, then m = (b1 m + (1 - b1) g) * k
///   ... the 1-bit all-reduce of the flat momentum ...
///   fresh(segments, consts, k, p, m, v, v_f, a, b, fmax)
///                                                    m /= k; v_f from the implied gradient; a = u0
///                                                    (over m_prev, which it no longer needs), b = upd;
///                                                    per tensor the factor max (sqrt(v)+eps)/(sqrt(v_f)+eps)
///   tensor_sumsq(segments, a | b, sums)              per tensor ||u0||^2, ||upd||^2 (weight decay only)
///   apply(segments, steps, p, b, out)                p -= step * upd; out = P(p)
///
/// The per-element math is kernels/elementwise.hpp's (onebit_lamb_momentum, onebit_lamb_fresh,
/// lamb_apply). Sums of squares are the reproducible ones (kernels/host/reduce.hpp): their bits
/// depend only on the values, not on threads or on how a tensor is cut into segments, so an
/// independent serial reference reproduces them with sum_squares over one vector.

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/kernels/elementwise.hpp"
#include "zerotk/kernels/host/adam.hpp"
#include "zerotk/kernels/host/parallel.hpp"
#include "zerotk/kernels/host/reduce.hpp"
#include "zerotk/kernels/tensor_list.hpp"

namespace zerotk::kernels::host::onebit_lamb {

namespace detail {

inline void check_per_segment(std::span<const Segment> segments, std::size_t values, const char* where) {
  if (values != segments.size()) {
    throw usage_error("one value per segment is required", where,
                      std::to_string(values) + " for " + std::to_string(segments.size()) + " segments");
  }
}

inline void check_tensor_slots(std::span<const Segment> segments, std::size_t slots, const char* where) {
  for (const Segment& s : segments) {
    if (s.tensor >= slots) {
      throw usage_error("segment tensor id outside the per-tensor values", where,
                        std::to_string(s.tensor) + " >= " + std::to_string(slots));
    }
  }
}

}  // namespace detail

/// dst = src over every segment (both indexed by partition offset): v_f = v at freeze_step.
inline void copy(std::span<const Segment> segments, const float* src, float* dst) {
  for_each_segment_piece(segments, [&](const Segment& s, std::size_t b, std::size_t e) {
    std::copy(src + s.offset + b, src + s.offset + e, dst + s.offset + b);
  });
}

/// sums[t] = the sum of squares of x over tensor t's segments (reproducible; +inf when one is inf or
/// NaN); tensors without segments get 0.
inline void tensor_sumsq(std::span<const Segment> segments, const float* x, std::span<double> sums) {
  detail::check_tensor_slots(segments, sums.size(), "kernels::host::onebit_lamb::tensor_sumsq");
  std::fill(sums.begin(), sums.end(), 0.0);
  host::detail::slot_sums<float>(
      segments.size(), [&](std::size_t i) { return x + segments[i].offset; },
      [&](std::size_t i) { return segments[i].numel; }, [&](std::size_t i) { return std::size_t{segments[i].tensor}; },
      sums.size(), sums.data(), /*add=*/false);
}

/// m_prev = m, then m = (b1 m + (1 - b1) g * grad_scale) * scaling[i] over segment i (m and m_prev
/// by partition offset, g by grad_at()): one pass over m.
template <FloatingElement G>
void scaled_momentum(std::span<const Segment> segments, std::span<const LambStepConsts> group_consts,
                     std::span<const float> scaling, float* m, float* m_prev, const G* grads, float grad_scale) {
  constexpr const char* kWhere = "kernels::host::onebit_lamb::scaled_momentum";
  host::detail::check_segment_groups(segments, group_consts.size(), kWhere);
  detail::check_per_segment(segments, scaling.size(), kWhere);
  for_each_piece(
      segments.size(), [&](std::size_t i) { return segments[i].numel; },
      [&](std::size_t i, std::size_t b, std::size_t e) {
        const Segment& s = segments[i];
        const LambStepConsts& k = group_consts[s.group];
        const float kf = scaling[i];
        float* mm = m + s.offset;
        float* prev = m_prev + s.offset;
        const G* g = grads + s.grad_at();
        for (std::size_t j = b; j < e; ++j) {
          prev[j] = mm[j];
          onebit_lamb_momentum(mm[j], unscale(to_float(g[j]), grad_scale), kf, k);
        }
      });
}

/// After the exchange, over segment i: m /= scaling[i], v_f updated, a = u0 (a holds m_prev on
/// entry), b = upd; fmax[t] = the largest (sqrt(v) + eps) / (sqrt(v_f) + eps) over tensor t, as a
/// double (tensors without segments get 0). The quotient's NaN never wins the max.
inline void fresh(std::span<const Segment> segments, std::span<const LambStepConsts> group_consts,
                  std::span<const float> scaling, const float* master, float* m, const float* v, float* vf, float* a,
                  float* b, std::span<double> fmax) {
  constexpr const char* kWhere = "kernels::host::onebit_lamb::fresh";
  host::detail::check_segment_groups(segments, group_consts.size(), kWhere);
  detail::check_per_segment(segments, scaling.size(), kWhere);
  detail::check_tensor_slots(segments, fmax.size(), kWhere);
  std::vector<std::size_t> first;
  const std::vector<Block> blocks = make_blocks(segments.size(), [&](std::size_t i) { return segments[i].numel; }, first);
  std::vector<float> partial(blocks.size(), 0.0f);
  for_each_block(blocks, [&](std::size_t bi, const Block& blk) {
    const Segment& s = segments[blk.tensor];
    const LambStepConsts& k = group_consts[s.group];
    const float kf = scaling[blk.tensor];
    float best = 0.0f;
    for (std::size_t j = s.offset + blk.begin; j < s.offset + blk.end; ++j) {
      const float q = onebit_lamb_fresh(master[j], m[j], vf[j], a[j], v[j], kf, k, a[j], b[j]);
      if (q > best) best = q;
    }
    partial[bi] = best;
  });
  std::fill(fmax.begin(), fmax.end(), 0.0);
  for (std::size_t i = 0; i < segments.size(); ++i) {
    double& f = fmax[segments[i].tensor];
    for (std::size_t bi = first[i]; bi < first[i + 1]; ++bi) f = std::max(f, static_cast<double>(partial[bi]));
  }
}

/// master -= steps[i] * upd over segment i (upd indexed by partition offset), then param_out at
/// out_at() = P(master) when param_out is not null.
template <ParamOutElement P>
void apply(std::span<const Segment> segments, std::span<const float> steps, float* master, const float* upd,
           P* param_out) {
  detail::check_per_segment(segments, steps.size(), "kernels::host::onebit_lamb::apply");
  for_each_piece(
      segments.size(), [&](std::size_t i) { return segments[i].numel; },
      [&](std::size_t i, std::size_t b, std::size_t e) {
        const Segment& s = segments[i];
        const float step = steps[i];
        float* p = master + s.offset;
        const float* u = upd + s.offset;
        for (std::size_t j = b; j < e; ++j) {
          float x = p[j];
          lamb_apply(x, u[j], step);
          p[j] = x;
          if constexpr (!std::is_void_v<P>) {
            if (param_out != nullptr) param_out[s.out_at() + j] = from_float<P>(x);
          }
        }
      });
}

}  // namespace zerotk::kernels::host::onebit_lamb
