// Pipeline schedules as data, their text form, the simulator's exact figures against the closed
// forms of SEMANTICS.md section 14, the partitioner, and the executor on the threads back end: its
// results against a serial run of the same stage functions, its virtual clock against the
// simulator, and its errors when ranks disagree.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "golden_cases.hpp"
#include "toy_model.hpp"
#include "zerotk/comm/grid.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/pipeline.hpp"

using namespace zerotk;
using namespace zerotk::pipeline;
using zt_test::serial_reference;
using zt_test::Serial;
using zt_test::ToyRank;
using zt_test::toy_shape;

namespace {

// "F0 F1 B0 ..." (chunk written as "F0.1" = micro 0 of chunk 1 when the schedule has chunks).
std::string computes(const Schedule& s, int rank) {
  std::string out;
  for (const Action& a : s.ranks[static_cast<std::size_t>(rank)]) {
    if (!is_compute(a.op)) continue;
    if (!out.empty()) out += ' ';
    out += std::string(to_string(a.op)) + std::to_string(a.micro);
    if (s.chunks > 1) out += "." + std::to_string(a.chunk);
  }
  return out;
}

Schedule gen(std::string_view spec, int p, int m, LowerOptions o = {}) { return make_schedule(ScheduleSpec::parse(spec), p, m, o); }

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot read " << path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

// ---- schedules ------------------------------------------------------------------------------------

TEST_CASE("generators: compute orders as derived by hand") {
  const Schedule g = gen("gpipe", 2, 3);
  CHECK(computes(g, 0) == "F0 F1 F2 B0 B1 B2");
  CHECK(computes(g, 1) == "F0 F1 F2 B0 B1 B2");
  // 1F1B: stage s runs p - s - 1 warm-up forwards (capped at m), then F/B in turn, then the rest.
  const Schedule f = gen("1f1b", 4, 6);
  CHECK(computes(f, 0) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  CHECK(computes(f, 1) == "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5");
  CHECK(computes(f, 3) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  CHECK(computes(gen("1f1b", 4, 2), 0) == "F0 F1 B0 B1");  // warm-up capped at m
  // Interleaved, p 2, v 2, m 4: rank 0 warms up with (p-1)*2 + (v-1)*p = 4 forwards (chunk 0 on
  // micro-batches 0 and 1, then chunk 1), rank 1 with 2; backwards start from the last chunk.
  const Schedule i = gen("interleaved:2", 2, 4);
  CHECK(computes(i, 0) == "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  CHECK(computes(i, 1) == "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
  // ZB-H1, p 3, m 4: 1F1B's warm-up; stage s holds its first s weight gradients back.
  const Schedule z = gen("zbh1", 3, 4);
  CHECK(computes(z, 0) == "F0 F1 F2 BI0 BW0 F3 BI1 BW1 BI2 BW2 BI3 BW3");
  CHECK(computes(z, 1) == "F0 F1 BI0 F2 BI1 BW0 F3 BI2 BW1 BI3 BW2 BW3");
  CHECK(computes(z, 2) == "F0 BI0 F1 BI1 F2 BI2 BW0 F3 BI3 BW1 BW2 BW3");
}

TEST_CASE("lowering: transfers around the computes, engine-facing actions in place") {
  const Schedule s = gen("1f1b", 2, 2);
  CHECK(to_text(s) ==
        "zerotk-pipeline-schedule 1\ngenerator 1f1b\nstages 2\nmicro-batches 2\nchunks 1\n"
        "rank 0\n  gather\n  F m0\n  send-act m0 to 1\n  F m1\n  send-act m1 to 1\n  recv-grad m0 from 1\n  B m0\n"
        "  reduce m0\n  recv-grad m1 from 1\n  B m1\n  reduce m1\n  release\n  step\n"
        "rank 1\n  gather\n  recv-act m0 from 0\n  F m0\n  B m0\n  send-grad m0 to 0\n  reduce m0\n"
        "  recv-act m1 from 0\n  F m1\n  B m1\n  send-grad m1 to 0\n  reduce m1\n  release\n  step\n");
  const Schedule bare = gen("1f1b", 2, 2, {.engine_actions = false});
  for (const auto& list : bare.ranks) {
    for (const Action& a : list) CHECK((is_compute(a.op) || is_transfer(a.op)));
  }
}

TEST_CASE("golden files: the generators write them, their compute orders are the hand-derived ones") {
  const std::string dir = std::string(ZEROTK_TEST_SOURCE_DIR) + "/pipeline/golden/";
  for (const auto& g : zt_test::golden_cases()) {
    CAPTURE(g.file);
    const std::string text = read_file(dir + g.file);
    const Schedule want = gen(g.spec, g.p, g.m);
    const Schedule got = parse_schedule(text);
    CHECK(got == want);
    // The file is the generator's text after its one comment line.
    CHECK(text.substr(text.find('\n') + 1) == to_text(want));
  }
  CHECK(computes(parse_schedule(read_file(dir + "gpipe_p2_m3.txt")), 1) == "F0 F1 F2 B0 B1 B2");
  const Schedule f = parse_schedule(read_file(dir + "1f1b_p3_m4.txt"));
  CHECK(computes(f, 0) == "F0 F1 F2 B0 F3 B1 B2 B3");
  CHECK(computes(f, 1) == "F0 F1 B0 F2 B1 F3 B2 B3");
  CHECK(computes(f, 2) == "F0 B0 F1 B1 F2 B2 F3 B3");
  const Schedule i = parse_schedule(read_file(dir + "interleaved2_p2_m4.txt"));
  CHECK(computes(i, 0) == "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  const Schedule z = parse_schedule(read_file(dir + "zbh1_p3_m4.txt"));
  CHECK(computes(z, 2) == "F0 BI0 F1 BI1 F2 BI2 BW0 F3 BI3 BW1 BW2 BW3");
  // The hand-checked neighbours of a compute: rank 1 of 1F1B receives m0 from rank 0, then sends
  // its output on to rank 2.
  const auto& r1 = f.ranks[1];
  CHECK(r1[1] == Action{Op::recv_activation, 0, 0, 0});
  CHECK(r1[2] == Action{Op::forward, 0, 0, -1});
  CHECK(r1[3] == Action{Op::send_activation, 0, 0, 2});
}

TEST_CASE("text form: round trip over every generator, and errors that name the line") {
  for (std::string_view spec : {"gpipe", "1f1b", "zbh1", "interleaved:2", "interleaved:3"}) {
    for (int p : {1, 2, 3, 4}) {
      for (int m : {1, 2, 4, 6, 8}) {
        const ScheduleSpec sp = ScheduleSpec::parse(spec);
        if (sp.kind == ScheduleKind::interleaved && (p < 2 || m % p != 0)) continue;
        for (bool engine : {true, false}) {
          const Schedule s = make_schedule(sp, p, m, {.engine_actions = engine});
          CHECK(parse_schedule(to_text(s)) == s);
          CHECK(to_text(parse_schedule(to_text(s))) == to_text(s));
        }
      }
    }
  }
  const std::string ok = to_text(gen("1f1b", 2, 1));
  const auto bad = [&](std::string text, const char* what) {
    CAPTURE(text);
    CHECK_THROWS_WITH_AS(parse_schedule(text), doctest::Contains(what), config_error);
  };
  bad("hello\n", "line 1: the first line must be `zerotk-pipeline-schedule 1`");
  bad(std::string(kTextMagic) + "\ngenerator x\nstages two\n", "line 3: stages must be a number >= 0 (got stages two)");
  std::string t = ok;
  t.replace(t.find("F m0"), 4, "FF m0");
  bad(t, "unknown action");
  t = ok;
  t.replace(t.find("send-act m0 to 1"), 16, "send-act m0 1");
  bad(t, "`send-act` needs `to <rank>`");
  t = ok;
  t.replace(t.find("reduce m0"), 9, "reduce");
  bad(t, "`reduce` needs a micro-batch `m<number>`");
  t = ok;
  t.replace(t.find("rank 1"), 6, "rank 3");
  bad(t, "ranks must come in order 0, 1, ...: expected rank 1");
  bad(ok.substr(0, ok.find("rank 1")), "every rank needs its `rank <number>` block (got 1 of 2 ranks)");
  // Well-formed text, inconsistent schedule: a usage_error naming the rank and action.
  t = ok;
  t.replace(t.find("send-act m0 to 1"), 16, "send-act m0 to 0");
  CHECK_THROWS_WITH_AS(parse_schedule(t), doctest::Contains("rank 0, action 2 (send-act m0 to 0): peer must be rank 1"),
                       usage_error);
  t = ok;
  t.replace(t.find("F m0"), 4, "F m0 c1");
  CHECK_THROWS_WITH_AS(parse_schedule(t), doctest::Contains("chunk must be in [0, 1)"), usage_error);
}

TEST_CASE("generators refuse what they cannot run, in words") {
  const auto refused = [](std::string_view spec, int p, int m, const char* what) {
    CAPTURE(spec);
    CHECK_THROWS_WITH_AS(make_schedule(ScheduleSpec::parse(spec), p, m), doctest::Contains(what), config_error);
  };
  refused("interleaved:2", 4, 6,
          "needs the micro-batches per step to be a multiple of the pipeline stages (6 is not a multiple of 4; "
          "Megatron-LM and torch assert the same): use m = 8 or 4 (got p 4, m 6, v 2)");
  refused("interleaved:2", 1, 4, "needs at least 2 pipeline stages");
  refused("interleaved:1", 2, 4, "needs at least 2 model chunks per rank (1 chunk is 1f1b)");
  refused("1f1b", 2, 0, "needs at least 1 micro-batch per step");
  refused("gpipe", 0, 4, "needs at least 1 pipeline stage");
  // p x v past int's range (issue 57 item 6): refused naming the product, not overflowed into a generator.
  refused("interleaved:2000000000", 2, 4, "has more virtual stages (p x v = 4000000000) than any model has layers");
  CHECK_THROWS_WITH_AS(check_runnable({ScheduleKind::one_f_one_b, 2}, 2, 4), doctest::Contains("runs one model chunk per rank"),
                       config_error);
  CHECK_THROWS_WITH_AS(ScheduleSpec::parse("pipedream"), doctest::Contains("unknown schedule (one of gpipe, 1f1b"), config_error);
  CHECK_THROWS_WITH_AS(ScheduleSpec::parse("interleaved:x"), doctest::Contains("needs a chunk count"), config_error);
  CHECK(ScheduleSpec::parse("interleaved:3").chunks == 3);
  CHECK(ScheduleSpec::parse("interleaved:3").name() == "interleaved:3");
  // A hand-edited schedule that claims a generator is held to its rules too.
  Schedule s = gen("interleaved:2", 4, 8);
  s.micro_batches = 10;
  CHECK_THROWS_WITH_AS(simulate(s), doctest::Contains("10 is not a multiple of 4"), config_error);
}

// ---- the simulator ------------------------------------------------------------------------------

TEST_CASE("simulator, unit costs: the bubble of GPipe and 1F1B is exactly (p-1)/(m+p-1)") {
  for (int p = 1; p <= 6; ++p) {
    for (int m = 1; m <= 12; ++m) {
      for (std::string_view spec : {"gpipe", "1f1b"}) {
        CAPTURE(spec);
        CAPTURE(p);
        CAPTURE(m);
        const SimulationReport r = simulate(gen(spec, p, m));
        CHECK(r.bubble() == Fraction(p - 1, m + p - 1));
        CHECK(r.makespan == 3 * (m + p - 1));  // F = 1, B = 2
        CHECK(r.total_messages() == 2 * m * (p - 1));
        CHECK(r.pair_ordered);
        for (int s = 0; s < p; ++s) {
          CHECK(r.peak_live[static_cast<std::size_t>(s)] == (spec == "gpipe" ? m : std::min(p - s, m)));
          CHECK(r.busy[static_cast<std::size_t>(s)] == 3 * m);
        }
      }
    }
  }
}

TEST_CASE("simulator, unit costs: interleaved 1F1B's bubble is exactly (p-1)/(v*m+p-1)") {
  for (int p = 2; p <= 4; ++p) {
    for (int v = 2; v <= 4; ++v) {
      for (int m = p; m <= 12; m += p) {
        CAPTURE(p);
        CAPTURE(v);
        CAPTURE(m);
        // Each chunk costs 1 forward and 2 backward ticks: the whole model v times 1F1B's per-stage cost.
        const SimulationReport r = simulate(gen("interleaved:" + std::to_string(v), p, m));
        CHECK(r.bubble() == Fraction(p - 1, v * m + p - 1));
        CHECK(r.total_messages() == 2 * m * (p * v - 1));  // every virtual-stage boundary, both ways
        CHECK(r.pair_ordered);
        // Fewer micro-batches alive than GPipe's v * m on every rank once m > p.
        if (m > p) {
          for (int peak : r.peak_live) CHECK(peak < v * m);
        }
      }
    }
  }
}

TEST_CASE("simulator: ZB-H1's bubble is a third of 1F1B's when F, BI and BW cost the same, at 1F1B's peak memory") {
  for (int p = 1; p <= 6; ++p) {
    for (int m = 1; m <= 12; ++m) {
      CAPTURE(p);
      CAPTURE(m);
      const SimulationReport z = simulate(gen("zbh1", p, m)), f = simulate(gen("1f1b", p, m));
      CHECK(z.total_messages() == 2 * m * (p - 1));
      const int f_peak = *std::max_element(f.peak_live.begin(), f.peak_live.end());
      for (int peak : z.peak_live) CHECK(peak == std::min(p, m));  // every stage at 1F1B's busiest stage's
      CHECK(f_peak == std::min(p, m));
      if (m >= p) {  // the schedule's claim needs the warm-up to fill
        CHECK(z.makespan == 3 * m + p - 1);
        if (p > 1) CHECK(Fraction(z.total_idle(), f.total_idle()) == Fraction(1, 3));
        CHECK(z.bubble() == Fraction(p - 1, 3 * m + p - 1));
      } else {
        CHECK(z.bubble().value() <= f.bubble().value());
      }
    }
  }
}

TEST_CASE("simulator: costs per action, transfer latency, custom costs") {
  // p 2, m 1 1F1B with F = 2, B = 5 and a 3-tick transfer: rank 0 F [0,2), act arrives at 5,
  // rank 1 F [5,7), B [7,12), grad arrives at 15, rank 0 B [15,20).
  CostModel c;
  c.forward = 2;
  c.backward = 5;
  c.transfer = 3;
  const SimulationReport r = simulate(gen("1f1b", 2, 1, {.engine_actions = false}), c);
  CHECK(r.makespan == 20);
  CHECK(r.finish == std::vector<std::int64_t>{20, 12});
  CHECK(r.busy == std::vector<std::int64_t>{7, 7});
  CHECK(r.bubble() == Fraction(40 - 14, 40));
  // Rank 1's forward started when the activation arrived.
  CHECK(r.start[1][1] == 5);
  CostModel slow_last;
  slow_last.custom = [](int rank, const Action& a) -> std::int64_t {
    if (!is_compute(a.op)) return 0;
    return (rank == 1 ? 3 : 1) * (a.op == Op::forward ? 1 : 2);
  };
  const SimulationReport u = simulate(gen("gpipe", 2, 2), slow_last);
  // rank 1: F at 1..4, 4..7, B 7..13, 13..19; rank 0's backwards wait for each gradient.
  CHECK(u.finish[1] == 19);
  CHECK(u.finish[0] == 21);
}

TEST_CASE("simulator: a deadlocking schedule is rejected naming the ranks and actions") {
  Schedule s = gen("1f1b", 2, 2);
  // Rank 0 waits for m0's gradient before sending m0's activation: each rank waits for the other.
  auto& r0 = s.ranks[0];  // gather, F m0, send-act m0, F m1, send-act m1, recv-grad m0, B m0, ...
  r0.erase(std::find(r0.begin(), r0.end(), Action{Op::recv_gradient, 0, 0, 1}));
  r0.insert(r0.begin() + 2, Action{Op::recv_gradient, 0, 0, 1});
  CHECK_THROWS_WITH_AS(simulate(s),
                       doctest::Contains("the schedule deadlocks: rank 0 waits at action 2 (recv-grad m0 from 1); rank 1 "
                                         "waits at action 1 (recv-act m0 from 0); rank 0 waits at action 2 (recv-grad m0 "
                                         "from 1) (a cycle)"),
                       usage_error);
  // A missing send, a send nobody receives, receives in another order than the sends.
  Schedule t = gen("gpipe", 2, 2);
  t.ranks[0].erase(std::find(t.ranks[0].begin(), t.ranks[0].end(), Action{Op::send_activation, 0, 1, 1}));
  CHECK_THROWS_WITH_AS(simulate(t), doctest::Contains("rank 1, action 3 (recv-act m1 from 0): has no matching send on rank 0"),
                       usage_error);
  Schedule u = gen("gpipe", 2, 2);  // rank 0: gather, F m0, send-act m0, F m1, send-act m1, ...
  u.ranks[0].insert(u.ranks[0].begin() + 5, Action{Op::send_activation, 0, 1, 1});
  CHECK_THROWS_WITH_AS(simulate(u), doctest::Contains("rank 0, action 5 (send-act m1 to 1): has no matching receive on rank 1"),
                       usage_error);
  Schedule w = gen("gpipe", 2, 2);
  auto& r1 = w.ranks[1];  // gather, recv m0, F m0, recv m1, F m1, ...: receive m1 first
  std::swap(r1[1], r1[3]);
  std::swap(r1[2], r1[4]);
  CHECK_THROWS_WITH_AS(simulate(w),
                       doctest::Contains("rank 1, action 1 (recv-act m1 from 0): would receive rank 0's action 2 (send-act "
                                         "m0 to 1): messages of one tag between two ranks meet in posting order"),
                       usage_error);
}

TEST_CASE("simulator: the dataflow is checked before timing") {
  const auto broken = [](Schedule s, const char* what) {
    CHECK_THROWS_WITH_AS(simulate(s), doctest::Contains(what), usage_error);
  };
  Schedule s = gen("1f1b", 2, 2);
  std::swap(s.ranks[1][1], s.ranks[1][2]);  // F m0 before recv-act m0
  broken(s, "rank 1, action 1 (F m0): runs before its input is received (recv-act)");
  s = gen("zbh1", 2, 2);
  auto& z = s.ranks[0];
  const auto bi = std::find(z.begin(), z.end(), Action{Op::backward_input, 0, 0, -1});
  const auto bw = std::find(z.begin(), z.end(), Action{Op::backward_weight, 0, 0, -1});
  std::iter_swap(bi, bw);
  broken(s, "runs before the micro-batch's input gradient (BI)");
  s = gen("1f1b", 2, 2);
  s.ranks[0].erase(std::find(s.ranks[0].begin(), s.ranks[0].end(), Action{Op::reduce, 0, 1, -1}));
  broken(s, "rank 0, the end of its actions: chunk 0, micro-batch 1 is never reduced");
  s = gen("1f1b", 2, 2);
  s.ranks[0].push_back({Op::forward, 0, 0, -1});
  broken(s, "comes after optimizer_step");
  s = gen("1f1b", 2, 2);
  std::swap(s.ranks[0][s.ranks[0].size() - 2], s.ranks[0][s.ranks[0].size() - 3]);  // release before reduce m1
  CHECK_NOTHROW(simulate(s));  // reduce is not a compute: it may follow the release
  s = gen("1f1b", 2, 2);
  s.ranks[1].insert(s.ranks[1].begin() + 4, Action{Op::release, 0, -1, -1});
  broken(s, "runs on a chunk after its release");
}

// ---- partitions -----------------------------------------------------------------------------------

TEST_CASE("partition: uniform as DeepSpeed's, balanced minimises the largest stage") {
  CHECK(partition_uniform(10, 4) == std::vector<std::size_t>{0, 3, 6, 8, 10});
  CHECK(partition_uniform(8, 4) == std::vector<std::size_t>{0, 2, 4, 6, 8});
  CHECK(partition_uniform(2, 4) == std::vector<std::size_t>{0, 1, 2, 2, 2});  // later stages empty
  const std::vector<std::uint64_t> ones(5, 1);
  CHECK(partition_balanced(ones, 4) == std::vector<std::size_t>{0, 2, 3, 4, 5});  // one of DeepSpeed's accepted
  const std::vector<std::uint64_t> params{100, 1, 1, 1, 100, 1};
  CHECK(partition_balanced(params, 2) == std::vector<std::size_t>{0, 3, 6});  // 102 and 102
  CHECK(layers_of(partition_uniform(10, 4), 1) == LayerRange{3, 6});
  CHECK_THROWS_AS(partition_uniform(3, 0), usage_error);
  CHECK_THROWS_AS(layers_of(partition_uniform(10, 4), 4), usage_error);
  // Against every partition of small random costs.
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t n = 1 + rng() % 7;
    const int parts = 1 + static_cast<int>(rng() % 4);
    std::vector<std::uint64_t> cost(n);
    for (auto& c : cost) c = rng() % 10;
    std::uint64_t best = ~0ull;
    const std::function<void(std::size_t, int, std::uint64_t)> search = [&](std::size_t at, int left, std::uint64_t worst) {
      if (left == 0) {
        if (at == n) best = std::min(best, worst);
        return;
      }
      const std::size_t min_take = n >= static_cast<std::size_t>(parts) ? 1 : 0;
      for (std::size_t e = at + min_take; e <= n; ++e) {
        const std::uint64_t sum = std::accumulate(cost.begin() + static_cast<long>(at), cost.begin() + static_cast<long>(e), std::uint64_t{0});
        search(e, left - 1, std::max(worst, sum));
      }
    };
    search(0, parts, 0);
    const auto b = partition_balanced(cost, parts);
    REQUIRE(b.size() == static_cast<std::size_t>(parts) + 1);
    CHECK(b.front() == 0);
    CHECK(b.back() == n);
    std::uint64_t worst = 0;
    for (int k = 0; k < parts; ++k) {
      const LayerRange r = layers_of(b, k);
      if (n >= static_cast<std::size_t>(parts)) CHECK(r.size() >= 1);
      worst = std::max<std::uint64_t>(worst, std::accumulate(cost.begin() + static_cast<long>(r.first), cost.begin() + static_cast<long>(r.last), std::uint64_t{0}));
    }
    CHECK(worst == best);
  }
}

// ---- the executor -------------------------------------------------------------------------------


TEST_CASE("executor on threads: every schedule gives the serial run's gradients and losses, bit for bit") {
  for (std::string_view spec : {"gpipe", "1f1b", "interleaved:2", "zbh1"}) {
    for (int p : {1, 2, 4}) {
      if (p == 1 && spec == "interleaved:2") continue;  // needs 2 stages
      for (int m : {4, 8}) {
        CAPTURE(spec);
        CAPTURE(p);
        CAPTURE(m);
        const Schedule s = gen(spec, p, m);
        const Serial want = serial_reference(s.virtual_stages(), m);
        std::mutex mu;
        std::vector<std::vector<float>> grads(static_cast<std::size_t>(s.virtual_stages()));
        std::vector<double> losses;
        comm::run_threads(p, [&](comm::ThreadsCommunicator& world) {
          comm::ProcessGrid grid(world, {.pipeline = p});
          Executor exec(grid, s);
          ToyRank me(s, grid.pipeline_index());
          StageFunctions f = me.functions();
          const StepResult r = exec.run(f);
          std::lock_guard lk(mu);
          for (int c = 0; c < s.chunks; ++c) grads[static_cast<std::size_t>(s.virtual_stage(exec.rank(), c))] = me.chunks[static_cast<std::size_t>(c)].grad;
          if (!r.losses.empty()) losses = r.losses;
          CHECK(r.figures.total_messages() == 2 * m * (s.virtual_stages() - 1));
          CHECK(r.figures.peak_live == exec.prediction().peak_live);
          // Reduces in micro-batch order per chunk, the step last.
          CHECK(me.events.back() == "step");
          CHECK(me.events.size() == static_cast<std::size_t>(s.chunks * m + 1));
        });
        CHECK(grads == want.grads);
        CHECK(losses == want.losses);
      }
    }
  }
}

TEST_CASE("executor on a virtual clock reproduces the simulator's figures exactly") {
  CostModel unit;
  CostModel uneven;
  uneven.forward = 2;
  uneven.backward_input = 3;
  uneven.backward_weight = 1;
  uneven.transfer = 1;
  uneven.reduce = 1;
  CostModel per_rank;
  per_rank.custom = [](int rank, const Action& a) -> std::int64_t {
    if (!is_compute(a.op)) return a.op == Op::optimizer_step ? 2 : 0;
    return (rank + 1) * (a.op == Op::forward ? 2 : 3) + (a.micro % 2);
  };
  for (const CostModel* costs : {&unit, &uneven, &per_rank}) {
    for (std::string_view spec : {"gpipe", "1f1b", "interleaved:2", "zbh1"}) {
      CAPTURE(spec);
      const int p = 4, m = 8;
      const Schedule s = gen(spec, p, m);
      const SimulationReport want = simulate(s, *costs);
      std::vector<Figures> got(static_cast<std::size_t>(p));
      comm::run_threads(p, [&](comm::ThreadsCommunicator& c) {
        Executor exec(c, s, {.virtual_clock = *costs});
        ToyRank me(s, c.rank());
        StageFunctions f = me.functions();
        for (int step = 0; step < 2; ++step) {  // the second step reuses buffers and shapes
          const StepResult r = exec.run(f);
          CHECK(r.virtual_clock);
          got[static_cast<std::size_t>(c.rank())] = r.figures;
        }
      });
      for (const Figures& g : got) {
        CHECK(g == static_cast<const Figures&>(want));
        CHECK(g.bubble() == want.bubble());
      }
    }
  }
  // And the unit-cost bubble is the closed form, through the executor.
  comm::run_threads(2, [](comm::ThreadsCommunicator& c) {
    const Schedule s = gen("1f1b", 2, 6);
    Executor exec(c, s, {.virtual_clock = CostModel{}});
    ToyRank me(s, c.rank());
    StageFunctions f = me.functions();
    CHECK(exec.run(f).figures.bubble() == Fraction(1, 7));
  });
}

TEST_CASE("executor: a rank whose stage shapes differ gets an error naming both ranks, the action and both shapes") {
  const Schedule s = gen("1f1b", 2, 2);
  std::vector<std::string> errors(2);
  CHECK_THROWS_WITH_AS(
      comm::run_threads(2,
                        [&](comm::ThreadsCommunicator& c) {
                          Executor exec(c, s);
                          ToyRank me(s, c.rank());
                          StageFunctions f = me.functions();
                          f.expected_input = [](int) -> std::optional<Shape> { return Shape{{2, 4}, DType::fp32}; };
                          try {
                            (void)exec.run(f);
                          } catch (const std::exception& e) {
                            errors[static_cast<std::size_t>(c.rank())] = e.what();
                            throw;
                          }
                        }),
      doctest::Contains("rank 1 (virtual stage 1) expects its input as [2, 4] fp32; rank 0 (virtual stage 0) sends [2, 3] fp32"),
      usage_error);
  CHECK(errors[1].find("at pipeline rank 1, action 1 (recv-act m0 from 0)") != std::string::npos);
  // Rank 0 was waiting for m0's gradient: released at once, naming the failed rank and its own wait.
  CAPTURE(errors[0]);
  CHECK(errors[0].find("rank 1 failed") != std::string::npos);
  CHECK(errors[0].find("while pipeline rank 0 waited at action 5 (recv-grad m0 from 1)") != std::string::npos);
}

TEST_CASE("executor: shapes are negotiated once; a change needs reset_shapes on every rank") {
  const Schedule s = gen("1f1b", 2, 2);
  // The first stage's output grows at micro-batch 1 without a reset.
  CHECK_THROWS_WITH_AS(comm::run_threads(2,
                                         [&](comm::ThreadsCommunicator& c) {
                                           Executor exec(c, s);
                                           ToyRank me(s, c.rank());
                                           StageFunctions f = me.functions();
                                           const auto base = f.forward;
                                           f.forward = [&](const MicroBatch& mb, const Activation* in, Activation& out) {
                                             base(mb, in, out);
                                             if (mb.micro == 1) out.reset(Shape{{3, 2}, DType::fp32});
                                           };
                                           (void)exec.run(f);
                                         }),
                       doctest::Contains("rank 0, action 3 (F m1): the forward's output has another shape than the one "
                                         "negotiated ([2, 3] fp32): shapes are negotiated once; call reset_shapes() on "
                                         "every rank when they change (got [3, 2] fp32)"),
                       usage_error);
  // With reset_shapes() on every rank between two steps, a new shape is announced.
  comm::run_threads(2, [&](comm::ThreadsCommunicator& c) {
    Executor exec(c, s);
    ToyRank me(s, c.rank());
    StageFunctions f = me.functions();
    (void)exec.run(f);
    exec.reset_shapes();
    const auto base = f.forward;
    f.forward = [&](const MicroBatch& mb, const Activation* in, Activation& out) {
      base(mb, in, out);
      out.reset(Shape{{6}, DType::fp32});  // same values, another shape
    };
    const auto bw = f.backward_input;
    f.backward_input = [&](const MicroBatch& mb, const Activation& gy, Activation* gx) {
      if (gx) CHECK(gx->shape() == Shape{{6}, DType::fp32});
      bw(mb, gy, gx);
    };
    CHECK_NOTHROW((void)exec.run(f));
  });
  // Only one rank resets: both fail at the next step's start.
  CHECK_THROWS_WITH_AS(comm::run_threads(2,
                                         [&](comm::ThreadsCommunicator& c) {
                                           Executor exec(c, s);
                                           ToyRank me(s, c.rank());
                                           StageFunctions f = me.functions();
                                           (void)exec.run(f);
                                           if (c.rank() == 1) exec.reset_shapes();
                                           (void)exec.run(f);
                                         }),
                       doctest::Contains("rank 1 called reset_shapes() 1 times, rank 0 0 times"), usage_error);
}

TEST_CASE("executor: ranks holding different schedules fail at the step's start, naming the first difference") {
  std::vector<std::string> errors(3);
  CHECK_THROWS_WITH_AS(
      comm::run_threads(3,
                        [&](comm::ThreadsCommunicator& c) {
                          const Schedule s = gen(c.rank() == 2 ? "gpipe" : "1f1b", 3, 4, {.engine_actions = false});
                          Executor exec(c, s);
                          ToyRank me(s, c.rank());
                          StageFunctions f = me.functions();
                          try {
                            (void)exec.run(f);
                          } catch (const usage_error& e) {
                            errors[static_cast<std::size_t>(c.rank())] = e.what();
                            throw;
                          }
                        }),
      doctest::Contains("pipeline ranks hold different schedules"), usage_error);
  for (const std::string& e : errors) {
    CAPTURE(e);  // every rank, the same words
    CHECK(e.find("they differ at the generator: rank 0's is 1f1b, rank 2's is gpipe") != std::string::npos);
  }
  // Same generator, one action swapped on one rank's copy.
  CHECK_THROWS_WITH_AS(comm::run_threads(2,
                                         [&](comm::ThreadsCommunicator& c) {
                                           Schedule s = gen("1f1b", 2, 2);
                                           if (c.rank() == 1) std::swap(s.ranks[0][7], s.ranks[0][8]);  // reduce m0, recv-grad m1
                                           Executor exec(c, s);
                                           ToyRank me(s, c.rank());
                                           StageFunctions f = me.functions();
                                           (void)exec.run(f);
                                         }),
                       doctest::Contains("they differ at the list of rank 0, action 7: rank 0's has `reduce m0`, rank 1's "
                                         "has `recv-grad m1 from 1`"),
                       usage_error);
}

TEST_CASE("executor: what it needs is checked before the step") {
  comm::run_threads(2, [](comm::ThreadsCommunicator& c) {
    CHECK_THROWS_WITH_AS(Executor(c, gen("1f1b", 4, 4)),
                         doctest::Contains("the pipeline group's size must equal the schedule's stages (4) (got 2 ranks)"),
                         usage_error);
    Schedule bad = gen("1f1b", 2, 2);
    std::swap(bad.ranks[1][1], bad.ranks[1][2]);
    CHECK_THROWS_WITH_AS(Executor(c, bad), doctest::Contains("runs before its input is received"), usage_error);
    Executor exec(c, gen("zbh1", 2, 2));
    StageFunctions f;
    CHECK_THROWS_WITH_AS((void)exec.run(f), doctest::Contains("StageFunctions::forward is required"), usage_error);
    f.forward = [](const MicroBatch&, const Activation*, Activation&) {};
    f.loss = [](const MicroBatch&, const Activation&, Activation&) { return 0.0; };
    f.backward = [](const MicroBatch&, const Activation&, Activation*) {};
    CHECK_THROWS_WITH_AS((void)exec.run(f), doctest::Contains("splits the backward into BI and BW"), usage_error);
  });
}
