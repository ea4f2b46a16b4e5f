#pragma once
/// \file zerotk/monitor/format.hpp
/// Numbers as DeepSpeed's Python writes them. DeepSpeed's csv monitor writes `str(value)`: a
/// Python int prints as digits ("65536"), a Python float as its shortest round-trip repr with
/// Python's layout ("0.0001", "1e-05", "65536.0", "1e+16", "inf", "nan"). Matching it byte for
/// byte lets existing DeepSpeed log tooling read zerotk's files unchanged.

#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

namespace zerotk::monitor {

/// Python's repr() of a float: shortest digits that round-trip; fixed notation when the decimal
/// exponent is in [-4, 16), else d.ddde+XX with at least two exponent digits.
inline std::string python_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  // Shortest round-trip digits in scientific form: "-d.ddde+XX".
  auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string_view s(buf, static_cast<std::size_t>(res.ptr - buf));
  std::string out;
  if (s.front() == '-') {
    out += '-';
    s.remove_prefix(1);
  }
  const std::size_t e = s.find('e');
  std::string digits;
  for (char c : s.substr(0, e)) {
    if (c != '.') digits += c;
  }
  int exp10 = 0;
  std::string_view es = s.substr(e + 1);
  if (!es.empty() && es.front() == '+') es.remove_prefix(1);
  std::from_chars(es.data(), es.data() + es.size(), exp10);
  const int decpt = exp10 + 1;  // value = 0.<digits> * 10^decpt
  const int n = static_cast<int>(digits.size());
  if (decpt <= -4 || decpt > 16) {
    out += digits[0];
    if (n > 1) {
      out += '.';
      out.append(digits, 1);
    }
    const int x = decpt - 1;
    out += x < 0 ? "e-" : "e+";
    const int ax = x < 0 ? -x : x;
    if (ax < 10) out += '0';
    out += std::to_string(ax);
  } else if (decpt <= 0) {
    out += "0.";
    out.append(static_cast<std::size_t>(-decpt), '0');
    out += digits;
  } else if (decpt < n) {
    out.append(digits, 0, static_cast<std::size_t>(decpt));
    out += '.';
    out.append(digits, static_cast<std::size_t>(decpt));
  } else {
    out += digits;
    out.append(static_cast<std::size_t>(decpt - n), '0');
    out += ".0";
  }
  return out;
}

/// A logged value with Python's distinction between int and float, which changes its text
/// ("65536" vs "65536.0").
class MetricValue {
 public:
  MetricValue(double v) : v_(v) {}  // NOLINT(google-explicit-constructor): values read naturally
  MetricValue(float v) : v_(static_cast<double>(v)) {}
  MetricValue(std::int64_t v) : v_(v) {}
  MetricValue(int v) : v_(static_cast<std::int64_t>(v)) {}

  bool is_integer() const noexcept { return std::holds_alternative<std::int64_t>(v_); }
  double as_double() const noexcept {
    return is_integer() ? static_cast<double>(std::get<std::int64_t>(v_)) : std::get<double>(v_);
  }
  /// Python's str() of the value.
  std::string str() const { return is_integer() ? std::to_string(std::get<std::int64_t>(v_)) : python_repr(std::get<double>(v_)); }

 private:
  std::variant<std::int64_t, double> v_;
};

}  // namespace zerotk::monitor
