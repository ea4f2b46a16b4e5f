#pragma once
/// \file zerotk/io/uring_queue.hpp
/// UringQueue: IoQueue on io_uring (liburing; ZEROTK_HAS_URING). `intra_op_parallelism` rings of
/// `queue_depth` entries, each driven by its own thread: the thread takes requests from its list,
/// keeps up to queue_depth of them in the kernel, resubmits the rest of a short transfer, and
/// reports each request's completion to its ticket. A transfer's requests are dealt round-robin
/// over the rings. The caller's thread never blocks on the ring, so a submitted transfer
/// proceeds while the caller computes (the offload store's pipelining relies on it).
///
///   single_submit    io_uring_submit after every prepared request (else once per batch)
///   overlap_events   after submitting, reap what has completed and top the ring up again; without
///                    it a batch is waited for completely before the next one is prepared
///
/// make_uring_queue() returns nullptr where the kernel refuses io_uring (ENOSYS, EPERM under a
/// seccomp filter, ENOMEM for the ring); the caller then falls back to ThreadPoolQueue.

#ifndef ZEROTK_HAS_URING
#define ZEROTK_HAS_URING 0
#endif

#include <algorithm>
#include <memory>
#include <string>

#include "zerotk/io/aio_options.hpp"
#include "zerotk/io/io_queue.hpp"

#if ZEROTK_HAS_URING
#include <liburing.h>
#endif

namespace zerotk::io {

#if ZEROTK_HAS_URING

class UringQueue final : public IoQueue {
 public:
  /// Throws std::system_error-free: check ok() after construction (a ring the kernel refused).
  UringQueue(int fd, std::string path, const AioOptions& aio) : IoQueue(fd, std::move(path)), aio_(aio) {
    rings_.reserve(static_cast<std::size_t>(aio.intra_op_parallelism));
    for (int i = 0; i < aio.intra_op_parallelism; ++i) {
      auto r = std::make_unique<Ring>();
      if (::io_uring_queue_init(static_cast<unsigned>(aio.queue_depth), &r->ring, 0) != 0) {
        ok_ = false;
        break;
      }
      r->initialised = true;
      r->slots.resize(static_cast<std::size_t>(aio.queue_depth));
      rings_.push_back(std::move(r));
    }
    if (!ok_) return;
    for (auto& r : rings_) r->thread = std::thread([this, ring = r.get()] { run(*ring); });
  }
  ~UringQueue() override {
    for (auto& r : rings_) {
      {
        std::lock_guard lock(r->mu);
        r->stop = true;
      }
      r->cv.notify_all();
      if (r->thread.joinable()) r->thread.join();
      if (r->initialised) ::io_uring_queue_exit(&r->ring);
    }
  }
  bool ok() const noexcept { return ok_; }
  const char* backend() const noexcept override { return "io_uring"; }

 private:
  struct Slot {
    Job job;
    std::size_t done = 0;  // bytes of the request already transferred
  };
  struct Ring {
    io_uring ring{};
    bool initialised = false;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Job> jobs;
    bool stop = false;
    std::vector<Slot> slots;
    std::vector<std::size_t> free_slots;
    std::thread thread;
  };

  void enqueue(Ticket t, std::span<const IoRequest> requests) override {
    for (const IoRequest& req : requests) {
      Ring& r = *rings_[next_ring_];
      next_ring_ = (next_ring_ + 1) % rings_.size();
      {
        std::lock_guard lock(r.mu);
        r.jobs.push_back(Job{t, req});
      }
      r.cv.notify_one();
    }
  }

  void prep(Ring& r, std::size_t slot_index) {
    Slot& s = r.slots[slot_index];
    io_uring_sqe* sqe = ::io_uring_get_sqe(&r.ring);  // never null: at most queue_depth in flight
    const IoRequest& q = s.job.request;
    if (q.write) {
      ::io_uring_prep_write(sqe, fd_, q.buffer + s.done, static_cast<unsigned>(q.bytes - s.done), q.offset + s.done);
    } else {
      ::io_uring_prep_read(sqe, fd_, q.buffer + s.done, static_cast<unsigned>(q.bytes - s.done), q.offset + s.done);
    }
    ::io_uring_sqe_set_data64(sqe, slot_index);
    if (aio_.single_submit) ::io_uring_submit(&r.ring);
  }

  /// Handles one completion; returns whether the slot was freed.
  bool reap(Ring& r, io_uring_cqe* cqe) {
    const auto slot_index = static_cast<std::size_t>(::io_uring_cqe_get_data64(cqe));
    const int res = cqe->res;
    ::io_uring_cqe_seen(&r.ring, cqe);
    Slot& s = r.slots[slot_index];
    const IoRequest& q = s.job.request;
    if (res == -EINTR || res == -EAGAIN || (res > 0 && s.done + static_cast<std::size_t>(res) < q.bytes)) {
      if (res > 0) s.done += static_cast<std::size_t>(res);
      prep(r, slot_index);  // the rest of a short transfer, or a retry
      if (!aio_.single_submit) ::io_uring_submit(&r.ring);
      return false;
    }
    int err = 0;
    if (res < 0) err = -res;
    if (res == 0 && s.done < q.bytes) err = q.write ? EIO : detail::kEndOfFile;
    complete(s.job.ticket, err, q.write, q.offset + s.done);
    r.free_slots.push_back(slot_index);
    return true;
  }

  void run(Ring& r) {
    r.free_slots.clear();
    for (std::size_t i = r.slots.size(); i-- > 0;) r.free_slots.push_back(i);
    std::size_t in_flight = 0;
    for (;;) {
      {
        std::unique_lock lock(r.mu);
        if (in_flight == 0) {
          r.cv.wait(lock, [&] { return r.stop || !r.jobs.empty(); });
          if (r.jobs.empty()) return;  // stopping, nothing left
        }
        std::size_t prepared = 0;
        while (!r.free_slots.empty() && !r.jobs.empty()) {
          Job j = r.jobs.front();
          r.jobs.pop_front();
          if (const int err = injected_fault(path_, j.request); err != 0) {
            complete(j.ticket, err, j.request.write, j.request.offset);
            continue;
          }
          const std::size_t i = r.free_slots.back();
          r.free_slots.pop_back();
          r.slots[i] = Slot{j, 0};
          prep(r, i);
          ++prepared;
        }
        in_flight += prepared;
      }
      if (in_flight == 0) continue;
      if (!aio_.single_submit) ::io_uring_submit(&r.ring);
      // overlap_events: one completion, then whatever else is ready, then top up again;
      // otherwise drain the batch before preparing more.
      do {
        io_uring_cqe* cqe = nullptr;
        int w;
        do {
          w = ::io_uring_wait_cqe(&r.ring, &cqe);
        } while (w == -EINTR);
        if (w < 0) {  // the ring itself failed: fail what is in flight
          for (std::size_t i = 0; i < r.slots.size(); ++i) {
            if (std::find(r.free_slots.begin(), r.free_slots.end(), i) != r.free_slots.end()) continue;
            complete(r.slots[i].job.ticket, -w, r.slots[i].job.request.write, r.slots[i].job.request.offset);
            r.free_slots.push_back(i);
          }
          in_flight = 0;
          break;
        }
        if (reap(r, cqe)) --in_flight;
        while (in_flight > 0 && ::io_uring_peek_cqe(&r.ring, &cqe) == 0 && cqe != nullptr) {
          if (reap(r, cqe)) --in_flight;
        }
      } while (!aio_.overlap_events && in_flight > 0);
    }
  }

  AioOptions aio_;
  bool ok_ = true;
  std::vector<std::unique_ptr<Ring>> rings_;
  std::size_t next_ring_ = 0;
};

#endif  // ZEROTK_HAS_URING

/// An io_uring queue where the build and the kernel allow one, else nullptr.
inline std::unique_ptr<IoQueue> make_uring_queue([[maybe_unused]] int fd, [[maybe_unused]] const std::string& path,
                                                 [[maybe_unused]] const AioOptions& aio) {
#if ZEROTK_HAS_URING
  auto q = std::make_unique<UringQueue>(fd, path, aio);
  if (q->ok()) return q;
#endif
  return nullptr;
}

}  // namespace zerotk::io
