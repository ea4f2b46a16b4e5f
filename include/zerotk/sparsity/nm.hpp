#pragma once
/// \file zerotk/sparsity/nm.hpp
/// N:M structured sparsity, the rule (SEMANTICS.md section 18, NVIDIA ASP's): in each group of M
/// consecutive weights along a parameter's last dimension keep the N of largest magnitude.
///
///   keep_bits(v, n, m)        which of v[0, m) a group keeps, as bits (ZEROTK_HD: one definition for
///                             host loops and CUDA kernels)
///   choose(values, keep, ...) the rule over whole groups of a contiguous run of values
///   count_kept_violations     groups of a run that hold more than N non-zero values (what the tests
///                             and the engine's checks ask)
///
/// Ties: of two equal magnitudes the earlier element is kept, so a group with fewer than N non-zero
/// weights (a pruned layer chosen again) keeps the same positions every time. A NaN counts as larger
/// than every number (a group always keeps exactly N).

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "zerotk/core/macros.hpp"

namespace zerotk::sparsity {

/// The magnitude the rule compares: |v|, NaN above +inf.
ZEROTK_HD inline float keep_key(float v) {
  const float a = v < 0.0f ? -v : v;
  return a != a ? INFINITY : a;  // NaN != NaN
}

/// Bit j set: the group v[0, m) keeps v[j]. Exactly n bits are set (1 <= n < m <= 32).
ZEROTK_HD inline std::uint32_t keep_bits(const float* v, int n, int m) {
  std::uint32_t bits = 0;
  for (int i = 0; i < m; ++i) {
    const float ki = keep_key(v[i]);
    int above = 0;  // elements that rank before v[i]: larger, or as large and earlier
    for (int j = 0; j < m; ++j) {
      const float kj = keep_key(v[j]);
      above += (kj > ki || (kj == ki && j < i)) ? 1 : 0;
    }
    if (above < n) bits |= std::uint32_t{1} << i;
  }
  return bits;
}

/// keep[i] := 1 if values[i] is kept, else 0, for `count` values made of whole groups of m
/// (count a multiple of m).
inline void choose(const float* values, std::uint8_t* keep, std::size_t count, int n, int m) {
  for (std::size_t g = 0; g + static_cast<std::size_t>(m) <= count; g += static_cast<std::size_t>(m)) {
    const std::uint32_t bits = keep_bits(values + g, n, m);
    for (int j = 0; j < m; ++j) keep[g + static_cast<std::size_t>(j)] = static_cast<std::uint8_t>((bits >> j) & 1u);
  }
}

/// Groups of m among `count` values (whole groups; count a multiple of m) with more than n values
/// that are not zero.
template <class T, class ToFloat>
std::size_t count_kept_violations(const T* values, std::size_t count, int n, int m, ToFloat to_float) {
  std::size_t bad = 0;
  for (std::size_t g = 0; g + static_cast<std::size_t>(m) <= count; g += static_cast<std::size_t>(m)) {
    int nonzero = 0;
    for (int j = 0; j < m; ++j) nonzero += to_float(values[g + static_cast<std::size_t>(j)]) != 0.0f ? 1 : 0;
    bad += nonzero > n ? 1 : 0;
  }
  return bad;
}

}  // namespace zerotk::sparsity
