#pragma once
/// \file zerotk/comm/timeout.hpp
/// The collective timeout shared by every back end (threads, MPI, NCCL), and the deadline it gives.

#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <system_error>

#include "zerotk/core/error.hpp"

namespace zerotk::comm {

/// Collective timeout when none is given: `ZEROTK_COMM_TIMEOUT_MS` (a positive integer) if set,
/// else 60000 ms. Throws config_error for a malformed value. Any positive int64 is accepted:
/// 9223372036854775807 (INT64_MAX) means "never" (see deadline_after).
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

/// `from + timeout_ms`, saturated: a timeout beyond what steady_clock can represent gives
/// `time_point::max()` (wait forever) instead of overflowing into the past, which would make the
/// first wait time out at once. `timeout_ms <= 0` gives `from`.
inline std::chrono::steady_clock::time_point deadline_after(
    std::int64_t timeout_ms, std::chrono::steady_clock::time_point from = std::chrono::steady_clock::now()) {
  using std::chrono::milliseconds;
  using Clock = std::chrono::steady_clock;
  if (timeout_ms <= 0) return from;
  // Room left before the clock's maximum, in whole milliseconds (rounded down, so the sum fits).
  const auto room = std::chrono::duration_cast<milliseconds>(Clock::time_point::max() - from).count();
  if (timeout_ms >= room) return Clock::time_point::max();
  return from + milliseconds(timeout_ms);
}

}  // namespace zerotk::comm
