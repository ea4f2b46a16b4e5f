#pragma once
/// \file zerotk/core/missing.hpp
/// Stand-ins for the entry points of a layer whose optional package this build lacks. An umbrella
/// header (zerotk/config.hpp, zerotk/plan.hpp, zerotk/zerotk.hpp) leaves such a layer out when its
/// feature macro is 0, so a call would fail with "'read_text_file' is not a member of
/// 'zerotk::config'"; with a stand-in, the first error is the message saying what to define or link.
/// Headers that need the package themselves say it with #error instead.
///
///   ZEROTK_MISSING_DEPENDENCY(load_file, "zerotk::config::load_file needs nlohmann-json: " ZEROTK_HOW_TO_GET_JSON)

namespace zerotk::detail {
template <class...>
inline constexpr bool kMissingDependency = false;
}  // namespace zerotk::detail

/// A function template `name` taking anything whose every call fails with `message` (a string
/// literal). The deduced return type makes the call itself instantiate the static_assert, so it is
/// the first error, before any about what the result is used for.
#define ZEROTK_MISSING_DEPENDENCY(name, message)                                \
  template <class... Args>                                                      \
  auto name(Args&&...) {                                                        \
    static_assert(::zerotk::detail::kMissingDependency<Args...>, message);      \
    return 0;                                                                   \
  }

// What to do, per package: the CMake target, or for a vendored copy of include/zerotk the macro and
// what must be on the include path / link line.
#define ZEROTK_HOW_TO_GET_JSON                                                                    \
  "link the CMake target zerotk::json (it defines ZEROTK_HAS_JSON=1), or, in a vendored copy, " \
  "define ZEROTK_HAS_JSON=1 and put nlohmann/json.hpp (Debian: nlohmann-json3-dev) on the include path"
#define ZEROTK_HOW_TO_GET_XXHASH                                                                      \
  "link the CMake target zerotk::xxhash (it defines ZEROTK_HAS_XXHASH=1), or, in a vendored copy, "  \
  "define ZEROTK_HAS_XXHASH=1 and put xxhash.h (Debian: libxxhash-dev) on the include path"
