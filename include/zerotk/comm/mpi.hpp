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
/// - Every operation is an MPI_I* call; several may be in flight; Work::wait is MPI_Wait.
/// - Communicators carry MPI_ERRORS_RETURN: MPI errors become comm_error (never an abort where MPI
///   can report them). Argument errors are usage_error, before anything is started.
/// - fp16/bf16 travel as 2-byte elements and reduce with user-defined ops (fp32 arithmetic, rounded
///   after each pairwise combine, in the order MPI chooses); fp32/fp64 max/min use user-defined ops
///   so NaN propagates as in the threads back end. avg = MPI sum, then divided by W on each rank.
///   With values whose sums are exact (e.g. small integers) results equal the threads back end's.
/// - Mismatched collectives are not detected (MPI may hang or fail); the threads back end finds them.
/// - Counts are limited to INT_MAX elements per call (MPI 3 int counts).

#include "zerotk/core/macros.hpp"

#if !ZEROTK_HAS_MPI
#error "zerotk/comm/mpi.hpp needs MPI: link the CMake target zerotk::mpi (it defines ZEROTK_HAS_MPI=1)"
#endif

// zerotk uses the C API only; the deprecated C++ bindings' header does not compile warning-free.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "zerotk/comm/accounting.hpp"
#include "zerotk/comm/communicator.hpp"
#include "zerotk/comm/detail/checks.hpp"
#include "zerotk/comm/detail/reduce.hpp"
#include "zerotk/core/error.hpp"

namespace zerotk::comm {

namespace detail::mpi {

inline std::string error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(len));
}

inline std::string where(int rank, int size) { return "rank " + std::to_string(rank) + " of " + std::to_string(size); }

// Throws comm_error for an MPI return code other than MPI_SUCCESS.
inline void check(int code, const char* call, int rank, int size) {
  if (code == MPI_SUCCESS) return;
  int cls = code;
  MPI_Error_class(code, &cls);
  throw comm_error(std::string(call) + " failed: " + error_text(code), where(rank, size),
                   "error class " + std::to_string(cls));
}

inline void require_initialized(const char* what) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin) {
    throw usage_error("MPI is not initialized (create a zerotk::comm::MpiSession or call MPI_Init_thread first)", what);
  }
}

// int count for an MPI call, or usage_error.
inline int to_int(std::size_t n, OpKind kind, int rank, int size) {
  if (n > static_cast<std::size_t>(INT_MAX)) {
    throw usage_error("more than INT_MAX elements in one MPI call; split the buffer", op_site(kind, rank, size),
                      std::to_string(n));
  }
  return static_cast<int>(n);
}

inline MPI_Datatype datatype(DType dt) {
  switch (dt) {
    case DType::fp32: return MPI_FLOAT;
    case DType::fp64: return MPI_DOUBLE;
    case DType::fp16:
    case DType::bf16: return MPI_UINT16_T;  // reduced only through the user-defined ops below
    case DType::int32: return MPI_INT32_T;
    case DType::uint8: return MPI_UINT8_T;
  }
  return MPI_DATATYPE_NULL;
}

template <class T, ReduceOp Op>
void user_op(void* in, void* inout, int* len, MPI_Datatype*) {
  combine_into<T, Op>(in, inout, static_cast<std::size_t>(*len));
}

// The user-defined MPI ops, created on first use and freed at MPI_Finalize (through an attribute
// on MPI_COMM_SELF, whose delete callback MPI runs first thing in MPI_Finalize).
struct UserOps {
  // [fp16, bf16, fp32, fp64][sum, max, min]; fp32/fp64 sum use MPI_SUM
  MPI_Op ops[4][3] = {};

  UserOps() {
    create<half>(0);
    create<bfloat16>(1);
    create<float>(2);
    create<double>(3);
    int keyval = MPI_KEYVAL_INVALID;
    MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &free_at_finalize, &keyval, nullptr);
    MPI_Comm_set_attr(MPI_COMM_SELF, keyval, this);
  }

  template <class T>
  void create(int row) {
    MPI_Op_create(&user_op<T, ReduceOp::sum>, 1, &ops[row][0]);
    MPI_Op_create(&user_op<T, ReduceOp::max>, 1, &ops[row][1]);
    MPI_Op_create(&user_op<T, ReduceOp::min>, 1, &ops[row][2]);
  }

  static int free_at_finalize(MPI_Comm, int, void* self, void*) {
    auto* u = static_cast<UserOps*>(self);
    for (auto& row : u->ops) {
      for (auto& op : row) {
        if (op != MPI_OP_NULL) MPI_Op_free(&op);
      }
    }
    return MPI_SUCCESS;
  }

  static UserOps& get() {
    static UserOps u;  // thread-safe initialization; MPI must be initialized by then
    return u;
  }
};

// The MPI op computing `op` on `dt` (avg: the sum; the caller divides afterwards).
inline MPI_Op reduction(DType dt, ReduceOp op) {
  const int col = op == ReduceOp::max ? 1 : (op == ReduceOp::min ? 2 : 0);
  switch (dt) {
    case DType::fp16: return UserOps::get().ops[0][col];
    case DType::bf16: return UserOps::get().ops[1][col];
    case DType::fp32: return col == 0 ? MPI_SUM : UserOps::get().ops[2][col];
    case DType::fp64: return col == 0 ? MPI_SUM : UserOps::get().ops[3][col];
    case DType::int32:
    case DType::uint8: return col == 0 ? MPI_SUM : (col == 1 ? MPI_MAX : MPI_MIN);
  }
  return MPI_OP_NULL;
}

// Work handle of one MPI request, plus what must happen on this rank once it completed.
class MpiWork final : public WorkState {
 public:
  struct After {
    void* divide = nullptr;  // avg: divide these `count` elements by `divisor`
    int divisor = 1;
    std::size_t count = 0;
    DType dtype = DType::fp32;
    void* move_to = nullptr;  // in-place reduce-scatter: the block MPI left at `move_from`
    const void* move_from = nullptr;
    std::size_t move_bytes = 0;
    int expect_recv = -1;  // recv: elements the sender must have sent
  };

  MpiWork(MPI_Request req, const char* call, int rank, int size, After after)
      : req_(req), call_(call), rank_(rank), size_(size), after_(after) {}

  // all_gatherv: the count/displacement arrays must live as long as the request.
  std::vector<int> counts, displs;

  void wait() override {
    if (done_) return;
    MPI_Status st;
    check(MPI_Wait(&req_, &st), call_, rank_, size_);
    finish(st);
  }

  bool test() override {
    if (done_) return true;
    int flag = 0;
    MPI_Status st;
    check(MPI_Test(&req_, &flag, &st), call_, rank_, size_);
    if (flag) finish(st);
    return flag != 0;
  }

 private:
  void finish(const MPI_Status& st) {
    done_ = true;
    if (after_.expect_recv >= 0) {
      int got = 0;
      MPI_Get_count(&st, datatype(after_.dtype), &got);
      if (got != after_.expect_recv) {
        throw comm_error("mismatched send/recv: the message from rank " + std::to_string(st.MPI_SOURCE) + " has " +
                             std::to_string(got) + " elements, the receive expected " +
                             std::to_string(after_.expect_recv),
                         where(rank_, size_), std::to_string(got));
      }
    }
    if (after_.move_to != nullptr && after_.move_to != after_.move_from) {
      std::memmove(after_.move_to, after_.move_from, after_.move_bytes);
    }
    if (after_.divide != nullptr) divide_in_place(after_.divide, after_.count, after_.dtype, after_.divisor);
  }

  MPI_Request req_;
  const char* call_;
  int rank_, size_;
  After after_;
  bool done_ = false;
};

}  // namespace detail::mpi

/// RAII for MPI_Init_thread / MPI_Finalize. If MPI is already initialized it does nothing (and
/// does not finalize).
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
    if (owns_ && !fin) MPI_Finalize();
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
  }

  bool owns_ = false;
  Threading provided_ = Threading::single;
};

/// One rank of an MPI communicator; models Communicator. Owns its MPI_Comm (a duplicate or a
/// split), freed on destruction unless MPI was finalized first. Move-only.
class MpiCommunicator {
 public:
  /// A duplicate of MPI_COMM_WORLD (collective over all processes): zerotk's traffic stays apart
  /// from the application's own MPI calls.
  static MpiCommunicator world() { return duplicate(MPI_COMM_WORLD); }

  /// A duplicate of `comm` (collective over `comm`).
  static MpiCommunicator duplicate(MPI_Comm comm) {
    detail::mpi::require_initialized("MpiCommunicator::duplicate");
    MPI_Comm dup = MPI_COMM_NULL;
    int rank = 0, size = 0;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    detail::mpi::check(MPI_Comm_dup(comm, &dup), "MPI_Comm_dup", rank, size);
    return MpiCommunicator(dup);
  }

  MpiCommunicator(MpiCommunicator&& o) noexcept
      : comm_(std::exchange(o.comm_, MPI_COMM_NULL)), rank_(o.rank_), size_(o.size_), stats_(o.stats_) {}
  MpiCommunicator& operator=(MpiCommunicator&& o) noexcept {
    if (this != &o) {
      release();
      comm_ = std::exchange(o.comm_, MPI_COMM_NULL);
      rank_ = o.rank_;
      size_ = o.size_;
      stats_ = o.stats_;
    }
    return *this;
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;
  ~MpiCommunicator() { release(); }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  /// The underlying communicator, for the application's own MPI calls.
  MPI_Comm native() const noexcept { return comm_; }

  const CommStats& stats() const noexcept { return stats_; }
  CommStats& stats() noexcept { return stats_; }

  Work all_reduce(const void* send, void* recv, std::size_t count, DType dt, ReduceOp op) {
    constexpr OpKind k = OpKind::all_reduce;
    detail::check_reduce(k, dt, op, rank_, size_);
    detail::check_buffer(k, send, count, "send", rank_, size_);
    detail::check_buffer(k, recv, count, "recv", rank_, size_);
    const int n = detail::mpi::to_int(count, k, rank_, size_);
    const MPI_Op mop = detail::mpi::reduction(dt, op);
    detail::record_ring(stats_, k, count * size_of(dt), size_);
    MPI_Request req;
    check(MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, n, detail::mpi::datatype(dt), mop, comm_, &req),
          "MPI_Iallreduce");
    return make_work(req, "MPI_Iallreduce", avg_after(op, recv, count, dt));
  }

  /// `send` holds size() blocks of `recv_count`. In place when recv == send + rank()*recv_count
  /// (the other blocks of `send` are unspecified afterwards).
  Work reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType dt, ReduceOp op) {
    constexpr OpKind k = OpKind::reduce_scatter;
    detail::check_reduce(k, dt, op, rank_, size_);
    const std::size_t total = recv_count * static_cast<std::size_t>(size_);
    detail::check_buffer(k, send, total, "send", rank_, size_);
    detail::check_buffer(k, recv, recv_count, "recv", rank_, size_);
    const int n = detail::mpi::to_int(recv_count, k, rank_, size_);
    detail::mpi::to_int(total, k, rank_, size_);
    const MPI_Op mop = detail::mpi::reduction(dt, op);
    detail::record_ring(stats_, k, total * size_of(dt), size_);
    const std::size_t block_bytes = recv_count * size_of(dt);
    const bool in_place = recv_count > 0 && static_cast<const std::byte*>(send) +
                                                    static_cast<std::size_t>(rank_) * block_bytes ==
                                                static_cast<const std::byte*>(recv);
    auto after = avg_after(op, recv, recv_count, dt);
    MPI_Request req;
    if (in_place) {
      // MPI_IN_PLACE takes the input from recvbuf (the whole flat buffer) and leaves this rank's
      // result at its start; move it to this rank's block afterwards.
      void* flat = const_cast<void*>(send);
      check(MPI_Ireduce_scatter_block(MPI_IN_PLACE, flat, n, detail::mpi::datatype(dt), mop, comm_, &req),
            "MPI_Ireduce_scatter_block");
      after.move_to = recv;
      after.move_from = flat;
      after.move_bytes = block_bytes;
    } else {
      check(MPI_Ireduce_scatter_block(send, recv, n, detail::mpi::datatype(dt), mop, comm_, &req),
            "MPI_Ireduce_scatter_block");
    }
    return make_work(req, "MPI_Ireduce_scatter_block", after);
  }

  /// In place when send == recv + rank()*send_count.
  Work all_gather(const void* send, void* recv, std::size_t send_count, DType dt) {
    constexpr OpKind k = OpKind::all_gather;
    const std::size_t total = send_count * static_cast<std::size_t>(size_);
    detail::check_buffer(k, send, send_count, "send", rank_, size_);
    detail::check_buffer(k, recv, total, "recv", rank_, size_);
    const int n = detail::mpi::to_int(send_count, k, rank_, size_);
    detail::mpi::to_int(total, k, rank_, size_);
    detail::record_ring(stats_, k, total * size_of(dt), size_);
    const bool in_place = static_cast<const std::byte*>(recv) +
                              static_cast<std::size_t>(rank_) * send_count * size_of(dt) ==
                          static_cast<const std::byte*>(send);
    const MPI_Datatype t = detail::mpi::datatype(dt);
    MPI_Request req;
    check(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, n, t, recv, n, t, comm_, &req), "MPI_Iallgather");
    return make_work(req, "MPI_Iallgather", {});
  }

  Work all_gatherv(const void* send, std::size_t send_count, void* recv, std::span<const std::size_t> recv_counts,
                   DType dt) {
    constexpr OpKind k = OpKind::all_gatherv;
    detail::check_counts(recv_counts, send_count, rank_, size_);
    std::vector<int> counts(recv_counts.size()), displs(recv_counts.size());
    std::size_t total = 0;
    for (std::size_t r = 0; r < recv_counts.size(); ++r) {
      counts[r] = detail::mpi::to_int(recv_counts[r], k, rank_, size_);
      displs[r] = detail::mpi::to_int(total, k, rank_, size_);
      total += recv_counts[r];
    }
    detail::check_buffer(k, send, send_count, "send", rank_, size_);
    detail::check_buffer(k, recv, total, "recv", rank_, size_);
    detail::record(stats_, k, total * size_of(dt), all_gatherv_wire_bytes(recv_counts, rank_, size_of(dt)));
    const bool in_place = static_cast<const std::byte*>(recv) +
                              static_cast<std::size_t>(displs[static_cast<std::size_t>(rank_)]) * size_of(dt) ==
                          static_cast<const std::byte*>(send);
    const MPI_Datatype t = detail::mpi::datatype(dt);
    MPI_Request req;
    check(MPI_Iallgatherv(in_place ? MPI_IN_PLACE : send, counts[static_cast<std::size_t>(rank_)], t, recv,
                          counts.data(), displs.data(), t, comm_, &req),
          "MPI_Iallgatherv");
    auto w = std::make_unique<detail::mpi::MpiWork>(req, "MPI_Iallgatherv", rank_, size_, detail::mpi::MpiWork::After{});
    w->counts = std::move(counts);
    w->displs = std::move(displs);
    return Work(std::move(w));
  }

  Work broadcast(void* buf, std::size_t count, DType dt, int root) {
    constexpr OpKind k = OpKind::broadcast;
    detail::check_peer(k, root, "root", rank_, size_);
    detail::check_buffer(k, buf, count, "buf", rank_, size_);
    const int n = detail::mpi::to_int(count, k, rank_, size_);
    detail::record_ring(stats_, k, count * size_of(dt), size_);
    MPI_Request req;
    check(MPI_Ibcast(buf, n, detail::mpi::datatype(dt), root, comm_, &req), "MPI_Ibcast");
    return make_work(req, "MPI_Ibcast", {});
  }

  /// `recv` is only used on `root` (may be null elsewhere); in place at the root when send == recv.
  Work reduce(const void* send, void* recv, std::size_t count, DType dt, ReduceOp op, int root) {
    constexpr OpKind k = OpKind::reduce;
    detail::check_reduce(k, dt, op, rank_, size_);
    detail::check_peer(k, root, "root", rank_, size_);
    detail::check_buffer(k, send, count, "send", rank_, size_);
    if (rank_ == root) detail::check_buffer(k, recv, count, "recv", rank_, size_);
    const int n = detail::mpi::to_int(count, k, rank_, size_);
    const MPI_Op mop = detail::mpi::reduction(dt, op);
    detail::record_ring(stats_, k, count * size_of(dt), size_);
    const bool in_place = rank_ == root && send == recv;
    MPI_Request req;
    check(MPI_Ireduce(in_place ? MPI_IN_PLACE : send, recv, n, detail::mpi::datatype(dt), mop, root, comm_, &req),
          "MPI_Ireduce");
    return make_work(req, "MPI_Ireduce", rank_ == root ? avg_after(op, recv, count, dt) : detail::mpi::MpiWork::After{});
  }

  Work all_to_all(const void* send, void* recv, std::size_t count, DType dt) {
    constexpr OpKind k = OpKind::all_to_all;
    const std::size_t total = count * static_cast<std::size_t>(size_);
    detail::check_buffer(k, send, total, "send", rank_, size_);
    detail::check_buffer(k, recv, total, "recv", rank_, size_);
    detail::check_not_in_place(k, send, recv, count, rank_, size_);
    const int n = detail::mpi::to_int(count, k, rank_, size_);
    detail::record_ring(stats_, k, total * size_of(dt), size_);
    const MPI_Datatype t = detail::mpi::datatype(dt);
    MPI_Request req;
    check(MPI_Ialltoall(send, n, t, recv, n, t, comm_, &req), "MPI_Ialltoall");
    return make_work(req, "MPI_Ialltoall", {});
  }

  Work send(const void* buf, std::size_t count, DType dt, int peer, int tag) {
    constexpr OpKind k = OpKind::send;
    detail::check_peer(k, peer, "peer", rank_, size_);
    detail::check_tag(k, tag, rank_, size_);
    detail::check_buffer(k, buf, count, "buf", rank_, size_);
    const int n = detail::mpi::to_int(count, k, rank_, size_);
    detail::record(stats_, k, count * size_of(dt), count * size_of(dt));
    MPI_Request req;
    check(MPI_Isend(buf, n, detail::mpi::datatype(dt), peer, tag, comm_, &req), "MPI_Isend");
    return make_work(req, "MPI_Isend", {});
  }

  /// The message must have exactly `count` elements (a longer one is an MPI truncation error).
  Work recv(void* buf, std::size_t count, DType dt, int peer, int tag) {
    constexpr OpKind k = OpKind::recv;
    detail::check_peer(k, peer, "peer", rank_, size_);
    detail::check_tag(k, tag, rank_, size_);
    detail::check_buffer(k, buf, count, "buf", rank_, size_);
    const int n = detail::mpi::to_int(count, k, rank_, size_);
    detail::record(stats_, k, count * size_of(dt), 0);
    MPI_Request req;
    check(MPI_Irecv(buf, n, detail::mpi::datatype(dt), peer, tag, comm_, &req), "MPI_Irecv");
    detail::mpi::MpiWork::After after;
    after.expect_recv = n;
    after.dtype = dt;
    return make_work(req, "MPI_Irecv", after);
  }

  Work barrier() {
    detail::record(stats_, OpKind::barrier, 0, 0);
    MPI_Request req;
    check(MPI_Ibarrier(comm_, &req), "MPI_Ibarrier");
    return make_work(req, "MPI_Ibarrier", {});
  }

  /// Collective: a communicator over the ranks with the same `color` (>= 0), ordered by (key, rank).
  MpiCommunicator split(int color, int key) {
    detail::check_color(color, rank_, size_);
    MPI_Comm out = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color, key, &out), "MPI_Comm_split");
    return MpiCommunicator(out);
  }

  /// Collective: the ranks that share memory with this one (one node), ordered by rank.
  MpiCommunicator split_node_local() {
    MPI_Comm out = MPI_COMM_NULL;
    check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &out), "MPI_Comm_split_type");
    return MpiCommunicator(out);
  }

 private:
  explicit MpiCommunicator(MPI_Comm owned) : comm_(owned) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }

  void release() noexcept {
    if (comm_ == MPI_COMM_NULL) return;
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
  }

  void check(int code, const char* call) const { detail::mpi::check(code, call, rank_, size_); }

  detail::mpi::MpiWork::After avg_after(ReduceOp op, void* buf, std::size_t count, DType dt) const {
    detail::mpi::MpiWork::After a;
    if (op == ReduceOp::avg) {
      a.divide = buf;
      a.count = count;
      a.dtype = dt;
      a.divisor = size_;
    }
    return a;
  }

  Work make_work(MPI_Request req, const char* call, detail::mpi::MpiWork::After after) const {
    return Work(std::make_unique<detail::mpi::MpiWork>(req, call, rank_, size_, after));
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  CommStats stats_;
};

static_assert(Communicator<MpiCommunicator>);

}  // namespace zerotk::comm
