#pragma once
/// \file zerotk/optim/onebit_adam.hpp
/// `Optimizer<OneBitAdam>`: DeepSpeed's 1-bit Adam (SEMANTICS.md section 9). Three phases, chosen by
/// the step count t of the step being taken:
///
///   t = 1                   DeepSpeed's initialisation step: counted (the scheduler steps too), and
///                           nothing else changes: no parameter, no moment
///   warm-up                 Adam over the all-reduced (averaged) gradients, without bias correction
///                           and with decoupled decay: m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2,
///                           p -= lr (m / (sqrt(v) + eps) + wd p)
///   compressed              from the step after the first t >= max(2, freeze_step): the gradient
///                           all-reduce is off, m = b1 m + (1 - b1) g_local, then every tensor's m is
///                           replaced by its 1-bit compressed average over the ranks (compress/
///                           onebit_allreduce.hpp, worker and server error feedback per tensor), v is
///                           frozen, and p steps as above
///
/// The per-element math is Adam's (kernels/elementwise.hpp: adam_update with bias correction off,
/// adam_momentum, adam_apply), so the warm-up equals Optimizer<AdamW> with bias_correction = false
/// bit for bit. One world rank (W = 1) compresses nothing: DeepSpeed skips the exchange there too.
///
/// The optimizer holds no buffers. The exchange is a hook the engine sets
/// (`set_momentum_exchange`, engine/onebit_momentum.hpp keeps the error buffers); without one the
/// momentum stays local, which is the W = 1 behaviour. The engine also asks `gradients_local()`
/// after each step: true switches the stage-0 gradient all-reduce off for the next step's backward
/// (DeepSpeed's enable_backward_allreduce = False).
///
/// Deliberate differences: DeepSpeed decides the phase after loading a checkpoint by t >= freeze_step
/// alone; here the rule is the same at every step (after a load with t = 1 and freeze_step <= 1 the
/// next step is a warm-up step, in DeepSpeed compressed). DeepSpeed's `exp_avg_mask` (a per-group
/// tensor set from Python) has no equivalent.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "zerotk/optim/optimizer.hpp"

namespace zerotk {

template <>
class Optimizer<OneBitAdam> : public optim::detail::FreezePhaseCore {
 public:
  using policy_kind = policy::optimizer;
  using tag = OneBitAdam;
  using State = OptimizerState;
  using consts_type = kernels::AdamStepConsts;

  // Phase, next_phase(), gradients_local(), set_freeze_step() and the momentum exchange (each
  // segment's m exchanged on its own): optim::detail::FreezePhaseCore.
  using FreezePhaseCore::FreezePhaseCore;

  /// The kernel constants of the step about to be taken, one per group: Adam's with decoupled decay
  /// and no bias correction.
  std::vector<kernels::AdamStepConsts> step_consts() const {
    return optim::detail::adam_step_consts(groups_, step_ + 1, /*adamw_mode=*/true, /*allow_bias_correction=*/false);
  }
};

}  // namespace zerotk
