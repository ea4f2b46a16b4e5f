#pragma once
/// \file zerotk/config/diagnostics.hpp
/// What reading a config reports besides the options: every error (a zerotk::config_error whose
/// `where` is the JSON path, `message` the rule and `value` the offending value), and notices for
/// keys that were accepted without effect (a feature zerotk has not built yet, a PyTorch-only
/// switch) or "auto" values that were resolved. Nothing is dropped silently.

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zerotk/core/error.hpp"
#include "zerotk/core/utf8.hpp"

namespace zerotk::config {

namespace detail {
/// Concatenates text pieces by appending. (GCC 12 at -O3 misreports `"literal" + std::string&&`
/// under -Wrestrict, which -Werror users would inherit from these headers.)
template <class... Ts>
std::string cat(const Ts&... parts) {
  std::string s;
  (s.append(std::string_view(parts)), ...);
  return s;
}

// printable() and unsafe_to_print() live in core/utf8.hpp: the checkpoint tools print untrusted
// names with the same escapes.
using zerotk::printable;
using zerotk::unsafe_to_print;

}  // namespace detail

/// A key accepted without error that the user should still know about.
struct Notice {
  enum class Kind : std::uint8_t {
    unsupported,    ///< known DeepSpeed key whose feature zerotk does not have (yet); ignored
    auto_resolved,  ///< an "auto" value and what it was resolved to
    deprecated,     ///< an old key name that was mapped to its replacement
  };
  Kind kind = Kind::unsupported;
  std::string path;
  std::string message;
};

constexpr std::string_view to_string(Notice::Kind k) noexcept {
  switch (k) {
    case Notice::Kind::unsupported: return "not supported";
    case Notice::Kind::auto_resolved: return "auto";
    case Notice::Kind::deprecated: return "deprecated";
  }
  return "note";
}

/// `<path>: <rule> (got <value>)`, the one-line form zerotk-config prints for each error.
inline std::string format_line(const config_error& e) {
  std::string s = e.where().empty() ? std::string("(config)") : e.where();
  s += ": ";
  s += e.message();
  if (!e.value().empty()) {
    s += " (got ";
    s += e.value();
    s += ")";
  }
  return s;
}

/// One config_error standing for all of `errors`: its what() lists each on its own line, its
/// `where` is `source` (a file name, or empty) and its `value` the number of errors.
inline config_error summarize(std::span<const config_error> errors, std::string_view source = {}) {
  std::string msg = std::to_string(errors.size()) + (errors.size() == 1 ? " problem" : " problems") +
                    " in DeepSpeed config";
  for (const auto& e : errors) {
    msg += "\n  ";
    msg += format_line(e);
  }
  return config_error(std::move(msg), std::string(source));
}

/// Collects errors and notices in document order. Caps the error count so a hostile or mangled
/// file cannot make the report itself unbounded: past kMaxErrors an error is only counted. Every
/// text stored is printable on one line (detail::printable), whoever built it.
class Diagnostics {
 public:
  static constexpr std::size_t kMaxErrors = 100;
  /// Longest `value` kept (values are normally cut to 60 characters where they are shown).
  static constexpr std::size_t kMaxValueChars = 80;

  void error(std::string path, std::string rule, std::string value = {}) {
    if (errors_.size() < kMaxErrors) {
      errors_.emplace_back(detail::printable(rule), detail::printable(path), detail::printable(value, kMaxValueChars));
    } else {
      ++dropped_;
    }
  }
  /// Counts `n` errors that were found but not built, because no more can be shown.
  void count_dropped(std::size_t n) noexcept { dropped_ += n; }
  /// How many more errors will be kept.
  std::size_t room() const noexcept { return kMaxErrors - errors_.size(); }
  void notice(Notice::Kind kind, std::string path, std::string message) {
    notices_.push_back(Notice{kind, detail::printable(path), detail::printable(message)});
  }

  bool ok() const noexcept { return errors_.empty(); }
  /// Errors, plus one closing record when more than kMaxErrors were found.
  std::vector<config_error> errors() const {
    std::vector<config_error> out = errors_;
    if (dropped_ > 0) {
      out.emplace_back(detail::cat("stopped after ", std::to_string(kMaxErrors), " errors; ", std::to_string(dropped_),
                                   " more not shown"));
    }
    return out;
  }
  std::size_t dropped() const noexcept { return dropped_; }
  const std::vector<Notice>& notices() const noexcept { return notices_; }

 private:
  std::vector<config_error> errors_;
  std::vector<Notice> notices_;
  std::size_t dropped_ = 0;
};

// ---- "did you mean" ------------------------------------------------------------------------------

namespace detail {

/// Shortest text that reads back as the same double ("0.0001", "1e-08", "65536").
inline std::string num_text(double v) {
  if (!std::isfinite(v)) return v != v ? "nan" : (v > 0 ? "inf" : "-inf");
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

inline char lower(char c) noexcept { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); }

inline bool iequals(std::string_view a, std::string_view b) noexcept {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return lower(x) == lower(y);
         });
}

/// Case-insensitive edit distance with adjacent transpositions (optimal string alignment).
/// Inputs are JSON keys, so the O(|a| |b|) table is small; longer inputs are cut at 64 chars.
inline std::size_t edit_distance(std::string_view a, std::string_view b) {
  a = a.substr(0, 64);
  b = b.substr(0, 64);
  const std::size_t n = a.size(), m = b.size();
  std::vector<std::size_t> prev2(m + 1), prev(m + 1), cur(m + 1);
  for (std::size_t j = 0; j <= m; ++j) prev[j] = j;
  for (std::size_t i = 1; i <= n; ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= m; ++j) {
      const std::size_t cost = lower(a[i - 1]) == lower(b[j - 1]) ? 0 : 1;
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost});
      if (i > 1 && j > 1 && lower(a[i - 1]) == lower(b[j - 2]) && lower(a[i - 2]) == lower(b[j - 1])) {
        cur[j] = std::min(cur[j], prev2[j - 2] + 1);
      }
    }
    prev2.swap(prev);
    prev.swap(cur);
  }
  return prev[m];
}

}  // namespace detail

/// The candidate a mistyped `word` most likely meant: the closest by edit distance when it is
/// within a third of the word's length (at least 2), else one that contains the word or is
/// contained in it (e.g. "max_live_parameters" -> "stage3_max_live_parameters").
inline std::optional<std::string> closest_match(std::string_view word, std::span<const std::string_view> candidates) {
  std::optional<std::string> best;
  // edit_distance() compares at most 64 characters, so the tolerance is taken from those too.
  std::size_t best_d = std::max<std::size_t>(2, std::min<std::size_t>(word.size(), 64) / 3) + 1;
  for (auto c : candidates) {
    const std::size_t d = detail::edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = std::string(c);
    }
  }
  if (best || word.size() < 4) return best;
  for (auto c : candidates) {
    if (c.size() >= 4 && (c.find(word) != std::string_view::npos || word.find(c) != std::string_view::npos)) {
      return std::string(c);
    }
  }
  return best;
}

}  // namespace zerotk::config
