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
///   master_into_host(at, host, n)   host := T(master[at, at+n)) in host memory (a writer's values)
///   master_to_host(dst), master_from_host(src)         the whole master, through host memory
///
/// The other stores (offload/host_pinned.hpp) keep the same interface; offload/store.hpp picks one
/// by the Offload policy's tag.
///
/// With a parameter home written through a writer (OffloadParams<Nvme>, StoreOptions::output_writer)
/// the store steps sub-group by sub-group (`sub_group_size`, offload/sub_group_steps.hpp) in the
/// two passes of offload/writer_passes.hpp, so that a failed shard write leaves the state as it
/// was: each sub-group's values are computed from the state without changing it and written;
/// commit_step() then steps the state in place. That needs the state in host memory (Device<Host>)
/// and an elementwise optimizer (Adam, AdamW): engine/compat.hpp says so. Extra memory, pinned
/// host: the gradient and output stagings of one sub-group (4 B each per element, `grads` and
/// `params16`).

#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "zerotk/core/error.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/kernels/tensor_list.hpp"
#include "zerotk/offload/options.hpp"
#include "zerotk/offload/sub_group_steps.hpp"
#include "zerotk/offload/writer_passes.hpp"
#include "zerotk/optim/optimizer.hpp"
#include "zerotk/zero/params/optimizer_out.hpp"

namespace zerotk::offload {

template <class Opt, class Ops>
class Resident {
 public:
  using optimizer_type = Opt;
  using space = typename Ops::Space;
  /// master(), exp_avg(), exp_avg_sq() are the state itself (in the compute space).
  static constexpr bool kStateInHostMemory = Ops::Space::host_accessible;
  /// The state lives in the compute space, which the trainer's next forward uses: no delayed update.
  static constexpr bool kCanDelayUpdate = false;
  /// v is kept only for an optimizer with two moments (optim::moments_v).
  static constexpr bool kTwoMoments = optim::moments_v<Opt> >= 2;

  Resident(Ops& ops, MemoryLedger* ledger, std::size_t owned_numel, const std::vector<ParamGroup>& groups,
           std::size_t tensor_count, const StoreOptions& options = {})
      : ops_(&ops),
        master_(ops.template allocate<float>(owned_numel, MemoryCategory::master32, ledger)),
        m_(ops.template allocate<float>(owned_numel, MemoryCategory::optimizer_state, ledger)),
        v_(ops.template allocate<float>(kTwoMoments ? owned_numel : 0, MemoryCategory::optimizer_state, ledger)),
        opt_(std::make_unique<Opt>(groups)) {
    if (options.output_writer) {
      if (!kStateInHostMemory) {
        throw usage_error("a step through a writer (OffloadParams<Nvme>) needs the state in host memory (Device<Host>)",
                          "offload::Resident");
      }
      steps_.emplace(ops, ledger, owned_numel, options.sub_group_size);
    }
    opt_->set_tensor_count(tensor_count);  // LAMB: equal-length per-tensor sums on every rank
  }

  float* master() noexcept { return master_.data(); }
  const float* master() const noexcept { return master_.data(); }
  std::size_t owned_numel() const noexcept { return master_.size(); }
  Opt& optimizer() noexcept { return *opt_; }
  const Opt& optimizer() const noexcept { return *opt_; }
  optim::Moments moments() noexcept { return {m_.data(), v(), m_.size()}; }
  /// The moments read-only, in the compute space.
  std::span<const float> exp_avg() const noexcept { return {m_.data(), m_.size()}; }
  std::span<const float> exp_avg_sq() const noexcept { return {v_.data(), v_.size()}; }

  /// 1 (the whole owned range), or ceil(owned / sub_group_size) when built for a writer.
  std::size_t sub_groups() const noexcept { return steps_ ? steps_->count() : 1; }

  template <class T>
  void master_from(const T* src, std::size_t at, std::size_t n) {
    ops_->cast(src, master_.data() + at, n);
  }
  template <class T>
  void master_into(std::size_t at, T* dst, std::size_t n) {
    ops_->cast(master_.data() + at, dst, n);
  }
  /// host[0, n) := T(master[at, at + n)), in host memory (a restored state's values for a writer:
  /// only a host compute space gives this store one; engine/compat.hpp refuses the rest).
  template <class T>
  void master_into_host(std::size_t at, T* host, std::size_t n) {
    static_assert(kStateInHostMemory, "offload::Resident: a writer's values come from a host state (Device<Host>)");
    ops_->cast(master_.data() + at, host, n);
  }
  void master_to_host(float* dst) const { ops_->copy_to_host(master_.data(), dst, master_.size()); }
  void master_from_host(const float* src) { ops_->copy_from_host(src, master_.data(), master_.size()); }

  /// One fused step over sub-group i (the whole owned range, or one sub-group when built for a
  /// writer): reads `grads` at each segment's grad_at(), writes 16-bit values to `out` at out_at()
  /// (through a writer: pass 1 of offload/writer_passes.hpp, the state untouched);
  /// `reduce(double*, n)` sums LAMB's per-tensor partials over ranks.
  template <class G, class P, class Reduce>
  void step(std::size_t i, std::span<const kernels::Segment> segments, const G* grads, P* out, float grad_scale,
            Reduce&& reduce) {
    static_assert(!zero::MemoryWriter<P>, "offload::Resident: a parameter shard in host memory on a device "
                                          "(OffloadParams<Cpu> with Device<Cuda>) is written by a step on the host: "
                                          "use Offload<Cpu> or Offload<Nvme> (engine/compat.hpp)");
    if constexpr (zero::FileWriter<P>) {
      static_assert(kStateInHostMemory, "offload::Resident: a step through a writer (OffloadParams<Nvme>) needs "
                                        "the state in host memory (Device<Host>)");
      passes_.prepare(steps_ ? &*steps_ : nullptr, *opt_, i, segments, grads, out, grad_scale, master_.data(),
                      m_.data(), v(), "offload::Resident::step");
    } else if (steps_) {  // built for a writer, given memory: the same sub-group loop
      if constexpr (kStateInHostMemory) {
        const std::size_t lo = steps_->begin(i);
        steps_->step(*opt_, i, segments, grads, out, grad_scale, std::forward<Reduce>(reduce), master_.data() + lo,
                     m_.data() + lo, v() + lo);
      }
    } else {
      ops_->step(*opt_, segments, master_.data(), moments(), grads, out, grad_scale, std::forward<Reduce>(reduce));
    }
  }
  /// After a step through a writer: pass 2, the state steps in place (no I/O). Otherwise a no-op.
  template <class G, class P, class Reduce>
  void commit_step(std::span<const kernels::Segment> segments, const G* grads, P* /*out*/, float grad_scale,
                   Reduce& reduce) {
    if constexpr (kStateInHostMemory) {
      if (steps_) {
        passes_.template commit<P>(*steps_, *opt_, segments, grads, grad_scale, reduce, master_.data(), m_.data(), v());
      }
    }
  }
  /// Instead of commit_step() (another group's step failed): the state and the step count never
  /// changed. A step into memory does no I/O, so its group never fails and never needs taking back.
  template <class P>
  void abort_step(std::span<const kernels::Segment> /*segments*/, P* /*out*/) noexcept {
    passes_.abort();
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
    optim::check_state(s, m_.size(), "Engine::load_state", optim::moments_v<Opt>);
    optim::check_extra(*opt_, s, "Engine::load_state");
    ops_->copy_from_host(s.m.data(), m_.data(), s.m.size());
    ops_->copy_from_host(s.v.data(), v_.data(), s.v.size());
    optim::load_extra(*opt_, s);
    opt_->set_step_count(s.step);
  }

 private:
  /// v, or m in its place for a one-moment optimizer (whose kernels never read it).
  float* v() noexcept { return kTwoMoments ? v_.data() : m_.data(); }

  Ops* ops_;
  typename Ops::template Buffer<float> master_;  // [owned_numel] fp32
  typename Ops::template Buffer<float> m_, v_;   // the optimizer's moments, [owned_numel] fp32 each (v: [0] with one)
  std::optional<SubGroupSteps<Ops>> steps_;      // built for a writer: the sub-group loop, its stagings
  WriterPasses passes_;                          // the two passes through a writer
  std::unique_ptr<Opt> opt_;
};

}  // namespace zerotk::offload
