#pragma once
/// \file zerotk/comm/nccl.hpp
/// NCCL communicator (target zerotk::nccl): stream-ordered GPU collectives behind the
/// Communicator concept. Buffers are device memory. Host code only: compiles with g++ against
/// nccl.h and the CUDA runtime.
///
///   auto world = zerotk::comm::MpiCommunicator::world();                  // or any Communicator
///   auto gpu = zerotk::comm::NcclCommunicator::bootstrap(world, local_device);
///   gpu.wait_for(compute_stream);                                         // grads are ready there
///   zerotk::comm::Work w = gpu.reduce_scatter(d_grads, d_part, n, DType::bf16, ReduceOp::avg);
///   { auto g = gpu.group(); for (auto& b : buckets) gpu.all_gather(...); }  // one launch
///   gpu.stream_wait(compute_stream);                                      // compute waits on the GPU
///
/// - Every operation is enqueued on the communicator's stream and returns a Work whose wait()
///   blocks the host until it finished; it polls NCCL's asynchronous error and fails with
///   comm_error after the timeout instead of hanging. stream_wait()/wait_for() order other streams
///   without blocking the host.
/// - group() batches launches (ncclGroupStart/End); Works issued inside complete together and may
///   only be waited on after the group closed.
/// - Unique-id bootstrap through any host Communicator (MPI across processes, threads for one GPU
///   per thread in one process) or through a file on a shared filesystem.
/// - NCCL matches send/recv per peer pair in issue order; tags are ignored. max/min NaN handling
///   is NCCL's. Byte counters follow the same conventions as the other back ends.

#include "zerotk/core/macros.hpp"

#if !ZEROTK_HAS_NCCL
#error "zerotk/comm/nccl.hpp needs NCCL: link the CMake target zerotk::nccl (it defines ZEROTK_HAS_NCCL=1), or, in a vendored copy, define ZEROTK_HAS_NCCL=1 and ZEROTK_HAS_CUDA=1 and add the CUDA and NCCL include paths and -lnccl -lcudart"
#endif

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "zerotk/comm/accounting.hpp"
#include "zerotk/comm/communicator.hpp"
#include "zerotk/comm/detail/checks.hpp"
#include "zerotk/comm/timeout.hpp"
#include "zerotk/comm/typed.hpp"
#include "zerotk/core/error.hpp"

namespace zerotk::comm {

class NcclCommunicator;
template <>
inline constexpr bool uses_device_memory<NcclCommunicator> = true;

namespace detail::nccl {

inline std::string where(int rank, int size, int device) {
  return "rank " + std::to_string(rank) + " of " + std::to_string(size) + " (device " + std::to_string(device) + ")";
}

inline void check(ncclResult_t r, const char* call, const std::string& at, ncclComm_t comm = nullptr) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  std::string msg = std::string(call) + " failed: " + ncclGetErrorString(r);
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && *last != '\0') (msg += ": ") += last;
  }
  throw comm_error(msg, at, std::to_string(static_cast<int>(r)));
}

inline void check_cuda(cudaError_t e, const char* call, const std::string& at) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();  // clear it so a later call is not blamed
  throw comm_error(std::string(call) + " failed: " + cudaGetErrorString(e), at, cudaGetErrorName(e));
}

inline ncclDataType_t datatype(DType dt) {
  switch (dt) {
    case DType::fp32: return ncclFloat32;
    case DType::fp16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::fp64: return ncclFloat64;
    case DType::int32: return ncclInt32;
    case DType::uint8: return ncclUint8;
  }
  return ncclFloat32;
}

/// On one rank an average is the identity, and so is a sum; `ncclAvg` there runs NCCL's one-rank
/// scaling kernel, which before NCCL 2.29.7 left the tail of counts not divisible by its block count
/// unwritten (NVIDIA/nccl#1950; seen on an H100 with 2.28.9: the last 3 of 2^20 + 3 elements stayed
/// 0). `ncclSum` on one rank is a copy, bitwise the same average.
inline ncclRedOp_t reduction(ReduceOp op, int nranks) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return nranks == 1 ? ncclSum : ncclAvg;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  return ncclSum;
}

// A CUDA event shared by the Works of one launch (one op, or one group).
struct Event {
  cudaEvent_t event = nullptr;
  bool recorded = false;
  ~Event() {
    if (event != nullptr) cudaEventDestroy(event);
  }
};

// What a communicator and its Works share: the comm handle outlives every Work that polls it.
struct State {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  std::shared_ptr<State> stream_owner;  // a split child keeps its parent's stream alive
  bool owns_stream = false;
  int rank = 0, size = 1, device = 0;
  std::int64_t timeout_ms = 60000;
  int group_depth = 0;
  std::shared_ptr<Event> group_event;  // the event the Works of the open group will share
  void* scratch = nullptr;             // 4 bytes of device memory for barrier()
  std::string unobserved;              // error of a Work destroyed without wait(); the next call throws it

  std::string at() const { return where(rank, size, device); }

  ~State() {
    if (scratch != nullptr) cudaFree(scratch);
    if (comm != nullptr) ncclCommDestroy(comm);
    if (owns_stream && stream != nullptr) cudaStreamDestroy(stream);
  }
};

// Work of one enqueued operation: waits for its event, polling NCCL's asynchronous error.
class NcclWork final : public WorkState {
 public:
  NcclWork(std::shared_ptr<State> s, std::shared_ptr<Event> e, const char* call)
      : s_(std::move(s)), e_(std::move(e)), call_(call) {}

  void wait() override {
    const auto deadline = deadline_after(s_->timeout_ms);
    while (!poll()) {
      if (std::chrono::steady_clock::now() >= deadline) {
        throw comm_error(std::string(call_) + " timed out after " + std::to_string(s_->timeout_ms) +
                             " ms (a rank did not join, or the GPU is stuck); abort the communicator",
                         s_->at());
      }
      std::this_thread::yield();
    }
  }

  bool test() override { return poll(); }

  // Destroyed without wait(): finish, and let the communicator's next call throw a failure.
  void dropped() noexcept override {
    try {
      wait();
    } catch (const std::exception& e) {
      if (s_->unobserved.empty()) s_->unobserved = e.what();
    } catch (...) {
      if (s_->unobserved.empty()) s_->unobserved = "an exception not derived from std::exception";
    }
  }

 private:
  bool poll() {
    if (!e_->recorded) {
      throw usage_error(std::string("wait/test on ") + call_ + " before its group() closed", s_->at());
    }
    const cudaError_t q = cudaEventQuery(e_->event);
    if (q == cudaSuccess) return true;
    if (q != cudaErrorNotReady) check_cuda(q, "cudaEventQuery", s_->at());
    ncclResult_t async = ncclSuccess;
    check(ncclCommGetAsyncError(s_->comm, &async), "ncclCommGetAsyncError", s_->at(), s_->comm);
    check(async, call_, s_->at(), s_->comm);
    return false;
  }

  std::shared_ptr<State> s_;
  std::shared_ptr<Event> e_;
  const char* call_;
};

}  // namespace detail::nccl

/// Options of an NCCL communicator.
struct NcclOptions {
  /// A Work not finished after this many ms raises comm_error (NCCL itself would wait forever).
  std::int64_t timeout_ms = default_timeout_ms();
  /// The stream operations are enqueued on; null: the communicator creates its own.
  cudaStream_t stream = nullptr;
};

/// One rank (one GPU) of an NCCL communicator; models Communicator. Move-only.
class NcclCommunicator {
 public:
  /// Collective over `boot` (any host-memory Communicator: MPI, threads, ...): rank 0 creates the
  /// NCCL unique id and broadcasts it through `boot`; every rank joins with `boot`'s rank and size
  /// on `device`.
  template <Communicator B>
  static NcclCommunicator bootstrap(B& boot, int device, NcclOptions opts = {}) {
    static_assert(!uses_device_memory<B>, "bootstrap through a host-memory communicator (MPI, threads)");
    ncclUniqueId id{};
    const std::string at = detail::nccl::where(boot.rank(), boot.size(), device);
    if (boot.rank() == 0) detail::nccl::check(ncclGetUniqueId(&id), "ncclGetUniqueId", at);
    boot.broadcast(&id, sizeof id, DType::uint8, 0).wait();
    return NcclCommunicator(id, boot.rank(), boot.size(), device, opts);
  }

  /// For processes without a bootstrap communicator: rank 0 writes the unique id to `path` (on a
  /// filesystem every rank sees; a fresh path per job), the others wait for it up to the timeout.
  /// Rank 0 removes the file once every rank joined.
  static NcclCommunicator from_file(const std::string& path, int rank, int size, int device, NcclOptions opts = {}) {
    const std::string at = detail::nccl::where(rank, size, device);
    ncclUniqueId id{};
    if (rank == 0) {
      detail::nccl::check(ncclGetUniqueId(&id), "ncclGetUniqueId", at);
      const std::string tmp = path + ".tmp";
      {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        out.write(id.internal, sizeof id.internal);
        if (!out) throw io_error("cannot write the NCCL unique id", tmp);
      }
      std::error_code ec;
      std::filesystem::rename(tmp, path, ec);  // atomic: readers never see a partial id
      if (ec) throw io_error("cannot publish the NCCL unique id: " + ec.message(), path);
    } else {
      const auto deadline = deadline_after(opts.timeout_ms);
      for (;;) {
        std::ifstream in(path, std::ios::binary);
        if (in.read(id.internal, sizeof id.internal)) break;
        if (std::chrono::steady_clock::now() >= deadline) {
          throw comm_error("timed out after " + std::to_string(opts.timeout_ms) +
                               " ms waiting for rank 0 to write the NCCL unique id",
                           at, path);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    NcclCommunicator c(id, rank, size, device, opts);
    if (rank == 0) {
      std::error_code ec;
      std::filesystem::remove(path, ec);  // every rank read it: ncclCommInitRank returned everywhere
    }
    return c;
  }

  NcclCommunicator(NcclCommunicator&&) noexcept = default;
  NcclCommunicator& operator=(NcclCommunicator&&) noexcept = default;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;
  ~NcclCommunicator() = default;

  int rank() const noexcept { return s_->rank; }
  int size() const noexcept { return s_->size; }
  int device() const noexcept { return s_->device; }
  cudaStream_t stream() const noexcept { return s_->stream; }
  ncclComm_t native() const noexcept { return s_->comm; }

  const CommStats& stats() const noexcept { return stats_; }
  CommStats& stats() noexcept { return stats_; }

  Work all_reduce(const void* send, void* recv, std::size_t count, DType dt, ReduceOp op) {
    detail::check_reduce(OpKind::all_reduce, dt, op, rank(), size());
    check_buffers(OpKind::all_reduce, send, count, recv, count);
    detail::record_ring(stats_, OpKind::all_reduce, count * size_of(dt), size());
    return launch("ncclAllReduce", [&] {
      return ncclAllReduce(send, recv, count, detail::nccl::datatype(dt), detail::nccl::reduction(op, size()), s_->comm,
                           s_->stream);
    });
  }

  /// In place when recv == send + rank()*recv_count.
  Work reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType dt, ReduceOp op) {
    detail::check_reduce(OpKind::reduce_scatter, dt, op, rank(), size());
    check_buffers(OpKind::reduce_scatter, send, total(recv_count), recv, recv_count);
    detail::record_ring(stats_, OpKind::reduce_scatter, total(recv_count) * size_of(dt), size());
    return launch("ncclReduceScatter", [&] {
      return ncclReduceScatter(send, recv, recv_count, detail::nccl::datatype(dt), detail::nccl::reduction(op, size()),
                               s_->comm, s_->stream);
    });
  }

  /// In place when send == recv + rank()*send_count.
  Work all_gather(const void* send, void* recv, std::size_t send_count, DType dt) {
    check_buffers(OpKind::all_gather, send, send_count, recv, total(send_count));
    detail::record_ring(stats_, OpKind::all_gather, total(send_count) * size_of(dt), size());
    return launch("ncclAllGather", [&] {
      return ncclAllGather(send, recv, send_count, detail::nccl::datatype(dt), s_->comm, s_->stream);
    });
  }

  /// One grouped broadcast per rank into its offset of `recv`.
  Work all_gatherv(const void* send, std::size_t send_count, void* recv, std::span<const std::size_t> recv_counts,
                   DType dt) {
    detail::check_counts(recv_counts, send_count, rank(), size());
    std::size_t sum = 0;
    for (std::size_t c : recv_counts) sum += c;
    check_buffers(OpKind::all_gatherv, send, send_count, recv, sum);
    detail::record(stats_, OpKind::all_gatherv, sum * size_of(dt), all_gatherv_wire_bytes(recv_counts, rank(), size_of(dt)));
    const std::size_t eb = size_of(dt);
    return launch("ncclBroadcast (all_gatherv)", [&] {
      ncclResult_t r = ncclGroupStart();
      std::size_t offset = 0;
      for (int s = 0; s < size() && r == ncclSuccess; ++s) {
        const auto n = recv_counts[static_cast<std::size_t>(s)];
        auto* dst = static_cast<std::byte*>(recv) + offset * eb;
        r = ncclBroadcast(s == rank() ? send : dst, dst, n, detail::nccl::datatype(dt), s, s_->comm, s_->stream);
        offset += n;
      }
      const ncclResult_t e = ncclGroupEnd();
      return r != ncclSuccess ? r : e;
    });
  }

  Work broadcast(void* buf, std::size_t count, DType dt, int root) {
    detail::check_peer(OpKind::broadcast, root, "root", rank(), size());
    check_buffers(OpKind::broadcast, buf, count, buf, count);
    detail::record_ring(stats_, OpKind::broadcast, count * size_of(dt), size());
    return launch("ncclBroadcast", [&] {
      return ncclBroadcast(buf, buf, count, detail::nccl::datatype(dt), root, s_->comm, s_->stream);
    });
  }

  Work reduce(const void* send, void* recv, std::size_t count, DType dt, ReduceOp op, int root) {
    detail::check_reduce(OpKind::reduce, dt, op, rank(), size());
    detail::check_peer(OpKind::reduce, root, "root", rank(), size());
    check_buffers(OpKind::reduce, send, count, rank() == root ? recv : send, count);
    detail::record_ring(stats_, OpKind::reduce, count * size_of(dt), size());
    return launch("ncclReduce", [&] {
      return ncclReduce(send, recv, count, detail::nccl::datatype(dt), detail::nccl::reduction(op, size()), root, s_->comm,
                        s_->stream);
    });
  }

  /// Grouped send/recv pairs (works with every NCCL version that has send/recv).
  Work all_to_all(const void* send, void* recv, std::size_t count, DType dt) {
    check_buffers(OpKind::all_to_all, send, total(count), recv, total(count));
    detail::check_not_in_place(OpKind::all_to_all, send, recv, count, rank(), size());
    detail::record_ring(stats_, OpKind::all_to_all, total(count) * size_of(dt), size());
    const std::size_t block = count * size_of(dt);
    return launch("ncclSend/ncclRecv (all_to_all)", [&] {
      ncclResult_t r = ncclGroupStart();
      for (int p = 0; p < size() && r == ncclSuccess; ++p) {
        const auto off = static_cast<std::size_t>(p) * block;
        r = ncclSend(static_cast<const std::byte*>(send) + off, count, detail::nccl::datatype(dt), p, s_->comm,
                     s_->stream);
        if (r == ncclSuccess) {
          r = ncclRecv(static_cast<std::byte*>(recv) + off, count, detail::nccl::datatype(dt), p, s_->comm, s_->stream);
        }
      }
      const ncclResult_t e = ncclGroupEnd();
      return r != ncclSuccess ? r : e;
    });
  }

  /// Variable blocks (see the Communicator concept) as grouped send/recv pairs. The ranks first
  /// agree on the counts in one small all_gather through device scratch (blocking the host; not
  /// inside group()): counts that disagree fail the call on every rank with a comm_error naming the
  /// two ranks, before any data moves.
  Work all_to_all_v(const void* send, std::span<const std::size_t> send_counts, void* recv,
                    std::span<const std::size_t> recv_counts, DType dt) {
    constexpr OpKind k = OpKind::all_to_all_v;
    const auto v = detail::check_v_counts(send_counts, recv_counts, rank(), size());
    check_buffers(k, send, v.sent, recv, v.received);
    detail::check_not_in_place(k, send, recv, v.sent + v.received, rank(), size());
    if (s_->group_depth > 0) {
      throw usage_error("all_to_all_v waits for the count agreement: call it outside group()", s_->at());
    }
    const auto row = detail::v_count_row(send_counts, recv_counts);
    const std::vector<std::uint64_t> rows = gather_host(row);
    if (const auto x = detail::find_count_disagreement(rows, size())) {
      throw comm_error(detail::describe(*x), s_->at(), std::to_string(x->sent) + " vs " + std::to_string(x->expected));
    }
    detail::record(stats_, k, v.sent * size_of(dt), all_to_all_v_wire_bytes(send_counts, rank(), size_of(dt)));
    const std::size_t eb = size_of(dt);
    return launch("ncclSend/ncclRecv (all_to_all_v)", [&] {
      ncclResult_t r = ncclGroupStart();
      std::size_t from = 0, to = 0;
      for (int p = 0; p < size() && r == ncclSuccess; ++p) {
        const auto up = static_cast<std::size_t>(p);
        if (send_counts[up] > 0) {
          r = ncclSend(static_cast<const std::byte*>(send) + from * eb, send_counts[up], detail::nccl::datatype(dt), p,
                       s_->comm, s_->stream);
        }
        if (r == ncclSuccess && recv_counts[up] > 0) {
          r = ncclRecv(static_cast<std::byte*>(recv) + to * eb, recv_counts[up], detail::nccl::datatype(dt), p, s_->comm,
                       s_->stream);
        }
        from += send_counts[up], to += recv_counts[up];
      }
      const ncclResult_t e = ncclGroupEnd();
      return r != ncclSuccess ? r : e;
    });
  }

  /// `tag` is ignored: NCCL matches sends and receives per peer pair in issue order.
  Work send(const void* buf, std::size_t count, DType dt, int peer, int tag) {
    detail::check_peer(OpKind::send, peer, "peer", rank(), size());
    detail::check_tag(OpKind::send, tag, rank(), size());
    check_buffers(OpKind::send, buf, count, buf, count);
    detail::record(stats_, OpKind::send, count * size_of(dt), count * size_of(dt));
    return launch("ncclSend",
                  [&] { return ncclSend(buf, count, detail::nccl::datatype(dt), peer, s_->comm, s_->stream); });
  }

  Work recv(void* buf, std::size_t count, DType dt, int peer, int tag) {
    detail::check_peer(OpKind::recv, peer, "peer", rank(), size());
    detail::check_tag(OpKind::recv, tag, rank(), size());
    check_buffers(OpKind::recv, buf, count, buf, count);
    detail::record(stats_, OpKind::recv, count * size_of(dt), 0);
    return launch("ncclRecv",
                  [&] { return ncclRecv(buf, count, detail::nccl::datatype(dt), peer, s_->comm, s_->stream); });
  }

  /// A one-element all-reduce; Work::wait returns once every rank reached it.
  Work barrier() {
    detail::record(stats_, OpKind::barrier, 0, 0);
    return launch("ncclAllReduce (barrier)", [&] {
      return ncclAllReduce(s_->scratch, s_->scratch, 1, ncclInt32, ncclSum, s_->comm, s_->stream);
    });
  }

  /// Collective: a communicator over the ranks with the same `color` (>= 0), ordered by (key,
  /// rank), on the same device and stream.
  NcclCommunicator split(int color, int key) {
    detail::check_color(color, rank(), size());
    ncclComm_t out = nullptr;
    detail::nccl::check(ncclCommSplit(s_->comm, color, key, &out, nullptr), "ncclCommSplit", s_->at(), s_->comm);
    return NcclCommunicator(out, s_);
  }

  /// Collective: the ranks on this host (by host name), ordered by rank.
  NcclCommunicator split_node_local() {
    const std::vector<int> nodes = node_of_ranks();
    return split(nodes[static_cast<std::size_t>(rank())], rank());
  }

  /// Collective: every rank's node, named by the lowest rank on the same host (by host name). The
  /// topology's node level on NCCL (comm/topology.hpp).
  std::vector<int> node_of_ranks() {
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    const std::uint64_t mine = std::hash<std::string>{}(host);
    const std::vector<std::uint64_t> all = gather_host(std::span<const std::uint64_t>(&mine, 1));
    std::vector<int> nodes(all.size());
    for (std::size_t r = 0; r < all.size(); ++r) {
      int first = 0;
      while (all[static_cast<std::size_t>(first)] != all[r]) ++first;  // the host's first rank names it
      nodes[r] = first;
    }
    return nodes;
  }

  /// RAII batch: operations issued while it lives are launched together when it is destroyed.
  class Group {
   public:
    explicit Group(NcclCommunicator& c) : c_(&c), uncaught_(std::uncaught_exceptions()) { c_->group_begin(); }
    Group(const Group&) = delete;
    Group& operator=(const Group&) = delete;
    /// Closes the group (launches its operations); throws comm_error unless already unwinding.
    ~Group() noexcept(false) {
      if (std::uncaught_exceptions() > uncaught_) {
        try {
          c_->group_end();
        } catch (...) {  // the exception in flight is the one to report
        }
        return;
      }
      c_->group_end();
    }

   private:
    NcclCommunicator* c_;
    int uncaught_;
  };
  [[nodiscard]] Group group() { return Group(*this); }

  /// `other` waits (on the GPU, not the host) for everything enqueued on this communicator so far.
  void stream_wait(cudaStream_t other) { order(s_->stream, other); }
  /// This communicator's later operations wait (on the GPU) for everything enqueued on `producer`.
  void wait_for(cudaStream_t producer) { order(producer, s_->stream); }

 private:
  // Every rank's `mine` (the same length on each), rank after rank, through device scratch: one
  // blocking all_gather (host-side agreement on small values: node names, all_to_all_v's counts).
  std::vector<std::uint64_t> gather_host(std::span<const std::uint64_t> mine) {
    const std::size_t bytes = mine.size() * sizeof(std::uint64_t);
    std::vector<std::uint64_t> all(mine.size() * static_cast<std::size_t>(size()));
    void* d = nullptr;
    detail::nccl::check_cuda(cudaMalloc(&d, all.size() * sizeof(std::uint64_t)), "cudaMalloc", s_->at());
    const std::unique_ptr<void, decltype(&cudaFree)> guard(d, &cudaFree);
    auto* slot = static_cast<std::byte*>(d) + static_cast<std::size_t>(rank()) * bytes;
    detail::nccl::check_cuda(cudaMemcpyAsync(slot, mine.data(), bytes, cudaMemcpyHostToDevice, s_->stream),
                             "cudaMemcpyAsync", s_->at());
    all_gather(slot, d, bytes, DType::uint8).wait();
    detail::nccl::check_cuda(cudaMemcpy(all.data(), d, all.size() * sizeof(std::uint64_t), cudaMemcpyDeviceToHost),
                             "cudaMemcpy", s_->at());
    return all;
  }

  NcclCommunicator(const ncclUniqueId& id, int rank, int size, int device, const NcclOptions& opts)
      : s_(std::make_shared<detail::nccl::State>()) {
    s_->rank = rank;
    s_->size = size;
    s_->device = device;
    s_->timeout_ms = opts.timeout_ms;
    detail::nccl::check_cuda(cudaSetDevice(device), "cudaSetDevice", s_->at());
    if (opts.stream != nullptr) {
      s_->stream = opts.stream;
    } else {
      detail::nccl::check_cuda(cudaStreamCreateWithFlags(&s_->stream, cudaStreamNonBlocking), "cudaStreamCreate",
                               s_->at());
      s_->owns_stream = true;
    }
    detail::nccl::check_cuda(cudaMalloc(&s_->scratch, sizeof(std::int32_t)), "cudaMalloc", s_->at());
    detail::nccl::check(ncclCommInitRank(&s_->comm, size, id, rank), "ncclCommInitRank", s_->at());
  }

  NcclCommunicator(ncclComm_t child, const std::shared_ptr<detail::nccl::State>& parent)
      : s_(std::make_shared<detail::nccl::State>()) {
    s_->comm = child;
    s_->stream = parent->stream;
    s_->stream_owner = parent;
    s_->device = parent->device;
    s_->timeout_ms = parent->timeout_ms;
    detail::nccl::check(ncclCommCount(child, &s_->size), "ncclCommCount", parent->at(), child);
    detail::nccl::check(ncclCommUserRank(child, &s_->rank), "ncclCommUserRank", parent->at(), child);
    detail::nccl::check_cuda(cudaMalloc(&s_->scratch, sizeof(std::int32_t)), "cudaMalloc", s_->at());
  }

  std::uint64_t total(std::size_t block) const noexcept {
    return static_cast<std::uint64_t>(block) * static_cast<std::uint64_t>(size());
  }

  void check_buffers(OpKind k, const void* send, std::size_t in, const void* recv, std::size_t out) const {
    detail::check_buffer(k, send, in, "send", rank(), size());
    detail::check_buffer(k, recv, out, "recv", rank(), size());
  }

  static std::shared_ptr<detail::nccl::Event> new_event(const std::string& at) {
    auto e = std::make_shared<detail::nccl::Event>();
    detail::nccl::check_cuda(cudaEventCreateWithFlags(&e->event, cudaEventDisableTiming), "cudaEventCreate", at);
    return e;
  }

  void record(detail::nccl::Event& e) {
    detail::nccl::check_cuda(cudaEventRecord(e.event, s_->stream), "cudaEventRecord", s_->at());
    e.recorded = true;
  }

  /// Enqueues one operation (`enqueue` returns its ncclResult_t) and returns its Work.
  template <class F>
  Work launch(const char* call, F&& enqueue) {
    if (!s_->unobserved.empty()) {
      const std::string earlier = std::exchange(s_->unobserved, std::string());
      throw comm_error(std::string("an earlier operation failed and its Work was destroyed without wait(): ") + earlier,
                       s_->at(), call);
    }
    detail::nccl::check_cuda(cudaSetDevice(s_->device), "cudaSetDevice", s_->at());
    detail::nccl::check(enqueue(), call, s_->at(), s_->comm);
    std::shared_ptr<detail::nccl::Event> e;
    if (s_->group_depth > 0) {
      e = s_->group_event;  // recorded when the group closes
    } else {
      e = new_event(s_->at());
      record(*e);
    }
    return Work(std::make_unique<detail::nccl::NcclWork>(s_, std::move(e), call));
  }

  void group_begin() {
    detail::nccl::check(ncclGroupStart(), "ncclGroupStart", s_->at(), s_->comm);
    if (s_->group_depth++ == 0) s_->group_event = new_event(s_->at());
  }

  void group_end() {
    const bool outermost = --s_->group_depth == 0;
    detail::nccl::check(ncclGroupEnd(), "ncclGroupEnd", s_->at(), s_->comm);
    if (outermost) {
      record(*s_->group_event);
      s_->group_event.reset();
    }
  }

  void order(cudaStream_t before, cudaStream_t after) {
    const auto e = new_event(s_->at());
    detail::nccl::check_cuda(cudaEventRecord(e->event, before), "cudaEventRecord", s_->at());
    detail::nccl::check_cuda(cudaStreamWaitEvent(after, e->event, 0), "cudaStreamWaitEvent", s_->at());
  }

  std::shared_ptr<detail::nccl::State> s_;
  CommStats stats_;
};

static_assert(Communicator<NcclCommunicator>);

}  // namespace zerotk::comm
