#pragma once
/// \file zerotk/engine/values_resident.hpp
/// ResidentValues: where the Params' values are when every bucket is always in place (stages 0-2;
/// engine/bindings.hpp picks it by the parameter path's kResident).
///
/// A Param points into its group's flat parameter buffer, or, in emulated 16-bit mode (float Params
/// over 16-bit storage), into a float copy of its working-precision group's whole buffer (one
/// zero/float_view.hpp for the dense group, one for the experts'): refreshed from the 16-bit values whenever a bucket is published, written
/// back (rounded) by take_user_values(), its gradients folded into the bucket at the close of each
/// Param's backward scope.
///
/// Members (FetchedValues, engine/values_fetched.hpp, has the same):
///   adopt(adopt)            construction: the Params' own values into engine storage
///   take_user_values()      emulated: what the trainer wrote through float Params becomes the
///                           16-bit values
///   published(g, k), replaced(g)   bucket k (all) of group g holds new values
///   values(e), grads_outside(e)    where Param e points outside its backward scope
///   binds_bucket_grads(g)   whether g's Params see the bucket's gradients in their scopes (else
///                           a float buffer: emulated mode)
///   open_param(e, again), close_param(e, g)   emulated: a Param's backward scope opens / closes
///   end_micro_step()
///   broadcast(comm, root), keep_writes(g, k, comm, root)   rank root's values become every rank's

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "zerotk/core/error.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/engine/registry.hpp"
#include "zerotk/zero/float_view.hpp"

namespace zerotk::engine {

template <class Groups, class Ops>
class ResidentValues {
  using Main = typename Groups::main_type;
  using S = typename Main::value_type;

 public:
  /// `bind(e, data, grad)` points Param e (`point`, which keeps the gradient, is for fetched values).
  ResidentValues(ParamRegistry& registry, Groups& groups, Ops& ops, MemoryLedger* ledger, float* scratch,
                 std::function<void(ParamEntry&, void*, void*)> bind, std::function<void(ParamEntry&, void*)> /*point*/)
      : registry_(&registry), groups_(&groups), scratch_(scratch), bind_(std::move(bind)) {
    if (!registry.emulated()) return;
    if (const Main* main = groups.main()) view_.emplace(ops, ledger, main->layout().flat_numel());
    if (const Main* experts = groups.expert()) expert_view_.emplace(ops, ledger, experts->layout().flat_numel());
  }

  /// Copies every Param's current values into engine storage (if `adopt`; a Param whose data() is
  /// null keeps zeros), then binds it. Returns whether any values were adopted.
  bool adopt(bool adopt) {
    bool adopted = false;
    for (ParamEntry& e : registry_->entries()) {
      if (adopt && e.read_initial(values(e))) adopted = true;
      bind_(e, values(e), grads_outside(e));
    }
    if (adopted) take_user_values();
    return adopted;
  }

  void take_user_values() {
    groups_->each([&](auto& g) {
      if constexpr (std::is_same_v<std::remove_cvref_t<decltype(g)>, Main>) {
        if (View* v = view_of(g.kind())) v->take_user_values(g.params().params(), g.layout().flat_numel());
      }
    });
  }

  template <class G>
  void published(G& g, std::size_t k) {
    if constexpr (std::is_same_v<G, Main>) {
      if (View* v = view_of(g.kind())) {
        const zero::Bucket& b = g.layout().buckets()[k];
        v->refresh(g.params().params(), b.flat_offset, b.numel);
      }
    }
  }
  template <class G>
  void replaced(G& g) {
    if constexpr (std::is_same_v<G, Main>) {
      if (View* v = view_of(g.kind())) v->refresh(g.params().params(), 0, g.layout().flat_numel());
    }
  }

  void* values(const ParamEntry& e) {
    if (View* v = view_of(e.group)) return v->params() + slot(e).flat_offset;
    void* out = nullptr;
    groups_->with(e.group, [&](auto& g) { out = g.params().params() + g.layout().param(e.local).flat_offset; });
    return out;
  }
  void* grads_outside(const ParamEntry& e) {
    View* v = view_of(e.group);
    return v ? v->grads() + slot(e).flat_offset : scratch_;
  }

  template <class G>
  bool binds_bucket_grads(const G& g) const noexcept {
    if constexpr (std::is_same_v<G, Main>) {
      return !(g.kind() == GroupKind::expert ? expert_view_.has_value() : view_.has_value());
    }
    (void)g;
    return true;
  }
  /// Emulated: the Param's float gradient is zeroed when its first scope of the micro-step opens;
  /// it stays bound to the view.
  void open_param(ParamEntry& e, bool again) {
    if (View* v = view_of(e.group); v && !again) v->open_param(slot(e));
  }
  template <class G>
  void close_param(ParamEntry&, G& g, const zero::ParamSlot& s) {
    if constexpr (std::is_same_v<G, Main>) {
      if (View* v = view_of(g.kind())) v->fold_param(s, g.bucket_grads(s.bucket), g.layout().buckets()[s.bucket].flat_offset);
    }
  }
  void end_micro_step() noexcept {}

  /// Every rank's values := rank root's, group by group; the masters follow.
  template <class Comm>
  void broadcast(Comm& comm, int root) {
    groups_->each([&](auto& g) {
      using T = typename std::remove_cvref_t<decltype(g)>::value_type;
      comm.broadcast(g.params().params(), g.layout().flat_numel(), dtype_of_v<T>, root).wait();
      replaced(g);
      g.init_master();
    });
  }
  /// Rank root's values of bucket k are every rank's (they are in place: nothing else to write).
  template <class G, class Comm>
  void keep_writes(G& g, std::size_t k, Comm& comm, int root) {
    using T = typename G::value_type;
    comm.broadcast(g.params().values(k), g.layout().buckets()[k].numel, dtype_of_v<T>, root).wait();
    published(g, k);
  }

 private:
  using View = zero::FloatView<S, Ops>;

  /// The float view of the working-precision group `kind` (emulated mode), or null.
  View* view_of(GroupKind kind) noexcept {
    std::optional<View>* v = kind == GroupKind::main ? &view_ : kind == GroupKind::expert ? &expert_view_ : nullptr;
    return v && v->has_value() ? &**v : nullptr;
  }
  const zero::ParamSlot& slot(const ParamEntry& e) const {
    const zero::ParamSlot* s = nullptr;
    std::as_const(*groups_).with(e.group, [&](const auto& g) { s = &g.layout().param(e.local); });
    return *s;
  }

  ParamRegistry* registry_;
  Groups* groups_;
  float* scratch_;
  std::function<void(ParamEntry&, void*, void*)> bind_;
  std::optional<View> view_, expert_view_;  // emulated 16-bit: the dense group's, the experts'
};

}  // namespace zerotk::engine
