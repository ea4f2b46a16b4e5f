#pragma once
/// \file zerotk/optim/onebit_exchange.hpp
/// What a flat group adds for its optimizer's own communication, chosen by the optimizer type (next
/// to the optimizers: engine/optimizer_comm.hpp gives the engine these names):
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
///   ZeroOneAdam            ZeroOneExchange      the same per-tensor 1-bit all-reduce, of the
///                                               gradient in grad steps and of the accumulator in
///                                               syncs; the accumulator; the switch
///   OneBitLamb             OneBitLambExchange   ONE 1-bit all-reduce of the whole model's (scaled)
///                                               momentum as a flat vector with a persistent tail,
///                                               as DeepSpeed; the fresh variance and scratch; the
///                                               switch
///
/// A part offers: sync(opt) after every step and load (sets the gradient switch for the next
/// step), reset() (zeroes compression errors: DeepSpeed does it on every load, zerotk when the
/// loaded state has no rank-local part),
/// wire_bytes() (what its exchanges sent, counted by the communicator), and its share of the
/// group's rank-local state (optim/rank_local.hpp): rank_local_size(), save_rank_local(out) (appends),
/// load_rank_local(reader) (takes the same share back, after reset()).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "zerotk/compress/onebit_allreduce.hpp"
#include "zerotk/compress/onebit_batch.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/kernels/tensor_list.hpp"
#include "zerotk/optim/local_gradients.hpp"
#include "zerotk/optim/onebit_options.hpp"
#include "zerotk/optim/optimizer.hpp"
#include "zerotk/optim/rank_local.hpp"

namespace zerotk::optim {

/// Optimizers that communicate nothing of their own.
class PlainOptimizerComm {
 public:
  static constexpr bool kOneFlatVector = false;
  template <class Opt, class Comm>
  PlainOptimizerComm(Opt&, Comm&, std::span<const kernels::Segment>, MemoryLedger*, LocalGradients*,
                     const OneBitOptions&) {}
  template <class Opt>
  void sync(const Opt&) noexcept {}
  void reset() noexcept {}
  std::uint64_t wire_bytes() const noexcept { return 0; }
  RankLocalSize rank_local_size() const noexcept { return {}; }
  void save_rank_local(RankLocalState&) const noexcept {}
  void load_rank_local(RankLocalReader&) noexcept {}
};

namespace detail {

/// The 1-bit all-reduce of every segment of a flat buffer over `comm`'s world: one
/// compress::OneBitAllReduce (worker and server errors) per segment, the segments' collectives
/// batched (compress::OneBitBatch). Error buffers (optimizer_state) and scratch (comm_buffers) are
/// in the ledger from construction on; one rank has neither and `active()` is false.
template <class Comm>
class SegmentExchange {
 public:
  SegmentExchange(Comm& comm, std::span<const kernels::Segment> segments, MemoryLedger* ledger)
      : comm_(&comm), ledger_(ledger) {
    if (comm.size() > 1) {
      std::vector<std::size_t> numels;
      numels.reserve(segments.size());
      for (const kernels::Segment& s : segments) numels.push_back(s.numel);
      batch_.emplace(numels, comm.size());
      state_bytes_ = batch_->error_bytes();
      buffer_bytes_ = batch_->scratch_bytes();
      views_.resize(segments.size());
    }
    if (ledger_) {
      ledger_->add(MemoryCategory::optimizer_state, state_bytes_);
      ledger_->add(MemoryCategory::comm_buffers, buffer_bytes_);
    }
  }
  SegmentExchange(const SegmentExchange&) = delete;
  SegmentExchange& operator=(const SegmentExchange&) = delete;
  ~SegmentExchange() {
    if (ledger_) {
      ledger_->sub(MemoryCategory::optimizer_state, state_bytes_);
      ledger_->sub(MemoryCategory::comm_buffers, buffer_bytes_);
    }
  }

  bool active() const noexcept { return batch_.has_value(); }
  /// Replaces each segment of x (x + offset, numel values) by its compressed average over the ranks.
  void run(std::span<const kernels::Segment> segments, float* x) {
    if (segments.size() != views_.size()) {
      throw usage_error("the 1-bit exchange was built for another number of segments", "optim::SegmentExchange",
                        std::to_string(segments.size()) + " for " + std::to_string(views_.size()));
    }
    for (std::size_t i = 0; i < segments.size(); ++i) views_[i] = std::span<float>(x + segments[i].offset, segments[i].numel);
    const std::uint64_t before = comm_->stats().total_wire_bytes();
    batch_->run(*comm_, std::span<const std::span<float>>(views_));
    wire_bytes_ += comm_->stats().total_wire_bytes() - before;
  }
  /// Zeroes every worker and server error.
  void reset() {
    if (batch_) batch_->reset();
  }
  /// Every segment's worker and server errors (none on one rank).
  std::size_t error_values() const noexcept { return batch_ ? batch_->error_values() : 0; }
  void save_errors(RankLocalState& out) const {
    if (batch_) batch_->save_errors(out.values);
  }
  void load_errors(RankLocalReader& in) {
    if (batch_) batch_->load_errors(in.values(batch_->error_values()));
  }
  std::uint64_t wire_bytes() const noexcept { return wire_bytes_; }

 private:
  Comm* comm_;
  MemoryLedger* ledger_;
  std::optional<compress::OneBitBatch> batch_;  // one reducer per segment; none on one rank
  std::vector<std::span<float>> views_;          // each segment's values, per call
  std::size_t state_bytes_ = 0, buffer_bytes_ = 0;
  std::uint64_t wire_bytes_ = 0;
};

}  // namespace detail

/// 1-bit Adam's momentum exchange over the engine's communicator (optim/onebit_adam.hpp).
template <class Comm>
class OneBitMomentum {
 public:
  static constexpr bool kOneFlatVector = false;
  /// Error buffers for every segment (one per tensor at stage 0) on `comm`'s world (DeepSpeed
  /// allocates them at the first compressed step; here the memory a run needs is there from the
  /// start). One rank: no buffers, no exchange.
  OneBitMomentum(Optimizer<OneBitAdam>& opt, Comm& comm, std::span<const kernels::Segment> segments,
                 MemoryLedger* ledger, LocalGradients* local, const OneBitOptions& options)
      : local_(local), exchange_(comm, segments, ledger) {
    opt.set_freeze_step(options.freeze_step);
    if (exchange_.active()) {
      opt.set_momentum_exchange([this](std::span<const kernels::Segment> segs, float* m) { exchange_.run(segs, m); });
    }
    sync(opt);
  }

  /// The gradient all-reduce of the next step is off in the compressed phase.
  void sync(const Optimizer<OneBitAdam>& opt) noexcept { local_->on = opt.gradients_local(); }
  void reset() { exchange_.reset(); }
  std::uint64_t wire_bytes() const noexcept { return exchange_.wire_bytes(); }
  /// Rank-local: the errors.
  RankLocalSize rank_local_size() const noexcept { return {exchange_.error_values(), 0}; }
  void save_rank_local(RankLocalState& out) const { exchange_.save_errors(out); }
  void load_rank_local(RankLocalReader& in) { exchange_.load_errors(in); }

 private:
  LocalGradients* local_;
  detail::SegmentExchange<Comm> exchange_;
};

/// 0/1 Adam's exchanges over the engine's communicator (optim/zero_one_adam.hpp): the 1-bit
/// all-reduce of the gradient (grad steps) and of the accumulator (syncs), one error pair per
/// segment shared by both (zeroed before the first frozen step), and the accumulator u itself
/// ([partition] fp32 in host memory, optimizer_state in the ledger; needed on one rank too).
template <class Comm>
class ZeroOneExchange {
 public:
  static constexpr bool kOneFlatVector = false;
  ZeroOneExchange(Optimizer<ZeroOneAdam>& opt, Comm& comm, std::span<const kernels::Segment> segments,
                  MemoryLedger* ledger, LocalGradients* local, const OneBitOptions& options)
      : opt_(&opt), local_(local), exchange_(comm, segments, ledger),
        u_(kernels::segments_extent(segments), MemoryCategory::optimizer_state, ledger) {
    opt.set_schedule(options.zero_one);
    opt.set_accumulator(u_.data(), u_.size());
    if (exchange_.active()) {
      opt.set_exchange([this](std::span<const kernels::Segment> segs, float* x) { exchange_.run(segs, x); },
                       [this] { exchange_.reset(); });
    }
    sync(opt);
  }

  /// The gradient all-reduce of the next step runs before var steps only.
  void sync(const Optimizer<ZeroOneAdam>& opt) { local_->on = opt.gradients_local(); }
  /// After a load: the errors start from zero (the optimizer's set_step_count zeroed u and L);
  /// load_rank_local then restores all three when the state has them.
  void reset() { exchange_.reset(); }
  std::uint64_t wire_bytes() const noexcept { return exchange_.wire_bytes(); }
  /// Rank-local: the errors, then u (values); the lr sums L, one per parameter group (scalars). u
  /// and L go together: u holds this rank's local steps since the last sync, L their lr sum.
  RankLocalSize rank_local_size() const noexcept { return {exchange_.error_values() + u_.size(), opt_->lr_sums().size()}; }
  void save_rank_local(RankLocalState& out) const {
    exchange_.save_errors(out);
    out.values.insert(out.values.end(), u_.begin(), u_.end());
    const std::span<const double> sums = opt_->lr_sums();
    out.scalars.insert(out.scalars.end(), sums.begin(), sums.end());
  }
  void load_rank_local(RankLocalReader& in) {
    exchange_.load_errors(in);
    const std::span<const float> u = in.values(u_.size());
    std::copy(u.begin(), u.end(), u_.begin());
    opt_->set_lr_sums(in.scalars(opt_->lr_sums().size()));
  }

 private:
  Optimizer<ZeroOneAdam>* opt_;
  LocalGradients* local_;
  detail::SegmentExchange<Comm> exchange_;
  TrackedBuffer<float> u_;  // zeros
};

/// 1-bit LAMB's exchange over the engine's communicator (optim/onebit_lamb.hpp): the momentum of
/// every segment, laid end to end in segment order in a flat buffer of N values (n rounded up as
/// the all-reduce pads, compress/onebit_allreduce.hpp), goes through one 1-bit all-reduce with one
/// worker and one server error for the whole model. The N - n tail values are not re-zeroed: each
/// call starts from what the last one left there, as DeepSpeed's flat buffer. A load restores the
/// errors and the tail from the state's rank-local part, or zeroes them without one (DeepSpeed
/// rebuilds both on every load). The part also owns the optimizer's fresh variance
/// v_f ([partition] fp32, saved by checkpoints) and its scratch ([2 partition] fp32), needed on one
/// rank too; all in the ledger (optimizer_state; the flat buffer and the all-reduce's scratch under
/// comm_buffers).
template <class Comm>
class OneBitLambExchange {
 public:
  /// The whole model's momentum is one vector: the engine keeps one flat group.
  static constexpr bool kOneFlatVector = true;
  OneBitLambExchange(Optimizer<OneBitLamb>& opt, Comm& comm, std::span<const kernels::Segment> segments,
                     MemoryLedger* ledger, LocalGradients* local, const OneBitOptions& options)
      : comm_(&comm),
        ledger_(ledger),
        local_(local),
        v_fresh_(kernels::segments_extent(segments), MemoryCategory::optimizer_state, ledger),
        scratch_(2 * kernels::segments_extent(segments), MemoryCategory::optimizer_state, ledger) {
    opt.set_freeze_step(options.freeze_step);
    opt.set_lamb_options(options.lamb);
    opt.set_buffers(v_fresh_.data(), scratch_.data(), v_fresh_.size());
    if (comm.size() > 1) {
      std::size_t n = 0;
      for (const kernels::Segment& s : segments) n += s.numel;
      numel_ = n;
      const std::size_t padded = compress::OneBitLayout::make(n, comm.size()).padded;
      reducer_.emplace(padded, comm.size());
      flat_ = TrackedBuffer<float>(padded, MemoryCategory::comm_buffers, ledger);
      state_bytes_ = reducer_->error_bytes();
      buffer_bytes_ = reducer_->scratch_bytes();
      if (ledger_) {
        ledger_->add(MemoryCategory::optimizer_state, state_bytes_);
        ledger_->add(MemoryCategory::comm_buffers, buffer_bytes_);
      }
      opt.set_momentum_exchange([this](std::span<const kernels::Segment> segs, float* m) { run(segs, m); });
    }
    sync(opt);
  }
  OneBitLambExchange(const OneBitLambExchange&) = delete;
  OneBitLambExchange& operator=(const OneBitLambExchange&) = delete;
  ~OneBitLambExchange() {
    if (ledger_) {
      ledger_->sub(MemoryCategory::optimizer_state, state_bytes_);
      ledger_->sub(MemoryCategory::comm_buffers, buffer_bytes_);
    }
  }

  /// The gradient all-reduce of the next step is off in the compression phase.
  void sync(const Optimizer<OneBitLamb>& opt) noexcept { local_->on = opt.gradients_local(); }
  /// After a load: the errors and the flat buffer's tail start from zero.
  void reset() {
    if (reducer_) reducer_->reset();
    std::fill(flat_.begin(), flat_.end(), 0.0f);
  }
  std::uint64_t wire_bytes() const noexcept { return wire_bytes_; }
  /// Rank-local: the errors, then the flat buffer's tail (its head is rewritten by every call).
  RankLocalSize rank_local_size() const noexcept {
    return {reducer_ ? reducer_->error_values() + (flat_.size() - numel_) : 0, 0};
  }
  void save_rank_local(RankLocalState& out) const {
    if (!reducer_) return;
    reducer_->save_errors(out.values);
    out.values.insert(out.values.end(), flat_.begin() + static_cast<std::ptrdiff_t>(numel_), flat_.end());
  }
  void load_rank_local(RankLocalReader& in) {
    if (!reducer_) return;
    reducer_->load_errors(in.values(reducer_->error_values()));
    const std::span<const float> tail = in.values(flat_.size() - numel_);
    std::copy(tail.begin(), tail.end(), flat_.begin() + static_cast<std::ptrdiff_t>(numel_));
  }

 private:
  void run(std::span<const kernels::Segment> segments, float* m) {
    std::size_t at = 0;
    for (const kernels::Segment& s : segments) {
      if (at + s.numel > flat_.size()) {
        throw usage_error("the 1-bit LAMB exchange was built for fewer elements", "optim::OneBitLambExchange",
                          std::to_string(at + s.numel) + " > " + std::to_string(flat_.size()));
      }
      std::copy(m + s.offset, m + s.offset + s.numel, flat_.data() + at);
      at += s.numel;
    }
    const std::uint64_t before = comm_->stats().total_wire_bytes();
    reducer_->run(*comm_, std::span<float>(flat_.data(), flat_.size()));
    wire_bytes_ += comm_->stats().total_wire_bytes() - before;
    at = 0;
    for (const kernels::Segment& s : segments) {
      std::copy(flat_.data() + at, flat_.data() + at + s.numel, m + s.offset);
      at += s.numel;
    }
  }

  Comm* comm_;
  MemoryLedger* ledger_;
  LocalGradients* local_;
  TrackedBuffer<float> v_fresh_;  // zeros
  TrackedBuffer<float> scratch_;
  std::optional<compress::OneBitAllReduce> reducer_;  // none on one rank
  TrackedBuffer<float> flat_;                         // [N]: the momentum, then the tail
  std::size_t numel_ = 0;                             // n: the momentum's values in flat_
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
template <class Comm>
struct OptimizerCommOf<Optimizer<ZeroOneAdam>, Comm> {
  using type = ZeroOneExchange<Comm>;
};
template <class Comm>
struct OptimizerCommOf<Optimizer<OneBitLamb>, Comm> {
  using type = OneBitLambExchange<Comm>;
};

}  // namespace zerotk::optim
