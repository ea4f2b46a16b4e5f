#pragma once
// Helpers shared by the kernel tests: seeded data, the ISA builds this CPU can run, thread counts,
// bitwise comparison.
#include <cstddef>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "zerotk/core/dtype.hpp"
#include "zerotk/core/macros.hpp"
#include "zerotk/kernels/host/simd.hpp"

#if ZEROTK_HAS_OPENMP
#include <omp.h>
#endif

namespace zerotk::test {

using kernels::host::simd::Isa;

/// Every ISA build this CPU supports (always includes scalar).
inline std::vector<Isa> supported_isas() {
  std::vector<Isa> v{Isa::scalar};
  if (kernels::host::simd::detect_isa() >= Isa::avx2) v.push_back(Isa::avx2);
  if (kernels::host::simd::detect_isa() >= Isa::avx512) v.push_back(Isa::avx512);
  return v;
}

/// Sets OpenMP's thread count for this thread's next parallel regions while alive.
class Threads {
 public:
  explicit Threads(int n) {
#if ZEROTK_HAS_OPENMP
    saved_ = omp_get_max_threads();
    omp_set_num_threads(n);
#else
    (void)n;
#endif
  }
  Threads(const Threads&) = delete;
  Threads& operator=(const Threads&) = delete;
  ~Threads() {
#if ZEROTK_HAS_OPENMP
    omp_set_num_threads(saved_);
#endif
  }

 private:
  int saved_ = 1;
};

/// Normal values of magnitude ~scale (seeded).
inline std::vector<float> randn(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

/// Values spread over many binades, with exact zeros, subnormals and halfway cases for 16-bit rounding.
inline std::vector<float> wide_values(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t r = static_cast<std::uint32_t>(rng());
    switch (i % 8) {
      case 0: v[i] = 0.0f; break;
      case 1: v[i] = std::ldexp(static_cast<float>(r % 1000) - 500.0f, -140); break;  // fp32 subnormals
      case 2: {  // exactly halfway between two halves / bf16s: the low 13 (or 16) bits 1000...0
        const std::uint32_t b = (r & 0xffff0000u) | ((i % 16 == 2) ? 0x8000u : 0x1000u);
        std::memcpy(&v[i], &b, 4);
        if (v[i] != v[i]) v[i] = 1.0f;
        break;
      }
      default: v[i] = std::ldexp(static_cast<float>(static_cast<std::int32_t>(r)) / 2147483648.0f,
                                 static_cast<int>(rng() % 60) - 30);
    }
  }
  return v;
}

template <class T>
std::vector<T> convert(const std::vector<float>& v) {
  std::vector<T> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = from_float<T>(v[i]);
  return r;
}

template <class T>
bool same_bits(const T* a, const T* b, std::size_t n) {
  return n == 0 || std::memcmp(a, b, n * sizeof(T)) == 0;
}
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && same_bits(a.data(), b.data(), a.size());
}

inline float qnan() { return std::numeric_limits<float>::quiet_NaN(); }
inline float inf() { return std::numeric_limits<float>::infinity(); }

}  // namespace zerotk::test
