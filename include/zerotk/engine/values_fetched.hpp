#pragma once
/// \file zerotk/engine/values_fetched.hpp
/// FetchedValues: where the Params' values are when buckets are gathered on demand (stage 3;
/// engine/bindings.hpp picks it by the parameter path's kResident). Members as ResidentValues
/// (engine/values_resident.hpp).
///
/// A Param's data points into its bucket's gathered buffer while the bucket is fetched and is null
/// otherwise: the parameter path reports every change (on_residency) and the Param is bound again,
/// keeping its gradient pointer. In emulated 16-bit mode the Params point at a float copy of each
/// fetched bucket instead (one zero/fetched_float_view.hpp for the dense group, one for the experts'), and their gradients at a float buffer from their first backward scope to
/// their own scope's close (zero/fetched_float_view.hpp). The initial values go bucket by bucket
/// through host staging into this rank's shard.

#include <cstddef>
#include <functional>
#include <optional>
#include <type_traits>
#include <vector>

#include "zerotk/core/memory.hpp"
#include "zerotk/engine/registry.hpp"
#include "zerotk/zero/fetched_float_view.hpp"

namespace zerotk::engine {

template <class Groups, class Ops>
class FetchedValues {
  using Main = typename Groups::main_type;
  using S = typename Main::value_type;

 public:
  /// `bind(e, data, grad)` points Param e; `point(e, data)` points its values, keeping its gradient.
  FetchedValues(ParamRegistry& registry, Groups& groups, Ops& ops, MemoryLedger* ledger, float* scratch,
                std::function<void(ParamEntry&, void*, void*)> bind, std::function<void(ParamEntry&, void*)> point)
      : registry_(&registry), groups_(&groups), ops_(&ops), scratch_(scratch), bind_(std::move(bind)),
        point_(std::move(point)) {
    if (registry.emulated()) {
      auto view = [&](std::optional<View>& out, const Main* g) {
        if (!g) return;
        std::vector<char> persistent(g->layout().buckets().size());
        for (std::size_t k = 0; k < persistent.size(); ++k) persistent[k] = g->params().persistent(k) ? 1 : 0;
        out.emplace(ops, ledger, g->layout(), std::move(persistent));
      };
      view(fetched_, groups.main());
      view(expert_fetched_, groups.expert());
    }
    groups.each([&](auto& g) {
      g.params().on_residency([this, &g](std::size_t k, auto* values) { this->rebind_bucket(g, k, values); });
    });
  }

  /// Each Param's initial values, bucket by bucket through host staging, of which this rank keeps
  /// its block in the shard. Then every Param is bound (null data: nothing is fetched yet).
  bool adopt(bool adopt) {
    bool adopted = false;
    if (adopt) groups_->each([&](auto& g) { adopted = adopt_group(g) || adopted; });
    for (ParamEntry& e : registry_->entries()) bind(e, values(e), grads_outside(e));
    return adopted;
  }

  /// Emulated: the float copies of the buckets gathered now become their 16-bit values (a scope
  /// that keeps writes then copies them into the shards).
  void take_user_values() {
    groups_->each([&](auto& g) {
      if constexpr (std::is_same_v<std::remove_cvref_t<decltype(g)>, Main>) {
        View* view = view_of(g.kind());
        for (std::size_t k = 0; view && k < g.layout().buckets().size(); ++k) {
          if (S* v = g.params().values(k)) view->take_user_values(k, v);
        }
      }
    });
  }

  template <class G>
  void published(G& g, std::size_t k) {
    if constexpr (std::is_same_v<G, Main>) {
      if (View* view = view_of(g.kind())) {
        if (S* v = g.params().values(k)) view->refresh(k, v);
      }
    }
  }
  template <class G>
  void replaced(G&) noexcept {}

  void* values(const ParamEntry& e) {
    if (view_of(e.group)) return float_values(e);
    void* out = nullptr;
    groups_->with(e.group, [&](auto& g) {
      const zero::ParamSlot& s = g.layout().param(e.local);
      auto* base = g.params().values(s.bucket);
      if (base) out = base + (s.flat_offset - g.layout().buckets()[s.bucket].flat_offset);
    });
    return out;
  }
  void* grads_outside(const ParamEntry&) noexcept { return scratch_; }

  template <class G>
  bool binds_bucket_grads(const G& g) const noexcept {
    if constexpr (std::is_same_v<G, Main>) {
      return !(g.kind() == GroupKind::expert ? expert_fetched_.has_value() : fetched_.has_value());
    }
    (void)g;
    return true;
  }
  /// Emulated: the Param's gradients go to its bucket's float buffer (taken at its first scope).
  void open_param(ParamEntry& e, bool again) {
    View* view = view_of(e.group);
    if (!view) return;
    const zero::BucketLayout& l = layout_of(e.group);
    const zero::ParamSlot& s = l.param(e.local);
    float* grads = again ? view->grads(s.bucket) : view->open_param(s);
    bind(e, float_values(e), grads + (s.flat_offset - l.buckets()[s.bucket].flat_offset));
  }
  template <class G>
  void close_param(ParamEntry& e, G& g, const zero::ParamSlot& s) {
    if constexpr (std::is_same_v<G, Main>) {
      if (View* view = view_of(g.kind())) {
        view->fold_param(s, g.bucket_grads(s.bucket));
        bind(e, float_values(e), scratch_);  // the float buffer may go to another bucket now
      }
    }
  }
  void end_micro_step() {
    if (fetched_) fetched_->end_micro_step();
    if (expert_fetched_) expert_fetched_->end_micro_step();
  }

  /// Stage 3 keeps one sharded copy of the parameters: there is no rank's copy to broadcast.
  template <class Comm>
  [[noreturn]] void broadcast(Comm&, int root) {
    throw usage_error("ZeRO stage 3 keeps one sharded copy of the parameters, so there is no rank's copy to "
                      "broadcast: write initial values inside `auto g = engine.gather(model, root);` (rank root's "
                      "writes are kept) and call initialize_master()",
                      "Engine::broadcast_parameters", std::to_string(root));
  }
  /// Rank root's values of gathered bucket k become every rank's, and each rank's block goes back
  /// into its shard.
  template <class G, class Comm>
  void keep_writes(G& g, std::size_t k, Comm& comm, int root) {
    using T = typename G::value_type;
    const zero::Bucket& b = g.layout().buckets()[k];
    T* values = g.params().values(k);
    comm.broadcast(values, b.numel, dtype_of_v<T>, root).wait();
    const std::size_t from = static_cast<std::size_t>(comm.rank()) * b.block;
    g.params().write_owned(k, [&](T* block) { ops_->copy(values + from, block, b.block); });
    published(g, k);
  }

 private:
  using View = zero::FetchedFloatView<S, Ops>;

  /// The float view of the working-precision group `kind` (emulated mode), or null.
  View* view_of(GroupKind kind) noexcept {
    std::optional<View>* v = kind == GroupKind::main ? &fetched_ : kind == GroupKind::expert ? &expert_fetched_ : nullptr;
    return v && v->has_value() ? &**v : nullptr;
  }
  const zero::BucketLayout& layout_of(GroupKind kind) const {
    return (kind == GroupKind::expert ? groups_->expert() : groups_->main())->layout();
  }

  /// Where Param e's float values are now (its bucket's float copy), or null.
  float* float_values(const ParamEntry& e) {
    const zero::BucketLayout& l = layout_of(e.group);
    const zero::ParamSlot& s = l.param(e.local);
    float* base = view_of(e.group)->values(s.bucket);
    return base ? base + (s.flat_offset - l.buckets()[s.bucket].flat_offset) : nullptr;
  }

  void bind(ParamEntry& e, void* data, void* grad) { bind_(e, data, grad); }

  /// Bucket k of group g became resident at `values` (or left: null).
  template <class G, class T>
  void rebind_bucket(G& g, std::size_t k, T* values) {
    if constexpr (std::is_same_v<G, Main>) {
      if (View* view = view_of(g.kind())) {  // emulated: the Params see the bucket's float copy
        if (values) return rebind_params(g, k, view->resident(k, values));
        view->evicted(k);
        return rebind_params(g, k, static_cast<float*>(nullptr));
      }
    }
    rebind_params(g, k, values);
  }
  template <class G, class U>
  void rebind_params(G& g, std::size_t k, U* values) {
    const zero::Bucket& b = g.layout().buckets()[k];
    for (std::uint32_t j : b.params) {
      U* data = values ? values + (g.layout().param(j).flat_offset - b.flat_offset) : nullptr;
      point_((*registry_)[g.member(j)], data);
    }
  }

  /// One group's initial values into its shard; whether any Param had values.
  template <class G>
  bool adopt_group(G& g) {
    using T = typename G::value_type;
    // Emulated: the Params hold float, rounded to 16 bits on the way into the shard.
    View* view = nullptr;
    if constexpr (std::is_same_v<G, Main>) view = view_of(g.kind());
    const bool as_float = view != nullptr;
    const zero::BucketLayout& l = g.layout();
    std::vector<T> staging;
    std::vector<float> staging_float;
    bool adopted = false;
    for (std::size_t k = 0; k < l.buckets().size(); ++k) {
      const zero::Bucket& b = l.buckets()[k];
      void* base = nullptr;
      if (as_float) {
        staging_float.assign(b.numel, 0.0f);
        base = staging_float.data();
      } else {
        staging.assign(b.numel, T{});
        base = staging.data();
      }
      const std::size_t elem = as_float ? sizeof(float) : sizeof(T);
      bool any = false;
      for (std::uint32_t j : b.params) {
        void* dst = static_cast<char*>(base) + elem * (l.param(j).flat_offset - b.flat_offset);
        any = (*registry_)[g.member(j)].read_initial(dst) || any;
      }
      if (!any) continue;
      adopted = true;
      const std::size_t from = static_cast<std::size_t>(g.rank()) * b.block;
      g.params().write_owned(k, [&](T* block) {
        if (as_float) {
          store_float(*view, staging_float.data() + from, block, b.block);
        } else {
          ops_->copy_from_host(staging.data() + from, block, b.block);
        }
      });
    }
    return adopted;
  }
  template <class T>
  static void store_float(View& view, const float* host, T* block, std::size_t n) {
    if constexpr (std::is_same_v<T, S>) view.store_from_host(host, block, n);
    (void)view, (void)host, (void)block, (void)n;
  }

  ParamRegistry* registry_;
  Groups* groups_;
  Ops* ops_;
  float* scratch_;
  std::function<void(ParamEntry&, void*, void*)> bind_;
  std::function<void(ParamEntry&, void*)> point_;
  std::optional<View> fetched_, expert_fetched_;  // emulated 16-bit: the dense group's, the experts'
};

}  // namespace zerotk::engine
