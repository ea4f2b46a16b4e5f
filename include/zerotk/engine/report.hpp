#pragma once
/// \file zerotk/engine/report.hpp
/// StepReport: what `Engine::step()` tells the trainer, and what the monitor writes (monitor/ reads
/// this struct directly; there is no mirrored copy).

#include <chrono>
#include <cstdint>
#include <vector>

#include "zerotk/monitor/slow_ranks.hpp"

namespace zerotk {

/// Milliseconds spent in each phase since the previous report (DeepSpeed's wall_clock_breakdown names).
struct StepTimings {
  double forward_ms = 0, backward_ms = 0, backward_inner_ms = 0, backward_allreduce_ms = 0, step_ms = 0;
};

/// The size of each group of the process grid the engine runs on (a plain communicator: one data
/// group). Which figures are over which: `loss` is the mean over the data group; `grad_norm` is over
/// every rank the parameters span (data x tensor x pipeline, a parameter held whole by every tensor
/// rank counted once); `comm_*_bytes` are this rank's, over all of its communicators.
struct ReportGroups {
  int data = 1, tensor = 1, pipeline = 1;
  friend bool operator==(const ReportGroups&, const ReportGroups&) = default;
};

/// What engine.step() tells the trainer.
struct StepReport {
  bool boundary = false;           ///< an optimizer boundary was reached in this call
  bool skipped = false;            ///< ... and the update was skipped (overflow)
  std::int64_t global_steps = 0;   ///< optimizer boundaries so far (skipped ones included)
  std::int64_t skipped_steps = 0;
  std::int64_t micro_steps = 0;
  double loss_scale = 1.0;         ///< the scale in force for the next micro-step
  double grad_norm = 0.0;          ///< of the unscaled gradients; -1 if non-finite
  double lr = 0.0;  ///< group 0's learning rate used by this update (the double that was set)
  /// Every parameter group's learning rate after this boundary, group 0 first: the scheduler has
  /// stepped (a skipped step does not step it), so this is what the next update uses, what
  /// DeepSpeed's get_lr() reports after a step and what its csv_monitor writes (monitor/ writes
  /// group_lr[0]). Empty in a hand-filled report: readers then take `{lr}` (monitor::group_lrs).
  std::vector<double> group_lr;
  double loss = 0.0;               ///< mean over micro-steps and data-parallel ranks of the losses given to step()
  ReportGroups groups;             ///< the grid's group sizes: what loss, grad_norm and bytes are over
  StepTimings timings;
  /// `timings` holds this boundary's phase times, measured by whoever made the report (Engine::step()
  /// sets it at boundaries). false: `timings` means nothing, and a monitor reads its own timers.
  bool timings_measured = false;
  std::uint64_t comm_wire_bytes = 0;  ///< sent by this rank since the previous boundary (ring convention)
  /// What this rank would have sent without compression since the previous boundary: comm_wire_bytes
  /// with 1-bit Adam's momentum exchanges and GradientCompression's frames replaced by the gradient
  /// all-reduces they stand in for.
  /// Equal to comm_wire_bytes when nothing was compressed.
  std::uint64_t comm_dense_bytes = 0;
  /// The slow-rank detector is on (communication.slow_node_*; monitor/slow_ranks.hpp): then
  /// `compute_ms` is this rank's compute time in the step (outside the engine's calls), and
  /// `slow_ranks` the ranks flagged slow as of this boundary (empty: none).
  bool slow_rank_detection = false;
  double compute_ms = 0;
  std::vector<SlowRank> slow_ranks;

  /// comm_dense_bytes / comm_wire_bytes (1 when nothing was sent).
  double compression_ratio() const noexcept {
    return comm_wire_bytes == 0 ? 1.0 : static_cast<double>(comm_dense_bytes) / static_cast<double>(comm_wire_bytes);
  }
};

namespace engine {
/// The byte counters at the previous boundary, to report what each step sent.
struct TrafficMarks {
  std::uint64_t wire = 0, saved = 0;
  /// `wire_now`: every communicator's wire bytes since construction; `saved_now`: what compressed
  /// exchanges saved against the dense reductions they replace, since construction.
  void report(StepReport& r, std::uint64_t wire_now, std::uint64_t saved_now) {
    r.comm_wire_bytes = wire_now - wire;
    r.comm_dense_bytes = (wire_now + saved_now) - (wire + saved);
    wire = wire_now;
    saved = saved_now;
  }
};
}  // namespace engine

namespace detail {
using Clock = std::chrono::steady_clock;
inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
}  // namespace detail

}  // namespace zerotk
