// Threads communicator: determinism, asynchronous operation, sub-communicators, error detection
// (mismatch, timeout, missing and failing ranks), byte counters and point-to-point matching.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "reference.hpp"
#include "zerotk/comm/grid.hpp"
#include "zerotk/comm/threads.hpp"

namespace test_threads_behaviour {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using comm::OpKind;
using comm::ReduceOp;
using comm::ThreadsCommunicator;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// Runs `fn` on every rank and returns each rank's comm_error message ("" if none was thrown).
template <class F>
std::vector<std::string> comm_errors(int w, F fn, comm::ThreadsOptions opts = {}) {
  return comm::run_threads(
      w,
      [&](ThreadsCommunicator& c) -> std::string {
        try {
          fn(c);
        } catch (const comm_error& e) {
          return e.what();
        }
        return {};
      },
      opts);
}

}  // namespace

TEST_CASE("16-bit sums accumulate in fp32 in rank order and round once") {
  // fp16: 2048 + 1 + 1. Rounding after each step gives 2048 (2049 ties to even); fp32 gives 2050.
  // bf16: 256 + 1 + 1. Step-wise rounding gives 256; fp32 accumulation gives 258.
  const auto out = comm::run_threads(3, [](ThreadsCommunicator& c) {
    const float x16 = c.rank() == 0 ? 2048.f : 1.f;
    const float xb = c.rank() == 0 ? 256.f : 1.f;
    half h(x16), hs;
    bfloat16 b(xb), bs;
    c.all_reduce(&h, &hs, 1, DType::fp16, ReduceOp::sum).wait();
    c.all_reduce(&b, &bs, 1, DType::bf16, ReduceOp::sum).wait();
    return std::pair<float, float>(static_cast<float>(hs), static_cast<float>(bs));
  });
  for (const auto& [h, b] : out) {
    CHECK(h == 2050.f);
    CHECK(b == 258.f);
  }
}

TEST_CASE("avg divides the sum by the world size; max/min propagate NaN and handle inf") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto out = comm::run_threads(4, [&](ThreadsCommunicator& c) {
    const int r = c.rank();
    // element 0: 1,2,3,4   element 1: -inf at rank 2   element 2: NaN at rank 3   element 3: +inf and -inf
    std::vector<float> x = {float(r + 1), r == 2 ? -inf : 0.f, r == 3 ? nan : 1.f, r == 0 ? inf : (r == 1 ? -inf : 0.f)};
    std::vector<float> avg(4), mx(4), mn(4), sum(4);
    c.all_reduce(x.data(), avg.data(), 4, DType::fp32, ReduceOp::avg).wait();
    c.all_reduce(x.data(), mx.data(), 4, DType::fp32, ReduceOp::max).wait();
    c.all_reduce(x.data(), mn.data(), 4, DType::fp32, ReduceOp::min).wait();
    c.all_reduce(x.data(), sum.data(), 4, DType::fp32, ReduceOp::sum).wait();
    return std::vector<std::vector<float>>{avg, mx, mn, sum};
  });
  for (const auto& v : out) {
    CHECK(v[0][0] == 2.5f);
    CHECK(v[1][0] == 4.f);
    CHECK(v[2][0] == 1.f);
    CHECK(v[1][1] == 0.f);
    CHECK(v[2][1] == -inf);
    CHECK(std::isnan(v[1][2]));
    CHECK(std::isnan(v[2][2]));
    CHECK(std::isnan(v[3][2]));
    CHECK(v[1][3] == inf);
    CHECK(v[2][3] == -inf);
    CHECK(std::isnan(v[3][3]));  // inf + -inf
  }
}

TEST_CASE("results are bitwise identical for every arrival order of the ranks") {
  constexpr int w = 4;
  constexpr std::size_t n = 100003;  // several chunks
  std::vector<std::vector<float>> in;
  for (int r = 0; r < w; ++r) in.push_back(test::make_data<float>(5, r, n, false));
  const auto ref = test::reduce_ref(in, n, ReduceOp::sum);
  std::vector<int> order(w);
  std::iota(order.begin(), order.end(), 0);
  int permutations = 0;
  do {
    // Ranks post in `order`: each waits for its turn (no sleeps), posts, and passes the turn on.
    std::atomic<int> turn{0};
    const auto out = comm::run_threads(w, [&](ThreadsCommunicator& c) {
      const int pos = static_cast<int>(std::find(order.begin(), order.end(), c.rank()) - order.begin());
      while (turn.load(std::memory_order_acquire) != pos) std::this_thread::yield();
      std::vector<float> sum(n);
      comm::Work work = c.all_reduce(in[static_cast<std::size_t>(c.rank())].data(), sum.data(), n, DType::fp32,
                                     ReduceOp::sum);
      turn.store(pos + 1, std::memory_order_release);
      work.wait();
      return sum;
    });
    for (const auto& sum : out) CHECK(test::compare_bits("sum", sum.data(), ref.data(), n) == "");
    ++permutations;
  } while (std::next_permutation(order.begin(), order.end()));
  CHECK(permutations == 24);
}

TEST_CASE("several collectives in flight, waited in a different order on every rank") {
  constexpr int w = 3;
  constexpr std::size_t n = 5000;
  std::vector<std::vector<bfloat16>> in;
  for (int r = 0; r < w; ++r) in.push_back(test::make_data<bfloat16>(9, r, w * n, false));
  const auto sum = test::reduce_ref(in, w * n, ReduceOp::sum);
  const auto mx = test::reduce_ref(in, w * n, ReduceOp::max);
  const auto errors = comm::run_threads(w, [&](ThreadsCommunicator& c) {
    const auto r = static_cast<std::size_t>(c.rank());
    const bfloat16* x = in[r].data();
    std::vector<bfloat16> ar(n), rs(n), ag(w * n), bc(x, x + n), a2a(w * n);
    std::vector<comm::Work> works;
    works.push_back(c.all_reduce(x, ar.data(), n, DType::bf16, ReduceOp::sum));
    works.push_back(c.reduce_scatter(x, rs.data(), n, DType::bf16, ReduceOp::max));
    works.push_back(c.all_gather(x, ag.data(), n, DType::bf16));
    works.push_back(c.broadcast(bc.data(), n, DType::bf16, 1));
    works.push_back(c.all_to_all(x, a2a.data(), n, DType::bf16));
    std::vector<std::size_t> idx(works.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::rotate(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(r), idx.end());
    if (r == 1) std::reverse(idx.begin(), idx.end());
    for (std::size_t i : idx) works[i].wait();
    std::vector<std::string> errs;
    errs.push_back(test::compare_bits("all_reduce", ar.data(), sum.data(), n));
    errs.push_back(test::compare_bits("reduce_scatter", rs.data(), mx.data() + r * n, n));
    for (std::size_t s = 0; s < w; ++s) {
      errs.push_back(test::compare_bits("all_gather", ag.data() + s * n, in[s].data(), n));
      errs.push_back(test::compare_bits("all_to_all", a2a.data() + s * n, in[s].data() + r * n, n));
    }
    errs.push_back(test::compare_bits("broadcast", bc.data(), in[1].data(), n));
    return errs;
  });
  for (const auto& rank_errors : errors) {
    for (const auto& e : rank_errors) CHECK_MESSAGE(e.empty(), e);
  }
}

TEST_CASE("waiting on a collective completes the earlier ones of the same communicator") {
  comm::run_threads(2, [](ThreadsCommunicator& c) {
    std::vector<float> a(1000, 1.f), b(1000, 2.f);
    comm::Work wa = c.all_reduce(a.data(), a.data(), a.size(), DType::fp32, ReduceOp::sum);
    comm::Work wb = c.all_reduce(b.data(), b.data(), b.size(), DType::fp32, ReduceOp::sum);
    CHECK(wa.pending());
    wb.wait();
    CHECK(wa.test());  // already complete: test() does not block and returns true
    CHECK_FALSE(wa.pending());
    CHECK(a[999] == 2.f);
    CHECK(b[0] == 4.f);
    comm::Work done;
    CHECK(done.test());
  });
}

TEST_CASE("one waiting rank completes an operation for everyone; test() polls without blocking") {
  std::atomic<bool> finished_by_rank0{false};
  comm::run_threads(2, [&](ThreadsCommunicator& c) {
    std::vector<std::int32_t> x(300000, c.rank() + 1), y(300000, 0);  // several chunks
    comm::Work w = c.all_reduce(x.data(), y.data(), x.size(), DType::int32, ReduceOp::sum);
    if (c.rank() == 0) {
      w.wait();
      finished_by_rank0.store(true, std::memory_order_release);
    } else {
      while (!finished_by_rank0.load(std::memory_order_acquire)) std::this_thread::yield();
      CHECK(y.front() == 3);  // rank 0 already wrote this rank's output
      CHECK(y.back() == 3);
      CHECK(w.test());
    }
  });
}

TEST_CASE("split: color groups ordered by (key, rank); groups work concurrently and nest") {
  const auto out = comm::run_threads(6, [](ThreadsCommunicator& world) {
    const int r = world.rank();
    ThreadsCommunicator half_group = world.split(r % 2, -r);  // reverse order inside each color
    ThreadsCommunicator pair = half_group.split(half_group.rank() / 2, 0);
    std::int32_t x = r, sum_half = 0, sum_pair = 0, sum_world = 0;
    comm::Work a = half_group.all_reduce(&x, &sum_half, 1, DType::int32, ReduceOp::sum);
    comm::Work b = world.all_reduce(&x, &sum_world, 1, DType::int32, ReduceOp::sum);
    comm::Work d = pair.all_reduce(&x, &sum_pair, 1, DType::int32, ReduceOp::sum);
    d.wait();
    b.wait();
    a.wait();
    return std::vector<int>{half_group.rank(), half_group.size(), half_group.world_rank(), sum_half, sum_world,
                            pair.size(), sum_pair};
  });
  // color 0: world ranks 4, 2, 0 (key -r); color 1: 5, 3, 1
  const int expected_rank[6] = {2, 2, 1, 1, 0, 0};
  const int expected_pair_sum[6] = {0, 1, 2 + 4, 3 + 5, 2 + 4, 3 + 5};  // pairs {4,2},{0} and {5,3},{1}
  const int expected_pair_size[6] = {1, 1, 2, 2, 2, 2};
  for (int r = 0; r < 6; ++r) {
    const auto& v = out[static_cast<std::size_t>(r)];
    CHECK(v[0] == expected_rank[r]);
    CHECK(v[1] == 3);
    CHECK(v[2] == r);
    CHECK(v[3] == (r % 2 == 0 ? 0 + 2 + 4 : 1 + 3 + 5));
    CHECK(v[4] == 15);
    CHECK(v[5] == expected_pair_size[r]);
    CHECK(v[6] == expected_pair_sum[r]);
  }
}

TEST_CASE("split_node_local groups world ranks by simulated node") {
  comm::ThreadsOptions opts;
  opts.ranks_per_node = 4;
  const auto out = comm::run_threads(
      6,
      [](ThreadsCommunicator& c) {
        ThreadsCommunicator node = c.split_node_local();
        return std::pair<int, int>(node.rank(), node.size());
      },
      opts);
  for (int r = 0; r < 6; ++r) {
    CHECK(out[static_cast<std::size_t>(r)].first == r % 4);
    CHECK(out[static_cast<std::size_t>(r)].second == (r < 4 ? 4 : 2));
  }
  const auto one_node = comm::run_threads(3, [](ThreadsCommunicator& c) { return c.split_node_local().size(); });
  CHECK(one_node == std::vector<int>{3, 3, 3});
}

TEST_CASE("mismatched collectives raise comm_error on every rank, naming the ranks and their calls") {
  struct Mismatch {
    const char* name;
    void (*odd)(ThreadsCommunicator&, std::vector<float>&);
    const char* odd_text;
  };
  const auto normal = [](ThreadsCommunicator& c, std::vector<float>& x) {
    c.all_reduce(x.data(), x.data(), 8, DType::fp32, ReduceOp::sum).wait();
  };
  const Mismatch cases[] = {
      {"op kind", [](ThreadsCommunicator& c, std::vector<float>& x) { c.all_gather(x.data(), x.data(), 2, DType::fp32).wait(); },
       "all_gather(count 2, fp32)"},
      {"count", [](ThreadsCommunicator& c, std::vector<float>& x) { c.all_reduce(x.data(), x.data(), 7, DType::fp32, ReduceOp::sum).wait(); },
       "all_reduce(count 7, fp32, sum)"},
      {"dtype", [](ThreadsCommunicator& c, std::vector<float>& x) { c.all_reduce(x.data(), x.data(), 8, DType::int32, ReduceOp::sum).wait(); },
       "all_reduce(count 8, int32, sum)"},
      {"reduce op", [](ThreadsCommunicator& c, std::vector<float>& x) { c.all_reduce(x.data(), x.data(), 8, DType::fp32, ReduceOp::max).wait(); },
       "all_reduce(count 8, fp32, max)"},
  };
  for (const auto& m : cases) {
    INFO("mismatch in ", m.name);
    const auto errors = comm_errors(3, [&](ThreadsCommunicator& c) {
      std::vector<float> x(8, 1.f);
      if (c.rank() == 2) {
        m.odd(c, x);
      } else {
        normal(c, x);
      }
    });
    for (const auto& e : errors) {  // the roster shows the calls posted when the mismatch was found
      CHECK(contains(e, "mismatched collective #0 on world"));
      CHECK(contains(e, "all_reduce(count 8, fp32, sum)"));
      CHECK(contains(e, std::string("rank 2: ") + m.odd_text));
    }
  }
  // roots differ; afterwards the communicator refuses further work instead of drifting
  const auto errors = comm_errors(2, [](ThreadsCommunicator& c) {
    float x = 1.f;
    try {
      c.broadcast(&x, 1, DType::fp32, c.rank()).wait();
    } catch (const comm_error& e) {
      CHECK(contains(e.what(), "root 0"));
      CHECK(contains(e.what(), "root 1"));
    }
    c.barrier().wait();
  });
  for (const auto& e : errors) CHECK(contains(e, "unusable after an earlier error"));
}

TEST_CASE("a rank that never arrives is reported by the timeout, naming it and what it is doing") {
  comm::ThreadsOptions opts;
  opts.timeout_ms = 100;
  const auto errors = comm_errors(
      2,
      [](ThreadsCommunicator& c) {
        if (c.rank() == 0) {
          c.barrier().wait();
        } else {
          c.set_timeout_ms(600000);  // rank 0 times out first, and sees rank 1 blocked in its recv
          float x = 0;
          c.recv(&x, 1, DType::fp32, 0, 3).wait();  // rank 0 never sends: a deadlock without the timeout
        }
      },
      opts);
  CHECK(contains(errors[0], "timed out after 100 ms in barrier() #0 on world: rank 1 has not called it"));
  CHECK(contains(errors[0], "now waiting in recv(count 1, fp32) send/recv rank 0 -> rank 1, tag 3"));
  CHECK(contains(errors[1], "rank 0 returned from its function without calling recv(count 1, fp32)"));
}

TEST_CASE("on a process grid, errors name the group by role and every rank by its world rank too") {
  // Issue 57 item 1: groups were all "world/split(color N)" and ranks their index in the group, so a
  // message from a tensor or data group named a healthy process or none.
  comm::ThreadsOptions opts;
  opts.timeout_ms = 100;
  std::vector<std::string> names(4);
  const auto errors = comm_errors(
      4,
      [&](ThreadsCommunicator& c) {
        comm::ProcessGrid grid(c, {.tensor = 2});  // tp-dp-pp: world rank = tensor + 2 * data
        names[static_cast<std::size_t>(c.rank())] = grid.tensor().name() + " | " + grid.data().name() + " | " +
                                                     grid.pipeline().name() + " | " + grid.model().name();
        if (c.rank() == 3) return;  // tensor 1 of data 1 leaves without its tensor group's collective
        float x = 1.f;
        grid.tensor().all_reduce(&x, &x, 1, DType::fp32, ReduceOp::sum).wait();  // world rank 2 fails here
      },
      opts);
  CHECK(names[3] == "world/tensor[data 1, pipeline 0] | world/data[tensor 1, pipeline 0] | "
                    "world/pipeline[tensor 1, data 1] | world/model[data 1]");
  CHECK(names[0] == "world/tensor[data 0, pipeline 0] | world/data[tensor 0, pipeline 0] | "
                    "world/pipeline[tensor 0, data 0] | world/model[data 0]");
  // World rank 2's tensor group is world ranks {2, 3}: its peer, group rank 1, is world rank 3.
  CHECK(contains(errors[2], "rank 1 (world 3) returned from its function without calling "
                            "all_reduce(count 1, fp32, sum) #0 on world/tensor[data 1, pipeline 0]"));
  CHECK(contains(errors[2], "rank 0 (world 2): all_reduce(count 1, fp32, sum)"));  // the roster, too
  CHECK(errors[0].empty());  // the other tensor group completed
  CHECK(errors[1].empty());
}

TEST_CASE("a rank that returned without calling fails its peers at once, not after the timeout") {
  comm::ThreadsOptions opts;
  opts.timeout_ms = 600000;  // a regression would hang this test for 10 minutes, not pass it
  const auto errors = comm_errors(
      3,
      [](ThreadsCommunicator& c) {
        if (c.rank() != 2) c.barrier().wait();
      },
      opts);
  CHECK(contains(errors[0], "rank 2 returned from its function without calling barrier() #0"));
  CHECK(contains(errors[1], "rank 2 returned"));
  CHECK(errors[2].empty());
}

TEST_CASE("a throwing rank releases its peers with a comm_error naming it; run_threads rethrows its exception") {
  comm::ThreadsOptions opts;
  opts.timeout_ms = 600000;
  std::vector<std::string> seen(3);
  const auto body = [&](ThreadsCommunicator& c, bool pending) {
    std::vector<float> x(16, 1.f);
    if (c.rank() == 1) {
      comm::Work w;
      if (pending) w = c.all_reduce(x.data(), x.data(), 16, DType::fp32, ReduceOp::sum);
      throw std::runtime_error("boom");
    }
    try {
      c.all_reduce(x.data(), x.data(), 16, DType::fp32, ReduceOp::sum).wait();
      c.barrier().wait();
    } catch (const comm_error& e) {
      seen[static_cast<std::size_t>(c.rank())] = e.what();
      throw;
    }
  };
  for (bool pending : {false, true}) {
    INFO("rank 1 has a collective pending: ", pending);
    seen.assign(3, "");
    CHECK_THROWS_WITH_AS(comm::run_threads(3, [&](ThreadsCommunicator& c) { body(c, pending); }, opts), "boom",
                         std::runtime_error);
    CHECK(contains(seen[0], "rank 1"));
    CHECK(contains(seen[2], "rank 1"));
  }
}

TEST_CASE("ZEROTK_COMM_TIMEOUT_MS sets the default timeout; bad values are config errors") {
  const char* old = std::getenv("ZEROTK_COMM_TIMEOUT_MS");
  const std::string saved = old ? old : "";
  ::unsetenv("ZEROTK_COMM_TIMEOUT_MS");
  CHECK(comm::ThreadsOptions{}.timeout_ms == 60000);
  ::setenv("ZEROTK_COMM_TIMEOUT_MS", "1234", 1);
  CHECK(comm::ThreadsOptions{}.timeout_ms == 1234);
  CHECK(comm::run_threads(1, [](ThreadsCommunicator& c) { return c.timeout_ms(); }).front() == 1234);
  for (const char* bad : {"0", "-5", "12ms", "x"}) {
    ::setenv("ZEROTK_COMM_TIMEOUT_MS", bad, 1);
    CHECK_THROWS_AS(comm::ThreadsOptions{}, config_error);
  }
  if (old) {
    ::setenv("ZEROTK_COMM_TIMEOUT_MS", saved.c_str(), 1);
  } else {
    ::unsetenv("ZEROTK_COMM_TIMEOUT_MS");
  }
}

TEST_CASE("argument errors are usage errors thrown by the calling rank before anything is posted") {
  CHECK_THROWS_AS(comm::run_threads(0, [](ThreadsCommunicator&) {}), usage_error);
  comm::run_threads(2, [](ThreadsCommunicator& c) {
    std::uint8_t b[8] = {};
    float f[8] = {};
    const std::size_t counts_short[1] = {1};
    CHECK_THROWS_AS(c.all_reduce(b, b, 8, DType::uint8, ReduceOp::avg), usage_error);
    CHECK_THROWS_AS(c.broadcast(f, 8, DType::fp32, 2), usage_error);
    CHECK_THROWS_AS(c.reduce(f, f, 8, DType::fp32, ReduceOp::sum, -1), usage_error);
    CHECK_THROWS_AS(c.all_reduce(nullptr, f, 8, DType::fp32, ReduceOp::sum), usage_error);
    CHECK_THROWS_AS(c.all_gatherv(f, 1, f, counts_short, DType::fp32), usage_error);
    CHECK_THROWS_AS(c.all_to_all(f, f, 4, DType::fp32), usage_error);
    CHECK_THROWS_AS(c.send(f, 1, DType::fp32, 5, 0), usage_error);
    CHECK_THROWS_AS(c.recv(f, 1, DType::fp32, 0, -1), usage_error);  // tags are >= 0, as in MPI
    CHECK_THROWS_AS(c.split(-1, 0), usage_error);
    // nothing was posted: the next collective still matches on both ranks
    c.all_reduce(f, f, 8, DType::fp32, ReduceOp::sum).wait();
    c.all_reduce(nullptr, nullptr, 0, DType::fp32, ReduceOp::sum).wait();  // zero elements: null is fine
  });
}

TEST_CASE("byte counters follow the ring conventions of OpCounters") {
  constexpr int w = 4;
  const auto stats = comm::run_threads(w, [](ThreadsCommunicator& c) {
    std::vector<half> x(40), y(40);
    const std::size_t counts[w] = {1, 2, 3, 4};
    c.all_reduce(x.data(), y.data(), 10, DType::fp16, ReduceOp::sum).wait();
    c.reduce_scatter(x.data(), y.data(), 10, DType::fp16, ReduceOp::sum).wait();
    c.all_gather(x.data(), y.data(), 10, DType::fp16).wait();
    c.all_gatherv(x.data(), counts[c.rank()], y.data(), counts, DType::fp16).wait();
    c.broadcast(x.data(), 10, DType::fp16, 0).wait();
    c.reduce(x.data(), y.data(), 10, DType::fp16, ReduceOp::sum, 0).wait();
    c.all_to_all(x.data(), y.data(), 10, DType::fp16).wait();
    const int right = (c.rank() + 1) % w, left = (c.rank() + w - 1) % w;
    comm::Work s = c.send(x.data(), 10, DType::fp16, right, 0);
    c.recv(y.data(), 10, DType::fp16, left, 0).wait();
    s.wait();
    c.barrier().wait();
    return c.stats();
  });
  const std::size_t next_count[w] = {2, 3, 4, 1};
  for (int r = 0; r < w; ++r) {
    const comm::CommStats& s = stats[static_cast<std::size_t>(r)];
    const auto expect = [&](OpKind k, std::uint64_t payload, std::uint64_t wire) {
      INFO("rank ", r, ", ", comm::to_string(k));
      CHECK(s[k].calls == 1);
      CHECK(s[k].payload_bytes == payload);
      CHECK(s[k].wire_bytes == wire);
    };
    expect(OpKind::all_reduce, 20, 30);       // 2 (W-1)/W * 20
    expect(OpKind::reduce_scatter, 80, 60);   // W * 10 * 2 bytes, (W-1)/W of it
    expect(OpKind::all_gather, 80, 60);
    expect(OpKind::all_gatherv, 20, (10 - next_count[r]) * 2);  // all but the next rank's block
    expect(OpKind::broadcast, 20, 20);
    expect(OpKind::reduce, 20, 20);
    expect(OpKind::all_to_all, 80, 60);
    expect(OpKind::send, 20, 20);
    expect(OpKind::recv, 20, 0);
    expect(OpKind::barrier, 0, 0);
    CHECK(s.total_wire_bytes() == 30 + 60 + 60 + (10 - next_count[r]) * 2 + 20 + 20 + 60 + 20);
  }
}

TEST_CASE("ZeRO step volume: reduce-scatter + all-gather of Psi elements move 2 Psi (W-1)/W per rank") {
  constexpr std::size_t psi = 6 * 1024;  // divisible by 2W for W = 1, 2, 3
  for (int w : {1, 2, 3}) {
    const auto stats = comm::run_threads(w, [](ThreadsCommunicator& c) {
      const std::size_t part = psi / static_cast<std::size_t>(c.size());
      std::vector<half> flat(psi);
      c.reduce_scatter(flat.data(), flat.data() + c.rank() * part, part, DType::fp16, ReduceOp::avg).wait();
      c.all_gather(flat.data() + c.rank() * part, flat.data(), part, DType::fp16).wait();
      comm::CommStats s = c.stats();
      c.stats().reset();
      CHECK(c.stats().total_wire_bytes() == 0);
      return s;
    });
    for (const auto& s : stats) {
      CHECK(s.total_wire_bytes() == 2 * psi * 2 * static_cast<std::size_t>(w - 1) / static_cast<std::size_t>(w));
      CHECK(s.total_payload_bytes() == 2 * psi * 2);
    }
  }
}

TEST_CASE("send/recv: matched per tag in posting order; different tags complete independently") {
  comm::run_threads(2, [](ThreadsCommunicator& c) {
    std::int32_t a = 11, b = 22, c5a = 51, c5b = 52;
    if (c.rank() == 0) {
      comm::Work w1 = c.send(&a, 1, DType::int32, 1, 1);
      comm::Work w2 = c.send(&b, 1, DType::int32, 1, 2);
      comm::Work w3 = c.send(&c5a, 1, DType::int32, 1, 5);
      comm::Work w4 = c.send(&c5b, 1, DType::int32, 1, 5);
      w4.wait();
      w1.wait();
      w3.wait();
      w2.wait();
    } else {
      std::int32_t x = 0, y = 0, first = 0, second = 0;
      c.recv(&y, 1, DType::int32, 0, 2).wait();  // tag 2 before tag 1
      c.recv(&x, 1, DType::int32, 0, 1).wait();
      comm::Work r1 = c.recv(&first, 1, DType::int32, 0, 5);
      comm::Work r2 = c.recv(&second, 1, DType::int32, 0, 5);
      r2.wait();
      r1.wait();
      CHECK(x == 11);
      CHECK(y == 22);
      CHECK(first == 51);  // same tag: posting order
      CHECK(second == 52);
    }
    std::int32_t self_in = 7 + c.rank(), self_out = 0;  // a rank may send to itself
    comm::Work s = c.send(&self_in, 1, DType::int32, c.rank(), 9);
    c.recv(&self_out, 1, DType::int32, c.rank(), 9).wait();
    s.wait();
    CHECK(self_out == 7 + c.rank());
  });
  const auto errors = comm_errors(2, [](ThreadsCommunicator& c) {
    float x[4] = {};
    if (c.rank() == 0) {
      c.send(x, 4, DType::fp32, 1, 0).wait();
    } else {
      c.recv(x, 3, DType::fp32, 0, 0).wait();
    }
  });
  for (const auto& e : errors) {
    CHECK(contains(e, "mismatched send/recv rank 0 -> rank 1, tag 0"));
    CHECK(contains(e, "send(count 4, fp32)"));
    CHECK(contains(e, "recv(count 3, fp32)"));
  }
}

TEST_CASE("a Work dropped without wait() does not lose its error: run_threads rethrows it") {
  // The hostile-input report: 4 ranks, one with a different count, nobody waits. Before, every
  // ~Work swallowed the mismatch and run_threads returned with the data unreduced.
  std::vector<std::vector<float>> data(4, std::vector<float>(1000, 1.f));
  std::string what;
  try {
    comm::run_threads(4, [&](ThreadsCommunicator& c) {
      auto& b = data[static_cast<std::size_t>(c.rank())];
      comm::Work w = c.all_reduce(b.data(), b.data(), c.rank() == 1 ? 999 : 1000, DType::fp32, ReduceOp::sum);
      (void)w;  // destroyed unfinished
    });
  } catch (const comm_error& e) {
    what = e.what();
  }
  CHECK(contains(what, "mismatched collective #0 on world"));
  CHECK(contains(what, "all_reduce(count 999, fp32, sum)"));
  CHECK(data[0][0] == 1.f);  // nothing was reduced: the error is the only correct outcome

  // Assigning over an unfinished Work drops it too.
  what.clear();
  try {
    comm::run_threads(2, [&](ThreadsCommunicator& c) {
      float x = 1.f;
      comm::Work w = c.broadcast(&x, 1, DType::fp32, c.rank());  // roots differ
      w = comm::Work();
    });
  } catch (const comm_error& e) {
    what = e.what();
  }
  CHECK(contains(what, "root 0"));
  CHECK(contains(what, "root 1"));

  // An error the rank met afterwards (and chose to handle) is known: run_threads does not rethrow.
  std::vector<std::string> later(2);
  CHECK_NOTHROW(comm::run_threads(2, [&](ThreadsCommunicator& c) {
    float x = 1.f;
    { comm::Work w = c.all_reduce(&x, &x, c.rank() == 0 ? 1 : 0, DType::fp32, ReduceOp::sum); }
    try {
      c.barrier().wait();
    } catch (const comm_error& e) {
      later[static_cast<std::size_t>(c.rank())] = e.what();
    }
  }));
  for (const auto& e : later) CHECK(contains(e, "unusable after an earlier error: mismatched collective #0"));
}

TEST_CASE("deadlines saturate: ZEROTK_COMM_TIMEOUT_MS=9223372036854775807 means never, not at once") {
  using Clock = std::chrono::steady_clock;
  const auto t = Clock::now();
  CHECK(comm::deadline_after(INT64_MAX, t) == Clock::time_point::max());
  CHECK(comm::deadline_after(INT64_MAX / 1000, t) == Clock::time_point::max());  // ms -> ns overflows too
  CHECK(comm::deadline_after(1500, t) == t + std::chrono::milliseconds(1500));
  CHECK(comm::deadline_after(0, t) == t);
  CHECK(comm::deadline_after(-1, t) == t);

  const char* old = std::getenv("ZEROTK_COMM_TIMEOUT_MS");
  const std::string saved = old ? old : "";
  ::setenv("ZEROTK_COMM_TIMEOUT_MS", "9223372036854775807", 1);
  const auto sums = comm::run_threads(3, [](ThreadsCommunicator& c) {
    CHECK(c.timeout_ms() == INT64_MAX);
    std::int32_t x = c.rank() + 1;
    c.all_reduce(&x, &x, 1, DType::int32, ReduceOp::sum).wait();  // timed out at once before the fix
    comm::Work w = c.barrier();
    while (!w.test()) {
    }
    ThreadsCommunicator sub = c.split(0, c.rank());
    sub.all_reduce(&x, &x, 1, DType::int32, ReduceOp::max).wait();
    return x;
  });
  CHECK(sums == std::vector<std::int32_t>{6, 6, 6});
  if (old) {
    ::setenv("ZEROTK_COMM_TIMEOUT_MS", saved.c_str(), 1);
  } else {
    ::unsetenv("ZEROTK_COMM_TIMEOUT_MS");
  }
}

}  // namespace test_threads_behaviour
