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
///
/// The classes hold the groups and the step count; the kernels that apply the step are chosen by
/// memory space in optim/run.hpp (host) and optim/run_cuda.cuh (CUDA).

#include <vector>

#include "zerotk/optim/optimizer.hpp"

namespace zerotk {
namespace optim::detail {

template <bool AdamWMode>
class AdamOptimizer : public OptimizerCore {
 public:
  using State = OptimizerState;
  using consts_type = kernels::AdamStepConsts;
  static constexpr bool adam_w_mode = AdamWMode;
  using OptimizerCore::OptimizerCore;

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
