#pragma once
/// \file zerotk/io/aio_options.hpp
/// AioOptions: how swap files are read and written (DeepSpeed's `aio` block; config/ fills it).
///
///   block_size            bytes per request; a transfer is split into requests of this size
///                         (a multiple of 4096: O_DIRECT needs aligned lengths and offsets)
///   queue_depth           requests in flight per submitting thread (io_uring: ring entries;
///                         pread/pwrite fallback: worker threads per submitting thread)
///   intra_op_parallelism  submitting threads (io_uring: one ring each); a transfer's requests
///                         are spread over them
///   single_submit         io_uring: one io_uring_submit per request instead of one per batch
///   overlap_events        io_uring: top the ring up as completions arrive instead of waiting for
///                         the whole batch before submitting the next
///   use_uring, use_direct zerotk extensions (no DeepSpeed keys): the I/O back end and O_DIRECT
///
/// check() validates them up front (config_error naming the key), so the I/O path has no checks.

#include <cstddef>
#include <cstdint>
#include <string>

#include "zerotk/core/error.hpp"

namespace zerotk::io {

/// The unit O_DIRECT transfers are aligned to (bytes): offsets, lengths and buffer addresses.
inline constexpr std::size_t kDirectAlign = 4096;
/// `bytes` rounded up to kDirectAlign: what an O_DIRECT file or buffer takes for them.
inline constexpr std::size_t direct_round(std::size_t bytes) noexcept {
  return (bytes + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
}

struct AioOptions {
  std::size_t block_size = std::size_t{1} << 20;
  int queue_depth = 8;
  int intra_op_parallelism = 1;
  bool single_submit = false;
  bool overlap_events = true;
  /// Use io_uring where the build has liburing and the kernel allows it; false forces the
  /// pread/pwrite thread pool (tests, comparisons).
  bool use_uring = true;
  /// Open swap files with O_DIRECT (past the page cache, as DeepSpeed's aio does) where the file
  /// system accepts it; false opens them buffered. A zerotk extension with no DeepSpeed key (set it
  /// in C++): for file systems whose O_DIRECT is refused or slow, and so that tests can run the
  /// buffered path on a disk that accepts O_DIRECT. SwapFile::direct() reports which path runs.
  bool use_direct = true;

  void check() const {
    if (block_size == 0 || block_size % kDirectAlign != 0 || block_size > (std::size_t{1} << 30)) {
      throw config_error("must be a positive multiple of 4096 bytes (O_DIRECT alignment), at most 1 GiB",
                         "aio.block_size", std::to_string(block_size));
    }
    if (queue_depth < 1 || queue_depth > 4096) {
      throw config_error("must be in [1, 4096]", "aio.queue_depth", std::to_string(queue_depth));
    }
    if (intra_op_parallelism < 1 || intra_op_parallelism > 64) {
      throw config_error("must be in [1, 64]", "aio.intra_op_parallelism", std::to_string(intra_op_parallelism));
    }
  }
};

}  // namespace zerotk::io
