#pragma once
/// \file zerotk/engine/bindings.hpp
/// ParamBindings: where each of the user's Params points, and the backward scopes' bookkeeping.
///
/// - At construction every Param is bound into its group's flat parameter buffer (or, in emulated
///   16-bit mode, into the float view), after its current values were adopted.
/// - A backward scope opens the buckets of its parameters (storage ready, zeroed where an
///   accumulation starts) and points their gradients into bucket storage; closing it marks them
///   complete (a complete bucket starts reducing).
/// - Outside scopes a gradient points at scratch memory: a stray write is lost instead of landing in
///   a pool buffer another bucket reuses (or in no storage at all), and step() names the parameter.
/// - Stage 3 (a parameter path that is not resident): a Param's data points into its bucket's
///   gathered buffer while the bucket is fetched and is null otherwise; the path reports every
///   change (on_residency) and the Param is bound again, keeping its gradient pointer. In emulated
///   16-bit mode the Params point at a float copy of each fetched bucket instead, and their
///   gradients at a float buffer from their first backward scope to their own scope's close
///   (zero/fetched_float_view.hpp).

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "zerotk/core/error.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/engine/registry.hpp"
#include "zerotk/zero/fetched_float_view.hpp"
#include "zerotk/zero/float_view.hpp"

namespace zerotk::engine {

/// MainGroup holds the working precision S, Fp32Group the parameters kept in fp32; either may be null.
template <class MainGroup, class Fp32Group, class Ops>
class ParamBindings {
  using S = typename MainGroup::value_type;
  using View = zero::FloatView<S, Ops>;
  using FetchedView = zero::FetchedFloatView<S, Ops>;

 public:
  ParamBindings(ParamRegistry& registry, MainGroup* main, Fp32Group* f32, Ops& ops, MemoryLedger* ledger)
      : registry_(&registry), main_(main), f32_(f32), ops_(&ops), opened_(registry.size(), 0), done_(registry.size(), 0),
        grad_(registry.size(), nullptr) {
    if (registry.emulated()) {
      if constexpr (!kResident) {
        std::vector<char> persistent(main->layout().buckets().size());
        for (std::size_t k = 0; k < persistent.size(); ++k) persistent[k] = main->params().persistent(k) ? 1 : 0;
        fetched_.emplace(ops, ledger, main->layout(), std::move(persistent));
      } else {
        view_.emplace(ops, ledger, main->layout().flat_numel());
      }
    }
    std::size_t largest = 1;
    for (const auto& e : registry.entries()) largest = std::max(largest, e.numel);
    scratch_ = ops.template allocate<float>(largest, MemoryCategory::other, ledger);
    if constexpr (!kResident) {
      for_each_group([&](auto& g) {
        g.params().on_residency([this, &g](std::size_t k, auto* values) { rebind_bucket(g, k, values); });
      });
    }
  }

  /// Every bucket's values are always in place (stages 0-2), or only while fetched (stage 3).
  static constexpr bool kResident = MainGroup::Params::kResident;

  /// Copies every Param's current values into engine storage (if `adopt`; a Param whose data() is
  /// null keeps zeros), then binds it. Returns whether any values were adopted.
  bool adopt_and_bind(bool adopt) {
    if constexpr (!kResident) return adopt_shards(adopt);
    bool adopted = false;
    for (ParamEntry& e : registry_->entries()) {
      void* data = in_view(e) ? static_cast<void*>(view_->params() + slot(e).flat_offset) : storage(e);
      if (adopt && e.read_initial(data)) adopted = true;
      bind_outside_scope(e);
    }
    if (adopted) take_user_values();
    return adopted;
  }

  /// Emulated mode: what the trainer wrote through float Params becomes the 16-bit values (stage 3:
  /// those of the buckets gathered now; a scope that keeps writes then copies them into the shards).
  void take_user_values() {
    if constexpr (kResident) {
      if (view_) view_->take_user_values(main_->params().params(), main_->layout().flat_numel());
    } else {
      if (!fetched_) return;
      for (std::size_t k = 0; k < main_->layout().buckets().size(); ++k) {
        if (S* v = main_->params().values(k)) fetched_->take_user_values(k, v);
      }
    }
  }

  /// Bucket k of group g holds new values: the float view follows (emulated mode).
  template <class G>
  void on_bucket_published(G& g, std::size_t k) {
    if constexpr (std::is_same_v<G, MainGroup> && kResident) {
      if (view_) {
        const zero::Bucket& b = g.layout().buckets()[k];
        view_->refresh(g.params().params(), b.flat_offset, b.numel);
      }
    } else if constexpr (std::is_same_v<G, MainGroup>) {
      if (S* v = fetched_ ? g.params().values(k) : nullptr) fetched_->refresh(k, v);
    } else {
      (void)g, (void)k;
    }
  }
  /// All of group g's values changed (broadcast).
  template <class G>
  void on_group_replaced(G& g) {
    if constexpr (std::is_same_v<G, MainGroup> && kResident) {
      if (view_) view_->refresh(g.params().params(), 0, g.layout().flat_numel());
    } else {
      (void)g;
    }
  }

  /// A layer's forward or backward needs these parameters' current values (overlap_param_gather).
  void wait_values(const std::vector<ParamId>& ids) {
    for (ParamId id : ids) {
      const ParamEntry& e = (*registry_)[id];
      with_group(e, [&](auto& g) { g.params().wait(g.layout().param(e.local).bucket); });
    }
  }

  /// A backward scope opens: gradient storage of `ids` ready and bound.
  void begin_backward(const std::vector<ParamId>& ids, bool first_micro_step) {
    for (ParamId id : ids) {
      ParamEntry& e = (*registry_)[id];
      with_group(e, [&](auto& g) {
        const std::size_t k = g.layout().param(e.local).bucket;
        g.params().wait(k);
        if (g.launched(k)) {
          throw usage_error("parameter's gradient bucket was already reduced in this micro-step (is the parameter "
                            "used by two layers? give every parameter to exactly one layer's backward scope)",
                            e.name);
        }
        if (!g.opened(k)) open_bucket(g, k, first_micro_step);
      });
      if (in_view(e) && !opened_[id]) view_->open_param(slot(e));
      if (in_fetched(e)) {
        const zero::ParamSlot& s = slot(e);
        float* grads = opened_[id] ? fetched_->grads(s.bucket) : fetched_->open_param(s);
        bind(e, float_values(e), grads + (s.flat_offset - main_->layout().buckets()[s.bucket].flat_offset));
      }
      opened_[id] = 1;
    }
  }

  /// A backward scope closes: the gradients of `ids` are complete.
  void end_backward(const std::vector<ParamId>& ids) {
    for (ParamId id : ids) {
      ParamEntry& e = (*registry_)[id];
      if (done_[id]) throw usage_error("parameter received a second backward in one micro-step", e.name);
      done_[id] = 1;
      ++done_count_;
      with_group(e, [&](auto& g) {
        const zero::ParamSlot& s = g.layout().param(e.local);
        if constexpr (std::is_same_v<std::remove_cvref_t<decltype(g)>, MainGroup>) {
          if (view_) view_->fold_param(s, g.bucket_grads(s.bucket), g.layout().buckets()[s.bucket].flat_offset);
          if (fetched_) {
            fetched_->fold_param(s, g.bucket_grads(s.bucket));
            bind(e, float_values(e), scratch_.data());  // the float buffer may go to another bucket now
          }
        }
        g.add_ready(s.bucket, s.numel);
      });
    }
  }

  /// Every parameter had a backward scope in this micro-step, or a usage_error naming those that did not.
  void check_every_parameter_had_backward(std::int64_t micro_step) const {
    if (done_count_ == registry_->size()) return;
    std::string missing;
    std::size_t count = 0;
    for (ParamId i = 0; i < registry_->size(); ++i) {
      if (done_[i]) continue;
      if (++count <= 5) missing += (missing.empty() ? "" : ", ") + (*registry_)[i].name;
    }
    if (count > 5) missing += ", ... (" + std::to_string(count) + " in all)";
    const std::string where = "Engine::step: micro-step " + std::to_string(micro_step);
    if (done_count_ == 0) {
      throw usage_error("step() with no backward scope since the last step(): every micro-step must run each layer's "
                        "backward inside engine.backward(layer)",
                        where, "0 of " + std::to_string(registry_->size()) + " parameters");
    }
    throw usage_error("parameters got no backward scope in this micro-step (list each parameter in its layer's "
                      "parameters() or external_parameters(), and open that layer's engine.backward() scope; an "
                      "unused parameter still needs its layer's scope, its gradient is then zero)",
                      where, missing);
  }

  /// After the micro-step's reductions: gradients back to scratch, flags cleared.
  void end_micro_step() {
    for (ParamId i = 0; i < registry_->size(); ++i) {
      if (opened_[i]) bind_outside_scope((*registry_)[i]);
    }
    std::fill(opened_.begin(), opened_.end(), 0);
    std::fill(done_.begin(), done_.end(), 0);
    done_count_ = 0;
    if (fetched_) fetched_->end_micro_step();
  }

 private:
  bool in_view(const ParamEntry& e) const noexcept { return view_ && e.group == GroupKind::main; }
  bool in_fetched(const ParamEntry& e) const noexcept { return fetched_ && e.group == GroupKind::main; }

  /// Emulated stage 3: where the Param's float values are now (its bucket's float copy), or null.
  float* float_values(const ParamEntry& e) {
    const zero::ParamSlot& s = main_->layout().param(e.local);
    float* base = fetched_->values(s.bucket);
    return base ? base + (s.flat_offset - main_->layout().buckets()[s.bucket].flat_offset) : nullptr;
  }

  template <class F>
  void for_each_group(F&& f) {
    if (main_) f(*main_);
    if (f32_) f(*f32_);
  }

  template <class F>
  void with_group(const ParamEntry& e, F&& f) {
    if (e.group == GroupKind::main) {
      f(*main_);
    } else {
      f(*f32_);
    }
  }

  const zero::ParamSlot& slot(const ParamEntry& e) const {
    return e.group == GroupKind::main ? main_->layout().param(e.local) : f32_->layout().param(e.local);
  }

  /// Where the Param's values are now: in its bucket's values, or null (stage 3, not fetched).
  void* storage(const ParamEntry& e) {
    void* out = nullptr;
    with_group(e, [&](auto& g) {
      const zero::ParamSlot& s = g.layout().param(e.local);
      auto* base = g.params().values(s.bucket);
      if (base) out = base + (s.flat_offset - g.layout().buckets()[s.bucket].flat_offset);
    });
    return out;
  }

  void bind(ParamEntry& e, void* data, void* grad) {
    grad_[static_cast<std::size_t>(&e - registry_->entries().data())] = grad;
    e.bind(data, grad);
  }

  void bind_outside_scope(ParamEntry& e) {
    if (in_view(e)) {
      bind(e, view_->params() + slot(e).flat_offset, view_->grads() + slot(e).flat_offset);
    } else if (in_fetched(e)) {
      bind(e, float_values(e), scratch_.data());
    } else {
      bind(e, storage(e), scratch_.data());
    }
  }

  /// Stage 3: bucket k of group g became resident at `values` (or left: null).
  template <class G, class T>
  void rebind_bucket(G& g, std::size_t k, T* values) {
    if constexpr (std::is_same_v<G, MainGroup>) {
      if (fetched_) {  // emulated: the Params see the bucket's float copy
        if (values) return rebind_params(g, k, fetched_->resident(k, values));
        fetched_->evicted(k);
        return rebind_params(g, k, static_cast<float*>(nullptr));
      }
    }
    rebind_params(g, k, values);
  }
  template <class G, class U>
  void rebind_params(G& g, std::size_t k, U* values) {
    const zero::Bucket& b = g.layout().buckets()[k];
    for (std::uint32_t j : b.params) {
      const ParamId id = g.member(j);
      U* data = values ? values + (g.layout().param(j).flat_offset - b.flat_offset) : nullptr;
      (*registry_)[id].bind(data, grad_[id]);
    }
  }

  /// Stage 3 construction: each Param's initial values, bucket by bucket through host staging, of
  /// which this rank keeps its block in the shard. Then every Param is bound (null data).
  bool adopt_shards(bool adopt) {
    bool adopted = false;
    if (adopt) {
      for_each_group([&](auto& g) {
        using G = std::remove_cvref_t<decltype(g)>;
        using T = typename G::value_type;
        // Emulated: the Params hold float, rounded to 16 bits on the way into the shard.
        const bool as_float = std::is_same_v<G, MainGroup> && fetched_.has_value();
        using Host = std::conditional_t<std::is_same_v<G, MainGroup>, float, T>;
        const zero::BucketLayout& l = g.layout();
        std::vector<T> staging;
        std::vector<Host> staging_float;
        const int rank = g.rank();
        for (std::size_t k = 0; k < l.buckets().size(); ++k) {
          const zero::Bucket& b = l.buckets()[k];
          void* base = nullptr;
          if (as_float) {
            staging_float.assign(b.numel, Host{});
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
          const std::size_t from = static_cast<std::size_t>(rank) * b.block;
          g.params().write_owned(k, [&](T* block) {
            if constexpr (std::is_same_v<G, MainGroup>) {
              if (as_float) {
                fetched_->store_from_host(staging_float.data() + from, block, b.block);
                return;
              }
            }
            ops_->copy_from_host(staging.data() + from, block, b.block);
          });
        }
      });
    }
    for (ParamEntry& e : registry_->entries()) bind_outside_scope(e);
    return adopted;
  }

  /// First touch of bucket k in this micro-step: storage ready, its Params' gradients bound to it
  /// (float-view Params stay bound to the view).
  template <class G>
  void open_bucket(G& g, std::size_t k, bool first_micro_step) {
    g.open(k, first_micro_step);
    if ((view_ || fetched_) && std::is_same_v<G, MainGroup>) return;
    using T = typename G::value_type;
    const zero::Bucket& b = g.layout().buckets()[k];
    T* grads = g.bucket_grads(k);
    T* values = g.params().values(k);  // null: a stage-3 bucket its layer did not fetch
    for (std::uint32_t j : b.params) {
      const std::size_t off = g.layout().param(j).flat_offset - b.flat_offset;
      bind((*registry_)[g.member(j)], values ? values + off : nullptr, grads + off);
    }
  }

  ParamRegistry* registry_;
  MainGroup* main_;
  Fp32Group* f32_;
  Ops* ops_;
  std::optional<View> view_;                      // emulated 16-bit, stages 0-2
  std::optional<FetchedView> fetched_;            // emulated 16-bit, stage 3
  typename Ops::template Buffer<float> scratch_;  // [largest parameter] gradients written outside scopes
  std::vector<char> opened_, done_;               // [parameter] this micro-step
  std::vector<void*> grad_;                       // [parameter] the gradient pointer it is bound with
  std::size_t done_count_ = 0;
};

}  // namespace zerotk::engine
