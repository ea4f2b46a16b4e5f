#pragma once
/// \file zerotk/core/glob.hpp
/// Name patterns: `*` matches any run of characters, every other character itself. Parameter rules
/// by name use them (checkpoint export's splits, Sparsity's parameters).

#include <cstddef>
#include <string_view>

namespace zerotk {

/// `text` matches `pattern`, `*` matching any run of characters.
inline bool glob_match(std::string_view pattern, std::string_view text) {
  std::size_t p = 0, t = 0, star = std::string_view::npos, mark = 0;
  while (t < text.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++, mark = t;
    } else if (p < pattern.size() && pattern[p] == text[t]) {
      ++p, ++t;
    } else if (star != std::string_view::npos) {
      p = star + 1, t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

}  // namespace zerotk
