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

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "zerotk/compress/codec.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/core/macros.hpp"

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
  return y < -step ? 0u : (y < 0.0f ? 1u : (y < step ? 2u : 3u));
}

ZEROTK_HD ZEROTK_FORCEINLINE float level(std::uint32_t code, float step) {
  const float half = 0.5f * step, big = 1.5f * step;
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

/// codes of y[0..n); y[j] becomes y[j] - level (the error buffer in place).
inline void pack_with_feedback(float* y, std::size_t n, float step, std::uint8_t* codes) {
  const std::size_t full = n / 4;
  const float half = 0.5f * step, big = 1.5f * step;
  for (std::size_t b = 0; b < full; ++b) {
    float* p = y + 4 * b;
    std::uint32_t byte = 0;
    for (unsigned j = 0; j < 4; ++j) {
      const std::uint32_t c = code_of(p[j], step);
      byte |= c << (6u - 2u * j);
      p[j] = p[j] - (c == 0 ? -big : (c == 1 ? -half : (c == 2 ? half : big)));
    }
    codes[b] = static_cast<std::uint8_t>(byte);
  }
  if (const unsigned rest = static_cast<unsigned>(n - 4 * full); rest != 0) {
    float* p = y + 4 * full;
    codes[full] = pack_byte(p, rest, step);
    for (unsigned j = 0; j < rest; ++j) p[j] = p[j] - level(code_of(p[j], step), step);
  }
}

/// codes of y[0..n), no feedback (the packing alone; benchmarked against memcpy).
inline void pack(const float* y, std::size_t n, float step, std::uint8_t* codes) {
  const std::size_t full = n / 4;
  for (std::size_t b = 0; b < full; ++b) codes[b] = pack_byte(y + 4 * b, 4, step);
  if (const unsigned rest = static_cast<unsigned>(n - 4 * full); rest != 0) {
    codes[full] = pack_byte(y + 4 * full, rest, step);
  }
}

inline void unpack(const std::uint8_t* codes, std::size_t n, float step, float* out) {
  for (std::size_t j = 0; j < n; ++j) out[j] = level(code_at(codes, j), step);
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
    std::uint32_t max_key = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t k = detail::abs_key(x[i] + err[i]);
      max_key = k > max_key ? k : max_key;
    }
    if (max_key >= detail::kNonfiniteKey) detail::throw_nonfinite("compress::TwoBitCodec::encode", x, err);
    const float step = two_bit::step_of_max(zerotk::detail::bits_float(max_key));
    for (std::size_t i = 0; i < n; ++i) err[i] = x[i] + err[i];
    detail::store_le_f32(out.data(), step);
    two_bit::pack_with_feedback(err.data(), n, step, out.data() + kHeaderBytes);
    return payload_bytes(n);
  }

  void decode(std::span<const std::uint8_t> in, std::span<float> decoded) const {
    const std::size_t n = decoded.size();
    if (in.size() != payload_bytes(n)) {
      throw usage_error("payload must have payload_bytes(n) = " + std::to_string(payload_bytes(n)) + " bytes for n = " +
                            std::to_string(n),
                        "compress::TwoBitCodec::decode", std::to_string(in.size()));
    }
    two_bit::unpack(in.data() + kHeaderBytes, n, detail::load_le_f32(in.data()), decoded.data());
  }
};

}  // namespace zerotk::compress
