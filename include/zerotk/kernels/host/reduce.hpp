#pragma once
/// \file zerotk/kernels/host/reduce.hpp
/// Sums of squares (for L2 norms) and the inf/NaN check on the host.
///
/// Every sum of squares here is the reproducible binned sum of kernels/elementwise.hpp (section
/// "reproducible sum of squares"): its bits depend only on the multiset of values summed, not on
/// their order, on how they are split into tensors, pieces or ranks, on the thread count, on the ISA
/// (scalar, AVX2, AVX-512) or on host vs CUDA (kernels/cuda/reduce.cuh uses the same per-element
/// code). The building blocks, for a norm over several ranks:
///
///   square_bound(x, n)           phase 1: largest square + inf/NaN flag (all-reduce: max)
///   NormGrid::make(M, N)         the grid from the global bound and a global count bound
///   add_squares(x, n, grid, acc) phase 2: per-fold sums (all-reduce: plain fp64 sum, exact)
///   fold_finish(global)          the sum of squares
///
/// `sum_squares(x, n)` runs both phases over one buffer (the grid from its own max and count).
///
/// A norm over ranks, per boundary step (what engine/boundary.hpp does):
///
///   // every rank, over the gradient elements it owns (any split into blocks):
///   kernels::SquareBound b = kernels::host::square_bound<T>(owned_blocks);  // phase 1, local
///   all-reduce max of b.max_square  (+inf carries "some element is inf/NaN")
///   if (global nonfinite) -> overflow: skip the step, the norm is not needed
///   auto grid = kernels::NormGrid::make(global_max_square, global_count);  // same inputs on every rank
///   kernels::FoldSums f;  kernels::host::add_squares<T>(owned_blocks, grid, f);  // phase 2, local
///   all-reduce sum of f.fold[0..3)   (plain fp64: the values are exact multiples, any order is exact)
///   double sum_squares = kernels::fold_finish(global_f);
///
/// `global_count` is any bound on the number of elements summed over all ranks that every rank
/// agrees on (padding zeros may be counted or not); the result depends on it only through
/// ceil(log2(global_count)), and it must be <= 2^44. kernels::combine joins two phase-1 bounds (a
/// max) or two disjoint sets' fold sums (exact).
///
/// Phase 1 is an integer max over magnitude bits, phase 2 three exact fold extractions per element
/// in fp64 vectors. Both vectorize in each ISA build without compiler flags, and neither depends on
/// -ffast-math being absent (see elementwise.hpp).

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <span>
#include <string>
#include <type_traits>
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

/// The 32 lanes of a SumSq combined in one fixed order (pairwise). Used by LAMB's per-tensor sums.
inline double tree_sum(double* lanes) {
  for (int w = 16; w >= 1; w /= 2) {
    for (int j = 0; j < w; ++j) lanes[j] = lanes[j] + lanes[j + w];
  }
  return lanes[0];
}

// ---- fp64 vectors for the fold arithmetic ---------------------------------------------------------

#if ZEROTK_HOST_X86_SIMD
/// 4 doubles in a ymm register.
struct F64x4 {
  __m256d v;
};
ZEROTK_TARGET_AVX2 inline F64x4 operator+(const F64x4& a, const F64x4& b) { return {_mm256_add_pd(a.v, b.v)}; }
ZEROTK_TARGET_AVX2 inline F64x4 operator-(const F64x4& a, const F64x4& b) { return {_mm256_sub_pd(a.v, b.v)}; }
ZEROTK_TARGET_AVX2 inline F64x4 operator*(const F64x4& a, const F64x4& b) { return {_mm256_mul_pd(a.v, b.v)}; }
/// See kernels::fp_opaque: the optimizer may not fold (s + C) - C, even under -ffast-math.
ZEROTK_TARGET_AVX2 inline F64x4 fp_opaque(F64x4 a) {
  __asm__("" : "+x"(a.v));
  return a;
}

/// 8 doubles in a zmm register.
struct F64x8 {
  __m512d v;
};
ZEROTK_TARGET_AVX512 inline F64x8 operator+(const F64x8& a, const F64x8& b) { return {_mm512_add_pd(a.v, b.v)}; }
ZEROTK_TARGET_AVX512 inline F64x8 operator-(const F64x8& a, const F64x8& b) { return {_mm512_sub_pd(a.v, b.v)}; }
ZEROTK_TARGET_AVX512 inline F64x8 operator*(const F64x8& a, const F64x8& b) { return {_mm512_mul_pd(a.v, b.v)}; }
ZEROTK_TARGET_AVX512 inline F64x8 fp_opaque(F64x8 a) {
  __asm__("" : "+v"(a.v));
  return a;
}
#endif

/// The fp64 vector that goes with ISA tag S: `V`, how many of them one S::F32 widens into (`per`),
/// `load` (S::width elements of T into `per` vectors), `splat`, and `add_lanes` (adds every lane to a
/// double; exact for fold sums, any order).
template <class S>
struct Fp64;

template <>
struct Fp64<simd::Scalar> {
  using V = double;
  static constexpr std::size_t per = 1;
  template <class T>
  static ZEROTK_FORCEINLINE void load(const T* p, V* out) {
    out[0] = to_float(*p);
  }
  static ZEROTK_FORCEINLINE V splat(double x) { return x; }
  static ZEROTK_FORCEINLINE void add_lanes(const V& x, double& to) { to += x; }
};

#if ZEROTK_HOST_X86_SIMD
template <>
struct Fp64<simd::Avx2> {
  using V = F64x4;
  static constexpr std::size_t per = 2;
  ZEROTK_TARGET_AVX2 static inline void widen(const simd::F32x8& x, V* out) {
    out[0] = {_mm256_cvtps_pd(_mm256_castps256_ps128(x.v))};
    out[1] = {_mm256_cvtps_pd(_mm256_extractf128_ps(x.v, 1))};
  }
  template <class T>
  ZEROTK_TARGET_AVX2 static inline void load(const T* p, V* out) {
    if constexpr (std::is_same_v<T, half>) {
      // Plain vcvtph2ps: simd::Avx2::load's restoring of signalling-NaN payloads (which casts need)
      // does not matter to a sum of squares, and skipping it makes fp16 phase 2 ~15% faster.
      const __m256 f = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      widen(simd::F32x8(f), out);
    } else {
      widen(simd::Avx2::load(p), out);
    }
  }
  ZEROTK_TARGET_AVX2 static inline V splat(double x) { return {_mm256_set1_pd(x)}; }
  ZEROTK_TARGET_AVX2 static inline void add_lanes(const V& x, double& to) {
    alignas(32) double l[4];
    _mm256_store_pd(l, x.v);
    for (double d : l) to += d;
  }
};

template <>
struct Fp64<simd::Avx512> {
  using V = F64x8;
  static constexpr std::size_t per = 2;
  // maskz forms: see simd.hpp (gcc 12's false -Wmaybe-uninitialized in the plain ones).
  ZEROTK_TARGET_AVX512 static inline void widen(const simd::F32x16& x, V* out) {
    out[0] = {_mm512_maskz_cvtps_pd(0xff, _mm512_maskz_extractf32x8_ps(0xff, x.v, 0))};
    out[1] = {_mm512_maskz_cvtps_pd(0xff, _mm512_maskz_extractf32x8_ps(0xff, x.v, 1))};
  }
  template <class T>
  ZEROTK_TARGET_AVX512 static inline void load(const T* p, V* out) {
    widen(simd::Avx512::load(p), out);
  }
  ZEROTK_TARGET_AVX512 static inline V splat(double x) { return {_mm512_set1_pd(x)}; }
  ZEROTK_TARGET_AVX512 static inline void add_lanes(const V& x, double& to) {
    alignas(64) double l[8];
    _mm512_store_pd(l, x.v);
    for (double d : l) to += d;
  }
};
#endif

// ---- kernels ----------------------------------------------------------------------------------------

/// Phase 1: *out = the largest magnitude_key of x[0..n) (an integer max: vectorized in every build).
struct MagnitudeKernel {
  template <class S, class T>
  static ZEROTK_FORCEINLINE void run(const T* x, std::size_t n, std::uint32_t* out) {
    using Key = decltype(magnitude_key(x[0]));
    Key m = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const Key k = magnitude_key(x[i]);
      m = k > m ? k : m;
    }
    *out = m;
  }
};

/// Phase 2: *out = the fold sums of x[0..n) on grid g. Four vectors per iteration keep the long
/// extraction chains overlapping; two accumulators per fold hide the add latency without spilling
/// (6 accumulators + 3 extractors fit AVX2's 16 registers). How elements are spread over lanes and
/// accumulators does not matter: the sums are exact.
struct FoldKernel {
  template <class S, class T>
  static ZEROTK_FORCEINLINE void run(const T* x, std::size_t n, const NormGrid* g, FoldSums* out) {
    using P = Fp64<S>;
    using V = typename P::V;
    constexpr std::size_t kSets = 4;
    constexpr std::size_t kLoads = kSets / P::per;
    constexpr std::size_t kStep = kLoads * S::width;
    const V c0 = P::splat(g->extractor[0]), c1 = P::splat(g->extractor[1]), c2 = P::splat(g->extractor[2]);
    constexpr std::size_t kAcc = 2;
    V a0[kAcc], a1[kAcc], a2[kAcc];
    for (std::size_t j = 0; j < kAcc; ++j) a0[j] = a1[j] = a2[j] = P::splat(0.0);
    std::size_t i = 0;
    for (; i + kStep <= n; i += kStep) {
      V s[kSets];
      for (std::size_t l = 0; l < kLoads; ++l) P::load(x + i + l * S::width, s + l * P::per);
      for (std::size_t j = 0; j < kSets; ++j) {
        fold_deposit(s[j] * s[j], c0, c1, c2, a0[j % kAcc], a1[j % kAcc], a2[j % kAcc]);
      }
    }
    FoldSums r;
    for (std::size_t j = 0; j < kAcc; ++j) {
      P::add_lanes(a0[j], r.fold[0]);
      P::add_lanes(a1[j], r.fold[1]);
      P::add_lanes(a2[j], r.fold[2]);
    }
    for (; i < n; ++i) {
      fold_deposit(exact_square(x[i]), g->extractor[0], g->extractor[1], g->extractor[2], r.fold[0], r.fold[1],
                   r.fold[2]);
    }
    *out = r;
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

// ---- drivers over lists of items ------------------------------------------------------------------
// Items are tensors or segments; slot_of(item) says which result an item contributes to (0 for a
// result over the whole list, the item itself for per-item results, a tensor id for segments).

/// keys[slot_of(i)] = max(keys[slot_of(i)], max magnitude_key of item i), one parallel pass.
template <class T, class PtrOf, class NumelOf, class SlotOf>
void magnitude_keys(std::size_t count, PtrOf&& ptr_of, NumelOf&& numel_of, SlotOf&& slot_of, std::uint32_t* keys) {
  const simd::Isa isa = simd::active_isa();
  std::mutex mu;
  for_each_piece(count, numel_of, [&](std::size_t item, std::size_t b, std::size_t e) {
    std::uint32_t k = 0;
    simd::dispatch<MagnitudeKernel>(isa, ptr_of(item) + b, e - b, &k);
    const std::lock_guard<std::mutex> lock(mu);
    std::uint32_t& slot = keys[slot_of(item)];
    slot = std::max(slot, k);
  });
}

/// sums[slot_of(i)] += fold sums of item i on the grid grid_of(i) (nullptr: skip the item), one
/// parallel pass. Pieces are merged in whatever order threads finish: the sums are exact.
template <class T, class PtrOf, class NumelOf, class SlotOf, class GridOf>
void fold_sums(std::size_t count, PtrOf&& ptr_of, NumelOf&& numel_of, SlotOf&& slot_of, GridOf&& grid_of,
               FoldSums* sums) {
  const simd::Isa isa = simd::active_isa();
  std::mutex mu;
  for_each_piece(count, numel_of, [&](std::size_t item, std::size_t b, std::size_t e) {
    const NormGrid* g = grid_of(item);
    if (g == nullptr) return;
    FoldSums f;
    simd::dispatch<FoldKernel>(isa, ptr_of(item) + b, e - b, g, &f);
    const std::lock_guard<std::mutex> lock(mu);
    FoldSums& slot = sums[slot_of(item)];
    slot = combine(slot, f);
  });
}

/// Both phases per slot, each slot its own grid (from its own max and element count):
/// out[s] = (or +=, with `add`) the sum of squares of the items of slot s; +inf when one is inf/NaN.
/// Slots without items are left alone.
template <class T, class PtrOf, class NumelOf, class SlotOf>
void slot_sums(std::size_t count, PtrOf&& ptr_of, NumelOf&& numel_of, SlotOf&& slot_of, std::size_t slots, double* out,
               bool add) {
  std::vector<std::uint32_t> keys(slots, 0);
  std::vector<std::uint64_t> numels(slots, 0);
  std::vector<unsigned char> used(slots, 0);
  for (std::size_t i = 0; i < count; ++i) {
    numels[slot_of(i)] += numel_of(i);
    used[slot_of(i)] = 1;
  }
  magnitude_keys<T>(count, ptr_of, numel_of, slot_of, keys.data());
  std::vector<NormGrid> grids(slots);
  std::vector<unsigned char> finite(slots, 0);
  for (std::size_t s = 0; s < slots; ++s) {
    const SquareBound b = square_bound_of_key<T>(keys[s]);
    if (!b.nonfinite) {
      grids[s] = NormGrid::make(b.max_square, numels[s]);
      finite[s] = 1;
    }
  }
  std::vector<FoldSums> sums(slots);
  fold_sums<T>(
      count, ptr_of, numel_of, slot_of,
      [&](std::size_t i) { return finite[slot_of(i)] ? &grids[slot_of(i)] : nullptr; }, sums.data());
  for (std::size_t s = 0; s < slots; ++s) {
    if (!used[s]) continue;
    const double v = finite[s] ? fold_finish(sums[s]) : std::numeric_limits<double>::infinity();
    out[s] = add ? out[s] + v : v;
  }
}

}  // namespace detail

// ---- the two phases ---------------------------------------------------------------------------------

/// Phase 1 over x[0..n): the largest square and the inf/NaN flag.
template <FloatingElement T>
SquareBound square_bound(const T* x, std::size_t n) {
  std::uint32_t key = 0;
  detail::magnitude_keys<T>(1, [x](std::size_t) { return x; }, [n](std::size_t) { return n; },
                            [](std::size_t) { return std::size_t{0}; }, &key);
  return square_bound_of_key<T>(key);
}

/// Phase 1 over every element of a list of tensors (one bound for the whole list, one parallel pass).
template <FloatingElement T>
SquareBound square_bound(std::span<const TensorRef<const T>> tensors) {
  std::uint32_t key = 0;
  detail::magnitude_keys<T>(
      tensors.size(), [&](std::size_t i) { return tensors[i].data; }, [&](std::size_t i) { return tensors[i].numel; },
      [](std::size_t) { return std::size_t{0}; }, &key);
  return square_bound_of_key<T>(key);
}

/// Phase 2: acc += the fold sums of x[0..n) on grid g (built from the global bound and count).
template <FloatingElement T>
void add_squares(const T* x, std::size_t n, const NormGrid& g, FoldSums& acc) {
  detail::fold_sums<T>(
      1, [x](std::size_t) { return x; }, [n](std::size_t) { return n; }, [](std::size_t) { return std::size_t{0}; },
      [&g](std::size_t) { return &g; }, &acc);
}

/// Phase 2 over every element of a list of tensors: acc += their fold sums (one parallel pass).
template <FloatingElement T>
void add_squares(std::span<const TensorRef<const T>> tensors, const NormGrid& g, FoldSums& acc) {
  detail::fold_sums<T>(
      tensors.size(), [&](std::size_t i) { return tensors[i].data; }, [&](std::size_t i) { return tensors[i].numel; },
      [](std::size_t) { return std::size_t{0}; }, [&g](std::size_t) { return &g; }, &acc);
}

// ---- both phases over data on this rank -------------------------------------------------------------

/// Sum of x[i]^2 over n elements (float, half or bfloat16): both phases, the grid from these elements'
/// own max and count. +inf when an element is inf or NaN. Equals fold_finish of add_squares on
/// NormGrid::make(square_bound(x, n).max_square, n) bit for bit, and the CUDA sum_squares.
template <FloatingElement T>
double sum_squares(const T* x, std::size_t n) {
  double s = 0.0;
  detail::slot_sums<T>(
      1, [x](std::size_t) { return x; }, [n](std::size_t) { return n; }, [](std::size_t) { return std::size_t{0}; },
      1, &s, false);
  return s;
}

/// True when any of the n elements is inf or NaN (exponent-bit test, valid under -ffast-math).
template <FloatingElement T>
bool has_nonfinite(const T* x, std::size_t n) {
  const simd::Isa isa = simd::active_isa();
  std::atomic<bool> found{false};
  for_each_share(n, [&](std::size_t b, std::size_t e) {
    bool bad = false;
    simd::dispatch<detail::NonfiniteKernel>(isa, x + b, e - b, &bad);
    if (bad) found.store(true, std::memory_order_relaxed);
  });
  return found.load(std::memory_order_relaxed);
}

/// Sum of squares and inf/NaN flag. Phase 1 answers the flag; phase 2 runs only when all are finite
/// (otherwise sum_squares is +inf).
template <FloatingElement T>
NormCheck norm_and_check(const T* x, std::size_t n) {
  const SquareBound b = square_bound(x, n);
  NormCheck r;
  r.nonfinite = b.nonfinite;
  if (b.nonfinite) {
    r.sum_squares = std::numeric_limits<double>::infinity();
    return r;
  }
  FoldSums f;
  add_squares(x, n, NormGrid::make(b.max_square, n), f);
  r.sum_squares = fold_finish(f);
  return r;
}

/// Per-tensor sums of squares: out[i] = sum_squares(tensors[i]) bit for bit. One parallel pass per
/// phase over all tensors.
template <FloatingElement T>
void sum_squares(std::span<const TensorRef<const T>> tensors, std::span<double> out) {
  if (out.size() < tensors.size()) {
    throw usage_error("output span shorter than the tensor list", "kernels::host::sum_squares",
                      std::to_string(out.size()) + " < " + std::to_string(tensors.size()));
  }
  detail::slot_sums<T>(
      tensors.size(), [&](std::size_t i) { return tensors[i].data; }, [&](std::size_t i) { return tensors[i].numel; },
      [](std::size_t i) { return i; }, tensors.size(), out.data(), false);
}

/// Per-tensor sums of squares over segments of one flat buffer: out[t] += the sum of squares of all
/// segments with tensor id t, taken together (equal to sum_squares of their concatenation). Tensor
/// ids without segments are left alone; size out to max tensor id + 1.
template <FloatingElement T>
void sum_squares(std::span<const Segment> segments, const T* base, std::span<double> out) {
  for (const Segment& s : segments) {
    if (s.tensor >= out.size()) {
      throw usage_error("segment tensor id outside the output span", "kernels::host::sum_squares",
                        std::to_string(s.tensor) + " >= " + std::to_string(out.size()));
    }
  }
  detail::slot_sums<T>(
      segments.size(), [&](std::size_t i) { return base + segments[i].offset; },
      [&](std::size_t i) { return segments[i].numel; }, [&](std::size_t i) { return std::size_t{segments[i].tensor}; },
      out.size(), out.data(), true);
}

/// The L2 norm of a list of tensors taken together: sqrt of the sum of squares of all their elements
/// (the same bits as for their concatenation). +inf when an element is inf or NaN.
template <FloatingElement T>
double l2_norm(std::span<const TensorRef<const T>> tensors) {
  double s = 0.0;
  detail::slot_sums<T>(
      tensors.size(), [&](std::size_t i) { return tensors[i].data; }, [&](std::size_t i) { return tensors[i].numel; },
      [](std::size_t) { return std::size_t{0}; }, 1, &s, false);
  return std::sqrt(s);
}

}  // namespace zerotk::kernels::host
