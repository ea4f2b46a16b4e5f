#pragma once
/// \file zerotk/checkpoint/checksum.hpp
/// The checksum of checkpoint files: XXH3-64 (libxxhash, used header-only), written as 16 lower-case
/// hex digits; of bytes in memory, or of bytes fed piece by piece (StreamingChecksum), for files
/// read in bounded memory. This is the only file that includes xxhash.h.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <string_view>

#include "zerotk/core/macros.hpp"

#if !ZEROTK_HAS_XXHASH
#error "zerotk/checkpoint needs libxxhash: link the CMake target zerotk::xxhash (it defines ZEROTK_HAS_XXHASH=1), or, in a vendored copy, define ZEROTK_HAS_XXHASH=1 and put xxhash.h (Debian: libxxhash-dev) on the include path"
#endif

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

namespace zerotk::checkpoint {

inline std::uint64_t checksum(std::span<const std::byte> bytes) noexcept {
  return static_cast<std::uint64_t>(XXH3_64bits(bytes.data(), bytes.size()));
}

inline std::uint64_t checksum(std::string_view text) noexcept {
  return static_cast<std::uint64_t>(XXH3_64bits(text.data(), text.size()));
}

/// XXH3-64 of bytes fed in pieces: value() equals checksum() of everything update() was given so
/// far, and update() may go on after value().
class StreamingChecksum {
 public:
  StreamingChecksum() : state_(XXH3_createState()) {
    if (!state_) throw std::bad_alloc();
    XXH3_64bits_reset(state_.get());
  }
  void update(std::span<const std::byte> bytes) noexcept { XXH3_64bits_update(state_.get(), bytes.data(), bytes.size()); }
  std::uint64_t value() const noexcept { return static_cast<std::uint64_t>(XXH3_64bits_digest(state_.get())); }

 private:
  struct FreeState {
    void operator()(XXH3_state_t* s) const noexcept { XXH3_freeState(s); }
  };
  std::unique_ptr<XXH3_state_t, FreeState> state_;
};

/// 16 lower-case hex digits.
inline std::string to_hex(std::uint64_t v) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<std::size_t>(i)] = kDigits[v & 0xf];
  return s;
}

}  // namespace zerotk::checkpoint
