#pragma once
/// \file zerotk/comm/hierarchical.hpp
/// HierarchicalCommunicator<C>: a Communicator whose reduce_scatter, all_gather and all_reduce run
/// through the levels of a Topology (comm/topology.hpp), Horovod's way, and whose other operations
/// go to the flat communicator it wraps. Every rank ends with exactly the flat collective's block
/// (ZeRO's partition ownership does not change), so checkpoints and resharding are unaffected.
///
///   auto topo = zerotk::comm::detect_topology(world, {.levels = 2, .ranks_per_node = 4});
///   zerotk::comm::HierarchicalCommunicator h(world, topo);   // collective: splits one group per level
///   h.reduce_scatter(send, recv, n, DType::bf16, ReduceOp::avg).wait();
///   h.link_stats()[1].wire_bytes;                             // what crossed nodes
///
/// Algorithms (levels l = 0 innermost .. L-1 top; s_l the fanout, c_l this rank's coordinate; the
/// level-l group is the ranks that differ from this one in c_l only):
/// - reduce_scatter(n per rank): the W send blocks are packed in the topology's packed order (c_0
///   slowest), then for l = 0 .. L-1 each rank reduce-scatters what it holds over its level-l
///   group, keeping the 1/s_l part of its coordinate. Inside a node every rank receives the node's
///   sum for one s_0-th of the blocks; across nodes every local rank reduces its own share in
///   parallel, 1/s_0 of the data each (Horovod). The last level leaves the rank its own block.
/// - all_gather: the mirror image (top level first), then the blocks are unpacked into rank order.
/// - all_reduce(count): reduce-scatter through the inner levels on the buffer padded to a multiple
///   of W/s_top, all-reduce across the top level on the 1/(W/s_top) piece, all-gather back down.
/// sum, avg, max and min: sums go through every level and avg divides by W once at the end, so
/// integer-valued data give the flat collective's bits (and int32 truncates as it does). Floating
/// sums are grouped by level instead of in rank order, and fp16/bf16 round after each level
/// (docs/comm.md); an fp16 sum inside a group can overflow where the flat average would not.
///
/// The phases depend on one another, so a hierarchical operation runs to completion in the call
/// (errors surface there) and returns a completed Work; the other operations stay asynchronous.
/// A scratch buffer as large as the largest operation's full buffer is kept (host memory; the
/// engine's ledger does not see it). Host-memory communicators only: NCCL builds its own rings and
/// trees across nodes.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "zerotk/comm/accounting.hpp"
#include "zerotk/comm/communicator.hpp"
#include "zerotk/comm/detail/checks.hpp"
#include "zerotk/comm/detail/reduce.hpp"
#include "zerotk/comm/topology.hpp"
#include "zerotk/comm/typed.hpp"
#include "zerotk/core/error.hpp"

namespace zerotk::comm {

/// What one rank sent over the links of one level.
struct LinkCounters {
  std::uint64_t calls = 0;       ///< collectives run over this level's group
  std::uint64_t steps = 0;       ///< ring steps (latency terms): s-1 per reduce-scatter / all-gather, 2(s-1) per all-reduce
  std::uint64_t wire_bytes = 0;  ///< ring convention over the level's group (communicator.hpp)
  friend bool operator==(const LinkCounters&, const LinkCounters&) = default;
};

/// LinkCounters by level (0 innermost; Topology::link_name names them).
struct LinkStats {
  std::array<LinkCounters, kMaxTopologyLevels> by_level{};
  LinkCounters& operator[](int level) noexcept { return by_level[static_cast<std::size_t>(level)]; }
  const LinkCounters& operator[](int level) const noexcept { return by_level[static_cast<std::size_t>(level)]; }
  void reset() noexcept { by_level = {}; }
  friend bool operator==(const LinkStats&, const LinkStats&) = default;
};

/// Ring steps of one collective of `kind` over `ranks` ranks (0 for one rank).
constexpr std::uint64_t ring_steps(OpKind kind, int ranks) noexcept {
  if (ranks <= 1) return 0;
  const auto s = static_cast<std::uint64_t>(ranks - 1);
  return kind == OpKind::all_reduce ? 2 * s : s;
}

/// What a flat ring collective of `kind` over `payload_bytes` sends from `rank`, by link level: the
/// ring passes ranks in order, so all of the rank's wire bytes and steps go to rank + 1 (mod W) over
/// one link, whose level the topology says. The baseline the hierarchical counters compare with.
inline LinkStats flat_ring_links(const Topology& t, OpKind kind, std::uint64_t payload_bytes, int rank) {
  LinkStats s;
  if (t.size() <= 1) return s;
  const int level = t.link_level(rank, (rank + 1) % t.size());
  s[level].calls = 1;
  s[level].steps = ring_steps(kind, t.size());
  s[level].wire_bytes = ring_wire_bytes(kind, payload_bytes, t.size());
  return s;
}

/// Copies the W blocks of `block_bytes` each of `send` (rank order) into `out` in the topology's
/// packed order (coordinates with c_0 slowest): what a hierarchical reduce-scatter reduces level by
/// level (also compress/quantized_collectives.hpp's qgZ).
inline void pack_blocks(const Topology& t, const void* send, std::size_t block_bytes, void* out) {
  const auto* in = static_cast<const std::byte*>(send);
  auto* o = static_cast<std::byte*>(out);
  for (int q = 0; q < t.size(); ++q) {
    std::memcpy(o + t.packed_index(q) * block_bytes, in + static_cast<std::size_t>(q) * block_bytes, block_bytes);
  }
}

template <Communicator C>
class HierarchicalCommunicator {
 public:
  /// Refers to `comm` (which must outlive this and every copy). Collective over `comm`: splits one
  /// communicator per level whose fanout exceeds 1. `topology` must describe comm's ranks.
  HierarchicalCommunicator(C& comm, Topology topology)
      : HierarchicalCommunicator(std::shared_ptr<C>(std::shared_ptr<void>(), &comm), std::move(topology)) {}

  /// Owns `comm`.
  static HierarchicalCommunicator owning(C comm, Topology topology) {
    return HierarchicalCommunicator(std::make_shared<C>(std::move(comm)), std::move(topology));
  }

  int rank() const { return s_->flat->rank(); }
  int size() const { return s_->flat->size(); }
  const Topology& topology() const noexcept { return s_->topo; }
  /// What this rank sent through the hierarchical operations, by link level.
  const LinkStats& link_stats() const noexcept { return s_->links; }
  void reset_link_stats() noexcept { s_->links.reset(); }
  C& flat() noexcept { return *s_->flat; }

  Work reduce_scatter(const void* send, void* recv, std::size_t n, DType dt, ReduceOp op) {
    if (!s_->topo.hierarchical()) return s_->flat->reduce_scatter(send, recv, n, dt, op);
    start(OpKind::reduce_scatter, dt, op, send, static_cast<std::size_t>(size()) * n, recv, n);
    if (n == 0) return Work{};
    const std::size_t e = size_of(dt);
    std::byte* buf = pack(send, n * e);
    const ReduceOp stage = op == ReduceOp::avg ? ReduceOp::sum : op;
    std::size_t base = 0, span = static_cast<std::size_t>(size()) * n;  // elements this rank still reduces
    const int last = last_wide_level();
    for (int l = 0; l < s_->topo.levels(); ++l) {
      const int s = s_->topo.fanout(l);
      if (s == 1) continue;
      const std::size_t chunk = span / static_cast<std::size_t>(s);
      const std::size_t mine = base + static_cast<std::size_t>(coord(l)) * chunk;
      void* out = l == last ? recv : buf + mine * e;
      level(l).reduce_scatter(buf + base * e, out, chunk, dt, stage).wait();
      count(l, OpKind::reduce_scatter, span * e);
      base = mine;
      span = chunk;
    }
    if (op == ReduceOp::avg) detail::divide_in_place(recv, n, dt, size());
    return Work{};
  }

  Work all_gather(const void* send, void* recv, std::size_t n, DType dt) {
    if (!s_->topo.hierarchical()) return s_->flat->all_gather(send, recv, n, dt);
    start(OpKind::all_gather, dt, ReduceOp::sum, send, n, recv, static_cast<std::size_t>(size()) * n);
    if (n == 0) return Work{};
    const std::size_t e = size_of(dt);
    std::byte* buf = scratch(static_cast<std::size_t>(size()) * n * e);
    std::memcpy(buf + s_->topo.packed_index(rank()) * n * e, send, n * e);
    // Before level l a rank holds the blocks whose coordinates below l equal its own: a contiguous
    // run of stride(l) blocks in packed order, the l-th of s_l runs of its level-l group.
    for (int l = s_->topo.levels() - 1; l >= 0; --l) {
      const int s = s_->topo.fanout(l);
      if (s == 1) continue;
      const std::size_t chunk = stride(l) * n, start_at = prefix(l) * n;
      level(l).all_gather(buf + (start_at + static_cast<std::size_t>(coord(l)) * chunk) * e, buf + start_at * e, chunk, dt).wait();
      count(l, OpKind::all_gather, static_cast<std::size_t>(s) * chunk * e);
    }
    auto* out = static_cast<std::byte*>(recv);
    for (int q = 0; q < size(); ++q) {
      std::memcpy(out + static_cast<std::size_t>(q) * n * e, buf + s_->topo.packed_index(q) * n * e, n * e);
    }
    return Work{};
  }

  Work all_reduce(const void* send, void* recv, std::size_t count_in, DType dt, ReduceOp op) {
    if (!s_->topo.hierarchical()) return s_->flat->all_reduce(send, recv, count_in, dt, op);
    start(OpKind::all_reduce, dt, op, send, count_in, recv, count_in);
    if (count_in == 0) return Work{};
    const std::size_t e = size_of(dt);
    const int top = s_->topo.levels() - 1;
    const std::size_t pieces = static_cast<std::size_t>(size() / s_->topo.fanout(top));
    const std::size_t padded = (count_in + pieces - 1) / pieces * pieces;
    std::byte* buf = scratch(padded * e);
    std::memcpy(buf, send, count_in * e);
    std::memset(buf + count_in * e, 0, (padded - count_in) * e);
    const ReduceOp stage = op == ReduceOp::avg ? ReduceOp::sum : op;
    std::array<std::size_t, kMaxTopologyLevels> before{}, piece{};  // per inner level: run start, piece size
    std::size_t base = 0, span = padded;
    for (int l = 0; l < top; ++l) {
      const int s = s_->topo.fanout(l);
      if (s == 1) continue;
      const std::size_t chunk = span / static_cast<std::size_t>(s);
      before[static_cast<std::size_t>(l)] = base;
      piece[static_cast<std::size_t>(l)] = chunk;
      const std::size_t mine = base + static_cast<std::size_t>(coord(l)) * chunk;
      level(l).reduce_scatter(buf + base * e, buf + mine * e, chunk, dt, stage).wait();
      count(l, OpKind::reduce_scatter, span * e);
      base = mine;
      span = chunk;
    }
    if (s_->topo.fanout(top) > 1) {
      level(top).all_reduce(buf + base * e, buf + base * e, span, dt, stage).wait();
      count(top, OpKind::all_reduce, span * e);
    }
    if (op == ReduceOp::avg) detail::divide_in_place(buf + base * e, span, dt, size());
    for (int l = top - 1; l >= 0; --l) {
      const int s = s_->topo.fanout(l);
      if (s == 1) continue;
      const std::size_t chunk = piece[static_cast<std::size_t>(l)], at = before[static_cast<std::size_t>(l)];
      level(l).all_gather(buf + (at + static_cast<std::size_t>(coord(l)) * chunk) * e, buf + at * e, chunk, dt).wait();
      count(l, OpKind::all_gather, static_cast<std::size_t>(s) * chunk * e);
    }
    std::memcpy(recv, buf, count_in * e);
    return Work{};
  }

  // ---- the rest: the flat communicator's -------------------------------------------------------
  Work all_gatherv(const void* send, std::size_t n, void* recv, std::span<const std::size_t> counts, DType dt) {
    return s_->flat->all_gatherv(send, n, recv, counts, dt);
  }
  Work broadcast(void* buf, std::size_t n, DType dt, int root) { return s_->flat->broadcast(buf, n, dt, root); }
  Work reduce(const void* send, void* recv, std::size_t n, DType dt, ReduceOp op, int root) {
    return s_->flat->reduce(send, recv, n, dt, op, root);
  }
  Work all_to_all(const void* send, void* recv, std::size_t n, DType dt) { return s_->flat->all_to_all(send, recv, n, dt); }
  Work all_to_all_v(const void* send, std::span<const std::size_t> send_counts, void* recv,
                    std::span<const std::size_t> recv_counts, DType dt) {
    return s_->flat->all_to_all_v(send, send_counts, recv, recv_counts, dt);
  }
  Work send(const void* buf, std::size_t n, DType dt, int peer, int tag) { return s_->flat->send(buf, n, dt, peer, tag); }
  Work recv(void* buf, std::size_t n, DType dt, int peer, int tag) { return s_->flat->recv(buf, n, dt, peer, tag); }
  Work barrier() { return s_->flat->barrier(); }

  /// A flat communicator over the ranks of `color` (the placement of a subset is not tracked).
  HierarchicalCommunicator split(int color, int key) {
    C part = s_->flat->split(color, key);
    const int n = part.size();
    return owning(std::move(part), Topology::flat(n));
  }

  /// The flat communicator's counters plus the hierarchical operations counted as the flat ones
  /// would be (ring convention over W ranks), so a ZeRO step shows the same bytes either way; the
  /// split per level is link_stats().
  const CommStats& stats() const {
    const CommStats& f = s_->flat->stats();
    for (std::size_t k = 0; k < kOpKindCount; ++k) {
      s_->merged.by_op[k].calls = f.by_op[k].calls + s_->own.by_op[k].calls;
      s_->merged.by_op[k].payload_bytes = f.by_op[k].payload_bytes + s_->own.by_op[k].payload_bytes;
      s_->merged.by_op[k].wire_bytes = f.by_op[k].wire_bytes + s_->own.by_op[k].wire_bytes;
    }
    return s_->merged;
  }

 private:
  struct State {
    std::shared_ptr<C> flat;
    Topology topo;
    std::array<std::optional<C>, kMaxTopologyLevels> level;  // groups differing in one coordinate
    std::vector<std::byte> scratch;
    LinkStats links;
    CommStats own, merged;
  };

  HierarchicalCommunicator(std::shared_ptr<C> comm, Topology topology) : s_(std::make_shared<State>()) {
    static_assert(!uses_device_memory<C>,
                  "HierarchicalCommunicator needs a host-memory communicator (NCCL builds its own hierarchy)");
    s_->flat = std::move(comm);
    s_->topo = std::move(topology);
    if (s_->topo.size() != s_->flat->size()) {
      throw usage_error("the topology must describe the communicator's ranks", "zerotk::comm::HierarchicalCommunicator",
                        std::to_string(s_->topo.size()) + " ranks vs " + std::to_string(s_->flat->size()));
    }
    if (!s_->topo.hierarchical()) return;
    for (int l = 0; l < s_->topo.levels(); ++l) {
      if (s_->topo.fanout(l) > 1) s_->level[static_cast<std::size_t>(l)].emplace(s_->flat->split(s_->topo.level_color(rank(), l), coord(l)));
    }
  }

  int coord(int level) const noexcept { return s_->topo.coordinate(rank(), level); }
  C& level(int l) noexcept { return *s_->level[static_cast<std::size_t>(l)]; }

  int last_wide_level() const noexcept {
    int last = 0;
    for (int l = 0; l < s_->topo.levels(); ++l) last = s_->topo.fanout(l) > 1 ? l : last;
    return last;
  }
  /// Blocks per coordinate step at level l in packed order: the product of the fanouts above l.
  std::size_t stride(int l) const noexcept {
    std::size_t s = 1;
    for (int j = l + 1; j < s_->topo.levels(); ++j) s *= static_cast<std::size_t>(s_->topo.fanout(j));
    return s;
  }
  /// Where the run of blocks sharing this rank's coordinates below l starts (in blocks).
  std::size_t prefix(int l) const noexcept {
    std::size_t p = 0;
    for (int j = 0; j < l; ++j) p += static_cast<std::size_t>(coord(j)) * stride(j);
    return p;
  }

  std::byte* scratch(std::size_t bytes) {
    if (s_->scratch.size() < bytes) s_->scratch.resize(bytes);
    return s_->scratch.data();
  }
  /// The W send blocks of `block_bytes` each, in packed order.
  std::byte* pack(const void* send, std::size_t block_bytes) {
    std::byte* buf = scratch(static_cast<std::size_t>(size()) * block_bytes);
    pack_blocks(s_->topo, send, block_bytes, buf);
    return buf;
  }

  /// Checks before anything starts, and the flat-equivalent counters.
  void start(OpKind kind, DType dt, ReduceOp op, const void* send, std::size_t in, void* recv, std::size_t out) {
    if (kind != OpKind::all_gather) detail::check_reduce(kind, dt, op, rank(), size());
    detail::check_buffer(kind, send, in, "send", rank(), size());
    detail::check_buffer(kind, recv, out, "recv", rank(), size());
    const std::size_t payload = (kind == OpKind::all_gather ? out : in) * size_of(dt);
    detail::record_ring(s_->own, kind, payload, size());
  }

  void count(int l, OpKind kind, std::size_t payload_bytes) {
    const int s = s_->topo.fanout(l);
    LinkCounters& c = s_->links[l];
    c.calls += 1;
    c.steps += ring_steps(kind, s);
    c.wire_bytes += ring_wire_bytes(kind, payload_bytes, s);
  }

  std::shared_ptr<State> s_;
};

}  // namespace zerotk::comm
