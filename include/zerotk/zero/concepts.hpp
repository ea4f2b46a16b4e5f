#pragma once
/// \file zerotk/zero/concepts.hpp
/// The contracts of ZeRO's parts as concepts: a gradient path (zero/grads/), a parameter path
/// (zero/params/) and stage 3's shard home (zero/params/compute_shard.hpp). The engine's flat group
/// (engine/group.hpp) calls exactly these members and probes for nothing else.
///
/// Each concept has a check, `check_<concept>_v<T>`, which the place that selects the type by a tag
/// instantiates (zero/partitioner.hpp's paths in engine/group.hpp, offload::ShardHomeOf). It
/// asserts the members one by one, so a part that lacks one fails to compile with a first error
/// line that names the concept and the member ("GradientPath: missing owned() ..."), not with a
/// page of substitution failures (tests/compile_fail/concept_*.cpp).

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

#include "zerotk/core/memory.hpp"
#include "zerotk/zero/grads/context.hpp"
#include "zerotk/zero/grads/uncompressed.hpp"
#include "zerotk/zero/layout.hpp"
#include "zerotk/zero/params/optimizer_out.hpp"

namespace zerotk::zero {

namespace detail {
/// What every parameter path's publish() and on_residency() are called with in the checks.
struct BucketCallbackArchetype {
  void operator()(std::size_t) const {}
};
}  // namespace detail

// ---- GradientPath ---------------------------------------------------------------------------------

/// A gradient path owns one flat group's gradient storage and its reductions (zero/grads/context.hpp
/// documents each member). The compressed-communication members (error feedback, bytes) are part
/// of every path: the uncompressed ones inherit zero::Uncompressed's empty ones.
template <class G>
concept GradientPath = requires(G& g, const G& cg, std::size_t k, bool flag, std::span<const float> errors) {
  typename G::value_type;
  g.open(k, flag);
  { g.bucket_grads(k) } -> std::same_as<typename G::value_type*>;
  g.ready(k);
  g.end_micro_step(flag);
  { cg.owned() } -> std::same_as<OwnedGrads<typename G::value_type>>;
  g.clear_accumulated();
  { g.drain_quietly() } noexcept;
  g.reset();
  { cg.error_feedback() } -> std::convertible_to<std::span<const float>>;
  g.load_error_feedback(errors);
  { cg.wire_bytes() } -> std::convertible_to<std::uint64_t>;
  { cg.dense_bytes() } -> std::convertible_to<std::uint64_t>;
};

template <class G>
consteval bool check_gradient_path() {
  static_assert(requires { typename G::value_type; }, "GradientPath: missing the member type value_type (the gradient element type)");
  static_assert(requires(G& g, std::size_t k, bool b) { g.open(k, b); }, "GradientPath: missing open(std::size_t bucket, bool first_micro_step)");
  static_assert(requires(G& g, std::size_t k) { g.bucket_grads(k); }, "GradientPath: missing bucket_grads(std::size_t bucket)");
  static_assert(requires(G& g, std::size_t k) { g.ready(k); }, "GradientPath: missing ready(std::size_t bucket)");
  static_assert(requires(G& g, bool b) { g.end_micro_step(b); }, "GradientPath: missing end_micro_step(bool boundary)");
  static_assert(requires(const G& g) { g.owned(); }, "GradientPath: missing owned() const");
  static_assert(requires(G& g) { g.clear_accumulated(); }, "GradientPath: missing clear_accumulated()");
  static_assert(requires(G& g) { { g.drain_quietly() } noexcept; }, "GradientPath: missing drain_quietly() noexcept");
  static_assert(requires(G& g) { g.reset(); }, "GradientPath: missing reset() (derive from zero::Uncompressed when there is nothing to reset)");
  static_assert(requires(const G& g) { g.error_feedback(); }, "GradientPath: missing error_feedback() const (zero::Uncompressed has an empty one)");
  static_assert(requires(G& g, std::span<const float> e) { g.load_error_feedback(e); }, "GradientPath: missing load_error_feedback(std::span<const float>)");
  static_assert(requires(const G& g) { g.wire_bytes(); g.dense_bytes(); }, "GradientPath: missing wire_bytes() const or dense_bytes() const (zero::Uncompressed has both)");
  static_assert(GradientPath<G>, "GradientPath: a member has the wrong signature (see zero/concepts.hpp)");
  return true;
}
template <class G>
inline constexpr bool check_gradient_path_v = check_gradient_path<G>();

// ---- ParamPath --------------------------------------------------------------------------------------

/// A parameter path owns where one flat group's working-precision values live
/// (zero/params/replicated.hpp documents each member). Resident paths (stages 0-2) also give the
/// flat buffer; fetched ones (stage 3) gather buckets on demand.
template <class P>
concept ParamPath = requires(P& p, const P& cp, std::size_t k, detail::BucketCallbackArchetype on_bucket) {
  typename P::value_type;
  typename P::Options;
  { P::kResident } -> std::convertible_to<bool>;
  { p.values(k) } -> std::same_as<typename P::value_type*>;
  p.optimizer_out();
  p.publish(on_bucket);
  p.wait(k);
  p.synchronize();
  { cp.pending() } -> std::convertible_to<std::size_t>;
  { p.drain_quietly() } noexcept;
  p.commit_update();
  p.abort_update();
};

template <class P>
concept ResidentParamPath = ParamPath<P> && P::kResident && requires(P& p) {
  { p.params() } -> std::same_as<typename P::value_type*>;
};

template <class P>
concept FetchedParamPath = ParamPath<P> && !P::kResident && requires(P& p, const P& cp, std::size_t k) {
  p.fetch(k);
  p.acquire(k);
  p.release(k);
  p.evict(k);
  { cp.resident(k) } -> std::convertible_to<bool>;
  { cp.persistent(k) } -> std::convertible_to<bool>;
  cp.home();
};

template <class P>
consteval bool check_param_path() {
  static_assert(requires { typename P::value_type; }, "ParamPath: missing the member type value_type (the parameter element type)");
  static_assert(requires { typename P::Options; }, "ParamPath: missing the member type Options (what it is built with: zero::ParamPathOptions<...>)");
  static_assert(requires { P::kResident; }, "ParamPath: missing static constexpr bool kResident");
  static_assert(requires(P& p, std::size_t k) { p.values(k); }, "ParamPath: missing values(std::size_t bucket)");
  static_assert(requires(P& p) { p.optimizer_out(); }, "ParamPath: missing optimizer_out()");
  static_assert(requires(P& p, detail::BucketCallbackArchetype f) { p.publish(f); }, "ParamPath: missing publish(on_bucket)");
  static_assert(requires(P& p, std::size_t k) { p.wait(k); p.synchronize(); }, "ParamPath: missing wait(std::size_t bucket) or synchronize()");
  static_assert(requires(const P& p) { p.pending(); }, "ParamPath: missing pending() const");
  static_assert(requires(P& p) { { p.drain_quietly() } noexcept; }, "ParamPath: missing drain_quietly() noexcept");
  static_assert(requires(P& p) { p.commit_update(); p.abort_update(); }, "ParamPath: missing commit_update() or abort_update() (no-ops where the output is plain memory)");
  static_assert(ParamPath<P>, "ParamPath: a member has the wrong signature (see zero/concepts.hpp)");
  static_assert(!P::kResident || ResidentParamPath<P>, "ParamPath: a resident path (kResident) is missing params(), the flat buffer the Params are bound into");
  static_assert(P::kResident || FetchedParamPath<P>, "ParamPath: a fetched path (!kResident) is missing fetch, acquire, release, evict, resident, persistent or home");
  return true;
}
template <class P>
inline constexpr bool check_param_path_v = check_param_path<P>();

/// Stage 2's named alias (DESIGN.md, decisions): the gradient path's reduced partition is also the
/// parameter path's all-gather source after the update, so the group hands one to the other and
/// a bucket's next reduction waits for its gather.
template <class G, class P>
concept SharedGatherSource = requires(G& g, P& p) { p.set_partition_source(g.gather_source()); };

// ---- ShardHome --------------------------------------------------------------------------------------

/// Where stage 3 keeps this rank's shard (zero/params/compute_shard.hpp documents the members):
/// addressable (data()) or swapped (read/write by block, a writer for the optimizer's output).
template <class H, class T, class Ops>
concept ShardHome = std::constructible_from<H, Ops&, const BucketLayout&, int, MemoryLedger*, const typename H::Options&> &&
                    requires(H& h, Ops& ops, std::size_t k, T* slot) {
                      typename H::Options;
                      { h.gather_source(ops, k, slot) } -> std::convertible_to<const T*>;
                    };

template <class H, class T, class Ops>
consteval bool check_shard_home() {
  static_assert(requires { typename H::Options; }, "ShardHome: missing the member type Options (zero::NoHomeOptions when it takes none)");
  static_assert(std::constructible_from<H, Ops&, const BucketLayout&, int, MemoryLedger*, const typename H::Options&>,
                "ShardHome: missing the constructor (Ops&, const BucketLayout&, int rank, MemoryLedger*, const Options&)");
  static_assert(requires(H& h, Ops& ops, std::size_t k, T* slot) { h.gather_source(ops, k, slot); },
                "ShardHome: missing gather_source(Ops&, std::size_t bucket, T* slot)");
  static_assert(ShardHome<H, T, Ops>, "ShardHome: a member has the wrong signature (see zero/concepts.hpp)");
  return true;
}
template <class H, class T, class Ops>
inline constexpr bool check_shard_home_v = check_shard_home<H, T, Ops>();

}  // namespace zerotk::zero
