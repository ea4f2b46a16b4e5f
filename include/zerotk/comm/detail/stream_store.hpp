#pragma once
// zerotk/comm/detail/stream_store.hpp (internal)
// Non-temporal (streaming) stores for the threads back end's large outputs, and the last-level
// cache size that decides when to use them.
//
// Why: an ordinary store to a line that is not cached first reads it (read for ownership), so a
// copy or reduction whose output does not stay in the cache moves its output bytes twice. Streaming
// stores write whole lines without reading them, as glibc's memcpy does above its non-temporal
// threshold; the bench's memcpy bound streams too. Data that fits in the cache is faster with
// ordinary stores (the reader finds it there), so the threads engine streams only when an
// operation touches more bytes than the last-level cache holds.
//
// Ordering: streaming stores are weakly ordered. Every thread that streamed calls `stream_fence()`
// before it publishes its part as done (under Context::mu), so whoever acquires the lock after it
// sees the data.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "zerotk/core/macros.hpp"
#include "zerotk/core/runtime.hpp"

// SSE2 is part of the x86-64 baseline: 16-byte streaming stores need no target attribute. They reach
// the same DRAM rate as 32-byte ones within a few percent for a copy (measured on a 2-core EPYC VM).
// ThreadSanitizer does not see the streaming builtins as writes (gcc 12: two threads streaming to
// the same bytes go unreported), so under it ordinary stores stand in and the engine's
// synchronization of outputs stays checked.
#if defined(__SANITIZE_THREAD__)  // gcc
#define ZEROTK_COMM_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)  // clang
#define ZEROTK_COMM_UNDER_TSAN 1
#endif
#endif
#ifndef ZEROTK_COMM_UNDER_TSAN
#define ZEROTK_COMM_UNDER_TSAN 0
#endif
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__)) && \
    !ZEROTK_COMM_UNDER_TSAN && !defined(__CUDA_ARCH__)
#define ZEROTK_COMM_STREAM_STORES 1
#include <emmintrin.h>
#else
#define ZEROTK_COMM_STREAM_STORES 0
#endif

namespace zerotk::comm::detail {

// Size of a cache as sysfs writes it ("32768K", "1M", "512"), 0 if unreadable.
ZEROTK_RUNTIME_INLINE std::size_t parse_cache_size(const std::string& s);

// Bytes of the largest data or unified cache of CPU 0 (sysfs, else sysconf, else 32 MiB; see
// stream_store_impl.hpp).
ZEROTK_RUNTIME_INLINE std::size_t last_level_cache_bytes_uncached();

inline std::size_t last_level_cache_bytes() {
  static const std::size_t bytes = last_level_cache_bytes_uncached();
  return bytes;
}

// Operations touching (reading plus writing) more bytes than this stream their outputs. 0: the
// last-level cache size. Tests set it low to send small cases through the streaming path.
inline std::atomic<std::size_t>& stream_threshold_override() {
  static std::atomic<std::size_t> bytes{0};
  return bytes;
}

inline std::size_t stream_threshold_bytes() {
  const std::size_t o = stream_threshold_override().load(std::memory_order_relaxed);
  return o != 0 ? o : last_level_cache_bytes();
}

// The width of one streaming store.
inline constexpr std::size_t kStreamBytes = 16;

// memcpy(dst, src, bytes) with streaming stores: ordinary stores for the bytes before `dst`'s first
// 16-byte boundary and after its last one, streaming stores between. Call stream_fence() before
// publishing.
inline void stream_copy(std::byte* dst, const std::byte* src, std::size_t bytes) noexcept {
#if ZEROTK_COMM_STREAM_STORES
  const std::size_t head =
      std::min(bytes, (kStreamBytes - reinterpret_cast<std::uintptr_t>(dst) % kStreamBytes) % kStreamBytes);
  std::memcpy(dst, src, head);
  dst += head, src += head, bytes -= head;
  std::size_t i = 0;
  for (; i + 64 <= bytes; i += 64) {  // one cache line per step: the write-combining buffer fills whole
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  for (; i + 16 <= bytes; i += 16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
  }
  std::memcpy(dst + i, src + i, bytes - i);
#else
  std::memcpy(dst, src, bytes);
#endif
}

// Writes the 16 bytes at `src` to `dst` (16-byte aligned) with a streaming store.
ZEROTK_FORCEINLINE void stream_16(std::byte* dst, const void* src) noexcept {
#if ZEROTK_COMM_STREAM_STORES
  __m128i v;
  std::memcpy(&v, src, sizeof v);
  _mm_stream_si128(reinterpret_cast<__m128i*>(dst), v);
#else
  std::memcpy(dst, src, kStreamBytes);
#endif
}

// Orders this thread's streaming stores before its later stores (the lock release that publishes).
inline void stream_fence() noexcept {
#if ZEROTK_COMM_STREAM_STORES
  _mm_sfence();
#endif
}

}  // namespace zerotk::comm::detail

#if !ZEROTK_COMPILED_RUNTIME
#include "zerotk/comm/detail/stream_store_impl.hpp"
#endif
