#pragma once
// zerotk/comm/detail/checks.hpp (internal)
// Argument checks every back end runs before it starts an operation (check before launch): they
// are local to the calling rank, so they throw usage_error at once instead of failing a collective.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

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

// all_to_all_v's local checks: one count per rank on both sides, and the block a rank keeps agrees
// with itself. Returns the elements sent and received.
struct VCounts {
  std::size_t sent = 0, received = 0;
};
inline VCounts check_v_counts(std::span<const std::size_t> send_counts, std::span<const std::size_t> recv_counts,
                              int rank, int size) {
  constexpr OpKind k = OpKind::all_to_all_v;
  const auto w = static_cast<std::size_t>(size);
  if (send_counts.size() != w) {
    throw usage_error("send_counts must have one entry per rank", op_site(k, rank, size),
                      std::to_string(send_counts.size()));
  }
  if (recv_counts.size() != w) {
    throw usage_error("recv_counts must have one entry per rank", op_site(k, rank, size),
                      std::to_string(recv_counts.size()));
  }
  const auto me = static_cast<std::size_t>(rank);
  if (send_counts[me] != recv_counts[me]) {
    throw usage_error("send_counts[rank] must equal recv_counts[rank] (the block a rank sends itself)",
                      op_site(k, rank, size),
                      std::to_string(send_counts[me]) + " vs " + std::to_string(recv_counts[me]));
  }
  VCounts v;
  for (std::size_t r = 0; r < w; ++r) v.sent += send_counts[r], v.received += recv_counts[r];
  return v;
}

// What each rank contributes to all_to_all_v's agreement: its send_counts, then its recv_counts.
inline std::vector<std::uint64_t> v_count_row(std::span<const std::size_t> send_counts,
                                             std::span<const std::size_t> recv_counts) {
  std::vector<std::uint64_t> row(send_counts.begin(), send_counts.end());
  row.insert(row.end(), recv_counts.begin(), recv_counts.end());
  return row;
}

// Two ranks whose all_to_all_v counts disagree: `sender` sends `sent` elements to `receiver`, which
// expects `expected` from it.
struct CountDisagreement {
  int sender = 0, receiver = 0;
  std::uint64_t sent = 0, expected = 0;
};

// `rows`: every rank's v_count_row, rank after rank (2 * size values each). The first disagreeing
// pair in (sender, receiver) order, so every rank that checks the same rows names the same pair.
inline std::optional<CountDisagreement> find_count_disagreement(std::span<const std::uint64_t> rows, int size) {
  const auto w = static_cast<std::size_t>(size);
  for (std::size_t s = 0; s < w; ++s) {
    for (std::size_t d = 0; d < w; ++d) {
      const std::uint64_t sent = rows[s * 2 * w + d], expected = rows[d * 2 * w + w + s];
      if (sent != expected) return CountDisagreement{static_cast<int>(s), static_cast<int>(d), sent, expected};
    }
  }
  return std::nullopt;
}

// "rank 1 sends 5 elements to rank 3, which expects 4 from it" (group ranks; the caller's `where`
// names them in the world).
inline std::string describe(const CountDisagreement& x) {
  return "all_to_all_v counts disagree: rank " + std::to_string(x.sender) + " sends " + std::to_string(x.sent) +
         " elements to rank " + std::to_string(x.receiver) + ", which expects " + std::to_string(x.expected) +
         " from it";
}

}  // namespace zerotk::comm::detail
