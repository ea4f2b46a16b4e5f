#pragma once
// zerotk/comm/detail/checks.hpp (internal)
// Argument checks every back end runs before it starts an operation (check before launch): they
// are local to the calling rank, so they throw usage_error at once instead of failing a collective.

#include <cstddef>
#include <span>
#include <string>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/core/error.hpp"

namespace zerotk::comm::detail {

// "all_reduce on rank 3 of 4": the `where` of a usage error.
inline std::string op_site(OpKind kind, int rank, int size) {
  return std::string(to_string(kind)) + " on rank " + std::to_string(rank) + " of " + std::to_string(size);
}

// avg is not defined for uint8 (the mean of bytes has no useful rounding); every other pair is.
inline void check_reduce(OpKind kind, DType dt, ReduceOp op, int rank, int size) {
  if (dt == DType::uint8 && op == ReduceOp::avg) {
    throw usage_error("avg is not defined for uint8 (use sum and divide)", op_site(kind, rank, size), "uint8 avg");
  }
}

inline void check_buffer(OpKind kind, const void* p, std::size_t count, const char* name, int rank, int size) {
  if (p == nullptr && count > 0) {
    throw usage_error(std::string(name) + " is null but count > 0", op_site(kind, rank, size), std::to_string(count));
  }
}

inline void check_peer(OpKind kind, int peer, const char* what, int rank, int size) {
  if (peer < 0 || peer >= size) {
    throw usage_error(std::string(what) + " must be in [0, size)", op_site(kind, rank, size), std::to_string(peer));
  }
}

inline void check_tag(OpKind kind, int tag, int rank, int size) {
  if (tag < 0) throw usage_error("tag must be >= 0", op_site(kind, rank, size), std::to_string(tag));
}

inline void check_counts(std::span<const std::size_t> counts, std::size_t send_count, int rank, int size) {
  if (counts.size() != static_cast<std::size_t>(size)) {
    throw usage_error("recv_counts must have one entry per rank", op_site(OpKind::all_gatherv, rank, size),
                      std::to_string(counts.size()));
  }
  if (counts[static_cast<std::size_t>(rank)] != send_count) {
    throw usage_error("send_count must equal recv_counts[rank]", op_site(OpKind::all_gatherv, rank, size),
                      std::to_string(send_count) + " vs " + std::to_string(counts[static_cast<std::size_t>(rank)]));
  }
}

inline void check_color(int color, int rank, int size) {
  if (color < 0) {
    throw usage_error("split color must be >= 0", "split on rank " + std::to_string(rank) + " of " + std::to_string(size),
                      std::to_string(color));
  }
}

// all_to_all cannot run in place: blocks move between ranks and would overwrite unsent data.
inline void check_not_in_place(OpKind kind, const void* send, const void* recv, std::size_t count, int rank,
                               int size) {
  if (send == recv && count > 0 && size > 1) {
    throw usage_error("send and recv must not be the same buffer", op_site(kind, rank, size));
  }
}

}  // namespace zerotk::comm::detail
