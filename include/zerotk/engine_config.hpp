#pragma once
/// \file zerotk/engine_config.hpp
/// From a resolved DeepSpeed config (zerotk/config/) to an Engine: the structure check, the run-time
/// options and the LR scheduler.
///
///   auto cfg = zerotk::config::load_file("ds_config.json", {.world_size = W});
///   using E = zerotk::Engine<zerotk::Partitioner<zerotk::Stage<2>>, zerotk::Optimizer<zerotk::AdamW>,
///                            zerotk::Precision<zerotk::fp16>>;
///   E engine(comm, model, zerotk::engine_options<E>(cfg));   // throws if cfg asks for another structure
///   if (auto s = zerotk::lr_scheduler(cfg)) engine.set_scheduler(*s);

#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "zerotk/config/options.hpp"
#include "zerotk/config/structure.hpp"
#include "zerotk/engine.hpp"
#include "zerotk/optim/schedulers.hpp"

namespace zerotk {

namespace detail {
inline optim::WarmupType warmup_type(config::WarmupType t) {
  return t == config::WarmupType::log ? optim::WarmupType::log : optim::WarmupType::linear;
}
}  // namespace detail

/// The numbers of `cfg` as EngineOptions for engine type E. Throws one config_error listing every
/// way `cfg` asks for a structure E was not compiled with, or a setting this version cannot honour.
template <class E>
EngineOptions engine_options(const config::Config& cfg) {
  std::vector<config_error> problems = config::check_structure<E>(cfg);
  if (cfg.prescale_gradients) {
    problems.emplace_back("not supported yet: zerotk averages gradients in the reduction (fp32 accumulation)",
                          "/prescale_gradients", "true");
  }
  if (cfg.gradient_predivide_factor != 1.0) {
    problems.emplace_back("not supported yet: zerotk averages gradients in the reduction (fp32 accumulation)",
                          "/gradient_predivide_factor", to_text(cfg.gradient_predivide_factor));
  }
  if (cfg.communication_data_type && *cfg.communication_data_type != cfg.precision()) {
    problems.emplace_back("not supported yet: gradients are reduced in the training precision",
                          "/communication_data_type", std::string(to_string(*cfg.communication_data_type)));
  }
  if (!problems.empty()) throw config::summarize(problems);

  using S = typename E::storage_type;
  EngineOptions o;
  // DeepSpeed counts bucket sizes in elements.
  o.bucket_bytes = static_cast<std::size_t>(cfg.zero_optimization.reduce_bucket_size) * sizeof(S);
  o.gradient_accumulation_steps = static_cast<int>(cfg.gradient_accumulation_steps);
  o.gradient_clipping = cfg.gradient_clipping;
  o.overlap_comm = cfg.zero_optimization.overlap_comm;
  if (cfg.optimizer) {
    const config::OptimizerOptions& p = *cfg.optimizer;
    o.optimizer.lr = static_cast<float>(p.lr);
    o.optimizer.beta1 = static_cast<float>(p.betas[0]);
    o.optimizer.beta2 = static_cast<float>(p.betas[1]);
    o.optimizer.eps = static_cast<float>(p.eps);
    o.optimizer.weight_decay = static_cast<float>(p.weight_decay);
    o.optimizer.bias_correction = p.bias_correction;
    o.optimizer.lamb_min_coeff = static_cast<float>(p.min_coeff);
    o.optimizer.lamb_max_coeff = static_cast<float>(p.max_coeff);
  }
  const config::Fp16Options& f = cfg.fp16;
  o.loss_scaler.initial_scale_power = f.initial_scale_power;
  o.loss_scaler.loss_scale_window = f.loss_scale_window;
  o.loss_scaler.hysteresis = f.hysteresis;
  o.loss_scaler.consecutive_hysteresis = f.consecutive_hysteresis;
  o.loss_scaler.min_loss_scale = f.min_loss_scale;
  o.loss_scaler.static_scale = f.loss_scale;
  return o;
}

/// The scheduler of `cfg`, if it has one, at iteration -1 (the engine steps it).
inline std::optional<LrScheduler> lr_scheduler(const config::Config& cfg) {
  if (!cfg.scheduler) return std::nullopt;
  const double base_lr = cfg.optimizer ? cfg.optimizer->lr : 1e-3;
  return std::visit(
      [&](const auto& p) -> std::optional<LrScheduler> {
        using P = std::remove_cvref_t<decltype(p)>;
        if constexpr (std::is_same_v<P, config::WarmupDecayLRParams>) {
          optim::WarmupDecayLROptions o;
          o.total_num_steps = p.total_num_steps;
          o.warmup_min_lr = p.warmup_min_lr;
          o.warmup_max_lr = p.warmup_max_lr;
          o.warmup_num_steps = p.warmup_num_steps;
          o.warmup_type = detail::warmup_type(p.warmup_type);
          return LrScheduler(optim::WarmupDecayLR(o));
        } else if constexpr (std::is_same_v<P, config::WarmupLRParams>) {
          optim::WarmupLROptions o;
          o.warmup_min_lr = p.warmup_min_lr;
          o.warmup_max_lr = p.warmup_max_lr;
          o.warmup_num_steps = p.warmup_num_steps;
          o.warmup_type = detail::warmup_type(p.warmup_type);
          return LrScheduler(optim::WarmupLR(o, base_lr));
        } else if constexpr (std::is_same_v<P, config::WarmupCosineLRParams>) {
          optim::WarmupCosineLROptions o;
          o.total_num_steps = p.total_num_steps;
          o.warmup_min_ratio = p.warmup_min_ratio;
          o.warmup_num_steps = p.warmup_num_steps;
          o.cos_min_ratio = p.cos_min_ratio;
          o.warmup_type = detail::warmup_type(p.warmup_type);
          return LrScheduler(optim::WarmupCosineLR(o, base_lr));
        } else if constexpr (std::is_same_v<P, config::OneCycleParams>) {
          optim::OneCycleOptions o;
          o.cycle_min_lr = p.cycle_min_lr;
          o.cycle_max_lr = p.cycle_max_lr;
          o.decay_lr_rate = p.decay_lr_rate;
          o.cycle_first_step_size = p.cycle_first_step_size;
          o.cycle_second_step_size = p.cycle_second_step_size;
          o.cycle_first_stair_count = p.cycle_first_stair_count;
          o.cycle_second_stair_count = p.cycle_second_stair_count;
          o.decay_step_size = p.decay_step_size;
          o.cycle_momentum = p.cycle_momentum;
          o.cycle_min_mom = p.cycle_min_mom;
          o.cycle_max_mom = p.cycle_max_mom;
          o.decay_mom_rate = p.decay_mom_rate;
          return LrScheduler(optim::OneCycle(o));
        } else {
          optim::LRRangeTestOptions o;
          o.lr_range_test_min_lr = p.lr_range_test_min_lr;
          o.lr_range_test_step_size = p.lr_range_test_step_size;
          o.lr_range_test_step_rate = p.lr_range_test_step_rate;
          o.lr_range_test_staircase = p.lr_range_test_staircase;
          return LrScheduler(optim::LRRangeTest(o));
        }
      },
      cfg.scheduler->params);
}

}  // namespace zerotk
