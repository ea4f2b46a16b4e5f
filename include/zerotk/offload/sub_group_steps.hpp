#pragma once
/// \file zerotk/offload/sub_group_steps.hpp
/// SubGroupSteps: the sub-group loop the offloading stores share (offload/host_pinned.hpp,
/// offload/nvme.hpp). It splits the owned range into sub-groups of sub_group_size elements, maps
/// the optimizer's segments onto them, and steps one sub-group whose master, m and v the caller
/// has in host memory:
///
///   gradients of its elements: compute space -> pinned staging buffer   [S] of the gradient type
///   optim::Run<Opt, HostSpace>::step over (master, m, v) of the sub-group -> pinned output staging
///   working-precision values: pinned output staging -> compute space    [S] of the parameter type
///
/// Stores differ only in where (master, m, v) of a sub-group come from and go to: HostPinned
/// points into its pinned arrays, Nvme into a buffer swapped in from the file.
///
/// Every sub-group takes the constants of the same step t (Run counts one step per call): the
/// step count is rewound before each sub-group after the first. Adam and AdamW are elementwise, so stepping sub-group by
/// sub-group gives the bits of one fused step.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "zerotk/core/error.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/core/pinned_host_space.hpp"
#include "zerotk/kernels/host/cast.hpp"
#include "zerotk/kernels/tensor_list.hpp"
#include "zerotk/offload/registered_host.hpp"
#include "zerotk/optim/optimizer.hpp"
#include "zerotk/optim/run.hpp"
#include "zerotk/zero/params/optimizer_out.hpp"

namespace zerotk::offload {

template <class Ops>
class SubGroupSteps {
 public:
  /// The largest gradient or parameter element a staging buffer holds (fp32).
  static constexpr std::size_t kStagingElementBytes = sizeof(float);

  SubGroupSteps(Ops& ops, MemoryLedger* ledger, std::size_t owned_numel, std::size_t sub_group_size)
      : ops_(&ops),
        owned_numel_(owned_numel),
        sub_group_numel_(checked(sub_group_size)),
        grads_staging_(std::min(owned_numel, sub_group_numel_) * kStagingElementBytes, MemoryCategory::grads, ledger),
        out_staging_(std::min(owned_numel, sub_group_numel_) * kStagingElementBytes, MemoryCategory::params16, ledger),
        grads_registered_(ops, grads_staging_.data(), grads_staging_.size()),
        out_registered_(ops, out_staging_.data(), out_staging_.size()) {}

  std::size_t owned_numel() const noexcept { return owned_numel_; }
  std::size_t sub_group_numel() const noexcept { return sub_group_numel_; }
  /// ceil(owned / sub_group_size), at least 1 (an empty partition still counts the step).
  std::size_t count() const noexcept { return std::max<std::size_t>(1, (owned_numel_ + sub_group_numel_ - 1) / sub_group_numel_); }
  /// Sub-group i is [begin(i), end(i)) of the owned range.
  std::size_t begin(std::size_t i) const noexcept { return std::min(owned_numel_, i * sub_group_numel_); }
  std::size_t end(std::size_t i) const noexcept { return std::min(owned_numel_, (i + 1) * sub_group_numel_); }
  std::size_t numel(std::size_t i) const noexcept { return end(i) - begin(i); }

  /// One fused step of sub-group i over `master`, `m`, `v` (its elements, from its first):
  /// stage its gradients, Run, write the working-precision values to `out` (null: none; the
  /// elements, or an OutputWriter: zero/params/optimizer_out.hpp).
  /// Segments as for Resident::step. Call with i = 0 .. count() - 1 in order.
  template <class Opt, class G, class P, class Reduce>
  void step(Opt& opt, std::size_t i, std::span<const kernels::Segment> segments, const G* grads, P* out,
            float grad_scale, Reduce&& reduce, float* master, float* m, float* v) {
    begin_sub_group(opt, i);
    staged(i, segments, grads, out, [&]<class V>(std::span<const kernels::Segment> local, const G* g, V* p) {
      optim::Run<Opt, HostSpace>::template step<G, V>(opt, local, master, optim::Moments{m, v, numel(i)}, g, p,
                                                     grad_scale,
                                                     [&](std::span<double> s) { reduce(s.data(), s.size()); });
    });
  }

  /// The values step() would write to `out` for sub-group i, with `master`, `m`, `v` and the step
  /// count unchanged (the next step's constants): Run::values, Adam and AdamW only.
  template <class Opt, class G, class P>
  void values(const Opt& opt, std::size_t i, std::span<const kernels::Segment> segments, const G* grads, P* out,
              float grad_scale, const float* master, const float* m, const float* v) {
    // Moments holds writable pointers; Run::values only reads through them.
    const optim::Moments mv{const_cast<float*>(m), const_cast<float*>(v), numel(i)};
    staged(i, segments, grads, out, [&]<class V>(std::span<const kernels::Segment> local, const G* g, V* p) {
      optim::Run<Opt, HostSpace>::template values<G, V>(opt, local, master, mv, g, p, grad_scale);
    });
  }

  /// The same step with the gradients already in host memory and the output going to host memory,
  /// both indexed like the master (`grads[j]`, `out[j]`: owned element j): no staging, no copies.
  /// The delayed parameter update (offload/delayed_update.hpp) steps its snapshot this way, off the
  /// training thread; `reduce` must not be needed (Adam and AdamW ask for no tensor sums).
  template <class Opt, class G, class V>
  void step_in_host(Opt& opt, std::size_t i, std::span<const kernels::Segment> segments, const G* grads, V* out,
                    float grad_scale, float* master, float* m, float* v) {
    begin_sub_group(opt, i);
    local_.clear();
    for (const Piece& p : pieces(segments, i)) local_.push_back(p.local);
    const std::size_t lo = begin(i);
    const optim::Moments mv{m, v, numel(i)};
    optim::Run<Opt, HostSpace>::template step<G, V>(
        opt, std::span<const kernels::Segment>(local_), master, mv, grads + lo, out + lo, grad_scale, [](std::span<double> s) {
          if (!s.empty()) throw usage_error("an optimizer that needs tensor sums cannot step in host memory off the training thread",
                                            "offload::SubGroupSteps::step_in_host");
        });
  }

  /// out := P(master) over sub-group i's pieces (`master` from the sub-group's first element): puts
  /// back the working-precision values of an abandoned step.
  template <class P>
  void write_out(std::span<const kernels::Segment> segments, std::size_t i, const float* master, P* out) {
    using V = zero::out_element_t<P>;
    V* p_stage = reinterpret_cast<V*>(out_staging_.data());
    for (const Piece& p : pieces(segments, i)) {
      kernels::host::cast(master + p.local.offset, p_stage + p.local.offset, p.local.numel);
      zero::put_out(*ops_, out, p.out_at, p_stage + p.local.offset, p.local.numel);
    }
    zero::end_sub_group(out);
  }

 private:
  /// Every sub-group takes the constants of step t: Run counts one step per call, so the count is
  /// rewound before each sub-group after the first.
  template <class Opt>
  void begin_sub_group(Opt& opt, std::size_t i) {
    if (i == 0) {
      step_before_ = opt.step_count();
    } else {
      opt.set_step_count(step_before_);
    }
  }

  /// Sub-group i's gradients into the staging buffer, kernel(local segments, staged gradients,
  /// output staging or null), the output staging to `out` (null: none) and the writer's sub-group
  /// ended.
  template <class G, class P, class Kernel>
  void staged(std::size_t i, std::span<const kernels::Segment> segments, const G* grads, P* out, Kernel&& kernel) {
    using V = zero::out_element_t<P>;  // P: the elements, or a writer of them (zero/params/optimizer_out.hpp)
    static_assert(sizeof(G) <= kStagingElementBytes && sizeof(V) <= kStagingElementBytes,
                  "offload: staging buffers hold elements of at most 4 bytes");
    const std::span<const Piece> ps = pieces(segments, i);
    G* g_stage = reinterpret_cast<G*>(grads_staging_.data());
    V* p_stage = out != nullptr ? reinterpret_cast<V*>(out_staging_.data()) : nullptr;
    local_.clear();
    for (const Piece& p : ps) {
      ops_->copy_to_host(grads + p.grad_at, g_stage + p.local.offset, p.local.numel);
      local_.push_back(p.local);
    }
    kernel(std::span<const kernels::Segment>(local_), g_stage, p_stage);
    if (out == nullptr) return;
    for (const Piece& p : ps) zero::put_out(*ops_, out, p.out_at, p_stage + p.local.offset, p.local.numel);
    zero::end_sub_group(out);
  }

  static std::size_t checked(std::size_t n) {
    if (n == 0) throw config_error("must be >= 1", "zero_optimization.sub_group_size", "0");
    return n;
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

  std::span<const Piece> pieces(std::span<const kernels::Segment> segments, std::size_t i) {
    const Plan& plan = plan_for(segments);
    return {plan.pieces.data() + plan.first[i], plan.first[i + 1] - plan.first[i]};
  }

  /// The plan for these segments, built on first use (a group's segments never change) in
  /// O(segments + sub-groups).
  const Plan& plan_for(std::span<const kernels::Segment> segments) {
    if (plan_.key == segments.data() && plan_.key_size == segments.size() && !plan_.first.empty()) return plan_;
    const std::size_t n = count(), S = sub_group_numel_;
    std::vector<std::vector<Piece>> by_group(n);
    for (const kernels::Segment& s : segments) {
      if (s.offset + s.numel > owned_numel_) {
        throw usage_error("a segment reaches past the owned range", "offload::SubGroupSteps::step",
                          std::to_string(s.offset + s.numel) + " > " + std::to_string(owned_numel_));
      }
      for (std::size_t a = s.offset, e = s.offset + s.numel; a < e;) {
        const std::size_t i = a / S, b = std::min(e, (i + 1) * S);
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
  std::size_t owned_numel_;
  std::size_t sub_group_numel_;
  PinnedTrackedBuffer<std::byte> grads_staging_;  // [min(owned, S)] gradients, <= 4 B each
  PinnedTrackedBuffer<std::byte> out_staging_;    // [min(owned, S)] working-precision values
  RegisteredHost<Ops> grads_registered_, out_registered_;  // with the compute space, while the stagings live
  Plan plan_;
  std::vector<kernels::Segment> local_;           // this sub-group's pieces, for Run
  std::int64_t step_before_ = 0;
};

}  // namespace zerotk::offload
