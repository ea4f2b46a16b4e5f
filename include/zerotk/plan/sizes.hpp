#pragma once
/// \file zerotk/plan/sizes.hpp
/// Numbers from the command line: counts ("7.5e9", "125M", "1.5B") and byte sizes ("80GB",
/// "80GiB", "512MB", "1e9"). Decimal suffixes are powers of 1000 (K, M, B or G, T), binary ones
/// (KiB, MiB, GiB, TiB) powers of 1024; a count must come out a whole non-negative number.
/// Errors are config_error naming the flag and the text.

#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <string>
#include <string_view>

#include "zerotk/core/error.hpp"

namespace zerotk::plan {

namespace detail {

inline double number_prefix(std::string_view flag, std::string_view text, std::size_t& used) {
  const std::string s(text);
  if (s.empty() || s.front() == '-' || s.front() == '+' || std::isspace(static_cast<unsigned char>(s.front()))) {
    throw config_error("must be a non-negative number", std::string(flag), s);
  }
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  used = static_cast<std::size_t>(end - s.c_str());
  if (used == 0 || !std::isfinite(v) || v < 0) throw config_error("must be a finite non-negative number", std::string(flag), s);
  // strtod reads "0x..", "inf", "nan": only plain decimal notation is a size here.
  for (std::size_t i = 0; i < used; ++i) {
    const char ch = s[i];
    if (!(std::isdigit(static_cast<unsigned char>(ch)) || ch == '.' || ch == 'e' || ch == 'E' || ch == '+' || ch == '-')) {
      throw config_error("must be a decimal number", std::string(flag), s);
    }
  }
  return v;
}

inline double scaled(std::string_view flag, std::string_view text, bool bytes) {
  std::size_t used = 0;
  const double v = number_prefix(flag, text, used);
  std::string suffix(text.substr(used));
  for (auto& ch : suffix) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (bytes && !suffix.empty() && suffix.back() == 'B' && suffix != "B") {
    if (suffix.size() >= 3 && suffix[suffix.size() - 2] == 'I') {
      const std::string p = suffix.substr(0, suffix.size() - 2);
      const double k = p == "K" ? 1024.0 : p == "M" ? 1048576.0 : p == "G" ? 1073741824.0 : p == "T" ? 1099511627776.0 : 0;
      if (k == 0) throw config_error("unknown size suffix (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)", std::string(flag), std::string(text));
      return v * k;
    }
    suffix.pop_back();
  } else if (bytes && suffix == "B") {
    suffix.clear();
  }
  double k = 0;
  if (suffix.empty()) k = 1;
  else if (suffix == "K") k = 1e3;
  else if (suffix == "M") k = 1e6;
  else if (suffix == "G" || (!bytes && suffix == "B")) k = 1e9;
  else if (suffix == "T") k = 1e12;
  if (k == 0) {
    throw config_error(bytes ? "unknown size suffix (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
                             : "unknown count suffix (K, M, B or G, T)",
                       std::string(flag), std::string(text));
  }
  return v * k;
}

}  // namespace detail

/// A count of elements ("7.5e9", "350M", "1.3B"): a whole number < 2^63.
inline std::size_t parse_count(std::string_view flag, std::string_view text) {
  const double v = detail::scaled(flag, text, false);
  if (v >= 9.2e18) throw config_error("is too large", std::string(flag), std::string(text));
  if (std::floor(v) != v) throw config_error("must be a whole number", std::string(flag), std::string(text));
  return static_cast<std::size_t>(v);
}

/// A size in bytes ("80GB" = 80e9, "80GiB" = 80 x 2^30, "1e9"); rounded down to whole bytes.
inline std::size_t parse_bytes(std::string_view flag, std::string_view text) {
  const double v = detail::scaled(flag, text, true);
  if (v >= 9.2e18) throw config_error("is too large", std::string(flag), std::string(text));
  return static_cast<std::size_t>(v);
}

}  // namespace zerotk::plan
