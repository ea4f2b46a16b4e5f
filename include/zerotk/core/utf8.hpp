#pragma once
/// \file zerotk/core/utf8.hpp
/// Well-formed UTF-8, checked by code point: what the config reader prints safely and what file
/// formats with UTF-8 names (safetensors) must reject before writing; and printable(), which makes
/// untrusted text (a config key, a checkpoint tag read from a file) safe to print on one line.

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <string>
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

/// Code points that would break a one-line message or take over a terminal: C0 and C1 controls,
/// DEL, line/paragraph separators, bidirectional overrides and marks, and the BOM.
constexpr bool unsafe_to_print(char32_t cp) noexcept {
  return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F) || cp == 0x061C || cp == 0x200E || cp == 0x200F ||
         (cp >= 0x2028 && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069) || cp == 0xFEFF;
}

/// `text` made safe to print on one line: unsafe code points become JSON-style escapes (\n, \t,
/// \u001b, \u202e), bytes that are not UTF-8 become \xNN, and with `escape_backslash` a
/// backslash becomes \\ (so an escape in the output always means an escape). The result is at
/// most `max_chars` bytes (>= 4): longer text is cut at a character boundary and ends in "...".
/// Reads at most about `max_chars` characters of `text`, so cutting a huge string costs nothing.
inline std::string printable(std::string_view text, std::size_t max_chars = 4096, bool escape_backslash = false) {
  max_chars = std::max<std::size_t>(max_chars, 4);
  std::string out;
  std::size_t keep = 0;  // the longest prefix, cut at a piece boundary, that leaves room for "..."
  for (std::size_t i = 0; i < text.size();) {
    char32_t cp = 0;
    const std::size_t n = utf8_sequence(text, i, cp);
    char piece[16];
    std::size_t len = 0;
    if (n == 0) {
      len = static_cast<std::size_t>(std::snprintf(piece, sizeof piece, "\\x%02X", static_cast<unsigned char>(text[i])));
      i += 1;
    } else if (unsafe_to_print(cp)) {
      const char* named = cp == '\n' ? "\\n" : cp == '\t' ? "\\t" : cp == '\r' ? "\\r" : nullptr;
      len = named ? static_cast<std::size_t>(std::snprintf(piece, sizeof piece, "%s", named))
                  : static_cast<std::size_t>(std::snprintf(piece, sizeof piece, "\\u%04x", static_cast<unsigned>(cp)));
      i += n;
    } else if (escape_backslash && cp == '\\') {
      piece[0] = piece[1] = '\\';
      len = 2;
      i += 1;
    } else {
      std::copy_n(text.data() + i, n, piece);
      len = n;
      i += n;
    }
    out.append(piece, len);
    if (out.size() + 3 <= max_chars) keep = out.size();
    if (out.size() > max_chars || (out.size() == max_chars && i < text.size())) {
      out.resize(keep);
      out += "...";
      return out;
    }
  }
  return out;
}

}  // namespace zerotk
