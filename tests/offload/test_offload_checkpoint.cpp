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

using namespace zerotk;
using namespace zt_test;

namespace {
template <int S, class Off>
using E = Engine<Partitioner<zerotk::Stage<S>>, Optimizer<AdamW>, Precision<fp16>, Off>;

template <int S, class Resume>
void save_load_continue(int world) {
  const std::filesystem::path dir = std::filesystem::path(ZEROTK_TEST_BINARY_DIR) / "scratch" /
                                    ("offload_ckpt." + std::to_string(S) + "." + std::to_string(world));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  RunConfig cfg;
  cfg.world = world;
  cfg.gas = 2;
  cfg.clip = 0.5;
  cfg.poison_steps = {1};
  std::vector<float> straight, resumed;
  comm::run_threads(world, [&](auto& comm) {
    EngineOptions o = engine_options(cfg);
    o.sub_group_size = 7;
    Mlp<half> model;
    E<S, Offload<Cpu>> engine(comm, model, o);
    model.init(42);
    engine.initialize_master();
    train_steps(engine, model, comm.rank(), cfg, 0, 4, nullptr);
    (void)checkpoint::save(engine, comm, dir);
    train_steps(engine, model, comm.rank(), cfg, 4, 8, nullptr);
    engine.synchronize();
    if (comm.rank() == 0) straight = model.values();

    Mlp<half> model2;
    E<S, Resume> other(comm, model2, o);
    (void)checkpoint::load(other, comm, dir);
    train_steps(other, model2, comm.rank(), cfg, 4, 8, nullptr);
    other.synchronize();
    if (comm.rank() == 0) resumed = model2.values();
  });
  std::filesystem::remove_all(dir);
  CHECK(!straight.empty());
  CHECK(resumed == straight);
}
}  // namespace

TEST_CASE("an Offload<Cpu> checkpoint resumes bitwise, into Offload<Cpu> and into Offload<None>") {
  for (int world : {1, 2, 3}) {
    CAPTURE(world);
    save_load_continue<1, Offload<Cpu>>(world);
    save_load_continue<2, Offload<Cpu>>(world);
    save_load_continue<2, Offload<None>>(world);
  }
}
