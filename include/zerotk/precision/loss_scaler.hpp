#pragma once
/// \file zerotk/precision/loss_scaler.hpp
/// Loss-scaling policies. `LossScaler<Dynamic>` is DeepSpeed's ZeRO-path dynamic scaler
/// (SEMANTICS.md section 1: hysteresis, consecutive hysteresis, growth window, minimum scale and
/// the error at the minimum); `LossScaler<Static>` keeps a fixed scale; `LossScaler<None>` is for
/// bf16/fp32 (scale 1). All three still skip steps whose gradients hold inf/NaN (None: switchable).
///
/// Each is usable on its own:
///
///   zerotk::LossScaler<zerotk::Dynamic> scaler({.loss_scale_window = 500});
///   const double used = scaler.scale();           // seed backward with this
///   ...backward...
///   if (!scaler.update(zerotk::agree_overflow(comm, local_has_inf_or_nan))) {
///     // unscale with `used` (the scale the gradients were made with), clip, optimizer step
///   }
///
/// `update()` is called once per optimizer boundary, skipped steps included, and returns whether
/// the step must be skipped. The state is a plain struct (`state()` / `load_state()`), so a
/// checkpoint restores the scaler exactly.

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "zerotk/core/error.hpp"
#include "zerotk/core/macros.hpp"
#include "zerotk/policies.hpp"

namespace zerotk::precision {

/// Options, named after DeepSpeed's `fp16` block; defaults are DeepSpeed's.
struct LossScalerOptions {
  double initial_scale_power = 16;          ///< Dynamic: initial scale = 2^power
  std::int64_t loss_scale_window = 1000;    ///< Dynamic: clean steps between doublings
  int hysteresis = 2;                       ///< Dynamic: overflows absorbed before a halving
  bool consecutive_hysteresis = false;      ///< Dynamic: refill hysteresis on every clean step
  double min_loss_scale = 1;                ///< Dynamic: the scale never drops below this
  bool raise_error_at_min_scale = true;     ///< Dynamic: overflow at the minimum throws (else clamps)
  double static_scale = 0;                  ///< Static only: DeepSpeed's `loss_scale` (> 0)
  bool skip_on_overflow = true;             ///< None only: skip steps with inf/NaN gradients
};

/// Everything a scaler remembers between steps. Plain data: compare with ==, copy field by field
/// into a checkpoint, hand back to `load_state()`.
struct LossScalerState {
  double scale = 1;                       ///< the current loss scale
  std::int64_t iter = 0;                  ///< updates so far (skipped steps included)
  std::int64_t last_overflow_iter = -1;   ///< iteration of the last overflow, -1 if none
  int hyst = 0;                           ///< Dynamic: overflows left before the next halving (0 otherwise)

  friend bool operator==(const LossScalerState&, const LossScalerState&) = default;
};

/// One event of LossScaler<Dynamic>'s history hook, reported for every overflow (also those that
/// leave the scale unchanged: absorbed by hysteresis, or clamped at the minimum) and every growth.
struct ScaleChange {
  static constexpr std::string_view kOverflow = "overflow";              ///< scale halved (or clamped to the minimum)
  static constexpr std::string_view kHysteresis = "hysteresis";          ///< overflow absorbed; scale unchanged
  static constexpr std::string_view kOverflowAtMinimum = "overflow_at_minimum";  ///< already at the minimum, clamped
  static constexpr std::string_view kGrowth = "growth";                  ///< a window of clean steps: scale doubled

  std::int64_t iter = 0;        ///< the update's iteration (0-based, skipped steps included)
  double old_scale = 0;
  double new_scale = 0;
  std::string_view reason;      ///< one of the constants above (static storage)
  int hysteresis_left = 0;      ///< `hyst` after the update
};

using ScaleChangeHook = std::function<void(const ScaleChange&)>;

/// A rule a LossScalerState breaks: the field ("scale", "iter", ...), the rule in words ("must be
/// >= 0") and the offending value as text.
struct LossScalerStateProblem {
  std::string_view field;
  std::string rule;
  std::string value;
};

/// The first rule that every loss scaler's state must keep and `s` breaks, or nothing: scale positive
/// and finite, iter >= 0, last_overflow_iter in [-1, iter), hyst >= 0. The scalers' load_state() and
/// a checkpoint's manifest (checkpoint/manifest.hpp) check the same rules through it.
inline std::optional<LossScalerStateProblem> loss_scaler_state_problem(const LossScalerState& s) {
  if (!(s.scale > 0) || !std::isfinite(s.scale)) return LossScalerStateProblem{"scale", "must be positive and finite", to_text(s.scale)};
  if (s.iter < 0) return LossScalerStateProblem{"iter", "must be >= 0", to_text(s.iter)};
  if (s.last_overflow_iter < -1 || s.last_overflow_iter >= s.iter) {
    return LossScalerStateProblem{"last_overflow_iter", "must be in [-1, iter)", to_text(s.last_overflow_iter)};
  }
  if (s.hyst < 0) return LossScalerStateProblem{"hyst", "must be >= 0", to_text(s.hyst)};
  return std::nullopt;
}

namespace detail {

inline void require(bool ok, std::string_view rule, const char* where, const std::string& value) {
  if (!ok) throw config_error(std::string(rule), where, value);
}

/// What the three scalers share: the state, the hook and the iteration counter.
class ScalerBase {
 public:
  /// Current loss scale: multiply the loss (or seed backward) with it.
  double scale() const noexcept { return state_.scale; }
  /// 1 / scale() rounded to float, the factor that unscales gradients when no clipping applies.
  float inv_scale() const noexcept { return static_cast<float>(1.0 / state_.scale); }
  /// Updates so far.
  std::int64_t iteration() const noexcept { return state_.iter; }
  LossScalerState state() const noexcept { return state_; }
  const LossScalerOptions& options() const noexcept { return options_; }
  /// Installs the history hook (replacing any previous one; an empty function removes it). The
  /// hook runs after the state is updated, so a hook that throws leaves a consistent scaler.
  void on_change(ScaleChangeHook hook) { hook_ = std::move(hook); }

 protected:
  explicit ScalerBase(const LossScalerOptions& o) : options_(o) {}

  void notify(std::int64_t iter, double old_scale, std::string_view reason) const {
    if (hook_) hook_(ScaleChange{iter, old_scale, state_.scale, reason, state_.hyst});
  }

  static void check_common_state(const LossScalerState& s, const char* where) {
    if (const std::optional<LossScalerStateProblem> p = loss_scaler_state_problem(s)) {
      throw usage_error("state." + std::string(p->field) + " " + p->rule, where, p->value);
    }
  }

  LossScalerOptions options_;
  LossScalerState state_{};
  ScaleChangeHook hook_;
};

}  // namespace detail

/// `LossScaler<Dynamic>`, `LossScaler<Static>` or `LossScaler<None>`.
template <class Kind>
class LossScaler {
  static_assert(dependent_false<Kind>,
                "LossScaler: no specialization for this Kind; use LossScaler<Dynamic>, LossScaler<Static> or "
                "LossScaler<None>");
};

/// DeepSpeed's dynamic loss scaler, ZeRO path (SEMANTICS.md section 1). The scale halves after
/// `hysteresis` overflows (never below `min_loss_scale`) and doubles on the (window+1)-th,
/// (2 window+1)-th, ... clean step after the last overflow; there is no upper bound.
template <>
class LossScaler<Dynamic> : public detail::ScalerBase {
 public:
  using policy_kind = policy::loss_scaler;
  using tag = Dynamic;
  static constexpr bool kScales = true;
  static constexpr std::string_view kName = "Dynamic";

  /// \throws config_error naming the DeepSpeed key ("/fp16/hysteresis", ...) for invalid options.
  explicit LossScaler(const LossScalerOptions& o = {}) : ScalerBase(o) {
    using detail::require;
    require(std::isfinite(o.initial_scale_power), "must be finite", "/fp16/initial_scale_power",
            to_text(o.initial_scale_power));
    const double initial = std::pow(2.0, o.initial_scale_power);  // as Python's 2**power
    require(initial > 0 && std::isfinite(initial), "2^initial_scale_power must be a positive finite double",
            "/fp16/initial_scale_power", to_text(o.initial_scale_power));
    require(o.loss_scale_window >= 1, "must be >= 1", "/fp16/loss_scale_window", to_text(o.loss_scale_window));
    require(o.hysteresis >= 1, "must be >= 1", "/fp16/hysteresis", to_text(o.hysteresis));
    require(o.min_loss_scale > 0 && std::isfinite(o.min_loss_scale), "must be positive and finite",
            "/fp16/min_loss_scale", to_text(o.min_loss_scale));
    // DeepSpeed accepts an initial scale below the minimum and then *raises* the scale to the
    // minimum on the first overflow; that is never what the user meant.
    require(initial >= o.min_loss_scale, "2^initial_scale_power must be >= min_loss_scale",
            "/fp16/initial_scale_power", to_text(initial) + " < " + to_text(o.min_loss_scale));
    require(o.static_scale == 0, "a loss_scale > 0 selects a static scale, but this is LossScaler<Dynamic>",
            "/fp16/loss_scale", to_text(o.static_scale));
    state_ = LossScalerState{initial, 0, -1, o.hysteresis};
  }

  /// One optimizer boundary. `overflow` must already be agreed by all ranks (agree_overflow).
  /// Returns true when the step must be skipped (exactly when `overflow`).
  /// \throws numerics_error if an overflow would reduce a scale already at `min_loss_scale` and
  ///   `raise_error_at_min_scale` is set; the state is then left unchanged.
  bool update(bool overflow) {
    const double old_scale = state_.scale;
    std::string_view reason;
    if (overflow) {
      if (options_.hysteresis == 1 || state_.hyst == 1) {
        if (state_.scale == options_.min_loss_scale && options_.raise_error_at_min_scale)
          throw numerics_error("loss scale already at minimum; cannot decrease it further (set "
                               "raise_error_at_min_scale = false to clamp instead)",
                               "LossScaler<Dynamic>::update, iteration " + to_text(state_.iter),
                               to_text(state_.scale));
        state_.scale = std::max(state_.scale / 2.0, options_.min_loss_scale);
        reason = state_.scale == old_scale ? ScaleChange::kOverflowAtMinimum : ScaleChange::kOverflow;
      } else {
        // hyst is refilled on growth only (or every clean step with consecutive_hysteresis),
        // never on a halving.
        --state_.hyst;
        reason = ScaleChange::kHysteresis;
      }
      state_.last_overflow_iter = state_.iter;
    } else {
      if (options_.consecutive_hysteresis) state_.hyst = options_.hysteresis;
      // Clean steps strictly between the last overflow and this one.
      const std::int64_t stable = state_.iter - state_.last_overflow_iter - 1;
      if (stable > 0 && stable % options_.loss_scale_window == 0) {
        if (!options_.consecutive_hysteresis) state_.hyst = options_.hysteresis;
        state_.scale *= 2.0;
        reason = ScaleChange::kGrowth;
      }
    }
    const std::int64_t iter = state_.iter++;
    if (!reason.empty()) notify(iter, old_scale, reason);
    return overflow;
  }

  /// Restores a state from state(). \throws usage_error naming the field if it is impossible.
  void load_state(const LossScalerState& s) {
    constexpr const char* where = "LossScaler<Dynamic>::load_state";
    check_common_state(s, where);
    if (s.hyst < 1) throw usage_error("state.hyst must be >= 1", where, to_text(s.hyst));
    state_ = s;
  }
};

/// A fixed loss scale (DeepSpeed `fp16.loss_scale` > 0). Overflow is still detected and skips the step.
template <>
class LossScaler<Static> : public detail::ScalerBase {
 public:
  using policy_kind = policy::loss_scaler;
  using tag = Static;
  static constexpr bool kScales = true;
  static constexpr std::string_view kName = "Static";

  /// \throws config_error at "/fp16/loss_scale" unless `static_scale` is positive and finite.
  explicit LossScaler(const LossScalerOptions& o) : ScalerBase(o) {
    detail::require(o.static_scale > 0 && std::isfinite(o.static_scale),
                    "LossScaler<Static> needs a positive finite loss_scale (0 selects dynamic scaling)",
                    "/fp16/loss_scale", to_text(o.static_scale));
    state_ = LossScalerState{o.static_scale, 0, -1, 0};
  }
  /// Convenience: `LossScaler<Static>(1024.0)`.
  explicit LossScaler(double static_scale) : LossScaler(LossScalerOptions{.static_scale = static_scale}) {}

  /// Returns true (skip) exactly when `overflow`; the scale never changes.
  bool update(bool overflow) noexcept {
    if (overflow) state_.last_overflow_iter = state_.iter;
    ++state_.iter;
    return overflow;
  }

  /// Restores a state from state(), scale included (as DeepSpeed restores its pickled scaler).
  void load_state(const LossScalerState& s) {
    check_common_state(s, "LossScaler<Static>::load_state");
    state_ = s;
  }
};

/// No loss scaling (bf16, fp32): the scale is 1. Steps with inf/NaN gradients are still skipped
/// unless `skip_on_overflow` is false.
template <>
class LossScaler<None> : public detail::ScalerBase {
 public:
  using policy_kind = policy::loss_scaler;
  using tag = None;
  static constexpr bool kScales = false;
  static constexpr std::string_view kName = "None";

  explicit LossScaler(const LossScalerOptions& o = {}) : ScalerBase(o) { state_ = LossScalerState{1.0, 0, -1, 0}; }

  /// Returns true (skip) when `overflow` and `skip_on_overflow`.
  bool update(bool overflow) noexcept {
    if (overflow) state_.last_overflow_iter = state_.iter;
    ++state_.iter;
    return overflow && options_.skip_on_overflow;
  }

  void load_state(const LossScalerState& s) {
    constexpr const char* where = "LossScaler<None>::load_state";
    check_common_state(s, where);
    if (s.scale != 1.0) throw usage_error("state.scale must be 1 for LossScaler<None>", where, to_text(s.scale));
    state_ = s;
  }
};

/// What the engine needs from a loss-scaling policy.
template <class S>
concept LossScalePolicy = std::same_as<typename S::policy_kind, policy::loss_scaler> &&
    requires(S& s, const S& cs, bool overflow, const LossScalerState& st, ScaleChangeHook hook) {
      { cs.scale() } -> std::same_as<double>;
      { cs.inv_scale() } -> std::same_as<float>;
      { s.update(overflow) } -> std::same_as<bool>;
      { cs.state() } -> std::same_as<LossScalerState>;
      s.load_state(st);
      s.on_change(hook);
      { S::kScales } -> std::convertible_to<bool>;
    };

static_assert(LossScalePolicy<LossScaler<Dynamic>>);
static_assert(LossScalePolicy<LossScaler<Static>>);
static_assert(LossScalePolicy<LossScaler<None>>);

}  // namespace zerotk::precision

namespace zerotk {
// Policies are spelled zerotk::LossScaler<...> in engine packs (DESIGN.md).
using precision::LossScalePolicy;
using precision::LossScaler;
using precision::LossScalerOptions;
using precision::LossScalerState;
using precision::ScaleChange;
using precision::ScaleChangeHook;
}  // namespace zerotk
