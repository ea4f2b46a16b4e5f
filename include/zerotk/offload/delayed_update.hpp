#pragma once
/// \file zerotk/offload/delayed_update.hpp
/// DelayedUpdate: ZeRO-Offload's delayed parameter update (DPU) for a store that steps on the host
/// (Offload<Cpu>). The host step of optimizer step t runs on a worker thread while the trainer goes
/// on with the forward and backward of step t + 1, which therefore still use the parameters of
/// step t - 1: every update lands one step late.
///
/// At a boundary the group (engine/group.hpp) does, in this order:
///   1. finish()                      the update started at the previous boundary has finished
///   2. take this step's gradients    compute space -> `grads()`, indexed like the master
///   3. put the finished update's     `out()` -> the parameter path, then published (all-gather),
///      values, take()                at stage 2 over the gradient partition, hence 2. first
///   4. start(f)                      f steps the store from `grads()` into `out()` off this thread
///
/// so the recursion is master_{t+1} = Adam(master_t, g(params_{t-1})). The worker touches only the
/// store's host state and the two buffers here, never the compute space or the communicator; the
/// training thread touches neither while the worker runs (the engine keeps the schedule's
/// learning rate away from the optimizer until it has waited).
///
/// Memory: two page-locked buffers of the owned elements, 4 bytes each at most (the gradient
/// snapshot, in the `grads` category; the delayed values, in `params16`), on top of the store's.

#include <cstddef>
#include <exception>
#include <thread>
#include <utility>

#include "zerotk/core/error.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/core/pinned_host_space.hpp"

namespace zerotk::offload {

class DelayedUpdate {
 public:
  /// The largest gradient or parameter element a buffer holds (fp32).
  static constexpr std::size_t kElementBytes = sizeof(float);

  DelayedUpdate(MemoryLedger* ledger, std::size_t owned_numel)
      : grads_(owned_numel * kElementBytes, MemoryCategory::grads, ledger),
        out_(owned_numel * kElementBytes, MemoryCategory::params16, ledger) {}
  DelayedUpdate(const DelayedUpdate&) = delete;
  DelayedUpdate& operator=(const DelayedUpdate&) = delete;
  ~DelayedUpdate() { drop(); }

  /// The snapshot of a step's gradients and the values its update produces, as elements of G / V
  /// (at most 4 bytes), indexed like the master.
  template <class G>
  G* grads() noexcept {
    static_assert(sizeof(G) <= kElementBytes, "offload::DelayedUpdate: elements of at most 4 bytes");
    return reinterpret_cast<G*>(grads_.data());
  }
  template <class V>
  V* out() noexcept {
    static_assert(sizeof(V) <= kElementBytes, "offload::DelayedUpdate: elements of at most 4 bytes");
    return reinterpret_cast<V*>(out_.data());
  }

  /// Whether an update was started and its values are neither taken nor superseded yet.
  bool pending() const noexcept { return running_ || ready_; }
  /// Whether the worker may still be running (nothing it uses may be touched).
  bool running() const noexcept { return running_; }

  /// Runs `step()` on the worker thread. Only when nothing is pending.
  template <class F>
  void start(F step) {
    if (pending()) throw usage_error("an update is still pending", "offload::DelayedUpdate::start");
    worker_ = std::thread([this, step = std::move(step)]() mutable {
      try {
        step();
      } catch (...) {
        error_ = std::current_exception();
      }
    });
    running_ = true;
  }

  /// Waits for the worker. Returns whether values are waiting to be taken (`out()` holds them until
  /// take()). Rethrows what the update threw; its values are then dropped.
  bool finish() {
    if (running_) {
      join();
      running_ = false;
      ready_ = true;
      if (error_) {
        ready_ = false;
        std::rethrow_exception(std::exchange(error_, nullptr));
      }
    }
    return ready_;
  }
  /// The values were taken (published) or superseded.
  void take() noexcept { ready_ = false; }

  /// Waits for the worker and forgets the update, and what it threw.
  void drop() noexcept {
    join();
    running_ = ready_ = false;
    error_ = nullptr;
  }

 private:
  void join() noexcept {
    if (worker_.joinable()) worker_.join();
  }

  PinnedTrackedBuffer<std::byte> grads_;  // [owned] this step's gradients, <= 4 B each
  PinnedTrackedBuffer<std::byte> out_;    // [owned] the update's working-precision values
  std::thread worker_;
  std::exception_ptr error_;
  bool running_ = false;  // started, not joined
  bool ready_ = false;    // joined, values in out_ not yet taken
};

}  // namespace zerotk::offload
