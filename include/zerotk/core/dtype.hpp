#pragma once
/// \file zerotk/core/dtype.hpp
/// Element types and their conversions. `half` and `bfloat16` are 16-bit storage types with
/// round-to-nearest-even conversions written out bit by bit, so host drivers and CUDA kernels share
/// exactly the same math (and host tests check it). The conversions are branch-free selects so host
/// loops vectorize without special compiler flags.
///
/// Rules: float -> 16-bit rounds to nearest, ties to even; overflow goes to +-inf; NaN stays NaN
/// (quieted, sign kept); subnormals are produced and read exactly (no flush to zero).

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <string_view>
#include <type_traits>

#include "zerotk/core/macros.hpp"

namespace zerotk {

/// fp64 exists for exact small reductions (global norms, LAMB per-tensor sums), not for tensors.
enum class DType : std::uint8_t { fp32, fp16, bf16, int32, uint8, fp64 };

constexpr std::size_t size_of(DType t) noexcept {
  switch (t) {
    case DType::fp32: return 4;
    case DType::fp16: return 2;
    case DType::bf16: return 2;
    case DType::int32: return 4;
    case DType::uint8: return 1;
    case DType::fp64: return 8;
  }
  return 0;
}

constexpr std::string_view to_string(DType t) noexcept {
  switch (t) {
    case DType::fp32: return "fp32";
    case DType::fp16: return "fp16";
    case DType::bf16: return "bf16";
    case DType::int32: return "int32";
    case DType::uint8: return "uint8";
    case DType::fp64: return "fp64";
  }
  return "unknown";
}

inline std::ostream& operator<<(std::ostream& os, DType t) { return os << to_string(t); }

namespace detail {

ZEROTK_HD ZEROTK_FORCEINLINE std::uint32_t float_bits(float f) {
#if ZEROTK_DEVICE_CODE && defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

ZEROTK_HD ZEROTK_FORCEINLINE float bits_float(std::uint32_t u) {
#if ZEROTK_DEVICE_CODE && defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

}  // namespace detail

/// IEEE binary16 bits from a float, round to nearest even.
ZEROTK_HD ZEROTK_FORCEINLINE std::uint16_t float_to_half_bits(float f) {
  const std::uint32_t x = detail::float_bits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t a = x & 0x7fffffffu;  // |f| as bits

  // Normal half range: rebias the exponent (127 -> 15) and round the 13 dropped bits to even.
  const std::uint32_t odd = (a >> 13) & 1u;
  const std::uint32_t normal = (a + 0xc8000fffu + odd) >> 13;  // 0xc8000000 == (15 - 127) << 23 mod 2^32

  // |f| < 2^-14: the result is a half subnormal (or zero). Adding 0.5f puts the value's 2^-24 units
  // into the low mantissa bits of a float whose ulp is exactly 2^-24; the FPU does the even rounding.
  const float sub_f = detail::bits_float(a) + 0.5f;
  const std::uint32_t subnormal = detail::float_bits(sub_f) - 0x3f000000u;

  // NaN: quiet it and keep the top payload bits; everything >= 65520 (incl. inf) becomes inf.
  const std::uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);

  std::uint32_t h = a < 0x38800000u ? subnormal : normal;
  h = a >= 0x477ff000u ? 0x7c00u : h;
  h = a > 0x7f800000u ? nan : h;
  return static_cast<std::uint16_t>(h | sign);
}

/// float from IEEE binary16 bits (exact).
ZEROTK_HD ZEROTK_FORCEINLINE float half_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t em = h & 0x7fffu;
  const std::uint32_t shifted = em << 13;
  std::uint32_t normal = shifted + 0x38000000u;          // rebias exponent 15 -> 127
  normal = em >= 0x7c00u ? normal + 0x38000000u : normal;  // inf/NaN: exponent all ones
  // Subnormal (exponent 0): value = em * 2^-24, computed exactly as (2^-14 + em*2^-24) - 2^-14.
  const float sub = detail::bits_float(shifted + 0x38800000u) - detail::bits_float(0x38800000u);
  const std::uint32_t r = em < 0x0400u ? detail::float_bits(sub) : normal;
  return detail::bits_float(r | sign);
}

/// bfloat16 bits from a float, round to nearest even; NaN quieted (sign and top payload kept).
ZEROTK_HD ZEROTK_FORCEINLINE std::uint16_t float_to_bf16_bits(float f) {
  const std::uint32_t x = detail::float_bits(f);
  const std::uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const std::uint32_t nan = (x >> 16) | 0x0040u;
  return static_cast<std::uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

/// float from bfloat16 bits (exact).
ZEROTK_HD ZEROTK_FORCEINLINE float bf16_bits_to_float(std::uint16_t b) {
  return detail::bits_float(static_cast<std::uint32_t>(b) << 16);
}

/// IEEE binary16 storage type. Arithmetic happens in float; this type only stores.
struct half {
  std::uint16_t bits = 0;
  half() = default;
  ZEROTK_HD explicit half(float f) : bits(float_to_half_bits(f)) {}
  ZEROTK_HD static half from_bits(std::uint16_t b) {
    half h;
    h.bits = b;
    return h;
  }
  ZEROTK_HD explicit operator float() const { return half_bits_to_float(bits); }
  friend bool operator==(half a, half b) { return a.bits == b.bits; }  // bitwise, for tests
};

/// bfloat16 storage type (8-bit exponent, 7-bit mantissa).
struct bfloat16 {
  std::uint16_t bits = 0;
  bfloat16() = default;
  ZEROTK_HD explicit bfloat16(float f) : bits(float_to_bf16_bits(f)) {}
  ZEROTK_HD static bfloat16 from_bits(std::uint16_t b) {
    bfloat16 h;
    h.bits = b;
    return h;
  }
  ZEROTK_HD explicit operator float() const { return bf16_bits_to_float(bits); }
  friend bool operator==(bfloat16 a, bfloat16 b) { return a.bits == b.bits; }
};

static_assert(sizeof(half) == 2 && std::is_trivially_copyable_v<half>);
static_assert(sizeof(bfloat16) == 2 && std::is_trivially_copyable_v<bfloat16>);

/// Generic conversions used by kernels: `to_float(x)` and `from_float<T>(f)` for float/half/bfloat16.
ZEROTK_HD ZEROTK_FORCEINLINE float to_float(float x) { return x; }
ZEROTK_HD ZEROTK_FORCEINLINE float to_float(half x) { return half_bits_to_float(x.bits); }
ZEROTK_HD ZEROTK_FORCEINLINE float to_float(bfloat16 x) { return bf16_bits_to_float(x.bits); }

template <class T>
ZEROTK_HD ZEROTK_FORCEINLINE T from_float(float f) {
  if constexpr (std::is_same_v<T, float>) {
    return f;
  } else if constexpr (std::is_same_v<T, half>) {
    return half::from_bits(float_to_half_bits(f));
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return bfloat16::from_bits(float_to_bf16_bits(f));
  } else {
    static_assert(dependent_false<T>, "from_float: T must be float, zerotk::half or zerotk::bfloat16");
  }
}

/// Compile-time mapping from C++ element type to DType.
template <class T>
struct dtype_of {
  static_assert(dependent_false<T>, "dtype_of: no zerotk::DType for this element type");
};
template <> struct dtype_of<float> { static constexpr DType value = DType::fp32; };
template <> struct dtype_of<half> { static constexpr DType value = DType::fp16; };
template <> struct dtype_of<bfloat16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<std::int32_t> { static constexpr DType value = DType::int32; };
template <> struct dtype_of<std::uint8_t> { static constexpr DType value = DType::uint8; };
template <> struct dtype_of<double> { static constexpr DType value = DType::fp64; };
template <class T>
inline constexpr DType dtype_of_v = dtype_of<T>::value;

/// True for the element types zerotk stores floating-point data in.
template <class T>
concept FloatingElement = std::is_same_v<T, float> || std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

/// Precision tags, used as policies: Precision<fp32>, Precision<fp16>, Precision<bf16>.
struct fp32 {
  using storage = float;
  static constexpr DType dtype = DType::fp32;
};
struct fp16 {
  using storage = half;
  static constexpr DType dtype = DType::fp16;
};
struct bf16 {
  using storage = bfloat16;
  static constexpr DType dtype = DType::bf16;
};

}  // namespace zerotk
