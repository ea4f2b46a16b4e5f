#pragma once
/// \file zerotk/zero/norms.hpp
/// Sum of squares with a result that depends only on the values and their count: not on the thread
/// count, the schedule, or where the block sits in memory. The engine relies on this to give
/// bitwise-identical clipping factors in stages 0, 1 and 2 (which see the same gradient blocks in
/// different buffers). Fixed 2048-element chunks, eight interleaved fp64 lanes per chunk (the compiler
/// may vectorize across lanes but not reassociate), chunk sums added in order.
///
/// A non-finite input makes the sum non-finite (an fp32 or 16-bit value squared in fp64 cannot
/// overflow), so one pass answers both "norm" and "overflow".

#include <cmath>
#include <cstddef>
#include <vector>

#include "zerotk/core/dtype.hpp"
#include "zerotk/core/macros.hpp"

namespace zerotk::zero {

inline constexpr std::size_t kNormChunk = 2048;

template <class T>
double chunk_sum_squares(const T* ZEROTK_RESTRICT x, std::size_t n) noexcept {
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) {
      const double v = static_cast<double>(to_float(x[i + j]));
      lane[j] += v * v;
    }
  }
  for (int j = 0; i < n; ++i, ++j) {
    const double v = static_cast<double>(to_float(x[i]));
    lane[j] += v * v;
  }
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

/// Deterministic fp64 sum of squares of n elements (float, half or bfloat16).
template <class T>
double sum_squares(const T* x, std::size_t n) {
  const std::size_t chunks = (n + kNormChunk - 1) / kNormChunk;
  if (chunks <= 1) return chunk_sum_squares(x, n);
  std::vector<double> part(chunks);
  const auto count = static_cast<long long>(chunks);
#if ZEROTK_HAS_OPENMP
#pragma omp parallel for schedule(static) if (chunks >= 64)
#endif
  for (long long c = 0; c < count; ++c) {
    const std::size_t lo = static_cast<std::size_t>(c) * kNormChunk;
    const std::size_t len = lo + kNormChunk <= n ? kNormChunk : n - lo;
    part[static_cast<std::size_t>(c)] = chunk_sum_squares(x + lo, len);
  }
  double s = 0;
  for (double p : part) s += p;
  return s;
}

}  // namespace zerotk::zero
