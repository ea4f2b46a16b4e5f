// Save at step k, continue to n; a fresh engine loads step k and continues to n: bitwise the same
// fp32 masters, optimizer states, counters, scaler, scheduler and parameters.
#include <doctest/doctest.h>

#include <mutex>
#include <string>
#include <vector>

#include "checkpoint_fixture.hpp"
#include "zerotk/comm/threads.hpp"

namespace test_resume {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using namespace zt_test;

namespace {

struct Outcome {
  EngineState state;
  std::vector<float> params;
};

template <class E, class Model>
Outcome finish(E& engine, Model& model) {
  engine.synchronize();
  return {engine.state(), model.values()};
}

}  // namespace

TEST_CASE_TEMPLATE("save at step k, load into a fresh engine, continue: bitwise equal to the uninterrupted run", S,
                   Stage<0>, Stage<1>, Stage<2>) {
  using E = Engine<Partitioner<S>, Optimizer<AdamW>, Precision<fp16>>;
  RunConfig cfg;
  cfg.world = 2;
  cfg.gas = 2;  // GAS > 1
  cfg.clip = 0.05;
  cfg.poison_steps = {1};  // an overflow at step 1: the scaler is mid-hysteresis at the save
  constexpr int k = 3, n = 6;
  ScratchDir dir("resume");
  const std::string client = "epoch=1 batch=17 rng=0xfeed";
  comm::run_threads(cfg.world, [&](auto& comm) {
    Outcome straight, resumed;
    EngineState at_save;
    {
      Mlp<half> model;
      E engine(comm, model, engine_options(cfg));
      model.init(42);
      engine.initialize_master();
      engine.set_scheduler(warmup_schedule());
      train_steps(engine, model, comm.rank(), cfg, 0, k, nullptr);
      at_save = engine.state();
      const auto saved = checkpoint::save(engine, comm, dir.path(), {.client_state = bytes_of(client)});
      CHECK(saved.tag == "global_step3");
      train_steps(engine, model, comm.rank(), cfg, k, n, nullptr);
      straight = finish(engine, model);
    }
    // What the save point covers (so this test cannot pass vacuously).
    CHECK(at_save.skipped_steps == 1);
    CHECK(at_save.scaler.hyst == 1);  // one overflow absorbed, hysteresis 2
    REQUIRE(at_save.scheduler.has_value());
    CHECK(at_save.scheduler->last_batch_iteration == 1);  // 2 applied updates into an 8-step warm-up
    CHECK(at_save.micro_steps == k * cfg.gas);

    Mlp<half> model;  // fresh model and engine: values and moments zero until loaded
    E engine(comm, model, engine_options(cfg));
    engine.set_scheduler(warmup_schedule());
    const checkpoint::LoadResult loaded = checkpoint::load(engine, comm, dir.path());
    CHECK(loaded.tag == "global_step3");
    CHECK(loaded.global_steps == k);
    CHECK(text_of(loaded.client_state) == client);
    CHECK(same_state(engine.state(), at_save));
    train_steps(engine, model, comm.rank(), cfg, k, n, nullptr);
    resumed = finish(engine, model);

    CHECK(straight.state.global_steps == n);
    CHECK(same_state(resumed.state, straight.state));
    CHECK(same_bits(resumed.params, straight.params));
  });
  CHECK(checkpoint::read_latest(dir.path()) == "global_step3");
  const checkpoint::Manifest m = checkpoint::verify(dir.path());
  CHECK(m.stage == S::value);
  CHECK(m.world_size == 2);
  CHECK(m.precision == "fp16");
  CHECK(m.optimizer == "AdamW");
}

TEST_CASE("an fp32 Adam engine on 3 ranks (odd world, stage 1, named tag) resumes bitwise") {
  using E = Engine<Partitioner<Stage<1>>, Optimizer<Adam>, Precision<fp32>>;
  RunConfig cfg;
  cfg.world = 3;
  cfg.gas = 1;
  ScratchDir dir("resume3");
  comm::run_threads(cfg.world, [&](auto& comm) {
    Outcome straight;
    {
      Mlp<float> model;
      E engine(comm, model, engine_options(cfg));
      model.init(42);
      engine.initialize_master();
      train_steps(engine, model, comm.rank(), cfg, 0, 2, nullptr);
      checkpoint::save(engine, comm, dir.path(), {.tag = "mid"});
      train_steps(engine, model, comm.rank(), cfg, 2, 4, nullptr);
      straight = finish(engine, model);
    }
    Mlp<float> model;
    E engine(comm, model, engine_options(cfg));
    CHECK(checkpoint::load(engine, comm, dir.path()).tag == "mid");
    train_steps(engine, model, comm.rank(), cfg, 2, 4, nullptr);
    const Outcome resumed = finish(engine, model);
    CHECK(same_state(resumed.state, straight.state));
    CHECK(same_bits(resumed.params, straight.params));
  });
}

}  // namespace test_resume
