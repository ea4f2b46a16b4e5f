// The delayed parameter update (EngineOptions::delayed_param_update, offload/delayed_update.hpp)
// with Offload<Cpu> on the threads communicator.
//
// The oracle: an ordinary Offload<Cpu> engine fed, before every step, the parameters the delayed
// engine's forward saw (written through a gather scope, so its master is untouched). Both then
// compute the same gradients from the same values, and the recursion
//     master_{t+1} = Adam(master_t, g(params_{t-1}))
// says their masters, moments, losses, norms, scales and skips are bitwise equal, and that the
// delayed engine publishes at boundary t what the fed engine published at boundary t - 1. The
// fed engine has no delay of its own, so this checks the delay, not a copy of it.
#include <doctest/doctest.h>

#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine_fixture.hpp"
#include "offload_runs.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/engine.hpp"
#include "zerotk/optim/schedulers.hpp"

namespace test_delayed_update {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using namespace zt_test;

namespace {

template <class Model>
void set_values(Model& model, const std::vector<float>& v) {
  using T = std::remove_cvref_t<decltype(model.layers[0].w.data()[0])>;
  std::size_t i = 0;
  for (auto& l : model.layers) {
    for (std::size_t k = 0; k < l.w.numel(); ++k) l.w.data()[k] = from_float<T>(v[i++]);
    for (std::size_t k = 0; k < l.b.numel(); ++k) l.b.data()[k] = from_float<T>(v[i++]);
  }
}

struct Variant {
  RunConfig cfg;
  std::int64_t start = 0;  // delayed_param_update_start
  bool scheduler = false;
};

struct Delayed {
  std::vector<std::vector<float>> seen;  // rank 0: what each step's forward saw
  RunResult run;                         // rank 0; params after settle()
  std::vector<EngineState> states;       // every rank, after settle()
  bool pending_before_settle = false;    // state() refused while the last update was in flight
};

/// The scheduled variant also has two parameter groups (no weight decay for biases), as the GPT
/// example has.
EngineOptions options_of(const Variant& v) {
  EngineOptions o = engine_options(v.cfg);
  if (v.scheduler) {
    o.groups = {ParamGroup{o.optimizer}, ParamGroup{o.optimizer}};
    o.groups[1].options.weight_decay = 0.0f;
    o.group_of = [](std::string_view name) -> std::uint32_t { return name.ends_with(".bias") ? 1 : 0; };
  }
  return o;
}

void maybe_schedule(auto& engine, bool on) {
  if (!on) return;
  optim::WarmupLROptions wo;
  wo.warmup_min_lr = 2e-3;  // every step moves the parameters
  wo.warmup_max_lr = 2e-2;
  wo.warmup_num_steps = 6;
  wo.warmup_type = optim::WarmupType::linear;
  engine.set_scheduler(optim::WarmupLR(wo, 1e-2));
}

template <int S, class Prec, class Model>
Delayed run_delayed(const Variant& v) {
  Delayed out;
  out.states.resize(static_cast<std::size_t>(v.cfg.world));
  std::mutex mu;
  comm::run_threads(v.cfg.world, [&](auto& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    EngineOptions o = options_of(v);
    o.delayed_param_update = true;
    o.delayed_param_update_start = v.start;
    Model model;
    OffloadEngine<S, Prec, Offload<Cpu>> engine(comm, model, o);
    init_model(engine, model, 42);
    maybe_schedule(engine, v.scheduler);
    Delayed mine;
    for (int s = 0; s < v.cfg.steps; ++s) {
      {
        auto g = engine.gather(model);
        mine.seen.push_back(model.values());
      }
      train_steps(engine, model, comm.rank(), v.cfg, s, s + 1, &mine.run);
    }
    try {
      (void)engine.state();
    } catch (const usage_error& e) {
      mine.pending_before_settle = std::string(e.what()).find("settle()") != std::string::npos;
    }
    engine.settle();
    engine.settle();  // nothing in flight any more: a no-op
    EngineState st = engine.state();
    {
      auto g = engine.gather(model);
      mine.run.params = model.values();
    }
    std::lock_guard lock(mu);
    out.states[r] = std::move(st);
    if (r == 0) {
      out.seen = std::move(mine.seen);
      out.run = std::move(mine.run);
      out.pending_before_settle = mine.pending_before_settle;
    }
  });
  return out;
}

struct Fed {
  RunResult run;
  std::vector<std::vector<float>> own;  // rank 0: the fed engine's own parameters before each overwrite
  std::vector<EngineState> states;
};

/// An ordinary Offload<Cpu> engine whose forward at step s sees `seen[s]`.
template <int S, class Prec, class Model>
Fed run_fed(const Variant& v, const std::vector<std::vector<float>>& seen) {
  Fed out;
  out.states.resize(static_cast<std::size_t>(v.cfg.world));
  std::mutex mu;
  comm::run_threads(v.cfg.world, [&](auto& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    Model model;
    OffloadEngine<S, Prec, Offload<Cpu>> engine(comm, model, options_of(v));
    init_model(engine, model, 42);
    maybe_schedule(engine, v.scheduler);
    Fed mine;
    for (int s = 0; s < v.cfg.steps; ++s) {
      {
        auto g = engine.gather(model, 0);  // rank 0's writes become every rank's; the master stays
        mine.own.push_back(model.values());
        set_values(model, seen[static_cast<std::size_t>(s)]);
      }
      train_steps(engine, model, comm.rank(), v.cfg, s, s + 1, &mine.run);
    }
    {
      auto g = engine.gather(model);
      mine.run.params = model.values();
    }
    std::lock_guard lock(mu);
    out.states[r] = engine.state();
    if (r == 0) {
      out.run = std::move(mine.run);
      out.own = std::move(mine.own);
    }
  });
  return out;
}

/// `Model` = Mlp<float> over a 16-bit Precision is emulated 16-bit (float Params over a float view).
template <int S, class Prec, class Model = Mlp<typename Precision<Prec>::storage>>
void check_variant(const Variant& v) {
  const Delayed d = run_delayed<S, Prec, Model>(v);
  REQUIRE(d.seen.size() == static_cast<std::size_t>(v.cfg.steps));
  CHECK(d.pending_before_settle);
  const Fed f = run_fed<S, Prec, Model>(v, d.seen);
  check_same_run(f.run, d.run);  // losses, scales, skips, norms and the final (settled) parameters
  check_same_states(f.states, d.states);
  for (std::size_t r = 0; r < d.states.size(); ++r) CHECK(same_state(f.states[r], d.states[r]));
  // The immediate steps publish at once; the first delayed one publishes nothing; from then on the
  // delayed engine publishes at boundary t what the fed engine published at boundary t - 1.
  const auto k = static_cast<std::size_t>(v.start);
  for (std::size_t s = 1; s <= k && s < d.seen.size(); ++s) CHECK(d.seen[s] != d.seen[s - 1]);
  if (k + 1 < d.seen.size()) CHECK(d.seen[k + 1] == d.seen[k]);
  bool skipped = false;
  for (char c : d.run.skipped) skipped = skipped || c;
  if (!skipped) {
    for (std::size_t s = k + 2; s < d.seen.size(); ++s) {
      CAPTURE(s);
      CHECK(d.seen[s] == f.own[s - 1]);
      CHECK(d.seen[s] != d.seen[s - 1]);
    }
  }
}

template <int S, class Prec, class Model = Mlp<typename Precision<Prec>::storage>>
void sweep(bool fp16) {
  for (int world : {1, 2, 3}) {
    for (int variant = 0; variant < 3; ++variant) {
      Variant v;
      v.cfg.world = world;
      v.cfg.steps = 10;
      v.cfg.stage3.param_persistence_threshold = 0;
      if (variant == 1) {  // accumulation, clipping, small sub-groups, a warm-up of immediate steps
        v.cfg.gas = 2;
        v.cfg.clip = 0.5;
        v.cfg.sub_group_size = 7;
        v.cfg.overlap_gather = true;  // the published values' all-gather overlaps the next forward
        v.start = 3;
      }
      if (variant == 2) v.scheduler = true;  // and two parameter groups
      if (fp16 && variant != 1) v.cfg.poison_steps = {4};
      CAPTURE(world);
      CAPTURE(variant);
      check_variant<S, Prec, Model>(v);
    }
  }
}

}  // namespace

TEST_CASE("delayed parameter update: each update lands one step late, bitwise (stages 1-3, fp32)") {
  sweep<1, fp32>(false);
  sweep<2, fp32>(false);
  sweep<3, fp32>(false);
}

TEST_CASE("delayed parameter update: fp16 with an overflow step, and bf16 (stages 1-3)") {
  sweep<1, fp16>(true);
  sweep<2, fp16>(true);
  sweep<3, fp16>(true);
  sweep<2, bf16>(false);
  sweep<3, bf16>(false);
  sweep<2, bf16, Mlp<float>>(false);  // emulated bf16, as the GPT example trains
  sweep<3, bf16, Mlp<float>>(false);
}

TEST_CASE("delayed parameter update: the trajectory differs from immediate updates") {
  RunConfig cfg;
  cfg.world = 2;
  cfg.steps = 8;
  Variant v;
  v.cfg = cfg;
  const Delayed d = run_delayed<2, fp32, Mlp<float>>(v);
  const RunResult immediate = train_with<2, fp32, Offload<Cpu>>(cfg, engine_options(cfg), [](const MemoryLedger&) { return true; });
  REQUIRE(immediate.losses.size() == d.run.losses.size());
  CHECK(immediate.losses[0] == d.run.losses[0]);  // the same initial parameters
  CHECK(immediate.losses[1] != d.run.losses[1]);  // step 1 still sees them with the delay
  CHECK(immediate.params != d.run.params);
}

TEST_CASE("delayed parameter update: a state taken after settle() resumes bitwise") {
  for (int world : {1, 2}) {
    CAPTURE(world);
    RunConfig cfg;
    cfg.world = world;
    std::vector<float> straight, resumed;
    comm::run_threads(world, [&](auto& comm) {
      EngineOptions o = engine_options(cfg);
      o.delayed_param_update = true;
      Mlp<half> model;
      OffloadEngine<2, fp16, Offload<Cpu>> engine(comm, model, o);
      init_model(engine, model, 42);
      train_steps(engine, model, comm.rank(), cfg, 0, 5, nullptr);
      engine.settle();
      const EngineState st = engine.state();
      train_steps(engine, model, comm.rank(), cfg, 5, 10, nullptr);
      engine.settle();
      {
        auto g = engine.gather(model);
        if (comm.rank() == 0) straight = model.values();
      }
      Mlp<half> model2;
      OffloadEngine<2, fp16, Offload<Cpu>> other(comm, model2, o);
      init_model(other, model2, 7);
      train_steps(other, model2, comm.rank(), cfg, 0, 2, nullptr);  // an update in flight, then superseded
      other.load_state(st);
      train_steps(other, model2, comm.rank(), cfg, 5, 10, nullptr);
      other.settle();
      {
        auto g = other.gather(model2);
        if (comm.rank() == 0) resumed = model2.values();
      }
    });
    REQUIRE(!straight.empty());
    CHECK(resumed == straight);
  }
}

TEST_CASE("delayed parameter update: new initial values supersede the update in flight") {
  comm::run_threads(2, [&](auto& comm) {
    RunConfig cfg;
    EngineOptions o = engine_options(cfg);
    o.delayed_param_update = true;
    Mlp<float> model;
    OffloadEngine<1, fp32, Offload<Cpu>> engine(comm, model, o);
    init_model(engine, model, 42);
    train_steps(engine, model, comm.rank(), cfg, 0, 3, nullptr);
    std::vector<float> written;
    {  // an update is in flight: it finishes, its values are dropped
      auto g = engine.gather(model, 0);
      model.init(9);
      written = model.values();
    }
    engine.initialize_master();
    const EngineState st = engine.state();  // nothing pending any more
    CHECK(st.global_steps == 3);
    CHECK(st.groups[0].optimizer.step == 3);  // the superseded update was still taken by the optimizer
    {
      auto g = engine.gather(model);
      CHECK(model.values() == written);
    }
    train_steps(engine, model, comm.rank(), cfg, 3, 5, nullptr);  // training goes on
    engine.settle();
    CHECK(engine.state().groups[0].optimizer.step == 5);
  });
}

TEST_CASE("delayed parameter update: pinned buffers of the owned elements in the ledger") {
  comm::run_threads(2, [&](auto& comm) {
    RunConfig cfg;
    cfg.sub_group_size = 7;
    EngineOptions o = engine_options(cfg);
    Mlp<half> a, b;
    OffloadEngine<2, fp16, Offload<Cpu>> plain(comm, a, o);
    o.delayed_param_update = true;
    OffloadEngine<2, fp16, Offload<Cpu>> delayed(comm, b, o);
    const std::size_t owned = plain.state().groups[0].master.size();
    auto pinned = [](const MemoryLedger& m, MemoryCategory c) { return m.live(MemorySpace::pinned_host, c); };
    CHECK(pinned(delayed.memory(), MemoryCategory::grads) - pinned(plain.memory(), MemoryCategory::grads) == 4 * owned);
    CHECK(pinned(delayed.memory(), MemoryCategory::params16) - pinned(plain.memory(), MemoryCategory::params16) == 4 * owned);
    CHECK(delayed.memory().live(MemorySpace::host, MemoryCategory::master32) == 0);
  });
}

TEST_CASE("delayed parameter update: refused where it cannot run, naming the option") {
  comm::run_threads(1, [&](auto& comm) {
    Mlp<float> model;
    EngineOptions o;
    o.delayed_param_update = true;
    try {
      OffloadEngine<2, fp32, Offload<None>> e(comm, model, o);
      FAIL("constructed");
    } catch (const config_error& e) {
      const std::string what = e.what();
      CHECK(what.find("delayed_param_update") != std::string::npos);
      CHECK(what.find("Offload<Cpu>") != std::string::npos);
    }
    o.delayed_param_update_start = -1;
    CHECK_THROWS_AS((OffloadEngine<2, fp32, Offload<Cpu>>(comm, model, o)), config_error);
  });
}

}  // namespace test_delayed_update
