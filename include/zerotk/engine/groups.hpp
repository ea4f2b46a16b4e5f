#pragma once
/// \file zerotk/engine/groups.hpp
/// Groups: the engine's flat groups as one object. Parameters the training precision covers form
/// the working-precision group; those kept in fp32 (keep_fp32, fp32_module_types) the fp32-kept
/// group; expert parameters (moe/) the expert group, in the working precision, over the expert-data
/// group's communicator. Any may be absent. Everything the engine does to "every group" is here,
/// once: the micro-step's end, the two-phase update (every group takes a step or none does),
/// skipping, publication, and the sums over all.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "zerotk/engine/registry.hpp"

namespace zerotk::engine {

template <class Main, class F32>
class Groups {
 public:
  using main_type = Main;
  using fp32_type = F32;

  Groups() = default;
  Groups(std::unique_ptr<Main> main, std::unique_ptr<F32> f32, std::unique_ptr<Main> expert = nullptr)
      : main_(std::move(main)), f32_(std::move(f32)), expert_(std::move(expert)) {}

  Main* main() noexcept { return main_.get(); }
  const Main* main() const noexcept { return main_.get(); }
  F32* f32() noexcept { return f32_.get(); }
  const F32* f32() const noexcept { return f32_.get(); }
  Main* expert() noexcept { return expert_.get(); }
  const Main* expert() const noexcept { return expert_.get(); }

  /// f(group) for each group present: the working-precision group, the fp32-kept one, the experts'.
  template <class F>
  void each(F&& f) {
    if (main_) f(*main_);
    if (f32_) f(*f32_);
    if (expert_) f(*expert_);
  }
  template <class F>
  void each(F&& f) const {
    if (main_) f(std::as_const(*main_));
    if (f32_) f(std::as_const(*f32_));
    if (expert_) f(std::as_const(*expert_));
  }
  /// f(the group a parameter of `kind` lives in).
  template <class F>
  void with(GroupKind kind, F&& f) {
    if (kind == GroupKind::fp32) {
      f(*f32_);
    } else {
      f(kind == GroupKind::main ? *main_ : *expert_);
    }
  }
  template <class F>
  void with(GroupKind kind, F&& f) const {
    if (kind == GroupKind::fp32) {
      f(std::as_const(*f32_));
    } else {
      f(std::as_const(kind == GroupKind::main ? *main_ : *expert_));
    }
  }
  std::size_t count() const noexcept { return (main_ ? 1 : 0) + (f32_ ? 1 : 0) + (expert_ ? 1 : 0); }

  /// Padded elements of the flat buffers, both groups.
  std::size_t flat_numel() const noexcept { return sum([](const auto& g) { return g.layout().flat_numel(); }); }
  /// Elements this rank's model shard counts in the norm (engine/norm_share.hpp), of the groups
  /// over the data group (`experts` false) or of the expert group (true).
  std::size_t counted_numel(bool experts = false) const noexcept {
    return sum([experts](const auto& g) { return (g.kind() == GroupKind::expert) == experts ? g.counted_numel() : 0; });
  }
  std::size_t bucket_count() const noexcept { return sum([](const auto& g) { return g.layout().buckets().size(); }); }
  std::size_t pending_publications() const noexcept { return sum([](const auto& g) { return g.pending_publications(); }); }
  /// Bytes the compressed exchanges saved: dense traffic replaced minus what was sent instead.
  std::uint64_t saved_wire_bytes() const noexcept {
    return sum([](const auto& g) { return g.replaced_dense_bytes() - g.replacement_wire_bytes(); });
  }
  /// 1-bit optimizers' compressed phase: the next step's gradients stay on their rank.
  bool gradients_local() const noexcept { return any([](const auto& g) { return g.gradients_local(); }); }
  /// A delayed update started and not yet published.
  bool update_pending() const noexcept { return any([](const auto& g) { return g.update_pending(); }); }

  void end_micro_step(bool boundary, bool first_micro_step) {
    each([&](auto& g) { g.end_micro_step(boundary, first_micro_step); });
  }
  void synchronize() {
    each([](auto& g) { g.params().synchronize(); });
  }
  void skip() {
    each([](auto& g) { g.skip(); });
  }
  void init_master() {
    each([](auto& g) { g.init_master(); });
  }
  void supersede_update() {
    each([](auto& g) { g.supersede_update(); });
  }
  void drain_quietly() noexcept {
    each([](auto& g) { g.drain_quietly(); });
  }

  /// One optimizer step of every group, taken by all or by none: each group prepares its step (all
  /// I/O; a failure takes that group back) before any makes it current, so a failure in a later
  /// group's leaves the earlier groups' untaken too (engine/group.hpp). Then the updated
  /// values are published; on_bucket(group, k) runs once bucket k of `group` holds them, which may
  /// be after this returns (overlap_param_gather): each group keeps a copy of `on_bucket`.
  /// `committed(group)` runs between a group's commit and its publication (Sparsity's pruning of
  /// the new values).
  template <class OnBucket, class Committed>
  void update(float grad_scale, OnBucket&& on_bucket, Committed&& committed) {
    int prepared = 0;
    try {
      each([&](auto& g) {
        g.prepare_update(grad_scale);
        ++prepared;
      });
    } catch (...) {
      each([&](auto& g) {
        if (prepared-- > 0) g.abort_update();
      });
      throw;
    }
    each([&](auto& g) {
      g.commit_update();
      committed(g);
      g.publish([on_bucket, &g](std::size_t k) { on_bucket(g, k); });  // may run after update() returns
    });
  }

 private:
  template <class F>
  auto sum(F&& f) const noexcept {
    decltype(f(std::declval<const Main&>())) n{};
    each([&](const auto& g) { n += f(g); });
    return n;
  }
  template <class F>
  bool any(F&& f) const noexcept {
    bool out = false;
    each([&](const auto& g) { out = out || f(g); });
    return out;
  }

  std::unique_ptr<Main> main_;
  std::unique_ptr<F32> f32_;
  std::unique_ptr<Main> expert_;
};

}  // namespace zerotk::engine
