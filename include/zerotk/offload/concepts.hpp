#pragma once
/// \file zerotk/offload/concepts.hpp
/// StateStore: the contract of what an Offload tag selects (offload/store.hpp), the store of one
/// flat group's fp32 master and optimizer state (offload/resident.hpp documents each member). The
/// engine's flat group calls exactly these members. `check_state_store_v<S, T>` asserts them one
/// by one where the tag selects the store, so a store that lacks one fails with a first error line
/// naming the concept and the member (tests/compile_fail/concept_state_store.cpp).
///
/// Optional, declared rather than probed: `kCanDelayUpdate` (a store that steps from host memory
/// off the training thread, step_in_host(): the delayed parameter update), `kStateInHostMemory`
/// (master(), exp_avg(), exp_avg_sq() view the state itself).

#include <concepts>
#include <cstddef>
#include <span>
#include <vector>

#include "zerotk/core/memory.hpp"
#include "zerotk/kernels/tensor_list.hpp"
#include "zerotk/offload/options.hpp"
#include "zerotk/optim/optimizer.hpp"

namespace zerotk::offload {

namespace detail {
/// The reduction of per-tensor sums a step is given (LAMB's norms), as the checks call it.
struct ReduceArchetype {
  void operator()(double*, std::size_t) const {}
};
}  // namespace detail

/// `T`: the working-precision element type of the group the store serves.
template <class S, class T>
concept StateStore =
    requires(S& s, const S& cs, std::size_t i, std::span<const kernels::Segment> seg, const float* g32, const T* gt,
             T* out, float* f32, const OptimizerState& st, detail::ReduceArchetype reduce) {
      typename S::optimizer_type;
      typename S::space;
      { S::kStateInHostMemory } -> std::convertible_to<bool>;
      { S::kCanDelayUpdate } -> std::convertible_to<bool>;
      { cs.owned_numel() } -> std::convertible_to<std::size_t>;
      { cs.sub_groups() } -> std::convertible_to<std::size_t>;
      s.step(i, seg, g32, out, 1.0f, reduce);
      s.step(i, seg, gt, out, 1.0f, reduce);
      s.commit_step(seg, g32, out, 1.0f, reduce);
      s.abort_step(seg, out);
      { s.optimizer() } -> std::same_as<typename S::optimizer_type&>;
      { cs.optimizer() } -> std::same_as<const typename S::optimizer_type&>;
      s.master_from(gt, i, i);
      s.master_into(i, out, i);
      s.master_into_host(i, out, i);
      cs.master_to_host(f32);
      s.master_from_host(g32);
      { cs.optimizer_state() } -> std::same_as<OptimizerState>;
      s.load_optimizer_state(st);
    };

template <class S, class T>
consteval bool check_state_store() {
  static_assert(requires { typename S::optimizer_type; typename S::space; },
                "StateStore: missing the member types optimizer_type (its Optimizer<...>) or space (where it steps)");
  static_assert(requires { S::kStateInHostMemory; S::kCanDelayUpdate; },
                "StateStore: missing static constexpr bool kStateInHostMemory or kCanDelayUpdate");
  static_assert(requires(const S& s) { s.owned_numel(); }, "StateStore: missing owned_numel() const");
  static_assert(requires(const S& s) { s.sub_groups(); }, "StateStore: missing sub_groups() const");
  static_assert(requires(S& s, std::size_t i, std::span<const kernels::Segment> seg, const float* g, T* out,
                         detail::ReduceArchetype r) { s.step(i, seg, g, out, 1.0f, r); },
                "StateStore: missing step(std::size_t sub_group, segments, grads, out, float grad_scale, reduce)");
  static_assert(requires(S& s, std::span<const kernels::Segment> seg, const float* g, T* out,
                         detail::ReduceArchetype r) { s.commit_step(seg, g, out, 1.0f, r); },
                "StateStore: missing commit_step(segments, grads, out, float grad_scale, reduce&)");
  static_assert(requires(S& s, std::span<const kernels::Segment> seg, T* out) { s.abort_step(seg, out); },
                "StateStore: missing abort_step(segments, out)");
  static_assert(requires(S& s, const S& cs) { s.optimizer(); cs.optimizer(); },
                "StateStore: missing optimizer() (and its const overload)");
  static_assert(requires(S& s, const S& cs, const T* v, T* out, float* f, std::size_t n) {
                  s.master_from(v, n, n);
                  s.master_into(n, out, n);
                  s.master_into_host(n, out, n);
                  cs.master_to_host(f);
                  s.master_from_host(f);
                },
                "StateStore: missing master_from, master_into, master_into_host, master_to_host or "
                "master_from_host");
  static_assert(requires(S& s, const S& cs, const OptimizerState& st) {
                  cs.optimizer_state();
                  s.load_optimizer_state(st);
                },
                "StateStore: missing optimizer_state() const or load_optimizer_state(const OptimizerState&)");
  static_assert(StateStore<S, T>, "StateStore: a member has the wrong signature (see offload/concepts.hpp)");
  return true;
}
template <class S, class T>
inline constexpr bool check_state_store_v = check_state_store<S, T>();

}  // namespace zerotk::offload
