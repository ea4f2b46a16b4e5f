#pragma once
/// \file zerotk/io/bytes.hpp
/// Little-endian encoding of integers and fp32 arrays into a byte vector, and a bounds-checked
/// reader over one: every read past the end is an io_error at "path:offset", never a wild read.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "zerotk/core/error.hpp"

namespace zerotk::io {

namespace detail {

template <class U>
constexpr U byteswap_if_big(U v) noexcept {
  if constexpr (std::endian::native == std::endian::little || sizeof(U) == 1) {
    return v;
  } else {
    U r = 0;
    for (std::size_t i = 0; i < sizeof(U); ++i) r = static_cast<U>((r << 8) | ((v >> (8 * i)) & 0xff));
    return r;
  }
}

template <class T>
using uint_of = std::conditional_t<
    sizeof(T) == 1, std::uint8_t,
    std::conditional_t<sizeof(T) == 2, std::uint16_t, std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>>;

}  // namespace detail

/// Turns values just copied from little-endian bytes into host order, in place (nothing to do on a
/// little-endian host). T: 1-, 2-, 4- or 8-byte trivially copyable values.
template <class T>
  requires(std::is_trivially_copyable_v<T> && (sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8))
void from_little_endian(std::span<T> v) noexcept {
  if constexpr (std::endian::native != std::endian::little && sizeof(T) > 1) {
    using U = detail::uint_of<T>;
    for (T& x : v) x = std::bit_cast<T>(detail::byteswap_if_big(std::bit_cast<U>(x)));
  } else {
    (void)v;
  }
}

/// Host-order values turned into little-endian order in place (the same swap, for the writing side).
template <class T>
void to_little_endian(std::span<T> v) noexcept {
  from_little_endian(v);
}

/// Appends little-endian values.
class ByteWriter {
 public:
  template <class T>
    requires(std::is_arithmetic_v<T> && (sizeof(T) == 1 || sizeof(T) == 4 || sizeof(T) == 8))
  void put(T v) {
    using U = detail::uint_of<T>;
    const U le = detail::byteswap_if_big(std::bit_cast<U>(v));
    const auto* p = reinterpret_cast<const std::byte*>(&le);
    bytes_.insert(bytes_.end(), p, p + sizeof(U));
  }
  void put_u16(std::uint16_t v) {
    put(static_cast<std::uint8_t>(v & 0xff));
    put(static_cast<std::uint8_t>(v >> 8));
  }
  void put_raw(std::span<const std::byte> b) { bytes_.insert(bytes_.end(), b.begin(), b.end()); }
  void put_text(std::string_view s) { put_raw(std::as_bytes(std::span<const char>(s.data(), s.size()))); }
  /// An array of 4- or 8-byte values, element by element in little-endian order.
  template <class T>
  void put_array(std::span<const T> v) {
    if constexpr (std::endian::native == std::endian::little) {
      put_raw(std::as_bytes(v));
    } else {
      for (const T& x : v) put(x);
    }
  }
  const std::vector<std::byte>& bytes() const noexcept { return bytes_; }
  std::vector<std::byte>& bytes() noexcept { return bytes_; }
  std::size_t size() const noexcept { return bytes_.size(); }

 private:
  std::vector<std::byte> bytes_;
};

/// Reads little-endian values from `bytes`; `name` (a path) and the offset go into every error.
/// `base` is the offset of `bytes` in that file, for a reader over a piece of it.
class ByteReader {
 public:
  ByteReader(std::span<const std::byte> bytes, std::string name, std::uint64_t base = 0)
      : bytes_(bytes), name_(std::move(name)), base_(base) {}

  template <class T>
    requires(std::is_arithmetic_v<T> && (sizeof(T) == 1 || sizeof(T) == 4 || sizeof(T) == 8))
  T get(std::string_view what) {
    using U = detail::uint_of<T>;
    U le;
    std::memcpy(&le, take(sizeof(U), what).data(), sizeof(U));
    return std::bit_cast<T>(detail::byteswap_if_big(le));
  }
  std::uint16_t get_u16(std::string_view what) {
    const std::span<const std::byte> b = take(2, what);
    return static_cast<std::uint16_t>(std::to_integer<unsigned>(b[0]) | (std::to_integer<unsigned>(b[1]) << 8));
  }
  std::string get_text(std::size_t n, std::string_view what) {
    const std::span<const std::byte> b = take(n, what);
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  }
  template <class T>
  void get_array(std::span<T> out, std::string_view what) {
    const std::span<const std::byte> b = take(out.size_bytes(), what);
    if (!out.empty()) std::memcpy(out.data(), b.data(), b.size());
    from_little_endian(out);
  }
  /// The next `n` bytes; an io_error naming `what`, the offset and the sizes if fewer are left.
  std::span<const std::byte> take(std::size_t n, std::string_view what) {
    if (n > remaining()) {
      throw io_error("truncated: " + std::string(what) + " needs " + std::to_string(n) + " bytes",
                     where(), std::to_string(remaining()) + " bytes left of " + std::to_string(bytes_.size()));
    }
    const std::span<const std::byte> b = bytes_.subspan(pos_, n);
    pos_ += n;
    return b;
  }
  /// Offset of the next byte in `bytes` (not counting `base`).
  std::size_t offset() const noexcept { return pos_; }
  std::size_t remaining() const noexcept { return bytes_.size() - pos_; }
  std::string where() const { return name_ + ":" + std::to_string(base_ + pos_); }

 private:
  std::span<const std::byte> bytes_;
  std::string name_;
  std::uint64_t base_ = 0;
  std::size_t pos_ = 0;
};

}  // namespace zerotk::io
