#pragma once
/// \file zerotk/zero/float_view.hpp
/// Emulated 16-bit training: the model's Params hold float while the engine stores fp16/bf16 (a host
/// trainer without 16-bit arithmetic). FloatView keeps float compute copies of the main group's flat
/// parameter and gradient buffers, binds the Params to them, and moves values across the boundary:
///
///   a parameter's first backward scope in a micro-step   its float gradient is zeroed
///   its backward scope closes                             float gradient folded into the 16-bit bucket
///                                                         (slot = T(float(slot) + g): rounded per add)
///   a bucket's 16-bit values change (update, gather)      refreshed into the float copy
///   the trainer wrote initial values through the Params   rounded to 16 bits, and the copy follows
///
/// So the model computes with exactly the values a 16-bit model would hold, and the optimizer sees
/// exactly the gradients a 16-bit backward would have written.

#include <cstddef>

#include "zerotk/core/memory.hpp"
#include "zerotk/zero/layout.hpp"

namespace zerotk::zero {

template <class T, class Ops>
class FloatView {
 public:
  FloatView(Ops& ops, MemoryLedger* ledger, std::size_t flat_numel)
      : ops_(&ops),
        params_(ops.template allocate<float>(flat_numel, MemoryCategory::other, ledger)),
        grads_(ops.template allocate<float>(flat_numel, MemoryCategory::other, ledger)) {}

  float* params() { return params_.data(); }
  float* grads() { return grads_.data(); }

  void open_param(const ParamSlot& s) { ops_->zero(grads_.data() + s.flat_offset, s.numel); }

  /// Folds the parameter's float gradient into its 16-bit slot in bucket storage `bucket_grads`
  /// (which starts at flat offset `bucket_flat_offset`).
  void fold_param(const ParamSlot& s, T* bucket_grads, std::size_t bucket_flat_offset) {
    ops_->accumulate(bucket_grads + (s.flat_offset - bucket_flat_offset), grads_.data() + s.flat_offset, s.numel);
  }

  /// The 16-bit values [offset, offset + n) changed: the float copy follows.
  void refresh(const T* params16, std::size_t offset, std::size_t n) {
    ops_->cast(params16 + offset, params_.data() + offset, n);
  }

  /// What the trainer wrote into the float copy becomes the 16-bit values, and the copy is rounded.
  void take_user_values(T* params16, std::size_t n) {
    ops_->cast(params_.data(), params16, n);
    ops_->cast(params16, params_.data(), n);
  }

 private:
  Ops* ops_;
  typename Ops::template Buffer<float> params_, grads_;  // [flat_numel] float
};

}  // namespace zerotk::zero
