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

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "zerotk/core/error.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/engine/registry.hpp"
#include "zerotk/zero/float_view.hpp"

namespace zerotk::engine {

/// MainGroup holds the working precision S, Fp32Group the parameters kept in fp32; either may be null.
template <class MainGroup, class Fp32Group, class Ops>
class ParamBindings {
  using S = typename MainGroup::value_type;
  using View = zero::FloatView<S, Ops>;

 public:
  ParamBindings(ParamRegistry& registry, MainGroup* main, Fp32Group* f32, Ops& ops, MemoryLedger* ledger)
      : registry_(&registry), main_(main), f32_(f32), opened_(registry.size(), 0), done_(registry.size(), 0) {
    if (registry.emulated()) view_.emplace(ops, ledger, main->layout().flat_numel());
    std::size_t largest = 1;
    for (const auto& e : registry.entries()) largest = std::max(largest, e.numel);
    scratch_ = ops.template allocate<float>(largest, MemoryCategory::other, ledger);
  }

  /// Copies every Param's current values into engine storage (if `adopt`; a Param whose data() is
  /// null keeps zeros), then binds it. Returns whether any values were adopted.
  bool adopt_and_bind(bool adopt) {
    bool adopted = false;
    for (ParamEntry& e : registry_->entries()) {
      void* data = in_view(e) ? static_cast<void*>(view_->params() + slot(e).flat_offset) : storage(e);
      if (adopt && e.read_initial(data)) adopted = true;
      bind_outside_scope(e);
    }
    if (adopted) take_user_values();
    return adopted;
  }

  /// Emulated mode: what the trainer wrote through float Params becomes the 16-bit values.
  void take_user_values() {
    if (view_) view_->take_user_values(main_->params().params(), main_->layout().flat_numel());
  }

  /// Bucket k of group g holds new values: the float view follows (emulated mode).
  template <class G>
  void on_bucket_published(G& g, std::size_t k) {
    if constexpr (std::is_same_v<G, MainGroup>) {
      if (view_) {
        const zero::Bucket& b = g.layout().buckets()[k];
        view_->refresh(g.params().params(), b.flat_offset, b.numel);
      }
    } else {
      (void)g, (void)k;
    }
  }
  /// All of group g's values changed (broadcast).
  template <class G>
  void on_group_replaced(G& g) {
    if constexpr (std::is_same_v<G, MainGroup>) {
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
  }

 private:
  bool in_view(const ParamEntry& e) const noexcept { return view_ && e.group == GroupKind::main; }

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

  void* storage(const ParamEntry& e) {
    if (e.group == GroupKind::main) return main_->params().params() + slot(e).flat_offset;
    return f32_->params().params() + slot(e).flat_offset;
  }

  void bind_outside_scope(ParamEntry& e) {
    if (in_view(e)) {
      e.bind(view_->params() + slot(e).flat_offset, view_->grads() + slot(e).flat_offset);
    } else {
      e.bind(storage(e), scratch_.data());
    }
  }

  /// First touch of bucket k in this micro-step: storage ready, its Params' gradients bound to it
  /// (float-view Params stay bound to the view).
  template <class G>
  void open_bucket(G& g, std::size_t k, bool first_micro_step) {
    g.open(k, first_micro_step);
    if (view_ && std::is_same_v<G, MainGroup>) return;
    using T = typename G::value_type;
    const zero::Bucket& b = g.layout().buckets()[k];
    T* grads = g.bucket_grads(k);
    for (std::uint32_t j : b.params) {
      const std::size_t off = g.layout().param(j).flat_offset;
      (*registry_)[g.member(j)].bind(g.params().params() + off, grads + (off - b.flat_offset));
    }
  }

  ParamRegistry* registry_;
  MainGroup* main_;
  Fp32Group* f32_;
  std::optional<View> view_;
  typename Ops::template Buffer<float> scratch_;  // [largest parameter] gradients written outside scopes
  std::vector<char> opened_, done_;               // [parameter] this micro-step
  std::size_t done_count_ = 0;
};

}  // namespace zerotk::engine
