#pragma once
/// \file zerotk/optim/zero_one_adam.hpp
/// `Optimizer<ZeroOneAdam>`: DeepSpeed's 0/1 Adam (docs/design/onebit_next.md section A; DeepSpeed
/// v0.19 runtime/fp16/onebit/zoadam.py). Adam without bias correction whose communication thins out
/// over the run. What step t does is optim/zero_one_schedule.hpp's `kind(t)`:
///
///   init    t = 1: counted (the scheduler steps too), nothing else changes
///   var     the gradients were all-reduced (averaged) by the engine: Adam's step,
///           m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2, p -= lr (m / (sqrt(v) + eps) + wd p)
///   grad    local gradients; the gradient is 1-bit all-reduced (per tensor, worker and server error
///           feedback: compress/onebit_allreduce.hpp), m is updated from it, v is not, p steps
///   local   (frozen phase) m from the local gradient, d = -lr (m / (sqrt(v) + eps) + wd p),
///           p += d, u += d, L += lr; nothing is sent
///   sync    a local step, then the interval's local steps are taken back (p -= u), the
///           accumulated update u (sqrt(v) + eps) is 1-bit all-reduced, m = -(u / L) (the lr-weighted
///           average momentum over the ranks) and p += u / (sqrt(v) + eps); u, L = 0
///
/// The errors of the 1-bit all-reduce carry gradient errors in the variance phase and accumulator
/// errors in the frozen phase; they are zeroed once, before the first frozen step (DeepSpeed's
/// reinitial_error_buffer).
///
/// The optimizer holds no buffers. The engine (optim/onebit_exchange.hpp) gives it the accumulator u
/// (`set_accumulator`, n fp32 zeros over the partition) and the exchange (`set_exchange`); without an
/// exchange nothing is all-reduced, the W = 1 behaviour. After each step the engine asks
/// `gradients_local()` to switch the stage-0 gradient all-reduce of the next backward (on only before
/// var steps).
///
/// Deliberate differences from DeepSpeed v0.19 (each documented in docs/compress.md):
///  - the schedule is a function of the step count, so a loaded checkpoint continues it exactly
///    (DeepSpeed resets its counters on load and may then take a var step on local gradients);
///  - at W = 1 a grad step updates m from the local gradient (DeepSpeed leaves m stale there);
///  - compression is per tensor in every precision (DeepSpeed's fp16 wrapper compresses per group);
///  - a sync whose lr sum L is 0 keeps m (DeepSpeed divides by 0: m, then p, become NaN);
///  - u, L and the errors are each rank's rank-local state (engine/state.hpp): the engine saves and
///    restores them with state() and same-layout checkpoints, so a resumed run is exact; DeepSpeed
///    drops them on every load (zerotk too when the state has no rank-local part: a reshard).

#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "zerotk/optim/optimizer.hpp"
#include "zerotk/optim/zero_one_schedule.hpp"

namespace zerotk {

template <>
class Optimizer<ZeroOneAdam> : public optim::detail::OptimizerCore {
 public:
  using policy_kind = policy::optimizer;
  using tag = ZeroOneAdam;
  using State = OptimizerState;
  using consts_type = kernels::AdamStepConsts;
  using Kind = optim::ZeroOneSchedule::Kind;
  /// All-reduces x (the scaled gradient in grad steps, the weighted accumulator in syncs) segment by
  /// segment in place, each segment with its own worker and server errors. Every rank calls it.
  using Exchange = std::function<void(std::span<const Segment> segments, float* x)>;

  explicit Optimizer(std::vector<ParamGroup> groups) : OptimizerCore(std::move(groups)), lr_sums_(groups_.size(), 0.0) {}

  /// var_freeze_step, var_update_scaler, local_step_scaler, local_step_clipper (config_error when out
  /// of range).
  void set_schedule(const optim::ZeroOneOptions& o) { schedule_ = optim::ZeroOneSchedule(o); }
  const optim::ZeroOneSchedule& schedule() const noexcept { return schedule_; }

  /// What the next step (t = step_count() + 1) does.
  Kind next_kind() const { return schedule_.kind(step_ + 1); }
  /// Whether the next step reads each rank's own gradients (no gradient all-reduce before it).
  bool gradients_local() const {
    const Kind k = next_kind();
    return k == Kind::grad || k == Kind::local || k == Kind::sync;
  }

  /// The 1-bit all-reduce and the reset of its errors (both or neither).
  void set_exchange(Exchange all_reduce, std::function<void()> reset_errors) {
    exchange_ = std::move(all_reduce);
    reset_errors_ = std::move(reset_errors);
  }
  bool has_exchange() const noexcept { return static_cast<bool>(exchange_); }
  void all_reduce(std::span<const Segment> segments, float* x) const {
    if (exchange_) exchange_(segments, x);
  }
  void reset_errors() const {
    if (reset_errors_) reset_errors_();
  }

  /// The accumulator u: `numel` fp32 values over the partition, zeros, kept by the caller; grad, local
  /// and sync steps need it.
  void set_accumulator(float* u, std::size_t numel) noexcept {
    u_ = u;
    u_numel_ = numel;
  }
  float* accumulator() const noexcept { return u_; }
  /// Throws usage_error unless the next step has the accumulator it needs under every segment.
  void check_accumulator(std::span<const Segment> segments) const {
    const Kind k = next_kind();
    if (k == Kind::init || k == Kind::var) return;
    const std::size_t need = kernels::segments_extent(segments);
    if (need > 0 && (u_ == nullptr || u_numel_ < need)) {
      throw usage_error("0/1 Adam's " + std::string(optim::ZeroOneSchedule::name(k)) +
                            " step needs the accumulator under every segment: call set_accumulator(u, numel)",
                        "Optimizer<ZeroOneAdam>::step",
                        std::to_string(u_ == nullptr ? 0 : u_numel_) + " accumulator elements, segments end at " +
                            std::to_string(need));
    }
  }

  /// The sum of each group's lr over the frozen steps since the last sync (DeepSpeed's `lrs`, a
  /// Python float there, a double here).
  std::span<const double> lr_sums() const noexcept { return lr_sums_; }
  void add_lr_sums() {
    lr_sums_.resize(groups_.size(), 0.0);
    for (std::size_t g = 0; g < groups_.size(); ++g) lr_sums_[g] += groups_[g].options.lr;
  }
  /// The sums rounded to float, as the element math uses them.
  std::vector<float> lr_sums_float() const {
    std::vector<float> f(lr_sums_.size());
    for (std::size_t g = 0; g < f.size(); ++g) f[g] = static_cast<float>(lr_sums_[g]);
    return f;
  }
  void clear_lr_sums() noexcept { std::fill(lr_sums_.begin(), lr_sums_.end(), 0.0); }
  /// Restores sums taken with lr_sums() (a rank-local state, engine/state.hpp): one per group.
  void set_lr_sums(std::span<const double> sums) {
    if (sums.size() != groups_.size()) {
      throw usage_error("one lr sum per parameter group expected", "Optimizer<ZeroOneAdam>::set_lr_sums",
                        std::to_string(sums.size()) + " for " + std::to_string(groups_.size()) + " groups");
    }
    lr_sums_.assign(sums.begin(), sums.end());
  }

  /// Sets the step count (a restored state; hides OptimizerCore's): the accumulator and the lr sums
  /// start from zero, as after DeepSpeed's load (the engine then restores both from the state's
  /// rank-local part when it has one).
  void set_step_count(std::int64_t n) {
    OptimizerCore::set_step_count(n);
    clear_lr_sums();
    if (u_ != nullptr) std::fill(u_, u_ + u_numel_, 0.0f);
  }

  /// The kernel constants of the step about to be taken, one per group: Adam's with decoupled decay
  /// and no bias correction.
  std::vector<kernels::AdamStepConsts> step_consts() const {
    return optim::detail::adam_step_consts(groups_, step_ + 1, /*adamw_mode=*/true, /*allow_bias_correction=*/false);
  }

 private:
  optim::ZeroOneSchedule schedule_;
  Exchange exchange_;
  std::function<void()> reset_errors_;
  float* u_ = nullptr;
  std::size_t u_numel_ = 0;
  std::vector<double> lr_sums_;  // per group
};

}  // namespace zerotk
