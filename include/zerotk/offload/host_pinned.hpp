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
/// The staging buffers bound the extra memory by sub_group_size, as DeepSpeed's do. On Device<Host>
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
/// The interface is offload/resident.hpp's (see there); FlatGroup::update calls step(0..n-1) in
/// order, once per optimizer step.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "zerotk/core/error.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/core/pinned_host_space.hpp"
#include "zerotk/kernels/host/cast.hpp"
#include "zerotk/kernels/tensor_list.hpp"
#include "zerotk/optim/optimizer.hpp"
#include "zerotk/optim/run.hpp"

namespace zerotk::offload {

template <class Opt, class Ops>
class HostPinned {
 public:
  using optimizer_type = Opt;
  using space = PinnedHostSpace;  ///< where the optimizer runs
  /// The largest gradient or parameter element a staging buffer holds (fp32).
  static constexpr std::size_t kStagingElementBytes = sizeof(float);

  HostPinned(Ops& ops, MemoryLedger* ledger, std::size_t owned_numel, const std::vector<ParamGroup>& groups,
             std::size_t tensor_count, std::size_t sub_group_size)
      : ops_(&ops),
        sub_group_numel_(checked_sub_group(sub_group_size)),
        master_(owned_numel, MemoryCategory::master32, ledger),
        m_(owned_numel, MemoryCategory::optimizer_state, ledger),
        v_(owned_numel, MemoryCategory::optimizer_state, ledger),
        grads_staging_(staging_bytes(owned_numel), MemoryCategory::grads, ledger),
        out_staging_(staging_bytes(owned_numel), MemoryCategory::params16, ledger),
        opt_(std::make_unique<Opt>(groups)) {
    opt_->set_tensor_count(tensor_count);
  }

  float* master() noexcept { return master_.data(); }
  const float* master() const noexcept { return master_.data(); }
  std::size_t owned_numel() const noexcept { return master_.size(); }
  std::size_t sub_group_numel() const noexcept { return sub_group_numel_; }
  Opt& optimizer() noexcept { return *opt_; }
  const Opt& optimizer() const noexcept { return *opt_; }
  optim::Moments moments() noexcept { return {m_.data(), v_.data(), m_.size()}; }
  std::span<const float> exp_avg() const noexcept { return {m_.data(), m_.size()}; }
  std::span<const float> exp_avg_sq() const noexcept { return {v_.data(), v_.size()}; }

  /// ceil(owned / sub_group_size), at least 1 (an empty partition still counts the step).
  std::size_t sub_groups() const noexcept {
    return std::max<std::size_t>(1, (owned_numel() + sub_group_numel_ - 1) / sub_group_numel_);
  }

  /// One fused step over sub-group i: stage its gradients, step on the host, write the
  /// working-precision values back. Segments as for Resident::step (offsets in the owned range;
  /// gradients at grad_at(), output at out_at() in the compute space). Call with i = 0 .. n-1.
  template <class G, class P, class Reduce>
  void step(std::size_t i, std::span<const kernels::Segment> segments, const G* grads, P* out, float grad_scale,
            Reduce&& reduce) {
    static_assert(sizeof(G) <= kStagingElementBytes && sizeof(P) <= kStagingElementBytes,
                  "HostPinned: staging buffers hold elements of at most 4 bytes");
    if (i == 0) {
      step_before_ = opt_->step_count();
    } else {
      opt_->set_step_count(step_before_);  // every sub-group takes step t's constants
    }
    const std::size_t lo = i * sub_group_numel_, hi = std::min(owned_numel(), lo + sub_group_numel_);
    const Plan& plan = plan_for(segments);
    const std::span<const Piece> pieces(plan.pieces.data() + plan.first[i], plan.first[i + 1] - plan.first[i]);
    G* g_stage = reinterpret_cast<G*>(grads_staging_.data());
    P* p_stage = out != nullptr ? reinterpret_cast<P*>(out_staging_.data()) : nullptr;

    local_.clear();
    for (const Piece& p : pieces) {
      ops_->copy_to_host(grads + p.grad_at, g_stage + p.local.offset, p.local.numel);
      local_.push_back(p.local);
    }
    const optim::Moments mv{m_.data() + lo, v_.data() + lo, hi - lo};
    optim::Run<Opt, HostSpace>::template step<G, P>(*opt_, std::span<const kernels::Segment>(local_), master_.data() + lo,
                                                   mv, g_stage, p_stage, grad_scale,
                                                   [&](std::span<double> s) { reduce(s.data(), s.size()); });
    if (out == nullptr) return;
    for (const Piece& p : pieces) ops_->copy_from_host(p_stage + p.local.offset, out + p.out_at, p.local.numel);
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
    kernels::host::cast(master_.data() + at, host.data(), n);
    ops_->copy_from_host(host.data(), dst, n);
  }
  void master_to_host(float* dst) const { std::copy_n(master_.data(), master_.size(), dst); }
  void master_from_host(const float* src) { std::copy_n(src, master_.size(), master_.data()); }

  OptimizerState optimizer_state() const {
    return {opt_->step_count(), std::vector<float>(m_.begin(), m_.end()), std::vector<float>(v_.begin(), v_.end())};
  }
  void load_optimizer_state(const OptimizerState& s) {
    optim::check_state(s, m_.size(), "Engine::load_state");
    std::copy(s.m.begin(), s.m.end(), m_.begin());
    std::copy(s.v.begin(), s.v.end(), v_.begin());
    opt_->set_step_count(s.step);
  }

 private:
  static std::size_t checked_sub_group(std::size_t n) {
    if (n == 0) throw config_error("must be >= 1", "zero_optimization.sub_group_size", "0");
    return n;
  }
  std::size_t staging_bytes(std::size_t owned_numel) const noexcept {
    return std::min(owned_numel, sub_group_numel_) * kStagingElementBytes;
  }

  /// A segment's piece inside one sub-group: `local` in sub-group coordinates (master, m, v and both
  /// stagings are indexed from the sub-group's first element), where its gradients are read and its
  /// output written in the compute space.
  struct Piece {
    kernels::Segment local;
    std::size_t grad_at = 0, out_at = 0;
  };
  /// Every sub-group's pieces: pieces[first[i], first[i + 1]) belong to sub-group i.
  struct Plan {
    const kernels::Segment* key = nullptr;
    std::size_t key_size = 0;
    std::vector<Piece> pieces;
    std::vector<std::size_t> first;
  };

  /// The plan for these segments, built on first use (a group's segments never change) in
  /// O(segments + sub-groups).
  const Plan& plan_for(std::span<const kernels::Segment> segments) {
    if (plan_.key == segments.data() && plan_.key_size == segments.size() && !plan_.first.empty()) return plan_;
    const std::size_t n = sub_groups(), S = sub_group_numel_;
    std::vector<std::vector<Piece>> by_group(n);
    for (const kernels::Segment& s : segments) {
      if (s.offset + s.numel > owned_numel()) {
        throw usage_error("a segment reaches past the owned range", "offload::HostPinned::step",
                          std::to_string(s.offset + s.numel) + " > " + std::to_string(owned_numel()));
      }
      for (std::size_t a = s.offset, end = s.offset + s.numel; a < end;) {
        const std::size_t i = a / S, b = std::min(end, (i + 1) * S);
        by_group[i].push_back(Piece{kernels::Segment{a - i * S, b - a, s.group, s.tensor}, s.grad_at() + (a - s.offset),
                                    s.out_at() + (a - s.offset)});
        a = b;
      }
    }
    plan_ = Plan{segments.data(), segments.size(), {}, {0}};
    for (auto& g : by_group) {
      plan_.pieces.insert(plan_.pieces.end(), g.begin(), g.end());
      plan_.first.push_back(plan_.pieces.size());
    }
    return plan_;
  }

  Ops* ops_;
  std::size_t sub_group_numel_;
  PinnedTrackedBuffer<float> master_;                     // [owned_numel] fp32
  PinnedTrackedBuffer<float> m_, v_;                      // [owned_numel] fp32 each
  PinnedTrackedBuffer<std::byte> grads_staging_;          // [min(owned, S)] gradients, <= 4 B each
  PinnedTrackedBuffer<std::byte> out_staging_;            // [min(owned, S)] working-precision values
  std::unique_ptr<Opt> opt_;
  Plan plan_;
  std::vector<kernels::Segment> local_;                   // this sub-group's pieces, for Run
  std::int64_t step_before_ = 0;
};

}  // namespace zerotk::offload
