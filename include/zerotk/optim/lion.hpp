#pragma once
/// \file zerotk/optim/lion.hpp
/// `Optimizer<Lion>` (DeepSpeed `"type": "Lion"`, its FusedLion and DeepSpeedCPULion): one moment,
/// a sign update, decoupled weight decay. Per element, with g the unscaled (and clipped) gradient:
///
///   c = b1 m + (1 - b1) g                       fma(b1, m, (1 - b1) g)
///   p = p (1 - lr wd) + (c > 0 ? -lr : lr)      fma(p, 1 - lr wd, u), one rounding
///   m = b2 m + (1 - b2) g                       fma(b2, m, (1 - b2) g)
///
/// That is FusedLion's kernel (csrc/lion/multi_tensor_lion.cu: `c > 0 ? -lr : lr`, so c = 0 steps
/// by +lr; DeepSpeedCPULion's copysign steps by -lr at c = +0, the only place the two differ). The
/// defaults are DeepSpeed's (lr 1e-3, betas (0.9, 0.999), weight_decay 0; the Lion paper suggests
/// beta2 = 0.99, one key away); `eps` and `bias_correction` mean nothing to it and a config that
/// gives them is refused (the tag's params say which keys it reads). 1 - lr wd is computed in
/// double from the float lr and wd and rounded once, where the kernels' constants are made.
///
/// It is an elementwise optimizer (ElementwiseOptimizer): the rule below is its whole step, and
/// optim::Run runs it on the host and the GPU with the generic drivers; the state stores keep its
/// one moment (m, `exp_avg` in checkpoints) and it steps sub-group by sub-group under every offload.

#include <cstdint>
#include <vector>

#include "zerotk/core/macros.hpp"
#include "zerotk/kernels/elementwise.hpp"
#include "zerotk/optim/optimizer.hpp"

namespace zerotk {
namespace optim {

/// Lion's kernel constants of one group, each rounded to float once.
struct LionStepConsts {
  float lr;
  float decay;  ///< 1 - lr * weight_decay
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;

  static LionStepConsts make(const OptimizerOptions& o) {
    const float lr = static_cast<float>(o.lr), wd = static_cast<float>(o.weight_decay);
    const float b1 = static_cast<float>(o.beta1), b2 = static_cast<float>(o.beta2);
    return {lr, static_cast<float>(1.0 - static_cast<double>(lr) * static_cast<double>(wd)), b1,
            static_cast<float>(1.0 - static_cast<double>(b1)), b2, static_cast<float>(1.0 - static_cast<double>(b2))};
  }
};

/// Lion's per-element update: the one definition the host (SIMD and scalar) and the GPU run.
struct LionRule {
  using Consts = LionStepConsts;
  static constexpr int kMoments = 1;

  ZEROTK_HD_TEMPLATE
  template <class F>
  ZEROTK_HD ZEROTK_FORCEINLINE static void update(F& p, F& m, F& /*v: none*/, const F& g, const Consts& k) {
    using kernels::fma;
    using kernels::where_positive;
    const F c = fma(F(k.beta1), m, F(k.one_minus_beta1) * g);
    p = fma(p, F(k.decay), where_positive(c, F(-k.lr), F(k.lr)));
    m = fma(F(k.beta2), m, F(k.one_minus_beta2) * g);
  }
};

}  // namespace optim

/// Lion (DeepSpeed `"type": "Lion"`).
template <>
class Optimizer<Lion> : public optim::detail::OptimizerCore {
 public:
  using policy_kind = policy::optimizer;
  using tag = Lion;
  using rule = optim::LionRule;
  using OptimizerCore::OptimizerCore;

  /// DeepSpeed's defaults for Lion's keys (its FusedLion and DeepSpeedCPULion): those of
  /// OptimizerOptions, which are Adam's; eps and bias_correction are not read.
  static OptimizerOptions default_options() { return OptimizerOptions{}; }

  /// The kernel constants of the step about to be taken, one per group (Lion has no bias correction:
  /// they do not depend on the step count).
  std::vector<optim::LionStepConsts> step_consts() const {
    std::vector<optim::LionStepConsts> k;
    k.reserve(groups_.size());
    for (const ParamGroup& g : groups_) k.push_back(optim::LionStepConsts::make(g.options));
    return k;
  }
};

}  // namespace zerotk
