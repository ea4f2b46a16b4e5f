#pragma once
// zerotk/comm/detail/threads_engine_impl.hpp (internal)
// The threads back end's matching, job building and progress (threads_engine.hpp describes them):
// included by threads_engine.hpp in header-only mode, compiled once in zerotk::runtime with
// ZEROTK_COMPILED_RUNTIME=1 (zerotk/core/runtime.hpp).

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "zerotk/comm/detail/checks.hpp"
#include "zerotk/comm/detail/reduce.hpp"
#include "zerotk/comm/detail/stream_store.hpp"
#include "zerotk/comm/detail/threads_engine.hpp"
#include "zerotk/comm/timeout.hpp"
#include "zerotk/core/error.hpp"

namespace zerotk::comm::detail::threads {

[[noreturn]] ZEROTK_RUNTIME_INLINE void ErrorInfo::raise() const { throw comm_error(message, where, value); }

ZEROTK_RUNTIME_INLINE bool has_reduce_op(OpKind k) noexcept {
  return k == OpKind::all_reduce || k == OpKind::reduce_scatter || k == OpKind::reduce;
}
ZEROTK_RUNTIME_INLINE bool has_root(OpKind k) noexcept { return k == OpKind::broadcast || k == OpKind::reduce; }

// "all_reduce(count 1000, fp32, sum)", "broadcast(count 7, bf16, root 2)", "split(color 1, key 0)".
ZEROTK_RUNTIME_INLINE std::string describe(const Call& c) {
  if (c.is_split) return "split(color " + std::to_string(c.color) + ", key " + std::to_string(c.key) + ")";
  std::string s(to_string(c.kind));
  if (c.kind == OpKind::barrier) return s + "()";
  const auto list = [&](std::size_t first, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(c.counts[first + i]);
  };
  if (c.kind == OpKind::all_gatherv) {
    s += "(counts [";
    list(0, c.counts.size());
    s += "]";
  } else if (c.kind == OpKind::all_to_all_v) {
    const std::size_t w = c.counts.size() / 2;
    s += "(send counts [";
    list(0, w);
    s += "], recv counts [";
    list(w, w);
    s += "]";
  } else {
    s += "(count " + std::to_string(c.count);
  }
  s += ", ";
  s += to_string(c.dtype);
  if (has_reduce_op(c.kind)) (s += ", ") += to_string(c.op);
  if (has_root(c.kind)) s += ", root " + std::to_string(c.root);
  return s + ")";
}

// "#5". (Not `"#" + std::to_string(n)`: GCC 12 warns -Wrestrict on it, a false positive.)
ZEROTK_RUNTIME_INLINE std::string seq_label(std::uint64_t seq) {
  std::string s = "#";
  s += std::to_string(seq);
  return s;
}

// Calls that may meet in one collective.
ZEROTK_RUNTIME_INLINE bool same_signature(const Call& a, const Call& b) noexcept {
  if (a.is_split || b.is_split) return a.is_split == b.is_split;
  if (a.kind != b.kind) return false;
  if (a.kind == OpKind::barrier) return true;
  if (a.dtype != b.dtype) return false;
  if (a.kind == OpKind::all_gatherv) return a.counts == b.counts;
  if (a.kind == OpKind::all_to_all_v) return true;  // counts differ by design: checked when all arrived
  if (a.count != b.count) return false;
  if (has_reduce_op(a.kind) && a.op != b.op) return false;
  if (has_root(a.kind) && a.root != b.root) return false;
  return true;
}

// Reduces (or, with one input, copies) `ins` into each of `outs`; outs[k] belongs to owners[k].
ZEROTK_RUNTIME_INLINE void Job::add(std::span<const std::byte* const> ins, std::span<std::byte* const> outs,
                                    std::span<const int> owners, std::size_t n) {
  if (n == 0 || outs.empty()) return;
  segments.push_back({static_cast<std::uint32_t>(in.size()), static_cast<std::uint32_t>(ins.size()),
                      static_cast<std::uint32_t>(out.size()), static_cast<std::uint32_t>(outs.size()), n});
  in.insert(in.end(), ins.begin(), ins.end());
  out.insert(out.end(), outs.begin(), outs.end());
  out_owner.insert(out_owner.end(), owners.begin(), owners.end());
}

// Copies `n` elements from `src` to `dst` (rank `owner`'s buffer); nothing when they coincide.
ZEROTK_RUNTIME_INLINE void Job::add_copy(const std::byte* src, std::byte* dst, int owner, std::size_t n) {
  if (src != dst) add(std::span<const std::byte* const>(&src, 1), std::span<std::byte* const>(&dst, 1),
                      std::span<const int>(&owner, 1), n);
}

// Distinct bytes read plus bytes written: an input that several segments copy (all_gather to
// every rank, broadcast) counts once.
ZEROTK_RUNTIME_INLINE std::size_t Job::footprint_bytes() const {
  std::vector<std::pair<const std::byte*, std::size_t>> inputs;
  std::size_t written = 0;
  for (const Segment& seg : segments) {
    written += seg.n * elem * seg.nout;
    for (std::uint32_t k = 0; k < seg.nin; ++k) inputs.emplace_back(in[seg.in_first + k], seg.n * elem);
  }
  std::sort(inputs.begin(), inputs.end());
  inputs.erase(std::unique(inputs.begin(), inputs.end()), inputs.end());
  std::size_t read = 0;
  for (const auto& x : inputs) read += x.second;
  return read + written;
}

ZEROTK_RUNTIME_INLINE void Job::cut(int world) {
  const std::size_t step = std::max<std::size_t>(1, kChunkBytes / elem);
  const auto w = static_cast<std::size_t>(world);
  std::vector<std::uint32_t> owner;  // per chunk
  for (std::uint32_t s = 0; s < segments.size(); ++s) {
    const Segment& seg = segments[s];
    const std::size_t count = (seg.n + step - 1) / step;
    for (std::size_t i = 0; i < count; ++i) {
      owner.push_back(seg.nout == 1 ? static_cast<std::uint32_t>(out_owner[seg.out_first])
                                    : static_cast<std::uint32_t>(i * w / count));
      chunks.push_back({s, i * step, std::min((i + 1) * step, seg.n)});
    }
  }
  // An operation that does not fit in the last-level cache evicts its own outputs before anyone
  // reads them: write them without the read for ownership. Smaller ones keep ordinary stores,
  // which leave the outputs in the cache for the reader.
  std::size_t upper = 0;  // footprint counting shared inputs once per segment: an upper bound
  for (const Segment& seg : segments) upper += seg.n * elem * (seg.nin + seg.nout);
  stream = streams(upper) && streams(footprint_bytes());  // small jobs skip the exact count
  head.assign(w + 1, 0);  // counting sort of the chunks by owner
  for (std::uint32_t o : owner) ++head[o + 1];
  for (std::size_t r = 0; r < w; ++r) head[r + 1] += head[r];
  tail.assign(head.begin() + 1, head.end());
  head.pop_back();
  order.resize(chunks.size());
  std::vector<std::size_t> fill(head);
  for (std::uint32_t c = 0; c < owner.size(); ++c) order[fill[owner[c]]++] = c;
}

// The next chunk for `rank` to compute: its own first, then the others' from the back. Lock held.
ZEROTK_RUNTIME_INLINE std::size_t Job::claim(int rank) {
  const std::size_t w = head.size();
  const auto own = static_cast<std::size_t>(rank);
  if (head[own] < tail[own]) return order[head[own]++];
  for (std::size_t k = 1; k < w; ++k) {
    const std::size_t r = (own + k) % w;
    if (head[r] < tail[r]) return order[--tail[r]];
  }
  return npos;
}

// Computes chunk `c`. With `stream`, fences before returning: the caller publishes the chunk as
// done next.
ZEROTK_RUNTIME_INLINE void Job::run(std::size_t c) const {
  const Chunk& ch = chunks[c];
  const Segment& s = segments[ch.segment];
  if (reduce) {
    reduce_rows(dtype, op, in.data() + s.in_first, s.nin, out.data() + s.out_first, s.nout, ch.begin,
                ch.end - ch.begin, divisor, stream);
  } else {
    const std::byte* src = in[s.in_first] + ch.begin * elem;
    const std::size_t bytes = (ch.end - ch.begin) * elem;
    for (std::uint32_t k = 0; k < s.nout; ++k) {
      std::byte* dst = out[s.out_first + k] + ch.begin * elem;
      if (stream) {
        stream_copy(dst, src, bytes);
      } else {
        std::memcpy(dst, src, bytes);
      }
    }
  }
  if (stream) stream_fence();
}

// "#5" or "send/recv rank 0 -> rank 1, tag 3" (built only for messages).
ZEROTK_RUNTIME_INLINE std::string Rendezvous::label() const {
  if (!is_p2p) return seq_label(seq);
  return "send/recv rank " + std::to_string(role_rank[0]) + " -> rank " + std::to_string(role_rank[1]) + ", tag " +
         std::to_string(tag);
}

// Waits until the epoch moves or `deadline` passes. Called and returns with `lk` held.
// Polls with sched_yield for a short while first: a peer on the same core runs at once, one on
// another core is seen within a microsecond, and no futex sleep/wake pair is paid. Measured on a
// loaded 2-core machine: 4 KiB all_reduce on 2 ranks 5 us with it, 50-110 us with a pause-spin
// or none. The short budget keeps idle ranks from burning the cores others need.
ZEROTK_RUNTIME_INLINE void Context::wait_locked(std::unique_lock<std::mutex>& lk, Clock::time_point deadline) {
  constexpr auto kPollBeforeSleep = std::chrono::microseconds(20);
  const std::uint64_t e = epoch.load(std::memory_order_relaxed);
  lk.unlock();
  const auto poll_end = std::min(deadline, Clock::now() + kPollBeforeSleep);
  for (int i = 0; epoch.load(std::memory_order_acquire) == e; ++i) {
    std::this_thread::yield();
    if ((i & 3) == 3 && Clock::now() >= poll_end) break;
  }
  lk.lock();
  if (epoch.load(std::memory_order_relaxed) != e) return;
  ++sleepers;
  const auto moved = [&] { return epoch.load(std::memory_order_relaxed) != e; };
  if (deadline == Clock::time_point::max()) {
    cv.wait(lk, moved);
  } else {
    cv.wait_until(lk, deadline, moved);
  }
  --sleepers;
}

ZEROTK_RUNTIME_INLINE std::string Group::rank_list(const std::vector<int>& ranks) const {
  return detail::rank_list(ranks, world_ranks, ctx->world);
}

ZEROTK_RUNTIME_INLINE std::string Group::where(const std::vector<int>& ranks) const {
  return rank_list(ranks) + " of " + name + " (" + std::to_string(size()) + " ranks)";
}

ZEROTK_RUNTIME_INLINE std::shared_ptr<Group> make_group(std::shared_ptr<Context> ctx, std::string name,
                                                        std::vector<int> world_ranks) {
  auto g = std::make_shared<Group>();
  const std::size_t n = world_ranks.size();
  g->ctx = std::move(ctx);
  g->name = std::move(name);
  g->world_ranks = std::move(world_ranks);
  g->next_seq.assign(n, 0);
  g->last_call.resize(n);
  return g;
}

// Fails a rendezvous that is not ready and breaks its group. Lock held.
ZEROTK_RUNTIME_INLINE void fail_locked(Group& g, Rendezvous& rv, ErrorInfo info) {
  if (rv.ready || rv.done || rv.error) return;
  if (!g.broken) {
    g.broken = ErrorInfo{"communicator unusable after an earlier error: " + info.message, info.where, info.value};
  }
  rv.error = std::move(info);
  g.ctx->bump_locked();
}

// The calls posted so far and the roles still missing, for error messages.
ZEROTK_RUNTIME_INLINE std::string roster(const Group& g, const Rendezvous& rv) {
  std::string s;
  for (std::size_t r = 0; r < rv.roles(); ++r) {
    if (!s.empty()) s += "; ";
    s += g.rank_list({rv.role_rank[r]}) + ": ";
    if (rv.calls[r]) {
      s += describe(*rv.calls[r]);
    } else {
      const int wr = g.world_ranks[static_cast<std::size_t>(rv.role_rank[r])];
      const auto& last = g.last_call[static_cast<std::size_t>(rv.role_rank[r])];
      s += "not called (last call on this group: ";
      s += last ? seq_label(last->first) + " " + describe(last->second) : std::string("none");
      const std::string& in = g.ctx->waiting_in[static_cast<std::size_t>(wr)];
      if (!in.empty()) s += "; now waiting in " + in;
      s += ")";
    }
  }
  return s;
}

ZEROTK_RUNTIME_INLINE std::vector<int> missing_ranks(const Rendezvous& rv) {
  std::vector<int> m;
  for (std::size_t r = 0; r < rv.roles(); ++r) {
    if (!rv.calls[r]) m.push_back(rv.role_rank[r]);
  }
  return m;
}

// "all_reduce(count 10, fp32, sum) #5 on world": the call a role made, for messages. Lock held.
ZEROTK_RUNTIME_INLINE std::string what_locked(const Group& g, const Rendezvous& rv, std::size_t role) {
  return describe(*rv.calls[role]) + " " + rv.label() + " on " + g.name;
}

// Fails a rendezvous that is not ready when it can no longer complete: a failed rank, the waiting
// rank abandoning it, a missing rank that returned, or the deadline. Lock held.
ZEROTK_RUNTIME_INLINE void check_pending_locked(Group& g, Rendezvous& rv, std::size_t role, Clock::time_point deadline,
                                                std::int64_t timeout_ms, bool abandon) {
  Context& ctx = *g.ctx;
  const int my_rank = rv.role_rank[role];
  if (ctx.abort) {
    fail_locked(g, rv, *ctx.abort);
    return;
  }
  if (abandon) {
    // The rank is failing: release every rank of the run, not only this group's.
    ErrorInfo info{g.rank_list({my_rank}) + " abandoned " + what_locked(g, rv, role) +
                       " while its thread was unwinding an exception; " + roster(g, rv),
                   g.where({my_rank}), describe(*rv.calls[role])};
    if (!ctx.abort) {
      ctx.abort = info;
      ctx.abort_rank = g.world_ranks[static_cast<std::size_t>(my_rank)];
    }
    fail_locked(g, rv, std::move(info));
    return;
  }
  for (int r : missing_ranks(rv)) {
    if (ctx.exited[static_cast<std::size_t>(g.world_ranks[static_cast<std::size_t>(r)])]) {
      fail_locked(g, rv,
                  ErrorInfo{g.rank_list({r}) + " returned from its function without calling " +
                                what_locked(g, rv, role) + "; " + roster(g, rv),
                            g.where({r}), describe(*rv.calls[role])});
      return;
    }
  }
  if (Clock::now() >= deadline) {
    const auto missing = missing_ranks(rv);
    fail_locked(g, rv,
                ErrorInfo{"timed out after " + std::to_string(timeout_ms) + " ms in " + what_locked(g, rv, role) +
                              ": " + g.rank_list(missing) + (missing.size() == 1 ? " has" : " have") +
                              " not called it; " + roster(g, rv),
                          g.where(missing), describe(*rv.calls[role])});
  }
}

// Drives `rv` towards completion on behalf of the rank in `role`: computes claimable chunks and,
// if `blocking`, waits until it is done or failed. Returns true when done or failed.
ZEROTK_RUNTIME_INLINE bool drive(Group& g, Rendezvous& rv, std::size_t role, Clock::time_point deadline,
                                 std::int64_t timeout_ms, bool blocking, bool abandon) {
  Context& ctx = *g.ctx;
  std::unique_lock lk(ctx.mu);
  std::string* waiting_in = nullptr;  // this rank's diagnostics entry while it sleeps here
  const auto leave = [&] {
    if (waiting_in) waiting_in->clear();
  };
  for (;;) {
    if (rv.done || rv.error) {
      leave();
      return true;
    }
    if (rv.ready) {
      if (const std::size_t c = rv.job.claim(rv.role_rank[role]); c != Job::npos) {
        lk.unlock();
        rv.job.run(c);  // the job is immutable once ready
        lk.lock();
        if (++rv.chunks_done == rv.job.chunks.size()) {
          rv.done = true;
          ctx.bump_locked();
        }
        continue;
      }
      if (!blocking) return false;
      ctx.wait_locked(lk, Clock::time_point::max());  // the last chunks are being computed elsewhere
      continue;
    }
    check_pending_locked(g, rv, role, deadline, timeout_ms, abandon);
    if (rv.error) continue;
    if (!blocking) return false;
    if (!waiting_in) {
      const auto wr = static_cast<std::size_t>(g.world_ranks[static_cast<std::size_t>(rv.role_rank[role])]);
      waiting_in = &ctx.waiting_in[wr];
      *waiting_in = what_locked(g, rv, role);
    }
    ctx.wait_locked(lk, deadline);
  }
}

// build_collective_job's all_gather / all_gatherv: the copies of every rank's block into every
// rank's output.
ZEROTK_RUNTIME_INLINE void add_gather_segments(Rendezvous& rv, int w) {
  const Call& c0 = *rv.calls[0];
  Job& job = rv.job;
  const std::size_t n = c0.count;
  const std::size_t eb = job.elem;
  const auto call = [&](int r) -> const Call& { return *rv.calls[static_cast<std::size_t>(r)]; };
  std::vector<std::byte*> outs;
  std::vector<int> owners;
  const auto count_of = [&](int s) {
    return c0.kind == OpKind::all_gather ? n : c0.counts[static_cast<std::size_t>(s)];
  };
  std::size_t total = 0;
  for (int s = 0; s < w; ++s) total += count_of(s);
  // Streamed (Job::cut reaches the same footprint: each input once, W outputs): one segment per
  // source writing every rank's output, so each input is read from memory once, not W times.
  // Cached: one segment per destination, so each rank's chunks write its own buffer.
  const bool fan_out = Job::streams(static_cast<std::size_t>(w + 1) * total * eb);
  std::size_t offset = 0;
  for (int s = 0; s < w; ++s) {
    const std::size_t ns = count_of(s);
    if (fan_out) {
      // A rank's own block needs no copy when its send buffer already sits there (in place).
      const std::byte* src = call(s).send;
      outs.clear(), owners.clear();
      for (int r = 0; r < w; ++r) {
        std::byte* dst = call(r).recv + offset * eb;
        if (dst != src) outs.push_back(dst), owners.push_back(r);
      }
      job.add(std::span<const std::byte* const>(&src, 1), outs, owners, ns);
    } else {
      for (int r = 0; r < w; ++r) job.add_copy(call(s).send, call(r).recv + offset * eb, r, ns);
    }
    offset += ns;
  }
}

// Builds the job of a matched collective from the calls of all ranks (indexed by group rank).
// Copies are one segment per destination, so each rank's chunks write its own buffer (a streamed
// all_gather excepted: see there).
ZEROTK_RUNTIME_INLINE void build_collective_job(Rendezvous& rv, int w) {
  const Call& c0 = *rv.calls[0];
  Job& job = rv.job;
  job.dtype = c0.dtype;
  job.op = c0.op;
  job.elem = size_of(c0.dtype);
  job.divisor = w;
  const std::size_t n = c0.count;
  const std::size_t eb = job.elem;
  const auto call = [&](int r) -> const Call& { return *rv.calls[static_cast<std::size_t>(r)]; };
  std::vector<const std::byte*> ins;
  std::vector<std::byte*> outs;
  std::vector<int> owners;
  switch (c0.kind) {
    case OpKind::all_reduce:
      job.reduce = true;
      for (int r = 0; r < w; ++r) ins.push_back(call(r).send), outs.push_back(call(r).recv), owners.push_back(r);
      job.add(ins, outs, owners, n);
      break;
    case OpKind::reduce_scatter:
      job.reduce = true;
      for (int b = 0; b < w; ++b) {
        ins.clear();
        for (int r = 0; r < w; ++r) ins.push_back(call(r).send + static_cast<std::size_t>(b) * n * eb);
        std::byte* o = call(b).recv;
        job.add(ins, std::span<std::byte* const>(&o, 1), std::span<const int>(&b, 1), n);
      }
      break;
    case OpKind::reduce: {
      job.reduce = true;
      for (int r = 0; r < w; ++r) ins.push_back(call(r).send);
      std::byte* o = call(c0.root).recv;
      job.add(ins, std::span<std::byte* const>(&o, 1), std::span<const int>(&c0.root, 1), n);
      break;
    }
    case OpKind::all_gather:
    case OpKind::all_gatherv:
      add_gather_segments(rv, w);
      break;
    case OpKind::broadcast:
      for (int r = 0; r < w; ++r) job.add_copy(call(c0.root).recv, call(r).recv, r, n);
      break;
    case OpKind::all_to_all:
      for (int s = 0; s < w; ++s) {
        for (int d = 0; d < w; ++d) {
          job.add_copy(call(s).send + static_cast<std::size_t>(d) * n * eb,
                       call(d).recv + static_cast<std::size_t>(s) * n * eb, d, n);
        }
      }
      break;
    case OpKind::all_to_all_v: {
      // Rank s's block for d starts after its blocks for 0..d-1 and lands in d's buffer after the
      // blocks d receives from 0..s-1 (`to[d]` walks them as s grows).
      const auto ws = static_cast<std::size_t>(w);
      std::vector<std::size_t> to(ws, 0);
      for (int s = 0; s < w; ++s) {
        const auto& sc = call(s).counts;
        std::size_t from = 0;
        for (std::size_t d = 0; d < ws; ++d) {
          const int owner = static_cast<int>(d);
          job.add_copy(call(s).send + from * eb, call(owner).recv + to[d] * eb, owner, sc[d]);
          from += sc[d];
          to[d] += call(owner).counts[ws + static_cast<std::size_t>(s)];
        }
      }
      break;
    }
    case OpKind::barrier:
    case OpKind::send:
    case OpKind::recv: break;
  }
  job.cut(w);
}

// Creates the groups of a matched split. Lock held.
ZEROTK_RUNTIME_INLINE void build_split(Group& g, Rendezvous& rv) {
  const int w = g.size();
  std::vector<std::tuple<int, int, int>> order;  // (color, key, old rank)
  for (int r = 0; r < w; ++r) {
    const Call& c = *rv.calls[static_cast<std::size_t>(r)];
    order.emplace_back(c.color, c.key, r);
  }
  std::sort(order.begin(), order.end());
  rv.split_group_of.assign(static_cast<std::size_t>(w), -1);
  rv.split_rank_of.assign(static_cast<std::size_t>(w), -1);
  for (std::size_t i = 0; i < order.size();) {
    const int color = std::get<0>(order[i]);
    // The group's name: the label its members gave (ProcessGrid's roles), else the split's color.
    const std::string& label = rv.calls[static_cast<std::size_t>(std::get<2>(order[i]))]->label;
    std::string name = split_group_name(g.name, color, label);
    std::vector<int> members;
    for (; i < order.size() && std::get<0>(order[i]) == color; ++i) members.push_back(std::get<2>(order[i]));
    std::vector<int> world_ranks;
    const int index = static_cast<int>(rv.split_groups.size());
    for (std::size_t k = 0; k < members.size(); ++k) {
      world_ranks.push_back(g.world_ranks[static_cast<std::size_t>(members[k])]);
      rv.split_group_of[static_cast<std::size_t>(members[k])] = index;
      rv.split_rank_of[static_cast<std::size_t>(members[k])] = static_cast<int>(k);
    }
    rv.split_groups.push_back(
        make_group(g.ctx, std::move(name), std::move(world_ranks)));
  }
}

// Turns a rendezvous whose calls have all arrived into a ready (or done) one. Lock held.
// all_to_all_v: every rank has posted; fails the rendezvous, naming two ranks, when a sender's
// count differs from what its receiver expects.
ZEROTK_RUNTIME_INLINE bool v_counts_agree_locked(Group& g, Rendezvous& rv) {
  const int w = g.size();
  std::vector<std::uint64_t> rows;
  rows.reserve(static_cast<std::size_t>(2 * w * w));
  for (int r = 0; r < w; ++r) {
    const auto& c = rv.calls[static_cast<std::size_t>(r)]->counts;
    rows.insert(rows.end(), c.begin(), c.end());
  }
  const auto x = detail::find_count_disagreement(rows, w);
  if (!x) return true;
  fail_locked(g, rv,
              ErrorInfo{detail::describe(*x) + " (collective " + rv.label() + " on " + g.name + ": " + roster(g, rv) + ")",
                        g.where({x->sender, x->receiver}), std::to_string(x->sent) + " vs " + std::to_string(x->expected)});
  return false;
}

ZEROTK_RUNTIME_INLINE void complete_arrivals_locked(Group& g, Rendezvous& rv, bool p2p) {
  if (!rv.error) {
    if (p2p) {
      const Call& s = *rv.calls[0];
      Job& job = rv.job;
      job.dtype = s.dtype;
      job.elem = size_of(s.dtype);
      job.add_copy(s.send, rv.calls[1]->recv, rv.role_rank[1], s.count);
      job.cut(g.size());
    } else if (rv.calls[0]->is_split) {
      build_split(g, rv);
    } else if (rv.calls[0]->kind == OpKind::all_to_all_v && !v_counts_agree_locked(g, rv)) {
      return;  // failed: every rank's wait raises the disagreement
    } else {
      build_collective_job(rv, g.size());
    }
    rv.ready = true;
    rv.done = rv.job.chunks.empty();
  }
  g.ctx->bump_locked();
}

// Posts rank `rank`'s next collective on `g`; returns its rendezvous and sequence number.
ZEROTK_RUNTIME_INLINE std::pair<std::shared_ptr<Rendezvous>, std::uint64_t> post_collective(Group& g, int rank,
                                                                                            Call call) {
  Context& ctx = *g.ctx;
  std::lock_guard lk(ctx.mu);
  const std::size_t ur = static_cast<std::size_t>(rank);
  const std::uint64_t seq = g.next_seq[ur]++;
  g.last_call[ur].emplace(seq, call);
  auto& slot = g.open[seq];
  if (!slot) {
    slot = std::make_shared<Rendezvous>();
    slot->seq = seq;
    for (int r = 0; r < g.size(); ++r) slot->role_rank.push_back(r);
    slot->calls.resize(static_cast<std::size_t>(g.size()));
    if (g.broken) slot->error = *g.broken;
  }
  std::shared_ptr<Rendezvous> rv = slot;
  if (!rv->error) {
    for (std::size_t r = 0; r < rv->roles(); ++r) {
      if (rv->calls[r] && !same_signature(*rv->calls[r], call)) {
        Rendezvous& x = *rv;
        x.calls[ur] = call;  // show it in the roster
        const std::string msg = "mismatched collective " + x.label() + " on " + g.name + ": " + roster(g, x);
        x.calls[ur].reset();
        fail_locked(g, x, ErrorInfo{msg, g.where({static_cast<int>(r), rank}), describe(call)});
        break;
      }
    }
  }
  rv->calls[ur] = std::move(call);
  if (++rv->arrivals == g.size()) {
    g.open.erase(seq);
    complete_arrivals_locked(g, *rv, false);
  }
  return {std::move(rv), seq};
}

// Posts a send (rank -> peer) or a receive (peer -> rank).
ZEROTK_RUNTIME_INLINE std::shared_ptr<Rendezvous> post_p2p(Group& g, int rank, int peer, int tag, bool is_send,
                                                           Call call) {
  Context& ctx = *g.ctx;
  std::lock_guard lk(ctx.mu);
  const int src = is_send ? rank : peer;
  const int dst = is_send ? peer : rank;
  const std::size_t role = is_send ? 0 : 1;
  auto key = std::make_tuple(src, dst, tag);
  auto& queue = g.p2p_open[key];
  std::shared_ptr<Rendezvous> rv;
  if (!queue.empty() && !queue.front()->calls[role]) {
    rv = queue.front();
    queue.pop_front();
  } else {
    rv = std::make_shared<Rendezvous>();
    rv->is_p2p = true;
    rv->tag = tag;
    rv->role_rank = {src, dst};
    rv->calls.resize(2);
    if (g.broken) rv->error = *g.broken;
    queue.push_back(rv);
  }
  if (queue.empty()) g.p2p_open.erase(key);
  rv->calls[role] = std::move(call);
  if (++rv->arrivals == 2) {
    const Call& s = *rv->calls[0];
    const Call& r = *rv->calls[1];
    if (!rv->error && (s.count != r.count || s.dtype != r.dtype)) {
      fail_locked(g, *rv,
                  ErrorInfo{"mismatched " + rv->label() + " on " + g.name + ": " + roster(g, *rv), g.where({src, dst}),
                            describe(s) + " vs " + describe(r)});
    }
    complete_arrivals_locked(g, *rv, true);
  }
  return rv;
}

// `queue` is null for point-to-point operations: those complete independently of collectives.
ZEROTK_RUNTIME_INLINE ThreadsWork::ThreadsWork(std::shared_ptr<Group> g, std::size_t role,
                                               std::shared_ptr<Rendezvous> rv, std::uint64_t seq,
                                               std::shared_ptr<RankQueue> queue, std::int64_t timeout_ms)
    : g_(std::move(g)),
      role_(role),
      rv_(std::move(rv)),
      seq_(seq),
      queue_(std::move(queue)),
      timeout_ms_(timeout_ms) {}

ZEROTK_RUNTIME_INLINE void ThreadsWork::wait() {
  advance(deadline_after(timeout_ms_), true, false);
  raise_if_failed();
}

ZEROTK_RUNTIME_INLINE bool ThreadsWork::test() {
  if (!first_test_) first_test_ = Clock::now();
  if (!advance(deadline_after(timeout_ms_, *first_test_), false, false)) return false;
  raise_if_failed();
  return true;
}

// Destroyed unfinished while an exception unwinds this rank: give the call up rather than wait
// out the timeout for peers that may never arrive.
ZEROTK_RUNTIME_INLINE void ThreadsWork::abandon() noexcept {
  try {
    advance(deadline_after(timeout_ms_), true, true);
  } catch (...) {
  }
}

// Destroyed unfinished with no exception in flight: finish, and keep a failure for run_threads
// (which rethrows it when the rank's function returned normally).
ZEROTK_RUNTIME_INLINE void ThreadsWork::dropped() noexcept {
  try {
    wait();
  } catch (...) {
    std::lock_guard lk(g_->ctx->mu);
    auto& slot = g_->ctx->unobserved[world_rank()];
    if (!slot) slot = std::current_exception();
  }
}

ZEROTK_RUNTIME_INLINE bool ThreadsWork::advance(Clock::time_point deadline, bool blocking, bool abandon) {
  if (queue_) {
    while (!queue_->pending.empty() && queue_->pending.front().seq <= seq_) {
      auto& e = queue_->pending.front();
      if (!drive(*g_, *e.rv, role_, deadline, timeout_ms_, blocking, abandon)) return false;
      queue_->pending.pop_front();
    }
  }
  return drive(*g_, *rv_, role_, deadline, timeout_ms_, blocking, abandon);
}

ZEROTK_RUNTIME_INLINE std::size_t ThreadsWork::world_rank() const {
  return static_cast<std::size_t>(g_->world_ranks[static_cast<std::size_t>(rv_->role_rank[role_])]);
}

ZEROTK_RUNTIME_INLINE void ThreadsWork::raise_if_failed() const {
  std::lock_guard lk(g_->ctx->mu);
  if (!rv_->error) return;
  g_->ctx->unobserved[world_rank()] = nullptr;  // an error reaches the rank: the earlier one is now known
  rv_->error->raise();
}

}  // namespace zerotk::comm::detail::threads
