#pragma once
/// \file zerotk/optim/optimizer.hpp
/// The optimizer policy: `zerotk::Optimizer<Adam>`, `Optimizer<AdamW>` (optim/adam.hpp) and
/// `Optimizer<Lamb>` (optim/lamb.hpp). Including this header gives all three.
///
/// An optimizer steps ONE rank's fp32 partition: it owns m and v for that partition (ZeRO stage >= 1
/// keeps only this rank's share) and is told which pieces of the partition belong to which tensor and
/// parameter group through `Segment`s. Hyper-parameters live in `ParamGroup`s; schedulers change
/// `groups()[g].options.lr` (and beta1) between steps. Every step is one fused pass through the host
/// kernels (kernels/host/), reading 16-bit or fp32 gradients with the combined unscale * clip factor
/// folded in and writing the 16-bit working copy.
///
///   zerotk::Optimizer<zerotk::AdamW> opt({zerotk::ParamGroup{{.lr = 3e-4, .weight_decay = 0.1}},
///                                         zerotk::ParamGroup{{.lr = 3e-4, .weight_decay = 0.0}}});  // no decay
///   opt.init_state(partition_numel, &ledger);
///   opt.step(segments, master, grads16, params16, 1.0f / combined_scale, no_reduce);

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/core/macros.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/kernels/elementwise.hpp"
#include "zerotk/kernels/host/adam.hpp"
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

/// Exact optimizer state of one partition: step count, first and second moments.
struct OptimizerState {
  std::int64_t step = 0;
  std::vector<float> m, v;
};

/// The reduction LAMB asks for: sums per-tensor partial sums over all ranks, in place.
template <class F>
concept TensorSumReducer = std::invocable<F&, std::span<double>>;

/// The optimizer policy. Use Optimizer<Adam>, Optimizer<AdamW> or Optimizer<Lamb>.
template <class Tag>
class Optimizer {
  static_assert(dependent_false<Tag>,
                "Optimizer: no specialization for this tag; use Optimizer<Adam>, Optimizer<AdamW> or Optimizer<Lamb>");
};

namespace optim::detail {

/// What all optimizers share: groups and their validation, the m/v buffers, the step count.
class OptimizerBase {
 public:
  explicit OptimizerBase(std::vector<ParamGroup> groups) : groups_(std::move(groups)) {
    if (groups_.empty()) throw config_error("at least one parameter group is required", "optimizer.groups", "0 groups");
    for (std::size_t g = 0; g < groups_.size(); ++g) validate(g);
  }

  /// Allocates m and v (zeros) for a partition of `partition_numel` fp32 elements, recorded in the
  /// ledger's optimizer_state category. Resets the step count.
  void init_state(std::size_t partition_numel, MemoryLedger* ledger = nullptr) {
    m_ = TrackedBuffer<float>(partition_numel, MemoryCategory::optimizer_state, ledger);
    v_ = TrackedBuffer<float>(partition_numel, MemoryCategory::optimizer_state, ledger);
    numel_ = partition_numel;
    step_ = 0;
    initialized_ = true;
  }

  std::vector<ParamGroup>& groups() noexcept { return groups_; }
  const std::vector<ParamGroup>& groups() const noexcept { return groups_; }
  /// Steps taken (the bias-correction t of the last step).
  std::int64_t step_count() const noexcept { return step_; }
  std::size_t partition_numel() const noexcept { return numel_; }

  /// The first and second moments, [partition_numel] fp32 each (for offload and checkpoint writers).
  std::span<float> exp_avg() noexcept { return {m_.data(), m_.size()}; }
  std::span<float> exp_avg_sq() noexcept { return {v_.data(), v_.size()}; }
  std::span<const float> exp_avg() const noexcept { return {m_.data(), m_.size()}; }
  std::span<const float> exp_avg_sq() const noexcept { return {v_.data(), v_.size()}; }

  OptimizerState state() const {
    return OptimizerState{step_, std::vector<float>(m_.begin(), m_.end()), std::vector<float>(v_.begin(), v_.end())};
  }
  /// Restores a state taken from an optimizer over a partition of the same size (bit-exact).
  void load_state(const OptimizerState& s) {
    require_state("load_state");
    if (s.m.size() != numel_ || s.v.size() != numel_) {
      throw usage_error("optimizer state is for a partition of another size", "Optimizer::load_state",
                        "m " + std::to_string(s.m.size()) + ", v " + std::to_string(s.v.size()) + " for " +
                            std::to_string(numel_) + " elements");
    }
    if (s.step < 0) throw usage_error("negative step count", "Optimizer::load_state", std::to_string(s.step));
    std::copy(s.m.begin(), s.m.end(), m_.begin());
    std::copy(s.v.begin(), s.v.end(), v_.begin());
    step_ = s.step;
  }

  /// Number of tensors in the whole model (LAMB): the per-tensor sums handed to the reducer are sized
  /// max(this, largest tensor id in the segments + 1), so every rank passes spans of equal length.
  void set_tensor_count(std::size_t n) noexcept { tensor_count_ = n; }
  std::size_t tensor_count() const noexcept { return tensor_count_; }

 protected:
  void validate(std::size_t g) const {
    optim::validate(groups_[g].options, "optimizer.groups[" + std::to_string(g) + "].");
  }

  void require_state(const char* what) const {
    if (!initialized_) {
      throw usage_error("init_state(partition_numel) must be called first", std::string("Optimizer::") + what);
    }
  }

  /// Checks every argument of a step before anything is modified; returns max tensor id + 1.
  std::size_t check_step(std::span<const Segment> segments, const void* master, const void* grads) const {
    require_state("step");
    for (std::size_t g = 0; g < groups_.size(); ++g) validate(g);  // schedulers may have changed lr/beta1
    if (!segments.empty() && (master == nullptr || grads == nullptr)) {
      throw usage_error("master and grads must not be null", "Optimizer::step");
    }
    std::size_t tensors = 0;
    for (std::size_t i = 0; i < segments.size(); ++i) {
      const Segment& s = segments[i];
      if (s.offset > numel_ || s.numel > numel_ - s.offset) {
        throw usage_error("segment outside the partition", "Optimizer::step: segment " + std::to_string(i),
                          "[" + std::to_string(s.offset) + ", " + std::to_string(s.offset + s.numel) + ") of " +
                              std::to_string(numel_));
      }
      if (s.group >= groups_.size()) {
        throw usage_error("segment names a group that does not exist", "Optimizer::step: segment " + std::to_string(i),
                          std::to_string(s.group) + " >= " + std::to_string(groups_.size()));
      }
      if (static_cast<std::size_t>(s.tensor) + 1 > tensors) tensors = static_cast<std::size_t>(s.tensor) + 1;
    }
    return tensors;
  }

  std::vector<ParamGroup> groups_;
  TrackedBuffer<float> m_, v_;  // [partition_numel] fp32 each
  std::size_t numel_ = 0;
  std::int64_t step_ = 0;
  std::size_t tensor_count_ = 0;
  bool initialized_ = false;
};

}  // namespace optim::detail
}  // namespace zerotk

// The specializations; each includes this header first, so any include order works.
#include "zerotk/optim/adam.hpp"
#include "zerotk/optim/lamb.hpp"
