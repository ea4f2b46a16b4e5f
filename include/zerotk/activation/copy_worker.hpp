#pragma once
/// \file zerotk/activation/copy_worker.hpp
/// CopyWorker: one background thread that runs copies in the order they were submitted, so that
/// moving a saved input to pinned host memory (and back before its recompute) overlaps the layer's
/// own compute. submit() returns a ticket; wait(ticket) returns once that copy and every earlier one
/// are done, and rethrows the first exception one of those copies threw (a bad_alloc while
/// restoring, say), once.
///
/// On Device<Host> the copies are memcpy on another core; a user whose ActivationTraits copy from a
/// device runs them on this thread too (a blocking cudaMemcpy there does not block the trainer).

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace zerotk::activation {

class CopyWorker {
 public:
  using Ticket = std::uint64_t;

  CopyWorker() : thread_([this] { run(); }) {}
  CopyWorker(const CopyWorker&) = delete;
  CopyWorker& operator=(const CopyWorker&) = delete;
  /// Finishes the queued copies, then joins.
  ~CopyWorker() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

  Ticket submit(std::function<void()> copy) {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(copy));
    const Ticket t = ++submitted_;
    wake_.notify_all();
    return t;
  }

  /// Blocks until the copy with ticket `t` (and all before it) ran; rethrows a copy's exception once.
  void wait(Ticket t) {
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return done_ >= t; });
    if (error_ && error_ticket_ <= t) std::rethrow_exception(std::exchange(error_, nullptr));
  }

  /// Every copy submitted so far has run.
  void drain() { wait(submitted()); }
  /// drain(), dropping any copy's exception (for clean-up paths that discard the copies' results).
  void drain_quietly() noexcept {
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return done_ >= submitted_; });
    error_ = nullptr;
  }

  Ticket submitted() const {
    std::lock_guard lock(mu_);
    return submitted_;
  }

 private:
  void run() {
    std::unique_lock lock(mu_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left
      auto copy = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      std::exception_ptr e;
      try {
        copy();
      } catch (...) {
        e = std::current_exception();
      }
      lock.lock();
      ++done_;
      if (e && !error_) {
        error_ = e;
        error_ticket_ = done_;
      }
      done_cv_.notify_all();
    }
  }

  mutable std::mutex mu_;
  std::condition_variable wake_, done_cv_;
  std::deque<std::function<void()>> queue_;
  Ticket submitted_ = 0, done_ = 0, error_ticket_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members above exist
};

}  // namespace zerotk::activation
