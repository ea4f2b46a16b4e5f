#pragma once
// zerotk/comm/detail/mpi_engine.hpp (internal; included by zerotk/comm/mpi.hpp after <mpi.h>)
// The machinery behind MpiCommunicator: signature checks, deadlines, diagnostics of missing ranks.
//
// Signature check. Every collective first exchanges its signature (kind, reduce op, count, dtype,
// root, sequence number) in one small nonblocking all-reduce on a private duplicate of the
// communicator (`sig`). The reduction keeps the smallest and the largest signature, each with the
// lowest rank that holds it, so every rank learns at once whether all calls agree and, if not, two
// ranks that differ and what each called. The data call (MPI_Iallreduce, ...) is issued on `data`
// only after its signature agreed: MPI never sees mismatched calls, so a mismatch cannot truncate,
// hang or silently combine wrong data, and after a mismatch nothing of the user's buffers is in
// MPI's hands. Signatures are issued at call time in call order; data calls in sequence order as
// soon as their signature completed (checked on every call, wait and test of the communicator), so
// several operations stay in flight and a signature overlaps the data of the calls before it.
// Cost: one 96-byte all-reduce per call (bench/comm: mpi/ against raw MPI of the same bytes).
//
// Deadlines. Work::wait polls MPI_Test until done or `timeout_ms` (ZEROTK_COMM_TIMEOUT_MS), never
// MPI_Wait. On a timeout the waiting rank asks its peers what they are doing over the process-wide
// control communicator (a duplicate of MPI_COMM_WORLD): every rank answers from inside any zerotk
// wait (checked every millisecond) and from MpiSession's finalize. The answer names the peer's calls
// on that communicator and what it is blocked in, or says it is finalizing; no answer within a grace
// period means it is stopped, dead or busy outside zerotk. The error names the operation, its
// sequence number and the ranks that have not called it.
//
// Left-behind requests. A collective cannot be cancelled: after a timeout (or an error with later
// operations already started) its requests stay with MPI. The communicator then refuses every
// further call, keeps the requests' buffers alive, and MpiSession aborts the job at exit instead of
// calling MPI_Finalize, which would wait forever for them (Process::unsafe).
//
// Threading: like MPI_THREAD_SERIALIZED, one thread at a time calls into zerotk's MPI code.

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/comm/detail/checks.hpp"
#include "zerotk/comm/detail/rank_names.hpp"
#include "zerotk/comm/detail/reduce.hpp"
#include "zerotk/comm/timeout.hpp"
#include "zerotk/core/error.hpp"

namespace zerotk::comm::detail::mpi {

using Clock = std::chrono::steady_clock;

inline std::string error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(len));
}

// "#5". (Not `"#" + std::to_string(n)`: GCC 12 warns -Wrestrict on it, a false positive.)
inline std::string seq_label(std::uint64_t seq) {
  std::string s = "#";
  s += std::to_string(seq);
  return s;
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

// ---------------------------------------------------------------------------------------------
// Signatures

inline constexpr std::uint8_t kSplitKind = 100;      // split(color, key): not an OpKind
inline constexpr std::uint8_t kSplitNodeKind = 101;  // split_node_local()
inline constexpr std::uint8_t kSplitDomainKind = 102;  // split_domain_local(d): color = d

inline bool has_reduce_op(OpKind k) noexcept {
  return k == OpKind::all_reduce || k == OpKind::reduce_scatter || k == OpKind::reduce;
}
inline bool has_root(OpKind k) noexcept { return k == OpKind::broadcast || k == OpKind::reduce; }

// One rank's call, as exchanged (trivially copyable: it travels as bytes). Fields that do not
// apply to the kind are normalized (op 0, root -1), so equal calls have equal bytes.
struct Signature {
  std::uint64_t seq = 0;          // collectives this rank called on the communicator before
  std::uint64_t count = 0;        // elements (all_gatherv: the total)
  std::uint64_t counts_hash = 0;  // all_gatherv: hash of the per-rank counts
  std::int32_t root = -1;
  std::int32_t rank = 0;          // the caller; not part of the key
  std::int32_t color = 0, key = 0;  // split only; not part of the key (they differ by design)
  std::uint8_t kind = 0, op = 0, dtype = 0, pad_ = 0;
  std::uint32_t pad2_ = 0;
};
static_assert(sizeof(Signature) == 48);

// What must agree. Lexicographic order over it gives the reduction a total order.
inline auto key_of(const Signature& s) noexcept {
  return std::make_tuple(s.seq, s.kind, s.op, s.dtype, s.root, s.count, s.counts_hash);
}

// The exchanged pair: after the all-reduce, the smallest and the largest signature of all ranks
// (by key, ties to the lowest rank). All calls agree iff their keys are equal.
struct SignaturePair {
  Signature lo, hi;
};

inline bool agree(const SignaturePair& p) noexcept { return key_of(p.lo) == key_of(p.hi); }

// MPI user op on SignaturePair (commutative and associative: a min and a max under a total order).
inline void combine_signatures(void* in, void* inout, int* len, MPI_Datatype*) {
  for (int i = 0; i < *len; ++i) {
    SignaturePair a, b;  // by value: MPI's buffers need not be aligned for Signature
    std::memcpy(&a, static_cast<const std::byte*>(in) + static_cast<std::size_t>(i) * sizeof a, sizeof a);
    std::memcpy(&b, static_cast<std::byte*>(inout) + static_cast<std::size_t>(i) * sizeof b, sizeof b);
    const auto ka = key_of(a.lo), kb = key_of(b.lo);
    if (ka < kb || (ka == kb && a.lo.rank < b.lo.rank)) b.lo = a.lo;
    const auto ha = key_of(a.hi), hb = key_of(b.hi);
    if (ha > hb || (ha == hb && a.hi.rank < b.hi.rank)) b.hi = a.hi;
    std::memcpy(static_cast<std::byte*>(inout) + static_cast<std::size_t>(i) * sizeof b, &b, sizeof b);
  }
}

inline std::uint64_t hash_counts(std::span<const std::size_t> counts) noexcept {
  std::uint64_t h = 0x9e3779b97f4a7c15ull;  // splitmix64 steps over the counts
  for (std::size_t c : counts) {
    h += 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(c);
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    h ^= h >> 31;
  }
  return h;
}

inline Signature make_signature(OpKind k, std::uint64_t count, DType dt, ReduceOp op, int root) {
  Signature s;
  s.kind = static_cast<std::uint8_t>(k);
  if (k != OpKind::barrier) {
    s.count = count;
    s.dtype = static_cast<std::uint8_t>(dt);
  }
  if (has_reduce_op(k)) s.op = static_cast<std::uint8_t>(op);
  if (has_root(k)) s.root = root;
  return s;
}

// "all_reduce(count 1000, fp32, sum)", "broadcast(count 7, bf16, root 2)", "split(color 1, key 0)":
// the same words as the threads back end.
inline std::string describe(const Signature& s) {
  if (s.kind == kSplitKind) return "split(color " + std::to_string(s.color) + ", key " + std::to_string(s.key) + ")";
  if (s.kind == kSplitNodeKind) return "split_node_local()";
  if (s.kind == kSplitDomainKind) return s.color == 0 ? "split_domain_local(socket)" : "split_domain_local(numa)";
  if (s.kind >= kOpKindCount) return "unknown call (kind " + std::to_string(s.kind) + ")";
  const auto k = static_cast<OpKind>(s.kind);
  std::string out(to_string(k));
  if (k == OpKind::barrier) return out + "()";
  if (k == OpKind::all_to_all_v) {
    out += "(";  // the counts differ by rank; their agreement was checked before
  } else {
    out += k == OpKind::all_gatherv ? "(total count " : "(count ";
    out += std::to_string(s.count);
    out += ", ";
  }
  out += to_string(static_cast<DType>(s.dtype));
  if (has_reduce_op(k)) (out += ", ") += to_string(static_cast<ReduceOp>(s.op));
  if (has_root(k)) out += ", root " + std::to_string(s.root);
  return out + ")";
}

// ---------------------------------------------------------------------------------------------
// User-defined MPI ops and types, created on first use and freed at MPI_Finalize (through an
// attribute on MPI_COMM_SELF, whose delete callback MPI runs first thing in MPI_Finalize).

template <class T, ReduceOp Op>
void user_op(void* in, void* inout, int* len, MPI_Datatype*) {
  combine_into<T, Op>(in, inout, static_cast<std::size_t>(*len));
}

struct UserOps {
  // [fp16, bf16, fp32, fp64][sum, max, min]; fp32/fp64 sum use MPI_SUM
  MPI_Op ops[4][3] = {};
  MPI_Op signature_op = MPI_OP_NULL;
  MPI_Datatype signature_type = MPI_DATATYPE_NULL;  // one SignaturePair

  UserOps() {
    create<half>(0);
    create<bfloat16>(1);
    create<float>(2);
    create<double>(3);
    MPI_Op_create(&combine_signatures, 1, &signature_op);
    MPI_Type_contiguous(static_cast<int>(sizeof(SignaturePair)), MPI_BYTE, &signature_type);
    MPI_Type_commit(&signature_type);
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
    if (u->signature_op != MPI_OP_NULL) MPI_Op_free(&u->signature_op);
    if (u->signature_type != MPI_DATATYPE_NULL) MPI_Type_free(&u->signature_type);
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

// ---------------------------------------------------------------------------------------------
// Process-wide state: the control channel, the registry of live communicators, and what makes
// MPI_Finalize unsafe.

struct ErrorInfo {
  std::string message, where, value;
};

// Something a rank can be blocked in, described for a peer's diagnostics.
class Waitable {
 public:
  virtual std::string describe_wait() const = 0;

 protected:
  ~Waitable() = default;
};

struct CommState;
struct Op;

// Inquiry and answer on the control communicator (fixed-size, sent as bytes).
struct Inquiry {
  std::uint64_t nonce = 0, comm_id = 0, seq = 0;
};
struct Reply {
  std::uint64_t nonce = 0, comm_id = 0;
  std::uint64_t posted = 0;    // collectives the peer has called on that communicator
  std::int32_t known = 0;      // 1: the peer has that communicator
  std::int32_t finalizing = 0;  // 1: the peer's MpiSession is finalizing (its main returned)
  char text[464] = {};         // what the peer is doing, in words
};

inline constexpr int kInquiryTag = 1;
inline constexpr int kReplyTag = 2;
inline constexpr auto kServiceEvery = std::chrono::milliseconds(1);

struct Process {
  std::mutex mu;                      // guards live, gone, unsafe, unobserved, graveyard (communicators
                                      // may be created and destroyed on other threads)
  std::vector<CommState*> live;       // registered communicators, for answers and progress
  std::vector<CommState*> busy;       // advance_all's scratch list
  std::string unsafe;                 // non-empty: requests were left with MPI; MPI_Finalize could hang
  std::string last_error;             // the last comm_error the MPI back end raised on this process
  std::vector<std::string> unobserved;  // errors of dropped Works of communicators already destroyed
  std::vector<std::shared_ptr<void>> graveyard;  // buffers of requests left with MPI: never freed
  std::uint64_t next_comm_id = 1;
  struct Gone {  // a destroyed communicator, still answered for
    std::uint64_t id, posted;
    std::optional<Signature> last;
  };
  std::deque<Gone> gone;              // the most recent kGoneKept
  static constexpr std::size_t kGoneKept = 64;
  const Waitable* waiting = nullptr;  // what this rank is blocked in
  bool finalizing = false;
  MPI_Comm control = MPI_COMM_NULL;   // duplicate of MPI_COMM_WORLD: inquiries and answers
  int world_rank = 0, world_size = 1;
  std::uint64_t nonce = 0;
  struct Outgoing {
    MPI_Request request;
    std::shared_ptr<void> buffer;
  };
  std::vector<Outgoing> outbox;       // answers and inquiries being sent

  static Process& get() {
    static Process p;
    return p;
  }

  void mark_unsafe(const std::string& why) {
    std::lock_guard lk(mu);
    if (unsafe.empty()) unsafe = why;
  }
};

// Errors of zerotk's calls on MPI_COMM_WORLD/SELF come back as codes (Open MPI 4.1 reports errors
// of nonblocking collectives through MPI_COMM_WORLD's handler, whatever their communicator).
inline void errors_return_everywhere() {
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
}

// Collective over MPI_COMM_WORLD the first time (MpiSession and MpiCommunicator::world call it).
inline void open_control() {
  Process& p = Process::get();
  if (p.control != MPI_COMM_NULL) return;
  errors_return_everywhere();
  MPI_Comm_rank(MPI_COMM_WORLD, &p.world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p.world_size);
  MPI_Comm c = MPI_COMM_NULL;
  const int rc = MPI_Comm_dup(MPI_COMM_WORLD, &c);
  if (rc != MPI_SUCCESS) {
    throw comm_error("MPI_Comm_dup failed: " + error_text(rc), "rank " + std::to_string(p.world_rank) + " of world");
  }
  MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  p.control = c;
}

inline void retire_outbox(Process& p) {
  std::erase_if(p.outbox, [](Process::Outgoing& o) {
    int done = 0;
    return MPI_Test(&o.request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done != 0;
  });
}

inline Reply answer(Process& p, const Inquiry& q);  // below, once CommState is complete
inline void advance_all(Process& p);

// Answers every pending inquiry (non-blocking).
inline void service(Process& p) {
  if (p.control == MPI_COMM_NULL) return;
  for (;;) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kInquiryTag, p.control, &flag, &st) != MPI_SUCCESS || !flag) break;
    Inquiry q;
    if (MPI_Recv(&q, sizeof q, MPI_BYTE, st.MPI_SOURCE, kInquiryTag, p.control, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
    auto r = std::make_shared<Reply>(answer(p, q));
    MPI_Request req = MPI_REQUEST_NULL;
    if (MPI_Isend(r.get(), sizeof(Reply), MPI_BYTE, st.MPI_SOURCE, kReplyTag, p.control, &req) == MPI_SUCCESS) {
      p.outbox.push_back({req, std::move(r)});
    }
  }
  retire_outbox(p);
}

// Asks the world ranks `targets` about (comm_id, seq) and collects answers for up to `grace`.
// Serves inquiries meanwhile: peers that timed out too may be asking this rank at the same time.
inline std::vector<std::optional<Reply>> ask(Process& p, const std::vector<int>& targets, std::uint64_t comm_id,
                                             std::uint64_t seq, Clock::duration grace) {
  std::vector<std::optional<Reply>> got(targets.size());
  if (p.control == MPI_COMM_NULL || targets.empty()) return got;
  auto q = std::make_shared<Inquiry>(Inquiry{++p.nonce, comm_id, seq});
  std::vector<Reply> buf(targets.size());
  std::vector<MPI_Request> recv(targets.size(), MPI_REQUEST_NULL);
  std::size_t open = 0;
  for (std::size_t i = 0; i < targets.size(); ++i) {
    if (targets[i] == MPI_UNDEFINED) continue;  // not a process of MPI_COMM_WORLD
    if (MPI_Irecv(&buf[i], sizeof(Reply), MPI_BYTE, targets[i], kReplyTag, p.control, &recv[i]) != MPI_SUCCESS) {
      recv[i] = MPI_REQUEST_NULL;
      continue;
    }
    ++open;
    MPI_Request s = MPI_REQUEST_NULL;
    if (MPI_Isend(q.get(), sizeof(Inquiry), MPI_BYTE, targets[i], kInquiryTag, p.control, &s) == MPI_SUCCESS) {
      p.outbox.push_back({s, q});
    }
  }
  const auto until = Clock::now() + grace;
  while (open > 0 && Clock::now() < until) {
    service(p);
    advance_all(p);
    for (std::size_t i = 0; i < targets.size(); ++i) {
      if (recv[i] == MPI_REQUEST_NULL) continue;
      int flag = 0;
      if (MPI_Test(&recv[i], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        recv[i] = MPI_REQUEST_NULL;
        --open;
        continue;
      }
      if (!flag) continue;
      if (buf[i].nonce == q->nonce) {
        buf[i].text[sizeof buf[i].text - 1] = '\0';
        got[i] = buf[i];
        --open;
      } else if (MPI_Irecv(&buf[i], sizeof(Reply), MPI_BYTE, targets[i], kReplyTag, p.control, &recv[i]) !=
                 MPI_SUCCESS) {  // (a late answer to an earlier inquiry: listen again)
        recv[i] = MPI_REQUEST_NULL;
        --open;
      }
    }
    std::this_thread::yield();
  }
  for (auto& r : recv) {  // cancelling a receive completes it locally
    if (r == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&r);
    MPI_Wait(&r, MPI_STATUS_IGNORE);
  }
  return got;
}

// How long a rank that timed out waits for its peers' answers.
inline Clock::duration grace_for(std::int64_t timeout_ms) {
  return std::chrono::milliseconds(std::clamp<std::int64_t>(timeout_ms / 4, 500, 2000));
}

// Sets what this rank is blocked in for the duration of a wait.
class WaitingScope {
 public:
  explicit WaitingScope(const Waitable* w) : p_(Process::get()), outer_(p_.waiting) { p_.waiting = w; }
  ~WaitingScope() { p_.waiting = outer_; }
  WaitingScope(const WaitingScope&) = delete;
  WaitingScope& operator=(const WaitingScope&) = delete;

 private:
  Process& p_;
  const Waitable* outer_;
};

// MpiSession's last act before MPI_Finalize: a barrier on the control communicator that answers
// inquiries while it waits ("finalizing"), so peers blocked on this rank learn that it left.
inline void finalize_barrier(Process& p) {
  if (p.control == MPI_COMM_NULL) return;
  p.finalizing = true;
  MPI_Request req = MPI_REQUEST_NULL;
  if (MPI_Ibarrier(p.control, &req) == MPI_SUCCESS) {
    for (;;) {
      int done = 0;
      if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done) break;
      service(p);
      std::this_thread::sleep_for(std::chrono::microseconds(200));  // not latency-critical
    }
  }
  // Answers still in flight: every peer is here, so their receives were matched or cancelled.
  for (int i = 0; i < 1000 && !p.outbox.empty(); ++i) {
    retire_outbox(p);
    if (!p.outbox.empty()) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  for (auto& o : p.outbox) MPI_Request_free(&o.request);
  p.outbox.clear();
  MPI_Comm_free(&p.control);
  p.control = MPI_COMM_NULL;
}

// Prints why and aborts every process of the job (the one documented exit of the library).
inline void abort_job(const std::string& why) {
  Process& p = Process::get();
  int rank = p.world_rank, size = p.world_size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::fprintf(stderr, "zerotk: rank %d of %d aborts the MPI job: %s\n", rank, size, why.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

// ---------------------------------------------------------------------------------------------
// Communicators and their operations

// What a rank does after its data call completed.
struct After {
  void* divide = nullptr;  // avg: divide these `count` elements by `divisor`
  int divisor = 1;
  std::size_t count = 0;
  DType dtype = DType::fp32;
  void* move_to = nullptr;  // in-place reduce-scatter: the block MPI left at `move_from`
  const void* move_from = nullptr;
  std::size_t move_bytes = 0;
};

// The MPI call of a verified collective.
struct DataCall {
  const void* send = nullptr;  // may be MPI_IN_PLACE
  void* recv = nullptr;
  int n = 0, root = 0;
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Op op = MPI_OP_NULL;
  std::vector<int> counts, displs;  // all_gatherv, all_to_all_v (received): must live as long as the request
  std::vector<int> send_counts, send_displs;  // all_to_all_v
};

enum class Phase : std::uint8_t { signature, data, done, failed };

struct Op final : Waitable {
  CommState* comm = nullptr;  // alive: every Work of the op holds the CommState
  std::uint64_t seq = 0;
  Signature mine;
  SignaturePair exchange;  // the signature all-reduce's buffer (in place)
  MPI_Request sig_req = MPI_REQUEST_NULL;
  const char* call = "";   // "MPI_Iallreduce"
  DataCall data;
  MPI_Request data_req = MPI_REQUEST_NULL;
  After after;
  Phase phase = Phase::signature;
  std::optional<ErrorInfo> error;

  std::string describe_wait() const override;
  bool finished() const noexcept { return phase == Phase::done || phase == Phase::failed; }
};

struct CommState {
  MPI_Comm data = MPI_COMM_NULL;  // the data calls; what native() returns
  MPI_Comm sig = MPI_COMM_NULL;   // signature exchanges only
  int rank = 0, size = 1;
  std::vector<int> world_ranks;   // rank -> MPI_COMM_WORLD rank (control channel address)
  std::string name;               // "world", "world/split(color 1)": same on every member
  std::uint64_t id = 0;           // same on every member, unique in each process
  std::int64_t timeout_ms = 60000;
  std::uint64_t next_seq = 0;     // collectives called
  std::optional<Signature> last;  // the last one, for answers
  std::deque<std::shared_ptr<Op>> queue;  // called and unfinished, in seq order
  std::optional<ErrorInfo> broken;
  std::string unobserved;         // error of a Work destroyed without wait(), not yet raised
  bool leaked = false;            // requests were left with MPI: never free the communicators
  std::vector<std::shared_ptr<void>> graveyard;  // their buffers

  CommState() = default;
  CommState(const CommState&) = delete;
  CommState& operator=(const CommState&) = delete;

  ~CommState() {
    Process& p = Process::get();
    {
      std::lock_guard lk(p.mu);
      std::erase(p.live, this);
      p.gone.push_back({id, next_seq, last});
      if (p.gone.size() > Process::kGoneKept) p.gone.pop_front();
      if (!unobserved.empty()) p.unobserved.push_back(unobserved);
      for (auto& op : queue) {
        if (op->finished()) continue;
        graveyard.push_back(op);  // unfinished: its requests stay with MPI
        leaked = true;
        if (p.unsafe.empty()) p.unsafe = "a communicator was destroyed with operations in flight: " + what(op->mine);
      }
      for (auto& g : graveyard) p.graveyard.push_back(std::move(g));
    }
    int fin = 0;
    MPI_Finalized(&fin);
    if (fin || leaked) return;
    if (sig != MPI_COMM_NULL) MPI_Comm_free(&sig);
    if (data != MPI_COMM_NULL) MPI_Comm_free(&data);
  }

  // "rank 1" on the world, "rank 1 (world 3)" on a group of it (comm/detail/rank_names.hpp).
  std::string ranks_text(const std::vector<int>& ranks) const {
    return detail::rank_list(ranks, world_ranks, Process::get().world_size);
  }
  // "ranks 0, 1 of world (2 ranks)"
  std::string where(std::vector<int> ranks) const {
    std::sort(ranks.begin(), ranks.end());
    ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
    return ranks_text(ranks) + " of " + name + " (" + std::to_string(size) + " ranks)";
  }
  std::string here() const { return where({rank}); }

  // "all_reduce(count 8, fp32, sum) #3 on world"
  std::string what(const Signature& s) const { return describe(s) + " " + seq_label(s.seq) + " on " + name; }
};

inline std::string Op::describe_wait() const { return comm->what(mine); }

inline Reply answer(Process& p, const Inquiry& q) {
  Reply r;
  r.nonce = q.nonce;
  r.comm_id = q.comm_id;
  std::string s;
  const auto last_call = [](const std::optional<Signature>& last) {
    return "last call on this communicator: " +
           (last ? seq_label(last->seq) + " " + describe(*last) : std::string("none"));
  };
  {
    std::lock_guard lk(p.mu);
    const auto live = std::find_if(p.live.begin(), p.live.end(), [&](const CommState* x) { return x->id == q.comm_id; });
    const auto gone = std::find_if(p.gone.rbegin(), p.gone.rend(), [&](const Process::Gone& x) { return x.id == q.comm_id; });
    if (live != p.live.end()) {
      const CommState& c = **live;
      r.known = 1;
      r.posted = c.next_seq;
      s = last_call(c.last);
      if (c.broken) s += "; it failed there: " + c.broken->message;
    } else if (gone != p.gone.rend()) {
      r.known = 1;
      r.posted = gone->posted;
      s = last_call(gone->last) + ", then it destroyed the communicator";
    } else {
      s = "it does not have this communicator (not created yet)";
    }
  }
  if (p.finalizing) {
    r.finalizing = 1;
    s += "; it left: its MpiSession is finalizing (its main returned)";
  } else if (p.waiting != nullptr) {
    s += "; now waiting in " + p.waiting->describe_wait();
  }
  const std::size_t n = std::min(s.size(), sizeof r.text - 1);
  std::memcpy(r.text, s.data(), n);
  r.text[n] = '\0';
  return r;
}

// Raises an error to the program: it is now known (not unobserved), and the last one seen.
[[noreturn]] inline void raise_error(CommState& s, const ErrorInfo& e) {
  s.unobserved.clear();
  comm_error err(e.message, e.where, e.value);
  Process::get().last_error = err.what();
  throw err;
}

inline ErrorInfo mpi_error(const CommState& s, int code, const std::string& call) {
  int cls = code;
  MPI_Error_class(code, &cls);
  return ErrorInfo{call + " failed: " + error_text(code), s.here(), "error class " + std::to_string(cls)};
}

// The error of every later call on a broken communicator.
inline ErrorInfo unusable(const CommState& s) {
  std::string m = "communicator unusable after an earlier error";
  if (!s.unobserved.empty()) m += " (of an operation whose Work was destroyed without wait())";
  return ErrorInfo{m + ": " + s.broken->message, s.broken->where, s.broken->value};
}

// Throws if the communicator failed before, or if a Work destroyed without wait() failed and
// the program has not met that error yet (checked by every call).
inline void ensure_usable(CommState& s) {
  if (s.broken) raise_error(s, unusable(s));
  if (!s.unobserved.empty()) {
    raise_error(s, ErrorInfo{"an earlier operation whose Work was destroyed without wait() failed: " + s.unobserved,
                       s.here(), {}});
  }
}

// Keeps a request that MPI still owns (and its buffers) for the rest of the process.
inline void leave_with_mpi(CommState& s, const std::shared_ptr<Op>& op, const std::string& why) {
  s.leaked = true;
  s.graveyard.push_back(op);
  Process::get().mark_unsafe(why);
}

// Runs `wait` for a Work destroyed without wait(); keeps its error for the communicator's next
// call (and for MpiSession, which aborts the job with it if the program never met it).
template <class F>
void keep_unobserved(CommState& s, F&& wait) noexcept {
  try {
    wait();
  } catch (const std::exception& e) {
    if (s.unobserved.empty()) s.unobserved = e.what();
  } catch (...) {
    if (s.unobserved.empty()) s.unobserved = "an exception not derived from std::exception";
  }
}

// Fails `op` and every later unfinished op of `s`, and breaks the communicator.
inline void fail_from(CommState& s, Op& op, ErrorInfo info) {
  if (!s.broken) {
    s.broken = info;
  }
  const std::string why = info.message;
  bool reached = false;
  for (auto& x : s.queue) {
    if (x.get() == &op) reached = true;
    if (!reached || x->finished()) continue;
    const bool first = x.get() == &op;
    const bool pending =
        (x->phase == Phase::signature && x->sig_req != MPI_REQUEST_NULL) || (x->phase == Phase::data);
    x->error = first ? info : unusable(s);
    x->phase = Phase::failed;
    if (pending) leave_with_mpi(s, x, why);
  }
}

inline ErrorInfo mismatch(const CommState& s, const Op& op) {
  // The two witnesses (every rank received the same pair), in rank order.
  const bool swap = op.exchange.lo.rank > op.exchange.hi.rank;
  const Signature& lo = swap ? op.exchange.hi : op.exchange.lo;
  const Signature& hi = swap ? op.exchange.lo : op.exchange.hi;
  std::string roster = s.ranks_text({lo.rank}) + ": " + describe(lo) + "; " + s.ranks_text({hi.rank}) + ": " + describe(hi);
  if (s.rank != lo.rank && s.rank != hi.rank) {
    roster += "; " + s.ranks_text({s.rank}) + " (this rank): " + describe(op.mine);
  }
  if (s.size > 2) roster += " (two of the differing calls: the smallest and the largest)";
  return ErrorInfo{"mismatched collective " + seq_label(op.seq) + " on " + s.name + ": " + roster,
                   s.where({lo.rank, hi.rank}), describe(op.mine)};
}

inline int issue(CommState& s, Op& op) {
  const DataCall& d = op.data;
  if (op.mine.kind >= kOpKindCount) return MPI_SUCCESS;  // split: the caller does it
  switch (static_cast<OpKind>(op.mine.kind)) {
    case OpKind::all_reduce: return MPI_Iallreduce(d.send, d.recv, d.n, d.type, d.op, s.data, &op.data_req);
    case OpKind::reduce_scatter:
      return MPI_Ireduce_scatter_block(d.send, d.recv, d.n, d.type, d.op, s.data, &op.data_req);
    case OpKind::all_gather: return MPI_Iallgather(d.send, d.n, d.type, d.recv, d.n, d.type, s.data, &op.data_req);
    case OpKind::all_gatherv:
      return MPI_Iallgatherv(d.send, d.n, d.type, d.recv, d.counts.data(), d.displs.data(), d.type, s.data,
                             &op.data_req);
    case OpKind::broadcast: return MPI_Ibcast(d.recv, d.n, d.type, d.root, s.data, &op.data_req);
    case OpKind::reduce: return MPI_Ireduce(d.send, d.recv, d.n, d.type, d.op, d.root, s.data, &op.data_req);
    case OpKind::all_to_all: return MPI_Ialltoall(d.send, d.n, d.type, d.recv, d.n, d.type, s.data, &op.data_req);
    case OpKind::all_to_all_v:
      return MPI_Ialltoallv(d.send, d.send_counts.data(), d.send_displs.data(), d.type, d.recv, d.counts.data(),
                            d.displs.data(), d.type, s.data, &op.data_req);
    case OpKind::barrier: return MPI_Ibarrier(s.data, &op.data_req);
    case OpKind::send:
    case OpKind::recv: break;
  }
  return MPI_SUCCESS;
}

inline void finish(Op& op) {
  op.phase = Phase::done;
  const After& a = op.after;
  if (a.move_to != nullptr && a.move_to != a.move_from) std::memmove(a.move_to, a.move_from, a.move_bytes);
  if (a.divide != nullptr) divide_in_place(a.divide, a.count, a.dtype, a.divisor);
}

// One non-blocking pass: completes signature exchanges in order, issues verified data calls in
// sequence order, completes data calls, and drops finished ops from the queue.
inline void advance(CommState& s) {
  for (auto& op : s.queue) {
    if (op->phase != Phase::signature) continue;
    int flag = 0;
    if (const int rc = MPI_Test(&op->sig_req, &flag, MPI_STATUS_IGNORE); rc != MPI_SUCCESS) {
      fail_from(s, *op, mpi_error(s, rc, "MPI_Iallreduce (signature of " + s.what(op->mine) + ")"));
      break;
    }
    if (!flag) break;  // later data calls must wait for this one: data calls go out in sequence order
    if (!agree(op->exchange)) {
      fail_from(s, *op, mismatch(s, *op));
      break;
    }
    if (const int rc = issue(s, *op); rc != MPI_SUCCESS) {
      fail_from(s, *op, mpi_error(s, rc, op->call));
      break;
    }
    op->phase = op->data_req == MPI_REQUEST_NULL ? Phase::done : Phase::data;
  }
  for (auto& op : s.queue) {
    if (op->phase != Phase::data) continue;
    int flag = 0;
    if (const int rc = MPI_Test(&op->data_req, &flag, MPI_STATUS_IGNORE); rc != MPI_SUCCESS) {
      fail_from(s, *op, mpi_error(s, rc, op->call));
      break;
    }
    if (flag) finish(*op);
  }
  while (!s.queue.empty() && s.queue.front()->finished()) s.queue.pop_front();
  std::erase_if(s.queue, [](const std::shared_ptr<Op>& op) { return op->finished(); });
}

// Advances every live communicator of this process that has calls in flight. Every wait does
// this, not only for its own communicator: data calls go out from inside zerotk, so a rank blocked
// on one communicator (or in a receive) must still issue another communicator's verified calls,
// or ranks that wait in different orders would wait for each other (raw MPI issues at call time).
inline void advance_all(Process& p) {
  {
    std::lock_guard lk(p.mu);
    p.busy.clear();  // (capacity stays: no allocation per poll)
    for (CommState* c : p.live) {
      if (!c->queue.empty()) p.busy.push_back(c);
    }
  }
  for (CommState* c : p.busy) advance(*c);  // may record failures, which takes p.mu
}

// Fails the oldest unfinished op after its deadline, naming what every peer is doing.
inline void time_out(CommState& s, const std::shared_ptr<Op>& op_ptr) {
  Op& op = *op_ptr;
  Process& p = Process::get();
  std::vector<int> peers, targets;
  for (int r = 0; r < s.size; ++r) {
    if (r == s.rank) continue;
    peers.push_back(r);
    targets.push_back(s.world_ranks[static_cast<std::size_t>(r)]);
  }
  const auto grace = grace_for(s.timeout_ms);
  const auto grace_ms = std::chrono::duration_cast<std::chrono::milliseconds>(grace).count();
  const auto replies = ask(p, targets, s.id, op.seq, grace);
  const bool in_signature = op.phase == Phase::signature;

  std::vector<int> missing, silent;
  std::vector<std::string> lines;  // the roster: this rank first
  lines.push_back(s.ranks_text({s.rank}) + ": " + describe(op.mine) +
                  (in_signature ? "" : " (waiting for the transfer)"));
  for (std::size_t i = 0; i < peers.size(); ++i) {
    const std::string who = s.ranks_text({peers[i]}) + ": ";
    if (!replies[i]) {
      silent.push_back(peers[i]);
      lines.push_back(who + "no answer within " + std::to_string(grace_ms) + " ms");
      continue;
    }
    const Reply& a = *replies[i];
    if (!a.known || a.posted <= op.seq) {
      missing.push_back(peers[i]);
      lines.push_back(who + "not called (" + a.text + ")");
    } else {
      lines.push_back(who + "called it (" + a.text + ")");
    }
  }
  std::string head = "timed out after " + std::to_string(s.timeout_ms) + " ms in " + s.what(op.mine) + ": ";
  std::vector<std::string> parts;
  if (in_signature && !missing.empty()) {
    parts.push_back(s.ranks_text(missing) + (missing.size() == 1 ? " has" : " have") + " not called it");
  }
  if (!in_signature) parts.push_back("every rank called it, but the transfer did not finish");
  if (!silent.empty()) {
    parts.push_back(s.ranks_text(silent) + (silent.size() == 1 ? " does" : " do") +
                    " not answer (stopped, dead, or busy outside zerotk)");
  }
  if (parts.empty()) parts.push_back("every rank called it, but the signature exchange did not complete");
  for (std::size_t i = 0; i < parts.size(); ++i) head += (i ? "; " : "") + parts[i];
  // The roster names every rank of small groups; of large ones this rank and those in question.
  std::string roster;
  std::size_t shown = 0;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const bool of_interest = i == 0 || lines[i].find("called it (") == std::string::npos;
    if (s.size > 16 && !of_interest) continue;
    if (++shown > 17) {
      roster += "; ...";
      break;
    }
    roster += "; " + lines[i];
  }
  if (p.control == MPI_COMM_NULL) {
    roster += "; (peers not asked: no control channel; create an MpiSession or MpiCommunicator::world() first)";
  }
  std::vector<int> blamed = missing;
  blamed.insert(blamed.end(), silent.begin(), silent.end());
  if (blamed.empty()) blamed.push_back(s.rank);
  fail_from(s, op, ErrorInfo{head + roster, s.where(blamed), describe(op.mine)});
}

// Drives the ops of `s` up to sequence number `target` (all of them: issue-order completion).
// Blocking: until they finished or failed; on the deadline the oldest fails with a timeout.
// Non-blocking (test): one pass, plus the timeout once the deadline passed.
inline void drive(CommState& s, std::uint64_t target, Clock::time_point deadline, bool blocking, const Waitable* me) {
  WaitingScope scope(me);
  Process& p = Process::get();
  auto next_service = Clock::now() + kServiceEvery;
  for (;;) {
    advance_all(p);
    if (s.queue.empty() || s.queue.front()->seq > target) return;
    const auto now = Clock::now();
    if (now >= deadline) {
      time_out(s, s.queue.front());
      continue;
    }
    if (!blocking) return;
    if (now >= next_service) {
      service(p);
      next_service = now + kServiceEvery;
    }
  }
}

// Work of a collective.
class CollectiveWork final : public WorkState {
 public:
  CollectiveWork(std::shared_ptr<CommState> s, std::shared_ptr<Op> op) : s_(std::move(s)), op_(std::move(op)) {}

  void wait() override {
    drive(*s_, op_->seq, deadline_after(s_->timeout_ms), true, op_.get());
    raise_if_failed();
  }

  bool test() override {
    if (!first_test_) first_test_ = Clock::now();
    drive(*s_, op_->seq, deadline_after(s_->timeout_ms, *first_test_), false, op_.get());
    if (!s_->queue.empty() && s_->queue.front()->seq <= op_->seq) return false;
    raise_if_failed();
    return true;
  }

  void dropped() noexcept override { keep_unobserved(*s_, [this] { wait(); }); }

  // The rank is unwinding. Not issued yet: nothing of the user's buffers is with MPI, so give it
  // up at once (the peers learn it from the answer, or the job is aborted). Issued: the buffers are
  // in use, so wait for it.
  void abandon() noexcept override {
    try {
      if (op_->phase == Phase::signature) {
        fail_from(*s_, *op_,
                  ErrorInfo{s_->ranks_text({s_->rank}) + " abandoned " + s_->what(op_->mine) +
                                " while an exception was unwinding it",
                            s_->here(), describe(op_->mine)});
        return;
      }
      wait();
    } catch (...) {
    }
  }

 private:
  void raise_if_failed() {
    if (op_->error) raise_error(*s_, *op_->error);
  }

  std::shared_ptr<CommState> s_;
  std::shared_ptr<Op> op_;
  std::optional<Clock::time_point> first_test_;
};

// Posts a collective: its signature exchange now, its data call once every rank agreed.
inline std::shared_ptr<Op> post(CommState& s, Signature sig, const char* call, DataCall data, After after) {
  ensure_usable(s);
  sig.seq = s.next_seq;
  sig.rank = s.rank;
  auto op = std::make_shared<Op>();
  op->comm = &s;
  op->seq = sig.seq;
  op->mine = sig;
  op->exchange = {sig, sig};
  op->call = call;
  op->data = std::move(data);
  op->after = after;
  if (s.size > 1) {
    const UserOps& u = UserOps::get();
    if (const int rc = MPI_Iallreduce(MPI_IN_PLACE, &op->exchange, 1, u.signature_type, u.signature_op, s.sig,
                                      &op->sig_req);
        rc != MPI_SUCCESS) {
      s.broken = mpi_error(s, rc, "MPI_Iallreduce (signature of " + s.what(sig) + ")");
      raise_error(s, *s.broken);
    }
  }
  ++s.next_seq;
  s.last = sig;
  s.queue.push_back(op);
  advance_all(Process::get());  // earlier calls may be ready to go out; a 1-rank group issues at once
  return op;
}

// Work of a send or a receive: polled with the deadline; a timed-out receive is cancelled.
class P2pWork final : public WorkState, public Waitable {
 public:
  P2pWork(std::shared_ptr<CommState> s, MPI_Request req, bool is_send, int peer, int tag, std::size_t count, DType dt)
      : s_(std::move(s)), req_(req), is_send_(is_send), peer_(peer), tag_(tag), count_(count), dtype_(dt) {}

  void wait() override {
    WaitingScope scope(this);
    const auto deadline = deadline_after(s_->timeout_ms);
    auto next_service = Clock::now() + kServiceEvery;
    while (!poll()) {
      advance_all(Process::get());  // collectives this rank called may be ready to go out
      const auto now = Clock::now();
      if (now >= deadline) time_out();
      if (now >= next_service) {
        service(Process::get());
        next_service = now + kServiceEvery;
      }
    }
  }

  bool test() override {
    if (!first_test_) first_test_ = Clock::now();
    advance_all(Process::get());
    if (poll()) return true;
    if (Clock::now() >= deadline_after(s_->timeout_ms, *first_test_)) time_out();
    return false;
  }

  void dropped() noexcept override { keep_unobserved(*s_, [this] { wait(); }); }

  std::string describe_wait() const override {
    std::string d = std::string(is_send_ ? "send" : "recv") + "(count " + std::to_string(count_) + ", ";
    d += to_string(dtype_);
    d += is_send_ ? ") to rank " : ") from rank ";
    return d + std::to_string(peer_) + ", tag " + std::to_string(tag_) + " on " + s_->name;
  }

 private:
  bool poll() {
    if (done_) return true;
    int flag = 0;
    MPI_Status st;
    if (const int rc = MPI_Test(&req_, &flag, &st); rc != MPI_SUCCESS) {
      done_ = true;
      fail(mpi_error(*s_, rc, is_send_ ? "MPI_Isend" : "MPI_Irecv"));
    }
    if (!flag) return false;
    done_ = true;
    if (!is_send_) {
      int got = 0;
      MPI_Get_count(&st, datatype(dtype_), &got);
      if (static_cast<std::size_t>(got) != count_) {
        fail(ErrorInfo{"mismatched send/recv: the message from rank " + std::to_string(st.MPI_SOURCE) + " has " +
                           std::to_string(got) + " elements, the receive expected " + std::to_string(count_),
                       s_->where({st.MPI_SOURCE, s_->rank}), std::to_string(got)});
      }
    }
    return true;
  }

  // Point-to-point failures concern this pair of ranks only, so unlike a collective's they do not
  // break the communicator (the other ranks could not know it had broken).
  [[noreturn]] void fail(ErrorInfo info) { raise_error(*s_, info); }

  [[noreturn]] void time_out() {
    const auto grace = grace_for(s_->timeout_ms);
    const auto replies = ask(Process::get(), {s_->world_ranks[static_cast<std::size_t>(peer_)]}, s_->id, 0, grace);
    std::string msg = "timed out after " + std::to_string(s_->timeout_ms) + " ms in " + describe_wait() + ": rank " +
                      std::to_string(peer_) + (is_send_ ? " has not received it" : " has not sent it") + "; rank " +
                      std::to_string(peer_) + ": ";
    if (replies[0]) {
      msg += replies[0]->text;
    } else {
      msg += "no answer within " +
             std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(grace).count()) +
             " ms (stopped, dead, or busy outside zerotk)";
    }
    done_ = true;
    if (is_send_) {  // a send cannot be taken back: its buffer stays with MPI
      s_->leaked = true;
      Process::get().mark_unsafe(msg);
    } else {  // cancelling a receive completes it locally
      MPI_Cancel(&req_);
      MPI_Wait(&req_, MPI_STATUS_IGNORE);
    }
    fail(ErrorInfo{msg, s_->where({peer_}), describe_wait()});
  }

  std::shared_ptr<CommState> s_;
  MPI_Request req_;
  bool is_send_;
  int peer_, tag_;
  std::size_t count_;
  DType dtype_;
  bool done_ = false;
  std::optional<Clock::time_point> first_test_;
};

// Builds the state of a communicator around `data` (owned): its signature duplicate, an id every
// member agrees on, its world ranks. Collective over `data`.
inline std::shared_ptr<CommState> make_state(MPI_Comm data, std::string name, std::int64_t timeout_ms) {
  auto s = std::make_shared<CommState>();
  s->data = data;
  s->name = std::move(name);
  s->timeout_ms = timeout_ms;
  MPI_Comm_set_errhandler(data, MPI_ERRORS_RETURN);
  MPI_Comm_rank(data, &s->rank);
  MPI_Comm_size(data, &s->size);
  if (const int rc = MPI_Comm_dup(data, &s->sig); rc != MPI_SUCCESS) {
    throw comm_error("MPI_Comm_dup failed: " + error_text(rc), s->here());
  }
  MPI_Comm_set_errhandler(s->sig, MPI_ERRORS_RETURN);
  // The id: the largest next id of the members, so it is new in every member's process.
  Process& p = Process::get();
  unsigned long long id = p.next_comm_id;
  if (const int rc = MPI_Allreduce(MPI_IN_PLACE, &id, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, data); rc != MPI_SUCCESS) {
    throw comm_error("MPI_Allreduce failed: " + error_text(rc), s->here());
  }
  s->id = id;
  p.next_comm_id = id + 1;
  MPI_Group mine = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  MPI_Comm_group(data, &mine);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> ranks(static_cast<std::size_t>(s->size));
  for (int r = 0; r < s->size; ++r) ranks[static_cast<std::size_t>(r)] = r;
  s->world_ranks.assign(ranks.size(), MPI_UNDEFINED);
  MPI_Group_translate_ranks(mine, s->size, ranks.data(), world, s->world_ranks.data());
  MPI_Group_free(&mine);
  MPI_Group_free(&world);
  std::lock_guard lk(p.mu);
  p.live.push_back(s.get());
  return s;
}

}  // namespace zerotk::comm::detail::mpi
