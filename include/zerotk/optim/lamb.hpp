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

#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "zerotk/kernels/host/lamb.hpp"
#include "zerotk/optim/optimizer.hpp"

namespace zerotk {

/// LAMB (layer-wise adaptive moments, trust ratio per tensor).
template <>
class Optimizer<Lamb> : public optim::detail::OptimizerBase {
 public:
  using policy_kind = policy::optimizer;
  using tag = Lamb;
  using State = OptimizerState;
  using optim::detail::OptimizerBase::OptimizerBase;

  /// One step over this rank's partition (arguments as Optimizer<AdamW>::step). Phase 1 updates m, v
  /// and sums ||p||^2, ||u||^2 per tensor id; `reduce_tensor_sums(span)` then receives these partial
  /// sums laid out [tensor][2] (length 2 * max(tensor_count(), largest tensor id + 1)) and must sum
  /// them over ranks in place; phase 2 applies the trust-ratio step and writes param_out.
  template <FloatingElement G, kernels::host::ParamOutElement P, TensorSumReducer ReduceFn>
  void step(std::span<const Segment> segments, float* master, const G* grads, P* param_out, float grad_scale,
            ReduceFn&& reduce_tensor_sums) {
    std::size_t tensors = check_step(segments, master, grads);
    if (tensor_count_ > tensors) tensors = tensor_count_;
    const std::vector<kernels::LambStepConsts> consts = step_consts();
    ++step_;
    std::vector<double> sums(2 * tensors, 0.0);
    kernels::host::lamb_phase1<G>(segments, consts, master, m_.data(), v_.data(), grads, grad_scale, sums);
    reduce_tensor_sums(std::span<double>(sums));
    kernels::host::lamb_phase2<P>(segments, consts, master, m_.data(), v_.data(), param_out, sums);
  }
  template <FloatingElement G, TensorSumReducer ReduceFn>
  void step(std::span<const Segment> segments, float* master, const G* grads, std::nullptr_t, float grad_scale,
            ReduceFn&& reduce_tensor_sums) {
    step<G, void>(segments, master, grads, nullptr, grad_scale, std::forward<ReduceFn>(reduce_tensor_sums));
  }
  /// Single-process form (the partial sums are already complete); param_out may be nullptr.
  template <FloatingElement G, class Out>
  void step(std::span<const Segment> segments, float* master, const G* grads, Out param_out, float grad_scale) {
    step(segments, master, grads, param_out, grad_scale, [](std::span<double>) {});
  }

  /// The kernel constants of the step about to be taken (step_count() + 1), one per group.
  std::vector<kernels::LambStepConsts> step_consts() const {
    std::vector<kernels::LambStepConsts> k;
    k.reserve(groups_.size());
    for (const ParamGroup& g : groups_) {
      const OptimizerOptions& o = g.options;
      // The kernel boundary: each (validated) double is rounded to float once, here.
      k.push_back(kernels::LambStepConsts::make(
          {static_cast<float>(o.lr), static_cast<float>(o.beta1), static_cast<float>(o.beta2),
           static_cast<float>(o.eps), static_cast<float>(o.weight_decay), o.bias_correction,
           static_cast<float>(o.lamb_min_coeff), static_cast<float>(o.lamb_max_coeff)},
          step_ + 1));
    }
    return k;
  }
};

}  // namespace zerotk
