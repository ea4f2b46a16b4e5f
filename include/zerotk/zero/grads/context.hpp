#pragma once
/// \file zerotk/zero/grads/context.hpp
/// What every gradient path is built from, and the pieces they share: the in-flight queue of bucket
/// reductions and the accumulator over micro-steps.
///
/// A gradient path (one per ZeRO stage and reduction schedule, one file each) owns the gradient
/// storage of one flat group and the reductions over it. Its members:
///   open(k, first_micro_step)   bucket k is touched for the first time in this micro-step: its
///                               storage is ready (zeroed where a new accumulation starts)
///   bucket_grads(k)             where backward writes bucket k's gradients (bound into the Params)
///   ready(k)                    every gradient of bucket k is complete: start its reduction if this
///                               schedule reduces now
///   end_micro_step(boundary)    reduce what is left (at the boundary for at_boundary schedules), wait
///   owned()                     the gradients the norm and the optimizer read, owned-shaped
///   clear_accumulated()         after an update (or a skipped one)

#include <cstddef>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/compress/gradient_options.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/device/ordered.hpp"
#include "zerotk/optim/local_gradients.hpp"
#include "zerotk/zero/collectives.hpp"
#include "zerotk/zero/layout.hpp"

namespace zerotk::zero {

/// The 1-bit optimizers' switch of stage 0's gradient all-reduce (optim/local_gradients.hpp).
using LocalGradients = optim::LocalGradients;

/// Construction arguments of a gradient or parameter path.
template <class Ops>
struct PathContext {
  const BucketLayout* layout = nullptr;
  Ops* ops = nullptr;
  device::OrderedCommunicator<Ops>* comm = nullptr;
  /// Stage 3 with hpZ: the communicator of this rank's group of `zero_hpz_partition_size` ranks,
  /// over which the parameter path keeps its secondary shard (zero/params/secondary_shard.hpp).
  /// Null: no secondary shard.
  device::OrderedCommunicator<Ops>* group_comm = nullptr;
  MemoryLedger* ledger = nullptr;
  /// Stage 0 with a 1-bit optimizer: the switch of the gradient all-reduce; null: always reduce.
  LocalGradients* local_gradients = nullptr;
  /// GradientCompression's topk_ratio and huffman_coding (zero/grads/compressed_all_reduce.hpp);
  /// null: the defaults.
  const compress::GradientCompressionOptions* compression = nullptr;
  /// How a bucket's gradients are reduce-scattered (stages 2, 3): the communicator's own, or qgZ's
  /// (Stage3Options::quantized_gradients; zero/collectives.hpp).
  GradientReduceScatter<device::OrderedCommunicator<Ops>> reduce_scatter;
  /// How stage 3 gathers a bucket from the primary shards: the communicator's own, or qwZ's
  /// (Stage3Options::quantized_weights; zero/collectives.hpp).
  WeightGather weight_gather;
  int gradient_accumulation_steps = 1;
  bool overlap_comm = true;
  int bucket_buffers = 2;
  /// Add micro-steps' reduced gradients in fp32 (true) or in the working precision (false).
  bool accumulate_fp32 = true;

  int rank() const { return comm->rank(); }
  int world() const { return comm->size(); }

  static_assert(GradientReduceScatterStrategy<GradientReduceScatter<device::OrderedCommunicator<Ops>>,
                                              device::OrderedCommunicator<Ops>>);
  static_assert(WeightGatherStrategy<WeightGather, device::OrderedCommunicator<Ops>>);
};

/// The gradients the norm and the optimizer read: this rank's owned elements, either owned-shaped
/// (indexed like the fp32 master: a stage-1/2 partition, or stage 0's flat buffer) or in the flat
/// buffer (a stage-1 rank's blocks, in place). Exactly one pointer is set.
template <class T>
struct OwnedGrads {
  const T* working = nullptr;
  const float* fp32 = nullptr;
  bool owned_shaped = true;

  template <class F>
  decltype(auto) visit(F&& f) const {
    if (fp32 != nullptr) return f(fp32);
    return f(working);
  }
};

/// Bucket reductions in flight, oldest first.
class InFlight {
 public:
  void push(std::size_t k, comm::Work w) { q_.emplace_back(k, std::move(w)); }
  bool empty() const noexcept { return q_.empty(); }
  /// Waits for the oldest and returns its bucket.
  std::size_t pop_wait() {
    auto [k, w] = std::move(q_.front());
    q_.pop_front();
    w.wait();
    return k;
  }
  /// Waits for everything without throwing (destruction, error paths).
  void drain_quietly() noexcept {
    for (auto& [k, w] : q_) {
      try {
        w.wait();
      } catch (...) {
      }
    }
    q_.clear();
  }

 private:
  std::deque<std::pair<std::size_t, comm::Work>> q_;
};

/// Sum over micro-steps of reduced gradients, owned-shaped, in fp32 or in the working precision T:
/// acc = A(float(acc) + float(reduced)) (kernels/host/accumulate.hpp). Exists only when the
/// schedule reduces every micro-step and gradient_accumulation_steps > 1.
template <class T, class Ops>
class Accumulator {
 public:
  Accumulator() = default;
  Accumulator(const PathContext<Ops>& c, std::size_t owned_numel) : ops_(c.ops) {
    if (c.gradient_accumulation_steps <= 1) return;
    if (c.accumulate_fp32) {
      fp32_ = c.ops->template allocate<float>(owned_numel, MemoryCategory::grads, c.ledger);
    } else {
      working_ = c.ops->template allocate<T>(owned_numel, MemoryCategory::grads, c.ledger);
    }
  }
  bool active() const noexcept { return fp32_.size() + working_.size() > 0; }
  void add(std::size_t offset, const T* reduced, std::size_t n) {
    if (fp32_.size()) ops_->accumulate(fp32_.data() + offset, reduced, n);
    if (working_.size()) ops_->accumulate(working_.data() + offset, reduced, n);
  }
  OwnedGrads<T> owned() const {
    return fp32_.size() ? OwnedGrads<T>{nullptr, fp32_.data(), true} : OwnedGrads<T>{working_.data(), nullptr, true};
  }
  void clear() {
    if (fp32_.size()) ops_->zero(fp32_.data(), fp32_.size());
    if (working_.size()) ops_->zero(working_.data(), working_.size());
  }

 private:
  Ops* ops_ = nullptr;
  typename Ops::template Buffer<float> fp32_;
  typename Ops::template Buffer<T> working_;
};

/// The whole flat gradient buffer of stages 0 and 1: backward writes each bucket in place; a bucket
/// is zeroed when first touched in a micro-step that starts a new accumulation (every micro-step
/// when the schedule reduces every micro-step).
template <class T, class Ops, bool kEveryMicroStep>
class FlatGradBuffer {
 public:
  using value_type = T;

  explicit FlatGradBuffer(const PathContext<Ops>& c)
      : layout_(c.layout), ops_(c.ops),
        grads_(c.ops->template allocate<T>(c.layout->flat_numel(), MemoryCategory::grads, c.ledger)) {}

  void open(std::size_t k, bool first_micro_step) {
    if (kEveryMicroStep || first_micro_step) ops_->zero(bucket(k), layout_->buckets()[k].numel);
  }
  T* bucket(std::size_t k) { return grads_.data() + layout_->buckets()[k].flat_offset; }
  T* at(std::size_t flat_offset) { return grads_.data() + flat_offset; }
  const T* data() const { return grads_.data(); }

 private:
  const BucketLayout* layout_;
  Ops* ops_;
  typename Ops::template Buffer<T> grads_;  // [flat_numel] working precision
};

}  // namespace zerotk::zero
