#pragma once
/// \file zerotk/precision/overflow.hpp
/// Overflow agreement: every rank must skip (or take) the same steps, or their parameters and
/// scaler states diverge. Each rank checks its own gradients for inf/NaN; the flags are
/// max-reduced over the group so that one rank's overflow is every rank's overflow.
///
///   bool skip = scaler.update(zerotk::agree_overflow(comm, has_nonfinite(grads, n)));
///
/// One byte travels per rank. The host-flag overloads need a communicator that takes host
/// buffers (threads, MPI); with a device communicator use agree_overflow_async on a flag that
/// lives where the communicator expects it.

#include <cstdint>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/precision/loss_scaler.hpp"

namespace zerotk::precision {

/// Starts the max-reduction of `*flag` (0 = clean, 1 = overflow) over `comm`, in place. `flag`
/// must stay valid until the returned Work is waited on; afterwards it holds the group's verdict.
template <comm::Communicator C>
[[nodiscard]] comm::Work agree_overflow_async(C& comm, std::uint8_t* flag) {
  return comm.all_reduce(flag, flag, 1, DType::uint8, comm::ReduceOp::max);
}

/// True on every rank when any rank of `comm` saw an overflow. Collective: every rank calls it
/// once per optimizer boundary, in the same order as its other collectives.
template <comm::Communicator C>
bool agree_overflow(C& comm, bool local_overflow) {
  std::uint8_t flag = local_overflow ? 1 : 0;
  agree_overflow_async(comm, &flag).wait();
  return flag != 0;
}

/// agree_overflow followed by `scaler.update()`: returns true when every rank must skip the step.
template <comm::Communicator C, LossScalePolicy S>
bool update_agreed(C& comm, S& scaler, bool local_overflow) {
  return scaler.update(agree_overflow(comm, local_overflow));
}

}  // namespace zerotk::precision

namespace zerotk {
using precision::agree_overflow;
using precision::agree_overflow_async;
using precision::update_agreed;
}  // namespace zerotk
