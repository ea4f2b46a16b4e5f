#pragma once
/// \file zerotk/comm/communicator.hpp
/// The Communicator concept that engine code is written against, the asynchronous `Work` handle
/// every collective returns, and the byte counters that let tests prove ZeRO's communication volume.
///
/// Buffers are raw pointers + element count + DType (the element type is a run-time property of the
/// engine's flat buffers). Every operation returns a `Work`; call `wait()` before touching the
/// buffers. Calls on one communicator are issued in the same order on every rank.

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <utility>

#include "zerotk/core/concepts.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"

namespace zerotk::comm {

enum class ReduceOp : std::uint8_t { sum, avg, max, min };

constexpr std::string_view to_string(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "unknown";
}

/// The kinds of operation, for byte counters and mismatch diagnostics.
enum class OpKind : std::uint8_t {
  all_reduce,
  reduce_scatter,
  all_gather,
  all_gatherv,
  broadcast,
  reduce,
  all_to_all,
  send,
  recv,
  barrier,
  all_to_all_v,
};
inline constexpr std::size_t kOpKindCount = 11;

constexpr std::string_view to_string(OpKind k) noexcept {
  constexpr std::string_view names[] = {"all_reduce", "reduce_scatter", "all_gather", "all_gatherv", "broadcast",
                                        "reduce",     "all_to_all",     "send",       "recv",        "barrier",
                                        "all_to_all_v"};
  return names[static_cast<std::size_t>(k)];
}

/// Per-operation counters of one rank.
/// `payload_bytes`: the bytes of the operation's full logical buffer (all_reduce: count*elem;
/// reduce_scatter: size*recv_count*elem; all_gather: size*send_count*elem; all_to_all_v: the
/// elements this rank sends, its own block included).
/// `wire_bytes`: the bytes a bandwidth-optimal (ring) algorithm sends from this rank, the convention
/// NCCL's "bus bandwidth" uses: all_reduce 2(W-1)/W*payload, reduce_scatter and all_gather
/// (W-1)/W*payload, broadcast/reduce payload, all_to_all (W-1)/W*payload, all_to_all_v the bytes
/// for other ranks (its own block stays), send payload.
/// With these, ZeRO stages 0-2 move 2*Psi*(W-1)/W wire elements per step and stage 3 3*Psi*(W-1)/W.
struct OpCounters {
  std::uint64_t calls = 0;
  std::uint64_t payload_bytes = 0;
  std::uint64_t wire_bytes = 0;
};

struct CommStats {
  std::array<OpCounters, kOpKindCount> by_op{};

  OpCounters& operator[](OpKind k) noexcept { return by_op[static_cast<std::size_t>(k)]; }
  const OpCounters& operator[](OpKind k) const noexcept { return by_op[static_cast<std::size_t>(k)]; }
  std::uint64_t total_wire_bytes() const noexcept {
    std::uint64_t t = 0;
    for (const auto& c : by_op) t += c.wire_bytes;
    return t;
  }
  std::uint64_t total_payload_bytes() const noexcept {
    std::uint64_t t = 0;
    for (const auto& c : by_op) t += c.payload_bytes;
    return t;
  }
  void reset() noexcept { by_op = {}; }
};

/// The time the calling thread spends blocked in Work::wait(), on a clock a client installs. The
/// slow-rank monitor (engine/slow_rank_monitor.hpp) installs its own and subtracts this from the
/// compute it clocks between engine calls, so a rank waiting for a slow peer (a pipeline's
/// activations, a trainer's own collective) is not charged for the wait, whether the back end
/// sleeps (threads) or polls (MPI) meanwhile. Nothing is measured while no clock is installed.
struct WaitClock {
  std::function<double()> now_ms;  // installed by a client; empty: not measured
  int installs = 0;                // clients that installed it (the first one's clock is used)
  double waited_ms = 0;            // accumulated on `now_ms`'s clock
  int depth = 0;                   // a wait inside a wait counts once
};
/// The calling thread's WaitClock.
inline WaitClock& thread_wait_clock() noexcept {
  thread_local WaitClock clock;
  return clock;
}

/// Back-end side of an asynchronous operation.
class WorkState {
 public:
  virtual ~WorkState() = default;
  /// Blocks until done; throws comm_error on failure, mismatch or timeout.
  virtual void wait() = 0;
  /// Non-blocking: true once done (then wait() returns at once). May throw like wait().
  virtual bool test() = 0;
  /// The Work was destroyed (or assigned over) unfinished while no exception propagates: finish the
  /// operation, and if it failed keep the error where the program will meet it (zerotk's back ends:
  /// the communicator's next call throws it; run_threads rethrows it; MpiSession aborts the job with
  /// it if nothing else did). This default, for back ends outside zerotk, writes it to stderr.
  virtual void dropped() noexcept;
  /// The Work was destroyed unfinished while an exception propagates (the rank is failing): give
  /// the operation up or finish it, whatever releases the peers soonest without leaving a buffer in
  /// use. This default waits and ignores the error (one is already on its way).
  virtual void abandon() noexcept {
    try {
      wait();
    } catch (...) {
    }
  }
};

/// Handle to an operation in flight. A default-constructed Work is already complete.
/// Work is move-only and must not be discarded: call `wait()` (or `test()` until true) before
/// touching the buffers. Destroying an unfinished Work still finishes the operation (never leaves a
/// collective dangling) and never loses its error: without an exception in flight the back end
/// keeps the error for the program (WorkState::dropped); during unwinding it gives the operation up
/// as fast as it safely can (WorkState::abandon).
class [[nodiscard("call wait() on the Work (a dropped Work still finishes, but late)")]] Work {
 public:
  Work() = default;
  explicit Work(std::unique_ptr<WorkState> s) : state_(std::move(s)) {}
  Work(Work&&) noexcept = default;
  Work& operator=(Work&& o) noexcept {
    if (this != &o) {
      finish_unobserved();
      state_ = std::move(o.state_);
    }
    return *this;
  }
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  ~Work() { finish_unobserved(); }

  void wait() {
    if (!state_) return;
    auto s = std::move(state_);
    WaitClock& clock = thread_wait_clock();
    if (!clock.now_ms || clock.depth > 0) {
      s->wait();
      return;
    }
    // (added even when wait() throws: the time was spent waiting)
    struct Timed {
      WaitClock& c;
      double t0;
      ~Timed() {
        c.waited_ms += c.now_ms() - t0;
        --c.depth;
      }
    };
    const double t0 = clock.now_ms();
    ++clock.depth;
    Timed timed{clock, t0};
    s->wait();
  }
  bool test() {
    if (!state_) return true;
    if (state_->test()) {
      wait();
      return true;
    }
    return false;
  }
  bool pending() const noexcept { return state_ != nullptr; }

 private:
  void finish_unobserved() noexcept {
    if (!state_) return;
    auto s = std::move(state_);
    if (std::uncaught_exceptions() > 0) {
      s->abandon();
    } else {
      s->dropped();
    }
  }
  std::unique_ptr<WorkState> state_;
};

inline void WorkState::dropped() noexcept {
  try {
    wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zerotk: a Work destroyed without wait() failed: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "zerotk: a Work destroyed without wait() failed with a non-standard exception\n");
  }
}

/// A Work that runs `after()` once `w` has completed successfully, on the thread that waits for it
/// (or whose test() finds it done), exactly once; a failure of `w` is thrown and `after` does not
/// run. Dropped unfinished, it still waits, runs `after` and reports a failure as any Work does.
/// What device::OrderedCommunicator's avg over a divisor other than the group size is made of.
template <class F>
Work then(Work w, F after) {
  class Then final : public WorkState {
   public:
    Then(Work w, F f) : w_(std::move(w)), f_(std::move(f)) {}
    void wait() override {
      if (done_) return;
      w_.wait();
      done_ = true;
      f_();
    }
    bool test() override {
      if (!done_ && w_.test()) wait();
      return done_;
    }

   private:
    Work w_;
    F f_;
    bool done_ = false;
  };
  if (!w.pending()) {
    after();
    return Work{};
  }
  return Work(std::make_unique<Then>(std::move(w), std::move(after)));
}

/// The collectives engine code may use. Argument conventions (counts are ELEMENTS, not bytes):
/// - all_reduce(send, recv, count, dtype, op): in place when send == recv.
/// - reduce_scatter(send, recv, recv_count, dtype, op): send holds size()*recv_count elements laid out
///   as size() contiguous blocks (the ZeRO flat-buffer layout); rank r receives the reduction of block r.
/// - all_gather(send, recv, send_count, dtype): recv holds size()*send_count; rank r's block at r*send_count.
///   In place when send == recv + rank()*send_count.
/// - all_gatherv(send, send_count, recv, recv_counts, dtype): variable blocks, concatenated in rank order.
/// - broadcast(buf, count, dtype, root); reduce(send, recv, count, dtype, op, root).
/// - all_to_all(send, recv, count, dtype): `count` elements to and from each rank.
/// - all_to_all_v(send, send_counts, recv, recv_counts, dtype): variable blocks (a token dispatch):
///   send holds size() blocks back to back, block d (send_counts[d] elements) for rank d; recv gets
///   rank s's block at the sum of recv_counts[0..s). Rank s's send_counts[d] must equal rank d's
///   recv_counts[s]; every back end checks that before moving data and fails on every rank with a
///   comm_error naming the two ranks that disagree (MPI and NCCL exchange the counts first, in one
///   small blocking all-gather, so their all_to_all_v returns after the counts were agreed).
/// - send(buf, count, dtype, peer, tag); recv(buf, count, dtype, peer, tag).
/// - barrier(); split(color, key) -> a new communicator over the ranks with the same color, ordered
///   by (key, old rank); stats() -> byte counters of this communicator.
/// int32/uint8 are accepted where meaningful (all ops but avg on uint8).
template <class C>
concept Communicator = RankedGroup<C> && std::movable<C> &&
    requires(C& c, const C& cc, const void* s, void* r, std::size_t n, DType dt, ReduceOp op, int peer,
             std::span<const std::size_t> counts) {
      { c.all_reduce(s, r, n, dt, op) } -> std::same_as<Work>;
      { c.reduce_scatter(s, r, n, dt, op) } -> std::same_as<Work>;
      { c.all_gather(s, r, n, dt) } -> std::same_as<Work>;
      { c.all_gatherv(s, n, r, counts, dt) } -> std::same_as<Work>;
      { c.broadcast(r, n, dt, peer) } -> std::same_as<Work>;
      { c.reduce(s, r, n, dt, op, peer) } -> std::same_as<Work>;
      { c.all_to_all(s, r, n, dt) } -> std::same_as<Work>;
      { c.all_to_all_v(s, counts, r, counts, dt) } -> std::same_as<Work>;
      { c.send(s, n, dt, peer, peer) } -> std::same_as<Work>;
      { c.recv(r, n, dt, peer, peer) } -> std::same_as<Work>;
      { c.barrier() } -> std::same_as<Work>;
      { c.split(peer, peer) } -> std::same_as<C>;
      { cc.stats() } -> std::convertible_to<const CommStats&>;
    };

}  // namespace zerotk::comm
