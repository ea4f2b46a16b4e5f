#pragma once
/// \file zerotk/kernels/host/lamb.hpp
/// Fused LAMB on the host, in two passes because the trust ratio needs whole-tensor norms:
///
///   phase 1 (one pass): unscale g, update m and v, form u = m / (sqrt(v) + eps) + wd * p, and
///            accumulate ||p||^2 and ||u||^2 per tensor in fp64 (deterministic blocks, reduce.hpp).
///   [the caller sums the per-tensor partial sums over ranks]
///   phase 2 (one pass): recompute u from p, m, v (the same bits as phase 1, no scratch buffer), apply
///            p -= step_size * trust_ratio * u, write the working copy.
///
/// Traffic: phase 1 reads p, g, m, v and writes m, v; phase 2 reads p, m, v and writes p (+ copy).

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
#include "zerotk/kernels/host/simd.hpp"
#include "zerotk/kernels/tensor_list.hpp"

namespace zerotk::kernels::host {

namespace detail {

struct LambMomentsKernel {
  // sums[0] += ||p||^2, sums[1] += ||u||^2 over this range (one fixed block).
  template <class S, class G>
  static ZEROTK_FORCEINLINE void run(const float* p, float* m, float* v, const G* g, std::size_t n, LambStepConsts k, float scale,
                  double* sums) {
    using V = typename S::F32;
    auto acc_p = S::sumsq_zero(), acc_u = S::sumsq_zero();
    std::size_t i = 0;
    for (; i + 32 <= n; i += 32) {
      for (int h = 0; h < static_cast<int>(32 / S::width); ++h) {
        const std::size_t j = i + static_cast<std::size_t>(h) * S::width;
        const V pp = S::load(p + j);
        V mm = S::load(m + j), vv = S::load(v + j);
        const V u = lamb_moments(pp, mm, vv, unscale(S::load(g + j), scale), k);
        S::store(m + j, mm);
        S::store(v + j, vv);
        S::sumsq_add(acc_p, pp, h);
        S::sumsq_add(acc_u, u, h);
      }
    }
    double lanes[32];
    S::sumsq_lanes(acc_p, lanes);
    double sp = tree_sum(lanes);
    S::sumsq_lanes(acc_u, lanes);
    double su = tree_sum(lanes);
    for (; i < n; ++i) {
      float mm = m[i], vv = v[i];
      const float u = lamb_moments(p[i], mm, vv, unscale(to_float(g[i]), scale), k);
      m[i] = mm;
      v[i] = vv;
      const double dp = p[i], du = u;
      sp = dp * dp + sp;
      su = du * du + su;
    }
    sums[0] = sp;
    sums[1] = su;
  }
};

struct LambApplyKernel {
  template <class S, class P>
  static ZEROTK_FORCEINLINE void run(float* p, const float* m, const float* v, P* out, std::size_t n, LambStepConsts k, float scaled_step) {
    using V = typename S::F32;
    std::size_t i = 0;
    if constexpr (S::width > 1) {
      for (; i + S::width <= n; i += S::width) {
        V pp = S::load(p + i);
        const V u = lamb_direction(pp, S::load(m + i), S::load(v + i), k);
        lamb_apply(pp, u, scaled_step);
        S::store(p + i, pp);
        if constexpr (!std::is_void_v<P>) S::store(out + i, pp);
      }
    }
    for (; i < n; ++i) {
      float pp = p[i];
      const float u = lamb_direction(pp, m[i], v[i], k);
      lamb_apply(pp, u, scaled_step);
      p[i] = pp;
      if constexpr (!std::is_void_v<P>) out[i] = from_float<P>(pp);
    }
  }
};

inline void check_segments(std::span<const Segment> segments, std::size_t groups, std::size_t tensor_slots,
                           const char* where) {
  for (const Segment& s : segments) {
    if (s.group >= groups) {
      throw usage_error("segment names a group without step constants", where,
                        std::to_string(s.group) + " >= " + std::to_string(groups));
    }
    if (s.tensor >= tensor_slots) {
      throw usage_error("segment tensor id outside the per-tensor sums", where,
                        std::to_string(s.tensor) + " >= " + std::to_string(tensor_slots));
    }
  }
}

}  // namespace detail

/// LAMB phase 1 over segments of a flat partition: updates m and v and ADDS each segment's ||p||^2
/// and ||u||^2 into tensor_sums[2 * tensor] and tensor_sums[2 * tensor + 1] (layout [tensor][2];
/// segments of one tensor are added in segment order). Segment s uses group_consts[s.group].
template <FloatingElement G>
void lamb_phase1(std::span<const Segment> segments, std::span<const LambStepConsts> group_consts, const float* master,
                 float* m, float* v, const G* grads, float grad_scale, std::span<double> tensor_sums) {
  detail::check_segments(segments, group_consts.size(), tensor_sums.size() / 2, "kernels::host::lamb_phase1");
  const simd::Isa isa = simd::active_isa();
  std::vector<std::size_t> first;
  const std::vector<Block> blocks =
      make_blocks(segments.size(), [&](std::size_t i) { return segments[i].numel; }, first);
  std::vector<double> partial(2 * blocks.size());
  for_each_block(blocks, [&](std::size_t bi, const Block& b) {
    const Segment& s = segments[b.tensor];
    const std::size_t at = s.offset + b.begin;
    simd::dispatch<detail::LambMomentsKernel>(isa, master + at, m + at, v + at, grads + s.grad_at() + b.begin,
                                              b.end - b.begin,
                                              group_consts[s.group], grad_scale, &partial[2 * bi]);
  });
  for (std::size_t i = 0; i < segments.size(); ++i) {
    double sp = 0.0, su = 0.0;
    for (std::size_t bi = first[i]; bi < first[i + 1]; ++bi) {
      sp += partial[2 * bi];
      su += partial[2 * bi + 1];
    }
    tensor_sums[2 * segments[i].tensor] += sp;
    tensor_sums[2 * segments[i].tensor + 1] += su;
  }
}

/// LAMB's parameter step over segments with each segment's scaled step given (scaled[i] for
/// segments[i]): p -= scaled * u, u recomputed from p, m, v (lamb_direction), and param_out (if not
/// null) = P(p). 1-bit LAMB's warm-up forms its own scaled steps (optim/onebit_lamb.hpp).
template <ParamOutElement P>
void lamb_apply_steps(std::span<const Segment> segments, std::span<const LambStepConsts> group_consts, float* master,
                      const float* m, const float* v, P* param_out, std::span<const float> scaled) {
  detail::check_segment_groups(segments, group_consts.size(), "kernels::host::lamb_apply_steps");
  if (scaled.size() != segments.size()) {
    throw usage_error("one scaled step per segment is required", "kernels::host::lamb_apply_steps",
                      std::to_string(scaled.size()) + " for " + std::to_string(segments.size()) + " segments");
  }
  const simd::Isa isa = simd::active_isa();
  for_each_piece(
      segments.size(), [&](std::size_t i) { return segments[i].numel; },
      [&](std::size_t i, std::size_t b, std::size_t e) {
        const std::size_t at = segments[i].offset + b;
        const LambStepConsts& k = group_consts[segments[i].group];
        if constexpr (std::is_void_v<P>) {
          simd::dispatch<detail::LambApplyKernel>(isa, master + at, m + at, v + at, static_cast<void*>(nullptr),
                                                  e - b, k, scaled[i]);
        } else if (param_out == nullptr) {
          simd::dispatch<detail::LambApplyKernel>(isa, master + at, m + at, v + at, static_cast<void*>(nullptr),
                                                  e - b, k, scaled[i]);
        } else {
          simd::dispatch<detail::LambApplyKernel>(isa, master + at, m + at, v + at, param_out + segments[i].out_at() + b,
                                                  e - b, k, scaled[i]);
        }
      });
}

/// LAMB phase 2 over segments: with the tensor sums complete (all ranks), p -= step_size *
/// trust_ratio(tensor) * u and param_out (if not null) = P(p).
template <ParamOutElement P>
void lamb_phase2(std::span<const Segment> segments, std::span<const LambStepConsts> group_consts, float* master,
                 const float* m, const float* v, P* param_out, std::span<const double> tensor_sums) {
  detail::check_segments(segments, group_consts.size(), tensor_sums.size() / 2, "kernels::host::lamb_phase2");
  std::vector<float> scaled(segments.size());
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const LambStepConsts& k = group_consts[segments[i].group];
    const std::size_t t = segments[i].tensor;
    scaled[i] = k.step_size * lamb_trust_ratio(tensor_sums[2 * t], tensor_sums[2 * t + 1], k);
  }
  lamb_apply_steps<P>(segments, group_consts, master, m, v, param_out, scaled);
}

/// nullptr working copy.
inline void lamb_phase2(std::span<const Segment> segments, std::span<const LambStepConsts> group_consts, float* master,
                        const float* m, const float* v, std::nullptr_t, std::span<const double> tensor_sums) {
  lamb_phase2<void>(segments, group_consts, master, m, v, nullptr, tensor_sums);
}

/// Both phases for one whole tensor on one process (tests, benchmarks, single-tensor users).
template <FloatingElement G, ParamOutElement P>
void fused_lamb(float* master, float* m, float* v, const G* grad, P* param_out, std::size_t n,
                const LambStepConsts& k, float grad_scale) {
  const Segment seg{0, n, 0, 0};
  double sums[2] = {0.0, 0.0};
  lamb_phase1<G>({&seg, 1}, {&k, 1}, master, m, v, grad, grad_scale, sums);
  lamb_phase2<P>({&seg, 1}, {&k, 1}, master, m, v, param_out, sums);
}

/// fused_lamb without a working copy.
template <FloatingElement G>
void fused_lamb(float* master, float* m, float* v, const G* grad, std::nullptr_t, std::size_t n,
                const LambStepConsts& k, float grad_scale) {
  fused_lamb<G, void>(master, m, v, grad, nullptr, n, k, grad_scale);
}

}  // namespace zerotk::kernels::host
