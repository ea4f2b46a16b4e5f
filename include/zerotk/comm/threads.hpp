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
  int size() const noexcept { return group_->size(); }
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

  Work all_reduce(const void* send, void* recv, std::size_t count, DType dt, ReduceOp op) {
    detail::check_reduce(OpKind::all_reduce, dt, op, rank_, size());
    check_buffers(OpKind::all_reduce, send, recv, count);
    detail::record_ring(stats_, OpKind::all_reduce, count * size_of(dt), size());
    return collective(make_call(OpKind::all_reduce, send, recv, count, dt, op));
  }

  /// `send` holds size() blocks of `recv_count`; rank r receives the reduction of block r.
  Work reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType dt, ReduceOp op) {
    detail::check_reduce(OpKind::reduce_scatter, dt, op, rank_, size());
    check_buffers(OpKind::reduce_scatter, send, recv, recv_count);
    detail::record_ring(stats_, OpKind::reduce_scatter, total(recv_count) * size_of(dt), size());
    return collective(make_call(OpKind::reduce_scatter, send, recv, recv_count, dt, op));
  }

  Work all_gather(const void* send, void* recv, std::size_t send_count, DType dt) {
    check_buffers(OpKind::all_gather, send, recv, send_count);
    detail::record_ring(stats_, OpKind::all_gather, total(send_count) * size_of(dt), size());
    return collective(make_call(OpKind::all_gather, send, recv, send_count, dt, ReduceOp::sum));
  }

  Work all_gatherv(const void* send, std::size_t send_count, void* recv, std::span<const std::size_t> recv_counts,
                   DType dt) {
    detail::check_counts(recv_counts, send_count, rank_, size());
    std::size_t sum = 0;
    for (std::size_t c : recv_counts) sum += c;
    detail::check_buffer(OpKind::all_gatherv, send, send_count, "send", rank_, size());
    detail::check_buffer(OpKind::all_gatherv, recv, sum, "recv", rank_, size());
    detail::record(stats_, OpKind::all_gatherv, sum * size_of(dt),
                   all_gatherv_wire_bytes(recv_counts, rank_, size_of(dt)));
    auto call = make_call(OpKind::all_gatherv, send, recv, send_count, dt, ReduceOp::sum);
    call.counts.assign(recv_counts.begin(), recv_counts.end());
    return collective(std::move(call));
  }

  Work broadcast(void* buf, std::size_t count, DType dt, int root) {
    detail::check_peer(OpKind::broadcast, root, "root", rank_, size());
    detail::check_buffer(OpKind::broadcast, buf, count, "buf", rank_, size());
    detail::record_ring(stats_, OpKind::broadcast, count * size_of(dt), size());
    auto call = make_call(OpKind::broadcast, buf, buf, count, dt, ReduceOp::sum);
    call.root = root;
    return collective(std::move(call));
  }

  /// `recv` is only used on `root` (may be null elsewhere).
  Work reduce(const void* send, void* recv, std::size_t count, DType dt, ReduceOp op, int root) {
    detail::check_reduce(OpKind::reduce, dt, op, rank_, size());
    detail::check_peer(OpKind::reduce, root, "root", rank_, size());
    detail::check_buffer(OpKind::reduce, send, count, "send", rank_, size());
    if (rank_ == root) detail::check_buffer(OpKind::reduce, recv, count, "recv", rank_, size());
    detail::record_ring(stats_, OpKind::reduce, count * size_of(dt), size());
    auto call = make_call(OpKind::reduce, send, recv, count, dt, op);
    call.root = root;
    return collective(std::move(call));
  }

  /// `send` holds size() blocks of `count` (block d goes to rank d); `recv` receives block s from rank s.
  Work all_to_all(const void* send, void* recv, std::size_t count, DType dt) {
    check_buffers(OpKind::all_to_all, send, recv, total(count));
    detail::check_not_in_place(OpKind::all_to_all, send, recv, count, rank_, size());
    detail::record_ring(stats_, OpKind::all_to_all, total(count) * size_of(dt), size());
    return collective(make_call(OpKind::all_to_all, send, recv, count, dt, ReduceOp::sum));
  }

  /// Matched with the peer's recv of the same tag, in posting order; counts and dtypes must agree.
  Work send(const void* buf, std::size_t count, DType dt, int peer, int tag) {
    detail::check_peer(OpKind::send, peer, "peer", rank_, size());
    detail::check_tag(OpKind::send, tag, rank_, size());
    detail::check_buffer(OpKind::send, buf, count, "buf", rank_, size());
    detail::record(stats_, OpKind::send, count * size_of(dt), count * size_of(dt));
    return p2p(make_call(OpKind::send, buf, nullptr, count, dt, ReduceOp::sum), peer, tag, true);
  }

  Work recv(void* buf, std::size_t count, DType dt, int peer, int tag) {
    detail::check_peer(OpKind::recv, peer, "peer", rank_, size());
    detail::check_tag(OpKind::recv, tag, rank_, size());
    detail::check_buffer(OpKind::recv, buf, count, "buf", rank_, size());
    detail::record(stats_, OpKind::recv, count * size_of(dt), 0);
    return p2p(make_call(OpKind::recv, nullptr, buf, count, dt, ReduceOp::sum), peer, tag, false);
  }

  Work barrier() {
    detail::record(stats_, OpKind::barrier, 0, 0);
    return collective(make_call(OpKind::barrier, nullptr, nullptr, 0, DType::uint8, ReduceOp::sum));
  }

  /// Collective: a communicator over the ranks with the same `color` (>= 0), ordered by (key, rank).
  ThreadsCommunicator split(int color, int key) {
    detail::check_color(color, rank_, size());
    detail::threads::Call call;
    call.is_split = true;
    call.color = color;
    call.key = key;
    auto [rv, seq] = detail::threads::post_collective(*group_, rank_, std::move(call));
    queue_->pending.push_back({rv, seq});
    detail::threads::ThreadsWork(group_, static_cast<std::size_t>(rank_), rv, seq, queue_, timeout_ms_).wait();
    std::lock_guard lk(group_->ctx->mu);
    const auto r = static_cast<std::size_t>(rank_);
    return ThreadsCommunicator(rv->split_groups[static_cast<std::size_t>(rv->split_group_of[r])],
                               rv->split_rank_of[r], timeout_ms_);
  }

  /// Collective: the ranks of this communicator on the same (simulated) node, ordered by rank.
  ThreadsCommunicator split_node_local() {
    const int rpn = group_->ctx->ranks_per_node;
    return split(rpn > 0 ? world_rank() / rpn : 0, rank_);
  }

  /// Collective: the ranks of this communicator in the same (simulated) socket of the same node,
  /// ordered by rank (ThreadsOptions::ranks_per_socket; one socket per node when 0).
  ThreadsCommunicator split_domain_local(InnerDomain /*socket or numa: simulated alike*/) {
    const int rpn = group_->ctx->ranks_per_node, rps = group_->ctx->ranks_per_socket;
    const int w = world_rank(), node = rpn > 0 ? w / rpn : 0, local = rpn > 0 ? w % rpn : w;
    return split(node * (group_->ctx->world + 1) + (rps > 0 ? local / rps : 0), rank_);
  }

  /// Fails every pending and future collective of this world with a comm_error naming this rank.
  void abort(std::string_view reason) {
    auto& ctx = *group_->ctx;
    std::lock_guard lk(ctx.mu);
    if (ctx.abort) return;
    ctx.abort = detail::threads::ErrorInfo{"rank " + std::to_string(world_rank()) + " aborted: " + std::string(reason),
                                           "rank " + std::to_string(world_rank()) + " of world", {}};
    ctx.abort_rank = world_rank();
    ctx.bump_locked();
  }

 private:
  friend struct detail::threads::Access;

  ThreadsCommunicator(std::shared_ptr<detail::threads::Group> g, int rank, std::int64_t timeout_ms)
      : group_(std::move(g)),
        rank_(rank),
        timeout_ms_(timeout_ms),
        queue_(std::make_shared<detail::threads::RankQueue>()) {}

  std::uint64_t total(std::size_t block) const noexcept {
    return static_cast<std::uint64_t>(block) * static_cast<std::uint64_t>(size());
  }

  void check_buffers(OpKind k, const void* send, const void* recv, std::size_t count) const {
    const std::size_t in = k == OpKind::reduce_scatter ? total(count) : count;
    const std::size_t out = k == OpKind::all_gather ? total(count) : count;
    detail::check_buffer(k, send, in, "send", rank_, size());
    detail::check_buffer(k, recv, out, "recv", rank_, size());
  }

  static detail::threads::Call make_call(OpKind k, const void* send, void* recv, std::size_t count, DType dt,
                                         ReduceOp op) {
    detail::threads::Call c;
    c.kind = k;
    c.dtype = dt;
    c.op = op;
    c.count = count;
    c.send = static_cast<const std::byte*>(send);
    c.recv = static_cast<std::byte*>(recv);
    return c;
  }

  Work collective(detail::threads::Call call) {
    auto [rv, seq] = detail::threads::post_collective(*group_, rank_, std::move(call));
    queue_->pending.push_back({rv, seq});
    return Work(std::make_unique<detail::threads::ThreadsWork>(group_, static_cast<std::size_t>(rank_), std::move(rv),
                                                               seq, queue_, timeout_ms_));
  }

  Work p2p(detail::threads::Call call, int peer, int tag, bool is_send) {
    auto rv = detail::threads::post_p2p(*group_, rank_, peer, tag, is_send, std::move(call));
    return Work(std::make_unique<detail::threads::ThreadsWork>(group_, is_send ? 0 : 1, std::move(rv), 0, nullptr,
                                                               timeout_ms_));
  }

  std::shared_ptr<detail::threads::Group> group_;
  int rank_ = 0;
  std::int64_t timeout_ms_ = 60000;
  std::shared_ptr<detail::threads::RankQueue> queue_;  // shared with this rank's Work handles
  CommStats stats_;
};

static_assert(Communicator<ThreadsCommunicator>);

namespace detail::threads {

struct Access {
  static std::vector<ThreadsCommunicator> make_world(int world, const ThreadsOptions& opts) {
    if (world < 1) throw usage_error("world size must be >= 1", "zerotk::comm::run_threads", std::to_string(world));
    if (opts.timeout_ms <= 0) {
      throw usage_error("timeout_ms must be > 0", "zerotk::comm::ThreadsOptions", std::to_string(opts.timeout_ms));
    }
    if (opts.ranks_per_node < 0) {
      throw usage_error("ranks_per_node must be >= 0", "zerotk::comm::ThreadsOptions",
                        std::to_string(opts.ranks_per_node));
    }
    if (opts.ranks_per_socket < 0) {
      throw usage_error("ranks_per_socket must be >= 0", "zerotk::comm::ThreadsOptions",
                        std::to_string(opts.ranks_per_socket));
    }
    detail::last_level_cache_bytes();  // reads sysfs once, here rather than under the lock of a job
    auto ctx = std::make_shared<Context>();
    ctx->world = world;
    ctx->timeout_ms = opts.timeout_ms;
    ctx->ranks_per_node = opts.ranks_per_node;
    ctx->ranks_per_socket = opts.ranks_per_socket;
    ctx->exited.assign(static_cast<std::size_t>(world), 0);
    ctx->waiting_in.assign(static_cast<std::size_t>(world), {});
    ctx->unobserved.assign(static_cast<std::size_t>(world), nullptr);
    std::vector<int> ranks(static_cast<std::size_t>(world));
    for (int r = 0; r < world; ++r) ranks[static_cast<std::size_t>(r)] = r;
    auto g = make_group(ctx, "world", std::move(ranks));
    std::vector<ThreadsCommunicator> comms;
    comms.reserve(static_cast<std::size_t>(world));
    for (int r = 0; r < world; ++r) comms.push_back(ThreadsCommunicator(g, r, opts.timeout_ms));
    return comms;
  }

  static Context& context(ThreadsCommunicator& c) { return *c.group_->ctx; }
};

inline std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}

// Marks world rank `r` failed with `e`; returns true when another rank had failed before
// (so `e` is most likely a consequence of that failure).
inline bool fail_rank(Context& ctx, int r, const std::exception_ptr& e) {
  std::lock_guard lk(ctx.mu);
  ctx.exited[static_cast<std::size_t>(r)] = 1;
  const bool secondary = ctx.abort.has_value() && ctx.abort_rank != r;
  if (!ctx.abort) {
    ctx.abort = ErrorInfo{"rank " + std::to_string(r) + " failed: " + what_of(e), "rank " + std::to_string(r) + " of world",
                          {}};
    ctx.abort_rank = r;
  }
  ctx.bump_locked();
  return secondary;
}

inline void mark_exited(Context& ctx, int r) {
  std::lock_guard lk(ctx.mu);
  ctx.exited[static_cast<std::size_t>(r)] = 1;
  ctx.bump_locked();
}

}  // namespace detail::threads

/// The communicators of a new threads world, one per rank, for callers that run their own threads
/// (run_threads is simpler). Without run_threads a rank that stops calling is found by the timeout.
inline std::vector<ThreadsCommunicator> make_threads_communicators(int world, ThreadsOptions opts = {}) {
  return detail::threads::Access::make_world(world, opts);
}

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
