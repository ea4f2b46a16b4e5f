#pragma once
/// \file zerotk/optim/schedulers.hpp
/// DeepSpeed's learning-rate schedules (SEMANTICS.md section 4): WarmupLR, WarmupDecayLR,
/// WarmupCosineLR, OneCycle (with momentum cycling) and LRRangeTest, plus `LrScheduler`, a
/// type-erased holder for when the schedule type is read from JSON.
///
/// Convention (DeepSpeed's): the iteration `it` starts at -1 and `step()` is called after every
/// optimizer step that was not skipped, so the k-th applied optimizer step (k = 1, 2, ...) runs with
/// `lr_at(k - 2)`. `lr()` is always the value for the next optimizer step:
///
///   zerotk::WarmupLR sched({.warmup_num_steps = 100}, /*optimizer_lr=*/3e-4);
///   for (...) {
///     group.lr = sched.lr();                     // first step: lr_at(-1)
///     if (!skipped) { optimizer.step(); sched.step(); }
///   }
///
/// Each formula is evaluated with the same operations in the same order as DeepSpeed v0.19.5, so
/// the values match DeepSpeed's bit for bit (log and cos up to the platform's libm).
/// Invalid parameters throw config_error whose `where` is the JSON path of the parameter,
/// e.g. "/scheduler/params/warmup_num_steps".

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <numbers>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

#include "zerotk/core/error.hpp"

namespace zerotk::optim {

/// DeepSpeed's default optimizer lr; WarmupLR and WarmupCosineLR take the optimizer's lr.
inline constexpr double kDefaultOptimizerLr = 1e-3;

/// The state DeepSpeed checkpoints for every schedule.
struct SchedulerState {
  std::int64_t last_batch_iteration = -1;
  friend bool operator==(const SchedulerState&, const SchedulerState&) = default;
};

/// Adam's (beta1, beta2) as OneCycle sets them.
struct Betas {
  double beta1 = 0.9;
  double beta2 = 0.999;
  friend bool operator==(const Betas&, const Betas&) = default;
};

/// How the warm-up phase rises from 0 to 1: log: ln(it+1)/ln(N); linear: it/N.
enum class WarmupType : std::uint8_t { log, linear };

constexpr std::string_view to_string(WarmupType t) noexcept { return t == WarmupType::log ? "log" : "linear"; }

/// Parses "log" / "linear". DeepSpeed warns and falls back to "log" on anything else; zerotk
/// rejects it, because a typo would silently change the schedule.
/// \throws config_error at `where`.
inline WarmupType warmup_type_from_string(std::string_view s, std::string where = "/scheduler/params/warmup_type") {
  if (s == "log") return WarmupType::log;
  if (s == "linear") return WarmupType::linear;
  throw config_error("must be \"log\" or \"linear\"", std::move(where), std::string(s));
}

// ---- options (DeepSpeed parameter names and defaults) -------------------------------------------

struct WarmupLROptions {
  double warmup_min_lr = 0;
  std::optional<double> warmup_max_lr{};  ///< unset: the optimizer's lr
  std::int64_t warmup_num_steps = 1000; ///< N; DeepSpeed uses max(2, N)
  WarmupType warmup_type = WarmupType::log;
};

struct WarmupDecayLROptions {
  std::optional<std::int64_t> total_num_steps{};  ///< T, required
  double warmup_min_lr = 0;
  double warmup_max_lr = 1e-3;  ///< DeepSpeed's WarmupDecayLR keeps 0.001 here (not the optimizer's lr)
  std::int64_t warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::log;
};

struct WarmupCosineLROptions {
  std::optional<std::int64_t> total_num_steps{};  ///< T, required
  double warmup_min_ratio = 0;
  std::int64_t warmup_num_steps = 1000;
  double cos_min_ratio = 1e-4;
  WarmupType warmup_type = WarmupType::log;
};

struct OneCycleOptions {
  std::optional<double> cycle_min_lr{};  ///< required
  std::optional<double> cycle_max_lr{};  ///< required
  double decay_lr_rate = 0;
  std::int64_t cycle_first_step_size = 2000;
  std::optional<std::int64_t> cycle_second_step_size{};    ///< unset: cycle_first_step_size
  std::int64_t cycle_first_stair_count = 0;              ///< 0: continuous
  std::optional<std::int64_t> cycle_second_stair_count{};  ///< unset: cycle_first_stair_count
  std::int64_t decay_step_size = 0;                      ///< 0: no decay after the cycle
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8;
  double cycle_max_mom = 0.9;
  double decay_mom_rate = 0;
};

struct LRRangeTestOptions {
  double lr_range_test_min_lr = 1e-3;
  std::int64_t lr_range_test_step_size = 2000;
  double lr_range_test_step_rate = 1.0;
  bool lr_range_test_staircase = false;
};

namespace detail {

inline std::string param_path(std::string_view name) { return "/scheduler/params/" + std::string(name); }

inline void require_param(bool ok, std::string_view name, std::string_view rule, const std::string& value) {
  if (!ok) throw config_error(std::string(rule), param_path(name), value);
}
inline void require_non_negative(double v, std::string_view name) {
  require_param(v >= 0 && std::isfinite(v), name, "must be >= 0 and finite", to_text(v));
}
inline void require_non_negative(std::int64_t v, std::string_view name) {
  require_param(v >= 0, name, "must be >= 0", to_text(v));
}
inline void require_positive(std::int64_t v, std::string_view name) {
  require_param(v > 0, name, "must be a positive integer", to_text(v));
}
template <class T>
T require_given(const std::optional<T>& v, std::string_view name) {
  if (!v) throw config_error("required", param_path(name));
  return *v;
}

inline void check_iteration(std::int64_t it, const char* where) {
  if (it < -1) throw usage_error("the iteration must be >= -1 (-1: before the first step)", where, to_text(it));
}

/// The warm-up ramp shared by WarmupLR, WarmupDecayLR and WarmupCosineLR.
struct WarmupRamp {
  std::int64_t steps;           // N = max(2, warmup_num_steps)
  WarmupType type;
  double inverse_log_steps;     // 1 / ln(N), as DeepSpeed precomputes it

  WarmupRamp(std::int64_t warmup_num_steps, WarmupType t)
      : steps(std::max<std::int64_t>(2, warmup_num_steps)),
        type(t),
        inverse_log_steps(1.0 / std::log(static_cast<double>(steps))) {}

  /// In [0, 1) for 0 <= it < steps.
  double gamma(std::int64_t it) const {
    return type == WarmupType::log ? inverse_log_steps * std::log(static_cast<double>(it + 1))
                                   : static_cast<double>(it) / static_cast<double>(steps);
  }
};

/// Iteration bookkeeping shared by every schedule (CRTP: Derived provides lr_at and may replace
/// momentum_at / betas_at, which default to "the schedule leaves momentum alone").
template <class Derived>
class Stepper {
 public:
  /// The lr for the next optimizer step.
  double lr() const { return self().lr_at(it_); }
  /// OneCycle's beta1 for the next optimizer step; nullopt for schedules that leave momentum alone.
  std::optional<double> momentum() const { return self().momentum_at(it_); }
  /// (beta1, beta2) for the next optimizer step when the schedule sets them.
  std::optional<Betas> betas() const { return self().betas_at(it_); }
  /// Call after every optimizer step that was not skipped.
  void step() noexcept { ++it_; }
  /// DeepSpeed's `last_batch_iteration`: -1 before the first step.
  std::int64_t last_batch_iteration() const noexcept { return it_; }
  SchedulerState state() const noexcept { return {it_}; }
  /// \throws usage_error if `last_batch_iteration` < -1.
  void load_state(const SchedulerState& s) {
    check_iteration(s.last_batch_iteration, "LrScheduler::load_state");
    it_ = s.last_batch_iteration;
  }
  std::optional<double> momentum_at(std::int64_t) const { return std::nullopt; }
  std::optional<Betas> betas_at(std::int64_t) const { return std::nullopt; }

 private:
  const Derived& self() const { return static_cast<const Derived&>(*this); }
  std::int64_t it_ = -1;
};

}  // namespace detail

/// WarmupLR: `lr = min + (max - min) * gamma`, gamma rising over N steps (log or linear), then 1.
/// lr_at(-1) = warmup_min_lr.
class WarmupLR : public detail::Stepper<WarmupLR> {
 public:
  static constexpr std::string_view kName = "WarmupLR";

  /// `optimizer_lr` is the optimizer's configured lr, used when warmup_max_lr is unset.
  explicit WarmupLR(const WarmupLROptions& o = {}, double optimizer_lr = kDefaultOptimizerLr)
      : ramp_(validated(o, optimizer_lr).warmup_num_steps, o.warmup_type),
        min_lr_(o.warmup_min_lr),
        delta_lr_(o.warmup_max_lr.value_or(optimizer_lr) - o.warmup_min_lr) {}

  double lr_at(std::int64_t it) const {
    detail::check_iteration(it, "WarmupLR::lr_at");
    if (it < 0) return min_lr_;
    const double gamma = it < ramp_.steps ? ramp_.gamma(it) : 1.0;
    return min_lr_ + delta_lr_ * gamma;
  }
  /// N after max(2, warmup_num_steps).
  std::int64_t warmup_num_steps() const noexcept { return ramp_.steps; }

 private:
  static const WarmupLROptions& validated(const WarmupLROptions& o, double optimizer_lr) {
    detail::require_non_negative(o.warmup_min_lr, "warmup_min_lr");
    if (o.warmup_max_lr) detail::require_non_negative(*o.warmup_max_lr, "warmup_max_lr");
    else if (!(optimizer_lr >= 0) || !std::isfinite(optimizer_lr))
      throw config_error("must be >= 0 and finite (WarmupLR's warmup_max_lr defaults to it)", "/optimizer/params/lr",
                         to_text(optimizer_lr));
    detail::require_positive(o.warmup_num_steps, "warmup_num_steps");
    return o;
  }

  detail::WarmupRamp ramp_;
  double min_lr_ = 0;
  double delta_lr_ = 0;
};

/// WarmupDecayLR: WarmupLR's ramp, then linear decay `gamma = max(0, (T - it) / max(1, T - N))`.
class WarmupDecayLR : public detail::Stepper<WarmupDecayLR> {
 public:
  static constexpr std::string_view kName = "WarmupDecayLR";

  explicit WarmupDecayLR(const WarmupDecayLROptions& o)
      : ramp_(validated(o).warmup_num_steps, o.warmup_type),
        total_num_steps_(*o.total_num_steps),
        min_lr_(o.warmup_min_lr),
        delta_lr_(o.warmup_max_lr - o.warmup_min_lr) {}

  double lr_at(std::int64_t it) const {
    detail::check_iteration(it, "WarmupDecayLR::lr_at");
    if (it < 0) return min_lr_;
    double gamma;
    if (it < ramp_.steps) {
      gamma = ramp_.gamma(it);
    } else {
      gamma = std::max(0.0, static_cast<double>(total_num_steps_ - it) /
                                std::max(1.0, static_cast<double>(total_num_steps_ - ramp_.steps)));
    }
    return min_lr_ + delta_lr_ * gamma;
  }
  std::int64_t warmup_num_steps() const noexcept { return ramp_.steps; }
  std::int64_t total_num_steps() const noexcept { return total_num_steps_; }

 private:
  static const WarmupDecayLROptions& validated(const WarmupDecayLROptions& o) {
    detail::require_non_negative(detail::require_given(o.total_num_steps, "total_num_steps"), "total_num_steps");
    detail::require_non_negative(o.warmup_min_lr, "warmup_min_lr");
    detail::require_non_negative(o.warmup_max_lr, "warmup_max_lr");
    detail::require_positive(o.warmup_num_steps, "warmup_num_steps");
    return o;
  }

  detail::WarmupRamp ramp_;
  std::int64_t total_num_steps_ = 0;
  double min_lr_ = 0;
  double delta_lr_ = 0;
};

/// WarmupCosineLR: lr = optimizer_lr * ratio; ratio ramps from warmup_min_ratio to 1 over N steps,
/// then follows a half cosine down to cos_min_ratio at it = T - 1 and stays there.
/// lr_at(-1) = 0 (DeepSpeed installs 0 before the first step).
class WarmupCosineLR : public detail::Stepper<WarmupCosineLR> {
 public:
  static constexpr std::string_view kName = "WarmupCosineLR";

  WarmupCosineLR(const WarmupCosineLROptions& o, double optimizer_lr)
      : ramp_(validated(o, optimizer_lr).warmup_num_steps, o.warmup_type),
        total_num_steps_(*o.total_num_steps),
        warmup_min_ratio_(o.warmup_min_ratio),
        cos_min_ratio_(o.cos_min_ratio),
        base_lr_(optimizer_lr) {}

  /// The multiplier of the optimizer's lr at `it` (0 at it = -1).
  double ratio_at(std::int64_t it) const {
    detail::check_iteration(it, "WarmupCosineLR::ratio_at");
    if (it < 0) return 0.0;
    if (it < ramp_.steps) return warmup_min_ratio_ + ramp_.gamma(it) * (1.0 - warmup_min_ratio_);
    const std::int64_t real_last_step = it - ramp_.steps + 1;
    const std::int64_t real_total_steps = std::max<std::int64_t>(1, total_num_steps_ - ramp_.steps);
    // Clamped so the ratio stays at cos_min_ratio after T instead of rising again.
    const double progress =
        std::min(1.0, static_cast<double>(real_last_step) / static_cast<double>(real_total_steps));
    const double cosine = (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
    return std::max(0.0, cos_min_ratio_ + (1.0 - cos_min_ratio_) * cosine);
  }
  double lr_at(std::int64_t it) const { return base_lr_ * ratio_at(it); }
  std::int64_t warmup_num_steps() const noexcept { return ramp_.steps; }
  std::int64_t total_num_steps() const noexcept { return total_num_steps_; }

 private:
  static const WarmupCosineLROptions& validated(const WarmupCosineLROptions& o, double optimizer_lr) {
    detail::require_non_negative(detail::require_given(o.total_num_steps, "total_num_steps"), "total_num_steps");
    detail::require_non_negative(o.warmup_min_ratio, "warmup_min_ratio");
    detail::require_positive(o.warmup_num_steps, "warmup_num_steps");
    detail::require_non_negative(o.cos_min_ratio, "cos_min_ratio");
    if (!(optimizer_lr >= 0) || !std::isfinite(optimizer_lr))
      throw config_error("must be >= 0 and finite (WarmupCosineLR scales it)", "/optimizer/params/lr",
                         to_text(optimizer_lr));
    return o;
  }

  detail::WarmupRamp ramp_;
  std::int64_t total_num_steps_ = 0;
  double warmup_min_ratio_ = 0;
  double cos_min_ratio_ = 0;
  double base_lr_ = 0;
};

/// OneCycle (1cycle policy): lr rises from cycle_min_lr to cycle_max_lr over cycle_first_step_size
/// steps, falls back over cycle_second_step_size steps, then stays at cycle_min_lr or decays as
/// `min / (1 + decay_lr_rate * (it - total + 1) / decay_step_size)`. With cycle_momentum, beta1
/// moves inversely between cycle_max_mom and cycle_min_mom, and DeepSpeed sets beta2 = 0.99.
/// Stair counts > 0 hold the value flat over that many equal stairs of each half cycle.
class OneCycle : public detail::Stepper<OneCycle> {
 public:
  static constexpr std::string_view kName = "OneCycle";
  /// DeepSpeed writes (beta1, 0.99) into the optimizer whenever it cycles momentum.
  static constexpr double kCycleBeta2 = 0.99;

  explicit OneCycle(const OneCycleOptions& o)
      : min_lr_(*validated(o).cycle_min_lr),
        max_lr_(*o.cycle_max_lr),
        decay_lr_rate_(o.decay_lr_rate),
        first_step_size_(static_cast<double>(o.cycle_first_step_size)),
        second_step_size_(static_cast<double>(o.cycle_second_step_size.value_or(o.cycle_first_step_size))),
        total_size_(first_step_size_ + second_step_size_),
        step_ratio_(first_step_size_ / total_size_),
        first_stair_count_(o.cycle_first_stair_count),
        second_stair_count_(o.cycle_second_stair_count.value_or(o.cycle_first_stair_count)),
        decay_step_size_(o.decay_step_size),
        cycle_momentum_(o.cycle_momentum),
        min_mom_(o.cycle_min_mom),
        max_mom_(o.cycle_max_mom),
        decay_mom_rate_(o.decay_mom_rate) {}

  double lr_at(std::int64_t it) const {
    detail::check_iteration(it, "OneCycle::lr_at");
    if (it < 0) return min_lr_;  // what DeepSpeed installs at construction
    if (static_cast<double>(it) < total_size_) return min_lr_ + (max_lr_ - min_lr_) * scale_factor(it);
    if (decay_step_size_ == 0 || decay_lr_rate_ == 0) return min_lr_;
    return min_lr_ / (1.0 + decay_lr_rate_ * decay_interval(it));
  }

  /// beta1, or nullopt without cycle_momentum. momentum_at(-1) = cycle_min_mom: DeepSpeed installs
  /// the minimum before the first step, although the cycle formula at -1 gives cycle_max_mom.
  std::optional<double> momentum_at(std::int64_t it) const {
    detail::check_iteration(it, "OneCycle::momentum_at");
    if (!cycle_momentum_) return std::nullopt;
    if (it < 0) return min_mom_;
    if (static_cast<double>(it) < total_size_) return max_mom_ - (max_mom_ - min_mom_) * scale_factor(it);
    if (decay_step_size_ == 0 || decay_mom_rate_ == 0) return max_mom_;
    // DeepSpeed multiplies: the momentum grows after the cycle.
    return max_mom_ * (1.0 + decay_mom_rate_ * decay_interval(it));
  }

  std::optional<Betas> betas_at(std::int64_t it) const {
    const auto m = momentum_at(it);
    if (!m) return std::nullopt;
    return Betas{*m, kCycleBeta2};
  }

  /// Position in the cycle at `it`: 0 at the ends, 1 at the peak (after stair quantisation).
  double scale_factor(std::int64_t it) const {
    const auto batch = static_cast<double>(it + 1);
    const double cycle = std::floor(1.0 + batch / total_size_);
    const double x = 1.0 + batch / total_size_ - cycle;
    double scale;
    std::int64_t stairs;
    if (x <= step_ratio_) {
      scale = x / step_ratio_;
      stairs = first_stair_count_;
    } else {
      scale = (x - 1.0) / (step_ratio_ - 1.0);
      stairs = second_stair_count_;
    }
    if (stairs > 0) {
      // Quantised from the integer batch offset, not from `scale`, which can land a hair under
      // an exact stair at the half-cycle boundary.
      const double in_cycle = std::fmod(batch, total_size_);
      const auto n = static_cast<double>(stairs);
      const double position = in_cycle <= first_step_size_ ? in_cycle * n / first_step_size_
                                                            : (total_size_ - in_cycle) * n / second_step_size_;
      scale = std::floor(position) / n;
    }
    return scale;
  }

  double total_size() const noexcept { return total_size_; }
  bool cycle_momentum() const noexcept { return cycle_momentum_; }

 private:
  static const OneCycleOptions& validated(const OneCycleOptions& o) {
    detail::require_non_negative(detail::require_given(o.cycle_min_lr, "cycle_min_lr"), "cycle_min_lr");
    detail::require_non_negative(detail::require_given(o.cycle_max_lr, "cycle_max_lr"), "cycle_max_lr");
    detail::require_non_negative(o.decay_lr_rate, "decay_lr_rate");
    detail::require_param(o.cycle_first_step_size > 0, "cycle_first_step_size", "must be > 0",
                          to_text(o.cycle_first_step_size));
    if (o.cycle_second_step_size) detail::require_non_negative(*o.cycle_second_step_size, "cycle_second_step_size");
    detail::require_non_negative(o.cycle_first_stair_count, "cycle_first_stair_count");
    if (o.cycle_second_stair_count)
      detail::require_non_negative(*o.cycle_second_stair_count, "cycle_second_stair_count");
    detail::require_non_negative(o.decay_step_size, "decay_step_size");
    detail::require_non_negative(o.cycle_min_mom, "cycle_min_mom");
    detail::require_non_negative(o.cycle_max_mom, "cycle_max_mom");
    detail::require_non_negative(o.decay_mom_rate, "decay_mom_rate");
    return o;
  }

  double decay_interval(std::int64_t it) const {
    return (static_cast<double>(it) - total_size_ + 1.0) / static_cast<double>(decay_step_size_);
  }

  double min_lr_ = 0, max_lr_ = 0, decay_lr_rate_ = 0;
  double first_step_size_ = 0, second_step_size_ = 0, total_size_ = 0, step_ratio_ = 0;  // steps, as doubles like DeepSpeed
  std::int64_t first_stair_count_ = 0, second_stair_count_ = 0, decay_step_size_ = 0;
  bool cycle_momentum_ = false;
  double min_mom_ = 0, max_mom_ = 0, decay_mom_rate_ = 0;
};

/// LRRangeTest: `lr = min * (1 + rate * I)`, `I = (it + 1) / step_size`, floored with staircase.
class LRRangeTest : public detail::Stepper<LRRangeTest> {
 public:
  static constexpr std::string_view kName = "LRRangeTest";

  explicit LRRangeTest(const LRRangeTestOptions& o = {})
      : min_lr_(validated(o).lr_range_test_min_lr),
        step_size_(o.lr_range_test_step_size),
        step_rate_(o.lr_range_test_step_rate),
        staircase_(o.lr_range_test_staircase) {}

  double lr_at(std::int64_t it) const {
    detail::check_iteration(it, "LRRangeTest::lr_at");
    double interval = static_cast<double>(it + 1) / static_cast<double>(step_size_);
    if (staircase_) interval = std::floor(interval);
    return min_lr_ * (1.0 + step_rate_ * interval);
  }

 private:
  static const LRRangeTestOptions& validated(const LRRangeTestOptions& o) {
    detail::require_non_negative(o.lr_range_test_min_lr, "lr_range_test_min_lr");
    detail::require_positive(o.lr_range_test_step_size, "lr_range_test_step_size");
    detail::require_non_negative(o.lr_range_test_step_rate, "lr_range_test_step_rate");
    return o;
  }

  double min_lr_ = 0;
  std::int64_t step_size_ = 1;
  double step_rate_ = 0;
  bool staircase_ = false;
};

/// What the engine needs from a schedule.
template <class S>
concept LrSchedule = std::copyable<S> && requires(S& s, const S& cs, std::int64_t it, const SchedulerState& st) {
  { S::kName } -> std::convertible_to<std::string_view>;
  { cs.lr_at(it) } -> std::same_as<double>;
  { cs.momentum_at(it) } -> std::same_as<std::optional<double>>;
  { cs.betas_at(it) } -> std::same_as<std::optional<Betas>>;
  { cs.lr() } -> std::same_as<double>;
  s.step();
  { cs.state() } -> std::same_as<SchedulerState>;
  s.load_state(st);
};

static_assert(LrSchedule<WarmupLR> && LrSchedule<WarmupDecayLR> && LrSchedule<WarmupCosineLR> &&
              LrSchedule<OneCycle> && LrSchedule<LRRangeTest>);

/// The options of any schedule; the alternative chosen is the schedule type.
using LrSchedulerOptions =
    std::variant<WarmupLROptions, WarmupDecayLROptions, WarmupCosineLROptions, OneCycleOptions, LRRangeTestOptions>;

/// Any of the five schedules, chosen at run time (e.g. from DeepSpeed JSON's "scheduler.type").
class LrScheduler {
 public:
  using Variant = std::variant<WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest>;

  /// Wraps a concrete schedule. (Constrained on the list of alternatives, not on LrSchedule: checking
  /// std::copyable<LrScheduler> must not recurse into this constructor.)
  template <class S>
    requires(std::is_same_v<S, WarmupLR> || std::is_same_v<S, WarmupDecayLR> || std::is_same_v<S, WarmupCosineLR> ||
             std::is_same_v<S, OneCycle> || std::is_same_v<S, LRRangeTest>)
  LrScheduler(S s) : impl_(std::move(s)) {}  // implicit: every schedule is an LrScheduler

  /// Builds the schedule that `options` names. `optimizer_lr` is the optimizer's configured lr
  /// (WarmupLR's default peak, WarmupCosineLR's base).
  LrScheduler(const LrSchedulerOptions& options, double optimizer_lr) {
    std::visit(
        [this, optimizer_lr](const auto& o) {
          using O = std::remove_cvref_t<decltype(o)>;
          if constexpr (std::is_same_v<O, WarmupLROptions>) impl_.emplace<WarmupLR>(o, optimizer_lr);
          else if constexpr (std::is_same_v<O, WarmupDecayLROptions>) impl_.emplace<WarmupDecayLR>(o);
          else if constexpr (std::is_same_v<O, WarmupCosineLROptions>) impl_.emplace<WarmupCosineLR>(o, optimizer_lr);
          else if constexpr (std::is_same_v<O, OneCycleOptions>) impl_.emplace<OneCycle>(o);
          else impl_.emplace<LRRangeTest>(o);
        },
        options);
  }

  std::string_view name() const {
    return std::visit([](const auto& s) { return std::string_view(std::remove_cvref_t<decltype(s)>::kName); }, impl_);
  }
  double lr() const { return std::visit([](const auto& s) { return s.lr(); }, impl_); }
  double lr_at(std::int64_t it) const { return std::visit([it](const auto& s) { return s.lr_at(it); }, impl_); }
  std::optional<double> momentum() const { return std::visit([](const auto& s) { return s.momentum(); }, impl_); }
  std::optional<double> momentum_at(std::int64_t it) const {
    return std::visit([it](const auto& s) { return s.momentum_at(it); }, impl_);
  }
  std::optional<Betas> betas() const { return std::visit([](const auto& s) { return s.betas(); }, impl_); }
  std::optional<Betas> betas_at(std::int64_t it) const {
    return std::visit([it](const auto& s) { return s.betas_at(it); }, impl_);
  }
  void step() {
    std::visit([](auto& s) { s.step(); }, impl_);
  }
  std::int64_t last_batch_iteration() const {
    return std::visit([](const auto& s) { return s.last_batch_iteration(); }, impl_);
  }
  SchedulerState state() const { return std::visit([](const auto& s) { return s.state(); }, impl_); }
  void load_state(const SchedulerState& st) {
    std::visit([&st](auto& s) { s.load_state(st); }, impl_);
  }

  const Variant& variant() const noexcept { return impl_; }
  template <class S>
  const S* get_if() const noexcept {
    return std::get_if<S>(&impl_);
  }

 private:
  Variant impl_;
};

}  // namespace zerotk::optim

namespace zerotk {
using optim::Betas;
using optim::LrSchedule;
using optim::LrScheduler;
using optim::LrSchedulerOptions;
using optim::LRRangeTest;
using optim::LRRangeTestOptions;
using optim::OneCycle;
using optim::OneCycleOptions;
using optim::SchedulerState;
using optim::WarmupCosineLR;
using optim::WarmupCosineLROptions;
using optim::WarmupDecayLR;
using optim::WarmupDecayLROptions;
using optim::WarmupLR;
using optim::WarmupLROptions;
using optim::WarmupType;
}  // namespace zerotk
