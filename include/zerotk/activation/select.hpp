#pragma once
/// \file zerotk/activation/select.hpp
/// Select: which of a model's layers to checkpoint, by index among the layers offered (for a
/// transformer: its blocks). `all()`, `none()`, `every(k)` (indices 0, k, 2k, ...), or any
/// predicate on the index. `parse("every:2")` reads the GPT example's --checkpoint-activations.

#include <charconv>
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <utility>

#include "zerotk/core/error.hpp"

namespace zerotk::activation {

class Select {
 public:
  /// Checkpoints the layers for which `pick(index)` is true.
  explicit Select(std::function<bool(std::size_t)> pick, std::string text = "custom")
      : pick_(std::move(pick)), text_(std::move(text)) {}

  static Select none() {
    return Select([](std::size_t) { return false; }, "none");
  }
  static Select all() {
    return Select([](std::size_t) { return true; }, "all");
  }
  /// Every k-th layer, starting with the first: k = 1 is all(), k = 2 every other layer.
  static Select every(std::size_t k) {
    if (k == 0) throw usage_error("every k-th layer needs k >= 1", "activation::Select::every", "0");
    return Select([k](std::size_t i) { return i % k == 0; }, k == 1 ? "all" : "every:" + std::to_string(k));
  }
  /// "none", "all" or "every:K" (K >= 1); `where` names the flag or key in errors.
  static Select parse(std::string_view s, std::string_view where) {
    if (s == "none") return none();
    if (s == "all") return all();
    if (s.starts_with("every:")) {
      const std::string_view digits = s.substr(6);
      std::size_t k = 0;
      const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), k);
      if (ec == std::errc{} && end == digits.data() + digits.size() && k >= 1) return every(k);
    }
    throw usage_error("expected none, all or every:K with K >= 1", std::string(where), "\"" + std::string(s) + "\"");
  }

  bool operator()(std::size_t index) const { return pick_(index); }
  /// "all", "every:2", "none" or "custom".
  const std::string& text() const noexcept { return text_; }

 private:
  std::function<bool(std::size_t)> pick_;
  std::string text_;
};

}  // namespace zerotk::activation
