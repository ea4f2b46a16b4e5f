#pragma once
/// \file zerotk/kernels/host/reduce.hpp
/// Sums of squares (for L2 norms) accumulated in fp64, and the inf/NaN check, on the host.
///
/// Determinism: a sum is computed in fixed blocks of kSumBlock elements, each block in 32 fixed
/// fp64 lanes combined in a fixed order, blocks added in order. The result depends only on the data:
/// not on the thread count and not on the ISA (scalar, AVX2 and AVX-512 give the same bits).
///
/// Squares of finite floats are exact in fp64 and no sum of fewer than 2^200 of them overflows, so the
/// fp64 sum is non-finite exactly when an element is inf or NaN: `norm_and_check` gets the overflow
/// flag from the same single pass.

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/kernels/elementwise.hpp"
#include "zerotk/kernels/host/parallel.hpp"
#include "zerotk/kernels/host/simd.hpp"
#include "zerotk/kernels/tensor_list.hpp"

namespace zerotk::kernels::host {

/// Result of one pass over gradients: the fp64 sum of squares and whether any element is inf/NaN.
struct NormCheck {
  double sum_squares = 0.0;
  bool nonfinite = false;
};

namespace detail {

/// The 32 lanes of a SumSq combined in one fixed order (pairwise).
inline double tree_sum(double* lanes) {
  for (int w = 16; w >= 1; w /= 2) {
    for (int j = 0; j < w; ++j) lanes[j] = lanes[j] + lanes[j + w];
  }
  return lanes[0];
}

/// Adds x^2 of 32 consecutive elements to the 32 lanes.
template <class S, class T>
ZEROTK_FORCEINLINE void sumsq_add32(typename S::SumSq& acc, const T* p) {
  for (int h = 0; h < static_cast<int>(32 / S::width); ++h) S::sumsq_add(acc, S::load(p + h * S::width), h);
}

struct SumSquaresKernel {
  template <class S, class T>
  static ZEROTK_FORCEINLINE void run(const T* x, std::size_t n, double* out) {
    auto acc = S::sumsq_zero();
    std::size_t i = 0;
    for (; i + 32 <= n; i += 32) sumsq_add32<S>(acc, x + i);
    double lanes[32];
    S::sumsq_lanes(acc, lanes);
    double s = tree_sum(lanes);
    for (; i < n; ++i) {
      const double d = to_float(x[i]);
      s = d * d + s;
    }
    *out = s;
  }
};

struct NonfiniteKernel {
  template <class S, class T>
  static ZEROTK_FORCEINLINE void run(const T* x, std::size_t n, bool* out) {
    // Integer bit tests: vectorized by the compiler in each ISA build, no early exit.
    unsigned bad = 0;
    for (std::size_t i = 0; i < n; ++i) bad |= is_nonfinite(x[i]) ? 1u : 0u;
    *out = bad != 0;
  }
};

/// Per-item sums of squares: out[i] = sum over item i (ptr_of(i), numel_of(i)); deterministic.
template <class T, class PtrOf, class NumelOf>
void item_sums(std::size_t count, PtrOf&& ptr_of, NumelOf&& numel_of, double* out) {
  const simd::Isa isa = simd::active_isa();
  std::vector<std::size_t> first;
  const std::vector<Block> blocks = make_blocks(count, numel_of, first);
  std::vector<double> partial(blocks.size());
  for_each_block(blocks, [&](std::size_t bi, const Block& b) {
    const T* x = ptr_of(b.tensor) + b.begin;
    simd::dispatch<SumSquaresKernel>(isa, x, b.end - b.begin, &partial[bi]);
  });
  for (std::size_t i = 0; i < count; ++i) {
    double s = 0.0;
    for (std::size_t bi = first[i]; bi < first[i + 1]; ++bi) s += partial[bi];
    out[i] = s;
  }
}

}  // namespace detail

/// Sum of x[i]^2 over n elements, accumulated in fp64 (deterministic, see the file comment).
template <FloatingElement T>
double sum_squares(const T* x, std::size_t n) {
  double s = 0.0;
  detail::item_sums<T>(1, [x](std::size_t) { return x; }, [n](std::size_t) { return n; }, &s);
  return s;
}

/// True when any of the n elements is inf or NaN (exponent-bit test, valid under -ffast-math).
template <FloatingElement T>
bool has_nonfinite(const T* x, std::size_t n) {
  const simd::Isa isa = simd::active_isa();
  std::atomic<bool> found{false};
  for_each_piece(1, [n](std::size_t) { return n; }, [&](std::size_t, std::size_t b, std::size_t e) {
    bool bad = false;
    simd::dispatch<detail::NonfiniteKernel>(isa, x + b, e - b, &bad);
    if (bad) found.store(true, std::memory_order_relaxed);
  });
  return found.load(std::memory_order_relaxed);
}

/// Sum of squares and inf/NaN flag in one pass.
template <FloatingElement T>
NormCheck norm_and_check(const T* x, std::size_t n) {
  const double s = sum_squares(x, n);
  return {s, is_nonfinite(s)};
}

/// Per-tensor sums of squares: out[i] = sum over tensors[i]. One parallel pass over all tensors.
template <FloatingElement T>
void sum_squares(std::span<const TensorRef<const T>> tensors, std::span<double> out) {
  if (out.size() < tensors.size()) {
    throw usage_error("output span shorter than the tensor list", "kernels::host::sum_squares",
                      std::to_string(out.size()) + " < " + std::to_string(tensors.size()));
  }
  detail::item_sums<T>(
      tensors.size(), [&](std::size_t i) { return tensors[i].data; }, [&](std::size_t i) { return tensors[i].numel; },
      out.data());
}

/// Per-tensor sums of squares over segments of one flat buffer: out[s.tensor] += sum over segment s,
/// added in segment order (out is not cleared; size it to max tensor id + 1).
template <FloatingElement T>
void sum_squares(std::span<const Segment> segments, const T* base, std::span<double> out) {
  for (const Segment& s : segments) {
    if (s.tensor >= out.size()) {
      throw usage_error("segment tensor id outside the output span", "kernels::host::sum_squares",
                        std::to_string(s.tensor) + " >= " + std::to_string(out.size()));
    }
  }
  std::vector<double> per(segments.size());
  detail::item_sums<T>(
      segments.size(), [&](std::size_t i) { return base + segments[i].offset; },
      [&](std::size_t i) { return segments[i].numel; }, per.data());
  for (std::size_t i = 0; i < segments.size(); ++i) out[segments[i].tensor] += per[i];
}

/// The global L2 norm of a list of tensors: sqrt of the in-order sum of their fp64 sums of squares.
template <FloatingElement T>
double l2_norm(std::span<const TensorRef<const T>> tensors) {
  std::vector<double> per(tensors.size());
  sum_squares<T>(tensors, per);
  double s = 0.0;
  for (double x : per) s += x;
  return std::sqrt(s);
}

}  // namespace zerotk::kernels::host
