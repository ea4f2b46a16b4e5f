#pragma once
/// \file zerotk/compress/codec.hpp
/// What every lossy gradient/momentum codec of zerotk::compress provides, and the helpers they share.
///
/// An error-feedback codec turns n fp32 values into a payload of exactly `payload_bytes(n)` bytes
/// (known before encoding, so receive buffers and wire-byte counts are computed up front) and keeps
/// what the payload could not carry in an error buffer that the next call adds back:
///
///   encode(x, err, out):  y = x + err                       (fp32, element by element)
///                         out = Q(y)                        (payload_bytes(x.size()) bytes)
///                         err = y - D(Q(y))                 (fp32: one rounding per element)
///   decode(in, d):        d = D(in)
///
/// so D(Q(y)) + err_new == x + err_old up to the rounding of the two fp32 operations above (each codec
/// states its own bound; top-k's is exact). Checks come first (CUTLASS's can_implement): a size that
/// does not match, or a y that is inf or NaN (an inf/NaN in x or err, or x + err overflowing), is an
/// error thrown before err or out is written, naming the offending index and value. Codecs do not
/// silently propagate NaN: DeepSpeed's sign() maps NaN to +1 and carries NaN in the error forever.
///
/// Byte order: every multi-byte field of a payload is little-endian, whatever the host. Bit order:
/// element j of a packed field sits in byte j / (8 / bits), most significant bits first (numpy's
/// packbits order, which DeepSpeed's NCCL backend gets from cupy.packbits).

#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/core/macros.hpp"
#include "zerotk/kernels/host/parallel.hpp"

namespace zerotk::compress {

/// A lossy codec with error feedback (see the file comment for the contract).
template <class C>
concept ErrorFeedbackCodec =
    requires(const C& c, std::size_t n, std::span<const float> x, std::span<float> err, std::span<std::uint8_t> out,
             std::span<const std::uint8_t> in, std::span<float> decoded) {
      { c.payload_bytes(n) } -> std::same_as<std::size_t>;  // exact, for every n
      { c.encode(x, err, out) } -> std::same_as<std::size_t>;  // returns payload_bytes(x.size())
      { c.decode(in, decoded) } -> std::same_as<void>;        // decoded.size() is n
    };

namespace detail {

/// |x|'s bits: ordering these as unsigned integers orders finite floats by magnitude, and every
/// inf/NaN compares >= kNonfiniteKey.
ZEROTK_HD ZEROTK_FORCEINLINE std::uint32_t abs_key(float x) { return zerotk::detail::float_bits(x) & 0x7fffffffu; }
inline constexpr std::uint32_t kNonfiniteKey = 0x7f800000u;

ZEROTK_HD ZEROTK_FORCEINLINE void store_le32(std::uint8_t* p, std::uint32_t v) {
  p[0] = static_cast<std::uint8_t>(v);
  p[1] = static_cast<std::uint8_t>(v >> 8);
  p[2] = static_cast<std::uint8_t>(v >> 16);
  p[3] = static_cast<std::uint8_t>(v >> 24);
}
ZEROTK_HD ZEROTK_FORCEINLINE std::uint32_t load_le32(const std::uint8_t* p) {
  return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
         (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
}
ZEROTK_HD ZEROTK_FORCEINLINE void store_le_f32(std::uint8_t* p, float v) { store_le32(p, zerotk::detail::float_bits(v)); }
ZEROTK_HD ZEROTK_FORCEINLINE float load_le_f32(const std::uint8_t* p) { return zerotk::detail::bits_float(load_le32(p)); }

inline std::string float_text(float v) { return to_text(v); }

/// Throws numerics_error naming the first i with x[i] + err[i] inf or NaN (called only once a pass
/// has seen one, so the scan is off the hot path).
[[noreturn]] inline void throw_nonfinite(const char* where, std::span<const float> x, std::span<const float> err) {
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float y = x[i] + err[i];
    if (abs_key(y) >= kNonfiniteKey) {
      throw numerics_error("input + error feedback is inf or NaN at index " + std::to_string(i) + " (input " +
                               float_text(x[i]) + ", error " + float_text(err[i]) + ")",
                           where, float_text(y));
    }
  }
  throw numerics_error("input + error feedback is inf or NaN", where);  // not reached
}

/// err[i] := x[i] + err[i] for i < n, after checking that none of the sums is inf or NaN (the check
/// comes first, so on the error nothing has changed). Returns the largest |x[i] + err[i]| as its
/// magnitude bits (abs_key), which the codecs turn into their scale or step.
/// Both passes run over the threads of kernels/host/parallel.hpp (a maximum and an elementwise add:
/// the same result on any number of threads).
inline std::uint32_t add_feedback_checked(const char* where, std::span<const float> x, float* err) {
  const std::size_t n = x.size();
  const float* in = x.data();
  std::atomic<std::uint32_t> max_key{0};
  kernels::host::for_each_share(n, [&](std::size_t b, std::size_t e) {
    std::uint32_t m = 0;
    for (std::size_t i = b; i < e; ++i) {
      const std::uint32_t k = abs_key(in[i] + err[i]);
      m = k > m ? k : m;
    }
    std::uint32_t seen = max_key.load(std::memory_order_relaxed);
    while (m > seen && !max_key.compare_exchange_weak(seen, m, std::memory_order_relaxed)) {
    }
  });
  if (max_key.load() >= kNonfiniteKey) throw_nonfinite(where, x, std::span<const float>(err, n));
  kernels::host::for_each_share(n, [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) err[i] = in[i] + err[i];
  });
  return max_key.load();
}

/// A decode's payload must be exactly payload_bytes(n) long.
inline void check_payload_size(const char* where, std::size_t got, std::size_t need, std::size_t n) {
  if (got != need) {
    throw usage_error("payload must have payload_bytes(n) = " + std::to_string(need) + " bytes for n = " +
                          std::to_string(n),
                      where, std::to_string(got));
  }
}

/// The size checks every encode does before touching anything.
inline void check_encode_sizes(const char* where, std::size_t n, std::size_t err_n, std::size_t out_bytes,
                               std::size_t need_bytes) {
  if (err_n != n) {
    throw usage_error("error buffer must have as many elements as the input (" + std::to_string(n) + ")", where,
                      std::to_string(err_n));
  }
  if (out_bytes < need_bytes) {
    throw usage_error("output buffer smaller than payload_bytes(n) = " + std::to_string(need_bytes), where,
                      std::to_string(out_bytes));
  }
}

}  // namespace detail
}  // namespace zerotk::compress
