#pragma once
/// \file zerotk/version.hpp
/// The one place the version lives. CMake reads it from here, so bump it only here.
/// Encoded as MMmmpp: 1.2.3 -> 10203 (two digits each for minor and patch, so 1.10 never collides with 2.0).

#define ZEROTK_VERSION_MAJOR 0
#define ZEROTK_VERSION_MINOR 2
#define ZEROTK_VERSION_PATCH 0
#define ZEROTK_VERSION (ZEROTK_VERSION_MAJOR * 10000 + ZEROTK_VERSION_MINOR * 100 + ZEROTK_VERSION_PATCH)

namespace zerotk {
inline constexpr int kVersion = ZEROTK_VERSION;
inline constexpr const char* kVersionString = "0.2.0";
static_assert(kVersion == 200, "kVersionString must match the numeric version");
}  // namespace zerotk
