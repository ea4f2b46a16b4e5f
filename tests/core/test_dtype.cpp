// dtype conversions, checked exhaustively over all 65,536 16-bit patterns against a reference that
// shares no code with the library: it decodes with ldexp in double precision and rounds a float by
// searching the sorted table of all finite 16-bit values for the nearest one (ties to even bits).
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "zerotk/core/dtype.hpp"

using namespace zerotk;

namespace {

struct Format {
  int exp_bits, man_bits;  // fp16: 5, 10; bf16: 8, 7
  int bias() const { return (1 << (exp_bits - 1)) - 1; }
  std::uint16_t inf_bits() const { return static_cast<std::uint16_t>(((1u << exp_bits) - 1) << man_bits); }
};
constexpr Format kHalf{5, 10};
constexpr Format kBf16{8, 7};

// Value of a 16-bit pattern, in double (exact for both formats).
double decode(Format f, std::uint16_t b) {
  const int sign = b >> 15;
  const int e = (b >> f.man_bits) & ((1 << f.exp_bits) - 1);
  const int m = b & ((1 << f.man_bits) - 1);
  double v;
  if (e == (1 << f.exp_bits) - 1) {
    v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m), 1 - f.bias() - f.man_bits);
  } else {
    v = std::ldexp(static_cast<double>((1 << f.man_bits) + m), e - f.bias() - f.man_bits);
  }
  return sign ? -v : v;
}

// Sorted magnitudes of all finite non-negative patterns; index == bit pattern.
std::vector<double> magnitudes(Format f) {
  std::vector<double> t;
  for (std::uint32_t b = 0; b < f.inf_bits(); ++b) t.push_back(decode(f, static_cast<std::uint16_t>(b)));
  return t;
}

// Reference float -> 16-bit rounding (nearest, ties to even); NaN handled by the caller.
std::uint16_t encode_ref(Format f, const std::vector<double>& table, float x) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(x));
  // The first value past the largest finite one is 2^(emax+1); the midpoint to it rounds to inf.
  const double max = table.back();
  const double next = std::ldexp(1.0, (1 << f.exp_bits) - 2 - f.bias() + 1);
  if (a >= (max + next) / 2) return sign | f.inf_bits();
  auto it = std::lower_bound(table.begin(), table.end(), a);
  std::size_t hi = static_cast<std::size_t>(it - table.begin());
  if (hi < table.size() && table[hi] == a) return static_cast<std::uint16_t>(sign | hi);
  if (hi == table.size()) return static_cast<std::uint16_t>(sign | (table.size() - 1));
  std::size_t lo = hi - 1;
  const double dlo = a - table[lo], dhi = table[hi] - a;
  std::size_t pick = dlo < dhi ? lo : dhi < dlo ? hi : ((lo & 1) == 0 ? lo : hi);
  return static_cast<std::uint16_t>(sign | pick);
}

bool same_float(float a, double ref) {
  if (std::isnan(ref)) return std::isnan(a);
  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(static_cast<float>(ref));
}

template <class Encode, class Decode>
void check_format(Format f, Encode encode, Decode decode_lib) {
  const auto table = magnitudes(f);

  // 1. Every pattern decodes exactly, and re-encodes to itself (NaN stays NaN with its sign).
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const double ref = decode(f, bits);
    const float got = decode_lib(bits);
    REQUIRE_MESSAGE(same_float(got, ref), "decode of pattern " << b);
    const std::uint16_t back = encode(got);
    if (std::isnan(ref)) {
      CHECK_MESSAGE((back & 0x7fff) > f.inf_bits(), "NaN pattern " << b << " did not stay NaN");
      CHECK((back & 0x8000) == (bits & 0x8000));
    } else {
      REQUIRE_MESSAGE(back == bits, "round trip of pattern " << b);
    }
  }

  // 2. Every rounding boundary: the midpoint between neighbours and the floats right beside it.
  std::size_t checked = 0;
  for (std::size_t i = 0; i + 1 <= table.size(); ++i) {
    const double lo = table[i];
    const double hi = i + 1 < table.size() ? table[i + 1]
                                           : std::ldexp(1.0, (1 << f.exp_bits) - 2 - f.bias() + 1);
    const float mid = static_cast<float>((lo + hi) / 2);
    REQUIRE(static_cast<double>(mid) == (lo + hi) / 2);  // midpoints are exact in float
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
      for (float s : {x, -x}) {
        REQUIRE_MESSAGE(encode(s) == encode_ref(f, table, s), "encode of " << s);
        ++checked;
      }
    }
  }
  CHECK(checked == 6 * table.size());

  // 3. Random float bit patterns across the whole range, NaN and inf included.
  std::mt19937 rng(1234);
  for (int k = 0; k < 1'000'000; ++k) {
    const float x = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
    const std::uint16_t got = encode(x);
    if (std::isnan(x)) {
      REQUIRE((got & 0x7fff) > f.inf_bits());
      REQUIRE((got & 0x8000) == (std::signbit(x) ? 0x8000 : 0));
    } else {
      REQUIRE_MESSAGE(got == encode_ref(f, table, x), "encode of bits " << std::bit_cast<std::uint32_t>(x));
    }
  }
}

}  // namespace

TEST_CASE("fp16: exhaustive decode, round trip, every rounding boundary, random floats") {
  check_format(kHalf, [](float x) { return float_to_half_bits(x); },
               [](std::uint16_t b) { return half_bits_to_float(b); });
}

TEST_CASE("bf16: exhaustive decode, round trip, every rounding boundary, random floats") {
  check_format(kBf16, [](float x) { return float_to_bf16_bits(x); },
               [](std::uint16_t b) { return bf16_bits_to_float(b); });
}

TEST_CASE("named edge values") {
  CHECK(float_to_half_bits(65504.0f) == 0x7bff);
  CHECK(float_to_half_bits(65519.996f) == 0x7bff);
  CHECK(float_to_half_bits(65520.0f) == 0x7c00);  // tie between 65504 (odd) and 65536: to inf
  CHECK(float_to_half_bits(-INFINITY) == 0xfc00);
  CHECK(float_to_half_bits(std::ldexp(1.0f, -24)) == 0x0001);  // smallest subnormal
  CHECK(float_to_half_bits(std::ldexp(1.0f, -25)) == 0x0000);  // tie to even: zero
  CHECK(float_to_half_bits(std::ldexp(3.0f, -25)) == 0x0002);  // tie to even: 2
  CHECK(float_to_half_bits(-0.0f) == 0x8000);
  CHECK(float_to_bf16_bits(1.0f) == 0x3f80);
  CHECK(float_to_bf16_bits(std::numeric_limits<float>::max()) == 0x7f80);  // rounds up to inf
  CHECK(std::isnan(static_cast<float>(half(NAN))));
  CHECK(std::isnan(static_cast<float>(bfloat16(-NAN))));
  CHECK(std::signbit(static_cast<float>(bfloat16(-NAN))));
}

TEST_CASE("dtype metadata") {
  CHECK(size_of(DType::fp32) == 4);
  CHECK(size_of(DType::fp16) == 2);
  CHECK(size_of(DType::bf16) == 2);
  CHECK(size_of(DType::int32) == 4);
  CHECK(size_of(DType::uint8) == 1);
  CHECK(size_of(DType::fp64) == 8);
  CHECK(to_string(DType::bf16) == "bf16");
  static_assert(dtype_of_v<half> == DType::fp16);
  static_assert(dtype_of_v<bfloat16> == DType::bf16);
  static_assert(fp16::dtype == DType::fp16);
  CHECK(from_float<half>(1.5f).bits == 0x3e00);
  CHECK(to_float(from_float<bfloat16>(-2.0f)) == -2.0f);
}
