#pragma once
/// \file zerotk/offload/host_pinned.hpp
/// Offload<Cpu>'s state store: the fp32 master copy of this rank's owned elements and the optimizer's
/// moments live in page-locked host memory (core/pinned_host_space.hpp, ledger space pinned_host),
/// and the optimizer runs on the host (optim::Run<Opt, HostSpace>), one sub-group at a time:
///
///   for sub-group i ([i * S, min((i + 1) * S, owned)) of the owned range, S = sub_group_size):
///     gradients of its elements: compute space -> pinned staging buffer   [S] of the gradient type
///     Run<Opt, HostSpace>::step over the pinned master, m, v and staging -> pinned output staging
///     working-precision values: pinned output staging -> compute space    [S] of the parameter type
///
/// The loop and its staging buffers are offload/sub_group_steps.hpp's (shared with Offload<Nvme>);
/// the staging buffers bound the extra memory by sub_group_size, as DeepSpeed's do. On Device<Host>
/// the compute space is host memory too and the stagings are plain copies: they exist so that the
/// data path is the one a device would take (copy in, step, copy out) and so the ledger shows the
/// compute space without master or optimizer state. Copies go through Ops::copy_to_host /
/// copy_from_host (device/), so the store is written once for every compute space; a CUDA copy
/// stream and the overlap of sub-group i+1's copy with i's step are not done yet.
///
/// Adam and AdamW are elementwise, so stepping sub-group by sub-group gives the bits of one fused
/// step. Every sub-group takes the constants of the same step t: the store rewinds the optimizer's
/// step count before each sub-group after the first (Run counts one step per call). LAMB needs the
/// whole partition's per-tensor norms between its two phases; engine/compat.hpp refuses it here.
///
/// The interface is offload/resident.hpp's (see there); FlatGroup::prepare_update calls
/// step(0..n-1) in order, once per optimizer step, and commit_update calls commit_step().
///
/// With a parameter home written through a writer (OffloadParams<Nvme>: `out` is a
/// zero::OutputWriter that writes the shard file), a failed write must leave the step undone while
/// the state is stepped in place: the step then takes offload/writer_passes.hpp's two passes (each
/// sub-group's values are computed from the state without changing it and written; once every
/// group's values are, commit_step() steps the state in place). A writer into memory (a pinned
/// shard on a device, zero::MemoryWriter) cannot fail: the plain loop feeds it.

#include <algorithm>
#include <cstddef>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "zerotk/core/memory.hpp"
#include "zerotk/core/pinned_host_space.hpp"
#include "zerotk/kernels/host/cast.hpp"
#include "zerotk/kernels/tensor_list.hpp"
#include "zerotk/optim/optimizer.hpp"
#include "zerotk/offload/options.hpp"
#include "zerotk/offload/sub_group_steps.hpp"
#include "zerotk/offload/writer_passes.hpp"
#include "zerotk/zero/params/optimizer_out.hpp"

namespace zerotk::offload {

template <class Opt, class Ops>
class HostPinned {
 public:
  using optimizer_type = Opt;
  using space = PinnedHostSpace;  ///< where the optimizer runs
  /// master(), exp_avg(), exp_avg_sq() are the state itself, in host memory (checkpoints read them in place).
  static constexpr bool kStateInHostMemory = true;
  /// step_in_host(): it can step from host copies off the training thread (the delayed update).
  static constexpr bool kCanDelayUpdate = true;
  /// v is kept only for an optimizer with two moments (optim::moments_v).
  static constexpr bool kTwoMoments = optim::moments_v<Opt> >= 2;

  HostPinned(Ops& ops, MemoryLedger* ledger, std::size_t owned_numel, const std::vector<ParamGroup>& groups,
             std::size_t tensor_count, const StoreOptions& options)
      : steps_(ops, ledger, owned_numel, options.sub_group_size),
        master_(owned_numel, MemoryCategory::master32, ledger),
        m_(owned_numel, MemoryCategory::optimizer_state, ledger),
        v_(kTwoMoments ? owned_numel : 0, MemoryCategory::optimizer_state, ledger),
        ops_(&ops),
        opt_(std::make_unique<Opt>(groups)) {
    opt_->set_tensor_count(tensor_count);
  }

  float* master() noexcept { return master_.data(); }
  const float* master() const noexcept { return master_.data(); }
  std::size_t owned_numel() const noexcept { return master_.size(); }
  std::size_t sub_group_numel() const noexcept { return steps_.sub_group_numel(); }
  Opt& optimizer() noexcept { return *opt_; }
  const Opt& optimizer() const noexcept { return *opt_; }
  optim::Moments moments() noexcept { return {m_.data(), v(), m_.size()}; }
  std::span<const float> exp_avg() const noexcept { return {m_.data(), m_.size()}; }
  std::span<const float> exp_avg_sq() const noexcept { return {v_.data(), v_.size()}; }

  /// ceil(owned / sub_group_size), at least 1 (an empty partition still counts the step).
  std::size_t sub_groups() const noexcept { return steps_.count(); }

  /// One fused step over sub-group i (offload/sub_group_steps.hpp) on the pinned state in place.
  /// Segments as for Resident::step. Call with i = 0 .. n-1.
  template <class G, class P, class Reduce>
  void step(std::size_t i, std::span<const kernels::Segment> segments, const G* grads, P* out, float grad_scale,
            Reduce&& reduce) {
    if constexpr (zero::FileWriter<P>) {  // a memory writer takes the plain loop, as memory does
      passes_.prepare(&steps_, *opt_, i, segments, grads, out, grad_scale, master_.data(), m_.data(), v(),
                      "offload::HostPinned::step");
    } else {
      const std::size_t lo = steps_.begin(i);
      steps_.step(*opt_, i, segments, grads, out, grad_scale, std::forward<Reduce>(reduce), master_.data() + lo,
                  m_.data() + lo, v() + lo);
    }
  }

  /// After a step through a writer (pass 1 over every sub-group): pass 2, the state steps in place
  /// with the same constants and gradients (no I/O). A no-op after a step into memory.
  /// `P` is pass 1's output type (the same kernel instantiation); nothing is written to it.
  template <class G, class P, class Reduce>
  void commit_step(std::span<const kernels::Segment> segments, const G* grads, P* /*out*/, float grad_scale,
                   Reduce& reduce) {
    passes_.template commit<P>(steps_, *opt_, segments, grads, grad_scale, reduce, master_.data(), m_.data(), v());
  }
  /// Instead of commit_step() (another group's step failed): the state and the step count never
  /// changed. A step into memory cannot be taken back, and never needs to be: it does no I/O, so no
  /// group of its engine fails.
  template <class P>
  void abort_step(std::span<const kernels::Segment> /*segments*/, P* /*out*/) noexcept {
    passes_.abort();
  }

  /// The same step from gradients in host memory to values in host memory, both indexed like the
  /// master (offload/sub_group_steps.hpp, step_in_host): what the delayed parameter update runs off
  /// the training thread. Touches only the state and `out`, never the compute space.
  template <class G, class V>
  void step_in_host(std::size_t i, std::span<const kernels::Segment> segments, const G* grads, V* out, float grad_scale) {
    const std::size_t lo = steps_.begin(i);
    steps_.step_in_host(*opt_, i, segments, grads, out, grad_scale, master_.data() + lo, m_.data() + lo, v() + lo);
  }

  /// master[at, at + n) := float(src[0, n)), src in the compute space (staged through host memory).
  template <class T>
  void master_from(const T* src, std::size_t at, std::size_t n) {
    std::vector<T> host(n);
    ops_->copy_to_host(src, host.data(), n);
    kernels::host::cast(host.data(), master_.data() + at, n);
  }
  /// dst[0, n) := T(master[at, at + n)), dst in the compute space.
  template <class T>
  void master_into(std::size_t at, T* dst, std::size_t n) {
    std::vector<T> host(n);
    master_into_host(at, host.data(), n);
    ops_->copy_from_host(host.data(), dst, n);
  }
  /// host[0, n) := T(master[at, at + n)), in host memory (a restored state's values for a writer).
  template <class T>
  void master_into_host(std::size_t at, T* host, std::size_t n) {
    kernels::host::cast(master_.data() + at, host, n);
  }
  void master_to_host(float* dst) const { std::copy_n(master_.data(), master_.size(), dst); }
  void master_from_host(const float* src) { std::copy_n(src, master_.size(), master_.data()); }

  OptimizerState optimizer_state() const {
    return {opt_->step_count(), std::vector<float>(m_.begin(), m_.end()), std::vector<float>(v_.begin(), v_.end()), {}, {}};
  }
  void load_optimizer_state(const OptimizerState& s) {
    optim::check_state(s, m_.size(), "Engine::load_state", optim::moments_v<Opt>);
    optim::check_extra(*opt_, s, "Engine::load_state");
    std::copy(s.m.begin(), s.m.end(), m_.begin());
    std::copy(s.v.begin(), s.v.end(), v_.begin());
    opt_->set_step_count(s.step);
  }

 private:
  /// v, or m in its place for a one-moment optimizer (whose kernels never read it).
  float* v() noexcept { return kTwoMoments ? v_.data() : m_.data(); }

  SubGroupSteps<Ops> steps_;              // the sub-group loop and its pinned stagings
  PinnedTrackedBuffer<float> master_;     // [owned_numel] fp32
  PinnedTrackedBuffer<float> m_, v_;      // [owned_numel] fp32 each (v: [0] with one moment)
  WriterPasses passes_;                   // a step through a writer (OffloadParams<Nvme>)
  Ops* ops_;
  std::unique_ptr<Opt> opt_;
};

}  // namespace zerotk::offload
