#pragma once
/// \file zerotk/zero/collectives.hpp
/// How the paths' bucket collectives travel, chosen once when the engine is built: a small closed
/// variant per collective, so a path calls one member and never tests what it was given.
///
///   GradientReduceScatter  the gradient path's average reduce-scatter of a bucket (stages 2, 3):
///                          plain (the communicator's own) or qgZ's int4 one through the
///                          topology's levels (compress::QuantizedReduceScatter)
///   WeightGather           the parameter path's all-gather of a bucket from the primary shards
///                          (stage 3): plain, or qwZ's int8 one (compress::quantized_all_gather)
///
/// Hierarchical collectives are not a third form: the data group's communicator itself is
/// hierarchical when the topology asks (engine/comms.hpp), so "plain" runs through the levels.
/// ZeRO++'s rules (stage 3 only, host memory only) are rows of the engine's run-time checker
/// (engine/checks.hpp). The concepts below say what a strategy provides; the paths static_assert them.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/compress/quantized_collectives.hpp"
#include "zerotk/core/dtype.hpp"

namespace zerotk::zero {

/// What the gradient path asks of its reduce-scatter strategy.
template <class S, class Comm>
concept GradientReduceScatterStrategy = requires(const S& s, Comm& comm, const float* send, float* recv, std::size_t n) {
  { s.reduce_scatter_avg(comm, send, recv, n) } -> std::same_as<comm::Work>;
  { s.quantized() } -> std::convertible_to<bool>;
};

/// What the parameter path asks of its gather strategy.
template <class S, class Comm>
concept WeightGatherStrategy =
    requires(const S& s, Comm& comm, const float* send, float* out, std::size_t n, std::vector<std::uint8_t>& scratch) {
      { s.all_gather(comm, send, out, n, scratch) } -> std::same_as<comm::Work>;
      { s.quantized() } -> std::convertible_to<bool>;
    };

/// The gradient path's average reduce-scatter: the communicator's (default), or qgZ's.
template <class Comm>
class GradientReduceScatter {
 public:
  using Quantized = compress::QuantizedReduceScatter<Comm>;
  /// Plain: `comm.reduce_scatter(..., avg)`.
  GradientReduceScatter() = default;
  /// qgZ: int4 through the topology's levels (the object outlives the path: engine/comms.hpp).
  static GradientReduceScatter quantized_by(Quantized& q) noexcept {
    GradientReduceScatter s;
    s.q_ = &q;
    return s;
  }
  bool quantized() const noexcept { return q_ != nullptr; }
  /// recv[0..n) = the average over the group of every rank's n elements at send + rank * n.
  template <class T>
  comm::Work reduce_scatter_avg(Comm& comm, const T* send, T* recv, std::size_t n) const {
    if (q_ != nullptr) return q_->reduce_scatter_avg(send, recv, n);
    return comm.reduce_scatter(send, recv, n, dtype_of_v<T>, comm::ReduceOp::avg);
  }

 private:
  Quantized* q_ = nullptr;
};

/// The parameter path's all-gather of a bucket from the primary shards: the communicator's
/// (default), or qwZ's (int8 records; every block dequantized, this rank's own too; complete on return).
class WeightGather {
 public:
  /// Plain: `comm.all_gather`.
  WeightGather() = default;
  /// qwZ, counting its calls and bytes into `stats` (which outlives the path: engine/comms.hpp).
  static WeightGather quantized_into(compress::QuantizedStats& stats) noexcept {
    WeightGather g;
    g.stats_ = &stats;
    return g;
  }
  bool quantized() const noexcept { return stats_ != nullptr; }
  /// out[r * n, (r + 1) * n) = rank r's send[0..n); `scratch` holds qwZ's records between calls.
  template <class Comm, class T>
  comm::Work all_gather(Comm& comm, const T* send, T* out, std::size_t n, std::vector<std::uint8_t>& scratch) const {
    if (stats_ != nullptr) return compress::quantized_all_gather(comm, send, out, n, scratch, stats_);
    return comm.all_gather(send, out, n, dtype_of_v<T>);
  }

 private:
  compress::QuantizedStats* stats_ = nullptr;
};

}  // namespace zerotk::zero
