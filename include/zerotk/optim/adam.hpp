#pragma once
/// \file zerotk/optim/adam.hpp
/// `Optimizer<Adam>` (L2 decay added to the gradient, DeepSpeed adam_w_mode = false) and
/// `Optimizer<AdamW>` (decoupled decay). Both use the fused form of SEMANTICS.md section 3 on every
/// back end (see kernels/elementwise.hpp):
///
///   Adam:  g' = g * grad_scale + wd * p
///   AdamW: g' = g * grad_scale
///   m = b1 m + (1 - b1) g';  v = b2 v + (1 - b2) g'^2
///   p -= lr * ( (m / bc1) / (sqrt(v / bc2) + eps) + [AdamW] wd * p ),   bc = 1 - beta^t (or 1)
///
/// torch.optim.AdamW decays first (p *= 1 - lr wd) and divides differently; the two agree in exact
/// arithmetic and differ by rounding only (tests/optim/test_adam_golden.cpp bounds the difference).

#include <cstddef>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "zerotk/optim/optimizer.hpp"

namespace zerotk {
namespace optim::detail {

template <bool AdamWMode>
class AdamOptimizer : public OptimizerBase {
 public:
  using State = OptimizerState;
  using OptimizerBase::OptimizerBase;

  /// One step over this rank's partition: for every segment, g = grads[i] * grad_scale, update
  /// master[i], m, v and, if param_out is not null, param_out[i] = P(master[i]); one pass.
  /// master, m, v are indexed by partition offset, grads and param_out by each segment's grad_at() /
  /// out_at() (the partition offset unless set). param_out may alias grads element for element (each
  /// gradient is read before the output at the same index is written); otherwise no overlap.
  /// `reduce_tensor_sums` is not called (Adam needs no cross-rank sums).
  template <FloatingElement G, kernels::host::ParamOutElement P, TensorSumReducer ReduceFn>
  void step(std::span<const Segment> segments, float* master, const G* grads, P* param_out, float grad_scale,
            ReduceFn&& reduce_tensor_sums) {
    (void)reduce_tensor_sums;
    check_step(segments, master, grads);
    const std::vector<kernels::AdamStepConsts> consts = step_consts();
    ++step_;
    kernels::host::fused_adam<G, P>(segments, consts, master, m_.data(), v_.data(), grads, param_out, grad_scale);
  }
  template <FloatingElement G, TensorSumReducer ReduceFn>
  void step(std::span<const Segment> segments, float* master, const G* grads, std::nullptr_t, float grad_scale,
            ReduceFn&& reduce_tensor_sums) {
    step<G, void>(segments, master, grads, nullptr, grad_scale, std::forward<ReduceFn>(reduce_tensor_sums));
  }
  /// Single-process form (nothing to reduce); param_out may be nullptr.
  template <FloatingElement G, class Out>
  void step(std::span<const Segment> segments, float* master, const G* grads, Out param_out, float grad_scale) {
    step(segments, master, grads, param_out, grad_scale, [](std::span<double>) {});
  }

  /// The kernel constants of the step about to be taken (step_count() + 1), one per group.
  std::vector<kernels::AdamStepConsts> step_consts() const {
    std::vector<kernels::AdamStepConsts> k;
    k.reserve(groups_.size());
    for (const ParamGroup& g : groups_) {
      const OptimizerOptions& o = g.options;
      // The kernel boundary: each (validated) double is rounded to float once, here.
      k.push_back(kernels::AdamStepConsts::make(
          {static_cast<float>(o.lr), static_cast<float>(o.beta1), static_cast<float>(o.beta2),
           static_cast<float>(o.eps), static_cast<float>(o.weight_decay), AdamWMode, o.bias_correction},
          step_ + 1));
    }
    return k;
  }
};

}  // namespace optim::detail

/// Adam with L2 weight decay (DeepSpeed `"type": "Adam", "adam_w_mode": false`).
template <>
class Optimizer<Adam> : public optim::detail::AdamOptimizer<false> {
 public:
  using policy_kind = policy::optimizer;
  using tag = Adam;
  using optim::detail::AdamOptimizer<false>::AdamOptimizer;
};

/// Adam with decoupled weight decay (DeepSpeed `"type": "AdamW"`, or "Adam" with adam_w_mode true).
template <>
class Optimizer<AdamW> : public optim::detail::AdamOptimizer<true> {
 public:
  using policy_kind = policy::optimizer;
  using tag = AdamW;
  using optim::detail::AdamOptimizer<true>::AdamOptimizer;
};

}  // namespace zerotk
