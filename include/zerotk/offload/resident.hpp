#pragma once
/// \file zerotk/offload/resident.hpp
/// Offload<None>'s state store: the fp32 master copy of this rank's owned elements and the
/// optimizer's state live in the compute space (host memory for Device<Host>, GPU memory for
/// Device<Cuda>), and the optimizer steps them in one sub-group.
///
/// A state store holds what the optimizer updates and nothing the gradient or parameter paths use:
///   master()                        [owned_numel] fp32
///   optimizer()                     the optimizer (math, groups, step count) and its moments
///   sub_groups(), sub_group(i)      pieces of the owned range stepped one at a time (the offload
///                                   stores bound the working set with them)
///   step(i, ...)                    one fused optimizer step over sub-group i

#include <cstddef>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "zerotk/core/memory.hpp"
#include "zerotk/kernels/tensor_list.hpp"
#include "zerotk/optim/optimizer.hpp"

namespace zerotk::offload {

template <class Opt, class Ops>
class Resident {
 public:
  using optimizer_type = typename Ops::template optimizer_type<Opt>;

  Resident(Ops& ops, MemoryLedger* ledger, std::size_t owned_numel, const std::vector<ParamGroup>& groups,
           std::size_t tensor_count)
      : ops_(&ops),
        master_(ops.template allocate<float>(owned_numel, MemoryCategory::master32, ledger)),
        opt_(std::make_unique<optimizer_type>(groups)) {
    ops.init_optimizer(*opt_, owned_numel, ledger);
    opt_->set_tensor_count(tensor_count);  // LAMB: equal-length per-tensor sums on every rank
  }

  float* master() noexcept { return master_.data(); }
  const float* master() const noexcept { return master_.data(); }
  std::size_t owned_numel() const noexcept { return master_.size(); }
  optimizer_type& optimizer() noexcept { return *opt_; }
  const optimizer_type& optimizer() const noexcept { return *opt_; }

  std::size_t sub_groups() const noexcept { return 1; }

  /// One fused step over sub-group i (the whole owned range): reads `grads` at each segment's
  /// grad_at(), writes 16-bit values to `out` at out_at(); `reduce(double*, n)` sums LAMB's
  /// per-tensor partials over ranks.
  template <class G, class P, class Reduce>
  void step(std::size_t /*i*/, std::span<const kernels::Segment> segments, const G* grads, P* out, float grad_scale,
            Reduce&& reduce) {
    ops_->step(*opt_, segments, master_.data(), grads, out, grad_scale, std::forward<Reduce>(reduce));
  }

 private:
  Ops* ops_;
  typename Ops::template Buffer<float> master_;  // [owned_numel] fp32
  std::unique_ptr<optimizer_type> opt_;
};

}  // namespace zerotk::offload
