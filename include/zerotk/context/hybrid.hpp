#pragma once
/// \file zerotk/context/hybrid.hpp
/// a2a+p2p (Megatron's hierarchical context parallelism; USP's Ulysses x ring) over a context group
/// of P = A x R ranks (docs/context.md): Ulysses' all-to-all inside each group of A adjacent context
/// ranks (put them on one node: it moves the most), then the ring across the R such groups, each
/// ring rank holding its a2a group's A chunks for its share of the heads:
///
///   auto g = zerotk::context::split_hybrid(grid.context(), A);        // g.a2a (A ranks), g.ring (R ranks)
///   zerotk::context::Ulysses u(g.a2a, n, d);                          // n tokens per context rank
///   u.seq_to_heads(q, split_heads(H, A), q_a);                       // [A n x H_a x d], and K, V
///   zerotk::context::Ring ring(g.ring, A * n * H_a * d);              // K and V blocks of the super-chunks
///   ring.forward(k_a, v_a, [&](int source, auto kb, auto vb) { ... g.positions(source) ... });
///   u.heads_to_seq(o_a, split_heads(H, A), o);
///
/// `node_a2a_size(grid.context())` gives the A that keeps each a2a group on one node.
///
/// Context rank c = a + A r sits at a = c % A in a2a group r = c / A; its chunk is tokens
/// [c n, (c + 1) n), so after the all-to-all ring rank r holds the contiguous super-chunk
/// [r A n, (r + 1) A n) (HybridGroups::positions). The ring's output for one head is exactly the
/// ring's over R ranks on those super-chunks (the all-to-all only moves rows), and the bytes per
/// rank are the two parts' (SEMANTICS.md section 17): a2a 4 N h (A-1)/(P A) (Q, K, V, O; MHA), ring
/// 2 N h_kv (R-1)/(R A) forward.

#include <cstddef>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/comm/grid.hpp"
#include "zerotk/comm/topology.hpp"
#include "zerotk/core/error.hpp"

namespace zerotk::context {

/// The two groups of a2a+p2p, split from a context group (split_hybrid).
template <comm::Communicator C>
struct HybridGroups {
  C a2a;   ///< the A adjacent context ranks of this rank's a2a group, ordered by context rank
  C ring;  ///< the R ranks at this rank's place in every a2a group, ordered by a2a group
  std::size_t tokens = 0;  ///< n: tokens per context rank (0 until set; positions() needs it)

  /// The global positions of ring rank `source`'s super-chunk: [source A n, (source + 1) A n).
  std::vector<std::size_t> positions(int source) const {
    const std::size_t width = static_cast<std::size_t>(a2a.size()) * tokens;
    std::vector<std::size_t> out(width);
    for (std::size_t i = 0; i < width; ++i) out[i] = static_cast<std::size_t>(source) * width + i;
    return out;
  }
};

/// Splits `context` (P ranks) into a2a groups of `a2a_size` adjacent ranks and the ring across them
/// (collective over `context`); `tokens` per context rank, for positions(). `a2a_size` must divide P.
template <comm::Communicator C>
HybridGroups<C> split_hybrid(C& context, int a2a_size, std::size_t tokens = 0) {
  const int P = context.size(), c = context.rank();
  if (a2a_size < 1 || P % a2a_size != 0) {
    throw usage_error("the a2a (Ulysses) degree must divide the context group's " + std::to_string(P) + " ranks",
                      "zerotk::context::split_hybrid on context rank " + std::to_string(c), std::to_string(a2a_size));
  }
  const int ring_index = c / a2a_size, a2a_index = c % a2a_size;
  C a2a = comm::split_named(context, ring_index, a2a_index, "a2a[ring " + std::to_string(ring_index) + "]");
  C ring = comm::split_named(context, a2a_index, ring_index, "ring[a2a " + std::to_string(a2a_index) + "]");
  return HybridGroups<C>{std::move(a2a), std::move(ring), tokens};
}

/// The a2a degree that keeps each Ulysses group on one node: the context ranks a node holds, read
/// from the back end (MPI's shared-memory split, NCCL's host names, the threads back end's simulated
/// nodes; collective over `context`). Every node must hold the same number of context ranks, in a
/// run of consecutive context indices (true for the grid's context groups under consecutive
/// placement: they are tensor-strided runs of world ranks); otherwise a usage_error names the
/// placement. A node holding the whole group gives P (Ulysses alone); one rank a node gives 1 (the
/// ring alone).
template <comm::Communicator C>
int node_a2a_size(C& context) {
  static_assert(comm::NodeAwareCommunicator<C> || comm::NodeMapCommunicator<C>,
                "zerotk::context::node_a2a_size: the communicator cannot tell nodes apart; give the a2a degree");
  comm::TopologyOptions detect;  // nothing declared: the back end's nodes
  detect.levels = 2;
  const std::vector<int> node = comm::detail::node_ids(context, detect);
  const int P = context.size();
  int run = 0;  // the length of the first node's run
  while (run < P && node[static_cast<std::size_t>(run)] == node[0]) ++run;
  bool even = P % run == 0;
  std::set<int> seen;
  for (int r = 0; r < P && even; r += run) {
    even = seen.insert(node[static_cast<std::size_t>(r)]).second;
    for (int i = r; i < r + run && even; ++i) even = node[static_cast<std::size_t>(i)] == node[static_cast<std::size_t>(r)];
  }
  if (!even) {
    std::string where;
    for (int r = 0; r < P; ++r) where += (r ? " " : "") + std::to_string(node[static_cast<std::size_t>(r)]);
    throw usage_error("the nodes do not hold equal runs of consecutive context ranks; give the a2a degree",
                      "zerotk::context::node_a2a_size on context rank " + std::to_string(context.rank()),
                      "node of each context rank: " + where);
  }
  return run;
}

}  // namespace zerotk::context
