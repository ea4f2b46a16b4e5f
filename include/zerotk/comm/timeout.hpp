#pragma once
/// \file zerotk/comm/timeout.hpp
/// The collective timeout shared by the back ends that can detect a missing rank (threads, NCCL).

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <system_error>

#include "zerotk/core/error.hpp"

namespace zerotk::comm {

/// Collective timeout when none is given: `ZEROTK_COMM_TIMEOUT_MS` (a positive integer) if set,
/// else 60000 ms. Throws config_error for a malformed value.
inline std::int64_t default_timeout_ms() {
  const char* env = std::getenv("ZEROTK_COMM_TIMEOUT_MS");
  if (env == nullptr || *env == '\0') return 60000;
  std::int64_t v = 0;
  const std::string_view s(env);
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || end != s.data() + s.size() || v <= 0) {
    throw config_error("must be a positive integer (milliseconds)", "ZEROTK_COMM_TIMEOUT_MS", std::string(s));
  }
  return v;
}

}  // namespace zerotk::comm
