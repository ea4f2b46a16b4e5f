#pragma once
/// \file zerotk/device/ordered.hpp
/// OrderedCommunicator: the engine's communicator. Every collective first fences the compute
/// stream (`Ops::fence()`: on CUDA the communicator's stream waits on the GPU for the kernels queued
/// so far; on the host nothing to do), so no part of the engine places ordering calls by hand.
/// An avg may divide by a count other than the group's size (`mean_over`): expert parameters reduce
/// over the expert-data group, and their gradients average over the whole data size (moe/).

#include <cstddef>
#include <span>
#include <utility>

#include "zerotk/comm/any.hpp"
#include "zerotk/comm/communicator.hpp"
#include "zerotk/core/dtype.hpp"

namespace zerotk::device {

template <class Ops>
class OrderedCommunicator {
 public:
  /// Refers to `comm` (kept alive by the caller) and to `ops`.
  template <class C>
  OrderedCommunicator(C& comm, Ops& ops) : comm_(comm), ops_(&ops) {}
  /// Owns (shares) `comm`, e.g. a communicator split from another.
  OrderedCommunicator(comm::AnyCommunicator comm, Ops& ops) : comm_(std::move(comm)), ops_(&ops) {}

  /// A communicator over the ranks of the same `color`, ordered by (key, rank), with the same Ops.
  /// Collective: every rank of this communicator calls it.
  OrderedCommunicator split(int color, int key) { return OrderedCommunicator(comm_.split(color, key), *ops_); }  // mean_over: size()

  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }
  const comm::CommStats& stats() const { return comm_.stats(); }

  /// From now on, avg divides the sum by `n` instead of size() (n >= 1): once the sum has arrived
  /// (comm::then, when the Work is waited for) Ops::divide is queued where the engine's kernels run,
  /// with the arithmetic the host back ends' own avg uses (comm::detail::divide_in_place). Expert
  /// gradients: summed over the expert-data group, averaged over the data size, since each already
  /// sums the tokens of its expert group's ranks.
  void mean_over(int n) noexcept { mean_over_ = n; }

  [[nodiscard]] comm::Work all_reduce(const void* send, void* recv, std::size_t count, DType dt, comm::ReduceOp op) {
    ops_->fence();
    if (divides_otherwise(op)) return divided(comm_.all_reduce(send, recv, count, dt, comm::ReduceOp::sum), recv, count, dt);
    return comm_.all_reduce(send, recv, count, dt, op);
  }
  [[nodiscard]] comm::Work reduce_scatter(const void* send, void* recv, std::size_t count_per_rank, DType dt,
                                          comm::ReduceOp op) {
    ops_->fence();
    if (divides_otherwise(op)) {
      return divided(comm_.reduce_scatter(send, recv, count_per_rank, dt, comm::ReduceOp::sum), recv, count_per_rank, dt);
    }
    return comm_.reduce_scatter(send, recv, count_per_rank, dt, op);
  }
  [[nodiscard]] comm::Work all_gather(const void* send, void* recv, std::size_t count_per_rank, DType dt) {
    ops_->fence();
    return comm_.all_gather(send, recv, count_per_rank, dt);
  }
  [[nodiscard]] comm::Work all_gatherv(const void* send, std::size_t send_count, void* recv,
                                       std::span<const std::size_t> recv_counts, DType dt) {
    ops_->fence();
    return comm_.all_gatherv(send, send_count, recv, recv_counts, dt);
  }
  [[nodiscard]] comm::Work all_to_all(const void* send, void* recv, std::size_t count_per_rank, DType dt) {
    ops_->fence();
    return comm_.all_to_all(send, recv, count_per_rank, dt);
  }
  [[nodiscard]] comm::Work all_to_all_v(const void* send, std::span<const std::size_t> send_counts, void* recv,
                                        std::span<const std::size_t> recv_counts, DType dt) {
    ops_->fence();
    return comm_.all_to_all_v(send, send_counts, recv, recv_counts, dt);
  }
  [[nodiscard]] comm::Work broadcast(void* buf, std::size_t count, DType dt, int root) {
    ops_->fence();
    return comm_.broadcast(buf, count, dt, root);
  }
  /// The communicator itself, without the fence: for host-memory collectives of the trainer's own
  /// (comm/agree.hpp) that order themselves by being called, not by the compute stream.
  comm::AnyCommunicator& unordered() noexcept { return comm_; }
  /// Small fp64 all-reduce of host values (through device memory where the Ops needs it).
  void all_reduce_host(const double* in, double* out, std::size_t n, comm::ReduceOp op) {
    ops_->all_reduce(comm_, in, out, n, op);
  }

 private:
  bool divides_otherwise(comm::ReduceOp op) const { return op == comm::ReduceOp::avg && mean_over_ > 0 && mean_over_ != size(); }
  comm::Work divided(comm::Work w, void* buf, std::size_t n, DType dt) const {
    return comm::then(std::move(w), [ops = ops_, buf, n, dt, d = mean_over_] { ops->divide(buf, n, dt, d); });
  }

  comm::AnyCommunicator comm_;
  Ops* ops_;
  int mean_over_ = 0;  // avg's divisor; 0: size()
};

}  // namespace zerotk::device
