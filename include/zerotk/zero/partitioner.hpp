#pragma once
/// \file zerotk/zero/partitioner.hpp
/// Partitioner<Stage<S>>: what a ZeRO stage partitions. The engine reads these constants; the flat
/// layout (zero/layout.hpp) does the arithmetic.

#include "zerotk/policies.hpp"

namespace zerotk {

template <class S>
struct Partitioner {
  static_assert(dependent_false<S>, "Partitioner: use Partitioner<Stage<0>>, <Stage<1>>, <Stage<2>> or <Stage<3>>");
};

template <int S>
struct Partitioner<Stage<S>> {
  using policy_kind = policy::partitioner;
  static constexpr int stage = S;
  /// Stage >= 1: each rank keeps the fp32 master and optimizer state of its partition only.
  static constexpr bool partitions_optimizer_state = S >= 1;
  /// Stage >= 2: each rank keeps only its partition of the reduced gradients.
  static constexpr bool partitions_gradients = S >= 2;
  /// Stage 3: parameters themselves are partitioned and gathered around each layer.
  static constexpr bool partitions_parameters = S >= 3;
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
