#pragma once
/// \file zerotk/monitor/training_log.hpp
/// What DeepSpeed logs during training, in DeepSpeed's order, for an engine to call at the same
/// points of a step. The log reads zerotk::StepReport (engine/report.hpp), the struct Engine::step()
/// returns; a trainer with its own engine fills one by hand.
///
///   backward() at an accumulation boundary    on_boundary_loss(mean loss, global_samples before the step)
///                                             -> Train/Samples/train_loss row
///   step() at a boundary, after the update    on_step(report, global_samples after the step)
///                                             -> Train/Samples/lr, Train/Samples/loss_scale (fp16) rows;
///                                                zerotk's own comm_wire_bytes, comm_dense_bytes,
///                                                compression_ratio rows (bytes this rank sent since
///                                                the previous boundary, what it would have sent
///                                                uncompressed, their ratio; DeepSpeed has none);
///                                                every steps_per_print steps the progress line
///                                                `[Rank 0] step=20, skipped=1, lr=[0.0001], loss_scale=32768.0,
///                                                grad_norm=0.8125, samples/s=1234.56`;
///                                                with wall_clock_breakdown the elapsed_time_ms_* rows and
///                                                `[Rank 0] time (ms) | fwd: ... | step: ...`
///   step() calls that are not boundaries      on_micro_step() -> `[Rank 0] time (ms) | fwd_microstep: ...`
///                                             (on_step prints that line itself at boundaries)
///
/// Phase times come from one of two places. A report with `timings_measured` set carries them in
/// `StepReport::timings` (zerotk::Engine measures its own). Otherwise the log reads timers(), under
/// timer_names::*; an engine wraps forward in
/// `auto t = log.timers().scope({timer_names::forward_micro, timer_names::forward});`.
/// Only rank 0 writes anything.

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <limits>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <utility>

#include "zerotk/config/options.hpp"
#include "zerotk/engine/report.hpp"
#include "zerotk/monitor/csv_monitor.hpp"
#include "zerotk/monitor/format.hpp"
#include "zerotk/monitor/timers.hpp"

namespace zerotk::monitor {

struct TrainingLogOptions {
  config::CsvMonitorOptions csv_monitor;
  std::int64_t steps_per_print = 10;
  bool wall_clock_breakdown = false;
  /// Loss-scale rows are written for fp16 only; static scales print as floats, a dynamic scale
  /// as an integer until its first change (DeepSpeed starts it at the int 2**initial_scale_power).
  config::ScalerKind scaler = config::ScalerKind::none;
  double initial_loss_scale = 65536;  ///< dynamic: 2^initial_scale_power
  int rank = 0;
  /// Global samples consumed before this log was made (a run resumed from a checkpoint): the first
  /// samples/s counts only the samples after them, which this process trained.
  std::int64_t start_samples = 0;

  static TrainingLogOptions from(const config::Config& c, int rank) {
    TrainingLogOptions o;
    o.csv_monitor = c.csv_monitor;
    o.steps_per_print = c.steps_per_print;
    o.wall_clock_breakdown = c.wall_clock_breakdown;
    o.scaler = c.scaler();
    o.initial_loss_scale = c.fp16.initial_scale();
    o.rank = rank;
    return o;
  }
};

/// Every parameter group's learning rate in `r`, group 0 first: `r.group_lr`, or `{r.lr}` when the
/// report carries group 0's only. Never empty; valid while `r` lives and its group_lr is unchanged.
inline std::span<const double> group_lrs(const StepReport& r) noexcept {
  return r.group_lr.empty() ? std::span<const double>(&r.lr, 1) : std::span<const double>(r.group_lr);
}

// ---- 0.1 API, deprecated in 0.2, removed in 0.3 ----------------------------------------------------
// A trainer written against 0.1 filled these two structs and called on_step(StepStats). They stay as
// they were, and the overloads below convert them to the StepReport the log reads now, so such a
// trainer compiles (with a deprecation warning naming the replacement) and writes the same rows.
// tests/api/v0_1/ compiles and runs one.

/// Milliseconds per phase over one accumulation boundary, for engines that time themselves.
struct [[deprecated("use zerotk::StepTimings (StepReport::timings, with timings_measured = true)")]] PhaseTimesMs {
  double forward = 0, backward = 0, backward_inner = 0, backward_allreduce = 0, step = 0;
};

// The header's own uses of the deprecated types must not warn in every file that includes it; only a
// trainer's uses do.
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
/// The state after one optimizer boundary (skipped steps included).
struct [[deprecated("use zerotk::StepReport and TrainingLog::on_step(report, global_samples)")]] StepStats {
  std::int64_t global_steps = 0;    ///< boundaries done, this one included
  std::int64_t global_samples = 0;  ///< samples consumed, this boundary included
  std::int64_t skipped_steps = 0;   ///< overflow-skipped boundaries so far
  std::span<const double> lr;       ///< per parameter group, after the scheduler step
  double loss_scale = 1;            ///< current scale after this boundary's update
  std::optional<double> grad_norm;  ///< unscaled global norm; empty on overflow
  /// The boundary's phase times when the engine measured them itself; empty: read timers().
  std::optional<PhaseTimesMs> phase_times;
};

namespace detail {
/// The StepReport a 0.1 StepStats stands for: a boundary; an empty grad_norm is -1 (non-finite), as
/// Engine::step() reports an overflow; phase_times become measured timings. An empty lr becomes
/// group 0's lr 0 (the csv row 0.1 wrote; the progress line now shows `lr=[0.0]` where 0.1 had `[]`).
inline StepReport report_of(const StepStats& s) {
  StepReport r;
  r.boundary = true;
  r.global_steps = s.global_steps;
  r.skipped_steps = s.skipped_steps;
  r.loss_scale = s.loss_scale;
  r.grad_norm = s.grad_norm ? *s.grad_norm : -1.0;
  r.lr = s.lr.empty() ? 0.0 : s.lr.front();
  r.group_lr.assign(s.lr.begin(), s.lr.end());
  if (s.phase_times) {
    const PhaseTimesMs& p = *s.phase_times;
    r.timings = StepTimings{p.forward, p.backward, p.backward_inner, p.backward_allreduce, p.step};
    r.timings_measured = true;
  }
  return r;
}
}  // namespace detail
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

class TrainingLog {
 public:
  explicit TrainingLog(TrainingLogOptions options, std::ostream& out = std::cout, Clock clock = steady_seconds)
      : options_(std::move(options)),
        out_(out),
        clock_(clock),
        timers_(clock),
        csv_(options_.csv_monitor, options_.rank),
        last_report_time_(clock_()),
        last_report_samples_(options_.start_samples) {
    if (options_.steps_per_print < 1) {
      throw usage_error("steps_per_print must be >= 1", "TrainingLog", std::to_string(options_.steps_per_print));
    }
    if (options_.start_samples < 0) {
      throw usage_error("start_samples must be >= 0", "TrainingLog", std::to_string(options_.start_samples));
    }
  }

  WallClockTimers& timers() noexcept { return timers_; }
  CsvMonitor& csv() noexcept { return csv_; }
  bool is_writer() const noexcept { return options_.rank == 0; }

  /// At the accumulation boundary, in backward before the step: the mean loss over the micro-steps.
  void on_boundary_loss(double loss, std::int64_t global_samples_before_step) {
    csv_.write("Train/Samples/train_loss", MetricValue(loss), global_samples_before_step);
  }

  /// After a step() call that is not an accumulation boundary (on_step covers the boundary one):
  /// prints the micro-step timers when wall_clock_breakdown is on.
  void on_micro_step() {
    if (!options_.wall_clock_breakdown) return;
    print_timers(timer_names::micro);
  }

  /// After each optimizer boundary (skipped ones included), with the report of the step() call that
  /// reached it and the samples consumed so far, this boundary's included. Order as in DeepSpeed: the
  /// progress line, lr and loss-scale rows, then (wall_clock_breakdown) micro-step timers,
  /// elapsed_time_ms rows and the boundary timers. A report that is not a boundary is a usage_error:
  /// after those step() calls the engine calls on_micro_step().
  void on_step(const StepReport& r, std::int64_t global_samples) {
    if (!r.boundary) {
      throw usage_error("on_step takes the report of an accumulation boundary; call on_micro_step() after other steps",
                        "TrainingLog::on_step", "micro_steps=" + std::to_string(r.micro_steps));
    }
    if (r.global_steps % options_.steps_per_print == 0) {
      const double now = clock_();
      const double dt = now - last_report_time_;
      const double samples = static_cast<double>(global_samples - last_report_samples_);
      if (is_writer()) {
        out_ << "[Rank 0] " << progress_line(r, dt > 0 ? samples / dt : 0.0) << '\n';
      }
      last_report_time_ = now;
      last_report_samples_ = global_samples;
    }

    // A Python float: DeepSpeed writes get_lr()[0], the double the scheduler computed.
    csv_.write("Train/Samples/lr", MetricValue(group_lrs(r).front()), global_samples);
    if (options_.scaler != config::ScalerKind::none) {
      csv_.write("Train/Samples/loss_scale", scale_value(r.loss_scale), global_samples);
    }
    // zerotk's own rows, at every boundary so a plot of a compressed and an uncompressed run lines up:
    // integers (a byte count past 2^63 - 1 would be 8 EiB in one step), the ratio as a Python float.
    csv_.write("Train/Samples/comm_wire_bytes", byte_count(r.comm_wire_bytes), global_samples);
    csv_.write("Train/Samples/comm_dense_bytes", byte_count(r.comm_dense_bytes), global_samples);
    csv_.write("Train/Samples/compression_ratio", MetricValue(r.compression_ratio()), global_samples);
    if (r.slow_rank_detection) {
      // The slow-rank detector's rows (monitor/slow_ranks.hpp): rank 0's own compute time, and the
      // slowest flagged rank with its factor (-1 and 1.0 while none is flagged).
      const SlowRank* worst = nullptr;
      for (const SlowRank& x : r.slow_ranks) worst = !worst || x.factor > worst->factor ? &x : worst;
      csv_.write("Train/Samples/compute_ms", MetricValue(r.compute_ms), global_samples);
      csv_.write("Train/Samples/slow_rank", MetricValue(static_cast<std::int64_t>(worst ? worst->rank : -1)), global_samples);
      csv_.write("Train/Samples/slow_rank_factor", MetricValue(worst ? worst->factor : 1.0), global_samples);
    }

    if (options_.wall_clock_breakdown) {
      on_micro_step();
      static constexpr const char* kCsvNames[] = {
          "Train/Samples/elapsed_time_ms_forward", "Train/Samples/elapsed_time_ms_backward",
          "Train/Samples/elapsed_time_ms_backward_inner", "Train/Samples/elapsed_time_ms_backward_allreduce",
          "Train/Samples/elapsed_time_ms_step"};
      if (r.timings_measured) {
        const StepTimings& t = r.timings;
        // In timer_names::global's order.
        const double ms[] = {t.forward_ms, t.backward_ms, t.backward_inner_ms, t.backward_allreduce_ms, t.step_ms};
        std::string line = "time (ms)";
        for (std::size_t i = 0; i < 5; ++i) {
          csv_.write(kCsvNames[i], MetricValue(ms[i]), global_samples);
          char buf[64];
          std::snprintf(buf, sizeof buf, " | %s: %.2f", std::string(timer_names::global[i]).c_str(), ms[i]);
          line += buf;
        }
        if (is_writer()) out_ << "[Rank 0] " << line << '\n';
      } else {
        for (std::size_t i = 0; i < 5; ++i) {
          csv_.write(kCsvNames[i], timers_.elapsed_value(timer_names::global[i]), global_samples);
        }
        print_timers(timer_names::global);
      }
    }
  }

#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
  /// 0.1's on_step: `s.global_samples` is the second argument of on_step(report, global_samples).
  [[deprecated("use on_step(const zerotk::StepReport&, std::int64_t global_samples)")]]
  void on_step(const StepStats& s) { on_step(detail::report_of(s), s.global_samples); }

  [[deprecated("use progress_line(const zerotk::StepReport&, double samples_per_s)")]]
  std::string progress_line(const StepStats& s, double samples_per_s) const {
    return progress_line(detail::report_of(s), samples_per_s);
  }
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

  /// `step=20, skipped=1, lr=[0.0001], loss_scale=32768.0, grad_norm=0.8125, samples/s=1234.56`
  /// (loss_scale only with fp16; lr per parameter group, Python list style; `grad_norm=None` when
  /// the report's norm is -1, i.e. non-finite, as DeepSpeed prints an overflow step's), then
  /// `, slow_ranks=[1 (node7) 1.31x backward]` while the slow-rank detector flags ranks.
  std::string progress_line(const StepReport& r, double samples_per_s) const {
    std::string s = "step=";
    s += std::to_string(r.global_steps);
    s += ", skipped=";
    s += std::to_string(r.skipped_steps);
    s += ", lr=[";
    const std::span<const double> lrs = group_lrs(r);
    for (std::size_t i = 0; i < lrs.size(); ++i) {
      if (i) s += ", ";
      s += python_repr(lrs[i]);
    }
    s += "]";
    if (options_.scaler != config::ScalerKind::none) {
      s += ", loss_scale=";
      s += scale_value(r.loss_scale).str();
    }
    s += ", grad_norm=";
    s += r.grad_norm >= 0 ? python_repr(r.grad_norm) : std::string("None");
    char buf[64];
    std::snprintf(buf, sizeof buf, ", samples/s=%.2f", samples_per_s);
    s += buf;
    if (!r.slow_ranks.empty()) {  // `, slow_ranks=[1 (node7) 1.31x backward]`
      s += ", slow_ranks=[";
      for (std::size_t i = 0; i < r.slow_ranks.size(); ++i) {
        const SlowRank& x = r.slow_ranks[i];
        std::snprintf(buf, sizeof buf, "%s%d (", i ? ", " : "", x.rank);
        s += buf;
        s += x.host;
        std::snprintf(buf, sizeof buf, ") %.2fx ", x.factor);
        s += buf;
        s += x.phase;
      }
      s += "]";
    }
    return s;
  }

 private:
  static MetricValue byte_count(std::uint64_t bytes) noexcept {
    constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
    return MetricValue(static_cast<std::int64_t>(bytes < kMax ? bytes : kMax));
  }

  /// Prints `time (ms) | ...` for those of `names` that were used (nothing when none was).
  void print_timers(std::span<const std::string_view> names) {
    bool any = false;
    for (auto n : names) any = any || timers_.has(n);
    if (!any) return;
    std::string line = timers_.log(names, /*reset=*/true);
    if (is_writer()) out_ << "[Rank 0] " << line << '\n';
  }

  /// DeepSpeed's cur_scale is the int 2**initial_scale_power until the first update multiplies or
  /// divides it by 2.0 (then a float for good); a static scale comes from a float config field.
  MetricValue scale_value(double scale) const {
    if (options_.scaler != config::ScalerKind::dynamic) return MetricValue(scale);
    if (scale != options_.initial_loss_scale) scale_changed_ = true;
    if (!scale_changed_ && scale == std::floor(scale) && scale < 9.2e18) {
      return MetricValue(static_cast<std::int64_t>(scale));
    }
    return MetricValue(scale);
  }

  TrainingLogOptions options_;
  std::ostream& out_;
  Clock clock_;
  WallClockTimers timers_;
  CsvMonitor csv_;
  double last_report_time_;
  std::int64_t last_report_samples_;
  mutable bool scale_changed_ = false;  // sticky, as Python's int -> float promotion is
};

}  // namespace zerotk::monitor
