#pragma once
/// \file zerotk/core/utf8.hpp
/// Well-formed UTF-8, checked by code point: what the config reader prints safely and what file
/// formats with UTF-8 names (safetensors) must reject before writing.

#include <cstddef>
#include <string_view>

namespace zerotk {

/// Length of the UTF-8 sequence starting at text[i] and its code point, or 0 when the bytes
/// there are not well-formed UTF-8 (stray continuation, overlong form, surrogate, > U+10FFFF).
inline std::size_t utf8_sequence(std::string_view text, std::size_t i, char32_t& cp) noexcept {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(text[i + k]); };
  const unsigned char c = b(0);
  std::size_t n = 0;
  if (c < 0x80) {
    cp = c;
    return 1;
  }
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
    cp = c & 0x1Fu;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    cp = c & 0x0Fu;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    cp = c & 0x07u;
  } else {
    return 0;
  }
  if (i + n > text.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xC0u) != 0x80u) return 0;
    cp = (cp << 6) | (b(k) & 0x3Fu);
  }
  const bool overlong = (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000);
  if (overlong || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return 0;
  return n;
}

/// True when all of `text` is well-formed UTF-8.
inline bool is_utf8(std::string_view text) noexcept {
  char32_t cp = 0;
  for (std::size_t i = 0, n = 0; i < text.size(); i += n) {
    if ((n = utf8_sequence(text, i, cp)) == 0) return false;
  }
  return true;
}

}  // namespace zerotk
