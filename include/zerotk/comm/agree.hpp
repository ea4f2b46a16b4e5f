#pragma once
/// \file zerotk/comm/agree.hpp
/// Agreeing on a failure that may have happened on some ranks only: one all-reduce tells every rank
/// the lowest rank whose local work threw, and that rank broadcasts its reason, so no rank goes on
/// into a collective that its failed peer will never join, and every rank's error says why (on
/// thread ranks whichever error arrives first ends the job, and it may be a bystander's).
/// checkpoint::agreed() (save and load) and interop/torch.hpp (a failed backward) build on it.
///
///   std::exception_ptr mine = ...;                           // null where this rank's work succeeded
///   if (auto f = zerotk::comm::agree_on_failure(comm, mine)) // collective, every rank calls it
///     ...                                                    // f->rank failed, because f->reason
///
/// Host-memory communicators only (threads, MPI; an AnyCommunicator over one of them).

#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/comm/typed.hpp"
#include "zerotk/core/error.hpp"

namespace zerotk::comm {

/// Rank `root`'s text, on every rank (one int32 broadcast for the length, one for the bytes).
template <Communicator C>
std::string broadcast_text(C& comm, const std::string& text, int root) {
  static_assert(!uses_device_memory<C>, "broadcast_text: host-memory communicators only");
  std::int32_t n = static_cast<std::int32_t>(text.size());
  comm.broadcast(&n, 1, DType::int32, root).wait();
  std::string out = comm.rank() == root ? text : std::string(static_cast<std::size_t>(n), '\0');
  comm.broadcast(out.data(), out.size(), DType::uint8, root).wait();
  return out;
}

/// The longest reason a failed rank passes to the others (a message, not a file).
inline constexpr std::size_t kMaxFailureReasonBytes = 4096;

/// What the lowest failed rank told every rank.
struct Failure {
  int rank = -1;                   ///< the lowest rank whose work threw
  std::optional<ErrorKind> kind;   ///< its exception's kind, when it was a zerotk::error
  std::string reason;              ///< its exception, see failure_reason()
};

/// An exception as a reason another rank can quote: a zerotk::error as "where: message (got value)"
/// (without the "zerotk io error at" that the quoting rank's own error adds), anything else its
/// what(); at most kMaxFailureReasonBytes (then "..." is appended).
inline std::string failure_reason(const std::exception_ptr& e) {
  std::string reason;
  try {
    std::rethrow_exception(e);
  } catch (const zerotk::error& x) {
    reason = (x.where().empty() ? "" : x.where() + ": ") + x.message() + (x.value().empty() ? "" : " (got " + x.value() + ")");
  } catch (const std::exception& x) {
    reason = x.what();
  } catch (...) {
    reason = "an exception not derived from std::exception";
  }
  if (reason.size() > kMaxFailureReasonBytes) reason = reason.substr(0, kMaxFailureReasonBytes) + "...";
  return reason;
}

/// Collective: every rank passes the exception its local work threw (null if none). Returns
/// nullopt when no rank failed (one all-reduce of an int32, nothing else); otherwise the lowest
/// failed rank, its error's kind and its reason, the same on every rank (two broadcasts from that
/// rank follow: kind and length, then the text). The caller decides what to throw; each failed rank
/// usually rethrows its own.
template <Communicator C>
std::optional<Failure> agree_on_failure(C& comm, const std::exception_ptr& mine) {
  static_assert(!uses_device_memory<C>, "agree_on_failure: host-memory communicators only");
  const int first = all_reduce_value(comm, mine ? comm.rank() : comm.size(), ReduceOp::min);
  if (first == comm.size()) return std::nullopt;  // every rank succeeded
  Failure f;
  f.rank = first;
  // {ErrorKind's value, or -1 for an exception of another type; the reason's length}
  std::int32_t head[2] = {-1, 0};
  if (comm.rank() == first) {
    f.reason = failure_reason(mine);
    head[1] = static_cast<std::int32_t>(f.reason.size());
    try {
      std::rethrow_exception(mine);
    } catch (const zerotk::error& x) {
      head[0] = static_cast<std::int32_t>(x.kind());
    } catch (...) {
    }
  }
  comm.broadcast(head, 2, DType::int32, first).wait();
  if (head[0] >= 0) f.kind = static_cast<ErrorKind>(head[0]);
  f.reason.resize(static_cast<std::size_t>(head[1]));
  comm.broadcast(f.reason.data(), f.reason.size(), DType::uint8, first).wait();
  return f;
}

}  // namespace zerotk::comm
