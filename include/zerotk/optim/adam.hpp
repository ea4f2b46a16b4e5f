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

#include <cstdint>
#include <vector>

#include "zerotk/optim/optimizer.hpp"

namespace zerotk {
namespace optim::detail {

/// The kernel constants of step `t` (1-based), one per group. The kernel boundary: each (validated)
/// double is rounded to float once, here. `allow_bias_correction` false ignores the groups'
/// bias_correction (1-bit Adam never corrects).
inline std::vector<kernels::AdamStepConsts> adam_step_consts(const std::vector<ParamGroup>& groups, std::int64_t t,
                                                             bool adamw_mode, bool allow_bias_correction = true) {
  std::vector<kernels::AdamStepConsts> k;
  k.reserve(groups.size());
  for (const ParamGroup& g : groups) {
    const OptimizerOptions& o = g.options;
    k.push_back(kernels::AdamStepConsts::make(
        {static_cast<float>(o.lr), static_cast<float>(o.beta1), static_cast<float>(o.beta2),
         static_cast<float>(o.eps), static_cast<float>(o.weight_decay), adamw_mode,
         allow_bias_correction && o.bias_correction},
        t));
  }
  return k;
}

template <bool AdamWMode>
class AdamOptimizer : public OptimizerCore {
 public:
  using State = OptimizerState;
  using consts_type = kernels::AdamStepConsts;
  static constexpr bool adam_w_mode = AdamWMode;
  using OptimizerCore::OptimizerCore;

  /// The kernel constants of the step about to be taken (step_count() + 1), one per group.
  std::vector<kernels::AdamStepConsts> step_consts() const { return adam_step_consts(groups_, step_ + 1, AdamWMode); }
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
