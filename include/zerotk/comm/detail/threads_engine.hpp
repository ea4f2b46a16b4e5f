#pragma once
// zerotk/comm/detail/threads_engine.hpp (internal)
// The shared state behind ThreadsCommunicator (zerotk/comm/threads.hpp).
//
// Matching: every collective a rank issues on a group gets the next per-rank sequence number. The
// ranks' calls with the same number meet in a Rendezvous; point-to-point operations meet in one
// keyed by (source, destination, tag), in posting order. The rank whose call completes a rendezvous
// checks that all calls agree and turns them into a Job: output segments cut into chunks.
//
// Progress: any rank that waits (or tests) on a ready rendezvous claims chunks and computes them,
// so several waiting ranks share the work and one waiting rank can finish it alone; nobody has to
// wait in a particular order. Each output element is computed from the inputs in rank order, so
// the result does not depend on which thread computed it.
//
// Failure: a rendezvous that is not ready fails on a signature mismatch, a timeout, a rank that
// returned or abandoned the call, or a failed rank (Context::abort). A ready one always completes:
// other threads may be writing into the waiting rank's buffers. After a failure the group is broken
// and every later call on it fails at once.
//
// Memory ordering: all state is guarded by Context::mu. Buffers are written by the user before the
// post (lock release) and read by computing threads after they saw `ready` (lock acquire); outputs
// are published by `chunks_done`/`done` under the lock (a chunk written with streaming stores is
// fenced before that: Job::run). The epoch atomic only lets waiters poll briefly before sleeping on
// the condition variable.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/comm/detail/rank_names.hpp"
#include "zerotk/comm/detail/reduce.hpp"
#include "zerotk/comm/detail/stream_store.hpp"
#include "zerotk/comm/timeout.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/core/runtime.hpp"

namespace zerotk::comm::detail::threads {

using Clock = std::chrono::steady_clock;

// A comm_error as data: stored once, raised by every rank that observes it.
struct ErrorInfo {
  std::string message, where, value;
  [[noreturn]] ZEROTK_RUNTIME_INLINE void raise() const;
};

// One rank's call, as posted.
struct Call {
  OpKind kind = OpKind::barrier;
  bool is_split = false;
  DType dtype = DType::fp32;
  ReduceOp op = ReduceOp::sum;
  int root = -1;
  std::size_t count = 0;
  const std::byte* send = nullptr;
  std::byte* recv = nullptr;
  std::vector<std::size_t> counts;  // all_gatherv: elements per rank; all_to_all_v: send then recv counts
  int color = 0, key = 0;           // split
  std::string label;                // split: the new group's name under this one's ("tensor[data 1, pipeline 0]")
};

// "all_reduce(count 1000, fp32, sum)", "broadcast(count 7, bf16, root 2)", "split(color 1, key 0)".
ZEROTK_RUNTIME_INLINE std::string describe(const Call& c);

// The data movement of a matched operation: segments (one reduction, or one copy, into `nout`
// outputs each), cut into chunks that any participating thread may compute. Every chunk has an
// owner, the rank whose buffer it writes (for a reduction into every rank's buffer: ranks take
// contiguous ranges); a waiting rank computes its own chunks first and then takes the others'
// from the back, so each rank mostly writes memory it will read next.
struct Job {
  struct Segment {
    std::uint32_t in_first, nin, out_first, nout;
    std::size_t n;  // elements
  };
  struct Chunk {
    std::uint32_t segment;
    std::size_t begin, end;  // elements within the segment
  };
  static constexpr std::size_t kChunkBytes = 256 << 10;  // per input row: a few rows stay in L2
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

  DType dtype = DType::fp32;
  ReduceOp op = ReduceOp::sum;
  bool reduce = false;
  bool stream = false;  // outputs written with streaming stores (set by cut)
  int divisor = 1;
  std::size_t elem = 4;
  std::vector<const std::byte*> in;
  std::vector<std::byte*> out;
  std::vector<int> out_owner;  // rank whose buffer out[k] is
  std::vector<Segment> segments;
  std::vector<Chunk> chunks;
  std::vector<std::uint32_t> order;    // chunk indices grouped by owning rank
  std::vector<std::size_t> head, tail;  // per rank: its unclaimed chunks are order[head[r] .. tail[r])

  // Reduces (or, with one input, copies) `ins` into each of `outs`; outs[k] belongs to owners[k].
  ZEROTK_RUNTIME_INLINE void add(std::span<const std::byte* const> ins, std::span<std::byte* const> outs,
                                 std::span<const int> owners, std::size_t n);

  // Copies `n` elements from `src` to `dst` (rank `owner`'s buffer); nothing when they coincide.
  ZEROTK_RUNTIME_INLINE void add_copy(const std::byte* src, std::byte* dst, int owner, std::size_t n);

  static bool streams(std::size_t footprint) { return footprint > stream_threshold_bytes(); }

  // Distinct bytes read plus bytes written: an input that several segments copy (all_gather to
  // every rank, broadcast) counts once.
  ZEROTK_RUNTIME_INLINE std::size_t footprint_bytes() const;

  // Cuts the segments into chunks, decides whether outputs stream, and orders the chunks by owner.
  ZEROTK_RUNTIME_INLINE void cut(int world);

  // The next chunk for `rank` to compute: its own first, then the others' from the back. Lock held.
  ZEROTK_RUNTIME_INLINE std::size_t claim(int rank);

  // Computes chunk `c`. With `stream`, fences before returning: the caller publishes the chunk as
  // done next.
  ZEROTK_RUNTIME_INLINE void run(std::size_t c) const;
};

struct Group;

// Where the calls of one operation meet. Roles are group ranks for a collective and
// {sender, receiver} for a point-to-point transfer.
struct Rendezvous {
  std::uint64_t seq = 0;           // collective: sequence number on its group
  bool is_p2p = false;
  int tag = 0;                     // point-to-point: the tag
  std::vector<int> role_rank;      // group rank of each role
  std::vector<std::optional<Call>> calls;
  int arrivals = 0;
  bool ready = false;
  bool done = false;
  std::optional<ErrorInfo> error;
  Job job;
  std::size_t chunks_done = 0;
  // split results: the new groups and, per old rank, its group and new rank
  std::vector<std::shared_ptr<Group>> split_groups;
  std::vector<int> split_group_of, split_rank_of;

  std::size_t roles() const noexcept { return role_rank.size(); }

  // "#5" or "send/recv rank 0 -> rank 1, tag 3" (built only for messages).
  ZEROTK_RUNTIME_INLINE std::string label() const;
};

// Everything one run_threads (or one make_threads_communicators) shares.
struct Context {
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<std::uint64_t> epoch{0};  // bumped under `mu` on every change a waiter may wait for
  int sleepers = 0;
  int world = 0;
  std::int64_t timeout_ms = 60000;        // initial timeout of every communicator of the world
  int ranks_per_node = 0;
  int ranks_per_socket = 0;
  std::optional<ErrorInfo> abort;         // a rank failed: release everyone
  int abort_rank = -1;                    // world rank that failed first
  std::vector<char> exited;               // by world rank: its function returned
  std::vector<std::string> waiting_in;    // by world rank: what it is blocked in, for diagnostics
  // by world rank: the error of a Work it destroyed without wait(), until a later error reaches it
  std::vector<std::exception_ptr> unobserved;

  void bump_locked() {
    epoch.fetch_add(1, std::memory_order_release);
    if (sleepers > 0) cv.notify_all();
  }

  // Waits until the epoch moves or `deadline` passes. Called and returns with `lk` held.
  // Polls with sched_yield for a short while first: a peer on the same core runs at once, one on
  // another core is seen within a microsecond, and no futex sleep/wake pair is paid. Measured on a
  // loaded 2-core machine: 4 KiB all_reduce on 2 ranks 5 us with it, 50-110 us with a pause-spin
  // or none. The short budget keeps idle ranks from burning the cores others need.
  ZEROTK_RUNTIME_INLINE void wait_locked(std::unique_lock<std::mutex>& lk, Clock::time_point deadline);
};

// A set of ranks that issue collectives together: the world or a split of it.
struct Group {
  std::shared_ptr<Context> ctx;
  std::string name;                 // "world", "world/split(color 1)", "world/tensor[data 1, pipeline 0]"
  std::vector<int> world_ranks;     // group rank -> world rank
  std::vector<std::uint64_t> next_seq;
  std::vector<std::optional<std::pair<std::uint64_t, Call>>> last_call;  // per rank, for diagnostics
  std::unordered_map<std::uint64_t, std::shared_ptr<Rendezvous>> open;  // collectives not all ranks posted
  // Unmatched point-to-point rendezvous per (source, destination, tag), oldest first; all in one
  // queue miss the same role.
  std::map<std::tuple<int, int, int>, std::deque<std::shared_ptr<Rendezvous>>> p2p_open;
  std::optional<ErrorInfo> broken;

  int size() const noexcept { return static_cast<int>(world_ranks.size()); }

  ZEROTK_RUNTIME_INLINE std::string rank_list(const std::vector<int>& ranks) const;
  ZEROTK_RUNTIME_INLINE std::string where(const std::vector<int>& ranks) const;
};

ZEROTK_RUNTIME_INLINE std::shared_ptr<Group> make_group(std::shared_ptr<Context> ctx, std::string name,
                                                        std::vector<int> world_ranks);

// Drives `rv` towards completion on behalf of the rank in `role`: computes claimable chunks and,
// if `blocking`, waits until it is done or failed. Returns true when done or failed.
ZEROTK_RUNTIME_INLINE bool drive(Group& g, Rendezvous& rv, std::size_t role, Clock::time_point deadline,
                                 std::int64_t timeout_ms, bool blocking, bool abandon);

// Posts rank `rank`'s next collective on `g`; returns its rendezvous and sequence number.
ZEROTK_RUNTIME_INLINE std::pair<std::shared_ptr<Rendezvous>, std::uint64_t> post_collective(Group& g, int rank,
                                                                                            Call call);

// Posts a send (rank -> peer) or a receive (peer -> rank).
ZEROTK_RUNTIME_INLINE std::shared_ptr<Rendezvous> post_p2p(Group& g, int rank, int peer, int tag, bool is_send,
                                                           Call call);

// The issued, unfinished collectives of one rank on one group, oldest first: waiting on one
// completes all earlier ones first (issue-order completion).
struct RankQueue {
  struct Entry {
    std::shared_ptr<Rendezvous> rv;
    std::uint64_t seq;
  };
  std::deque<Entry> pending;
};

// Work handle of a threads-back-end operation.
class ThreadsWork final : public WorkState {
 public:
  // `queue` is null for point-to-point operations: those complete independently of collectives.
  ZEROTK_RUNTIME_INLINE ThreadsWork(std::shared_ptr<Group> g, std::size_t role, std::shared_ptr<Rendezvous> rv,
                                    std::uint64_t seq, std::shared_ptr<RankQueue> queue, std::int64_t timeout_ms);

  // Out of class, so that with ZEROTK_COMPILED_RUNTIME the vtable is emitted in zerotk::runtime only.
  ZEROTK_RUNTIME_INLINE void wait() override;
  ZEROTK_RUNTIME_INLINE bool test() override;

  // Destroyed unfinished while an exception unwinds this rank: give the call up rather than wait
  // out the timeout for peers that may never arrive.
  ZEROTK_RUNTIME_INLINE void abandon() noexcept override;

  // Destroyed unfinished with no exception in flight: finish, and keep a failure for run_threads
  // (which rethrows it when the rank's function returned normally).
  ZEROTK_RUNTIME_INLINE void dropped() noexcept override;

 private:
  ZEROTK_RUNTIME_INLINE bool advance(Clock::time_point deadline, bool blocking, bool abandon);
  ZEROTK_RUNTIME_INLINE std::size_t world_rank() const;
  ZEROTK_RUNTIME_INLINE void raise_if_failed() const;

  std::shared_ptr<Group> g_;
  std::size_t role_;
  std::shared_ptr<Rendezvous> rv_;
  std::uint64_t seq_;
  std::shared_ptr<RankQueue> queue_;
  std::int64_t timeout_ms_;
  std::optional<Clock::time_point> first_test_;
};

}  // namespace zerotk::comm::detail::threads

#if !ZEROTK_COMPILED_RUNTIME
#include "zerotk/comm/detail/threads_engine_impl.hpp"
#endif
