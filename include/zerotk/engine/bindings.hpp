#pragma once
/// \file zerotk/engine/bindings.hpp
/// ParamBindings: where each of the user's Params points, and the backward scopes' bookkeeping.
///
/// - At construction every Param is bound into engine storage, after its current values were
///   adopted. Where the values are is the Values part, picked by the parameter path:
///   engine/values_resident.hpp (stages 0-2: the flat buffer, or a float view of it in emulated
///   16-bit mode) or engine/values_fetched.hpp (stage 3: a bucket's gathered buffer while it is
///   fetched, null otherwise).
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
#include "zerotk/engine/values_fetched.hpp"
#include "zerotk/engine/values_resident.hpp"

namespace zerotk::engine {

/// `Groups`: the engine's flat groups (engine/groups.hpp).
template <class Groups, class Ops>
class ParamBindings {
  using Main = typename Groups::main_type;

 public:
  /// Every bucket's values are always in place (stages 0-2), or only while fetched (stage 3).
  static constexpr bool kResident = Main::Params::kResident;
  using Values = std::conditional_t<kResident, ResidentValues<Groups, Ops>, FetchedValues<Groups, Ops>>;

  ParamBindings(ParamRegistry& registry, Groups& groups, Ops& ops, MemoryLedger* ledger)
      : registry_(&registry),
        groups_(&groups),
        opened_(registry.size(), 0),
        done_(registry.size(), 0),
        grad_(registry.size(), nullptr),
        scratch_(ops.template allocate<float>(largest(registry), MemoryCategory::other, ledger)),
        values_(registry, groups, ops, ledger, scratch_.data(),
                [this](ParamEntry& e, void* data, void* grad) { bind(e, data, grad); },
                [this](ParamEntry& e, void* data) { e.bind(data, grad_[id_of(e)]); }) {}

  /// Copies every Param's current values into engine storage (if `adopt`; a Param whose data() is
  /// null keeps zeros), then binds it. Returns whether any values were adopted.
  bool adopt_and_bind(bool adopt) { return values_.adopt(adopt); }

  /// Emulated mode: what the trainer wrote through float Params becomes the 16-bit values (stage 3:
  /// those of the buckets gathered now; a scope that keeps writes then copies them into the shards).
  void take_user_values() { values_.take_user_values(); }

  /// Bucket k of group g holds new values: the float view follows (emulated mode).
  template <class G>
  void on_bucket_published(G& g, std::size_t k) {
    values_.published(g, k);
  }

  /// Every rank's parameters := rank root's (stages 0-2; stage 3 refuses: it keeps one sharded copy).
  template <class Comm>
  void broadcast(Comm& comm, int root) {
    values_.broadcast(comm, root);
  }

  /// Rank root's values of the buckets holding m's parameters become every rank's (stage 3: each
  /// rank's block goes back into its shard): the dense groups' over `data` from its rank `root`, the
  /// expert group's over `expert_data` from its rank `expert_root`.
  template <class Comm>
  void keep_writes(const ModuleEntry& m, Comm& data, int root, Comm& expert_data, int expert_root) {
    take_user_values();
    groups_->each([&](auto& g) {
      std::vector<char> seen(g.layout().buckets().size(), 0);
      const GroupKind kind = g.kind();
      for (const std::vector<ParamId>* ids : {&m.own, &m.external}) {
        for (ParamId id : *ids) {
          const ParamEntry& e = (*registry_)[id];
          if (e.group != kind) continue;
          const std::size_t k = g.layout().param(e.local).bucket;
          if (seen[k]) continue;
          seen[k] = 1;
          if (kind == GroupKind::expert) {
            values_.keep_writes(g, k, expert_data, expert_root);
          } else {
            values_.keep_writes(g, k, data, root);
          }
        }
      }
    });
  }

  /// A layer's forward or backward needs these parameters' current values (overlap_param_gather).
  void wait_values(const std::vector<ParamId>& ids) {
    for (ParamId id : ids) {
      const ParamEntry& e = (*registry_)[id];
      groups_->with(e.group, [&](auto& g) { g.params().wait(g.layout().param(e.local).bucket); });
    }
  }

  /// A backward scope opens: gradient storage of `ids` ready and bound.
  void begin_backward(const std::vector<ParamId>& ids, bool first_micro_step) {
    for (ParamId id : ids) {
      ParamEntry& e = (*registry_)[id];
      groups_->with(e.group, [&](auto& g) {
        const std::size_t k = g.layout().param(e.local).bucket;
        g.params().wait(k);
        if (g.launched(k)) {
          throw usage_error("parameter's gradient bucket was already reduced in this micro-step (is the parameter "
                            "used by two layers? give every parameter to exactly one layer's backward scope)",
                            e.name);
        }
        if (!g.opened(k)) open_bucket(g, k, first_micro_step);
      });
      values_.open_param(e, opened_[id] != 0);
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
      groups_->with(e.group, [&](auto& g) {
        const zero::ParamSlot& s = g.layout().param(e.local);
        values_.close_param(e, g, s);
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
    values_.end_micro_step();
  }

 private:
  static std::size_t largest(const ParamRegistry& r) {
    std::size_t n = 1;
    for (const auto& e : r.entries()) n = std::max(n, e.numel);
    return n;
  }
  std::size_t id_of(const ParamEntry& e) const noexcept {
    return static_cast<std::size_t>(&e - registry_->entries().data());
  }

  void bind(ParamEntry& e, void* data, void* grad) {
    grad_[id_of(e)] = grad;
    e.bind(data, grad);
  }
  void bind_outside_scope(ParamEntry& e) { bind(e, values_.values(e), values_.grads_outside(e)); }

  /// First touch of bucket k in this micro-step: storage ready, its Params' gradients bound to it
  /// (float-view Params stay bound to the view).
  template <class G>
  void open_bucket(G& g, std::size_t k, bool first_micro_step) {
    g.open(k, first_micro_step);
    if (!values_.binds_bucket_grads(g)) return;
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
  Groups* groups_;
  std::vector<char> opened_, done_;               // [parameter] this micro-step
  std::vector<void*> grad_;                       // [parameter] the gradient pointer it is bound with
  typename Ops::template Buffer<float> scratch_;  // [largest parameter] gradients written outside scopes
  std::size_t done_count_ = 0;
  Values values_;  // last: it binds through the members above
};

}  // namespace zerotk::engine
