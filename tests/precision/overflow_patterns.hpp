#pragma once
// Seeded overflow patterns shared by the precision tests. The generator is spelled out (not
// std::mt19937) because tests/golden/make_scaler_reference.py must produce the same patterns.

#include <bit>
#include <cstdint>
#include <vector>

namespace zerotk_test {

struct SplitMix64 {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1p-53; }
};

/// Calm stretches with rare overflows and storms with frequent ones; the mode toggles with
/// probability 1/64 per step.
inline std::vector<bool> overflow_pattern(std::uint64_t seed, int steps, double p_calm, double p_storm) {
  SplitMix64 rng{seed};
  std::vector<bool> out;
  out.reserve(static_cast<std::size_t>(steps));
  bool storm = false;
  for (int i = 0; i < steps; ++i) {
    if (rng.uniform() < 1.0 / 64) storm = !storm;
    out.push_back(rng.uniform() < (storm ? p_storm : p_calm));
  }
  return out;
}

/// FNV-1a 64 over a step's (skip, scale, hyst), little-endian like the Python generator.
struct Fnv1a64 {
  static_assert(std::endian::native == std::endian::little, "the golden hashes are of little-endian bytes");
  std::uint64_t h = 0xCBF29CE484222325ull;
  void bytes(const void* p, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001B3ull;
  }
  void step(bool skip, double scale, std::int32_t hyst) {
    const unsigned char s = skip ? 1 : 0;
    bytes(&s, 1);
    bytes(&scale, sizeof scale);
    bytes(&hyst, sizeof hyst);
  }
};

}  // namespace zerotk_test
