#pragma once
/// \file zerotk/comm/stream_communicator.hpp
/// StreamCommunicator<C>: a host communicator whose collectives run on a stream of a host_async
/// device (core/host_async.hpp), as NCCL's run on a CUDA stream: each call is enqueued and returns
/// at once; its Work completes when the stream ran it. Device<HostAsync> engines take one
/// (device/host_async_ops.hpp); docs/device.md.
///
///   zerotk::host_async::Device dev({.seed = 7});
///   zerotk::host_async::CurrentDevice current(dev);
///   zerotk::comm::StreamCommunicator comm(threads_comm.split(0, threads_comm.rank()), dev);
///
/// Its buffers must be the device's memory (HostAsyncSpace; host memory is refused naming the call),
/// so `comm::uses_device_memory` is true for it, as for NCCL.
///
/// It owns the communicator it wraps (every call to that one must go through this, in one order on
/// every rank, so give it one of its own: a split). A split shares the stream (NCCL's split shares
/// its parent's stream too), so the calls of a communicator and its splits run in the order they
/// were made. Every collective's byte ranges are recorded on the device (host_async::InFlight) from
/// the call until the host waits for its Work; the device's operations refuse to touch them
/// meanwhile. Point-to-point calls run one at a time on the stream: a pattern in which two ranks
/// both send first needs a back end whose sends do not wait for the receive (threads, MPI eager).

#include <cstddef>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "zerotk/comm/accounting.hpp"
#include "zerotk/comm/communicator.hpp"
#include "zerotk/comm/typed.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/core/host_async.hpp"

namespace zerotk::comm {

template <Communicator C>
class StreamCommunicator {
 public:
  /// Owns `inner`; its collectives run on a new stream of `device`.
  StreamCommunicator(C inner, host_async::Device device)
      : StreamCommunicator(std::make_shared<C>(std::move(inner)), device, device.make_stream()) {}

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }

  Work all_reduce(const void* s, void* r, std::size_t n, DType t, ReduceOp op) {
    detail::record_ring(stats_, OpKind::all_reduce, n * size_of(t), size_);
    return run("all_reduce", {s, n * size_of(t)}, {r, n * size_of(t)},
               [=](C& c) { return c.all_reduce(s, r, n, t, op); });
  }
  Work reduce_scatter(const void* s, void* r, std::size_t n, DType t, ReduceOp op) {
    detail::record_ring(stats_, OpKind::reduce_scatter, sz() * n * size_of(t), size_);
    return run("reduce_scatter", {s, sz() * n * size_of(t)}, {r, n * size_of(t)},
               [=](C& c) { return c.reduce_scatter(s, r, n, t, op); });
  }
  Work all_gather(const void* s, void* r, std::size_t n, DType t) {
    detail::record_ring(stats_, OpKind::all_gather, sz() * n * size_of(t), size_);
    return run("all_gather", {s, n * size_of(t)}, {r, sz() * n * size_of(t)},
               [=](C& c) { return c.all_gather(s, r, n, t); });
  }
  Work all_gatherv(const void* s, std::size_t n, void* r, std::span<const std::size_t> counts, DType t) {
    std::vector<std::size_t> rc(counts.begin(), counts.end());
    const std::size_t total = std::accumulate(rc.begin(), rc.end(), std::size_t{0});
    detail::record(stats_, OpKind::all_gatherv, total * size_of(t), all_gatherv_wire_bytes(rc, rank_, size_of(t)));
    return run("all_gatherv", {s, n * size_of(t)}, {r, total * size_of(t)},
               [=, rc = std::move(rc)](C& c) { return c.all_gatherv(s, n, r, rc, t); });
  }
  Work broadcast(void* b, std::size_t n, DType t, int root) {
    detail::record_ring(stats_, OpKind::broadcast, n * size_of(t), size_);
    const host_async::Range buf{b, n * size_of(t)};  // the root's is read, the others' written
    return run("broadcast", rank_ == root ? buf : host_async::Range{}, rank_ == root ? host_async::Range{} : buf,
               [=](C& c) { return c.broadcast(b, n, t, root); });
  }
  Work reduce(const void* s, void* r, std::size_t n, DType t, ReduceOp op, int root) {
    detail::record_ring(stats_, OpKind::reduce, n * size_of(t), size_);
    return run("reduce", {s, n * size_of(t)}, {r, rank_ == root ? n * size_of(t) : 0},
               [=](C& c) { return c.reduce(s, r, n, t, op, root); });
  }
  Work all_to_all(const void* s, void* r, std::size_t n, DType t) {
    detail::record_ring(stats_, OpKind::all_to_all, sz() * n * size_of(t), size_);
    return run("all_to_all", {s, sz() * n * size_of(t)}, {r, sz() * n * size_of(t)},
               [=](C& c) { return c.all_to_all(s, r, n, t); });
  }
  Work all_to_all_v(const void* s, std::span<const std::size_t> sc, void* r, std::span<const std::size_t> rc, DType t) {
    std::vector<std::size_t> send(sc.begin(), sc.end()), recv(rc.begin(), rc.end());
    const std::size_t out = std::accumulate(send.begin(), send.end(), std::size_t{0});
    const std::size_t in = std::accumulate(recv.begin(), recv.end(), std::size_t{0});
    detail::record(stats_, OpKind::all_to_all_v, out * size_of(t), all_to_all_v_wire_bytes(send, rank_, size_of(t)));
    return run("all_to_all_v", {s, out * size_of(t)}, {r, in * size_of(t)},
               [=, send = std::move(send), recv = std::move(recv)](C& c) {
                 return c.all_to_all_v(s, send, r, recv, t);
               });
  }
  Work send(const void* b, std::size_t n, DType t, int peer, int tag) {
    detail::record(stats_, OpKind::send, n * size_of(t), n * size_of(t));
    return run("send", {b, n * size_of(t)}, {}, [=](C& c) { return c.send(b, n, t, peer, tag); });
  }
  Work recv(void* b, std::size_t n, DType t, int peer, int tag) {
    detail::record(stats_, OpKind::recv, n * size_of(t), 0);
    return run("recv", {}, {b, n * size_of(t)}, [=](C& c) { return c.recv(b, n, t, peer, tag); });
  }
  Work barrier() {
    detail::record(stats_, OpKind::barrier, 0, 0);
    return run("barrier", {}, {}, [](C& c) { return c.barrier(); });
  }
  /// Collective; the child runs on the same stream. (Synchronous, whatever host_async::Drop says:
  /// the host needs the child.)
  StreamCommunicator split(int color, int key) {
    auto child = std::make_shared<std::shared_ptr<C>>();
    auto out = std::make_shared<Outcome>();
    stream_.enqueue([inner = inner_, child, out, color, key] {
      try {
        *child = std::make_shared<C>(inner->split(color, key));
      } catch (...) {
        out->error = std::current_exception();
      }
    });
    stream_.record().synchronize();
    if (out->error) std::rethrow_exception(out->error);
    return StreamCommunicator(std::move(*child), device_, stream_);
  }
  /// The counters, counted when each call was made (as NCCL's): never waits for the stream.
  const CommStats& stats() const noexcept { return stats_; }

  /// The stream its collectives run on, and its device.
  host_async::Stream& stream() noexcept { return stream_; }
  const host_async::Device& device() const noexcept { return device_; }

 private:
  StreamCommunicator(std::shared_ptr<C> inner, host_async::Device device, host_async::Stream stream)
      : inner_(std::move(inner)), device_(std::move(device)), stream_(std::move(stream)),
        rank_(inner_->rank()), size_(inner_->size()) {}

  std::size_t sz() const noexcept { return static_cast<std::size_t>(size_); }

  struct Outcome {
    std::exception_ptr error;
  };

  class StreamWork final : public WorkState {
   public:
    StreamWork(host_async::Event done, std::shared_ptr<Outcome> out, host_async::Device device, std::uint64_t id,
               bool dropped_wait)
        : done_(std::move(done)), out_(std::move(out)), device_(std::move(device)), id_(id), skip_(dropped_wait) {}
    void wait() override {
      if (skip_) {  // host_async::Drop::work_wait: the wait removed (the collective stays in flight)
        done_.demand();
        return;
      }
      done_.synchronize();
      device_.in_flight().finish(id_);
      if (out_->error) std::rethrow_exception(out_->error);
    }
    bool test() override {
      done_.demand();  // polling makes progress, as a GPU's queue does
      if (!done_.reached()) return false;
      wait();
      return true;
    }

   private:
    host_async::Event done_;
    std::shared_ptr<Outcome> out_;
    host_async::Device device_;  // its in-flight bookkeeping
    std::uint64_t id_;
    bool skip_;
  };

  template <class F>
  Work run(const char* what, host_async::Range reads, host_async::Range writes, F f) {
    device_.require_device_memory(what, {reads, writes});
    auto out = std::make_shared<Outcome>();
    const std::string named = std::string(what) + " on rank " + std::to_string(rank_) + " of " + std::to_string(size_);
    const std::uint64_t id = (reads.bytes || writes.bytes) ? device_.in_flight().start(named, reads, writes) : 0;
    try {
      stream_.enqueue([inner = inner_, f = std::move(f), out] {
        try {
          f(*inner).wait();
        } catch (...) {
          out->error = std::current_exception();
        }
      });
      const bool drop = device_.options().drop == host_async::Drop::work_wait;
      return Work(std::make_unique<StreamWork>(stream_.record(), std::move(out), device_, id, drop));
    } catch (...) {
      device_.in_flight().finish(id);  // nothing was enqueued, or it is waited for by no Work
      throw;
    }
  }

  std::shared_ptr<C> inner_;
  host_async::Device device_;
  host_async::Stream stream_;
  int rank_, size_;
  CommStats stats_;
};

/// Its buffers are the device's memory (HostAsyncSpace), as NCCL's are GPU memory: the engine takes
/// it for Device<HostAsync>, and what needs a host-memory communicator refuses it.
template <class C>
inline constexpr bool uses_device_memory<StreamCommunicator<C>> = true;

}  // namespace zerotk::comm
