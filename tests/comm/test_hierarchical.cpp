// Topologies (comm/topology.hpp) and the hierarchical collectives (comm/hierarchical.hpp) on the
// threads back end: bitwise equal to the flat collectives on integer-valued data, bitwise run to
// run for a fixed topology, and bytes and ring steps per link level as docs/comm.md gives them.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "reference.hpp"
#include "zerotk/comm/any.hpp"
#include "zerotk/comm/hierarchical.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/comm/topology.hpp"

namespace test_hierarchical {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using comm::OpKind;
using comm::ReduceOp;
using comm::ThreadsCommunicator;
using comm::Topology;
using comm::TopologyOptions;

namespace {

TopologyOptions nodes_of(int ranks_per_node) {
  TopologyOptions o;
  o.levels = 2;
  o.ranks_per_node = ranks_per_node;
  return o;
}

TopologyOptions sockets_of(int ranks_per_node, int ranks_per_socket) {
  TopologyOptions o = nodes_of(ranks_per_node);
  o.levels = 3;
  o.ranks_per_socket = ranks_per_socket;
  return o;
}

TopologyOptions node_map(std::vector<int> map) {
  TopologyOptions o;
  o.levels = 2;
  o.node_of_rank = std::move(map);
  return o;
}

}  // namespace

TEST_CASE("topology: coordinates, fanouts, packed order and link levels") {
  const Topology two = Topology::from_groups({{0, 0, 0, 0, 1, 1, 1, 1}});
  CHECK(two.levels() == 2);
  CHECK(two.fanout(0) == 4);
  CHECK(two.fanout(1) == 2);
  CHECK(two.hierarchical());
  CHECK(two.describe() == "2 nodes x 4 ranks");
  CHECK(two.coordinate(5, 0) == 1);
  CHECK(two.coordinate(5, 1) == 1);
  CHECK(two.packed_index(5) == 3);  // (c0 = 1) * 2 + (c1 = 1): local index slowest
  CHECK(two.packed_index(4) == 1);
  CHECK(two.link_level(0, 3) == 0);
  CHECK(two.link_level(3, 4) == 1);
  CHECK(two.link_level(2, 2) == -1);
  CHECK(two.link_name(1) == "inter-node");

  // Interleaved nodes: {0, 2, 4, 6} and {1, 3, 5, 7}; the node ids themselves do not matter.
  const Topology odd = Topology::from_groups({{7, 3, 7, 3, 7, 3, 7, 3}});
  CHECK(odd.fanout(0) == 4);
  CHECK(odd.coordinate(3, 0) == 1);  // second rank of the node holding rank 1
  CHECK(odd.coordinate(3, 1) == 1);
  CHECK(odd.link_level(0, 1) == 1);

  // Three levels: socket ids are read within their node (socket 0 of node 0 is not socket 0 of node 1).
  const Topology three = Topology::from_groups({{0, 0, 1, 1, 0, 0, 1, 1}, {0, 0, 0, 0, 1, 1, 1, 1}});
  CHECK(three.levels() == 3);
  CHECK(three.describe() == "2 nodes x 2 sockets x 2 ranks");
  CHECK(three.coordinate(6, 0) == 0);
  CHECK(three.coordinate(6, 1) == 1);
  CHECK(three.coordinate(6, 2) == 1);
  CHECK(three.link_level(0, 1) == 0);
  CHECK(three.link_level(1, 2) == 1);
  CHECK(three.link_level(3, 4) == 2);
  CHECK(three.link_name(1) == "inter-socket");

  const Topology one_node = Topology::from_groups({{0, 0, 0}});
  CHECK_FALSE(one_node.hierarchical());  // one node: nothing to gain
  CHECK_FALSE(Topology::flat(4).hierarchical());

  CHECK_THROWS_WITH_AS(Topology::from_groups({{0, 0, 0, 1}}),
                       doctest::Contains("communication.topology: hierarchical collectives need the same number of "
                                         "ranks in every node (got node 0: 3, node 1: 1)"),
                       config_error);
  CHECK_THROWS_WITH_AS(Topology::from_groups({{0, 0, 1, 1, 0, 0}, {0, 0, 0, 0, 1, 1}}),
                       doctest::Contains("same number of sockets in every node"), config_error);
}

TEST_CASE("topology: declared, mapped or detected on threads; bad options name their key") {
  comm::ThreadsOptions sim;
  sim.ranks_per_node = 2;  // the threads back end's simulated nodes, seen through split_node_local()
  comm::run_threads(
      4,
      [](ThreadsCommunicator& c) {
        // sockets: one per node unless simulated (below)
        CHECK(comm::detect_topology(c, sockets_of(0, 0)) == Topology::from_groups({{0, 0, 1, 1}, {0, 0, 1, 1}}));
        CHECK(comm::detect_topology(c, sockets_of(0, 0)).hierarchical());
        const Topology detected = comm::detect_topology(c, nodes_of(0));
        CHECK(detected == Topology::from_groups({{0, 0, 1, 1}}));
        CHECK(comm::detect_topology(c, nodes_of(2)) == detected);
        CHECK(comm::detect_topology(c, node_map({5, 5, 9, 9})) == detected);
        CHECK(comm::detect_topology(c, TopologyOptions{}) == Topology::flat(4));
        CHECK(comm::detect_topology(c, sockets_of(4, 2)) ==
              Topology::from_groups({{0, 0, 1, 1}, {0, 0, 0, 0}}));
        // A grid's data group {0, 2} / {1, 3}: placed by the world's map.
        const std::vector<int> mine = comm::locate(c, node_map({0, 0, 1, 1}));
        ThreadsCommunicator data = c.split(c.rank() % 2, c.rank());
        CHECK(comm::gather_topology(data, mine) == Topology::from_groups({{0, 1}}));
      },
      sim);

  auto fails = [](TopologyOptions o, const char* text) {
    CAPTURE(text);
    CHECK_THROWS_WITH_AS(comm::run_threads(4, [&](ThreadsCommunicator& c) { (void)comm::detect_topology(c, o); }),
                         doctest::Contains(text), config_error);
  };
  TopologyOptions zero;
  zero.levels = 0;
  fails(zero, "at communication.topology: must be 1 (flat), 2 (node -> world) or 3");
  fails(node_map({0, 0, 1}), "at communication.topology.node_of_rank: must give one entry for each of the 4 ranks (got 3 entries)");
  fails(node_map({0, -1, 1, 1}), "communication.topology.node_of_rank[1]: ids must be >= 0");
  fails(nodes_of(3), "communication.topology.ranks_per_node: must divide the world size (4) (got 3)");
  fails(node_map({0, 0, 0, 1}), "same number of ranks in every node");
  // A communicator that cannot tell nodes or sockets (type-erased here) is told what to declare.
  CHECK_THROWS_WITH_AS(comm::run_threads(4,
                                         [&](ThreadsCommunicator& c) {
                                           comm::AnyCommunicator any(c);
                                           (void)comm::detect_topology(any, sockets_of(4, 0));
                                         }),
                       doctest::Contains("this communicator cannot detect sockets (Open MPI and the threads back end "
                                         "can); give ranks_per_socket or socket_of_rank"),
                       config_error);
  CHECK_THROWS_WITH_AS(comm::run_threads(4,
                                         [&](ThreadsCommunicator& c) {
                                           comm::AnyCommunicator any(c);
                                           (void)comm::detect_topology(any, nodes_of(0));
                                         }),
                       doctest::Contains("cannot detect nodes; give ranks_per_node or node_of_rank"), config_error);
  // Simulated sockets: 8 ranks = 2 nodes x 2 sockets x 2, all detected.
  comm::ThreadsOptions sockets;
  sockets.ranks_per_node = 4;
  sockets.ranks_per_socket = 2;
  comm::run_threads(
      8, [](ThreadsCommunicator& c) { CHECK(comm::detect_topology(c, sockets_of(0, 0)) == comm::detect_topology(c, sockets_of(4, 2))); },
      sockets);
  // What zerotk-config checks without a communicator.
  CHECK(comm::declared_topology(sockets_of(4, 2), 8) == Topology::from_groups({{0, 0, 1, 1, 0, 0, 1, 1}, {0, 0, 0, 0, 1, 1, 1, 1}}));
  CHECK_FALSE(comm::declared_topology(nodes_of(0), 8).has_value());
  CHECK_THROWS_WITH_AS(comm::declared_topology(node_map({0, 0, 0, 1}), 4), doctest::Contains("(got node 0: 3, node 1: 1)"),
                       config_error);
  TopologyOptions socket_without_level = nodes_of(2);
  socket_without_level.ranks_per_socket = 1;
  fails(socket_without_level, "communication.topology.levels: a socket level needs levels 3");
}

namespace {

struct Outputs {
  std::vector<std::vector<char>> flat, hier;  // per rank, raw bytes
};

template <class T>
std::vector<char> bytes_of(const std::vector<T>& v) {
  const auto* p = reinterpret_cast<const char*>(v.data());
  return {p, p + v.size() * sizeof(T)};
}

/// Runs one kind of collective flat and hierarchically over 8 thread ranks; returns both per rank
/// (and checks that the in-place form gives the hierarchical bits).
template <class T>
Outputs flat_and_hier(OpKind kind, ReduceOp op, const TopologyOptions& topo, std::size_t n, bool exact,
                      std::uint64_t seed = 7) {
  Outputs out;
  out.flat.resize(8);
  out.hier.resize(8);
  comm::run_threads(8, [&](ThreadsCommunicator& c) {
    comm::HierarchicalCommunicator h(c, comm::detect_topology(c, topo));
    const int w = c.size();
    const std::size_t in = kind == OpKind::reduce_scatter ? n * static_cast<std::size_t>(w) : n;
    const std::size_t res = kind == OpKind::all_gather ? n * static_cast<std::size_t>(w) : n;
    const auto x = test::make_data<T>(seed, c.rank(), in, exact);
    std::vector<T> flat(res), hier(res);
    const DType dt = dtype_of_v<T>;
    if (kind == OpKind::reduce_scatter) {
      c.reduce_scatter(x.data(), flat.data(), n, dt, op).wait();
      h.reduce_scatter(x.data(), hier.data(), n, dt, op).wait();
      // in place (the ZeRO layout): recv = send + rank * n
      std::vector<T> inplace = x;
      T* mine = inplace.data() + static_cast<std::size_t>(c.rank()) * n;
      h.reduce_scatter(inplace.data(), mine, n, dt, op).wait();
      CHECK(test::compare_bits("in place", mine, hier.data(), n) == "");
    } else if (kind == OpKind::all_gather) {
      c.all_gather(x.data(), flat.data(), n, dt).wait();
      h.all_gather(x.data(), hier.data(), n, dt).wait();
      std::vector<T> inplace(res);
      std::copy(x.begin(), x.end(), inplace.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(c.rank()) * n));
      h.all_gather(inplace.data() + static_cast<std::size_t>(c.rank()) * n, inplace.data(), n, dt).wait();
      CHECK(test::compare_bits("in place", inplace.data(), hier.data(), res) == "");
    } else {
      c.all_reduce(x.data(), flat.data(), n, dt, op).wait();
      h.all_reduce(x.data(), hier.data(), n, dt, op).wait();
      std::vector<T> inplace = x;
      h.all_reduce(inplace.data(), inplace.data(), n, dt, op).wait();
      CHECK(test::compare_bits("in place", inplace.data(), hier.data(), n) == "");
    }
    out.flat[static_cast<std::size_t>(c.rank())] = bytes_of(flat);
    out.hier[static_cast<std::size_t>(c.rank())] = bytes_of(hier);
  });
  return out;
}

const std::vector<std::pair<const char*, TopologyOptions>>& topologies() {
  static const std::vector<std::pair<const char*, TopologyOptions>> t = {
      {"2 nodes x 4", nodes_of(4)},
      {"4 nodes x 2", nodes_of(2)},
      {"2 x 2 sockets x 2", sockets_of(4, 2)},
      {"interleaved nodes", node_map({0, 1, 0, 1, 0, 1, 0, 1})},
  };
  return t;
}

}  // namespace

TEST_CASE_TEMPLATE("hierarchical reduce-scatter, all-gather and all-reduce equal the flat ones bit for bit on "
                   "integer-valued data",
                   T, float, half, bfloat16, std::int32_t) {
  for (const auto& [name, topo] : topologies()) {
    CAPTURE(name);
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
      CAPTURE(comm::to_string(op));
      for (OpKind kind : {OpKind::reduce_scatter, OpKind::all_reduce}) {
        CAPTURE(comm::to_string(kind));
        // 1003: the all-reduce pads to a multiple of W / s_top; 0 and 1 elements too
        for (std::size_t n : {std::size_t{1003}, std::size_t{1}, std::size_t{0}}) {
          const Outputs o = flat_and_hier<T>(kind, op, topo, n, true);
          CHECK(o.hier == o.flat);
        }
      }
    }
    const Outputs g = flat_and_hier<T>(OpKind::all_gather, ReduceOp::sum, topo, 37, false);
    CHECK(g.hier == g.flat);  // a gather moves bits: any data
  }
}

TEST_CASE("hierarchical collectives on real-valued data: bitwise run to run, close to flat, and the same on every rank") {
  for (const auto& [name, topo] : topologies()) {
    CAPTURE(name);
    for (OpKind kind : {OpKind::reduce_scatter, OpKind::all_reduce}) {
      const Outputs a = flat_and_hier<float>(kind, ReduceOp::avg, topo, 4099, false, 11);
      const Outputs b = flat_and_hier<float>(kind, ReduceOp::avg, topo, 4099, false, 11);
      CHECK(a.hier == b.hier);
      for (std::size_t r = 0; r < 8; ++r) {
        const auto* h = reinterpret_cast<const float*>(a.hier[r].data());
        const auto* f = reinterpret_cast<const float*>(a.flat[r].data());
        const std::size_t n = a.hier[r].size() / sizeof(float);
        bool close = true;
        for (std::size_t i = 0; i < n; ++i) close = close && std::abs(h[i] - f[i]) <= 1e-6f * (1 + std::abs(f[i]));
        CHECK(close);
        if (kind == OpKind::all_reduce) CHECK(a.hier[r] == a.hier[0]);  // one result, gathered
      }
    }
  }
}

TEST_CASE("hierarchical collectives: bytes and ring steps per link level (8 ranks = 2 nodes x 4) match docs/comm.md") {
  constexpr std::size_t n = 1000, m = 4096, e = sizeof(float);  // per-rank block; all-reduce count
  comm::run_threads(8, [&](ThreadsCommunicator& c) {
    comm::HierarchicalCommunicator h(c, comm::detect_topology(c, nodes_of(4)));
    const Topology& t = h.topology();
    std::vector<float> big(8 * n, 1.0f), block(n, 1.0f), ar(m, 1.0f);

    h.reduce_scatter(big.data(), block.data(), n, DType::fp32, ReduceOp::avg).wait();
    const comm::LinkStats rs = h.link_stats();
    // level 0 (inside the node, L = 4): the packed W*n buffer; level 1 (across N = 2 nodes): 1/L of it
    CHECK(rs[0] == comm::LinkCounters{1, 3, 3 * 2 * n * e});   // (L-1) * N * n elements
    CHECK(rs[1] == comm::LinkCounters{1, 1, 1 * n * e});       // (N-1) * n elements
    h.reset_link_stats();
    h.all_gather(block.data(), big.data(), n, DType::fp32).wait();
    CHECK(h.link_stats() == rs);  // the mirror image
    h.reset_link_stats();
    h.all_reduce(ar.data(), ar.data(), m, DType::fp32, ReduceOp::sum).wait();
    // reduce-scatter + all-gather inside the node on m, all-reduce across nodes on m / L
    CHECK(h.link_stats()[0] == comm::LinkCounters{2, 6, 2 * 3 * (m / 4) * e});
    CHECK(h.link_stats()[1] == comm::LinkCounters{1, 2, 2 * 1 * (m / 4 / 2) * e});

    // The flat ring over the same ranks: everything a rank sends goes to rank + 1, across nodes
    // for ranks 3 and 7: (W-1) * n elements and W-1 steps on one inter-node link.
    const comm::LinkStats flat = comm::flat_ring_links(t, OpKind::reduce_scatter, 8 * n * e, c.rank());
    const int cross = c.rank() % 4 == 3 ? 1 : 0;
    CHECK(flat[cross] == comm::LinkCounters{1, 7, 7 * n * e});
    CHECK(flat[1 - cross] == comm::LinkCounters{});
    if (cross == 1) CHECK(flat[1].wire_bytes == 7 * rs[1].wire_bytes);  // 7x the inter-node bytes of the hierarchy

    // stats(): the hierarchical operations counted as the flat ones, so the engine's byte totals do
    // not change: what h adds to c's counters equals what the same three flat calls add.
    const comm::CommStats before = c.stats();
    c.reduce_scatter(big.data(), block.data(), n, DType::fp32, ReduceOp::avg).wait();
    c.all_gather(block.data(), big.data(), n, DType::fp32).wait();
    c.all_reduce(ar.data(), ar.data(), m, DType::fp32, ReduceOp::sum).wait();
    for (OpKind k : {OpKind::reduce_scatter, OpKind::all_gather, OpKind::all_reduce}) {
      CAPTURE(comm::to_string(k));
      CHECK(h.stats()[k].wire_bytes - c.stats()[k].wire_bytes == c.stats()[k].wire_bytes - before[k].wire_bytes);
      CHECK(h.stats()[k].calls - c.stats()[k].calls == 1);
    }
  });
}

TEST_CASE("hierarchical collectives: three levels (2 nodes x 2 sockets x 2) per link level") {
  constexpr std::size_t n = 64, e = sizeof(half);
  comm::run_threads(8, [&](ThreadsCommunicator& c) {
    comm::HierarchicalCommunicator h(c, comm::detect_topology(c, sockets_of(4, 2)));
    std::vector<half> big(8 * n, half(1.0f)), block(n);
    h.reduce_scatter(big.data(), block.data(), n, DType::fp16, ReduceOp::sum).wait();
    CHECK(static_cast<float>(block[0]) == 8.0f);
    // payload P_l = W n e / prod_{j<l} s_j; wire (s_l - 1) / s_l * P_l; one step per level
    CHECK(h.link_stats()[0] == comm::LinkCounters{1, 1, 4 * n * e});
    CHECK(h.link_stats()[1] == comm::LinkCounters{1, 1, 2 * n * e});
    CHECK(h.link_stats()[2] == comm::LinkCounters{1, 1, 1 * n * e});
    // split() gives a flat communicator over the subset
    auto half_world = h.split(c.rank() / 4, c.rank());
    CHECK_FALSE(half_world.topology().hierarchical());
    CHECK(half_world.size() == 4);
  });
}

TEST_CASE("hierarchical collectives: checks before anything starts") {
  comm::run_threads(4, [](ThreadsCommunicator& c) {
    comm::HierarchicalCommunicator h(c, comm::detect_topology(c, nodes_of(2)));
    std::vector<std::uint8_t> b(8);
    CHECK_THROWS_AS(h.all_reduce(b.data(), b.data(), 8, DType::uint8, ReduceOp::avg), usage_error);
    CHECK_THROWS_AS(h.reduce_scatter(nullptr, b.data(), 2, DType::uint8, ReduceOp::sum), usage_error);
    c.barrier().wait();  // nothing was posted
    CHECK_THROWS_AS(comm::HierarchicalCommunicator(c, Topology::flat(3)), usage_error);
  });
}

}  // namespace test_hierarchical
