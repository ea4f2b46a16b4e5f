#pragma once
/// \file zerotk/offload/resident.hpp
/// Offload<None>'s state store: the fp32 master copy of this rank's owned elements and the
/// optimizer's state live in the compute space (host memory for Device<Host>, GPU memory for
/// Device<Cuda>), and the optimizer steps them in one sub-group.
///
/// A state store holds what the optimizer updates and nothing the gradient or parameter paths use:
///   master()                        [owned_numel] fp32
///   optimizer()                     the optimizer: math, groups, step count (no buffers)
///   moments()                       its state, m and v [owned_numel] fp32 each, in the compute space
///   sub_groups(), sub_group(i)      pieces of the owned range stepped one at a time (the offload
///                                   stores bound the working set with them)
///   step(i, ...)                    one fused optimizer step over sub-group i (optim::Run<Opt, Space>)
///   optimizer_state(), load_optimizer_state(s)   the exact state, copied through host memory
///   master_from(src, at, n), master_into(at, dst, n)   master[at, at+n) := float(src) / dst := T(master),
///                                   src and dst in the compute space (the owned parameters)
///   master_to_host(dst), master_from_host(src)         the whole master, through host memory
///
/// The other stores (offload/host_pinned.hpp) keep the same interface; offload/store.hpp picks one
/// by the Offload policy's tag.

#include <cstddef>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "zerotk/core/memory.hpp"
#include "zerotk/kernels/tensor_list.hpp"
#include "zerotk/offload/options.hpp"
#include "zerotk/optim/optimizer.hpp"

namespace zerotk::offload {

template <class Opt, class Ops>
class Resident {
 public:
  using optimizer_type = Opt;
  using space = typename Ops::Space;
  /// master(), exp_avg(), exp_avg_sq() are the state itself (in the compute space).
  static constexpr bool kStateInHostMemory = Ops::Space::host_accessible;

  Resident(Ops& ops, MemoryLedger* ledger, std::size_t owned_numel, const std::vector<ParamGroup>& groups,
           std::size_t tensor_count, const StoreOptions& /*one sub-group here*/ = {})
      : ops_(&ops),
        master_(ops.template allocate<float>(owned_numel, MemoryCategory::master32, ledger)),
        m_(ops.template allocate<float>(owned_numel, MemoryCategory::optimizer_state, ledger)),
        v_(ops.template allocate<float>(owned_numel, MemoryCategory::optimizer_state, ledger)),
        opt_(std::make_unique<Opt>(groups)) {
    opt_->set_tensor_count(tensor_count);  // LAMB: equal-length per-tensor sums on every rank
  }

  float* master() noexcept { return master_.data(); }
  const float* master() const noexcept { return master_.data(); }
  std::size_t owned_numel() const noexcept { return master_.size(); }
  Opt& optimizer() noexcept { return *opt_; }
  const Opt& optimizer() const noexcept { return *opt_; }
  optim::Moments moments() noexcept { return {m_.data(), v_.data(), m_.size()}; }
  /// The moments read-only, in the compute space.
  std::span<const float> exp_avg() const noexcept { return {m_.data(), m_.size()}; }
  std::span<const float> exp_avg_sq() const noexcept { return {v_.data(), v_.size()}; }

  std::size_t sub_groups() const noexcept { return 1; }

  template <class T>
  void master_from(const T* src, std::size_t at, std::size_t n) {
    ops_->cast(src, master_.data() + at, n);
  }
  template <class T>
  void master_into(std::size_t at, T* dst, std::size_t n) {
    ops_->cast(master_.data() + at, dst, n);
  }
  void master_to_host(float* dst) const { ops_->copy_to_host(master_.data(), dst, master_.size()); }
  void master_from_host(const float* src) { ops_->copy_from_host(src, master_.data(), master_.size()); }

  /// One fused step over sub-group i (the whole owned range): reads `grads` at each segment's
  /// grad_at(), writes 16-bit values to `out` at out_at(); `reduce(double*, n)` sums LAMB's
  /// per-tensor partials over ranks.
  template <class G, class P, class Reduce>
  void step(std::size_t /*i*/, std::span<const kernels::Segment> segments, const G* grads, P* out, float grad_scale,
            Reduce&& reduce) {
    ops_->step(*opt_, segments, master_.data(), moments(), grads, out, grad_scale, std::forward<Reduce>(reduce));
  }

  /// The optimizer's exact state (step count, m, v), copied to host memory.
  OptimizerState optimizer_state() const {
    OptimizerState s{opt_->step_count(), std::vector<float>(m_.size()), std::vector<float>(v_.size()), {}, {}};
    ops_->copy_to_host(m_.data(), s.m.data(), s.m.size());
    ops_->copy_to_host(v_.data(), s.v.data(), s.v.size());
    optim::save_extra(*opt_, s);  // 1-bit LAMB's v_f (host memory: Device<Host> only) and scalars
    return s;
  }
  /// Restores a state taken from a store over the same owned range (bit-exact); nothing changes
  /// when `s` does not fit.
  void load_optimizer_state(const OptimizerState& s) {
    optim::check_state(s, m_.size(), "Engine::load_state");
    optim::check_extra(*opt_, s, "Engine::load_state");
    ops_->copy_from_host(s.m.data(), m_.data(), s.m.size());
    ops_->copy_from_host(s.v.data(), v_.data(), s.v.size());
    optim::load_extra(*opt_, s);
    opt_->set_step_count(s.step);
  }

 private:
  Ops* ops_;
  typename Ops::template Buffer<float> master_;  // [owned_numel] fp32
  typename Ops::template Buffer<float> m_, v_;   // the optimizer's moments, [owned_numel] fp32 each
  std::unique_ptr<Opt> opt_;
};

}  // namespace zerotk::offload
