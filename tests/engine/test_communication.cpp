// The engine's communication block (engine/communication.hpp): hierarchical collectives selected by
// `communication.topology` for the data group at stages 0-3 (engine/comms.hpp).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "engine_fixture.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/engine.hpp"

namespace test_communication {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using zt_test::RunConfig;
using zt_test::RunResult;

namespace {

/// A layer whose backward adds small integers to its gradients: their averages over 4 ranks are
/// exact, so any correct reduction order gives the same bits. Forward does nothing (the scopes still
/// gather at stage 3).
struct IntLayer {
  Param<float> w;
  explicit IntLayer(std::string name, std::size_t n) : w(std::move(name), {n}) {}
  template <class V>
  void parameters(V&& visit) {
    visit(w.name(), w);
  }
  void backward(int step, int rank) {
    for (std::size_t i = 0; i < w.numel(); ++i) {
      w.grad()[i] += static_cast<float>(static_cast<int>((i * 7 + static_cast<std::size_t>(rank) * 3 +
                                                          static_cast<std::size_t>(step) * 5) % 9) - 4);
    }
  }
};

struct IntModel {
  std::vector<IntLayer> layers;
  IntModel() {
    for (std::size_t n : {13u, 17u, 11u, 5u}) layers.emplace_back("l" + std::to_string(layers.size()), n);
  }
  template <class V>
  void parameters(V&& visit) {
    for (auto& l : layers) l.parameters(visit);
  }
  void init() {
    for (std::size_t l = 0; l < layers.size(); ++l) {
      for (std::size_t i = 0; i < layers[l].w.numel(); ++i) layers[l].w.data()[i] = 0.25f * static_cast<float>(i % 5) - 0.5f;
    }
  }
  std::vector<float> values() const {
    std::vector<float> v;
    for (const auto& l : layers) v.insert(v.end(), l.w.data(), l.w.data() + l.w.numel());
    return v;
  }
};

struct IntRun {
  std::vector<std::vector<float>> params;  // per rank
  std::vector<float> initial;
  comm::LinkStats links;                   // rank 0's
  std::uint64_t wire_bytes = 0;            // rank 0's data-group counter
};

EngineOptions int_options(int levels) {
  EngineOptions o;
  o.reduce_bucket_size = 24;  // several buckets, sizes not divisible by the ranks
  o.optimizer.lr = 1e-2f;
  o.optimizer.weight_decay = 0.01f;
  o.communication.topology.levels = levels;
  o.communication.topology.ranks_per_node = 2;  // 4 thread ranks = 2 simulated nodes x 2
  return o;
}

template <int S>
IntRun train_int(int levels, int steps = 6) {
  IntRun out;
  out.params.resize(4);
  std::mutex mu;
  comm::run_threads(4, [&](comm::ThreadsCommunicator& c) {
    IntModel model;
    Engine<Partitioner<Stage<S>>, Optimizer<AdamW>, Precision<fp32>> engine(c, model, int_options(levels));
    {
      auto g = engine.gather(model, 0);
      model.init();
    }
    engine.initialize_master();
    for (int s = 0; s < steps; ++s) {
      for (auto& l : model.layers) {
        auto scope = engine.forward(l);
      }
      for (auto it = model.layers.rbegin(); it != model.layers.rend(); ++it) {
        auto scope = engine.backward(*it);
        it->backward(s, c.rank());
      }
      (void)engine.step(0.0);
    }
    auto g = engine.gather(model);
    std::lock_guard lock(mu);
    out.params[static_cast<std::size_t>(c.rank())] = model.values();
    if (c.rank() == 0) {
      if (engine.link_stats()) out.links = *engine.link_stats();
      out.wire_bytes = engine.comm_stats().total_wire_bytes();
      CHECK(engine.topology().levels() == levels);
    }
  });
  IntModel fresh;
  std::vector<float> init(4096);
  std::size_t off = 0;
  fresh.parameters([&](std::string_view, auto& p) {
    p.bind(init.data() + off, nullptr);
    off += p.numel();
  });
  fresh.init();
  out.initial = fresh.values();
  return out;
}

template <int S>
void hierarchical_equals_flat_on_integer_gradients() {
  CAPTURE(S);
  const IntRun flat = train_int<S>(1), hier = train_int<S>(2);
  for (int r = 0; r < 4; ++r) CHECK(zt_test::same_bits(hier.params[static_cast<std::size_t>(r)], flat.params[static_cast<std::size_t>(r)]));
  CHECK(hier.params[0] != hier.initial);  // it trained
  CHECK(flat.links == comm::LinkStats{});
  CHECK(hier.links[1].wire_bytes > 0);    // the gradients and parameters crossed the simulated nodes
  CHECK(hier.links[1].wire_bytes < hier.links[0].wire_bytes);
  CHECK(hier.wire_bytes == flat.wire_bytes);  // counted as the flat collectives
}

}  // namespace

TEST_CASE("communication.topology 2 on 2 simulated nodes x 2 ranks: stages 0-3 train to the flat run's parameters bit "
          "for bit on integer-valued gradients") {
  hierarchical_equals_flat_on_integer_gradients<0>();
  hierarchical_equals_flat_on_integer_gradients<1>();
  hierarchical_equals_flat_on_integer_gradients<2>();
  hierarchical_equals_flat_on_integer_gradients<3>();
}

namespace {

template <int S>
void hierarchical_close_to_flat_on_real_gradients() {
  CAPTURE(S);
  RunConfig cfg;
  cfg.world = 4;
  cfg.steps = 10;
  cfg.communication.topology.levels = 2;
  cfg.communication.topology.ranks_per_node = 2;
  std::vector<RunResult> flat(4), hier(4);
  auto run = [&](std::vector<RunResult>& out, const RunConfig& c) {
    std::mutex mu;
    comm::run_threads(4, [&](comm::ThreadsCommunicator& comm) {
      RunResult r = zt_test::train_on<S, fp32>(comm, comm.rank(), c);
      std::lock_guard lock(mu);
      out[static_cast<std::size_t>(comm.rank())] = std::move(r);
    });
  };
  RunConfig flat_cfg = cfg;
  flat_cfg.communication = {};
  run(flat, flat_cfg);
  run(hier, cfg);
  // The sums group (r0 + r1) + (r2 + r3) instead of ((r0 + r1) + r2) + r3: after 10 AdamW steps at
  // lr 1e-2 the parameters (O(1)) agree to 1e-6 absolute (measured: 6e-8, one ulp), differ
  // somewhere (the grouping is really another), and every rank holds the same.
  double worst = 0;
  for (std::size_t i = 0; i < flat[0].params.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::abs(hier[0].params[i] - flat[0].params[i])));
  }
  CHECK(worst <= 1e-6);
  CHECK(worst > 0);
  CHECK(hier[0].params != hier[0].initial);
  for (int r = 1; r < 4; ++r) CHECK(zt_test::same_bits(hier[static_cast<std::size_t>(r)].params, hier[0].params));
  MESSAGE("stage ", S, ": largest |hierarchical - flat| after 10 steps: ", worst);
}

}  // namespace

TEST_CASE("communication.topology 2, real gradients: stages 0-3 stay within 1e-6 of the flat run") {
  hierarchical_close_to_flat_on_real_gradients<0>();
  hierarchical_close_to_flat_on_real_gradients<1>();
  hierarchical_close_to_flat_on_real_gradients<2>();
  hierarchical_close_to_flat_on_real_gradients<3>();
}

TEST_CASE("communication.topology: bad options name their key at construction") {
  EngineOptions o;
  o.communication.topology.levels = 0;
  CHECK_THROWS_WITH_AS(comm::run_threads(2,
                                         [&](comm::ThreadsCommunicator& c) {
                                           zt_test::Mlp<float> model;
                                           Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Precision<fp32>> e(c, model, o);
                                         }),
                       doctest::Contains("communication.topology"), config_error);
  o.communication.topology.levels = 2;
  o.communication.topology.node_of_rank = {0, 0, 1};
  CHECK_THROWS_WITH_AS(comm::run_threads(2,
                                         [&](comm::ThreadsCommunicator& c) {
                                           zt_test::Mlp<float> model;
                                           Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Precision<fp32>> e(c, model, o);
                                         }),
                       doctest::Contains("communication.topology.node_of_rank: must give one entry for each of the 2 ranks"),
                       config_error);
}

// ---- slow ranks: the detector on injected times (monitor/slow_ranks.hpp) ---------------------------

namespace {

/// Steps of 8 ranks at 10 ms per step (+-jitter uniform), rank `slow` `factor` times slower in
/// backward; returns the first step at which any rank was flagged (0: none) and the flags then.
struct Detection {
  std::int64_t first_step = 0;
  std::vector<SlowRank> flagged;
};
Detection detect(int steps, int slow, double factor, double jitter, SlowRankOptions o, std::uint32_t seed = 5) {
  o.enabled = true;
  SlowRankDetector d(o, 8);
  d.set_hosts({"h0", "h0", "h0", "h0", "h1", "h1", "h1", "h1"});
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-jitter, jitter);
  Detection out;
  for (int s = 1; s <= steps; ++s) {
    std::vector<ComputeTimes> t(8);
    for (int r = 0; r < 8; ++r) {
      const double j = 1 + u(rng), f = r == slow ? factor : 1.0;  // the jitter scales the whole step
      t[static_cast<std::size_t>(r)] = {3.0 * j, 6.0 * f * j, 1.0 * j, 1};
    }
    d.add(t, s);
    if (!d.slow().empty() && out.first_step == 0) {
      out.first_step = s;
      out.flagged.assign(d.slow().begin(), d.slow().end());
    }
  }
  return out;
}

}  // namespace

TEST_CASE("slow ranks: +30% on one rank is flagged at window x count steps, naming it, its host and phase") {
  const SlowRankOptions defaults;  // window 20, count 3, tolerance 0.1
  CHECK(defaults.window * defaults.count == 60);
  const Detection d = detect(200, 5, 1.3, 0.05, defaults);
  CHECK(d.first_step == 60);
  REQUIRE(d.flagged.size() == 1);
  CHECK(d.flagged[0].rank == 5);
  CHECK(d.flagged[0].host == "h1");
  CHECK(d.flagged[0].phase == "backward");
  CHECK(d.flagged[0].since_step == 60);
  // backward is 6 of 10 ms: 30% more of it is 18% more in all
  CHECK(d.flagged[0].factor == doctest::Approx(1.18).epsilon(0.02));
  SlowRankOptions quick;
  quick.window = 5;
  quick.count = 2;
  CHECK(detect(50, 2, 1.3, 0.05, quick).first_step == 10);
}

TEST_CASE("slow ranks: +-5% jitter on every rank flags nobody in 1,000 steps; nor does +8% at tolerance 0.1") {
  const SlowRankOptions o;
  for (std::uint32_t seed : {1u, 2u, 3u}) {
    CAPTURE(seed);
    CHECK(detect(1000, -1, 1.0, 0.05, o, seed).first_step == 0);
    // +8% of all its time (backward 13.3% slower: 0.8 ms of 10)
    CHECK(detect(1000, 3, 1.0 + 0.08 * 10 / 6, 0.05, o, seed).first_step == 0);
  }
  // the same +8% at tolerance 0.05 is flagged (the test above could fail)
  SlowRankOptions tight;
  tight.tolerance = 0.05;
  CHECK(detect(1000, 3, 1.0 + 0.08 * 10 / 6, 0.05, tight).first_step == 60);
}

TEST_CASE("slow ranks: one slow step is not a slow rank; a recovered rank is unflagged after one good window") {
  SlowRankOptions o;
  o.enabled = true;
  o.window = 4;
  o.count = 2;
  SlowRankDetector d(o, 3);
  auto step = [&](std::int64_t s, double r1) {
    std::vector<ComputeTimes> t(3, ComputeTimes{1, 2, 0, 1});
    t[1].backward_ms *= r1;
    return d.add(t, s);
  };
  for (int s = 1; s <= 16; ++s) step(s, s % 4 == 1 ? 10.0 : 1.0);  // a 10x spike in every window
  CHECK(d.slow().empty());
  for (int s = 17; s <= 24; ++s) step(s, 2.0);
  REQUIRE(d.slow().size() == 1);
  CHECK(d.slow()[0].since_step == 24);
  CHECK(d.ratios()[1] == doctest::Approx(5.0 / 3.0));
  for (int s = 25; s <= 28; ++s) step(s, 2.0);
  CHECK(d.slow()[0].since_step == 24);  // the same episode
  for (int s = 29; s <= 32; ++s) step(s, 1.0);
  CHECK(d.slow().empty());
  // per sample: a rank given half the samples in half the time is not slow
  SlowRankDetector p(o, 2);
  for (int s = 1; s <= 8; ++s) p.add(std::vector<ComputeTimes>{{0, 4, 0, 4}, {0, 2, 0, 2}}, s);
  CHECK(p.slow().empty());
  CHECK(p.ratios()[1] == 1.0);
}

TEST_CASE("slow ranks: sample shares split the micro-batch exactly; bad options name their key") {
  // 1.3x slower: ideal 8.49, 6.53, 8.49, 8.49 of 32; the largest remainders get the two left over
  CHECK(split_samples(32, std::vector<double>{1, 1 / 1.3, 1, 1}) == std::vector<std::int64_t>{9, 7, 8, 8});
  CHECK(split_samples(16, std::vector<double>{1, 1 / 1.3, 1, 1}) == std::vector<std::int64_t>{4, 4, 4, 4});
  CHECK(split_samples(4, std::vector<double>{1, 0.01, 1, 1}) == std::vector<std::int64_t>{1, 1, 1, 1});
  CHECK(split_samples(10, std::vector<double>{1, 1}) == std::vector<std::int64_t>{5, 5});
  std::vector<config_error> problems;
  SlowRankOptions o;
  o.enabled = true;
  o.tolerance = -0.1;
  o.window = 0;
  o.action = SlowRankAction::rebalance;
  o.check(problems);
  REQUIRE(problems.size() == 3);
  CHECK(std::string(problems[0].what()).find("communication.slow_node_tolerance: must be finite and >= 0 (got -0.1") !=
        std::string::npos);
  CHECK(problems[1].where() == "communication.slow_node_window");
  CHECK(problems[2].where() == "communication.slow_node_action");
}

// ---- slow ranks in the engine, on a virtual clock --------------------------------------------------

namespace {

/// Layers whose per-sample gradients are small integers: any split of the micro-batch over the
/// ranks, weighted by BatchShare::sample_weight (a power of two here), sums to the same bits.
struct SampleModel {
  std::vector<IntLayer> layers;
  SampleModel() {
    for (std::size_t n : {7u, 5u, 9u}) layers.emplace_back("s" + std::to_string(layers.size()), n);
  }
  template <class V>
  void parameters(V&& visit) {
    for (auto& l : layers) l.parameters(visit);
  }
  static void add_sample(IntLayer& l, int step, std::int64_t sample, float weight) {
    for (std::size_t k = 0; k < l.w.numel(); ++k) {
      const auto g = static_cast<int>((static_cast<std::size_t>(sample) * 3 + k * 5 + static_cast<std::size_t>(step) * 7) % 9) - 4;
      l.w.grad()[k] += weight * static_cast<float>(g);
    }
  }
  std::vector<float> values() const {
    std::vector<float> v;
    for (const auto& l : layers) v.insert(v.end(), l.w.data(), l.w.data() + l.w.numel());
    return v;
  }
};

struct SlowRun {
  std::vector<std::vector<float>> params = std::vector<std::vector<float>>(4);
  std::vector<std::vector<StepReport>> reports = std::vector<std::vector<StepReport>>(4);
  std::vector<std::vector<BatchShare>> shares = std::vector<std::vector<BatchShare>>(4);
  std::vector<std::string> errors = std::vector<std::string>(4);
  std::vector<std::int64_t> error_steps = std::vector<std::int64_t>(4, 0);
  std::uint64_t data_wire_bytes = 0;  // rank 0's data group
};

/// 16 steps of 4 thread ranks with 8 samples each per micro-step. Compute on the virtual clock: 0.5 ms
/// per sample per layer in forward, 1 ms in backward, `factor` times that on rank `slow`.
SlowRun train_slow(SlowRankOptions o, int slow, double factor, int steps = 16) {
  SlowRun out;
  std::mutex mu;
  comm::run_threads(4, [&](comm::ThreadsCommunicator& c) {
    const int r = c.rank();
    double clock = 0;
    EngineOptions eo;
    eo.reduce_bucket_size = 8;
    eo.optimizer.lr = 1e-2f;
    eo.communication.slow_ranks = o;
    eo.communication.slow_ranks.clock_ms = [&clock] { return clock; };
    eo.communication.slow_ranks.micro_batch_size = 8;
    SampleModel model;
    Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Precision<fp32>> engine(c, model, eo);
    {
      auto g = engine.gather(model, 0);
      for (auto& l : model.layers) {
        for (std::size_t i = 0; i < l.w.numel(); ++i) l.w.data()[i] = 0.125f * static_cast<float>(i % 3);
      }
    }
    engine.initialize_master();
    std::vector<StepReport> reports;
    std::vector<BatchShare> shares;
    std::string error;
    std::int64_t error_step = 0;
    const double slower = r == slow ? factor : 1.0;
    try {
      for (int s = 0; s < steps; ++s) {
        const BatchShare share = engine.batch_share();
        shares.push_back(share);
        for (auto& l : model.layers) {
          auto scope = engine.forward(l);
          clock += 0.5 * static_cast<double>(share.samples);
        }
        for (auto it = model.layers.rbegin(); it != model.layers.rend(); ++it) {
          auto scope = engine.backward(*it);
          for (std::int64_t i = share.first; i < share.first + share.samples; ++i) {
            SampleModel::add_sample(*it, s, i, static_cast<float>(share.sample_weight));
          }
          clock += 1.0 * slower * static_cast<double>(share.samples);
        }
        clock += 0.25;  // the loss and the next batch: outside every scope
        reports.push_back(engine.step(0.0));
      }
    } catch (const slow_rank_error& e) {
      error = e.what();
      error_step = static_cast<std::int64_t>(reports.size()) + 1;
    }
    auto g = engine.gather(model);
    std::lock_guard lock(mu);
    const auto i = static_cast<std::size_t>(r);
    out.params[i] = model.values();
    out.reports[i] = std::move(reports);
    out.shares[i] = std::move(shares);
    out.errors[i] = std::move(error);
    out.error_steps[i] = error_step;
    if (r == 0) out.data_wire_bytes = engine.comm_stats().total_wire_bytes();
  });
  return out;
}

SlowRankOptions quick(SlowRankAction action) {
  SlowRankOptions o;
  o.enabled = true;
  o.window = 4;
  o.count = 2;
  o.action = action;
  return o;
}

}  // namespace

TEST_CASE("slow ranks in the engine: report names the slow rank at window x count steps on every rank") {
  const SlowRun run = train_slow(quick(SlowRankAction::report), 1, 1.3);
  for (std::size_t r = 0; r < 4; ++r) {
    CAPTURE(r);
    REQUIRE(run.reports[r].size() == 16);
    for (std::size_t s = 0; s < 16; ++s) {
      CAPTURE(s);
      const StepReport& rep = run.reports[r][s];
      CHECK(rep.slow_rank_detection);
      CHECK(rep.slow_ranks.size() == (s + 1 >= 8 ? 1u : 0u));  // window 4 x count 2
      CHECK(rep.slow_ranks == run.reports[0][s].slow_ranks);
    }
    // this rank's compute: 8 samples x (3 x 0.5 + 3 x 1 x factor) + 0.25 per step, the engine's own
    // time excluded (the virtual clock stands still inside its calls)
    CHECK(run.reports[r][5].compute_ms == doctest::Approx(8 * (1.5 + 3 * (r == 1 ? 1.3 : 1.0)) + 0.25));
  }
  const SlowRank& s = run.reports[0][7].slow_ranks.at(0);
  CHECK(s.rank == 1);
  CHECK(s.phase == "backward");
  CHECK(s.since_step == 8);
  CHECK(s.factor == doctest::Approx((8 * (1.5 + 3.9) + 0.25) / (8 * 4.5 + 0.25)));
  CHECK_FALSE(s.host.empty());
  CHECK(run.errors[0].empty());
  // report changes nothing else: the shares stay equal
  CHECK(run.shares[1].back() == BatchShare{8, 8, 32, 0.125});
}

TEST_CASE("slow ranks in the engine: abort ends every rank with slow_rank_error at the same boundary") {
  const SlowRun run = train_slow(quick(SlowRankAction::abort), 2, 1.3);
  for (std::size_t r = 0; r < 4; ++r) {
    CAPTURE(r);
    CHECK(run.error_steps[r] == 8);
    CHECK(run.errors[r].find("rank 2 (") != std::string::npos);
    CHECK(run.errors[r].find("communication.slow_node_action is abort") != std::string::npos);
    CHECK(run.errors[r] == run.errors[0]);
  }
  // no straggler: no abort
  const SlowRun calm = train_slow(quick(SlowRankAction::abort), 2, 1.0);
  for (std::size_t r = 0; r < 4; ++r) CHECK(calm.errors[r].empty());
}

TEST_CASE("slow ranks in the engine: rebalance gives the slow rank fewer samples and keeps the no-straggler run's "
          "parameters bit for bit (integer data)") {
  const SlowRun plain = train_slow(quick(SlowRankAction::rebalance), 1, 1.0);
  const SlowRun slow = train_slow(quick(SlowRankAction::rebalance), 1, 1.3);
  for (std::size_t r = 0; r < 4; ++r) {
    CAPTURE(r);
    CHECK(zt_test::same_bits(slow.params[r], plain.params[r]));
    for (const BatchShare& b : plain.shares[r]) CHECK(b.samples == 8);
  }
  std::vector<float> initial;
  for (std::size_t n : {7u, 5u, 9u}) {
    for (std::size_t i = 0; i < n; ++i) initial.push_back(0.125f * static_cast<float>(i % 3));
  }
  CHECK(slow.params[0] != initial);  // it trained
  // from step 9 on (after the boundary that flagged it): rank 1 takes 7 of 32, the others 9, 8, 8
  CHECK(slow.shares[1][7].samples == 8);
  CHECK(slow.shares[1][8] == BatchShare{9, 7, 32, 0.125});
  CHECK(slow.shares[0][8] == BatchShare{0, 9, 32, 0.125});
  CHECK(slow.shares[3][15] == BatchShare{24, 8, 32, 0.125});
  CHECK(slow.reports[0].back().slow_ranks.at(0).rank == 1);  // still measured slow per sample
  // The detector talks over its own communicator: the data group's bytes are those of a run without it.
  SlowRankOptions off;
  const SlowRun none = train_slow(off, 1, 1.0);
  CHECK(none.data_wire_bytes == plain.data_wire_bytes);
  CHECK_FALSE(none.reports[0][0].slow_rank_detection);
}

// ---- ZeRO++ qwZ / qgZ in the engine ---------------------------------------------------------------

namespace {

/// The fixture's MLP made wider (13 -> 96 -> 96 -> 5: 11,141 parameters), so that per-group scales
/// and the norm's small reductions are a small part of the traffic, as in a real model.
template <class T>
struct WideMlp {
  std::vector<zt_test::Dense<T>> layers;
  WideMlp() {
    layers.emplace_back("fc0", 13, 96, true);
    layers.emplace_back("fc1", 96, 96, true);
    layers.emplace_back("fc2", 96, 5, false);
  }
  template <class V>
  void parameters(V&& visit) {
    for (auto& l : layers) l.parameters(visit);
  }
  void init(std::uint32_t seed) {
    std::mt19937 rng(seed);
    for (auto& l : layers) {
      std::normal_distribution<float> nd(0.0f, 1.0f / std::sqrt(static_cast<float>(l.in)));
      for (std::size_t i = 0; i < l.w.numel(); ++i) l.w.data()[i] = from_float<T>(nd(rng));
      for (std::size_t i = 0; i < l.b.numel(); ++i) l.b.data()[i] = from_float<T>(0.0f);
    }
  }
  std::vector<float> values() const {
    std::vector<float> v;
    for (const auto& l : layers) {
      for (std::size_t i = 0; i < l.w.numel(); ++i) v.push_back(to_float(l.w.data()[i]));
    }
    return v;
  }
};

struct PlusRun {
  std::vector<double> losses;        // rank 0's, per step
  std::uint64_t inter_node = 0;      // rank 0's bytes across the simulated nodes
  std::uint64_t intra_node = 0;
  std::vector<float> first_forward;  // layer 1's weights inside its first forward scope
};

/// Stage-3 steps of WideMlp on 4 thread ranks as 2 simulated nodes x 2, every layer gathered in
/// each of its scopes (no reuse: the backward gathers again, as hpZ assumes); `plus`: hpZ within the
/// node, qwZ and qgZ.
template <class Prec>
PlusRun train_zero3(bool plus, int steps) {
  using T = typename Prec::storage;
  using E = Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, Precision<Prec>>;
  PlusRun out;
  std::mutex mu;
  comm::run_threads(4, [&](comm::ThreadsCommunicator& c) {
    RunConfig cfg;
    cfg.world = 4;
    cfg.bucket_bytes = 1 << 20;  // one bucket per layer
    cfg.stage3.param_persistence_threshold = 0;
    cfg.stage3.max_reuse_distance = 0;
    cfg.communication.topology.levels = 2;
    cfg.communication.topology.ranks_per_node = 2;
    if (plus) {
      cfg.stage3.reshard_after_forward = ReshardAfterForward::group(2);  // hpZ: the node
      cfg.stage3.quantized_weights = true;
      cfg.stage3.quantized_gradients = true;
    }
    WideMlp<T> model;
    E engine(c, model, zt_test::engine_options(cfg));
    zt_test::init_model(engine, model, 42);
    // The steps' bytes only: the set-up's exact gather of rank 0's initial values is the same in both.
    const auto link_bytes = [&](int level) {
      std::uint64_t bytes = engine.link_stats()->by_level[static_cast<std::size_t>(level)].wire_bytes;
      if (const auto* q = engine.quantized_gradients_stats()) bytes += q->links[level].wire_bytes;
      if (const auto* g = engine.group_comm_stats(); g && level == 0) bytes += g->total_wire_bytes();  // hpZ: the node
      return bytes;
    };
    const std::uint64_t inter_before = link_bytes(1), intra_before = link_bytes(0);
    PlusRun mine;
    for (int s = 0; s < steps; ++s) {
      const zt_test::Batch b = zt_test::make_batch(s, 0, c.rank());
      std::vector<float> x = b.x;
      for (auto& l : model.layers) {
        auto scope = engine.forward(l);
        if (s == 0 && &l == &model.layers[1]) {
          for (std::size_t i = 0; i < l.w.numel(); ++i) mine.first_forward.push_back(to_float(l.w.data()[i]));
        }
        x = l.forward(x);
      }
      std::vector<float> dy;
      const float loss = zt_test::mse(x, b.t, static_cast<float>(engine.loss_scale()), dy);
      for (auto it = model.layers.rbegin(); it != model.layers.rend(); ++it) {
        auto scope = engine.backward(*it);
        dy = it->backward(dy);
      }
      mine.losses.push_back(engine.step(loss).loss);
    }
    mine.inter_node = link_bytes(1) - inter_before;
    mine.intra_node = link_bytes(0) - intra_before;
    if (c.rank() == 0) {
      std::lock_guard lock(mu);
      out = std::move(mine);
    }
  });
  return out;
}

}  // namespace

TEST_CASE("ZeRO++ (hpZ + qwZ + qgZ) at stage 3 on 2 simulated nodes x 2: >= 3x fewer inter-node bytes, the forward "
          "on int8 weights, and training converging as the plain run does") {
  const PlusRun plain = train_zero3<fp32>(false, 30), plus = train_zero3<fp32>(true, 30);
  const double ratio = static_cast<double>(plain.inter_node) / static_cast<double>(plus.inter_node);
  MESSAGE("fp32: inter-node bytes per rank over 30 steps: plain ", plain.inter_node, ", ZeRO++ ", plus.inter_node, " (",
          ratio, "x fewer); intra-node ", plain.intra_node, " vs ", plus.intra_node, "; loss ", plain.losses.front(), " -> ",
          plain.losses.back(), " vs ", plus.losses.front(), " -> ", plus.losses.back());
  CHECK(ratio >= 3.0);
  // qwZ: the first forward sees the int8-dequantized initial weights: not the exact ones (the plain
  // run's), within one int8 step (the bucket's absmax / 128 bounds every group's step).
  REQUIRE(plus.first_forward.size() == plain.first_forward.size());
  double diff = 0, absmax = 0;
  for (std::size_t i = 0; i < plain.first_forward.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::abs(plus.first_forward[i] - plain.first_forward[i])));
    absmax = std::max(absmax, static_cast<double>(std::abs(plain.first_forward[i])));
  }
  CHECK(diff > 0);
  CHECK(diff <= absmax / 128 * 1.001);
  // Convergence, stated: the loss falls by more than 60% in 30 steps, as the plain run's does (68%
  // measured; 66% with ZeRO++), and ends within 10% of the plain run's (5.3% measured).
  CHECK(plus.losses.back() < 0.4 * plus.losses.front());
  CHECK(std::abs(plus.losses.back() - plain.losses.back()) <= 0.1 * plain.losses.back());

  // bf16 (what DeepSpeed's ZeRO++ runs in): the plain run moves half the fp32 bytes. Per step:
  // forward + backward gathers + reduce-scatter of 2 B per element against an int8 forward gather,
  // the backward's inside the node (hpZ) and an int4 reduce-scatter: about 4x.
  const PlusRun plain16 = train_zero3<bf16>(false, 4), plus16 = train_zero3<bf16>(true, 4);
  const double ratio16 = static_cast<double>(plain16.inter_node) / static_cast<double>(plus16.inter_node);
  MESSAGE("bf16: inter-node bytes per rank over 4 steps: plain ", plain16.inter_node, ", ZeRO++ ", plus16.inter_node, " (",
          ratio16, "x fewer)");
  CHECK(ratio16 >= 3.0);
}

}  // namespace test_communication
