// Vectorized conversions (F16C / AVX-512 instructions and the integer bf16 path) against the scalar
// bit-by-bit conversions of zerotk/core/dtype.hpp (themselves checked exhaustively in tests/core):
// every ISA build, all 65,536 16-bit inputs, and a dense sweep of float bit patterns.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernel_test_util.hpp"
#include "zerotk/kernels/host/cast.hpp"

using namespace zerotk;
using zerotk::test::Isa;

namespace {

// Float bit patterns: every 6151st of the 2^32 (about 700,000, all classes: zeros, subnormals, normals,
// inf, NaN payloads) plus rounding boundaries (below, at and above halfway) for every exponent.
std::vector<float> float_patterns() {
  std::vector<float> v;
  for (std::uint64_t b = 0; b < (1ull << 32); b += 6151) {
    const auto u = static_cast<std::uint32_t>(b);
    float f;
    std::memcpy(&f, &u, 4);
    v.push_back(f);
  }
  // Halfway and near-halfway points: low bits 0x0fff/0x1000/0x1001 (fp16 in the normal range) and
  // 0x7fff/0x8000/0x8001 (bf16), for every exponent and both signs, plus subnormal-half inputs.
  for (std::uint32_t e = 0; e < 256; ++e) {
    for (std::uint32_t low : {0x0fffu, 0x1000u, 0x1001u, 0x2000u, 0x3000u, 0x7fffu, 0x8000u, 0x8001u, 0x18000u}) {
      for (std::uint32_t s : {0u, 0x80000000u}) {
        const std::uint32_t u = s | (e << 23) | low | 0x10000u;
        float f;
        std::memcpy(&f, &u, 4);
        v.push_back(f);
      }
    }
  }
  return v;
}

}  // namespace

TEST_CASE("cast fp32 -> fp16 / bf16 equals dtype.hpp's rounding bit for bit (every ISA)") {
  const std::vector<float> in = float_patterns();
  std::vector<half> ref_h(in.size());
  std::vector<bfloat16> ref_b(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    ref_h[i] = half::from_bits(float_to_half_bits(in[i]));
    ref_b[i] = bfloat16::from_bits(float_to_bf16_bits(in[i]));
  }
  for (const Isa isa : test::supported_isas()) {
    CAPTURE(kernels::host::simd::to_string(isa));
    kernels::host::simd::IsaCap cap(isa);
    std::vector<half> h(in.size());
    std::vector<bfloat16> b(in.size());
    kernels::host::cast(in.data(), h.data(), in.size());
    kernels::host::cast(in.data(), b.data(), in.size());
    for (std::size_t i = 0; i < in.size(); ++i) {
      if (h[i].bits != ref_h[i].bits || b[i].bits != ref_b[i].bits) {
        std::uint32_t u;
        std::memcpy(&u, &in[i], 4);
        FAIL("input bits 0x" << std::hex << u << ": fp16 0x" << h[i].bits << " want 0x" << ref_h[i].bits << ", bf16 0x"
                             << b[i].bits << " want 0x" << ref_b[i].bits);
      }
    }
  }
}

TEST_CASE("cast fp16 / bf16 -> fp32 is exact for all 65,536 patterns (every ISA)") {
  std::vector<half> h(65536);
  std::vector<bfloat16> b(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) {
    h[i] = half::from_bits(static_cast<std::uint16_t>(i));
    b[i] = bfloat16::from_bits(static_cast<std::uint16_t>(i));
  }
  for (const Isa isa : test::supported_isas()) {
    CAPTURE(kernels::host::simd::to_string(isa));
    kernels::host::simd::IsaCap cap(isa);
    std::vector<float> fh(65536), fb(65536);
    kernels::host::cast(h.data(), fh.data(), 65536);
    kernels::host::cast(b.data(), fb.data(), 65536);
    for (std::uint32_t i = 0; i < 65536; ++i) {
      const float rh = half_bits_to_float(static_cast<std::uint16_t>(i));
      const float rb = bf16_bits_to_float(static_cast<std::uint16_t>(i));
      REQUIRE(std::memcmp(&fh[i], &rh, 4) == 0);
      REQUIRE(std::memcmp(&fb[i], &rb, 4) == 0);
    }
    // 16 -> 16 through float: fp16 -> bf16 rounds like the two scalar steps.
    std::vector<bfloat16> hb(65536);
    kernels::host::cast(h.data(), hb.data(), 65536);
    for (std::uint32_t i = 0; i < 65536; ++i) {
      REQUIRE(hb[i].bits == float_to_bf16_bits(half_bits_to_float(static_cast<std::uint16_t>(i))));
    }
  }
}

TEST_CASE("cast: empty, one element, odd lengths, unaligned starts, same type copies") {
  const auto src = test::wide_values(1000, 4);
  for (const Isa isa : test::supported_isas()) {
    kernels::host::simd::IsaCap cap(isa);
    for (std::size_t n : {0u, 1u, 15u, 17u, 33u, 999u}) {
      for (std::size_t shift : {0u, 1u}) {
        std::vector<half> out(1000, half::from_bits(0x5555));
        kernels::host::cast(src.data() + shift, out.data() + shift, n - (n > 0 && shift ? 1 : 0));
        const std::size_t m = n - (n > 0 && shift ? 1 : 0);
        for (std::size_t i = 0; i < 1000; ++i) {
          const bool written = i >= shift && i < shift + m;
          REQUIRE(out[i].bits == (written ? float_to_half_bits(src[i]) : 0x5555));
        }
      }
    }
  }
  std::vector<float> copy(src.size());
  kernels::host::cast(src.data(), copy.data(), src.size());
  CHECK(test::same_bits(src, copy));
}

TEST_CASE("scale: x = T(float(x) * factor) in place, large arrays split over threads") {
  test::Threads th(2);
  const std::size_t n = 150001;
  const auto x = test::wide_values(n, 8);
  auto h = test::convert<half>(x);
  auto f = x;
  const float factor = 1.0f / 3.0f;
  kernels::host::scale(f.data(), n, factor);
  kernels::host::scale(h.data(), n, factor);
  for (std::size_t i = 0; i < n; ++i) {
    const float rf = x[i] * factor;
    REQUIRE(std::memcmp(&f[i], &rf, 4) == 0);
    REQUIRE(h[i].bits == float_to_half_bits(half_bits_to_float(float_to_half_bits(x[i])) * factor));
  }
}

TEST_CASE("cast of large outputs (non-temporal stores after an unaligned head) equals the scalar rounding") {
  const std::size_t n = (std::size_t{2} << 20) + 37;  // >= kStreamMinBytes of fp16 output on one thread
  static_assert(kernels::host::detail::kStreamMinBytes <= (std::size_t{2} << 20) * sizeof(half));
  const auto src = test::wide_values(n, 12);
  for (const Isa isa : test::supported_isas()) {
    kernels::host::simd::IsaCap cap(isa);
    test::Threads th(1);
    for (std::size_t shift : {0u, 3u}) {
      std::vector<half> h(n);
      std::vector<bfloat16> b(n);
      std::vector<float> f(n);
      kernels::host::cast(src.data() + shift, h.data() + shift, n - shift);
      kernels::host::cast(src.data() + shift, b.data() + shift, n - shift);
      kernels::host::cast(h.data() + shift, f.data() + shift, n - shift);
      std::size_t wrong = 0;
      for (std::size_t i = shift; i < n; ++i) {
        const float r = half_bits_to_float(h[i].bits);
        wrong += h[i].bits != float_to_half_bits(src[i]) || b[i].bits != float_to_bf16_bits(src[i]) ||
                 std::memcmp(&f[i], &r, 4) != 0;
      }
      CHECK(wrong == 0);
    }
  }
}
