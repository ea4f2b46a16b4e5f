#pragma once
/// \file zerotk/compress/quantize.hpp
/// Block quantization for ZeRO++'s qwZ (int8 weights) and qgZ (int4 gradients): the per-element
/// rules (ZEROTK_HD, shared by the host drivers below and compress/cuda/quantize.cuh) and the host
/// drivers over a block of n values cut into groups of `group` elements (the last may be shorter).
///
/// Rules (DeepSpeed's csrc/includes/quantization_utils.h, written from its facts):
///   symmetric, b bits:   scale = 2^(b-1) / absmax  (absmax 0: scale 1)
///                        q = clamp(round(x * scale), -2^(b-1), 2^(b-1) - 1),  x' = q * (absmax / 2^(b-1))
///   asymmetric, b bits:  scale = 2^b / (max - min) (max == min: 1), offset = (max + min) / 2
///                        q = clamp(round((x - offset) * scale), -2^(b-1), 2^(b-1) - 1),
///                        x' = q * ((max - min) / 2^b) + offset
/// round() is half away from zero here (one fp32 addition and a truncating conversion: the same bits
/// on the host, under -ffast-math and on the GPU); DeepSpeed's kernels round half to even. They
/// differ only for products that are exactly k + 1/2. The largest magnitude maps to 2^(b-1), which
/// the clamp pulls to 2^(b-1) - 1, as DeepSpeed's does. The GPU divides with __fdiv_rn, so
/// --use_fast_math does not change the scales.
///
/// A record (what travels): [codes, padded to 4 bytes][one fp32 inverse scale per group][symmetric
/// only that; asymmetric one fp32 offset per group after them], little-endian as the host is.
/// int8 codes are bytes; int4 codes two per byte, element 2j in the low nibble (groups have an even
/// size, so every group starts on a byte).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/core/macros.hpp"

namespace zerotk::compress::quant {

enum class Scheme : std::uint8_t { symmetric, asymmetric };

/// How a block is quantized: bits per value (4 or 8), the scheme, elements per group (even, > 0).
struct Format {
  int bits = 8;
  Scheme scheme = Scheme::symmetric;
  std::size_t group = 2048;

  ZEROTK_HD constexpr std::size_t groups(std::size_t n) const noexcept { return (n + group - 1) / group; }
  ZEROTK_HD constexpr std::size_t code_bytes(std::size_t n) const noexcept {
    const std::size_t raw = bits == 8 ? n : (n + 1) / 2;
    return (raw + 3) / 4 * 4;
  }
  ZEROTK_HD constexpr std::size_t params_per_group() const noexcept { return scheme == Scheme::symmetric ? 1 : 2; }
  /// Bytes of the record of n values.
  ZEROTK_HD constexpr std::size_t record_bytes(std::size_t n) const noexcept {
    return code_bytes(n) + 4 * params_per_group() * groups(n);
  }

  /// Check before use: the widths and group sizes the drivers and kernels handle.
  void check(const char* where) const {
    if (bits != 4 && bits != 8) throw usage_error("bits must be 4 or 8", where, std::to_string(bits));
    if (group == 0 || group % 2 != 0) throw usage_error("group must be even and > 0", where, std::to_string(group));
  }
};

// ---- per element (host and device) -----------------------------------------------------------

ZEROTK_HD ZEROTK_FORCEINLINE float divide_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

/// The quantization of one group: q = clamp(round((x - offset) * scale)), x' = q * inv + offset.
struct GroupParams {
  float scale = 1, inv = 1, offset = 0;
};

/// 2^(bits-1) (16 or 128), exact.
ZEROTK_HD ZEROTK_FORCEINLINE float half_range(int bits) { return bits == 8 ? 128.0f : 8.0f; }

ZEROTK_HD ZEROTK_FORCEINLINE GroupParams symmetric_params(float absmax, int bits) {
  GroupParams p;
  if (!(absmax > 0.0f)) return p;  // all zero (or NaN: scale 1, the NaN stays in the values)
  p.scale = divide_rn(half_range(bits), absmax);
  p.inv = absmax * (1.0f / half_range(bits));  // a power of two: exact
  return p;
}

ZEROTK_HD ZEROTK_FORCEINLINE GroupParams asymmetric_params(float lo, float hi, int bits) {
  GroupParams p;
  p.offset = 0.5f * (hi + lo);
  if (!(hi > lo)) return p;
  const float range = hi - lo;
  p.scale = divide_rn(2.0f * half_range(bits), range);
  p.inv = range * (0.5f / half_range(bits));
  return p;
}

/// The code of x: round half away from zero, then clamp to [-2^(b-1), 2^(b-1) - 1].
ZEROTK_HD ZEROTK_FORCEINLINE int quantize_value(float x, const GroupParams& p, int bits) {
  const float v = (x - p.offset) * p.scale;
  const float hr = half_range(bits);
  if (!(v < hr)) return static_cast<int>(hr) - 1;  // also NaN: the largest code
  if (v <= -hr) return -static_cast<int>(hr);
  const int r = static_cast<int>(v + (v >= 0.0f ? 0.5f : -0.5f));  // truncation toward zero
  return r > static_cast<int>(hr) - 1 ? static_cast<int>(hr) - 1 : r;  // 127.6 rounds to 128: clamped
}

ZEROTK_HD ZEROTK_FORCEINLINE float dequantize_value(int q, const GroupParams& p) {
  return static_cast<float>(q) * p.inv + p.offset;
}

/// int4 codes: element i of a block in byte i / 2, low nibble for even i (two's complement).
ZEROTK_HD ZEROTK_FORCEINLINE std::uint8_t pack4(int lo, int hi) {
  return static_cast<std::uint8_t>((static_cast<unsigned>(lo) & 0xfu) | ((static_cast<unsigned>(hi) & 0xfu) << 4));
}
ZEROTK_HD ZEROTK_FORCEINLINE int unpack4(std::uint8_t byte, int high) {
  const int nib = high ? (byte >> 4) : (byte & 0xf);
  return nib >= 8 ? nib - 16 : nib;
}

/// Code of element i of a record's codes.
ZEROTK_HD ZEROTK_FORCEINLINE int code_at(const std::uint8_t* codes, std::size_t i, int bits) {
  if (bits == 8) return static_cast<std::int8_t>(codes[i]);
  return unpack4(codes[i / 2], static_cast<int>(i % 2));
}

template <class T>
ZEROTK_HD ZEROTK_FORCEINLINE float load(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return to_float(x);
  }
}

inline constexpr float kFloatMax = 3.40282346638528859812e+38f;

/// The params of a group (values x[0 .. n)), from its absmax or its min and max (NaN ignored; the
/// GPU's reduction gives the same: max and min are exact in any order).
template <class T>
ZEROTK_HD GroupParams params_of(const T* x, std::size_t n, const Format& f) {
  if (f.scheme == Scheme::symmetric) {
    float m = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const float a = load(x[i]) < 0 ? -load(x[i]) : load(x[i]);
      m = a > m ? a : m;
    }
    return symmetric_params(m, f.bits);
  }
  float lo = kFloatMax, hi = -kFloatMax;  // NaN never compares: ignored, as by the symmetric absmax
  for (std::size_t i = 0; i < n; ++i) {
    lo = load(x[i]) < lo ? load(x[i]) : lo;
    hi = load(x[i]) > hi ? load(x[i]) : hi;
  }
  return asymmetric_params(lo, hi, f.bits);
}

/// Four bytes, by byte (a record's params need not be aligned; memcpy is not a device function).
ZEROTK_HD ZEROTK_FORCEINLINE void copy4(void* to, const void* from) {
  auto* t = static_cast<unsigned char*>(to);
  const auto* f = static_cast<const unsigned char*>(from);
  for (int i = 0; i < 4; ++i) t[i] = f[i];
}

/// Reads / writes group g's params in a record of n values.
ZEROTK_HD ZEROTK_FORCEINLINE void store_params(std::uint8_t* record, std::size_t n, const Format& f, std::size_t g,
                                               const GroupParams& p) {
  std::uint8_t* at = record + f.code_bytes(n);
  copy4(at + 4 * g, &p.inv);
  if (f.scheme == Scheme::asymmetric) copy4(at + 4 * (f.groups(n) + g), &p.offset);
}
ZEROTK_HD ZEROTK_FORCEINLINE GroupParams load_params(const std::uint8_t* record, std::size_t n, const Format& f,
                                                     std::size_t g) {
  GroupParams p;
  const std::uint8_t* at = record + f.code_bytes(n);
  copy4(&p.inv, at + 4 * g);
  if (f.scheme == Scheme::asymmetric) copy4(&p.offset, at + 4 * (f.groups(n) + g));
  return p;
}

// ---- host drivers --------------------------------------------------------------------------------

/// The record of x[0 .. n) (f.record_bytes(n) bytes; padding bytes are 0).
template <class T>
void quantize(const T* x, std::size_t n, const Format& f, std::uint8_t* record) {
  std::memset(record, 0, f.code_bytes(n));
  for (std::size_t g = 0; g < f.groups(n); ++g) {
    const std::size_t at = g * f.group, len = n - at < f.group ? n - at : f.group;
    const GroupParams p = params_of(x + at, len, f);
    store_params(record, n, f, g, p);
    for (std::size_t i = at; i < at + len; ++i) {
      const int q = quantize_value(load(x[i]), p, f.bits);
      if (f.bits == 8) {
        record[i] = static_cast<std::uint8_t>(static_cast<std::int8_t>(q));
      } else {
        record[i / 2] = static_cast<std::uint8_t>(record[i / 2] | (pack4(q, q) & (i % 2 ? 0xf0u : 0x0fu)));
      }
    }
  }
}

/// out[i] = the dequantized value i (rounded to T).
template <class T>
void dequantize(const std::uint8_t* record, std::size_t n, const Format& f, T* out) {
  for (std::size_t g = 0; g < f.groups(n); ++g) {
    const GroupParams p = load_params(record, n, f, g);
    const std::size_t at = g * f.group, end = n - at < f.group ? n : at + f.group;
    for (std::size_t i = at; i < end; ++i) out[i] = from_float<T>(dequantize_value(code_at(record, i, f.bits), p));
  }
}

/// acc[i] += the dequantized value i (fp32: the reductions of qgZ add in fp32).
inline void dequantize_add(const std::uint8_t* record, std::size_t n, const Format& f, float* acc) {
  for (std::size_t g = 0; g < f.groups(n); ++g) {
    const GroupParams p = load_params(record, n, f, g);
    const std::size_t at = g * f.group, end = n - at < f.group ? n : at + f.group;
    for (std::size_t i = at; i < end; ++i) acc[i] += dequantize_value(code_at(record, i, f.bits), p);
  }
}

}  // namespace zerotk::compress::quant
