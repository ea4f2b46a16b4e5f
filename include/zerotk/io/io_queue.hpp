#pragma once
/// \file zerotk/io/io_queue.hpp
/// Asynchronous reads and writes of aligned blocks at offsets of one file descriptor.
///
///   IoQueue            submit(requests) -> Ticket, returns at once; wait(ticket) blocks until
///                      all of them are done and throws io_error for the first that failed
///   ThreadPoolQueue    pread/pwrite on worker threads (where io_uring is unavailable)
///   UringQueue         io_uring rings (io/uring_queue.hpp; builds with liburing)
///
/// An error names the file, the byte offset of the failed request and the errno text:
///   zerotk io error at /disk/zerotk_optim.r0.main.swap:1048576: write failed (got No space left on
///   device (errno 28))
/// A read that meets the end of the file (a file truncated under the run) is an error too.
///
/// Test hook: set_fault_hook(f) makes every request first ask f; a non-zero return is taken as the
/// errno of that request, which is then not done. One relaxed atomic load per request when unset.

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "zerotk/core/error.hpp"

namespace zerotk::io {

/// One transfer: `bytes` at file `offset` from or into `buffer` (aligned for O_DIRECT).
struct IoRequest {
  bool write = false;
  std::byte* buffer = nullptr;
  std::size_t bytes = 0;
  std::uint64_t offset = 0;
};

/// What a fault hook is asked about.
struct FaultSite {
  const char* path = "";
  bool write = false;
  std::uint64_t offset = 0;
  std::size_t bytes = 0;
};
/// Returns the errno to inject (0: do the request).
using FaultHook = int (*)(const FaultSite&);

namespace detail {
inline std::atomic<FaultHook> fault_hook{nullptr};
/// The errno a read that hits the end of the file reports (a truncated file).
inline constexpr int kEndOfFile = -1;
}  // namespace detail

/// Installs (or, with nullptr, removes) the fault-injection hook for every queue of the process.
inline void set_fault_hook(FaultHook hook) noexcept { detail::fault_hook.store(hook, std::memory_order_release); }

inline int injected_fault(const std::string& path, const IoRequest& r) noexcept {
  const FaultHook h = detail::fault_hook.load(std::memory_order_acquire);
  if (h == nullptr) return 0;
  FaultSite s;
  s.path = path.c_str();
  s.write = r.write;
  s.offset = r.offset;
  s.bytes = r.bytes;
  return h(s);
}

/// Does `r` on `fd` with pread/pwrite, retrying interrupted and short transfers. Returns 0, an
/// errno, or detail::kEndOfFile; `*failed_at` is the offset where it stopped.
inline int transfer_blocking(int fd, const IoRequest& r, std::uint64_t* failed_at) noexcept {
  std::size_t done = 0;
  while (done < r.bytes) {
    const auto at = static_cast<off_t>(r.offset + done);
    const ::ssize_t n = r.write ? ::pwrite(fd, r.buffer + done, r.bytes - done, at)
                                : ::pread(fd, r.buffer + done, r.bytes - done, at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *failed_at = r.offset + done;
      return n < 0 ? errno : (r.write ? EIO : detail::kEndOfFile);
    }
    done += static_cast<std::size_t>(n);
  }
  return 0;
}

/// The common part of every queue: tickets, their outstanding request counts and first errors.
class IoQueue {
 public:
  using Ticket = std::uint64_t;
  /// No ticket (wait() on it returns at once).
  static constexpr Ticket kNone = 0;

  IoQueue(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  IoQueue(const IoQueue&) = delete;
  IoQueue& operator=(const IoQueue&) = delete;
  virtual ~IoQueue() = default;

  /// Queues the requests and returns (an empty span gives kNone).
  Ticket submit(std::span<const IoRequest> requests) {
    if (requests.empty()) return kNone;
    Ticket t;
    {
      std::lock_guard lock(mu_);
      t = ++next_;
      tickets_[t].remaining = requests.size();
    }
    enqueue(t, requests);
    return t;
  }

  /// Blocks until every request of `t` is done; throws io_error (file:offset, errno text) for the
  /// first one that failed. Each ticket is waited at most once.
  void wait(Ticket t) {
    if (t == kNone) return;
    State s;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return tickets_.at(t).remaining == 0; });
      s = tickets_.at(t);
      tickets_.erase(t);
    }
    if (s.err == 0) return;
    const std::string where = path_ + ":" + std::to_string(s.failed_at);
    if (s.err == detail::kEndOfFile) {
      throw io_error("read failed", where, "end of file: the swap file is shorter than the state it holds (truncated?)");
    }
    throw io_error(s.write ? "write failed" : "read failed", where,
                   std::strerror(s.err) + std::string(" (errno ") + std::to_string(s.err) + ")");
  }
  /// wait() for clean-up paths: the error is dropped.
  void wait_quietly(Ticket t) noexcept {
    try {
      wait(t);
    } catch (...) {
    }
  }

  const std::string& path() const noexcept { return path_; }
  virtual const char* backend() const noexcept = 0;

 protected:
  struct Job {
    Ticket ticket = kNone;
    IoRequest request;
  };
  virtual void enqueue(Ticket t, std::span<const IoRequest> requests) = 0;

  /// A worker reports one request of `t` done (err 0) or failed.
  void complete(Ticket t, int err, bool write, std::uint64_t failed_at) {
    {
      std::lock_guard lock(mu_);
      State& s = tickets_.at(t);
      if (err != 0 && s.err == 0) {
        s.err = err;
        s.write = write;
        s.failed_at = failed_at;
      }
      --s.remaining;
    }
    cv_.notify_all();
  }

  int fd_;
  std::string path_;

 private:
  struct State {
    std::size_t remaining = 0;
    int err = 0;
    bool write = false;
    std::uint64_t failed_at = 0;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<Ticket, State> tickets_;
  Ticket next_ = kNone;
};

/// pread/pwrite on `threads` worker threads, one request each at a time.
class ThreadPoolQueue final : public IoQueue {
 public:
  ThreadPoolQueue(int fd, std::string path, int threads) : IoQueue(fd, std::move(path)) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { run(); });
  }
  ~ThreadPoolQueue() override {
    {
      std::lock_guard lock(jobs_mu_);
      stop_ = true;
    }
    jobs_cv_.notify_all();
    for (auto& w : workers_) w.join();
  }
  const char* backend() const noexcept override { return "pread/pwrite thread pool"; }

 private:
  void enqueue(Ticket t, std::span<const IoRequest> requests) override {
    {
      std::lock_guard lock(jobs_mu_);
      for (const IoRequest& r : requests) jobs_.push_back(Job{t, r});
    }
    jobs_cv_.notify_all();
  }
  void run() {
    for (;;) {
      Job j;
      {
        std::unique_lock lock(jobs_mu_);
        jobs_cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping, nothing left
        j = jobs_.front();
        jobs_.pop_front();
      }
      std::uint64_t failed_at = j.request.offset;
      int err = injected_fault(path_, j.request);
      if (err == 0) err = transfer_blocking(fd_, j.request, &failed_at);
      complete(j.ticket, err, j.request.write, failed_at);
    }
  }

  std::mutex jobs_mu_;
  std::condition_variable jobs_cv_;
  std::deque<Job> jobs_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace zerotk::io
