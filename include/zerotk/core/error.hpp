#pragma once
/// \file zerotk/core/error.hpp
/// The one error policy of zerotk: typed exceptions that carry what failed, where, and the offending
/// value. Library code never calls exit() or abort(); every failure surfaces as one of these.
///
///   throw config_error("must be >= 0", "/fp16/loss_scale", "-1");
///   // what(): "zerotk config error at /fp16/loss_scale: must be >= 0 (got -1)"

#include <stdexcept>
#include <string>
#include <string_view>
#include <sstream>
#include <utility>

namespace zerotk {

enum class ErrorKind { config, comm, io, numerics, usage };

constexpr std::string_view to_string(ErrorKind k) noexcept {
  switch (k) {
    case ErrorKind::config: return "config";
    case ErrorKind::comm: return "comm";
    case ErrorKind::io: return "io";
    case ErrorKind::numerics: return "numerics";
    case ErrorKind::usage: return "usage";
  }
  return "unknown";
}

/// Base of all zerotk errors. `where` names the location (JSON path, "rank 3", "file:offset", a
/// function); `value` is the offending value as text. Either may be empty.
class error : public std::runtime_error {
 public:
  error(ErrorKind kind, std::string message, std::string where = {}, std::string value = {})
      : std::runtime_error(format(kind, message, where, value)),
        kind_(kind),
        message_(std::move(message)),
        where_(std::move(where)),
        value_(std::move(value)) {}

  ErrorKind kind() const noexcept { return kind_; }
  /// The rule that was broken, without location or value.
  const std::string& message() const noexcept { return message_; }
  const std::string& where() const noexcept { return where_; }
  const std::string& value() const noexcept { return value_; }

 private:
  static std::string format(ErrorKind kind, const std::string& message, const std::string& where,
                            const std::string& value) {
    std::string s = "zerotk ";
    s += to_string(kind);
    s += " error";
    if (!where.empty()) {
      s += " at ";
      s += where;
    }
    s += ": ";
    s += message;
    if (!value.empty()) {
      s += " (got ";
      s += value;
      s += ")";
    }
    return s;
  }

  ErrorKind kind_;
  std::string message_, where_, value_;
};

#define ZEROTK_DEFINE_ERROR(name, kind_enum)                                                     \
  class name : public error {                                                                    \
   public:                                                                                       \
    explicit name(std::string message, std::string where = {}, std::string value = {})           \
        : error(ErrorKind::kind_enum, std::move(message), std::move(where), std::move(value)) {} \
  };

/// Bad configuration: JSON keys, option values, policy combinations. `where` is a JSON path.
ZEROTK_DEFINE_ERROR(config_error, config)
/// Collective failures: mismatched ops between ranks, timeouts, transport errors. `where` names ranks.
ZEROTK_DEFINE_ERROR(comm_error, comm)
/// File and device I/O: checkpoints, NVMe swap files. `where` is "path" or "path:offset".
ZEROTK_DEFINE_ERROR(io_error, io)
/// Numerical failures: loss scale at its minimum, NaN where none may appear.
ZEROTK_DEFINE_ERROR(numerics_error, numerics)
/// API misuse: calls out of order, sizes that do not match, a GPU asked for where none is usable.
ZEROTK_DEFINE_ERROR(usage_error, usage)

#undef ZEROTK_DEFINE_ERROR

/// Throws the typed error of `kind` (config_error for ErrorKind::config, ...): for code that passes
/// an error's kind along, e.g. one another rank reported (comm/agree.hpp).
[[noreturn]] inline void throw_error(ErrorKind kind, std::string message, std::string where = {}, std::string value = {}) {
  switch (kind) {
    case ErrorKind::config: throw config_error(std::move(message), std::move(where), std::move(value));
    case ErrorKind::comm: throw comm_error(std::move(message), std::move(where), std::move(value));
    case ErrorKind::io: throw io_error(std::move(message), std::move(where), std::move(value));
    case ErrorKind::numerics: throw numerics_error(std::move(message), std::move(where), std::move(value));
    case ErrorKind::usage: break;
  }
  throw usage_error(std::move(message), std::move(where), std::move(value));
}

/// Formats any streamable value for an error's `value` field.
template <class T>
std::string to_text(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace zerotk
