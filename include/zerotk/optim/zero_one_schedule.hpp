#pragma once
/// \file zerotk/optim/zero_one_schedule.hpp
/// `optim::ZeroOneSchedule`: what step t of 0/1 Adam does (optim/zero_one_adam.hpp). DeepSpeed keeps
/// four counters per tensor and advances them step by step; they are a function of t and four
/// config values alone, so here the kind of any step is computed from t. Nothing about the schedule
/// needs checkpointing, and a run resumed at step t continues the schedule exactly (DeepSpeed resets
/// the counters on load; docs/design/onebit_next.md, G2).
///
///   t = 1                       init    counted, nothing changes (DeepSpeed's set-up step)
///   2 <= t <= F + 1             variance phase, F = max(var_freeze_step, 1). An interval I_v
///                               starts at 1:
///     t % I_v == 0              var     dense gradient all-reduce, Adam's moments and step; after
///                                       every var_update_scaler var steps I_v doubles
///     otherwise                 grad    local gradients; the gradient is 1-bit all-reduced, m is
///                                       updated from it, v is not
///   t >= F + 2                  frozen phase. An interval I_l starts at 1:
///     t % I_l == 0              sync    local step, then the accumulated update is 1-bit
///                                       all-reduced and m, p rebuilt from it
///     otherwise                 local   local step, nothing sent
///                                       every frozen step counts; after every local_step_scaler of
///                                       them I_l = min(local_step_clipper, 2 I_l)
///
///   optim::ZeroOneSchedule s({.var_freeze_step = 12, .var_update_scaler = 2, .local_step_scaler = 3,
///                             .local_step_clipper = 4});
///   s.kind(13);   // Kind::grad;  s.kind(14): Kind::sync (the first frozen step)
///
/// The counters are cached: asking for t, t + 1, ... costs O(1) per step; asking for an earlier t
/// (a loaded checkpoint) replays from t = 2, O(t) once. Not thread-safe (the cache).

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "zerotk/core/error.hpp"

namespace zerotk::optim {

/// 0/1 Adam's schedule keys (optimizer.params), with DeepSpeed's defaults, local_step_scaler's odd
/// 32678 included.
struct ZeroOneOptions {
  std::int64_t var_freeze_step = 100'000;  ///< last step of the variance phase (>= 0)
  std::int64_t var_update_scaler = 16;     ///< var steps per doubling of I_v (>= 1)
  std::int64_t local_step_scaler = 32678;  ///< frozen steps per doubling of I_l (>= 1)
  std::int64_t local_step_clipper = 16;    ///< cap of I_l (>= 1)

  /// Throws config_error naming the key and its value.
  void validate() const {
    check(var_freeze_step, 0, "var_freeze_step");
    check(var_update_scaler, 1, "var_update_scaler");
    check(local_step_scaler, 1, "local_step_scaler");
    check(local_step_clipper, 1, "local_step_clipper");
  }
  bool operator==(const ZeroOneOptions&) const = default;

 private:
  static void check(std::int64_t v, std::int64_t min, const char* key) {
    if (v < min) {
      throw config_error("must be an integer >= " + std::to_string(min), std::string("optimizer.params.") + key,
                         std::to_string(v));
    }
  }
};

class ZeroOneSchedule {
 public:
  enum class Kind : std::uint8_t { init, var, grad, local, sync };

  ZeroOneSchedule() = default;
  /// Validates the options (config_error).
  explicit ZeroOneSchedule(const ZeroOneOptions& o) : o_(o) { o_.validate(); }
  const ZeroOneOptions& options() const noexcept { return o_; }

  /// Last step of the variance phase: F + 1.
  std::int64_t last_variance_step() const noexcept { return std::max<std::int64_t>(o_.var_freeze_step, 1) + 1; }
  bool frozen(std::int64_t t) const noexcept { return t > last_variance_step(); }

  /// What step t (1-based) does.
  Kind kind(std::int64_t t) const {
    if (t <= 1) return Kind::init;
    seek(t);
    if (!frozen(t)) return t % c_.var_interval == 0 ? Kind::var : Kind::grad;
    return t % c_.local_interval == 0 ? Kind::sync : Kind::local;
  }
  /// I_v and I_l in force at step t (t >= 2).
  std::int64_t var_interval(std::int64_t t) const { return seek(t).var_interval; }
  std::int64_t local_interval(std::int64_t t) const { return seek(t).local_interval; }

  static constexpr std::string_view name(Kind k) noexcept {
    switch (k) {
      case Kind::init: return "init";
      case Kind::var: return "var";
      case Kind::grad: return "grad";
      case Kind::local: return "local";
      case Kind::sync: return "sync";
    }
    return "?";
  }

 private:
  /// The counters before step t is taken.
  struct Counters {
    std::int64_t t = 2;
    std::int64_t var_interval = 1, var_counter = 0;
    std::int64_t local_interval = 1, local_counter = 0;
  };

  const Counters& seek(std::int64_t t) const {
    if (t < c_.t) c_ = Counters{};
    for (; c_.t < t; ++c_.t) {  // take step c_.t
      if (!frozen(c_.t)) {
        if (c_.t % c_.var_interval == 0 && ++c_.var_counter == o_.var_update_scaler) {
          c_.var_counter = 0;
          c_.var_interval *= 2;
        }
      } else if (++c_.local_counter == o_.local_step_scaler) {
        c_.local_counter = 0;  // I_l = min(clipper, 2 I_l), without overflowing 2 I_l
        const std::int64_t cap = o_.local_step_clipper;
        c_.local_interval = c_.local_interval > cap / 2 ? cap : 2 * c_.local_interval;
      }
    }
    return c_;
  }

  ZeroOneOptions o_;
  mutable Counters c_;
};

}  // namespace zerotk::optim
