#pragma once
/// \file zerotk/monitor/timers.hpp
/// Named wall-clock timers for `wall_clock_breakdown`, kept and reported like DeepSpeed's
/// SynchronizedWallClockTimer: each timer accumulates start/stop intervals in milliseconds until
/// reset, reading a running timer includes its current interval, and a group is printed as
/// `time (ms) | fwd: 12.34 | bwd: 5.67`. The clock is injectable so tests need no sleeps.
///
/// DeepSpeed's engine keeps a per-micro-step and a per-boundary timer for each phase; the names
/// below are its names, so logs read the same.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zerotk/core/error.hpp"
#include "zerotk/monitor/format.hpp"

namespace zerotk::monitor {

/// Seconds from a monotonic origin. Tests pass a lambda reading a variable they advance.
using Clock = std::function<double()>;

inline double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// DeepSpeed's timer names: `*_microstep` cover one micro-step (logged every step() call),
/// the others a whole accumulation boundary (logged and written to csv_monitor at boundaries).
namespace timer_names {
inline constexpr std::string_view forward = "fwd";
inline constexpr std::string_view backward = "bwd";
inline constexpr std::string_view backward_inner = "bwd_inner";
inline constexpr std::string_view backward_allreduce = "bwd_allreduce";
inline constexpr std::string_view step = "step";
inline constexpr std::string_view forward_micro = "fwd_microstep";
inline constexpr std::string_view backward_micro = "bwd_microstep";
inline constexpr std::string_view backward_inner_micro = "bwd_inner_microstep";
inline constexpr std::string_view backward_allreduce_micro = "bwd_allreduce_microstep";
inline constexpr std::string_view step_micro = "step_microstep";

inline constexpr std::string_view global[] = {forward, backward, backward_inner, backward_allreduce, step};
inline constexpr std::string_view micro[] = {forward_micro, backward_micro, backward_inner_micro,
                                             backward_allreduce_micro, step_micro};
}  // namespace timer_names

/// One accumulating timer. Times are seconds from the owning group's clock.
class Timer {
 public:
  explicit Timer(std::string name = {}) : name_(std::move(name)) {}

  void start(double now) {
    if (started_) throw usage_error("timer already started", name_);
    started_ = true;
    start_ = now;
  }
  void stop(double now) {
    if (!started_) throw usage_error("timer stopped without being started", name_);
    started_ = false;
    intervals_ms_.push_back((now - start_) * 1000.0);
  }
  bool running() const noexcept { return started_; }
  /// True once any interval was recorded (DeepSpeed reports an empty timer as integer 0).
  bool recorded() const noexcept { return !intervals_ms_.empty() || started_; }
  void reset() {
    started_ = false;
    intervals_ms_.clear();
  }
  /// Sum of the intervals in ms, a running one included up to `now`; `reset` clears them and
  /// restarts a running timer at `now` (DeepSpeed's elapsed(reset=True)).
  double elapsed_ms(double now, bool reset_after = true) {
    const bool was_running = started_;
    if (was_running) stop(now);
    double sum = 0;
    for (double ms : intervals_ms_) sum += ms;
    if (reset_after) reset();
    if (was_running) start(now);
    return sum;
  }

 private:
  std::string name_;
  bool started_ = false;
  double start_ = 0;
  std::vector<double> intervals_ms_;  // one entry per start/stop pair
};

class WallClockTimers {
 public:
  explicit WallClockTimers(Clock clock = steady_seconds) : clock_(std::move(clock)) {}

  /// The timer `name`, created on first use.
  Timer& operator()(std::string_view name) {
    auto it = timers_.find(name);
    if (it == timers_.end()) it = timers_.emplace(std::string(name), Timer(std::string(name))).first;
    return it->second;
  }
  bool has(std::string_view name) const { return timers_.find(name) != timers_.end(); }
  double now() const { return clock_(); }

  void start(std::string_view name) { (*this)(name).start(now()); }
  void stop(std::string_view name) { (*this)(name).stop(now()); }
  double elapsed_ms(std::string_view name, bool reset = true) { return (*this)(name).elapsed_ms(now(), reset); }

  /// The value DeepSpeed writes for a timer: a float in ms, or integer 0 when it never ran.
  MetricValue elapsed_value(std::string_view name, bool reset = false) {
    Timer& t = (*this)(name);
    if (!t.recorded()) return MetricValue(0);
    return MetricValue(t.elapsed_ms(now(), reset));
  }

  /// `time (ms) | name: 1.23 | ...` over the timers in `names` that exist (DeepSpeed leaves the
  /// others out), each divided by `normalizer`; `reset` clears them after reading.
  std::string log(std::span<const std::string_view> names, bool reset = true, double normalizer = 1.0) {
    if (!(normalizer > 0)) throw usage_error("timer log normalizer must be > 0", "WallClockTimers::log");
    std::string s = "time (ms)";
    const double t = now();
    for (auto name : names) {
      auto it = timers_.find(name);
      if (it == timers_.end()) continue;
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.2f", it->second.elapsed_ms(t, reset) / normalizer);
      s += " | ";
      s += name;
      s += ": ";
      s += buf;
    }
    return s;
  }
  std::string log(std::initializer_list<std::string_view> names, bool reset = true, double normalizer = 1.0) {
    return log(std::span<const std::string_view>(names.begin(), names.size()), reset, normalizer);
  }

  /// Starts `names` now and stops them when the scope ends (in reverse order).
  class Scope {
   public:
    Scope(WallClockTimers& t, std::initializer_list<std::string_view> names) : t_(&t), names_(names.begin(), names.end()) {
      const double now = t_->now();
      for (auto n : names_) (*t_)(n).start(now);
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    Scope(Scope&& o) noexcept : t_(std::exchange(o.t_, nullptr)), names_(std::move(o.names_)) {}
    ~Scope() {
      if (!t_) return;
      const double now = t_->now();
      for (auto it = names_.rbegin(); it != names_.rend(); ++it) {
        Timer& timer = (*t_)(*it);
        if (timer.running()) timer.stop(now);
      }
    }

   private:
    WallClockTimers* t_;
    std::vector<std::string> names_;
  };
  Scope scope(std::initializer_list<std::string_view> names) { return Scope(*this, names); }

 private:
  Clock clock_;
  std::map<std::string, Timer, std::less<>> timers_;
};

}  // namespace zerotk::monitor
