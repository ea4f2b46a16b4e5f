#pragma once
/// \file bench/common/modelled_link.hpp
/// A communicator wrapper for benchmarks: every operation of the wrapped communicator completes no
/// sooner than a modelled network link would deliver it. Shared by bench/engine (overlap of
/// communication with compute) and bench/compress (the 1-bit all-reduce against an fp32 one).
///
/// Model, per rank (each rank's ModelledLink is its own link, as each node has its own NIC):
///   busy(op)   = latency + wire_bytes(op) / bandwidth
///   done_at    = max(issue time, link free) + busy(op);  link free = done_at
/// wire_bytes(op) is what the inner communicator's byte counters add for the call (the ring
/// convention of comm/communicator.hpp: all_reduce 2 (W-1)/W x payload, all_gather / reduce_scatter /
/// all_to_all (W-1)/W x payload, ...), so operations queue behind each other on the link and an
/// operation's wait() returns at max(inner completion, done_at). The inner communicator still moves
/// the data (the threads back end at memory speed), so the model only ever adds time: where the inner
/// operation is slower than the modelled link, the inner time shows through.
///
/// Every operation of the Communicator concept is forwarded with this model (all_reduce,
/// reduce_scatter, all_gather, all_gatherv, broadcast, reduce, all_to_all, all_to_all_v, send, recv at 0 wire bytes,
/// barrier at 0 bytes: latency only). split() is refused.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/core/error.hpp"

namespace zerotk::bench {

/// A communicator that completes each operation no sooner than a modelled link would.
template <class Inner>
class ModelledLink {
 public:
  using Clock = std::chrono::steady_clock;

  /// `gbytes_per_s`: link bandwidth in GB/s (10^9 bytes per second).
  ModelledLink(Inner& inner, double gbytes_per_s, std::chrono::microseconds latency)
      : inner_(&inner), bytes_per_us_(gbytes_per_s * 1e3), latency_(latency) {}
  int rank() const { return inner_->rank(); }
  int size() const { return inner_->size(); }
  const zerotk::comm::CommStats& stats() const { return inner_->stats(); }
  /// The wrapped communicator (operations on it bypass the model, e.g. an untimed barrier).
  Inner& inner() noexcept { return *inner_; }

#define ZT_FORWARD(name)                                                     \
  template <class... A>                                                      \
  zerotk::comm::Work name(A&&... a) {                                        \
    const std::uint64_t before = inner_->stats().total_wire_bytes();         \
    zerotk::comm::Work w = inner_->name(std::forward<A>(a)...);              \
    const std::uint64_t bytes = inner_->stats().total_wire_bytes() - before; \
    return delayed(std::move(w), bytes);                                     \
  }
  ZT_FORWARD(all_reduce)
  ZT_FORWARD(reduce_scatter)
  ZT_FORWARD(all_gather)
  ZT_FORWARD(all_gatherv)
  ZT_FORWARD(broadcast)
  ZT_FORWARD(reduce)
  ZT_FORWARD(all_to_all)
  ZT_FORWARD(all_to_all_v)
  ZT_FORWARD(send)
  ZT_FORWARD(recv)
  ZT_FORWARD(barrier)
#undef ZT_FORWARD
  ModelledLink split(int, int) { throw zerotk::usage_error("ModelledLink cannot split"); }
  /// Time the link has been busy so far (what the operations cost by the model, queueing aside).
  std::chrono::microseconds busy() const { return busy_; }

  /// One operation as the model scheduled it: issued by the caller, started on the link (after the
  /// operations before it), done (its wait() returns no earlier).
  struct Op {
    Clock::time_point issued, start, done;
    std::uint64_t wire_bytes = 0;
  };
  /// Every operation so far, in issue order (tests/interop counts those that started before
  /// loss.backward() returned).
  const std::vector<Op>& ops() const noexcept { return ops_; }

 private:
  struct State final : zerotk::comm::WorkState {
    zerotk::comm::Work inner;
    Clock::time_point done_at;
    void wait() override {
      inner.wait();
      // Sleep for most of the remaining time, spin for the rest: a sleep overshoots by the timer
      // slack (~50-100 us here), which at 20 us of modelled latency per operation would add up to
      // more than the link itself when many small operations are waited for.
      const auto spin = std::chrono::microseconds(200);
      if (Clock::now() + spin < done_at) std::this_thread::sleep_until(done_at - spin);
      while (Clock::now() < done_at) {
      }
    }
    bool test() override { return Clock::now() >= done_at && inner.test(); }
  };
  zerotk::comm::Work delayed(zerotk::comm::Work w, std::uint64_t bytes) {
    // The link is busy with earlier operations first: operations queue behind each other.
    const auto now = Clock::now();
    const auto start = std::max(now, link_free_);
    const auto busy = latency_ + std::chrono::microseconds(static_cast<long long>(double(bytes) / bytes_per_us_));
    link_free_ = start + busy;
    busy_ += busy;
    ops_.push_back(Op{now, start, link_free_, bytes});
    auto s = std::make_unique<State>();
    s->inner = std::move(w);
    s->done_at = link_free_;
    return zerotk::comm::Work(std::move(s));
  }
  Inner* inner_;
  double bytes_per_us_;
  std::chrono::microseconds latency_;
  Clock::time_point link_free_{};
  std::chrono::microseconds busy_{0};
  std::vector<Op> ops_;
};

}  // namespace zerotk::bench
