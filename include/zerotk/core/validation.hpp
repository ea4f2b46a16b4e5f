#pragma once
/// \file zerotk/core/validation.hpp
/// What to do when ranks disagree on a value they must share (DeepSpeed's ValidationMode: Ignore,
/// Warn, Fail). checkpoint::TagValidation and config::TagValidation name it for checkpoint tags.

#include <cstdint>
#include <string_view>

namespace zerotk {

enum class ValidationMode : std::uint8_t { ignore, warn, fail };

/// DeepSpeed's spelling, as a config writes it.
constexpr std::string_view to_string(ValidationMode v) noexcept {
  return v == ValidationMode::ignore ? "Ignore" : v == ValidationMode::warn ? "Warn" : "Fail";
}

}  // namespace zerotk
