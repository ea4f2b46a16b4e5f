#pragma once
// Shared helpers for the config tests.
#include <doctest/doctest.h>

#include <string>
#include <string_view>

#include "zerotk/config.hpp"

namespace zerotk_test {

inline std::string fixture_path(std::string_view name) {
  return std::string(ZEROTK_TEST_SOURCE_DIR) + "/config/configs/" + std::string(name);
}

inline std::string fixture(std::string_view name) { return zerotk::config::read_text_file(fixture_path(name)); }

/// All errors of a result, one per line, for failure messages.
inline std::string error_lines(const zerotk::config::ParseResult& r) {
  std::string s;
  for (const auto& e : r.errors) s += zerotk::config::format_line(e) + "\n";
  return s;
}

inline bool has_notice(const zerotk::config::ParseResult& r, std::string_view path, std::string_view text = {}) {
  for (const auto& n : r.notices) {
    if (n.path == path && n.message.find(text) != std::string::npos) return true;
  }
  return false;
}

}  // namespace zerotk_test
