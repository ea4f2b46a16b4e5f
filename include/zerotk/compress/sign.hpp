#pragma once
/// \file zerotk/compress/sign.hpp
/// 1-bit compression: the sign of each value and one fp32 scale, with error feedback. This is the
/// codec of DeepSpeed's compressed all-reduce (runtime/comm/nccl.py, used by 1-bit Adam, 0/1 Adam and
/// 1-bit LAMB); compress/onebit_allreduce.hpp builds that all-reduce from the pieces below.
///
///   y     = x + err                                   fp32
///   scale = ||y||_2 / sqrt(n)                         the RMS of y: see scale_of
///   bit_j = 1 if y_j >= 0 else 0                      sign(0) = sign(-0) = +1, as DeepSpeed's
///                                                     sign().add_(1).bool() gives
///   D_j   = bit_j ? +scale : -scale
///   err_j = y_j - D_j                                 one fp32 rounding
///
/// Payload: [fp32 scale, little-endian][ceil(n/8) bytes of bits, element j in byte j/8 at bit 7 - j%8;
/// the unused low bits of the last byte are 0]. payload_bytes(n) = 4 + ceil(n / 8).
/// Error feedback: |D_j + err_j - y_j| <= 2^-24 |err_j| (err_j is y_j - D_j rounded once).
///
/// The per-element functions (namespace sign, ZEROTK_HD) are what a CUDA kernel would share with the
/// host drivers below; the scale is the reproducible sum of squares of kernels/host/reduce.hpp,
/// whose CUDA twin (kernels/cuda/reduce.cuh) gives the same bits.

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "zerotk/compress/codec.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/core/macros.hpp"
#include "zerotk/kernels/host/parallel.hpp"
#include "zerotk/kernels/host/reduce.hpp"
#include "zerotk/kernels/host/simd.hpp"  // ZEROTK_HOST_X86_SIMD and <immintrin.h>

namespace zerotk::compress {

namespace sign {

// ---- per element (host and device) -------------------------------------------------------------

/// The bit of one value: 1 for y >= 0 (including -0), 0 for y < 0.
ZEROTK_HD ZEROTK_FORCEINLINE std::uint32_t bit_of(float y) { return y >= 0.0f ? 1u : 0u; }

/// The byte holding values y[0..count), count in 1..8, most significant bit first, unused bits 0.
ZEROTK_HD ZEROTK_FORCEINLINE std::uint8_t pack_byte(const float* y, unsigned count) {
  std::uint32_t b = 0;
  for (unsigned j = 0; j < count; ++j) b |= bit_of(y[j]) << (7u - j);
  return static_cast<std::uint8_t>(b);
}

/// The decoded value of element j of a packed field: +scale or -scale.
ZEROTK_HD ZEROTK_FORCEINLINE float value(const std::uint8_t* bits, std::size_t j, float scale) {
  return ((bits[j >> 3] >> (7u - static_cast<unsigned>(j & 7u))) & 1u) ? scale : -scale;
}

/// What the sign of y at this scale leaves out: y - (+-scale), one rounding.
ZEROTK_HD ZEROTK_FORCEINLINE float residual(float y, float scale) { return y - (y >= 0.0f ? scale : -scale); }

/// The scale from a sum of squares of n > 0 values: sqrt(sum_squares / n) in fp64, rounded once to
/// fp32. (DeepSpeed computes ||y|| in fp32 and divides by sqrt(n); the two differ by rounding only.)
ZEROTK_HD ZEROTK_FORCEINLINE float scale_from_sum_squares(double sum_squares, std::size_t n) {
  return n == 0 ? 0.0f : static_cast<float>(std::sqrt(sum_squares / static_cast<double>(n)));
}

// ---- host drivers ---------------------------------------------------------------------------------

/// Bytes of the packed bits of n values.
constexpr std::size_t packed_bytes(std::size_t n) noexcept { return (n + 7) / 8; }

/// ||y||_2 / sqrt(n) of finite y[0..n) (0 for n = 0). The sum of squares is kernels' reproducible
/// one, so it does not depend on threads, ISA or host vs CUDA.
inline float scale_of(const float* y, std::size_t n) {
  return n == 0 ? 0.0f : scale_from_sum_squares(kernels::host::sum_squares(y, n), n);
}

namespace detail {
inline constexpr auto kReverseBits = [] {  // m with its 8 bits in reverse order
  std::array<std::uint8_t, 256> t{};
  for (unsigned m = 0; m < 256; ++m) {
    unsigned r = 0;
    for (unsigned i = 0; i < 8; ++i) r |= ((m >> i) & 1u) << (7u - i);
    t[m] = static_cast<std::uint8_t>(r);
  }
  return t;
}();
#if ZEROTK_HOST_X86_SIMD
/// 4 values: the mask of y >= 0 and, in place, residual(y, scale): +scale where the mask is set,
/// -scale elsewhere, subtracted once (the same single rounding as residual).
inline int residual4(float* p, __m128 zero, __m128 plus, __m128 minus) {
  const __m128 v = _mm_loadu_ps(p);
  const __m128 ge = _mm_cmpge_ps(v, zero);
  _mm_storeu_ps(p, _mm_sub_ps(v, _mm_or_ps(_mm_and_ps(ge, plus), _mm_andnot_ps(ge, minus))));
  return _mm_movemask_ps(ge);
}
#endif

/// pack_with_feedback on one thread.
inline void pack_with_feedback_range(float* y, std::size_t n, float scale, std::uint8_t* bits) {
  const std::size_t full = n / 8;
  std::size_t b = 0;
#if ZEROTK_HOST_X86_SIMD
  const __m128 zero = _mm_setzero_ps(), plus = _mm_set1_ps(scale), minus = _mm_set1_ps(-scale);
  for (; b < full; ++b) {
    const int lo = detail::residual4(y + 8 * b, zero, plus, minus);
    const int hi = detail::residual4(y + 8 * b + 4, zero, plus, minus);
    bits[b] = detail::kReverseBits[static_cast<unsigned>(lo | (hi << 4))];
  }
#endif
  for (; b < full; ++b) {
    float* p = y + 8 * b;
    bits[b] = pack_byte(p, 8);
    for (unsigned j = 0; j < 8; ++j) p[j] = residual(p[j], scale);
  }
  if (const unsigned rest = static_cast<unsigned>(n - 8 * full); rest != 0) {
    float* p = y + 8 * full;
    bits[full] = pack_byte(p, rest);
    for (unsigned j = 0; j < rest; ++j) p[j] = residual(p[j], scale);
  }
}
}  // namespace detail

/// bits = signs of y[0..n); y[j] becomes residual(y[j], scale) (y is the error buffer in place).
/// On x86-64 8 values at a time through SSE2 (baseline), bit for bit the per-element functions; over
/// the threads of kernels/host/parallel.hpp, whose shares start on multiples of 64 values (whole
/// bytes), so the bits do not depend on the number of threads.
inline void pack_with_feedback(float* y, std::size_t n, float scale, std::uint8_t* bits) {
  static_assert(kernels::host::kShareGrain % 8 == 0, "a share must start on a whole byte of bits");
  kernels::host::for_each_share(n, [&](std::size_t b, std::size_t e) {
    detail::pack_with_feedback_range(y + b, e - b, scale, bits + b / 8);
  });
}

/// bits = signs of y[0..n), no feedback (the packing alone; benchmarked against memcpy). On x86-64,
/// 8 values per byte through SSE2 (baseline: no dispatch needed): compare y >= 0 (so -0 gives 1 and
/// NaN 0, as bit_of), movemask, reverse the byte. Elsewhere, and for the tail, pack_byte.
inline void pack(const float* y, std::size_t n, std::uint8_t* bits) {
  const std::size_t full = n / 8;
  std::size_t b = 0;
#if ZEROTK_HOST_X86_SIMD
  const __m128 zero = _mm_setzero_ps();
  for (; b < full; ++b) {
    const float* p = y + 8 * b;
    const int lo = _mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(p), zero));
    const int hi = _mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(p + 4), zero));
    bits[b] = detail::kReverseBits[static_cast<unsigned>(lo | (hi << 4))];
  }
#endif
  for (; b < full; ++b) bits[b] = pack_byte(y + 8 * b, 8);
  if (const unsigned rest = static_cast<unsigned>(n - 8 * full); rest != 0) bits[full] = pack_byte(y + 8 * full, rest);
}

namespace detail {
/// put(out[j], value(j)) for every j. Large n go through a table of the 256 bytes' 8 values (8 KiB,
/// built per call): one 32-byte row per byte.
template <class Put>
void unpack_each(const std::uint8_t* bits, std::size_t n, float scale, float* out, Put put) {
  constexpr std::size_t kTableMinValues = 8 * 4096;
  std::size_t j = 0;
  if (n >= kTableMinValues) {
    alignas(64) static thread_local float table[256][8];
    const std::uint32_t magnitude = zerotk::detail::float_bits(scale), negative = zerotk::detail::float_bits(-scale);
    for (unsigned b = 0; b < 256; ++b) {
      for (unsigned k = 0; k < 8; ++k) table[b][k] = zerotk::detail::bits_float(((b >> (7u - k)) & 1u) ? magnitude : negative);
    }
    const std::size_t full = n / 8;
    for (std::size_t b = 0; b < full; ++b) {
      const float* row = table[bits[b]];
      float* o = out + 8 * b;
      for (unsigned k = 0; k < 8; ++k) put(o[k], row[k]);
    }
    j = 8 * full;
  }
  for (; j < n; ++j) put(out[j], value(bits, j, scale));
}
}  // namespace detail

/// out[j] = +-scale from the packed bits of n values: sign::value for every j, bit for bit. Large n
/// go through a table of the 256 bytes' 8 values (8 KiB, built per call), so each byte is one
/// 32-byte copy the compiler vectorizes; the per-element loop handles small n and the tail.
/// Over the threads, in shares of whole bytes.
inline void unpack(const std::uint8_t* bits, std::size_t n, float scale, float* out) {
  kernels::host::for_each_share(n, [&](std::size_t b, std::size_t e) {
    detail::unpack_each(bits + b / 8, e - b, scale, out + b, [](float& o, float v) { o = v; });
  });
}

/// sum[j] += value(j): the same values as unpack, added in place.
inline void unpack_add(const std::uint8_t* bits, std::size_t n, float scale, float* sum) {
  kernels::host::for_each_share(n, [&](std::size_t b, std::size_t e) {
    detail::unpack_each(bits + b / 8, e - b, scale, sum + b, [](float& o, float v) { o += v; });
  });
}

}  // namespace sign

/// The 1-bit codec with error feedback (models ErrorFeedbackCodec). Stateless: the caller owns the
/// error buffer.
class SignCodec {
 public:
  static constexpr std::size_t kHeaderBytes = 4;  // the fp32 scale

  /// 4 + ceil(n / 8).
  static constexpr std::size_t payload_bytes(std::size_t n) noexcept { return kHeaderBytes + sign::packed_bytes(n); }

  /// y = x + err; out = scale and signs of y; err = y - decoded. Returns payload_bytes(n).
  std::size_t encode(std::span<const float> x, std::span<float> err, std::span<std::uint8_t> out) const {
    const std::size_t n = x.size();
    detail::check_encode_sizes("compress::SignCodec::encode", n, err.size(), out.size(), payload_bytes(n));
    (void)detail::add_feedback_checked("compress::SignCodec::encode", x, err.data());
    const float scale = sign::scale_of(err.data(), n);
    detail::store_le_f32(out.data(), scale);
    sign::pack_with_feedback(err.data(), n, scale, out.data() + kHeaderBytes);
    return payload_bytes(n);
  }

  /// decoded[j] = +-scale. `in` must hold payload_bytes(decoded.size()) bytes.
  void decode(std::span<const std::uint8_t> in, std::span<float> decoded) const {
    const std::size_t n = decoded.size();
    detail::check_payload_size("compress::SignCodec::decode", in.size(), payload_bytes(n), n);
    sign::unpack(in.data() + kHeaderBytes, n, detail::load_le_f32(in.data()), decoded.data());
  }

  /// sum[j] += sign::value(j): sum + decode(in), element by element.
  void decode_add(std::span<const std::uint8_t> in, std::span<float> sum) const {
    const std::size_t n = sum.size();
    detail::check_payload_size("compress::SignCodec::decode_add", in.size(), payload_bytes(n), n);
    sign::unpack_add(in.data() + kHeaderBytes, n, detail::load_le_f32(in.data()), sum.data());
  }
};

}  // namespace zerotk::compress
