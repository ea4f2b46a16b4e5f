#pragma once
/// \file zerotk/engine/boundary_step.hpp
/// The optimizer boundary as one pipeline (DESIGN.md, "one boundary step"), over the engine's parts:
///
///   Sparsity's masks (engine/sparsity.hpp: chosen at their step, the pruned gradients zeroed) ->
///   global norm and overflow agreement (engine/boundary.hpp: two fp64 all-reduces over every rank
///   the parameters span) -> scaler.update(overflow); on overflow: drop the gradients, count a
///   skipped step, stop -> clip factor (SEMANTICS.md 2) -> every group's update, taken by all or by
///   none (engine/groups.hpp), or the delayed update (offload/delayed_update.hpp) -> Sparsity's
///   pruning of the new values -> publication ->
///   the LR scheduler (engine/schedule.hpp).
///
/// An update that fails (an I/O error of a swapped store or shard) leaves every group's state as it
/// was; the boundary then puts the scaler and the step count back and drops the gradients, so the
/// next step starts afresh.

#include <cmath>
#include <cstdint>
#include <optional>

#include "zerotk/engine/boundary.hpp"
#include "zerotk/engine/report.hpp"
#include "zerotk/engine/schedule.hpp"
#include "zerotk/optim/clip.hpp"
#include "zerotk/precision/loss_scaler.hpp"

namespace zerotk::engine {

/// The engine's step counters and the accumulation in progress.
struct StepCounters {
  int micro_in_accum = 0;  ///< micro-steps of the accumulation in progress (0: at a boundary)
  std::int64_t micro_steps = 0, global_steps = 0, skipped_steps = 0;
  double loss_sum = 0;     ///< of the accumulation in progress
  /// An accumulation ends (a boundary, or one abandoned by an error): the next step starts afresh.
  void end_accumulation() noexcept {
    micro_in_accum = 0;
    loss_sum = 0;
  }
};

/// What the boundary reads of the options.
struct BoundarySettings {
  int gradient_accumulation_steps = 1;
  double gradient_clipping = 0.0;
  bool delayed_param_update = false;
  std::int64_t delayed_param_update_start = 0;
};

template <class Groups, class Scaler, class Comms, class Ops, class Sparse>
class BoundaryStep {
 public:
  BoundaryStep(Groups& groups, Scaler& scaler, Comms& comms, Ops& ops, Schedule& schedule, Sparse& sparse,
               BoundarySettings settings, std::uint64_t norm_count)
      : groups_(&groups), scaler_(&scaler), comms_(&comms), ops_(&ops), schedule_(&schedule), sparse_(&sparse),
        s_(settings), norm_count_(norm_count) {}

  /// One boundary; `on_bucket(group, k)` runs once bucket k of `group` holds its new values.
  template <class OnBucket>
  void run(StepCounters& c, StepReport& r, OnBucket&& on_bucket) {
    const double gas = s_.gradient_accumulation_steps;
    sparse_->before_norm(*groups_, c.global_steps);
    const GlobalNorm norm = global_norm(comms_->norm(), comms_->norm_share(), *ops_, norm_count_, c.loss_sum / gas,
                                        [&](auto&& f) { groups_->each(f); }, groups_->gradients_local());
    r.loss = norm.loss_sum / comms_->place().data_size;
    r.boundary = true;
    const double sumsq = norm.sum_squares / (gas * gas);  // of the scaled, GAS-averaged gradients
    const double scale = scaler_->scale();
    const LossScalerState scaler_before = scaler_->state();  // an abandoned update puts it back
    const bool skip = scaler_->update(norm.nonfinite);
    ++c.global_steps;
    r.lr = schedule_->lr(0);
    const bool delayed = s_.delayed_param_update && c.global_steps > s_.delayed_param_update_start;
    if (skip) {  // nothing is updated; only the (non-finite) accumulated gradients are dropped
      if (delayed) {
        delayed_update(std::nullopt, on_bucket);  // the previous update is still published
      } else {
        groups_->skip();
      }
      ++c.skipped_steps;
      r.skipped = true;
      r.grad_norm = -1;
      r.group_lr = schedule_->lrs();
      return;
    }
    const ClipResult clip = clip_factor(norm.nonfinite ? INFINITY : sumsq, scale, s_.gradient_clipping);
    r.grad_norm = clip.reported_norm;
    const float grad_scale = static_cast<float>(static_cast<double>(clip.grad_factor) / gas);
    try {
      if (delayed) {
        delayed_update(grad_scale, on_bucket);
      } else {
        groups_->update(grad_scale, on_bucket, [this](auto& g) { sparse_->after_update(g); });
      }
    } catch (...) {
      groups_->skip();
      scaler_->load_state(scaler_before);
      --c.global_steps;
      throw;
    }
    schedule_->step();
    schedule_->apply(*groups_);
    r.group_lr = schedule_->lrs();
  }

 private:
  /// The boundary with the delayed parameter update: the previous boundary's update is waited for
  /// and published, this one's (unless skipped: no `grad_scale`) started on each group's worker. The
  /// schedule reaches the optimizer only between the two.
  template <class OnBucket>
  void delayed_update(std::optional<float> grad_scale, OnBucket& on_bucket) {
    if constexpr (Groups::main_type::kCanDelayUpdate) {
      groups_->each([](auto& g) { g.finish_update(); });
      schedule_->apply(*groups_);
      // A publication may finish after this returns (overlap_param_gather keeps the callback): copies.
      groups_->each([&](auto& g) { g.update_delayed(grad_scale, [on_bucket, &g](std::size_t k) { on_bucket(g, k); }); });
    } else {
      (void)grad_scale, (void)on_bucket;
    }
  }

  Groups* groups_;
  Scaler* scaler_;
  Comms* comms_;
  Ops* ops_;
  Schedule* schedule_;
  Sparse* sparse_;
  BoundarySettings s_;
  std::uint64_t norm_count_;
};

}  // namespace zerotk::engine
