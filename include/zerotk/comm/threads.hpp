#pragma once
/// \file zerotk/comm/threads.hpp
/// In-process communicator: N ranks are N threads of one process sharing memory. Used by tests,
/// examples and single-machine runs.
///
///   zerotk::comm::run_threads(4, [&](zerotk::comm::ThreadsCommunicator& c) {
///     std::vector<float> g(n, float(c.rank()));
///     c.all_reduce(g.data(), g.data(), n, zerotk::DType::fp32, zerotk::comm::ReduceOp::sum).wait();
///   });
///
/// Guarantees:
/// - Reductions combine ranks in order 0, 1, ..., W-1 with fp32 accumulation for fp16/bf16 (rounded
///   once), so results are bitwise identical for any thread scheduling; avg = sum / W.
/// - Collectives return at once; several may be in flight. Waiting on one also completes the
///   earlier collectives of the same communicator (issue order). Work is done by whichever ranks
///   wait, so no rank has to wait in a particular order. Send/recv complete independently.
/// - Ranks whose calls differ (op, count, dtype, root, reduce op), a rank that does not arrive
///   within `timeout_ms`, a rank that returned from its function, or a rank that threw: every rank
///   waiting for the call gets a comm_error naming the ranks and their calls. Nothing hangs.
/// - A communicator and its Work handles are used by one thread at a time (normally its rank's).
///   Buffers must stay valid and unmodified until the operation's Work completes.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "zerotk/comm/accounting.hpp"
#include "zerotk/comm/communicator.hpp"
#include "zerotk/comm/detail/checks.hpp"
#include "zerotk/comm/detail/threads_engine.hpp"
#include "zerotk/comm/timeout.hpp"
#include "zerotk/comm/topology.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/core/runtime.hpp"

namespace zerotk::comm {

/// Options of a threads world.
struct ThreadsOptions {
  /// A rank waiting longer than this for its peers to call the same collective gets a comm_error.
  std::int64_t timeout_ms = default_timeout_ms();
  /// Simulated nodes for split_node_local(): world rank r is on node r / ranks_per_node. 0: one node.
  int ranks_per_node = 0;
  /// Simulated sockets for split_domain_local() (socket and NUMA alike): a rank's index within its
  /// node / ranks_per_socket. 0: one per node.
  int ranks_per_socket = 0;
};

class ThreadsCommunicator;
namespace detail::threads {
struct Access;
}

/// One rank of a threads world; models Communicator. Created by run_threads or
/// make_threads_communicators; move-only.
class ThreadsCommunicator {
 public:
  ThreadsCommunicator(ThreadsCommunicator&&) noexcept = default;
  ThreadsCommunicator& operator=(ThreadsCommunicator&&) noexcept = default;
  ThreadsCommunicator(const ThreadsCommunicator&) = delete;
  ThreadsCommunicator& operator=(const ThreadsCommunicator&) = delete;
  ~ThreadsCommunicator() = default;

  int rank() const noexcept { return rank_; }
  // Group::size() spelled out: an engine function called here would be emitted in every TU at -O0.
  int size() const noexcept { return static_cast<int>(group_->world_ranks.size()); }
  /// This rank's index in the world the communicator was split from.
  int world_rank() const noexcept { return group_->world_ranks[static_cast<std::size_t>(rank_)]; }
  /// Timeout of operations issued from now on (ThreadsOptions::timeout_ms unless changed).
  std::int64_t timeout_ms() const noexcept { return timeout_ms_; }
  /// Changes the timeout of this rank's later operations on this communicator (e.g. a longer one
  /// around a slow checkpoint write). Sub-communicators inherit it.
  void set_timeout_ms(std::int64_t ms) {
    if (ms <= 0) throw usage_error("timeout_ms must be > 0", "ThreadsCommunicator::set_timeout_ms", std::to_string(ms));
    timeout_ms_ = ms;
  }
  /// "world", "world/split(color 1)", ...: how the group was made, as error messages name it.
  const std::string& name() const noexcept { return group_->name; }

  /// Byte counters of the operations issued through this object (see OpCounters).
  const CommStats& stats() const noexcept { return stats_; }
  CommStats& stats() noexcept { return stats_; }

  ZEROTK_RUNTIME_INLINE Work all_reduce(const void* send, void* recv, std::size_t count, DType dt, ReduceOp op);

  /// `send` holds size() blocks of `recv_count`; rank r receives the reduction of block r.
  ZEROTK_RUNTIME_INLINE Work reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType dt,
                                            ReduceOp op);

  ZEROTK_RUNTIME_INLINE Work all_gather(const void* send, void* recv, std::size_t send_count, DType dt);

  ZEROTK_RUNTIME_INLINE Work all_gatherv(const void* send, std::size_t send_count, void* recv,
                                         std::span<const std::size_t> recv_counts, DType dt);

  ZEROTK_RUNTIME_INLINE Work broadcast(void* buf, std::size_t count, DType dt, int root);

  /// `recv` is only used on `root` (may be null elsewhere).
  ZEROTK_RUNTIME_INLINE Work reduce(const void* send, void* recv, std::size_t count, DType dt, ReduceOp op,
                                    int root);

  /// `send` holds size() blocks of `count` (block d goes to rank d); `recv` receives block s from rank s.
  ZEROTK_RUNTIME_INLINE Work all_to_all(const void* send, void* recv, std::size_t count, DType dt);

  /// Variable blocks (see the Communicator concept): block d of `send` (send_counts[d] elements)
  /// goes to rank d; rank s's block lands in `recv` after recv_counts[0..s). Counts that disagree
  /// between two ranks fail the call on every rank, naming both, before anything moves.
  ZEROTK_RUNTIME_INLINE Work all_to_all_v(const void* send, std::span<const std::size_t> send_counts, void* recv,
                                          std::span<const std::size_t> recv_counts, DType dt);

  /// Matched with the peer's recv of the same tag, in posting order; counts and dtypes must agree.
  ZEROTK_RUNTIME_INLINE Work send(const void* buf, std::size_t count, DType dt, int peer, int tag);

  ZEROTK_RUNTIME_INLINE Work recv(void* buf, std::size_t count, DType dt, int peer, int tag);

  ZEROTK_RUNTIME_INLINE Work barrier();

  /// Collective: a communicator over the ranks with the same `color` (>= 0), ordered by (key, rank).
  /// `label` names the new group in error messages under this one's name ("world/tensor[data 1,
  /// pipeline 0]"; ProcessGrid names its groups by role); every rank of a color passes the same one.
  /// Without it the group is "<this name>/split(color N)".
  ZEROTK_RUNTIME_INLINE ThreadsCommunicator split(int color, int key, std::string label = {});

  /// Collective: the ranks of this communicator on the same (simulated) node, ordered by rank.
  ZEROTK_RUNTIME_INLINE ThreadsCommunicator split_node_local();

  /// Collective: the ranks of this communicator in the same (simulated) socket of the same node,
  /// ordered by rank (ThreadsOptions::ranks_per_socket; one socket per node when 0).
  ZEROTK_RUNTIME_INLINE ThreadsCommunicator split_domain_local(InnerDomain /*socket or numa: simulated alike*/);

  /// Fails every pending and future collective of this world with a comm_error naming this rank.
  ZEROTK_RUNTIME_INLINE void abort(std::string_view reason);

 private:
  friend struct detail::threads::Access;

  ZEROTK_RUNTIME_INLINE ThreadsCommunicator(std::shared_ptr<detail::threads::Group> g, int rank,
                                            std::int64_t timeout_ms);

  std::uint64_t total(std::size_t block) const noexcept {
    return static_cast<std::uint64_t>(block) * static_cast<std::uint64_t>(size());
  }

  ZEROTK_RUNTIME_INLINE void check_buffers(OpKind k, const void* send, const void* recv,
                                           std::size_t count) const;

  ZEROTK_RUNTIME_INLINE static detail::threads::Call make_call(OpKind k, const void* send, void* recv,
                                                               std::size_t count, DType dt, ReduceOp op);

  ZEROTK_RUNTIME_INLINE Work collective(detail::threads::Call call);

  ZEROTK_RUNTIME_INLINE Work p2p(detail::threads::Call call, int peer, int tag, bool is_send);

  std::shared_ptr<detail::threads::Group> group_;
  int rank_ = 0;
  std::int64_t timeout_ms_ = 60000;
  std::shared_ptr<detail::threads::RankQueue> queue_;  // shared with this rank's Work handles
  CommStats stats_;
};

static_assert(Communicator<ThreadsCommunicator>);

namespace detail::threads {

struct Access {
  ZEROTK_RUNTIME_INLINE static std::vector<ThreadsCommunicator> make_world(int world, const ThreadsOptions& opts);

  ZEROTK_RUNTIME_INLINE static Context& context(ThreadsCommunicator& c);
};

// Marks world rank `r` failed with `e`; returns true when another rank had failed before
// (so `e` is most likely a consequence of that failure).
ZEROTK_RUNTIME_INLINE bool fail_rank(Context& ctx, int r, const std::exception_ptr& e);

ZEROTK_RUNTIME_INLINE void mark_exited(Context& ctx, int r);

}  // namespace detail::threads

/// The communicators of a new threads world, one per rank, for callers that run their own threads
/// (run_threads is simpler). Without run_threads a rank that stops calling is found by the timeout.
ZEROTK_RUNTIME_INLINE std::vector<ThreadsCommunicator> make_threads_communicators(int world,
                                                                                  ThreadsOptions opts = {});

/// Runs `fn(ThreadsCommunicator&)` on `world` threads, one per rank, and joins them. Returns nothing
/// if `fn` returns void, else the values by rank. If ranks throw, rethrows (after all threads ended)
/// the first exception that was not a consequence of another rank's failure; ranks blocked in a
/// collective with a failed rank are released with a comm_error naming it. If every rank returned
/// but one destroyed a failed operation's Work without wait() (and met no later error), rethrows
/// that operation's comm_error.
template <class F>
  requires std::invocable<F&, ThreadsCommunicator&>
auto run_threads(int world, F&& fn, ThreadsOptions opts = {}) {
  using R = std::invoke_result_t<F&, ThreadsCommunicator&>;
  auto comms = make_threads_communicators(world, opts);
  auto& ctx = detail::threads::Access::context(comms[0]);

  std::mutex mu;
  std::exception_ptr primary, secondary;
  using Slot = std::conditional_t<std::is_void_v<R>, char, std::optional<R>>;
  std::vector<Slot> results(static_cast<std::size_t>(world));

  const auto body = [&](int r) {
    try {
      if constexpr (std::is_void_v<R>) {
        fn(comms[static_cast<std::size_t>(r)]);
      } else {
        results[static_cast<std::size_t>(r)].emplace(fn(comms[static_cast<std::size_t>(r)]));
      }
      detail::threads::mark_exited(ctx, r);
    } catch (...) {
      auto e = std::current_exception();
      const bool consequence = detail::threads::fail_rank(ctx, r, e);
      std::lock_guard lk(mu);
      auto& first = consequence ? secondary : primary;
      if (!first) first = e;
    }
  };

  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(world));
  try {
    for (int r = 0; r < world; ++r) threads.emplace_back(body, r);
  } catch (...) {  // could not start every thread: release those that did
    auto e = std::current_exception();
    for (int r = static_cast<int>(threads.size()); r < world; ++r) detail::threads::fail_rank(ctx, r, e);
    for (auto& t : threads) t.join();
    throw;
  }
  for (auto& t : threads) t.join();
  if (primary) std::rethrow_exception(primary);
  if (secondary) std::rethrow_exception(secondary);
  // Every rank returned, but one destroyed the Work of a failed operation without wait() and met no
  // error afterwards: its results may be wrong, so the error is the run's.
  for (const auto& e : ctx.unobserved) {
    if (e) std::rethrow_exception(e);
  }
  if constexpr (!std::is_void_v<R>) {
    std::vector<R> out;
    out.reserve(results.size());
    for (auto& v : results) out.push_back(std::move(*v));
    return out;
  }
}

}  // namespace zerotk::comm

#if !ZEROTK_COMPILED_RUNTIME
#include "zerotk/comm/threads_impl.hpp"
#endif
