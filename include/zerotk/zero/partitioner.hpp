#pragma once
/// \file zerotk/zero/partitioner.hpp
/// Partitioner<Stage<S>, When>: a ZeRO stage as the parts that implement it. The tag selects types;
/// the engine never branches on the stage number:
///
///   stage  gradient path (zero/grads/)              parameter path (zero/params/)   state partitioned
///   0      FlatAllReduce<When>       all-reduce     Replicated                       no
///   1      BlockReduceScatter<When>  in place       BucketGather (in place)          yes
///   2      PooledBuckets             pool + part.   BucketGather (from the partition) yes
///   3      PooledBuckets             pool + part.   FetchOnDemand (shards, gathered  yes
///                                                   per layer: engine/fetch_sharded.hpp)
///
/// What a rank owns of each group (its optimizer's elements) is `ownership` (zero/ownership.hpp):
/// everything at stage 0, block r of every bucket at stages 1-3.
///
/// `When` (policies.hpp, when::) is when gradients are reduced under accumulation: stages 0 and 1
/// default to at_boundary (DeepSpeed's order), stage 2 always reduces every micro-step. Every stage
/// uses the bucket layout (zero/layout.hpp): the same buckets and blocks, so the same elements meet
/// the same reductions in every stage. Stage 3's buckets never span two fetch units (a model's
/// sub-modules, or single parameters), so a layer gathers exactly its own buckets.

#include <type_traits>

#include "zerotk/policies.hpp"
#include "zerotk/zero/grads/block_reduce_scatter.hpp"
#include "zerotk/zero/grads/flat_all_reduce.hpp"
#include "zerotk/zero/grads/pooled_buckets.hpp"
#include "zerotk/zero/layout.hpp"
#include "zerotk/zero/ownership.hpp"
#include "zerotk/zero/params/bucket_gather.hpp"
#include "zerotk/zero/params/fetch_on_demand.hpp"
#include "zerotk/zero/params/replicated.hpp"

namespace zerotk {

namespace detail {
template <class S>
struct default_when {
  using type = when::at_boundary;
};
template <>
struct default_when<Stage<2>> {
  using type = when::every_micro_step;
};
template <>
struct default_when<Stage<3>> {
  using type = when::every_micro_step;
};
template <class W>
inline constexpr bool is_when_v = std::is_same_v<W, when::at_boundary> || std::is_same_v<W, when::every_micro_step>;
}  // namespace detail

template <class S, class When = typename detail::default_when<S>::type>
struct Partitioner {
  static_assert(dependent_false<S>, "Partitioner: use Partitioner<Stage<0>>, <Stage<1>>, <Stage<2>> or <Stage<3>>");
};

template <class When>
struct Partitioner<Stage<0>, When> {
  static_assert(detail::is_when_v<When>, "Partitioner<Stage<0>, When>: When is when::at_boundary or when::every_micro_step");
  using policy_kind = policy::partitioner;
  using when = When;
  static constexpr int stage = 0;
  static constexpr bool partitions_optimizer_state = false;
  static constexpr bool partitions_gradients = false;
  static constexpr bool partitions_parameters = false;
  using layout = zero::BucketLayout;
  using ownership = zero::OwnsAll;
  template <class T, class Ops>
  using grads = zero::FlatAllReduce<T, Ops, When>;
  template <class T, class Ops>
  using params = zero::Replicated<T, Ops>;
};

template <class When>
struct Partitioner<Stage<1>, When> {
  static_assert(detail::is_when_v<When>, "Partitioner<Stage<1>, When>: When is when::at_boundary or when::every_micro_step");
  using policy_kind = policy::partitioner;
  using when = When;
  static constexpr int stage = 1;
  static constexpr bool partitions_optimizer_state = true;
  static constexpr bool partitions_gradients = false;
  static constexpr bool partitions_parameters = false;
  using layout = zero::BucketLayout;
  using ownership = zero::OwnsBlocks;
  template <class T, class Ops>
  using grads = zero::BlockReduceScatter<T, Ops, When>;
  template <class T, class Ops>
  using params = zero::BucketGather<T, Ops>;
};

template <class When>
struct Partitioner<Stage<2>, When> {
  static_assert(std::is_same_v<When, when::every_micro_step>,
                "Partitioner<Stage<2>>: stage 2 keeps only its partition of the gradients, so it reduces every "
                "micro-step; when::at_boundary is for stages 0 and 1");
  using policy_kind = policy::partitioner;
  using when = When;
  static constexpr int stage = 2;
  static constexpr bool partitions_optimizer_state = true;
  static constexpr bool partitions_gradients = true;
  static constexpr bool partitions_parameters = false;
  using layout = zero::BucketLayout;
  using ownership = zero::OwnsBlocks;
  template <class T, class Ops>
  using grads = zero::PooledBuckets<T, Ops>;
  template <class T, class Ops>
  using params = zero::BucketGather<T, Ops>;
};

template <class When>
struct Partitioner<Stage<3>, When> {
  static_assert(std::is_same_v<When, when::every_micro_step>,
                "Partitioner<Stage<3>>: stage 3 keeps only its partition of the gradients, so it reduces every "
                "micro-step; when::at_boundary is for stages 0 and 1");
  using policy_kind = policy::partitioner;
  using when = When;
  static constexpr int stage = 3;
  static constexpr bool partitions_optimizer_state = true;
  static constexpr bool partitions_gradients = true;
  static constexpr bool partitions_parameters = true;
  using layout = zero::BucketLayout;
  using ownership = zero::OwnsBlocks;
  template <class T, class Ops>
  using grads = zero::PooledBuckets<T, Ops>;
  /// `Home`: where the shards live (zero/params/compute_shard.hpp; OffloadParams<Cpu> gives
  /// offload/pinned_shard.hpp's). Stages 0-2 have no shards and take two arguments.
  template <class T, class Ops, class Home = zero::ComputeShard<T, Ops>>
  using params = zero::FetchOnDemand<T, Ops, Home>;
};

/// Bucketer<Bytes<N>>: gradient buckets of N bytes (of the working precision). Overridable at run
/// time (EngineOptions::bucket_bytes, or the JSON key reduce_bucket_size which counts ELEMENTS).
template <class B>
struct Bucketer {
  static_assert(dependent_false<B>, "Bucketer: use Bucketer<Bytes<N>>");
};

template <std::size_t N>
struct Bucketer<Bytes<N>> {
  static_assert(N > 0, "Bucketer<Bytes<N>>: N must be > 0");
  using policy_kind = policy::bucketer;
  static constexpr std::size_t bytes = N;
};

}  // namespace zerotk
