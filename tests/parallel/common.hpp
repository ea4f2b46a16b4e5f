#pragma once
// Shared helpers for the tensor-parallel tests: deterministic inputs and bitwise comparison.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace zt_parallel_test {

/// Values in [-1, 1) from a fixed linear congruential sequence (independent of zerotk's RNG).
inline std::vector<float> values(std::size_t n, std::uint32_t seed) {
  std::vector<float> v(n);
  std::uint32_t s = seed * 2654435761u + 12345u;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<float>(s >> 8) / 8388608.0f - 1.0f;
  }
  return v;
}

inline bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline float max_abs_diff(std::span<const float> a, std::span<const float> b) {
  float m = a.size() == b.size() ? 0.0f : 1e30f;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

}  // namespace zt_parallel_test
