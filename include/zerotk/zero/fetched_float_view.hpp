#pragma once
/// \file zerotk/zero/fetched_float_view.hpp
/// Emulated 16-bit training at ZeRO stage 3: float Params over fp16/bf16 storage, with float compute
/// copies only of what is gathered. FloatView (float_view.hpp) keeps float copies of the whole flat
/// parameter and gradient buffers, which stage 3 exists to avoid; this view keeps, per bucket,
///
///   bucket k becomes resident (gathered)    its 16-bit values are cast into a float buffer; the
///                                           bucket's Params point there
///   bucket k is evicted                     the buffer goes back to the pool (Params: null)
///   a parameter's first backward scope      its bucket takes a float gradient buffer (if it has none)
///   in a micro-step                         and the parameter's slot in it is zeroed
///   its backward scope closes               float gradient folded into the 16-bit bucket gradient
///                                           (slot = T(float(slot) + g): rounded per add, as FloatView);
///                                           the bucket's last open parameter gives the buffer back
///   the trainer wrote through the Params    rounded to 16 bits into the gathered values, and the
///   (a gather scope that keeps writes)      float copy follows
///
/// Buffers come from one pool of float buffers sized for the largest bucket, created on first need
/// and reused for the life of the engine (no allocation in steady state); persistent buckets (never
/// evicted) have exact-sized value buffers of their own. The ledger shows all of them under
/// MemoryCategory::other (the float compute copy, as FloatView's). Bound: pool buffers <= (buckets
/// resident at once) + (buckets with an open backward at once), so with G gathered pool buffers and
/// no external parameters, float bytes <= 2 x G x 4 x largest bucket (+ 4 x persistent elements).

#include <algorithm>
#include <cstddef>
#include <vector>

#include "zerotk/core/memory.hpp"
#include "zerotk/zero/layout.hpp"

namespace zerotk::zero {

template <class T, class Ops>
class FetchedFloatView {
 public:
  /// `persistent[k]`: bucket k stays gathered for the life of the engine (its own value buffer).
  FetchedFloatView(Ops& ops, MemoryLedger* ledger, const BucketLayout& layout, std::vector<char> persistent)
      : ops_(&ops), ledger_(ledger), layout_(&layout), persistent_(std::move(persistent)),
        state_(layout.buckets().size()) {
    for (const Bucket& b : layout.buckets()) slot_numel_ = std::max(slot_numel_, b.numel);
    persistent_.resize(state_.size(), 0);
  }

  /// Bucket k's 16-bit values are gathered at `values16`: returns its float copy.
  float* resident(std::size_t k, const T* values16) {
    State& s = state_[k];
    if (s.values < 0) {
      if (persistent_[k]) {
        s.values = static_cast<int>(own_.size());
        own_.push_back(ops_->template allocate<float>(layout_->buckets()[k].numel, MemoryCategory::other, ledger_));
      } else {
        s.values = take();
      }
    }
    refresh(k, values16);
    return values(k);
  }

  /// Bucket k left the gathered pool: its float copy goes back to the pool.
  void evicted(std::size_t k) {
    State& s = state_[k];
    if (s.values < 0 || persistent_[k]) return;
    give(s.values);
    s.values = -1;
  }

  /// Bucket k's float copy, or null when it is not resident.
  float* values(std::size_t k) noexcept {
    const State& s = state_[k];
    if (s.values < 0) return nullptr;
    return (persistent_[k] ? own_ : pool_)[static_cast<std::size_t>(s.values)].data();
  }

  /// Bucket k's 16-bit values changed (publication, broadcast): the float copy follows.
  void refresh(std::size_t k, const T* values16) {
    if (float* f = values(k)) ops_->cast(values16, f, layout_->buckets()[k].numel);
  }

  /// What the trainer wrote into bucket k's float copy becomes its 16-bit values, and the copy is
  /// rounded (a no-op for values that came from 16 bits).
  void take_user_values(std::size_t k, T* values16) {
    if (float* f = values(k)) {
      const std::size_t n = layout_->buckets()[k].numel;
      ops_->cast(f, values16, n);
      ops_->cast(values16, f, n);
    }
  }

  /// `host` [n] float values (host memory) rounded into `out` [n] 16-bit (engine memory), through a
  /// pool buffer borrowed for the copy.
  void store_from_host(const float* host, T* out, std::size_t n) {
    const int i = take();
    float* f = pool_[static_cast<std::size_t>(i)].data();
    ops_->copy_from_host(host, f, n);
    ops_->cast(f, out, n);
    give(i);
  }

  /// A parameter's first backward scope in this micro-step: returns its bucket's float gradient
  /// buffer (bucket-relative, like the values), with the parameter's slot zeroed.
  float* open_param(const ParamSlot& p) {
    State& s = state_[p.bucket];
    if (s.grads < 0) s.grads = take();
    ++s.open_params;
    float* g = pool_[static_cast<std::size_t>(s.grads)].data();
    ops_->zero(g + offset(p), p.numel);
    return g;
  }
  /// The bucket's float gradient buffer while some parameter of it is open, else null.
  float* grads(std::size_t k) noexcept {
    const State& s = state_[k];
    return s.grads < 0 ? nullptr : pool_[static_cast<std::size_t>(s.grads)].data();
  }

  /// Folds the parameter's float gradient into its 16-bit slot of bucket storage `bucket_grads`;
  /// the bucket's last open parameter returns the float buffer.
  void fold_param(const ParamSlot& p, T* bucket_grads) {
    State& s = state_[p.bucket];
    ops_->accumulate(bucket_grads + offset(p), grads(p.bucket) + offset(p), p.numel);
    if (--s.open_params == 0) {
      give(s.grads);
      s.grads = -1;
    }
  }

  /// End of a micro-step: gradient buffers of parameters never folded (an aborted micro-step) go back.
  void end_micro_step() {
    for (State& s : state_) {
      if (s.grads >= 0) give(s.grads);
      s.grads = -1;
      s.open_params = 0;
    }
  }

 private:
  struct State {
    int values = -1;  ///< pool (or own_, if persistent) index of the float values; -1: not resident
    int grads = -1;   ///< pool index of the float gradients; -1: none open
    std::size_t open_params = 0;  ///< parameters opened in this micro-step, not yet folded
  };

  std::size_t offset(const ParamSlot& p) const noexcept {
    return p.flat_offset - layout_->buckets()[p.bucket].flat_offset;
  }

  int take() {
    if (free_.empty()) {
      pool_.push_back(ops_->template allocate<float>(slot_numel_, MemoryCategory::other, ledger_));
      free_.push_back(static_cast<int>(pool_.size() - 1));
    }
    const int i = free_.back();
    free_.pop_back();
    return i;
  }
  void give(int i) { free_.push_back(i); }

  Ops* ops_;
  MemoryLedger* ledger_;
  const BucketLayout* layout_;
  std::vector<char> persistent_;                          // [bucket]
  std::vector<State> state_;                              // [bucket]
  std::vector<typename Ops::template Buffer<float>> pool_;  // [pool buffers][slot_numel_] float
  std::vector<typename Ops::template Buffer<float>> own_;   // [persistent buckets resident][bucket numel]
  std::vector<int> free_;
  std::size_t slot_numel_ = 1;
};

}  // namespace zerotk::zero
