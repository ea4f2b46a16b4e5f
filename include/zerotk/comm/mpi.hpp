#pragma once
/// \file zerotk/comm/mpi.hpp
/// MPI communicator (target zerotk::mpi): nonblocking MPI collectives behind the Communicator
/// concept, for multi-process runs on one machine or many (`mpirun -np N prog`).
///
///   int main(int argc, char** argv) {
///     zerotk::comm::MpiSession mpi(argc, argv);                      // MPI_Init_thread / MPI_Finalize
///     auto world = zerotk::comm::MpiCommunicator::world();           // a private duplicate of MPI_COMM_WORLD
///     world.all_reduce(g, g, n, zerotk::DType::fp32, zerotk::comm::ReduceOp::avg).wait();
///   }
///
/// Guarantees (the threads back end's, across processes):
/// - Mismatched collectives never reach MPI: each call's signature (kind, reduce op, count, dtype,
///   root, sequence number) is checked by one small all-reduce before its data call is issued; a
///   mismatch is a comm_error on every rank naming two ranks and their calls.
/// - No wait blocks forever: Work::wait polls with a deadline (`timeout_ms`, default
///   ZEROTK_COMM_TIMEOUT_MS or 60 s) and then fails with a comm_error naming the operation, its
///   sequence number and the ranks that have not called it, with what each peer is doing (asked
///   over a control communicator; a rank that finalized, is stopped or is dead is named as such).
/// - MPI errors are returned, never fatal: MPI_ERRORS_RETURN on every zerotk communicator and on
///   MPI_COMM_WORLD/MPI_COMM_SELF (Open MPI 4.1 reports errors of nonblocking collectives through
///   MPI_COMM_WORLD's handler); they become comm_error. Argument errors are usage_error, before
///   anything is started.
/// - After an error the communicator refuses further calls. A rank leaving with an exception in
///   flight, or with MPI requests an error left behind, aborts the job from ~MpiSession with a
///   message instead of hanging in MPI_Finalize (the only place the library ends a process).
/// - fp16/bf16 travel as 2-byte elements and reduce with user-defined ops (fp32 arithmetic, rounded
///   after each pairwise combine, in the order MPI chooses); fp32/fp64 max/min use user-defined ops
///   so NaN propagates as in the threads back end. avg = MPI sum, then divided by W on each rank.
///   With values whose sums are exact (e.g. small integers) results equal the threads back end's.
/// - Counts are limited to INT_MAX elements per call (MPI 3 int counts).
/// - One thread at a time calls into a communicator (MPI_THREAD_SERIALIZED is enough).

#include "zerotk/core/macros.hpp"

#if !ZEROTK_HAS_MPI
#error "zerotk/comm/mpi.hpp needs MPI: link the CMake target zerotk::mpi (it defines ZEROTK_HAS_MPI=1), or, in a vendored copy, define ZEROTK_HAS_MPI=1 and compile with mpicxx (or add MPI's include path and libmpi)"
#endif

// zerotk uses the C API only; the deprecated C++ bindings' header does not compile warning-free.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zerotk/comm/accounting.hpp"
#include "zerotk/comm/communicator.hpp"
#include "zerotk/comm/detail/checks.hpp"
#include "zerotk/comm/detail/mpi_engine.hpp"
#include "zerotk/comm/timeout.hpp"
#include "zerotk/comm/topology.hpp"
#include "zerotk/core/error.hpp"

namespace zerotk::comm {

/// RAII for MPI_Init_thread / MPI_Finalize, and the end of the job when a rank leaves badly.
/// Construct it on every rank (it is collective: it opens zerotk's control communicator). If MPI
/// is already initialized it does not initialize or finalize it.
///
/// The destructor of the session that initialized MPI, with more than one process:
/// - while an exception propagates (the rank is leaving, its peers may wait for it in a collective,
///   and MPI_Finalize would hang): prints why on stderr and calls MPI_Abort;
/// - after an error left MPI requests behind (a timeout; MPI_Finalize would wait for them): the same;
/// - after a failed operation whose Work was destroyed without wait() and whose error never reached
///   the program: the same (with any number of processes), so the job does not end with status 0;
/// - otherwise waits for every rank in a barrier that tells peers still waiting on this rank that
///   it left, then MPI_Finalize.
class MpiSession {
 public:
  enum class Threading : int {
    single = MPI_THREAD_SINGLE,
    funneled = MPI_THREAD_FUNNELED,
    serialized = MPI_THREAD_SERIALIZED,
    multiple = MPI_THREAD_MULTIPLE
  };

  explicit MpiSession(Threading required = Threading::serialized) : MpiSession(nullptr, nullptr, required) {}
  MpiSession(int& argc, char**& argv, Threading required = Threading::serialized)
      : MpiSession(&argc, &argv, required) {}
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  ~MpiSession() {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!owns_ || fin) return;
    auto& p = detail::mpi::Process::get();
    const bool unwinding = std::uncaught_exceptions() > uncaught_at_start_;
    if (p.world_size > 1 && unwinding) {
      std::string why =
          "it is leaving with an exception in flight (its MpiSession is destroyed during unwinding), so its peers "
          "could wait for it forever";
      why += p.last_error.empty() ? "; no zerotk comm error was raised on this rank"
                                  : "; last zerotk comm error on this rank: " + p.last_error;
      detail::mpi::abort_job(why);
    }
    if (p.world_size > 1 && !p.unsafe.empty()) {
      detail::mpi::abort_job("an earlier error left MPI operations unfinished, so MPI_Finalize would wait for them: " +
                             p.unsafe);
    }
    if (const std::string e = first_unobserved(p); !e.empty()) {
      detail::mpi::abort_job("an operation failed, its Work was destroyed without wait(), and the error never reached "
                             "the program: " + e);
    }
    detail::mpi::finalize_barrier(p);
    MPI_Finalize();
  }

  /// Prints `reason` on stderr and aborts every process of the job (MPI_Abort), e.g. from a
  /// catch block that cannot let this rank return while its peers wait for it.
  [[noreturn]] static void abort(std::string_view reason) {
    detail::mpi::abort_job(std::string(reason));
    throw comm_error("MPI_Abort returned", "MpiSession::abort");  // MPI_Abort does not return
  }

  /// The thread support MPI provides (may be less than requested; check it if threads call MPI).
  Threading provided() const noexcept { return provided_; }
  /// True when this object initialized MPI (and will finalize it).
  bool owns() const noexcept { return owns_; }

 private:
  MpiSession(int* argc, char*** argv, Threading required) {
    int init = 0;
    MPI_Initialized(&init);
    int provided = 0;
    if (init) {
      MPI_Query_thread(&provided);
    } else {
      const int rc = MPI_Init_thread(argc, argv, static_cast<int>(required), &provided);
      if (rc != MPI_SUCCESS) throw comm_error("MPI_Init_thread failed: " + detail::mpi::error_text(rc), "MpiSession");
      owns_ = true;
    }
    provided_ = static_cast<Threading>(provided);
    detail::mpi::open_control();
  }

  static std::string first_unobserved(detail::mpi::Process& p) {
    std::lock_guard lk(p.mu);
    for (const auto* c : p.live) {
      if (!c->unobserved.empty()) return c->unobserved;
    }
    return p.unobserved.empty() ? std::string() : p.unobserved.front();
  }

  bool owns_ = false;
  Threading provided_ = Threading::single;
  int uncaught_at_start_ = std::uncaught_exceptions();
};

/// Options of an MPI communicator.
struct MpiOptions {
  /// A wait longer than this fails with a comm_error naming the ranks that have not called the
  /// operation. INT64_MAX: never.
  std::int64_t timeout_ms = default_timeout_ms();
};

/// One rank of an MPI communicator; models Communicator. Owns its MPI communicators (a duplicate
/// or a split for the data, one more duplicate for signatures), freed when the communicator and
/// every Work of it are gone. Move-only.
class MpiCommunicator {
 public:
  /// A duplicate of MPI_COMM_WORLD named "world" (collective over all processes): zerotk's traffic
  /// stays apart from the application's own MPI calls. Opens the control communicator if no
  /// MpiSession did.
  static MpiCommunicator world(MpiOptions opts = {}) {
    detail::mpi::require_initialized("MpiCommunicator::world");
    detail::mpi::open_control();
    return duplicate(MPI_COMM_WORLD, "world", opts);
  }

  /// A duplicate of `comm` (collective over `comm`), named "dup".
  static MpiCommunicator duplicate(MPI_Comm comm, MpiOptions opts = {}) { return duplicate(comm, "dup", opts); }

  MpiCommunicator(MpiCommunicator&&) noexcept = default;
  MpiCommunicator& operator=(MpiCommunicator&&) noexcept = default;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;
  ~MpiCommunicator() = default;

  int rank() const noexcept { return s_->rank; }
  int size() const noexcept { return s_->size; }
  /// The communicator zerotk's data calls use, for the application's own MPI calls: wait for
  /// zerotk's operations on it first (their data calls go out only once every rank called them).
  MPI_Comm native() const noexcept { return s_->data; }
  /// "world", "world/split(color 1)", ...: how the group was made, as error messages name it.
  const std::string& name() const noexcept { return s_->name; }
  /// Timeout of waits from now on (MpiOptions::timeout_ms unless changed).
  std::int64_t timeout_ms() const noexcept { return s_->timeout_ms; }
  /// Changes the timeout of this rank's waits on this communicator; splits inherit it.
  void set_timeout_ms(std::int64_t ms) {
    if (ms <= 0) throw usage_error("timeout_ms must be > 0", "MpiCommunicator::set_timeout_ms", std::to_string(ms));
    s_->timeout_ms = ms;
  }

  const CommStats& stats() const noexcept { return stats_; }
  CommStats& stats() noexcept { return stats_; }

  Work all_reduce(const void* send, void* recv, std::size_t count, DType dt, ReduceOp op) {
    constexpr OpKind k = OpKind::all_reduce;
    detail::check_reduce(k, dt, op, rank(), size());
    detail::check_buffer(k, send, count, "send", rank(), size());
    detail::check_buffer(k, recv, count, "recv", rank(), size());
    detail::mpi::DataCall d;
    d.send = send == recv ? MPI_IN_PLACE : send;
    d.recv = recv;
    d.n = detail::mpi::to_int(count, k, rank(), size());
    d.type = detail::mpi::datatype(dt);
    d.op = detail::mpi::reduction(dt, op);
    return post(detail::mpi::make_signature(k, count, dt, op, -1), "MPI_Iallreduce", std::move(d),
                avg_after(op, recv, count, dt), count * size_of(dt));
  }

  /// `send` holds size() blocks of `recv_count`. In place when recv == send + rank()*recv_count
  /// (the other blocks of `send` are unspecified afterwards).
  Work reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType dt, ReduceOp op) {
    constexpr OpKind k = OpKind::reduce_scatter;
    detail::check_reduce(k, dt, op, rank(), size());
    const std::size_t total = recv_count * static_cast<std::size_t>(size());
    detail::check_buffer(k, send, total, "send", rank(), size());
    detail::check_buffer(k, recv, recv_count, "recv", rank(), size());
    detail::mpi::DataCall d;
    d.n = detail::mpi::to_int(recv_count, k, rank(), size());
    detail::mpi::to_int(total, k, rank(), size());
    d.type = detail::mpi::datatype(dt);
    d.op = detail::mpi::reduction(dt, op);
    const std::size_t block_bytes = recv_count * size_of(dt);
    const bool in_place = recv_count > 0 && static_cast<const std::byte*>(send) +
                                                    static_cast<std::size_t>(rank()) * block_bytes ==
                                                static_cast<const std::byte*>(recv);
    auto after = avg_after(op, recv, recv_count, dt);
    if (in_place) {
      // MPI_IN_PLACE takes the input from recvbuf (the whole flat buffer) and leaves this rank's
      // result at its start; move it to this rank's block afterwards.
      void* flat = const_cast<void*>(send);
      d.send = MPI_IN_PLACE;
      d.recv = flat;
      after.move_to = recv;
      after.move_from = flat;
      after.move_bytes = block_bytes;
    } else {
      d.send = send;
      d.recv = recv;
    }
    return post(detail::mpi::make_signature(k, recv_count, dt, op, -1), "MPI_Ireduce_scatter_block", std::move(d),
                after, total * size_of(dt));
  }

  /// In place when send == recv + rank()*send_count.
  Work all_gather(const void* send, void* recv, std::size_t send_count, DType dt) {
    constexpr OpKind k = OpKind::all_gather;
    const std::size_t total = send_count * static_cast<std::size_t>(size());
    detail::check_buffer(k, send, send_count, "send", rank(), size());
    detail::check_buffer(k, recv, total, "recv", rank(), size());
    detail::mpi::DataCall d;
    d.n = detail::mpi::to_int(send_count, k, rank(), size());
    detail::mpi::to_int(total, k, rank(), size());
    const bool in_place = static_cast<const std::byte*>(recv) +
                              static_cast<std::size_t>(rank()) * send_count * size_of(dt) ==
                          static_cast<const std::byte*>(send);
    d.send = in_place ? MPI_IN_PLACE : send;
    d.recv = recv;
    d.type = detail::mpi::datatype(dt);
    return post(detail::mpi::make_signature(k, send_count, dt, ReduceOp::sum, -1), "MPI_Iallgather", std::move(d),
                {}, total * size_of(dt));
  }

  Work all_gatherv(const void* send, std::size_t send_count, void* recv, std::span<const std::size_t> recv_counts,
                   DType dt) {
    constexpr OpKind k = OpKind::all_gatherv;
    detail::check_counts(recv_counts, send_count, rank(), size());
    detail::mpi::DataCall d;
    d.counts.resize(recv_counts.size());
    d.displs.resize(recv_counts.size());
    std::size_t total = 0;
    for (std::size_t r = 0; r < recv_counts.size(); ++r) {
      d.counts[r] = detail::mpi::to_int(recv_counts[r], k, rank(), size());
      d.displs[r] = detail::mpi::to_int(total, k, rank(), size());
      total += recv_counts[r];
    }
    detail::check_buffer(k, send, send_count, "send", rank(), size());
    detail::check_buffer(k, recv, total, "recv", rank(), size());
    const auto ur = static_cast<std::size_t>(rank());
    const bool in_place = static_cast<const std::byte*>(recv) + static_cast<std::size_t>(d.displs[ur]) * size_of(dt) ==
                          static_cast<const std::byte*>(send);
    d.send = in_place ? MPI_IN_PLACE : send;
    d.recv = recv;
    d.n = d.counts[ur];
    d.type = detail::mpi::datatype(dt);
    auto sig = detail::mpi::make_signature(k, total, dt, ReduceOp::sum, -1);
    sig.counts_hash = detail::mpi::hash_counts(recv_counts);
    const std::uint64_t wire = all_gatherv_wire_bytes(recv_counts, rank(), size_of(dt));
    return post(sig, "MPI_Iallgatherv", std::move(d), {}, total * size_of(dt), wire);
  }

  Work broadcast(void* buf, std::size_t count, DType dt, int root) {
    constexpr OpKind k = OpKind::broadcast;
    detail::check_peer(k, root, "root", rank(), size());
    detail::check_buffer(k, buf, count, "buf", rank(), size());
    detail::mpi::DataCall d;
    d.recv = buf;
    d.n = detail::mpi::to_int(count, k, rank(), size());
    d.type = detail::mpi::datatype(dt);
    d.root = root;
    return post(detail::mpi::make_signature(k, count, dt, ReduceOp::sum, root), "MPI_Ibcast", std::move(d), {},
                count * size_of(dt));
  }

  /// `recv` is only used on `root` (may be null elsewhere); in place at the root when send == recv.
  Work reduce(const void* send, void* recv, std::size_t count, DType dt, ReduceOp op, int root) {
    constexpr OpKind k = OpKind::reduce;
    detail::check_reduce(k, dt, op, rank(), size());
    detail::check_peer(k, root, "root", rank(), size());
    detail::check_buffer(k, send, count, "send", rank(), size());
    if (rank() == root) detail::check_buffer(k, recv, count, "recv", rank(), size());
    detail::mpi::DataCall d;
    d.n = detail::mpi::to_int(count, k, rank(), size());
    d.type = detail::mpi::datatype(dt);
    d.op = detail::mpi::reduction(dt, op);
    d.root = root;
    d.send = rank() == root && send == recv ? MPI_IN_PLACE : send;
    d.recv = recv;
    return post(detail::mpi::make_signature(k, count, dt, op, root), "MPI_Ireduce", std::move(d),
                rank() == root ? avg_after(op, recv, count, dt) : detail::mpi::After{}, count * size_of(dt));
  }

  Work all_to_all(const void* send, void* recv, std::size_t count, DType dt) {
    constexpr OpKind k = OpKind::all_to_all;
    const std::size_t total = count * static_cast<std::size_t>(size());
    detail::check_buffer(k, send, total, "send", rank(), size());
    detail::check_buffer(k, recv, total, "recv", rank(), size());
    detail::check_not_in_place(k, send, recv, count, rank(), size());
    detail::mpi::DataCall d;
    d.n = detail::mpi::to_int(count, k, rank(), size());
    d.send = send;
    d.recv = recv;
    d.type = detail::mpi::datatype(dt);
    return post(detail::mpi::make_signature(k, count, dt, ReduceOp::sum, -1), "MPI_Ialltoall", std::move(d), {},
                total * size_of(dt));
  }

  /// Variable blocks (see the Communicator concept). Before the data call the ranks agree on the
  /// counts in one small all_gather (2 x size() 8-byte counts per rank, blocking, counted under
  /// all_gather): counts that disagree fail the call on every rank with a comm_error naming the
  /// two ranks, and MPI never sees them. The data call (MPI_Ialltoallv) is asynchronous.
  Work all_to_all_v(const void* send, std::span<const std::size_t> send_counts, void* recv,
                    std::span<const std::size_t> recv_counts, DType dt) {
    constexpr OpKind k = OpKind::all_to_all_v;
    const auto v = detail::check_v_counts(send_counts, recv_counts, rank(), size());
    detail::check_buffer(k, send, v.sent, "send", rank(), size());
    detail::check_buffer(k, recv, v.received, "recv", rank(), size());
    detail::check_not_in_place(k, send, recv, v.sent + v.received, rank(), size());
    detail::mpi::DataCall d;
    const auto w = static_cast<std::size_t>(size());
    d.send_counts.resize(w), d.send_displs.resize(w), d.counts.resize(w), d.displs.resize(w);
    std::size_t sent = 0, received = 0;
    for (std::size_t r = 0; r < w; ++r) {
      d.send_counts[r] = detail::mpi::to_int(send_counts[r], k, rank(), size());
      d.send_displs[r] = detail::mpi::to_int(sent, k, rank(), size());
      d.counts[r] = detail::mpi::to_int(recv_counts[r], k, rank(), size());
      d.displs[r] = detail::mpi::to_int(received, k, rank(), size());
      sent += send_counts[r], received += recv_counts[r];
    }
    d.send = send;
    d.recv = recv;
    d.type = detail::mpi::datatype(dt);
    const auto row = detail::v_count_row(send_counts, recv_counts);
    std::vector<std::uint64_t> rows(row.size() * w);
    all_gather(row.data(), rows.data(), row.size() * sizeof(std::uint64_t), DType::uint8).wait();
    if (const auto x = detail::find_count_disagreement(rows, size())) {
      s_->broken = detail::mpi::ErrorInfo{detail::describe(*x) + " (on " + s_->name + ")",
                                          s_->where({x->sender, x->receiver}),
                                          std::to_string(x->sent) + " vs " + std::to_string(x->expected)};
      detail::mpi::raise_error(*s_, *s_->broken);
    }
    auto sig = detail::mpi::make_signature(k, 0, dt, ReduceOp::sum, -1);
    const std::vector<std::size_t> all(rows.begin(), rows.end());
    sig.counts_hash = detail::mpi::hash_counts(all);
    return post(sig, "MPI_Ialltoallv", std::move(d), {}, v.sent * size_of(dt),
                all_to_all_v_wire_bytes(send_counts, rank(), size_of(dt)));
  }

  /// Point-to-point operations are not signature-checked (MPI matches them by source and tag);
  /// the receive checks the message's element count; both wait with the deadline.
  Work send(const void* buf, std::size_t count, DType dt, int peer, int tag) {
    constexpr OpKind k = OpKind::send;
    detail::check_peer(k, peer, "peer", rank(), size());
    detail::check_tag(k, tag, rank(), size());
    detail::check_buffer(k, buf, count, "buf", rank(), size());
    const int n = detail::mpi::to_int(count, k, rank(), size());
    detail::mpi::ensure_usable(*s_);
    detail::record(stats_, k, count * size_of(dt), count * size_of(dt));
    MPI_Request req = MPI_REQUEST_NULL;
    check(MPI_Isend(buf, n, detail::mpi::datatype(dt), peer, tag, s_->data, &req), "MPI_Isend");
    return Work(std::make_unique<detail::mpi::P2pWork>(s_, req, true, peer, tag, count, dt));
  }

  /// The message must have exactly `count` elements (a longer one is an MPI truncation error).
  Work recv(void* buf, std::size_t count, DType dt, int peer, int tag) {
    constexpr OpKind k = OpKind::recv;
    detail::check_peer(k, peer, "peer", rank(), size());
    detail::check_tag(k, tag, rank(), size());
    detail::check_buffer(k, buf, count, "buf", rank(), size());
    const int n = detail::mpi::to_int(count, k, rank(), size());
    detail::mpi::ensure_usable(*s_);
    detail::record(stats_, k, count * size_of(dt), 0);
    MPI_Request req = MPI_REQUEST_NULL;
    check(MPI_Irecv(buf, n, detail::mpi::datatype(dt), peer, tag, s_->data, &req), "MPI_Irecv");
    return Work(std::make_unique<detail::mpi::P2pWork>(s_, req, false, peer, tag, count, dt));
  }

  Work barrier() {
    return post(detail::mpi::make_signature(OpKind::barrier, 0, DType::uint8, ReduceOp::sum, -1), "MPI_Ibarrier", {},
                {}, 0, 0);
  }

  /// Collective: a communicator over the ranks with the same `color` (>= 0), ordered by (key, rank).
  /// `label` names the new group in error messages under this one's name ("world/tensor[data 1,
  /// pipeline 0]"; ProcessGrid names its groups by role); every rank of a color passes the same one.
  /// Without it the group is "<this name>/split(color N)".
  MpiCommunicator split(int color, int key, std::string label = {}) {
    detail::check_color(color, rank(), size());
    detail::mpi::Signature sig;
    sig.kind = detail::mpi::kSplitKind;
    sig.color = color;
    sig.key = key;
    wait_verified(sig);
    MPI_Comm out = MPI_COMM_NULL;
    check(MPI_Comm_split(s_->data, color, key, &out), "MPI_Comm_split");
    return MpiCommunicator(
        out, detail::split_group_name(s_->name, color, std::move(label)), s_->timeout_ms);
  }

  /// Collective: the ranks that share memory with this one (one node), ordered by rank.
  MpiCommunicator split_node_local() {
    detail::mpi::Signature sig;
    sig.kind = detail::mpi::kSplitNodeKind;
    wait_verified(sig);
    MPI_Comm out = MPI_COMM_NULL;
    check(MPI_Comm_split_type(s_->data, MPI_COMM_TYPE_SHARED, rank(), MPI_INFO_NULL, &out), "MPI_Comm_split_type");
    return MpiCommunicator(out, s_->name + "/node", s_->timeout_ms);
  }

  /// Collective: the ranks in this rank's socket or NUMA domain, ordered by rank (Open MPI's
  /// OMPI_COMM_TYPE_SOCKET / OMPI_COMM_TYPE_NUMA, from the process binding hwloc sees). With another
  /// MPI library, or when Open MPI cannot place some rank in one domain (an unbound process), every
  /// rank gets a config_error naming communication.topology: declare ranks_per_socket instead.
  MpiCommunicator split_domain_local(InnerDomain d) {
    detail::mpi::Signature sig;
    sig.kind = detail::mpi::kSplitDomainKind;
    sig.color = static_cast<int>(d);
    wait_verified(sig);
    const std::string what = std::string(to_string(d)) + " split";
#if defined(OPEN_MPI) && OPEN_MPI
    MPI_Comm out = MPI_COMM_NULL;
    const int type = d == InnerDomain::socket ? OMPI_COMM_TYPE_SOCKET : OMPI_COMM_TYPE_NUMA;
    check(MPI_Comm_split_type(s_->data, type, rank(), MPI_INFO_NULL, &out), "MPI_Comm_split_type");
    const std::int32_t placed = out != MPI_COMM_NULL ? 1 : 0;
    std::int32_t all_placed = 0;
    all_reduce(&placed, &all_placed, 1, DType::int32, ReduceOp::min).wait();
    if (all_placed == 1) return MpiCommunicator(out, s_->name + "/" + std::string(to_string(d)), s_->timeout_ms);
    if (out != MPI_COMM_NULL) MPI_Comm_free(&out);
    throw config_error("Open MPI could not place every rank in one " + std::string(to_string(d)) +
                           " (bind the processes, e.g. mpiexec --bind-to " + std::string(to_string(d)) +
                           ", or declare ranks_per_socket)",
                       std::string(TopologyOptions::kKey), what);
#else
    throw config_error("detecting sockets or NUMA domains needs Open MPI's split types (this MPI library has none); "
                       "declare ranks_per_socket or socket_of_rank",
                       std::string(TopologyOptions::kKey), what);
#endif
  }

 private:
  MpiCommunicator(MPI_Comm owned, std::string name, std::int64_t timeout_ms)
      : s_(detail::mpi::make_state(owned, std::move(name), timeout_ms)) {}

  static MpiCommunicator duplicate(MPI_Comm comm, const char* name, const MpiOptions& opts) {
    detail::mpi::require_initialized("MpiCommunicator::duplicate");
    if (opts.timeout_ms <= 0) {
      throw usage_error("timeout_ms must be > 0", "zerotk::comm::MpiOptions", std::to_string(opts.timeout_ms));
    }
    detail::mpi::errors_return_everywhere();
    MPI_Comm dup = MPI_COMM_NULL;
    int rank = 0, size = 0;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    const int rc = MPI_Comm_dup(comm, &dup);
    if (rc != MPI_SUCCESS) {
      throw comm_error("MPI_Comm_dup failed: " + detail::mpi::error_text(rc),
                       "rank " + std::to_string(rank) + " of " + std::to_string(size));
    }
    return MpiCommunicator(dup, name, opts.timeout_ms);
  }

  // Byte counters count at issue time, like every back end, for the call this rank made.
  Work post(detail::mpi::Signature sig, const char* call, detail::mpi::DataCall d, detail::mpi::After after,
            std::uint64_t payload, std::uint64_t wire = ~std::uint64_t{0}) {
    const auto k = static_cast<OpKind>(sig.kind);
    auto op = detail::mpi::post(*s_, sig, call, std::move(d), after);
    if (wire == ~std::uint64_t{0}) {
      detail::record_ring(stats_, k, payload, size());
    } else {
      detail::record(stats_, k, payload, wire);
    }
    return Work(std::make_unique<detail::mpi::CollectiveWork>(s_, std::move(op)));
  }

  // Posts a call without data (split) and waits until every rank is known to have made it.
  void wait_verified(const detail::mpi::Signature& sig) {
    auto op = detail::mpi::post(*s_, sig, "MPI_Comm_split", {}, {});
    detail::mpi::CollectiveWork(s_, std::move(op)).wait();
  }

  void check(int code, const char* call) {
    if (code == MPI_SUCCESS) return;
    s_->broken = detail::mpi::mpi_error(*s_, code, call);
    detail::mpi::raise_error(*s_, *s_->broken);
  }

  detail::mpi::After avg_after(ReduceOp op, void* buf, std::size_t count, DType dt) const {
    detail::mpi::After a;
    if (op == ReduceOp::avg) {
      a.divide = buf;
      a.count = count;
      a.dtype = dt;
      a.divisor = size();
    }
    return a;
  }

  std::shared_ptr<detail::mpi::CommState> s_;
  CommStats stats_;
};

static_assert(Communicator<MpiCommunicator>);

}  // namespace zerotk::comm
