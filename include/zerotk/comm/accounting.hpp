#pragma once
/// \file zerotk/comm/accounting.hpp
/// The byte-counter conventions of communicator.hpp as functions, shared by every back end so that
/// threads, MPI and NCCL count identically (and tests can compute expected volumes the same way).
///
/// Units: bytes. `world` is the communicator's size. A world of one rank sends nothing, so every
/// wire count is 0 there.

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>

#include "zerotk/comm/communicator.hpp"

namespace zerotk::comm {

/// Bytes a bandwidth-optimal (ring) algorithm sends from one rank for an operation whose logical
/// buffer is `payload_bytes` (see OpCounters). For all_gatherv use `all_gatherv_wire_bytes`.
constexpr std::uint64_t ring_wire_bytes(OpKind kind, std::uint64_t payload_bytes, int world) noexcept {
  if (world <= 1) return 0;
  const auto w = static_cast<std::uint64_t>(world);
  switch (kind) {
    case OpKind::all_reduce: return payload_bytes * 2 * (w - 1) / w;
    case OpKind::reduce_scatter:
    case OpKind::all_gather:
    case OpKind::all_gatherv:
    case OpKind::all_to_all: return payload_bytes * (w - 1) / w;
    case OpKind::all_to_all_v: return payload_bytes;  // an upper bound: use all_to_all_v_wire_bytes
    case OpKind::broadcast:
    case OpKind::reduce:
    case OpKind::send: return payload_bytes;
    case OpKind::recv:
    case OpKind::barrier: return 0;
  }
  return 0;
}

/// all_gatherv in a ring: rank r forwards every block except the one of rank r+1 (which that rank
/// already holds), so it sends `total - counts[(r+1) % W]` elements. Equal counts give (W-1)/W.
inline std::uint64_t all_gatherv_wire_bytes(std::span<const std::size_t> counts, int rank,
                                            std::size_t elem_bytes) noexcept {
  const auto w = counts.size();
  if (w <= 1) return 0;
  const std::uint64_t total = std::accumulate(counts.begin(), counts.end(), std::uint64_t{0});
  return (total - counts[(static_cast<std::size_t>(rank) + 1) % w]) * elem_bytes;
}

/// all_to_all_v: every block but the rank's own goes over the wire.
inline std::uint64_t all_to_all_v_wire_bytes(std::span<const std::size_t> send_counts, int rank,
                                             std::size_t elem_bytes) noexcept {
  std::uint64_t sent = 0;
  for (std::size_t d = 0; d < send_counts.size(); ++d) {
    if (d != static_cast<std::size_t>(rank)) sent += send_counts[d];
  }
  return sent * elem_bytes;
}

namespace detail {

/// Adds one call to the counters of `kind`.
inline void record(CommStats& stats, OpKind kind, std::uint64_t payload_bytes, std::uint64_t wire_bytes) noexcept {
  auto& c = stats[kind];
  c.calls += 1;
  c.payload_bytes += payload_bytes;
  c.wire_bytes += wire_bytes;
}

/// Records an operation whose wire bytes follow `ring_wire_bytes`.
inline void record_ring(CommStats& stats, OpKind kind, std::uint64_t payload_bytes, int world) noexcept {
  record(stats, kind, payload_bytes, ring_wire_bytes(kind, payload_bytes, world));
}

}  // namespace detail
}  // namespace zerotk::comm
