#pragma once
/// \file zerotk/engine/optimizer_comm.hpp
/// What a flat group adds for its optimizer's own communication, chosen by the optimizer type:
///
///   Adam, AdamW, Lamb      PlainOptimizerComm   nothing (LAMB's per-tensor sums go through the
///                                               store's reducer)
///   OneBitAdam             OneBitMomentum       the compressed momentum exchange, one
///                                               compress::OneBitAllReduce (with its worker and
///                                               server errors) per tensor, the tensors' collectives
///                                               batched (compress::OneBitBatch: 4 operations per
///                                               step, not 4 per tensor), as DeepSpeed's fp32
///                                               path compresses each parameter's exp_avg (its fp16
///                                               wrapper flattens each param group into one); and
///                                               the switch of the stage-0 gradient all-reduce
///
/// A part offers: sync(opt) after every step and load (sets the gradient switch for the next
/// step), reset() (zeroes compression errors: DeepSpeed does it when a checkpoint is loaded), and
/// wire_bytes() (what its exchanges sent, counted by the communicator).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "zerotk/compress/onebit_batch.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/engine/options.hpp"
#include "zerotk/kernels/tensor_list.hpp"
#include "zerotk/optim/optimizer.hpp"
#include "zerotk/zero/grads/context.hpp"

namespace zerotk::engine {

/// Optimizers that communicate nothing of their own.
class PlainOptimizerComm {
 public:
  template <class Opt, class Comm>
  PlainOptimizerComm(Opt&, Comm&, std::span<const kernels::Segment>, MemoryLedger*, zero::LocalGradients*,
                     const OneBitOptions&) {}
  template <class Opt>
  void sync(const Opt&) noexcept {}
  void reset() noexcept {}
  std::uint64_t wire_bytes() const noexcept { return 0; }
};

/// 1-bit Adam's momentum exchange over the engine's communicator (optim/onebit_adam.hpp).
template <class Comm>
class OneBitMomentum {
 public:
  /// Error buffers for every segment (one per tensor at stage 0) on `comm`'s world, recorded in the
  /// ledger from construction on (DeepSpeed allocates them at the first compressed step; here the
  /// memory a run needs is there from the start). One rank: no buffers, no exchange.
  OneBitMomentum(Optimizer<OneBitAdam>& opt, Comm& comm, std::span<const kernels::Segment> segments,
                 MemoryLedger* ledger, zero::LocalGradients* local, const OneBitOptions& options)
      : comm_(&comm), local_(local), ledger_(ledger) {
    opt.set_freeze_step(options.freeze_step);
    if (comm.size() > 1) {
      std::vector<std::size_t> numels;
      numels.reserve(segments.size());
      for (const kernels::Segment& s : segments) numels.push_back(s.numel);
      batch_.emplace(numels, comm.size());
      state_bytes_ = batch_->error_bytes();
      buffer_bytes_ = batch_->scratch_bytes();
      views_.resize(segments.size());
      opt.set_momentum_exchange([this](std::span<const kernels::Segment> segs, float* m) { run(segs, m); });
    }
    if (ledger_) {
      ledger_->add(MemoryCategory::optimizer_state, state_bytes_);
      ledger_->add(MemoryCategory::comm_buffers, buffer_bytes_);
    }
    sync(opt);
  }
  OneBitMomentum(const OneBitMomentum&) = delete;
  OneBitMomentum& operator=(const OneBitMomentum&) = delete;
  ~OneBitMomentum() {
    if (ledger_) {
      ledger_->sub(MemoryCategory::optimizer_state, state_bytes_);
      ledger_->sub(MemoryCategory::comm_buffers, buffer_bytes_);
    }
  }

  /// The gradient all-reduce of the next step is off in the compressed phase.
  void sync(const Optimizer<OneBitAdam>& opt) noexcept { local_->on = opt.gradients_local(); }
  void reset() {
    if (batch_) batch_->reset();
  }
  std::uint64_t wire_bytes() const noexcept { return wire_bytes_; }

 private:
  void run(std::span<const kernels::Segment> segments, float* m) {
    if (segments.size() != views_.size()) {
      throw usage_error("the momentum exchange was built for another number of segments", "engine::OneBitMomentum",
                        std::to_string(segments.size()) + " for " + std::to_string(views_.size()));
    }
    for (std::size_t i = 0; i < segments.size(); ++i) views_[i] = std::span<float>(m + segments[i].offset, segments[i].numel);
    const std::uint64_t before = comm_->stats().total_wire_bytes();
    batch_->run(*comm_, std::span<const std::span<float>>(views_));
    wire_bytes_ += comm_->stats().total_wire_bytes() - before;
  }

  Comm* comm_;
  zero::LocalGradients* local_;
  MemoryLedger* ledger_;
  std::optional<compress::OneBitBatch> batch_;  // one reducer per segment; none on one rank
  std::vector<std::span<float>> views_;          // each segment's momentum, per call
  std::size_t state_bytes_ = 0, buffer_bytes_ = 0;
  std::uint64_t wire_bytes_ = 0;
};

template <class Opt, class Comm>
struct OptimizerCommOf {
  using type = PlainOptimizerComm;
};
template <class Comm>
struct OptimizerCommOf<Optimizer<OneBitAdam>, Comm> {
  using type = OneBitMomentum<Comm>;
};

}  // namespace zerotk::engine
