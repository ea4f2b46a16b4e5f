#pragma once
/// \file zerotk/core/host_async.hpp
/// host_async: a GPU's execution model on host memory, so the engine's device orchestration (what
/// runs on which stream, which event orders it, when the host waits) is exercised by CI on a CPU.
/// `Device<HostAsync>` (device/host_async_ops.hpp) runs the engine on it; comm/stream_communicator.hpp
/// runs a host communicator's collectives on a stream of it. docs/device.md.
///
/// - A **Stream** runs what is enqueued on it in order, on a worker thread of its own, later: each
///   operation is either *held* until something waits for it (an Event on the host, a synchronize, or
///   another stream's wait) or run after a random spin; which, is drawn from the
///   device's seed. So a host read that skips its wait reads the old bits, not the new ones, and a
///   stream that skips an event runs ahead of its producer.
/// - An **Event** marks a point of a stream (`record()`); `Stream::wait(e)` orders later work of one
///   stream after it, `Event::synchronize()` blocks the host until it is reached.
/// - A **Device** owns its streams and the bookkeeping of its collectives in flight (InFlight): the
///   byte ranges a collective reads or writes from its enqueue until the host waits for its Work.
///   Device<HostAsync>'s operations check what they touch against it and throw a usage_error naming
///   the collective and the operation, where a GPU would silently race.
/// - **HostAsyncSpace** is the device memory: host allocations that the ledger counts as device
///   memory, not readable through a buffer's operator[] (as CUDA's), freed only after the device's
///   streams drained (cudaFree synchronizes too). Allocation needs a current device on the calling
///   thread (CurrentDevice, like cudaSetDevice). The device records its allocations, so a kernel or
///   a collective given host memory is refused (Device::require_device_memory).
/// - Drop (tests only) removes one kind of wait from the orchestration, to prove that each matters.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "zerotk/core/error.hpp"
#include "zerotk/core/memory.hpp"

namespace zerotk::host_async {

/// A wait of the orchestration that a test removes, to prove the emulation catches its absence.
enum class Drop : std::uint8_t {
  none,
  fence,        ///< the communicator's stream no longer waits for the compute stream before a collective
  result_sync,  ///< the norm's results are read without waiting for the compute stream
  copy_sync,    ///< copies to and from the host no longer wait for the compute stream
  work_wait,    ///< a collective's Work returns without waiting for it
};

struct Options {
  std::uint64_t seed = 1;       ///< draws which operations are held and how long the others spin
  double hold = 0.5;            ///< the share of operations held until something waits for them (0..1)
  /// An operation not held first spins 0..max_spin iterations (a few ns each: a delay that reorders
  /// without giving up the core, so a loaded machine does not slow it down by whole time slices).
  int max_spin = 4096;
  /// A held operation nobody waits for runs after this long anyway (counted in StreamStats: the
  /// orchestration never relies on it, which the tests check).
  std::chrono::milliseconds release_after{2000};
  Drop drop = Drop::none;       ///< tests only
};

struct StreamStats {
  std::uint64_t operations = 0;         ///< run so far
  std::uint64_t held = 0;               ///< of them, held until waited for
  std::uint64_t released_unwaited = 0;  ///< held ones that ran after release_after with nobody waiting
};

namespace detail {

class StreamState {
 public:
  StreamState(std::uint64_t seed, const Options& o) : rng_(seed), hold_(o.hold), max_spin_(o.max_spin),
                                                       release_after_(o.release_after) {
    worker_ = std::thread([this] { run(); });
  }
  StreamState(const StreamState&) = delete;
  StreamState& operator=(const StreamState&) = delete;
  ~StreamState() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
      demanded_ = enqueued_;
    }
    cv_.notify_all();
    worker_.join();
  }

  /// Queues `fn`; returns its ticket (1, 2, ...).
  std::uint64_t enqueue(std::function<void()> fn) {
    std::uint64_t ticket;
    {
      std::lock_guard lock(mu_);
      const bool held = std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < hold_;
      const int spin = max_spin_ > 0 ? static_cast<int>(rng_() % static_cast<std::uint64_t>(max_spin_ + 1)) : 0;
      ticket = ++enqueued_;
      queue_.push_back(Task{std::move(fn), ticket, held, spin});
    }
    cv_.notify_all();
    return ticket;
  }
  std::uint64_t last() const {
    std::lock_guard lock(mu_);
    return enqueued_;
  }
  /// Asks for everything up to `ticket` to run, without waiting.
  void demand(std::uint64_t ticket) {
    {
      std::lock_guard lock(mu_);
      demanded_ = std::max(demanded_, ticket);
    }
    cv_.notify_all();
  }
  /// Blocks until everything up to `ticket` ran.
  void wait_for(std::uint64_t ticket) {
    std::unique_lock lock(mu_);
    demanded_ = std::max(demanded_, ticket);
    cv_.notify_all();
    cv_.wait(lock, [&] { return completed_ >= ticket; });
  }
  bool reached(std::uint64_t ticket) const {
    std::lock_guard lock(mu_);
    return completed_ >= ticket;
  }
  /// The first failure of an operation since the last call, if any (then cleared).
  std::exception_ptr take_error() {
    std::lock_guard lock(mu_);
    return std::exchange(error_, nullptr);
  }
  StreamStats stats() const {
    std::lock_guard lock(mu_);
    return stats_;
  }
  /// Whether the calling thread is this stream's worker (an operation running on it).
  bool on_worker() const noexcept { return std::this_thread::get_id() == worker_.get_id(); }

 private:
  struct Task {
    std::function<void()> fn;
    std::uint64_t ticket;
    bool held;
    int spin;
  };

  /// A delay that keeps the core: `n` dependent steps the compiler cannot drop.
  static void spin(int n) {
    std::atomic<int> sink{0};
    for (int i = 0; i < n; ++i) sink.fetch_add(1, std::memory_order_relaxed);
  }

  void run() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      const std::uint64_t ticket = queue_.front().ticket;
      const bool held = queue_.front().held;
      if (held && !cv_.wait_for(lock, release_after_, [&] { return stop_ || demanded_ >= ticket; })) {
        ++stats_.released_unwaited;
      }
      Task task = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      spin(task.spin);
      std::exception_ptr failed;
      try {
        task.fn();
      } catch (...) {
        failed = std::current_exception();
      }
      task.fn = nullptr;  // what it captured goes before the ticket counts as done
      lock.lock();
      if (failed && !error_) error_ = failed;
      ++stats_.operations;
      if (held) ++stats_.held;
      completed_ = ticket;
      cv_.notify_all();
    }
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  std::uint64_t enqueued_ = 0, completed_ = 0, demanded_ = 0;
  std::exception_ptr error_;
  StreamStats stats_;
  std::mt19937_64 rng_;
  double hold_;
  int max_spin_;
  std::chrono::milliseconds release_after_;
  bool stop_ = false;
  std::thread worker_;  // last: started once everything it reads exists
};

}  // namespace detail

/// A point of a stream: everything enqueued on it before record().
class Event {
 public:
  Event() = default;  ///< already reached
  Event(std::shared_ptr<detail::StreamState> s, std::uint64_t ticket) : s_(std::move(s)), ticket_(ticket) {}
  /// Blocks the host until the stream reached this point (asking for it to run).
  void synchronize() const {
    if (s_) s_->wait_for(ticket_);
  }
  /// Asks for the stream to run up to this point, without waiting.
  void demand() const {
    if (s_) s_->demand(ticket_);
  }
  bool reached() const { return !s_ || s_->reached(ticket_); }
  const detail::StreamState* stream() const noexcept { return s_.get(); }

 private:
  std::shared_ptr<detail::StreamState> s_;
  std::uint64_t ticket_ = 0;
};

/// A queue of operations run in order on a worker thread (Device::make_stream). Copies share it.
/// An operation must not hold the last copy of its own stream (its worker would join itself).
class Stream {
 public:
  explicit Stream(std::shared_ptr<detail::StreamState> s) : s_(std::move(s)) {}

  /// Runs `fn` after everything enqueued before; it must own or outlive what it touches.
  void enqueue(std::function<void()> fn) { s_->enqueue(std::move(fn)); }
  /// The point after everything enqueued so far.
  Event record() const { return Event(s_, s_->last()); }
  /// Later operations of this stream run after `e` was reached (cudaStreamWaitEvent).
  void wait(const Event& e) {
    if (e.stream() == s_.get()) return;  // a stream is in order with itself
    s_->enqueue([e] { e.synchronize(); });
  }
  /// Blocks the host until everything enqueued ran; rethrows the first operation that failed.
  void synchronize() {
    s_->wait_for(s_->last());
    if (std::exception_ptr e = s_->take_error()) std::rethrow_exception(e);
  }
  StreamStats stats() const { return s_->stats(); }
  friend bool operator==(const Stream& a, const Stream& b) noexcept { return a.s_ == b.s_; }

 private:
  std::shared_ptr<detail::StreamState> s_;
};

/// One byte range of a collective in flight.
struct Range {
  const void* begin = nullptr;
  std::size_t bytes = 0;
  bool overlaps(const Range& o) const noexcept {
    const auto a = reinterpret_cast<std::uintptr_t>(begin), b = reinterpret_cast<std::uintptr_t>(o.begin);
    return bytes && o.bytes && a < b + o.bytes && b < a + bytes;
  }
};

/// The collectives in flight on a device (enqueued, their Work not yet waited for by the host):
/// what each reads and writes. An operation that writes what one reads or writes, or reads what one
/// writes, races with it on a GPU; here it throws naming both.
class InFlight {
 public:
  /// Returns the entry's id (for finish()).
  std::uint64_t start(std::string what, Range reads, Range writes) {
    std::lock_guard lock(mu_);
    entries_.push_back(Entry{++next_, std::move(what), reads, writes});
    return next_;
  }
  void finish(std::uint64_t id) {
    std::lock_guard lock(mu_);
    std::erase_if(entries_, [&](const Entry& e) { return e.id == id; });
  }
  /// Throws a usage_error if `op` (reading `reads`, writing `writes`) races a collective in flight.
  void check(const char* op, std::initializer_list<Range> reads, std::initializer_list<Range> writes) const {
    std::lock_guard lock(mu_);
    for (const Entry& e : entries_) {
      for (const Range& w : writes) {
        if (w.overlaps(e.reads) || w.overlaps(e.writes)) race(op, "writes", e);
      }
      for (const Range& r : reads) {
        if (r.overlaps(e.writes)) race(op, "reads", e);
      }
    }
  }
  std::size_t size() const {
    std::lock_guard lock(mu_);
    return entries_.size();
  }

 private:
  struct Entry {
    std::uint64_t id;
    std::string what;
    Range reads, writes;
  };
  [[noreturn]] static void race(const char* op, const char* how, const Entry& e) {
    throw usage_error(std::string("the operation ") + how + " bytes that a collective in flight uses (wait for the "
                      "collective's Work before the compute stream touches its buffers)",
                      std::string("Device<HostAsync> ") + op, e.what);
  }
  mutable std::mutex mu_;
  std::vector<Entry> entries_;
  std::uint64_t next_ = 0;
};

namespace detail {
struct DeviceState {
  Options options;
  std::mutex mu;
  std::vector<std::shared_ptr<StreamState>> streams;
  InFlight in_flight;
  std::map<std::uintptr_t, std::size_t> allocations;  // HostAsyncSpace's: begin -> bytes (under mu)

  explicit DeviceState(const Options& o) : options(o) {}
  void allocated(const void* p, std::size_t bytes) {
    std::lock_guard lock(mu);
    allocations[reinterpret_cast<std::uintptr_t>(p)] = bytes;
  }
  void freed(const void* p) {
    std::lock_guard lock(mu);
    allocations.erase(reinterpret_cast<std::uintptr_t>(p));
  }
  /// Whether `r` lies inside one allocation of this device.
  bool owns(const Range& r) {
    const auto a = reinterpret_cast<std::uintptr_t>(r.begin);
    std::lock_guard lock(mu);
    auto it = allocations.upper_bound(a);
    if (it == allocations.begin()) return false;
    --it;
    return a + r.bytes <= it->first + it->second;
  }
  void synchronize() {
    std::vector<std::shared_ptr<StreamState>> all;
    {
      std::lock_guard lock(mu);
      all = streams;
    }
    for (const auto& s : all) {
      if (!s->on_worker()) s->wait_for(s->last());  // an operation freeing memory: its own stream is busy with it
    }
  }
};
}  // namespace detail

/// A device: its streams, its collectives in flight, its options. Copies share it.
class Device {
 public:
  explicit Device(const Options& o = {}) : s_(std::make_shared<detail::DeviceState>(o)) {}
  /// A new stream; its draws come from the device's seed and the stream's index.
  Stream make_stream() {
    std::lock_guard lock(s_->mu);
    const std::uint64_t seed = s_->options.seed * 0x9E3779B97F4A7C15ull + s_->streams.size();
    s_->streams.push_back(std::make_shared<detail::StreamState>(seed, s_->options));
    return Stream(s_->streams.back());
  }
  /// Blocks until every stream of the device ran everything enqueued (cudaDeviceSynchronize).
  void synchronize() { s_->synchronize(); }
  const Options& options() const noexcept { return s_->options; }
  InFlight& in_flight() const noexcept { return s_->in_flight; }
  /// Whether `r` lies inside one of this device's allocations (HostAsyncSpace).
  bool owns(const Range& r) const { return s_->owns(r); }
  /// Throws a usage_error unless every non-empty range is this device's memory: a kernel or a
  /// collective on a device given host memory (the GPU would fault or read garbage).
  void require_device_memory(const char* op, std::initializer_list<Range> ranges) const {
    for (const Range& r : ranges) {
      if (r.bytes && !s_->owns(r)) {
        throw usage_error("the operation was given memory that is not the device's (host memory, or another "
                          "device's): a GPU would fault or read garbage; copy it to the device first",
                          std::string("Device<HostAsync> ") + op, std::to_string(r.bytes) + " bytes");
      }
    }
  }
  /// Summed over the device's streams.
  StreamStats stats() const {
    std::lock_guard lock(s_->mu);
    StreamStats t;
    for (const auto& s : s_->streams) {
      const StreamStats one = s->stats();
      t.operations += one.operations;
      t.held += one.held;
      t.released_unwaited += one.released_unwaited;
    }
    return t;
  }
  friend bool operator==(const Device& a, const Device& b) noexcept { return a.s_ == b.s_; }
  const std::shared_ptr<detail::DeviceState>& state() const noexcept { return s_; }

 private:
  std::shared_ptr<detail::DeviceState> s_;
};

namespace detail {
inline std::shared_ptr<DeviceState>& current() noexcept {
  thread_local std::shared_ptr<DeviceState> d;
  return d;
}
}  // namespace detail

/// Makes `d` the calling thread's current device while it lives (cudaSetDevice): HostAsyncSpace
/// allocates there.
class CurrentDevice {
 public:
  explicit CurrentDevice(const Device& d) : previous_(std::exchange(detail::current(), d.state())) {}
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;
  ~CurrentDevice() { detail::current() = std::move(previous_); }

 private:
  std::shared_ptr<detail::DeviceState> previous_;
};

/// Whether `d` is the calling thread's current device.
inline bool is_current(const Device& d) noexcept { return detail::current() == d.state(); }

}  // namespace zerotk::host_async

namespace zerotk {

/// Device<HostAsync>'s memory (core/host_async.hpp): host allocations on the calling thread's
/// current host_async device, counted as device memory, freed once that device's streams drained.
struct HostAsyncSpace {
  static constexpr bool host_accessible = false;
  static constexpr MemorySpace memory_space = MemorySpace::device;
  template <class T>
  static T* allocate(std::size_t n, MemoryCategory cat) {
    if (n == 0) return nullptr;
    std::shared_ptr<host_async::detail::DeviceState>& dev = host_async::detail::current();
    if (!dev) {
      throw usage_error("no host_async device is current on this thread (make one current with "
                        "host_async::CurrentDevice, as cudaSetDevice before a cudaMalloc)",
                        std::string("HostAsyncSpace::allocate (") + std::string(to_string(cat)) + ")",
                        std::to_string(n * sizeof(T)) + " bytes");
    }
    auto* base = static_cast<std::byte*>(aligned_alloc_bytes(kHeader + n * sizeof(T)));
    new (base) std::shared_ptr<host_async::detail::DeviceState>(dev);
    T* p = reinterpret_cast<T*>(base + kHeader);
    for (std::size_t i = 0; i < n; ++i) new (p + i) T();
    dev->allocated(p, n * sizeof(T));
    return p;
  }
  template <class T>
  static void deallocate(T* p, std::size_t) noexcept {
    if (!p) return;
    auto* base = reinterpret_cast<std::byte*>(p) - kHeader;
    auto* dev = std::launder(reinterpret_cast<std::shared_ptr<host_async::detail::DeviceState>*>(base));
    (*dev)->synchronize();  // no operation may still use it
    (*dev)->freed(p);
    std::destroy_at(dev);
    aligned_free_bytes(base);
  }

 private:
  static constexpr std::size_t kHeader = kAlignment;  // keeps the elements aligned as HostSpace's
  static_assert(sizeof(std::shared_ptr<host_async::detail::DeviceState>) <= kHeader);
};

}  // namespace zerotk
