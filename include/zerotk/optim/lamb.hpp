#pragma once
/// \file zerotk/optim/lamb.hpp
/// `Optimizer<Lamb>`: LAMB as DeepSpeed's FusedLamb (SEMANTICS.md section 3), per tensor:
///
///   g' = g * grad_scale;  m = b1 m + (1 - b1) g';  v = b2 v + (1 - b2) g'^2
///   u  = m / (sqrt(v) + eps) + wd * p
///   ratio = clamp(||p|| / ||u||, lamb_min_coeff, lamb_max_coeff), or 1 when either norm is 0
///   p -= step_size * ratio * u,   step_size = lr * sqrt(1 - b2^t) / (1 - b1^t)  (lr without bias correction)
///
/// The norms are over whole tensors, which ZeRO may split over ranks: each rank sums its pieces
/// (fp64), the engine's reducer adds the partial sums over ranks, then every rank applies the update.
/// The kernels of both phases are chosen by memory space in optim/run.hpp and optim/run_cuda.cuh.

#include <cstdint>
#include <vector>

#include "zerotk/optim/optimizer.hpp"

namespace zerotk {

namespace optim::detail {

/// LAMB's kernel constants of step t, one per group (1-bit LAMB passes allow_bias_correction = false).
inline std::vector<kernels::LambStepConsts> lamb_step_consts(const std::vector<ParamGroup>& groups, std::int64_t t,
                                                             bool allow_bias_correction = true) {
  std::vector<kernels::LambStepConsts> k;
  k.reserve(groups.size());
  for (const ParamGroup& g : groups) {
    const OptimizerOptions& o = g.options;
    // The kernel boundary: each (validated) double is rounded to float once, here.
    k.push_back(kernels::LambStepConsts::make(
        {static_cast<float>(o.lr), static_cast<float>(o.beta1), static_cast<float>(o.beta2),
         static_cast<float>(o.eps), static_cast<float>(o.weight_decay), allow_bias_correction && o.bias_correction,
         static_cast<float>(o.lamb_min_coeff), static_cast<float>(o.lamb_max_coeff)},
        t));
  }
  return k;
}

}  // namespace optim::detail

/// LAMB (layer-wise adaptive moments, trust ratio per tensor).
template <>
class Optimizer<Lamb> : public optim::detail::OptimizerCore {
 public:
  using policy_kind = policy::optimizer;
  using tag = Lamb;
  using State = OptimizerState;
  using consts_type = kernels::LambStepConsts;
  using optim::detail::OptimizerCore::OptimizerCore;

  /// The kernel constants of the step about to be taken (step_count() + 1), one per group.
  std::vector<kernels::LambStepConsts> step_consts() const {
    return optim::detail::lamb_step_consts(groups_, step_ + 1);
  }
};

}  // namespace zerotk
