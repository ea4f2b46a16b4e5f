#pragma once
/// \file zerotk/optim/optimizer.hpp
/// The optimizer policy: `zerotk::Optimizer<Adam>`, `Optimizer<AdamW>` (optim/adam.hpp),
/// `Optimizer<Lamb>` (optim/lamb.hpp), `Optimizer<OneBitAdam>` (optim/onebit_adam.hpp),
/// `Optimizer<ZeroOneAdam>` (optim/zero_one_adam.hpp) and `Optimizer<OneBitLamb>`
/// (optim/onebit_lamb.hpp). Including this header gives all six.
///
/// An optimizer is math, parameter groups and a step count; it holds no buffers. Its per-element
/// state (Adam's and LAMB's first and second moments over one rank's fp32 partition) lives wherever
/// a state store keeps it (offload/resident.hpp in the engine; optim::Standalone for use without an
/// engine), and `optim::Run<Opt, Space>` (optim/run.hpp, optim/run_cuda.cuh) picks the kernels that
/// step it by the memory space the data lives in. The optimizer learns which pieces of the partition
/// belong to which tensor and parameter group through `Segment`s. Hyper-parameters live in
/// `ParamGroup`s; schedulers change `groups()[g].options.lr` (and beta1) between steps.
///
///   zerotk::Optimizer<zerotk::AdamW> opt({zerotk::ParamGroup{{.lr = 3e-4, .weight_decay = 0.1}},
///                                         zerotk::ParamGroup{{.lr = 3e-4, .weight_decay = 0.0}}});  // no decay
///   zerotk::optim::Moments st = ...;                  // m, v: [partition_numel] fp32, zeros at first
///   zerotk::optim::Run<decltype(opt), zerotk::HostSpace>::step(opt, segments, master, st, grads16, params16,
///                                                             1.0f / combined_scale, no_reduce);

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/core/macros.hpp"
#include "zerotk/kernels/elementwise.hpp"
#include "zerotk/kernels/tensor_list.hpp"
#include "zerotk/optim/options.hpp"
#include "zerotk/policies.hpp"

namespace zerotk {

/// A parameter group. Groups with weight_decay = 0 exclude their parameters (biases, norms) from decay.
struct ParamGroup {
  OptimizerOptions options;
};

/// One contiguous piece of this rank's fp32 partition that belongs to one parameter tensor
/// (offset/numel in partition elements; group indexes groups(); tensor is a global tensor id).
using Segment = kernels::Segment;

/// Exact optimizer state of one partition: step count, first and second moments, and what only
/// 1-bit LAMB keeps (empty for every other optimizer).
struct OptimizerState {
  std::int64_t step = 0;
  std::vector<float> m, v;
  std::vector<float> v_fresh;          ///< 1-bit LAMB's exp_avg_sq_fresh, over the same elements
  std::vector<double> tensor_scalars;  ///< 1-bit LAMB: per tensor c_f, F, k (optim/onebit_lamb.hpp)
};

/// An optimizer whose step is one elementwise rule (kernels/host/elementwise_step.hpp): it names
/// its `rule` and gives the rule's constants per group for the next step. optim::Run runs every
/// such optimizer with the generic drivers on every memory space, so a new one needs no kernel.
namespace optim {
template <class Opt>
concept ElementwiseOptimizer = requires(const Opt& o) {
  typename Opt::rule;
  { o.step_consts() } -> std::same_as<std::vector<typename Opt::rule::Consts>>;
};
}  // namespace optim

/// The reduction LAMB asks for: sums per-tensor partial sums over all ranks, in place.
template <class F>
concept TensorSumReducer = std::invocable<F&, std::span<double>>;

/// The optimizer policy. Use Optimizer<Adam>, Optimizer<AdamW>, Optimizer<Lamb>, Optimizer<OneBitAdam>,
/// Optimizer<ZeroOneAdam> or Optimizer<OneBitLamb>.
template <class Tag>
class Optimizer {
  static_assert(dependent_false<Tag>,
                "Optimizer: no specialization for this tag; the optimizers are zerotk::optimizer_tags (policies.hpp), "
                "e.g. Optimizer<AdamW>");
};

namespace optim {

/// Where one partition's optimizer state is: exp_avg (m) and exp_avg_sq (v), `numel` fp32 each, in
/// the memory space the kernels stepping it run in. Owned by a state store, never by the optimizer.
struct Moments {
  float* m = nullptr;
  float* v = nullptr;
  std::size_t numel = 0;
};

/// The per-element moment vectors a state store keeps for `Opt` beside the master: 1 (m: Lion) or
/// 2 (m and v): its tag's `moments` (policies.hpp). A store keeps v only when it is 2 (and hands the
/// kernels m in its place otherwise, which a one-moment rule never reads).
template <class Opt>
inline constexpr std::size_t moments_v = Opt::tag::moments;

/// Checks that `s` fits a partition of `numel` elements of an optimizer with `moments` moment
/// vectors (v is empty with one); `where` names the caller in the error.
inline void check_state(const OptimizerState& s, std::size_t numel, const char* where, std::size_t moments = 2) {
  const std::size_t v = moments >= 2 ? numel : 0;
  if (s.m.size() != numel || s.v.size() != v) {
    throw usage_error("optimizer state is for a partition of another size (or another optimizer)", where,
                      "m " + std::to_string(s.m.size()) + ", v " + std::to_string(s.v.size()) + " for " +
                          std::to_string(numel) + " elements and " + std::to_string(moments) + " moments");
  }
  if (s.step < 0) throw usage_error("negative step count", where, std::to_string(s.step));
}

/// The state an optimizer keeps beside m and v (1-bit LAMB's v_f and per-tensor scalars), for the
/// stores: save_extra fills `s`, check_extra rejects a state that does not fit (for the others: one
/// that carries any), load_extra restores it. No-ops for optimizers without one.
template <class Opt>
void save_extra(const Opt& opt, OptimizerState& s) {
  if constexpr (requires { opt.save_extra(s); }) opt.save_extra(s);
}
template <class Opt>
void check_extra(const Opt& opt, const OptimizerState& s, const char* where) {
  if constexpr (requires { opt.check_extra(s, where); }) {
    opt.check_extra(s, where);
  } else if (!s.v_fresh.empty() || !s.tensor_scalars.empty()) {
    throw usage_error("state carries 1-bit LAMB's fresh variance or per-tensor scalars, which this optimizer does not keep",
                      where, std::to_string(s.v_fresh.size()) + " + " + std::to_string(s.tensor_scalars.size()) + " values");
  }
}
template <class Opt>
void load_extra(Opt& opt, const OptimizerState& s) {
  if constexpr (requires { opt.load_extra(s); }) opt.load_extra(s);
}

/// The extra state viewed where the optimizer keeps it (host memory): 1-bit LAMB's v_f in place
/// and a copy of its per-tensor scalars (small); empty for optimizers without one.
struct ExtraView {
  std::span<const float> v_fresh;
  std::vector<double> tensor_scalars;
};
template <class Opt>
std::optional<ExtraView> extra_view(const Opt& opt) {
  if constexpr (requires { opt.fresh_variance(); opt.encoded_tensor_states(); }) {
    return ExtraView{std::span<const float>(opt.fresh_variance(), opt.buffer_numel()), opt.encoded_tensor_states()};
  } else {
    (void)opt;
    return std::nullopt;
  }
}

namespace detail {

/// What all optimizers share: groups and their validation, the step count, the model's tensor count.
class OptimizerCore {
 public:
  explicit OptimizerCore(std::vector<ParamGroup> groups) : groups_(std::move(groups)) {
    if (groups_.empty()) throw config_error("at least one parameter group is required", "optimizer.groups", "0 groups");
    for (std::size_t g = 0; g < groups_.size(); ++g) validate(g);
  }

  std::vector<ParamGroup>& groups() noexcept { return groups_; }
  const std::vector<ParamGroup>& groups() const noexcept { return groups_; }
  /// Steps taken (the bias-correction t of the last step).
  std::int64_t step_count() const noexcept { return step_; }
  /// Sets the step count (a restored state); the next step uses t = n + 1.
  void set_step_count(std::int64_t n) {
    if (n < 0) throw usage_error("negative step count", "Optimizer::set_step_count", std::to_string(n));
    step_ = n;
  }

  /// Number of tensors in the whole model (LAMB): the per-tensor sums handed to the reducer are sized
  /// max(this, largest tensor id in the segments + 1), so every rank passes spans of equal length.
  void set_tensor_count(std::size_t n) noexcept { tensor_count_ = n; }
  std::size_t tensor_count() const noexcept { return tensor_count_; }

  /// Checks every argument of a step over the partition the moments cover (st.numel elements)
  /// before anything is modified (groups too: schedulers may have changed lr/beta1); returns the
  /// length of the per-tensor sums, max(tensor_count(), largest tensor id + 1).
  std::size_t check_step(std::span<const Segment> segments, const void* master, const Moments& st,
                         const void* grads) const {
    for (std::size_t g = 0; g < groups_.size(); ++g) validate(g);
    const std::size_t numel = st.numel;
    if (numel != 0 && (st.m == nullptr || st.v == nullptr)) {
      throw usage_error("the optimizer state has no m or v buffer", "Optimizer::step",
                        std::to_string(numel) + " state elements");
    }
    if (!segments.empty() && (master == nullptr || grads == nullptr)) {
      throw usage_error("master and grads must not be null", "Optimizer::step");
    }
    std::size_t tensors = tensor_count_;
    for (std::size_t i = 0; i < segments.size(); ++i) {
      const Segment& s = segments[i];
      if (s.offset > numel || s.numel > numel - s.offset) {
        throw usage_error("segment outside the partition", "Optimizer::step: segment " + std::to_string(i),
                          "[" + std::to_string(s.offset) + ", " + std::to_string(s.offset + s.numel) + ") of " +
                              std::to_string(numel));
      }
      if (s.group >= groups_.size()) {
        throw usage_error("segment names a group that does not exist", "Optimizer::step: segment " + std::to_string(i),
                          std::to_string(s.group) + " >= " + std::to_string(groups_.size()));
      }
      if (static_cast<std::size_t>(s.tensor) + 1 > tensors) tensors = static_cast<std::size_t>(s.tensor) + 1;
    }
    return tensors;
  }

  /// Counts the step whose constants were just taken (call once per step, after check_step).
  void advance() noexcept { ++step_; }

 protected:
  void validate(std::size_t g) const {
    optim::validate(groups_[g].options, "optimizer.groups[" + std::to_string(g) + "].");
  }

  std::vector<ParamGroup> groups_;
  std::int64_t step_ = 0;
  std::size_t tensor_count_ = 0;
};

/// What 1-bit Adam and 1-bit LAMB share: the phase by the step count (t = 1 set-up, warm-up up to
/// max(2, freeze_step), compressed after it) and the momentum exchange hook the engine sets.
class FreezePhaseCore : public OptimizerCore {
 public:
  /// What the step about to be taken does.
  enum class Phase : std::uint8_t { first, warmup, compressed };
  /// Replaces the local momentum of the segments by its compressed average over the ranks (1-bit
  /// Adam: per segment; 1-bit LAMB: all segments end to end as one vector). Called once per
  /// compressed step, by every rank.
  using MomentumExchange = std::function<void(std::span<const Segment> segments, float* m)>;

  using OptimizerCore::OptimizerCore;

  /// Warm-up steps before compression (DeepSpeed `freeze_step`, default 100000).
  void set_freeze_step(std::int64_t steps) {
    if (steps < 0) throw config_error("must be >= 0", "optimizer.params.freeze_step", std::to_string(steps));
    freeze_step_ = steps;
  }
  std::int64_t freeze_step() const noexcept { return freeze_step_; }

  /// The phase of the next step (t = step_count() + 1).
  Phase next_phase() const noexcept {
    if (step_ == 0) return Phase::first;
    return step_ >= std::max<std::int64_t>(2, freeze_step_) ? Phase::compressed : Phase::warmup;
  }
  /// Whether the next step reads each rank's own gradients (no gradient all-reduce before it).
  bool gradients_local() const noexcept { return next_phase() == Phase::compressed; }

  void set_momentum_exchange(MomentumExchange f) { exchange_ = std::move(f); }
  /// Runs the exchange (none set: the momentum stays local).
  void exchange_momentum(std::span<const Segment> segments, float* m) const {
    if (exchange_) exchange_(segments, m);
  }

 private:
  std::int64_t freeze_step_ = 100'000;
  MomentumExchange exchange_;
};

}  // namespace detail
}  // namespace optim
}  // namespace zerotk

// The specializations; each includes this header first, so any include order works.
#include "zerotk/optim/adam.hpp"
#include "zerotk/optim/lamb.hpp"
#include "zerotk/optim/onebit_adam.hpp"
#include "zerotk/optim/zero_one_adam.hpp"
#include "zerotk/optim/onebit_lamb.hpp"
#include "zerotk/optim/lion.hpp"
