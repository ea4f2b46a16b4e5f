#pragma once
/// \file zerotk/checkpoint/agree.hpp
/// Collective agreement for save and load: every local step that can fail runs inside agreed(), so
/// all ranks learn whether every rank succeeded and none proceeds (or waits in a collective) while
/// another has thrown. Host-memory communicators only (threads, MPI).

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zerotk/checkpoint/options.hpp"
#include "zerotk/comm/agree.hpp"
#include "zerotk/comm/communicator.hpp"
#include "zerotk/comm/typed.hpp"
#include "zerotk/core/error.hpp"

namespace zerotk::checkpoint {

template <class C>
concept HostCommunicator = comm::Communicator<C> && !comm::uses_device_memory<C>;

using comm::broadcast_text;

/// The longest reason agreed() passes from the failing rank to the others (a message, not a file).
inline constexpr std::size_t kMaxAgreedReasonBytes = comm::kMaxFailureReasonBytes;

/// Runs `f` on this rank, then one all-reduce tells every rank the lowest rank whose `f` threw
/// (comm::agree_on_failure). That rank (and any other that threw) rethrows its own exception; the
/// others throw an io_error naming it and carrying its reason, so whichever rank's error ends the
/// job says why: on thread ranks the first error to arrive may well be another rank's.
template <HostCommunicator C, class F>
void agreed(C& comm, std::string_view what, F&& f) {
  std::exception_ptr err;
  try {
    f();
  } catch (...) {
    err = std::current_exception();
  }
  const std::optional<comm::Failure> failed = comm::agree_on_failure(comm, err);
  if (!failed) return;  // every rank succeeded
  if (err) std::rethrow_exception(err);
  throw io_error(std::string(what) + " failed on rank " + std::to_string(failed->rank) + ": " + failed->reason,
                 "rank " + std::to_string(comm.rank()));
}

/// Every rank's `mine` (same length on all ranks), concatenated in rank order.
template <HostCommunicator C>
std::vector<std::uint64_t> all_gather_u64(C& comm, const std::vector<std::uint64_t>& mine) {
  std::vector<std::uint64_t> all(mine.size() * static_cast<std::size_t>(comm.size()));
  comm.all_gather(mine.data(), all.data(), mine.size() * sizeof(std::uint64_t), DType::uint8).wait();
  return all;
}

inline void warn(const WarningSink& sink, const std::string& message) {
  if (sink) {
    sink(message);
  } else {
    std::fprintf(stderr, "zerotk warning: %s\n", message.c_str());
  }
}

/// The tag every rank uses: rank 0's. Ranks whose `mine` differs warn (TagValidation::warn), or every
/// rank throws a usage_error (TagValidation::fail).
template <HostCommunicator C>
std::string agree_on_tag(C& comm, const std::string& mine, TagValidation mode, const WarningSink& sink) {
  const std::string root = broadcast_text(comm, mine, 0);
  const bool differs = root != mine;
  const int any = comm::all_reduce_value(comm, differs ? 1 : 0, comm::ReduceOp::max);
  if (any == 0 || mode == TagValidation::ignore) return root;
  const std::string where = "rank " + std::to_string(comm.rank());
  if (mode == TagValidation::fail) {
    throw usage_error("checkpoint tags differ between ranks (tag_validation Fail)", where,
                      differs ? "\"" + mine + "\", rank 0 has \"" + root + "\"" : "another rank's tag is not \"" + root + "\"");
  }
  if (differs) warn(sink, where + ": checkpoint tag \"" + mine + "\" differs from rank 0's \"" + root + "\"; using rank 0's");
  return root;
}

}  // namespace zerotk::checkpoint
