#pragma once
/// \file zerotk/compress/two_bit.hpp
/// 2-bit quantisation with error feedback: four uniform levels around 0, scaled by the largest |y|.
///
///   y     = x + err                                          fp32
///   m     = max_j |y_j|;   step = m / 1.5                    fp32, one rounding (0 when m = 0)
///   levels (code 0..3):  -1.5 step, -0.5 step, +0.5 step, +1.5 step
///                        (0.5 step is exact; 1.5 step is one rounding)
///   code_j = 0 if y_j < -step,  1 if y_j < 0,  2 if y_j < step,  3 otherwise
///            i.e. the nearest level, ties toward +inf (decided by comparisons, no division)
///   err_j = y_j - level(code_j)                              one fp32 rounding
///
/// so |y_j - level| <= 0.5 step for |y_j| <= 1.5 step, and the largest |y| lands on +-1.5 step, which
/// equals m up to one rounding. (If 1.5 step would overflow, step is lowered to the float below it.)
/// Zero gets code 2 (+0.5 step), like the sign codec's sign(0) = +1; when every y is 0 (step 0),
/// every code is 3 and every level 0.
///
/// Payload: [fp32 step, little-endian][ceil(n/4) bytes of codes, element j in byte j/4 at bits
/// 7-2(j%4) and 6-2(j%4), most significant first; unused low bits of the last byte are 0].
/// payload_bytes(n) = 4 + ceil(n / 4): 2 bits per value plus the scale.
/// Error feedback: |level_j + err_j - y_j| <= 2^-24 |err_j|.

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "zerotk/compress/codec.hpp"
#include "zerotk/kernels/host/parallel.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/core/macros.hpp"
#include "zerotk/kernels/host/simd.hpp"  // ZEROTK_HOST_X86_SIMD and <immintrin.h>

namespace zerotk::compress {

namespace two_bit {

// ---- per element (host and device) -------------------------------------------------------------

/// The step for a largest magnitude m (finite, >= 0).
ZEROTK_HD ZEROTK_FORCEINLINE float step_of_max(float m) {
  float step = m / 1.5f;
  while (detail::abs_key(1.5f * step) >= detail::kNonfiniteKey) {
    step = zerotk::detail::bits_float(zerotk::detail::float_bits(step) - 1u);  // the float below
  }
  return step;
}

ZEROTK_HD ZEROTK_FORCEINLINE std::uint32_t code_of(float y, float step) {
  // The number of boundaries -step <= 0 <= step at or below y: the comparisons vectorize, the
  // nested choice they replace does not.
  return static_cast<std::uint32_t>(y >= -step) + static_cast<std::uint32_t>(y >= 0.0f) +
         static_cast<std::uint32_t>(y >= step);
}

/// The level of a code: one rounded product, which the caller subtracts. On the device the products
/// are __fmul_rn, which nvcc never contracts with that subtraction into an fma (the host's baseline
/// x86-64 build has no fma to contract into).
ZEROTK_HD ZEROTK_FORCEINLINE float level(std::uint32_t code, float step) {
#if defined(__CUDA_ARCH__)
  const float half = __fmul_rn(0.5f, step), big = __fmul_rn(1.5f, step);
#else
  const float half = 0.5f * step, big = 1.5f * step;
#endif
  return code == 0 ? -big : (code == 1 ? -half : (code == 2 ? half : big));
}

/// The byte holding the codes of y[0..count), count in 1..4.
ZEROTK_HD ZEROTK_FORCEINLINE std::uint8_t pack_byte(const float* y, unsigned count, float step) {
  std::uint32_t b = 0;
  for (unsigned j = 0; j < count; ++j) b |= code_of(y[j], step) << (6u - 2u * j);
  return static_cast<std::uint8_t>(b);
}

ZEROTK_HD ZEROTK_FORCEINLINE std::uint32_t code_at(const std::uint8_t* codes, std::size_t j) {
  return (codes[j >> 2] >> (6u - 2u * static_cast<unsigned>(j & 3u))) & 3u;
}

// ---- host drivers ---------------------------------------------------------------------------------

constexpr std::size_t packed_bytes(std::size_t n) noexcept { return (n + 3) / 4; }

namespace detail {
/// kInterleave[h | l << 4]: the byte of 4 codes whose high bits are h and low bits l (bit j of each
/// nibble for element j), element j at bits 7-2j (high) and 6-2j (low).
inline constexpr auto kInterleave = [] {
  std::array<std::uint8_t, 256> t{};
  for (unsigned m = 0; m < 256; ++m) {
    unsigned r = 0;
    for (unsigned j = 0; j < 4; ++j) r |= (((m >> j) & 1u) << (7u - 2u * j)) | (((m >> (4 + j)) & 1u) << (6u - 2u * j));
    t[m] = static_cast<std::uint8_t>(r);
  }
  return t;
}();

/// pack_with_feedback on one thread.
inline void pack_with_feedback_range(float* y, std::size_t n, float step, std::uint8_t* codes) {
  const std::size_t full = n / 4;
  const float half = 0.5f * step, big = 1.5f * step;
  std::size_t b = 0;
#if ZEROTK_HOST_X86_SIMD
  const __m128 zero = _mm_setzero_ps(), up = _mm_set1_ps(step), down = _mm_set1_ps(-step);
  const __m128 ones = _mm_castsi128_ps(_mm_set1_epi32(-1));
  const __m128 vhalf = _mm_set1_ps(half), vbig = _mm_set1_ps(big), vnhalf = _mm_set1_ps(-half), vnbig = _mm_set1_ps(-big);
  for (; b < full; ++b) {
    float* p = y + 4 * b;
    const __m128 v = _mm_loadu_ps(p);
    const __m128 at_zero = _mm_cmpge_ps(v, zero), ge_down = _mm_cmpge_ps(v, down), ge_up = _mm_cmpge_ps(v, up);
    const __m128 low = _mm_xor_ps(_mm_xor_ps(ge_down, at_zero), ge_up);
    const __m128 outer = _mm_or_ps(ge_up, _mm_andnot_ps(ge_down, ones));  // code 0 or 3
    const __m128 pos = _mm_or_ps(_mm_and_ps(outer, vbig), _mm_andnot_ps(outer, vhalf));
    const __m128 neg = _mm_or_ps(_mm_and_ps(outer, vnbig), _mm_andnot_ps(outer, vnhalf));
    _mm_storeu_ps(p, _mm_sub_ps(v, _mm_or_ps(_mm_and_ps(at_zero, pos), _mm_andnot_ps(at_zero, neg))));
    codes[b] = detail::kInterleave[static_cast<unsigned>(_mm_movemask_ps(at_zero) | (_mm_movemask_ps(low) << 4))];
  }
#endif
  for (; b < full; ++b) {
    float* p = y + 4 * b;
    codes[b] = pack_byte(p, 4, step);
    for (unsigned j = 0; j < 4; ++j) p[j] = p[j] - level(code_of(p[j], step), step);
  }
  if (const unsigned rest = static_cast<unsigned>(n - 4 * full); rest != 0) {
    float* p = y + 4 * full;
    codes[full] = pack_byte(p, rest, step);
    for (unsigned j = 0; j < rest; ++j) p[j] = p[j] - level(code_of(p[j], step), step);
  }
  (void)half;
  (void)big;
}
}  // namespace detail

/// codes of y[0..n); y[j] becomes y[j] - level (the error buffer in place). On x86-64 4 values at a
/// time through SSE2 (baseline), bit for bit the per-element functions; over the threads of
/// kernels/host/parallel.hpp in shares of whole bytes, so the codes do not depend on the threads.
inline void pack_with_feedback(float* y, std::size_t n, float step, std::uint8_t* codes) {
  static_assert(kernels::host::kShareGrain % 4 == 0, "a share must start on a whole byte of codes");
  kernels::host::for_each_share(n, [&](std::size_t b, std::size_t e) {
    detail::pack_with_feedback_range(y + b, e - b, step, codes + b / 4);
  });
}

/// codes of y[0..n), no feedback (the packing alone; benchmarked against memcpy). On x86-64, 4 values
/// per byte through SSE2 (baseline: no dispatch needed): a code's high bit is y >= 0, its low bit
/// (y >= -step) xor (y >= 0) xor (y >= step), which is code_of's count written in binary; two
/// movemasks and a table give the byte. Elsewhere, and for the tail, pack_byte.
inline void pack(const float* y, std::size_t n, float step, std::uint8_t* codes) {
  const std::size_t full = n / 4;
  std::size_t b = 0;
#if ZEROTK_HOST_X86_SIMD
  const __m128 zero = _mm_setzero_ps(), up = _mm_set1_ps(step), down = _mm_set1_ps(-step);
  for (; b < full; ++b) {
    const __m128 v = _mm_loadu_ps(y + 4 * b);
    const __m128 at_zero = _mm_cmpge_ps(v, zero);
    const __m128 low = _mm_xor_ps(_mm_xor_ps(_mm_cmpge_ps(v, down), at_zero), _mm_cmpge_ps(v, up));
    const int m = _mm_movemask_ps(at_zero) | (_mm_movemask_ps(low) << 4);
    codes[b] = detail::kInterleave[static_cast<unsigned>(m)];
  }
#endif
  for (; b < full; ++b) codes[b] = pack_byte(y + 4 * b, 4, step);
  if (const unsigned rest = static_cast<unsigned>(n - 4 * full); rest != 0) codes[full] = pack_byte(y + 4 * full, rest, step);
}

namespace detail {
/// put(out[j], level(code j)) for every j. Large n go through a table of the 256 bytes' 4 levels
/// (4 KiB, built per call): one 16-byte row per byte.
template <class Put>
void unpack_each(const std::uint8_t* codes, std::size_t n, float step, float* out, Put put) {
  constexpr std::size_t kTableMinValues = 4 * 4096;
  std::size_t j = 0;
  if (n >= kTableMinValues) {
    alignas(64) static thread_local float table[256][4];
    for (unsigned b = 0; b < 256; ++b) {
      for (unsigned k = 0; k < 4; ++k) table[b][k] = level((b >> (6u - 2u * k)) & 3u, step);
    }
    const std::size_t full = n / 4;
    for (std::size_t b = 0; b < full; ++b) {
      const float* row = table[codes[b]];
      float* o = out + 4 * b;
      for (unsigned k = 0; k < 4; ++k) put(o[k], row[k]);
    }
    j = 4 * full;
  }
  for (; j < n; ++j) put(out[j], level(code_at(codes, j), step));
}
}  // namespace detail

/// out[j] = level(code j): two_bit::level for every j, bit for bit.
inline void unpack(const std::uint8_t* codes, std::size_t n, float step, float* out) {
  detail::unpack_each(codes, n, step, out, [](float& o, float v) { o = v; });
}

/// sum[j] += level(code j): the same values as unpack, added in place (a gathered payload summed
/// into a running total without a decoded copy).
inline void unpack_add(const std::uint8_t* codes, std::size_t n, float step, float* sum) {
  detail::unpack_each(codes, n, step, sum, [](float& o, float v) { o += v; });
}

}  // namespace two_bit

/// The 2-bit codec with error feedback (models ErrorFeedbackCodec).
class TwoBitCodec {
 public:
  static constexpr std::size_t kHeaderBytes = 4;  // the fp32 step

  /// 4 + ceil(n / 4).
  static constexpr std::size_t payload_bytes(std::size_t n) noexcept { return kHeaderBytes + two_bit::packed_bytes(n); }

  std::size_t encode(std::span<const float> x, std::span<float> err, std::span<std::uint8_t> out) const {
    const std::size_t n = x.size();
    detail::check_encode_sizes("compress::TwoBitCodec::encode", n, err.size(), out.size(), payload_bytes(n));
    const std::uint32_t max_key = detail::add_feedback_checked("compress::TwoBitCodec::encode", x, err.data());
    const float step = two_bit::step_of_max(zerotk::detail::bits_float(max_key));
    detail::store_le_f32(out.data(), step);
    two_bit::pack_with_feedback(err.data(), n, step, out.data() + kHeaderBytes);
    return payload_bytes(n);
  }

  void decode(std::span<const std::uint8_t> in, std::span<float> decoded) const {
    const std::size_t n = decoded.size();
    detail::check_payload_size("compress::TwoBitCodec::decode", in.size(), payload_bytes(n), n);
    two_bit::unpack(in.data() + kHeaderBytes, n, detail::load_le_f32(in.data()), decoded.data());
  }

  /// sum[j] += two_bit::level(code j): sum + decode(in), element by element.
  void decode_add(std::span<const std::uint8_t> in, std::span<float> sum) const {
    const std::size_t n = sum.size();
    detail::check_payload_size("compress::TwoBitCodec::decode_add", in.size(), payload_bytes(n), n);
    two_bit::unpack_add(in.data() + kHeaderBytes, n, detail::load_le_f32(in.data()), sum.data());
  }
};

}  // namespace zerotk::compress
