#pragma once
/// \file zerotk/config/optimizer.hpp
/// The `optimizer` and `scheduler` blocks: Reader::read_optimizer, read_scheduler. Declared in
/// config/reader.hpp and defined here (reader.hpp includes this file at its end), so one block's keys live
/// in one file.

#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "zerotk/config/options.hpp"
#include "zerotk/config/reader.hpp"

namespace zerotk::config::detail {

/// The optimizer's "type", matched case-insensitively against the tags' names (policies.hpp); an
/// error and nothing when it is absent, unknown or one of DeepSpeed's that zerotk lacks.
inline std::optional<OptimizerKind> Reader::read_optimizer_type(Block& b) {
  std::array<std::string_view, OptimizerKind::count()> types{};
  std::string supported;
  for (std::size_t i = 0; i < types.size(); ++i) {
    types[i] = OptimizerKind::at(i).name();
    supported += cat(i == 0 ? "" : i + 1 == types.size() ? " or " : ", ", types[i]);
  }
  // DeepSpeed's other optimizers (none of them is a tag).
  constexpr std::array<std::string_view, 10> kNotYet{"Adagrad", "MuAdam", "MuAdamW", "MuSGD", "Muon",
                                                     "SGD", "RMSprop", "Adamax", "CPUAdam", "FusedAdam"};
  std::string type;
  Got got_type = b.get_string("type", type);
  b.finish({{"legacy_fusion", "false"}});
  if (got_type == Got::absent) {
    error(b.path_of("type"), cat("required: the optimizer type (", supported, ")"));
    return std::nullopt;
  }
  if (got_type != Got::value) return std::nullopt;
  std::optional<OptimizerKind> kind;
  for (std::size_t i = 0; i < types.size(); ++i) {
    if (iequals(type, types[i])) kind = OptimizerKind::at(i);
  }
  if (kind) return kind;
  for (auto n : kNotYet) {
    if (iequals(type, n)) {
      error(b.path_of("type"), cat("optimizer not supported by zerotk yet (supported: ", supported, ")"),
            show_string(type));
      return std::nullopt;
    }
  }
  std::string rule = cat("unknown optimizer type (supported: ", supported, ")");
  if (auto m = closest_match(type, types)) rule += "; did you mean \"" + *m + "\"?";
  error(b.path_of("type"), std::move(rule), show_string(type));
  return std::nullopt;
}

/// lr, betas, eps, weight_decay and bias_correction, each where the optimizer's tag reads it, "auto"
/// resolved from the engine's hints.
inline void Reader::read_optimizer_hyper(Block& p, OptimizerBlock& o) {
  namespace keys = ::zerotk::optimizer_params;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  OptimizerOptions& h = o.params;  // the optimizer layer's own struct, filled in place
  if (o.kind.reads(keys::lr) && p.get_number("lr", h.lr, 0, false, kInf, true) == Got::automatic) {
    resolve_auto(p.path_of("lr"), h.lr, std::optional(ctx.lr.value_or(h.lr)), ctx.lr ? "engine" : "optimizer default");
  }
  std::array<double, 2> betas{h.beta1, h.beta2};
  if (o.kind.reads(keys::betas) && p.get_betas("betas", betas, true) == Got::automatic) {
    resolve_auto(p.path_of("betas"), betas, std::optional(ctx.betas.value_or(betas)),
                 ctx.betas ? "engine" : "optimizer default");
  }
  h.beta1 = betas[0];
  h.beta2 = betas[1];
  if (o.kind.reads(keys::eps) && p.get_number("eps", h.eps, 0, false, kInf, true) == Got::automatic) {
    resolve_auto(p.path_of("eps"), h.eps, std::optional(ctx.eps.value_or(h.eps)), ctx.eps ? "engine" : "optimizer default");
  }
  if (o.kind.reads(keys::weight_decay) &&
      p.get_number("weight_decay", h.weight_decay, 0, false, kInf, true) == Got::automatic) {
    resolve_auto(p.path_of("weight_decay"), h.weight_decay, std::optional(ctx.weight_decay.value_or(h.weight_decay)),
                 ctx.weight_decay ? "engine" : "optimizer default");
  }
  if (o.kind.reads(keys::bias_correction)) p.get_bool("bias_correction", h.bias_correction);
}

/// The keys of one family each: Adam's mode, LAMB's trust clamp, freeze steps, 0/1 Adam's and the
/// 1-bit optimizers' own.
inline void Reader::read_optimizer_family(Block& p, OptimizerBlock& o) {
  namespace keys = ::zerotk::optimizer_params;
  OptimizerOptions& h = o.params;
  // Read before "Adam" may become AdamW below.
  const bool adam_like = o.kind.reads(keys::adam_w_mode), lamb_like = o.kind.reads(keys::trust_clamp);
  const bool zero_one = o.kind.reads(keys::zero_one), onebit = o.kind.reads(keys::onebit_comm);
  if (adam_like) {
    bool w = true;
    if (p.get_bool("adam_w_mode", w) == Got::value && o.kind == OptimizerKind::adamw && !w) {
      error(p.path_of("adam_w_mode"), "AdamW always decouples weight decay; use \"type\": \"Adam\" for L2 mode", "false");
    }
    // "Adam" means AdamW unless adam_w_mode is false (DeepSpeed's FusedAdam default).
    if (o.kind == OptimizerKind::adam && w) o.kind = OptimizerKind::adamw;
    o.adam_w_mode = o.kind == OptimizerKind::adamw;
  }
  if (lamb_like) {
    p.get_number("max_coeff", h.lamb_max_coeff, 0);
    p.get_number("min_coeff", h.lamb_min_coeff, 0);
    if (h.lamb_min_coeff > h.lamb_max_coeff) {
      error(p.path_of("min_coeff"), cat("must be <= max_coeff (", num_text(h.lamb_max_coeff), ")"),
            num_text(h.lamb_min_coeff));
    }
  }
  constexpr std::int64_t kMaxInt = std::numeric_limits<std::int64_t>::max();
  if (o.kind.reads(keys::freeze_step)) p.get_int("freeze_step", o.freeze_step, 0, kMaxInt);
  if (zero_one) {  // 0/1 Adam has no freeze_step: its variance phase ends at var_freeze_step
    optim::ZeroOneOptions& z = o.zero_one;
    p.get_int("var_freeze_step", z.var_freeze_step, 0, kMaxInt);
    p.get_int("var_update_scaler", z.var_update_scaler, 1, kMaxInt);
    p.get_int("local_step_scaler", z.local_step_scaler, 1, kMaxInt);
    p.get_int("local_step_clipper", z.local_step_clipper, 1, kMaxInt);
  }
  if (onebit) {
    p.get_bool("cuda_aware", o.cuda_aware);
    p.get_string("comm_backend_name", o.comm_backend_name);
  }
  if (o.kind.reads(keys::onebit_lamb)) {
    p.get_number("coeff_beta", o.lamb.coeff_beta, 0, false, 1);
    p.get_number("factor_max", o.lamb.factor_max, 0);
    p.get_number("factor_min", o.lamb.factor_min, 0);
    p.get_number("factor_threshold", o.lamb.factor_threshold, 0);
  }
}

/// The optimizer layer's own rules, at JSON paths. They repeat the range checks above (a value those
/// rejected is not assigned, so it is not reported twice) and add what only they know: the kernels
/// round each value to float (lr 1e300 -> inf, eps 1e-50 -> 0, a beta -> 1), and an "auto" resolved
/// from an engine hint was not range-checked at all.
inline void Reader::check_optimizer_rules(Block& p, const OptimizerBlock& o) {
  namespace keys = ::zerotk::optimizer_params;
  const OptimizerOptions& h = o.params;
  const std::array<double, 2> betas{h.beta1, h.beta2};
  for (const optim::OptionProblem& e : optim::problems(h)) {
    const std::string_view key = optimizer_param_key(e.field);
    const bool beta = key == "betas";
    const unsigned flag = key == "lr" ? keys::lr : key == "betas" ? keys::betas : key == "eps" ? keys::eps
                          : key == "weight_decay" ? keys::weight_decay : keys::trust_clamp;
    if (!o.kind.reads(flag)) continue;  // not read, not used
    if (key == "max_coeff" && h.lamb_min_coeff > h.lamb_max_coeff) continue;  // reported at min_coeff above
    error(p.path_of(key), beta ? cat(e.field, " ", e.rule) : e.rule, beta ? text(betas) : num_text(e.value));
  }
}

inline void Reader::read_optimizer(Block& root, Config& c) {
  const Json* oj = root.get_object("optimizer");
  if (!oj) return;
  Block b(*this, oj, root.path_of("optimizer"));
  const Json* params_json = b.get_object("params");
  const std::optional<OptimizerKind> kind = read_optimizer_type(b);
  if (!kind) return;
  OptimizerBlock o;
  o.kind = *kind;
  Block p(*this, params_json, b.path_of("params"));
  if (const Json* m = p.find("max_grad_norm")) {
    error(p.path_of("max_grad_norm"),
          "max_grad_norm is not an optimizer parameter in DeepSpeed configs; use the top-level \"gradient_clipping\"",
          show(*m));
  }
  // Each key only where the optimizer's tag says it reads it (policies.hpp, optimizer_params).
  read_optimizer_hyper(p, o);
  read_optimizer_family(p, o);
  check_optimizer_rules(p, o);
  p.finish({{"amsgrad", "false"},
            {"torch_adam", "false", kTorchOnly},
            {"fused", "", kTorchOnly},
            {"eps_inside_sqrt", "false"}});
  c.optimizer = o;
}

/// warmup_type: "log" or "linear".
inline void Reader::read_warmup_type(Block& p, WarmupType& out) {
  constexpr std::array<std::string_view, 2> kWarm{"log", "linear"};
  std::size_t w = 0;
  if (p.get_choice("warmup_type", w, kWarm) == Got::value) out = static_cast<WarmupType>(w);
}

/// warmup_num_steps (>= 1, as WarmupLR needs), "auto" from the engine's hint.
inline void Reader::read_warmup_steps(Block& p, std::int64_t& out) {
  constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
  if (p.get_int("warmup_num_steps", out, 1, kMax, true) == Got::automatic) {  // as WarmupLR: N >= 1
    resolve_auto(p.path_of("warmup_num_steps"), out, std::optional(ctx.warmup_num_steps.value_or(out)),
                 ctx.warmup_num_steps ? "engine" : "scheduler default");
  }
}

/// total_num_steps, required by the decaying schedules; "auto" from the engine's hint.
inline void Reader::read_total_steps(Block& p, std::optional<std::int64_t>& out, SchedulerKind kind) {
  constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
  std::int64_t v = 0;
  Got g = p.get_int("total_num_steps", v, 1, kMax, true);
  if (g == Got::value) {
    out = v;
  } else if (g == Got::automatic) {
    if (resolve_auto(p.path_of("total_num_steps"), v, ctx.total_num_steps, "engine",
                     "write the number of optimizer steps, or give it (zerotk-config --total-steps N)")) {
      out = v;
    }
  } else if (g == Got::absent) {
    error(p.path_of("total_num_steps"), cat("required by ", to_string(kind)));
  }
}

/// OneCycle's keys (SchedulerKind::one_cycle).
inline void Reader::read_one_cycle(Block& p, SchedulerOptions& s) {
  constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
  OneCycleOptions o;
  auto required_lr = [&](std::string_view key, std::optional<double>& out) {
    double v = 0;
    const Got g = p.get_number(key, v, 0);
    if (g == Got::value) out = v;
    if (g == Got::absent) error(p.path_of(key), "required by OneCycle");
  };
  required_lr("cycle_min_lr", o.cycle_min_lr);
  required_lr("cycle_max_lr", o.cycle_max_lr);
  p.get_number("decay_lr_rate", o.decay_lr_rate, 0);
  p.get_int("cycle_first_step_size", o.cycle_first_step_size, 1, kMax);
  std::int64_t second = o.cycle_first_step_size;  // resolved: defaults to the first
  p.get_int("cycle_second_step_size", second, 1, kMax);
  o.cycle_second_step_size = second;
  p.get_int("cycle_first_stair_count", o.cycle_first_stair_count, 0, kMax);
  std::int64_t second_stairs = o.cycle_first_stair_count;
  p.get_int("cycle_second_stair_count", second_stairs, 0, kMax);
  o.cycle_second_stair_count = second_stairs;
  p.get_int("decay_step_size", o.decay_step_size, 0, kMax);
  p.get_bool("cycle_momentum", o.cycle_momentum);
  p.get_number("cycle_min_mom", o.cycle_min_mom, 0, false, 1);
  p.get_number("cycle_max_mom", o.cycle_max_mom, 0, false, 1);
  p.get_number("decay_mom_rate", o.decay_mom_rate, 0);
  p.get_int("last_batch_iteration", s.last_batch_iteration, -1, kMax);
  s.params = o;
}

/// LRRangeTest's keys (SchedulerKind::lr_range_test).
inline void Reader::read_lr_range_test(Block& p, SchedulerOptions& s) {
  constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
  LRRangeTestOptions l;
  p.get_number("lr_range_test_min_lr", l.lr_range_test_min_lr, 0);
  p.get_int("lr_range_test_step_size", l.lr_range_test_step_size, 1, kMax);
  p.get_number("lr_range_test_step_rate", l.lr_range_test_step_rate, 0);
  p.get_bool("lr_range_test_staircase", l.lr_range_test_staircase);
  p.get_int("last_batch_iteration", s.last_batch_iteration, -1, kMax);
  s.params = l;
}

/// The scheduler's learning rates: the engine writes them into the optimizer, whose kernels round
/// each to float.
inline void Reader::check_scheduler_lrs(Block& p, const SchedulerOptions& s) {
  auto lr_fits_float = [&](std::string_view key, std::optional<double> v) {
    if (!v) return;
    if (std::string why = optim::float_range_problem(*v); !why.empty()) error(p.path_of(key), why, num_text(*v));
  };
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, WarmupLROptions> || std::is_same_v<T, WarmupDecayLROptions>) {
          lr_fits_float("warmup_min_lr", x.warmup_min_lr);
          lr_fits_float("warmup_max_lr", x.warmup_max_lr);
        } else if constexpr (std::is_same_v<T, OneCycleOptions>) {
          lr_fits_float("cycle_min_lr", x.cycle_min_lr);
          lr_fits_float("cycle_max_lr", x.cycle_max_lr);
        } else if constexpr (std::is_same_v<T, LRRangeTestOptions>) {
          lr_fits_float("lr_range_test_min_lr", x.lr_range_test_min_lr);
        }
      },
      s.params);
}

inline void Reader::read_scheduler(Block& root, Config& c) {
  const Json* sj = root.get_object("scheduler");
  if (!sj) return;
  Block b(*this, sj, root.path_of("scheduler"));
  constexpr std::array<std::string_view, 5> kTypes{"WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle",
                                                   "LRRangeTest"};
  std::size_t t = 0;
  const Json* params_json = b.get_object("params");
  Got got = b.get_choice("type", t, kTypes);
  b.finish();
  if (got == Got::absent) error(b.path_of("type"), "required: the scheduler type (WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle or LRRangeTest)");
  if (got != Got::value) return;
  const auto kind = static_cast<SchedulerKind>(t);
  constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
  constexpr auto kInf = std::numeric_limits<double>::infinity();
  Block p(*this, params_json, b.path_of("params"));
  const double opt_lr = c.optimizer ? c.optimizer->params.lr : ctx.lr.value_or(optim::kDefaultOptimizerLr);

  SchedulerOptions s;
  auto last_iter = [&] { p.get_int("last_batch_iteration", s.last_batch_iteration, -1, kMax); };
  // WarmupLR and WarmupDecayLR: warmup_max_lr is resolved here, so it is set in either.
  auto warmup_lr = [&](auto& w, double max_default) {
    if (p.get_number("warmup_min_lr", w.warmup_min_lr, 0, false, kInf, true) == Got::automatic) {
      resolve_auto(p.path_of("warmup_min_lr"), w.warmup_min_lr, std::optional(0.0), "scheduler default");
    }
    double max_lr = max_default;
    if (p.get_number("warmup_max_lr", max_lr, 0, false, kInf, true) == Got::automatic) {
      resolve_auto(p.path_of("warmup_max_lr"), max_lr, std::optional(opt_lr), "optimizer lr");
    }
    w.warmup_max_lr = max_lr;
    read_warmup_steps(p, w.warmup_num_steps);
    read_warmup_type(p, w.warmup_type);
    last_iter();
  };

  switch (kind) {
    case SchedulerKind::warmup_lr: {
      WarmupLROptions w;
      warmup_lr(w, opt_lr);  // DeepSpeed: warmup_max_lr defaults to the optimizer's lr
      s.params = w;
      break;
    }
    case SchedulerKind::warmup_decay_lr: {
      WarmupDecayLROptions w;
      read_total_steps(p, w.total_num_steps, kind);
      warmup_lr(w, 1e-3);  // DeepSpeed's WarmupDecayLR signature defaults warmup_max_lr to 0.001
      s.params = w;
      break;
    }
    case SchedulerKind::warmup_cosine_lr: {
      WarmupCosineLROptions w;
      read_total_steps(p, w.total_num_steps, kind);
      p.get_number("warmup_min_ratio", w.warmup_min_ratio, 0, false, 1);
      p.get_number("cos_min_ratio", w.cos_min_ratio, 0, false, 1);
      read_warmup_steps(p, w.warmup_num_steps);
      read_warmup_type(p, w.warmup_type);
      last_iter();
      s.params = w;
      break;
    }
    case SchedulerKind::one_cycle:
      read_one_cycle(p, s);
      break;
    case SchedulerKind::lr_range_test:
      read_lr_range_test(p, s);
      break;
  }
  check_scheduler_lrs(p, s);
  p.finish();
  c.scheduler = s;
}

}  // namespace zerotk::config::detail
