#pragma once
/// \file zerotk/optim/onebit_options.hpp
/// OneBitOptions: the 1-bit optimizers' optimizer-wide keys, their own options struct with its check
/// (EngineOptions holds it as `onebit`; the config reader fills it from `optimizer.params`).

#include <cstdint>
#include <string>
#include <vector>

#include "zerotk/core/error.hpp"
#include "zerotk/optim/options.hpp"
#include "zerotk/optim/zero_one_schedule.hpp"

namespace zerotk {

/// The 1-bit optimizers' optimizer-wide keys: Optimizer<OneBitAdam> (optim/onebit_adam.hpp),
/// Optimizer<ZeroOneAdam> (optim/zero_one_adam.hpp) and Optimizer<OneBitLamb> (optim/onebit_lamb.hpp).
struct OneBitOptions {
  /// OneBitAdam, OneBitLamb: steps before the compressed phase (DeepSpeed `optimizer.params.freeze_step`); >= 0.
  std::int64_t freeze_step = 100'000;
  /// OneBitLamb: coeff_beta, factor_max, factor_min, factor_threshold.
  OneBitLambOptions lamb;
  /// ZeroOneAdam: var_freeze_step, var_update_scaler, local_step_scaler, local_step_clipper.
  optim::ZeroOneOptions zero_one;

  /// What is out of range, naming DeepSpeed's key (`optimizer.params.*`) and the value.
  void check(std::vector<config_error>& out) const {
    if (freeze_step < 0) out.emplace_back("must be >= 0", "optimizer.params.freeze_step", std::to_string(freeze_step));
    try {
      optim::validate(lamb);
      zero_one.validate();
    } catch (const config_error& e) {
      out.push_back(e);
    }
  }
};

}  // namespace zerotk
