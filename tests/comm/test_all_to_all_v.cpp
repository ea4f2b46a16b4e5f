// all_to_all_v on the threads back end (and through AnyCommunicator, the typed helper, a
// hierarchical communicator and a split group): every rank's blocks land where the counts say, bit
// for bit against each rank's regenerated inputs; byte counters count what is sent; counts that
// disagree between two ranks fail on every rank naming both, before anything moves.
#include <doctest/doctest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "reference.hpp"
#include "zerotk/comm/any.hpp"
#include "zerotk/comm/hierarchical.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/comm/typed.hpp"

namespace test_all_to_all_v {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using comm::OpKind;
using comm::ThreadsCommunicator;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Runs one v_case on `c` and returns "" or the first difference.
template <class T, class C>
std::string exchange(C& c, std::uint64_t seed, std::size_t most, DType dt) {
  auto v = test::v_case<T>(seed, c.rank(), c.size(), most);
  std::vector<T> got(v.want.size());
  c.all_to_all_v(v.send.data(), v.send_counts, got.data(), v.recv_counts, dt).wait();
  return test::compare_bits("all_to_all_v", got.data(), v.want.data(), got.size());
}

}  // namespace

TEST_CASE_TEMPLATE("all_to_all_v moves every rank's blocks to where the counts say, bit for bit", T, float, bfloat16,
                   std::int32_t, std::uint8_t) {
  for (int w : {1, 2, 3, 5}) {
    for (std::size_t most : {std::size_t{0}, std::size_t{1}, std::size_t{37}, std::size_t{70000}}) {
      INFO("world ", w, ", at most ", most, " elements per block");
      const auto errors = comm::run_threads(w, [&](ThreadsCommunicator& c) {
        return exchange<T>(c, 11 + most, most, dtype_of_v<T>);
      });
      for (const auto& e : errors) CHECK(e == "");
    }
  }
}

TEST_CASE("all_to_all_v's byte counters: the elements sent, and on the wire all but the rank's own block") {
  comm::run_threads(4, [](ThreadsCommunicator& c) {
    const auto v = test::v_case<float>(5, c.rank(), c.size(), 50);
    std::vector<float> got(v.want.size());
    c.all_to_all_v(v.send.data(), v.send_counts, got.data(), v.recv_counts, DType::fp32).wait();
    const auto sent = std::accumulate(v.send_counts.begin(), v.send_counts.end(), std::uint64_t{0});
    const auto own = v.send_counts[static_cast<std::size_t>(c.rank())];
    CHECK(c.stats()[OpKind::all_to_all_v].calls == 1);
    CHECK(c.stats()[OpKind::all_to_all_v].payload_bytes == sent * 4);
    CHECK(c.stats()[OpKind::all_to_all_v].wire_bytes == (sent - own) * 4);
    CHECK(c.stats().total_wire_bytes() == (sent - own) * 4);  // nothing else: no count exchange here
  });
}

TEST_CASE("all_to_all_v through AnyCommunicator, the typed helper, a hierarchical communicator and a split") {
  const auto errors = comm::run_threads(
      4,
      [](ThreadsCommunicator& c) {
        std::string e;
        comm::AnyCommunicator any(c);
        e += exchange<float>(any, 21, 9, DType::fp32);
        {
          const auto v = test::v_case<std::int32_t>(22, c.rank(), c.size(), 9);
          std::vector<std::int32_t> got(v.want.size());
          comm::all_to_all_v(c, v.send, v.send_counts, got, v.recv_counts).wait();
          e += test::compare_bits("typed", got.data(), v.want.data(), got.size());
          std::vector<std::int32_t> short_recv(got.size() + 1);
          CHECK_THROWS_AS(comm::all_to_all_v(c, v.send, v.send_counts, short_recv, v.recv_counts), usage_error);
        }
        comm::TopologyOptions two_nodes;
        two_nodes.levels = 2;
        two_nodes.ranks_per_node = 2;
        comm::HierarchicalCommunicator h(c, comm::detect_topology(c, two_nodes));
        e += exchange<float>(h, 23, 9, DType::fp32);
        auto half_group = c.split(c.rank() % 2, c.rank());
        e += exchange<float>(half_group, 24 + static_cast<std::uint64_t>(c.rank() % 2), 9, DType::fp32);
        return e;
      });
  for (const auto& e : errors) CHECK(e == "");
}

TEST_CASE("all_to_all_v counts that disagree fail on every rank, naming both ranks, and nothing moves") {
  const auto errors = comm::run_threads(4, [](ThreadsCommunicator& c) -> std::string {
    // Every rank sends 2 elements to every other rank, but rank 3 expects 1 from rank 1.
    std::vector<std::size_t> send_counts(4, 2), recv_counts(4, 2);
    if (c.rank() == 3) recv_counts[1] = 1;
    std::vector<float> send(8, 1.f), recv(8, -7.f);
    std::string what;
    try {
      c.all_to_all_v(send.data(), send_counts, recv.data(), recv_counts, DType::fp32).wait();
    } catch (const comm_error& e) {
      what = e.what();
    }
    for (float x : recv) CHECK(x == -7.f);  // no block was copied
    CHECK_THROWS_AS(c.barrier().wait(), comm_error);  // the communicator refuses further work
    return what;
  });
  for (const auto& e : errors) {
    CHECK(contains(e, "rank 1 sends 2 elements to rank 3, which expects 1 from it"));
    CHECK(contains(e, "ranks 1, 3"));
    CHECK(contains(e, "recv counts [2, 1, 2, 2]"));
  }
}

TEST_CASE("all_to_all_v's local argument errors are usage_error before anything is posted") {
  comm::run_threads(2, [](ThreadsCommunicator& c) {
    std::vector<float> buf(8), out(8);
    const std::vector<std::size_t> two{2, 2}, three{2, 2, 2};
    CHECK_THROWS_AS(c.all_to_all_v(buf.data(), three, out.data(), two, DType::fp32), usage_error);
    CHECK_THROWS_AS(c.all_to_all_v(buf.data(), two, out.data(), three, DType::fp32), usage_error);
    // the block a rank keeps must agree with itself
    std::vector<std::size_t> mine = two;
    mine[static_cast<std::size_t>(c.rank())] = 1;
    CHECK_THROWS_AS(c.all_to_all_v(buf.data(), two, out.data(), mine, DType::fp32), usage_error);
    CHECK_THROWS_AS(c.all_to_all_v(nullptr, two, out.data(), two, DType::fp32), usage_error);
    CHECK_THROWS_AS(c.all_to_all_v(buf.data(), two, nullptr, two, DType::fp32), usage_error);
    CHECK_THROWS_AS(c.all_to_all_v(buf.data(), two, buf.data(), two, DType::fp32), usage_error);
    c.barrier().wait();  // nothing was posted: the ranks still agree
  });
}

}  // namespace test_all_to_all_v
