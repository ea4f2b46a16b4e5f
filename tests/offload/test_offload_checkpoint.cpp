// Checkpoints of an Offload<Cpu> engine (checkpoint/ reads the pinned master and moments in place
// through state_views()): save, load into a fresh engine, continue == the uninterrupted run, bit for
// bit; the same checkpoint loads into an Offload<None> engine (offload is not part of the format).
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "zerotk/checkpoint.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/engine.hpp"
#include "engine_fixture.hpp"

namespace test_offload_checkpoint {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using namespace zt_test;

namespace {
template <int S, class Off, class ParamOff = OffloadParams<None>>
using E = Engine<Partitioner<zerotk::Stage<S>>, Optimizer<AdamW>, Precision<fp16>, Off, ParamOff>;
template <class Off, class ParamOff>
using E3 = E<3, Off, ParamOff>;

/// Saves from an engine of (Off1, P1) after 4 steps, loads into a fresh (Off2, P2) engine; its next 4
/// steps equal the uninterrupted run's (a checkpoint holds master and moments; where the state or the
/// 16-bit shards lived is not part of it).
/// `delayed`: both engines with delayed_param_update. The save and the load settle the update in
/// flight themselves; the runs settle before their parameters are read.
template <int S, class Off1, class P1, class Off2, class P2>
void save_load_continue(int world, bool delayed = false) {
  const std::filesystem::path dir = std::filesystem::path(ZEROTK_TEST_BINARY_DIR) / "scratch" /
                                    ("offload_ckpt." + std::to_string(S) + "." + std::to_string(world));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  RunConfig cfg;
  cfg.world = world;
  cfg.gas = 2;
  cfg.clip = 0.5;
  cfg.poison_steps = {1};
  cfg.stage3.param_persistence_threshold = 0;
  std::vector<float> straight, resumed;
  comm::run_threads(world, [&](auto& comm) {
    EngineOptions o = engine_options(cfg);
    o.sub_group_size = 7;
    o.delayed_param_update = delayed;
    Mlp<half> model;
    E<S, Off1, P1> engine(comm, model, o);
    {
      auto g = engine.gather(model, 0);  // stage 3: values exist only in gather scopes
      model.init(42);
    }
    engine.initialize_master();
    train_steps(engine, model, comm.rank(), cfg, 0, 4, nullptr);
    (void)checkpoint::save(engine, comm, dir);
    train_steps(engine, model, comm.rank(), cfg, 4, 8, nullptr);
    engine.settle();
    {
      auto g = engine.gather(model);
      if (comm.rank() == 0) straight = model.values();
    }

    Mlp<half> model2;
    E<S, Off2, P2> other(comm, model2, o);
    (void)checkpoint::load(other, comm, dir);
    train_steps(other, model2, comm.rank(), cfg, 4, 8, nullptr);
    other.settle();
    auto g = other.gather(model2);
    if (comm.rank() == 0) resumed = model2.values();
  });
  std::filesystem::remove_all(dir);
  CHECK(!straight.empty());
  CHECK(resumed == straight);
}
using NoP = OffloadParams<None>;
using CpuP = OffloadParams<Cpu>;
}  // namespace

TEST_CASE("an Offload<Cpu> checkpoint resumes bitwise, into Offload<Cpu> and into Offload<None>") {
  for (int world : {1, 2, 3}) {
    CAPTURE(world);
    save_load_continue<1, Offload<Cpu>, NoP, Offload<Cpu>, NoP>(world);
    save_load_continue<2, Offload<Cpu>, NoP, Offload<Cpu>, NoP>(world);
    save_load_continue<2, Offload<Cpu>, NoP, Offload<None>, NoP>(world);
  }
}

TEST_CASE("with the delayed parameter update, a checkpoint (saved with an update in flight) resumes bitwise") {
  for (int world : {1, 2}) {
    CAPTURE(world);
    save_load_continue<2, Offload<Cpu>, NoP, Offload<Cpu>, NoP>(world, true);
    save_load_continue<3, Offload<Cpu>, CpuP, Offload<Cpu>, CpuP>(world, true);
  }
}

TEST_CASE("stage 3 checkpoints with OffloadParams<Cpu> resume bitwise, into and out of parameter offload") {
  for (int world : {1, 2, 3}) {
    CAPTURE(world);
    save_load_continue<3, Offload<None>, CpuP, Offload<None>, CpuP>(world);
    save_load_continue<3, Offload<Cpu>, CpuP, Offload<Cpu>, CpuP>(world);
    save_load_continue<3, Offload<Cpu>, CpuP, Offload<None>, NoP>(world);
    save_load_continue<3, Offload<None>, NoP, Offload<Cpu>, CpuP>(world);
  }
}

TEST_CASE("a stage 3 OffloadParams<Cpu> checkpoint loads on another world size and continues as OffloadParams<None> does") {
  // Same checkpoint (W = 2) loaded at W = 3 into both kinds: the continued runs are bitwise equal.
  const std::filesystem::path dir = std::filesystem::path(ZEROTK_TEST_BINARY_DIR) / "scratch" / "param_offload_reshard";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  RunConfig cfg;
  cfg.gas = 2;
  cfg.stage3.param_persistence_threshold = 0;
  cfg.world = 2;
  comm::run_threads(2, [&](auto& comm) {
    Mlp<half> model;
    E3<Offload<Cpu>, OffloadParams<Cpu>> engine(comm, model, engine_options(cfg));
    {
      auto g = engine.gather(model, 0);
      model.init(42);
    }
    engine.initialize_master();
    train_steps(engine, model, comm.rank(), cfg, 0, 3, nullptr);
    (void)checkpoint::save(engine, comm, dir);
  });
  cfg.world = 3;
  auto resume = [&]<class Off, class P>(std::type_identity<Off>, std::type_identity<P>) {
    std::vector<float> out;
    comm::run_threads(3, [&](auto& comm) {
      Mlp<half> model;
      E3<Off, P> engine(comm, model, engine_options(cfg));
      (void)checkpoint::load(engine, comm, dir);
      train_steps(engine, model, comm.rank(), cfg, 3, 6, nullptr);
      auto g = engine.gather(model);
      if (comm.rank() == 0) out = model.values();
    });
    return out;
  };
  const auto a = resume(std::type_identity<Offload<Cpu>>{}, std::type_identity<OffloadParams<Cpu>>{});
  const auto b = resume(std::type_identity<Offload<None>>{}, std::type_identity<OffloadParams<None>>{});
  std::filesystem::remove_all(dir);
  CHECK(!a.empty());
  CHECK(a == b);
}

}  // namespace test_offload_checkpoint
