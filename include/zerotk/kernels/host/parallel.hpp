#pragma once
/// \file zerotk/kernels/host/parallel.hpp
/// How host drivers split work over OpenMP threads. One parallel region per call, whatever the number
/// of tensors: the elements of all tensors are laid end to end and cut into one contiguous share per
/// thread, so 10,000 small tensors cost one fork/join, and one large tensor is split evenly.
///
/// Elementwise ops use `for_each_piece` (shares cut anywhere on a 64-element grain; `for_each_share`
/// for one buffer). Reductions use `for_each_block`: every tensor is cut into fixed blocks of kSumBlock
/// elements, each block's partial result lands in its own slot, and slots are combined in order
/// afterwards. Results therefore do not depend on the number of threads. Passes that keep one result
/// per share and combine them in share order (top-k's histograms) use `for_each_share_indexed`, whose
/// caller fixes the share count. A team smaller than asked for (OMP_THREAD_LIMIT) still covers every
/// element: the shares follow the threads the region got.
///
/// The thread count is OpenMP's (`OMP_NUM_THREADS`, or `omp_set_num_threads` on the calling thread;
/// a rank thread of the threads communicator can set its own). Without OpenMP everything runs on the
/// calling thread. The callbacks must not throw.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "zerotk/core/macros.hpp"
#include "zerotk/kernels/tensor_list.hpp"

#if ZEROTK_HAS_OPENMP
#include <omp.h>
#endif

namespace zerotk::kernels::host {

/// Below this many elements a call stays on the calling thread (a fork/join costs microseconds).
inline constexpr std::size_t kParallelMinElements = std::size_t{1} << 15;
/// Share boundaries fall on multiples of this many elements of the concatenated index (64 fp32 =
/// 4 cache lines), so neighbouring threads never write the same cache line of an aligned buffer.
inline constexpr std::size_t kShareGrain = 64;
/// Block length of deterministic reductions (elements).
inline constexpr std::size_t kSumBlock = std::size_t{1} << 14;

/// Threads a parallel region would use now.
inline int max_threads() noexcept {
#if ZEROTK_HAS_OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

namespace detail {

inline int threads_for(std::size_t total) noexcept {
  const int t = max_threads();
  const std::size_t useful = total / kParallelMinElements;
  if (useful <= 1 || t <= 1) return 1;
  return useful < static_cast<std::size_t>(t) ? static_cast<int>(useful) : t;
}

/// First element of thread `tid`'s share of `total` elements (grain-aligned; the last share ends at total).
inline std::size_t share_begin(std::size_t total, int threads, int tid) noexcept {
  if (tid >= threads) return total;
  const std::size_t grains = (total + kShareGrain - 1) / kShareGrain;
  const std::size_t g = grains / static_cast<std::size_t>(threads) * static_cast<std::size_t>(tid) +
                        std::min<std::size_t>(static_cast<std::size_t>(tid), grains % static_cast<std::size_t>(threads));
  return std::min(total, g * kShareGrain);
}

/// Walks the pieces of [lo, hi) of the concatenation described by `prefix` (prefix[i] = first element of
/// item i, prefix.back() = total): fn(item, begin, end) with offsets relative to the item.
template <class Fn>
void walk(const std::vector<std::size_t>& prefix, std::size_t lo, std::size_t hi, Fn& fn) {
  if (lo >= hi) return;
  std::size_t item = static_cast<std::size_t>(std::upper_bound(prefix.begin(), prefix.end(), lo) - prefix.begin()) - 1;
  const std::size_t items = prefix.size() - 1;
  for (; item < items && prefix[item] < hi; ++item) {
    const std::size_t b = std::max(lo, prefix[item]) - prefix[item];
    const std::size_t e = std::min(hi, prefix[item + 1]) - prefix[item];
    if (e > b) fn(item, b, e);
  }
}

}  // namespace detail

/// Calls fn(tensor, begin, end) over all elements of `count` tensors of sizes numel_of(i), in parallel,
/// each element exactly once. Pieces handed to one call are contiguous within one tensor.
template <class NumelOf, class Fn>
void for_each_piece(std::size_t count, NumelOf&& numel_of, Fn&& fn) {
  if (count == 0) return;
  if (count == 1) {  // the common large-buffer case: no table
    const std::size_t n = numel_of(std::size_t{0});
    const int threads = detail::threads_for(n);
    if (threads == 1) {
      if (n > 0) fn(std::size_t{0}, std::size_t{0}, n);
      return;
    }
#if ZEROTK_HAS_OPENMP
#pragma omp parallel num_threads(threads)
    {
      const int tid = omp_get_thread_num(), got = omp_get_num_threads();  // got < threads under a thread limit
      const std::size_t b = detail::share_begin(n, got, tid), e = detail::share_begin(n, got, tid + 1);
      if (e > b) fn(std::size_t{0}, b, e);
    }
#endif
    return;
  }
  std::vector<std::size_t> prefix(count + 1);
  prefix[0] = 0;
  for (std::size_t i = 0; i < count; ++i) prefix[i + 1] = prefix[i] + numel_of(i);
  const std::size_t total = prefix[count];
  const int threads = detail::threads_for(total);
  if (threads == 1) {
    detail::walk(prefix, 0, total, fn);
    return;
  }
#if ZEROTK_HAS_OPENMP
#pragma omp parallel num_threads(threads)
  {
    const int tid = omp_get_thread_num(), got = omp_get_num_threads();
    detail::walk(prefix, detail::share_begin(total, got, tid), detail::share_begin(total, got, tid + 1), fn);
  }
#endif
}

/// fn(begin, end) over the elements [0, n) of one buffer, in parallel: for_each_piece of one tensor.
template <class Fn>
void for_each_share(std::size_t n, Fn&& fn) {
  for_each_piece(1, [n](std::size_t) { return n; }, [&](std::size_t, std::size_t b, std::size_t e) { fn(b, e); });
}

/// How many shares for_each_share_indexed should cut `n` elements into now: one per thread worth
/// forking (1 below kParallelMinElements, or without OpenMP).
inline int share_count(std::size_t n) noexcept { return detail::threads_for(n); }

/// fn(share, begin, end) for every share = 0 .. shares - 1, in parallel: [begin, end) is that share's
/// contiguous part of [0, n), its boundaries multiples of kShareGrain (a share may be empty). For
/// passes that keep a result per share (a histogram, a count) and combine them in share order
/// afterwards: with `shares` taken once from share_count(n), every pass of a call cuts the same shares.
template <class Fn>
void for_each_share_indexed(std::size_t n, int shares, Fn&& fn) {
  if (shares <= 1) {
    fn(0, std::size_t{0}, n);
    return;
  }
#if ZEROTK_HAS_OPENMP
#pragma omp parallel for num_threads(shares) schedule(static, 1)
#endif
  for (int s = 0; s < shares; ++s) fn(s, detail::share_begin(n, shares, s), detail::share_begin(n, shares, s + 1));
}

/// for_each_piece over the segments of a flat buffer: fn(segment, begin, end) with [begin, end) a
/// piece of that segment's elements (offsets within it).
template <class Fn>
void for_each_segment_piece(std::span<const Segment> segments, Fn&& fn) {
  for_each_piece(
      segments.size(), [&](std::size_t i) { return segments[i].numel; },
      [&](std::size_t i, std::size_t b, std::size_t e) { fn(segments[i], b, e); });
}

/// A fixed block of one tensor, for deterministic reductions.
struct Block {
  std::size_t tensor, begin, end;
};

/// The blocks of `count` tensors: each tensor cut into kSumBlock-element blocks in order (a tensor of
/// 0 elements has none). `first[i]` is the index of tensor i's first block; first[count] = total blocks.
template <class NumelOf>
std::vector<Block> make_blocks(std::size_t count, NumelOf&& numel_of, std::vector<std::size_t>& first) {
  first.assign(count + 1, 0);
  std::size_t nblocks = 0;
  for (std::size_t i = 0; i < count; ++i) {
    first[i] = nblocks;
    nblocks += (numel_of(i) + kSumBlock - 1) / kSumBlock;
  }
  first[count] = nblocks;
  std::vector<Block> blocks;
  blocks.reserve(nblocks);
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t n = numel_of(i);
    for (std::size_t b = 0; b < n; b += kSumBlock) blocks.push_back({i, b, std::min(n, b + kSumBlock)});
  }
  return blocks;
}

/// Calls fn(block_index, block) for every block, in parallel, blocks shared out by element count.
template <class Fn>
void for_each_block(const std::vector<Block>& blocks, Fn&& fn) {
  const std::size_t nb = blocks.size();
  if (nb == 0) return;
  std::size_t total = 0;
  for (const Block& b : blocks) total += b.end - b.begin;
  const int threads = nb > 1 ? detail::threads_for(total) : 1;
  if (threads == 1) {
    for (std::size_t i = 0; i < nb; ++i) fn(i, blocks[i]);
    return;
  }
#if ZEROTK_HAS_OPENMP
  // Blocks go to the thread whose element share contains the block's first element.
  std::vector<std::size_t> start(nb + 1);
  start[0] = 0;
  for (std::size_t i = 0; i < nb; ++i) start[i + 1] = start[i] + (blocks[i].end - blocks[i].begin);
#pragma omp parallel num_threads(threads)
  {
    const int tid = omp_get_thread_num(), got = omp_get_num_threads();
    const std::size_t lo = detail::share_begin(total, got, tid), hi = detail::share_begin(total, got, tid + 1);
    std::size_t i = static_cast<std::size_t>(std::lower_bound(start.begin(), start.begin() + static_cast<std::ptrdiff_t>(nb), lo) - start.begin());
    for (; i < nb && start[i] < hi; ++i) fn(i, blocks[i]);
  }
#endif
}

}  // namespace zerotk::kernels::host
