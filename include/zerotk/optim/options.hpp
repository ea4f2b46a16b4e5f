#pragma once
/// \file zerotk/optim/options.hpp
/// `zerotk::OptimizerOptions`, the hyper-parameters of one parameter group, and their validation.
/// A header of its own (no kernels) so the config layer can hold the struct directly.
///
/// The hyper-parameters are doubles: what a user or a config sets is what `Engine::lr()` and the
/// monitors report back (0.003, not 0.003000000026077032). The kernels compute in fp32 and round
/// each value to float once per step (kernels::AdamStepConsts / LambStepConsts), so `validate()`
/// also rejects every value that float cannot carry: one that would become inf, and a non-zero
/// one that would become 0 or a subnormal (which GPU kernels may flush to 0, so host and device
/// would disagree).

#include <charconv>
#include <cmath>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zerotk/core/error.hpp"

namespace zerotk {

/// Hyper-parameters of one parameter group, with DeepSpeed's defaults (JSON `optimizer.params`:
/// `betas` is [beta1, beta2], `min_coeff`/`max_coeff` are lamb_min_coeff/lamb_max_coeff).
struct OptimizerOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool bias_correction = true;
  double lamb_min_coeff = 0.01;  ///< LAMB trust-ratio clamp (ignored by Adam)
  double lamb_max_coeff = 10.0;
};

/// 1-bit LAMB's optimizer-wide keys with DeepSpeed's defaults (JSON `optimizer.params`; the trust
/// ratio's clamp max_coeff/min_coeff is per group, in OptimizerOptions). optim/onebit_lamb.hpp.
struct OneBitLambOptions {
  double coeff_beta = 0.9;        ///< EMA rate of the warm-up trust ratio, in [0, 1]
  double factor_max = 4.0;        ///< upper bound of the compression-phase factor, >= 0
  double factor_min = 0.5;        ///< lower bound, >= 0 (applied after factor_max: it wins when larger)
  double factor_threshold = 0.1;  ///< largest relative change of the factor per step, >= 0
};

namespace optim {

/// One rule of OptimizerOptions that a value breaks. `field` is the member's name.
struct OptionProblem {
  std::string_view field;
  std::string rule;
  double value = 0;
};

namespace detail {

/// Shortest text that reads back as the same double ("0.003", "1e-50", "inf").
inline std::string double_text(double v) {
  if (!std::isfinite(v)) return v != v ? "nan" : (v > 0 ? "inf" : "-inf");
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

}  // namespace detail

/// Why the fp32 kernels cannot carry the finite value `v`, or an empty string when they can.
/// (Tested on the double: converting a double beyond float's range is undefined behaviour.)
inline std::string float_range_problem(double v) {
  const double a = std::fabs(v);
  if (a > static_cast<double>(std::numeric_limits<float>::max())) {
    return "is beyond float's range (the optimizer kernels compute in fp32, where it becomes inf)";
  }
  if (a != 0 && a < static_cast<double>(std::numeric_limits<float>::min())) {
    return "is non-zero but below float's smallest normal value 1.1754944e-38 (the optimizer kernels compute in "
           "fp32, where it becomes 0 or a subnormal that GPUs flush to 0)";
  }
  return {};
}

/// Every rule of `o` that a value breaks, in member order (empty: `o` is valid).
inline std::vector<OptionProblem> problems(const OptimizerOptions& o) {
  std::vector<OptionProblem> out;
  auto check = [&](std::string_view field, double v, bool ok, std::string_view rule) {
    if (!ok) {
      out.push_back({field, std::string(rule), v});
    } else if (std::string why = float_range_problem(v); !why.empty()) {
      out.push_back({field, std::move(why), v});
    }
  };
  check("lr", o.lr, std::isfinite(o.lr) && o.lr >= 0, "must be finite and >= 0");
  for (const auto& [field, beta] : {std::pair<std::string_view, double>{"beta1", o.beta1}, {"beta2", o.beta2}}) {
    if (beta >= 0 && beta < 1 && static_cast<float>(beta) == 1.0f) {
      out.push_back({field, "must be in [0, 1) in float too (the kernels compute in fp32, where it rounds to 1)", beta});
    } else {
      check(field, beta, beta >= 0 && beta < 1, "must be in [0, 1)");
    }
  }
  check("eps", o.eps, std::isfinite(o.eps) && o.eps >= 0, "must be finite and >= 0");
  check("weight_decay", o.weight_decay, std::isfinite(o.weight_decay) && o.weight_decay >= 0,
        "must be finite and >= 0");
  check("lamb_min_coeff", o.lamb_min_coeff, std::isfinite(o.lamb_min_coeff) && o.lamb_min_coeff >= 0,
        "must be finite and >= 0");
  check("lamb_max_coeff", o.lamb_max_coeff, std::isfinite(o.lamb_max_coeff) && o.lamb_max_coeff >= o.lamb_min_coeff,
        "must be finite and >= lamb_min_coeff");
  return out;
}

/// \throws config_error for the first broken rule of `o`, whose where() is `prefix` + the member's
/// name (e.g. "optimizer.groups[1].beta2") and value() the offending value.
inline void validate(const OptimizerOptions& o, std::string_view prefix = "OptimizerOptions.") {
  const std::vector<OptionProblem> p = problems(o);
  if (!p.empty()) {
    throw config_error(p.front().rule, std::string(prefix) + std::string(p.front().field),
                       detail::double_text(p.front().value));
  }
}

/// \throws config_error naming `prefix` + the key (e.g. "optimizer.params.coeff_beta") for the first
/// value of `o` out of range: every value finite, coeff_beta in [0, 1], the others >= 0.
inline void validate(const OneBitLambOptions& o, std::string_view prefix = "optimizer.params.") {
  auto bad = [&](std::string_view key, double v, bool ok, const char* rule) {
    if (!ok) throw config_error(rule, std::string(prefix) + std::string(key), detail::double_text(v));
  };
  bad("coeff_beta", o.coeff_beta, o.coeff_beta >= 0 && o.coeff_beta <= 1, "must be in [0, 1]");
  bad("factor_max", o.factor_max, std::isfinite(o.factor_max) && o.factor_max >= 0, "must be finite and >= 0");
  bad("factor_min", o.factor_min, std::isfinite(o.factor_min) && o.factor_min >= 0, "must be finite and >= 0");
  bad("factor_threshold", o.factor_threshold, std::isfinite(o.factor_threshold) && o.factor_threshold >= 0,
      "must be finite and >= 0");
}

}  // namespace optim
}  // namespace zerotk
