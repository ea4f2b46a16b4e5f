#pragma once
// zerotk/comm/threads_impl.hpp
// ThreadsCommunicator's operations and the threads world's setup (threads.hpp declares them):
// included by threads.hpp in header-only mode, compiled once in zerotk::runtime with
// ZEROTK_COMPILED_RUNTIME=1 (zerotk/core/runtime.hpp).

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zerotk/comm/accounting.hpp"
#include "zerotk/comm/communicator.hpp"
#include "zerotk/comm/detail/checks.hpp"
#include "zerotk/comm/detail/stream_store.hpp"
#include "zerotk/comm/detail/threads_engine.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/core/error.hpp"

namespace zerotk::comm {

ZEROTK_RUNTIME_INLINE Work ThreadsCommunicator::all_reduce(const void* send, void* recv, std::size_t count, DType dt,
                                                           ReduceOp op) {
  detail::check_reduce(OpKind::all_reduce, dt, op, rank_, size());
  check_buffers(OpKind::all_reduce, send, recv, count);
  detail::record_ring(stats_, OpKind::all_reduce, count * size_of(dt), size());
  return collective(make_call(OpKind::all_reduce, send, recv, count, dt, op));
}

ZEROTK_RUNTIME_INLINE Work ThreadsCommunicator::reduce_scatter(const void* send, void* recv, std::size_t recv_count,
                                                               DType dt, ReduceOp op) {
  detail::check_reduce(OpKind::reduce_scatter, dt, op, rank_, size());
  check_buffers(OpKind::reduce_scatter, send, recv, recv_count);
  detail::record_ring(stats_, OpKind::reduce_scatter, total(recv_count) * size_of(dt), size());
  return collective(make_call(OpKind::reduce_scatter, send, recv, recv_count, dt, op));
}

ZEROTK_RUNTIME_INLINE Work ThreadsCommunicator::all_gather(const void* send, void* recv, std::size_t send_count,
                                                           DType dt) {
  check_buffers(OpKind::all_gather, send, recv, send_count);
  detail::record_ring(stats_, OpKind::all_gather, total(send_count) * size_of(dt), size());
  return collective(make_call(OpKind::all_gather, send, recv, send_count, dt, ReduceOp::sum));
}

ZEROTK_RUNTIME_INLINE Work ThreadsCommunicator::all_gatherv(const void* send, std::size_t send_count, void* recv,
                                                            std::span<const std::size_t> recv_counts, DType dt) {
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

ZEROTK_RUNTIME_INLINE Work ThreadsCommunicator::broadcast(void* buf, std::size_t count, DType dt, int root) {
  detail::check_peer(OpKind::broadcast, root, "root", rank_, size());
  detail::check_buffer(OpKind::broadcast, buf, count, "buf", rank_, size());
  detail::record_ring(stats_, OpKind::broadcast, count * size_of(dt), size());
  auto call = make_call(OpKind::broadcast, buf, buf, count, dt, ReduceOp::sum);
  call.root = root;
  return collective(std::move(call));
}

ZEROTK_RUNTIME_INLINE Work ThreadsCommunicator::reduce(const void* send, void* recv, std::size_t count, DType dt,
                                                       ReduceOp op, int root) {
  detail::check_reduce(OpKind::reduce, dt, op, rank_, size());
  detail::check_peer(OpKind::reduce, root, "root", rank_, size());
  detail::check_buffer(OpKind::reduce, send, count, "send", rank_, size());
  if (rank_ == root) detail::check_buffer(OpKind::reduce, recv, count, "recv", rank_, size());
  detail::record_ring(stats_, OpKind::reduce, count * size_of(dt), size());
  auto call = make_call(OpKind::reduce, send, recv, count, dt, op);
  call.root = root;
  return collective(std::move(call));
}

ZEROTK_RUNTIME_INLINE Work ThreadsCommunicator::all_to_all(const void* send, void* recv, std::size_t count, DType dt) {
  check_buffers(OpKind::all_to_all, send, recv, total(count));
  detail::check_not_in_place(OpKind::all_to_all, send, recv, count, rank_, size());
  detail::record_ring(stats_, OpKind::all_to_all, total(count) * size_of(dt), size());
  return collective(make_call(OpKind::all_to_all, send, recv, count, dt, ReduceOp::sum));
}

ZEROTK_RUNTIME_INLINE Work ThreadsCommunicator::all_to_all_v(const void* send, std::span<const std::size_t> send_counts,
                                                             void* recv, std::span<const std::size_t> recv_counts,
                                                             DType dt) {
  constexpr OpKind k = OpKind::all_to_all_v;
  const auto v = detail::check_v_counts(send_counts, recv_counts, rank_, size());
  detail::check_buffer(k, send, v.sent, "send", rank_, size());
  detail::check_buffer(k, recv, v.received, "recv", rank_, size());
  detail::check_not_in_place(k, send, recv, v.sent + v.received, rank_, size());
  detail::record(stats_, k, v.sent * size_of(dt), all_to_all_v_wire_bytes(send_counts, rank_, size_of(dt)));
  auto call = make_call(k, send, recv, v.sent, dt, ReduceOp::sum);
  const auto row = detail::v_count_row(send_counts, recv_counts);
  call.counts.assign(row.begin(), row.end());
  return collective(std::move(call));
}

ZEROTK_RUNTIME_INLINE Work ThreadsCommunicator::send(const void* buf, std::size_t count, DType dt, int peer, int tag) {
  detail::check_peer(OpKind::send, peer, "peer", rank_, size());
  detail::check_tag(OpKind::send, tag, rank_, size());
  detail::check_buffer(OpKind::send, buf, count, "buf", rank_, size());
  detail::record(stats_, OpKind::send, count * size_of(dt), count * size_of(dt));
  return p2p(make_call(OpKind::send, buf, nullptr, count, dt, ReduceOp::sum), peer, tag, true);
}

ZEROTK_RUNTIME_INLINE Work ThreadsCommunicator::recv(void* buf, std::size_t count, DType dt, int peer, int tag) {
  detail::check_peer(OpKind::recv, peer, "peer", rank_, size());
  detail::check_tag(OpKind::recv, tag, rank_, size());
  detail::check_buffer(OpKind::recv, buf, count, "buf", rank_, size());
  detail::record(stats_, OpKind::recv, count * size_of(dt), 0);
  return p2p(make_call(OpKind::recv, nullptr, buf, count, dt, ReduceOp::sum), peer, tag, false);
}

ZEROTK_RUNTIME_INLINE Work ThreadsCommunicator::barrier() {
  detail::record(stats_, OpKind::barrier, 0, 0);
  return collective(make_call(OpKind::barrier, nullptr, nullptr, 0, DType::uint8, ReduceOp::sum));
}

ZEROTK_RUNTIME_INLINE ThreadsCommunicator ThreadsCommunicator::split(int color, int key, std::string label) {
  detail::check_color(color, rank_, size());
  detail::threads::Call call;
  call.is_split = true;
  call.color = color;
  call.key = key;
  call.label = std::move(label);
  auto [rv, seq] = detail::threads::post_collective(*group_, rank_, std::move(call));
  queue_->pending.push_back({rv, seq});
  detail::threads::ThreadsWork(group_, static_cast<std::size_t>(rank_), rv, seq, queue_, timeout_ms_).wait();
  std::lock_guard lk(group_->ctx->mu);
  const auto r = static_cast<std::size_t>(rank_);
  return ThreadsCommunicator(rv->split_groups[static_cast<std::size_t>(rv->split_group_of[r])],
                             rv->split_rank_of[r], timeout_ms_);
}

ZEROTK_RUNTIME_INLINE ThreadsCommunicator ThreadsCommunicator::split_node_local() {
  const int rpn = group_->ctx->ranks_per_node;
  return split(rpn > 0 ? world_rank() / rpn : 0, rank_);
}

ZEROTK_RUNTIME_INLINE ThreadsCommunicator ThreadsCommunicator::split_domain_local(
    InnerDomain /*socket or numa: simulated alike*/) {
  const int rpn = group_->ctx->ranks_per_node, rps = group_->ctx->ranks_per_socket;
  const int w = world_rank(), node = rpn > 0 ? w / rpn : 0, local = rpn > 0 ? w % rpn : w;
  return split(node * (group_->ctx->world + 1) + (rps > 0 ? local / rps : 0), rank_);
}

ZEROTK_RUNTIME_INLINE void ThreadsCommunicator::abort(std::string_view reason) {
  auto& ctx = *group_->ctx;
  std::lock_guard lk(ctx.mu);
  if (ctx.abort) return;
  ctx.abort = detail::threads::ErrorInfo{"rank " + std::to_string(world_rank()) + " aborted: " + std::string(reason),
                                         "rank " + std::to_string(world_rank()) + " of world", {}};
  ctx.abort_rank = world_rank();
  ctx.bump_locked();
}

ZEROTK_RUNTIME_INLINE ThreadsCommunicator::ThreadsCommunicator(std::shared_ptr<detail::threads::Group> g,
                                                               int rank, std::int64_t timeout_ms)
    : group_(std::move(g)),
      rank_(rank),
      timeout_ms_(timeout_ms),
      queue_(std::make_shared<detail::threads::RankQueue>()) {}

ZEROTK_RUNTIME_INLINE void ThreadsCommunicator::check_buffers(OpKind k, const void* send, const void* recv,
                                                              std::size_t count) const {
  const std::size_t in = k == OpKind::reduce_scatter ? total(count) : count;
  const std::size_t out = k == OpKind::all_gather ? total(count) : count;
  detail::check_buffer(k, send, in, "send", rank_, size());
  detail::check_buffer(k, recv, out, "recv", rank_, size());
}

ZEROTK_RUNTIME_INLINE detail::threads::Call ThreadsCommunicator::make_call(OpKind k, const void* send, void* recv,
                                                                           std::size_t count, DType dt, ReduceOp op) {
  detail::threads::Call c;
  c.kind = k;
  c.dtype = dt;
  c.op = op;
  c.count = count;
  c.send = static_cast<const std::byte*>(send);
  c.recv = static_cast<std::byte*>(recv);
  return c;
}

ZEROTK_RUNTIME_INLINE Work ThreadsCommunicator::collective(detail::threads::Call call) {
  auto [rv, seq] = detail::threads::post_collective(*group_, rank_, std::move(call));
  queue_->pending.push_back({rv, seq});
  return Work(std::make_unique<detail::threads::ThreadsWork>(group_, static_cast<std::size_t>(rank_), std::move(rv),
                                                             seq, queue_, timeout_ms_));
}

ZEROTK_RUNTIME_INLINE Work ThreadsCommunicator::p2p(detail::threads::Call call, int peer, int tag, bool is_send) {
  auto rv = detail::threads::post_p2p(*group_, rank_, peer, tag, is_send, std::move(call));
  return Work(std::make_unique<detail::threads::ThreadsWork>(group_, is_send ? 0 : 1, std::move(rv), 0, nullptr,
                                                             timeout_ms_));
}

namespace detail::threads {

ZEROTK_RUNTIME_INLINE std::vector<ThreadsCommunicator> Access::make_world(int world, const ThreadsOptions& opts) {
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

ZEROTK_RUNTIME_INLINE Context& Access::context(ThreadsCommunicator& c) { return *c.group_->ctx; }

ZEROTK_RUNTIME_INLINE std::string what_of(const std::exception_ptr& e) {
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
ZEROTK_RUNTIME_INLINE bool fail_rank(Context& ctx, int r, const std::exception_ptr& e) {
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

ZEROTK_RUNTIME_INLINE void mark_exited(Context& ctx, int r) {
  std::lock_guard lk(ctx.mu);
  ctx.exited[static_cast<std::size_t>(r)] = 1;
  ctx.bump_locked();
}

}  // namespace detail::threads

/// The communicators of a new threads world, one per rank, for callers that run their own threads
/// (run_threads is simpler). Without run_threads a rank that stops calling is found by the timeout.
ZEROTK_RUNTIME_INLINE std::vector<ThreadsCommunicator> make_threads_communicators(int world, ThreadsOptions opts) {
  return detail::threads::Access::make_world(world, opts);
}

}  // namespace zerotk::comm
