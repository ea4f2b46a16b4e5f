// save_async: the snapshot is taken when it returns; training goes on while the files are written;
// commit() publishes exactly the snapshot. A PendingSave dropped without commit leaves `latest`
// alone, and the next save removes its temporary directory.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "checkpoint_fixture.hpp"
#include "zerotk/comm/threads.hpp"

namespace test_async {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using namespace zt_test;
namespace fs = std::filesystem;

namespace {
using E = Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Precision<fp16>>;

RunConfig config() {
  RunConfig cfg;
  cfg.world = 2;
  cfg.gas = 2;
  return cfg;
}
}  // namespace

TEST_CASE("save_async: training goes on during the write; commit publishes the snapshot, bitwise") {
  ScratchDir d("async");
  const RunConfig cfg = config();
  comm::run_threads(cfg.world, [&](auto& comm) {
    EngineState at_save, after;
    {
      Mlp<half> model;
      E engine(comm, model, engine_options(cfg));
      model.init(42);
      engine.initialize_master();
      engine.set_scheduler(warmup_schedule());
      train_steps(engine, model, comm.rank(), cfg, 0, 3, nullptr);
      at_save = engine.state();
      auto pending = checkpoint::save_async(engine, comm, d.path(), {.client_state = bytes_of("snap")});
      CHECK(pending->tag() == "global_step3");
      train_steps(engine, model, comm.rank(), cfg, 3, 5, nullptr);  // the engine moves on
      after = engine.state();
      CHECK(pending->commit().tag == "global_step3");
      CHECK_THROWS_WITH_AS(pending->commit(), doctest::Contains("commit() was already called"), usage_error);
    }
    CHECK(!same_state(after, at_save));  // the run did move on during the write
    Mlp<half> model;
    E engine(comm, model, engine_options(cfg));
    engine.set_scheduler(warmup_schedule());
    const auto loaded = checkpoint::load(engine, comm, d.path());
    CHECK(text_of(loaded.client_state) == "snap");
    CHECK(same_state(engine.state(), at_save));
  });
}

TEST_CASE("save_async dropped without commit: latest still names the previous checkpoint; the next save cleans up") {
  ScratchDir d("async_drop");
  const RunConfig cfg = config();
  comm::run_threads(cfg.world, [&](auto& comm) {
    Mlp<half> model;
    E engine(comm, model, engine_options(cfg));
    model.init(42);
    engine.initialize_master();
    engine.set_scheduler(warmup_schedule());
    train_steps(engine, model, comm.rank(), cfg, 0, 1, nullptr);
    checkpoint::save(engine, comm, d.path());
    train_steps(engine, model, comm.rank(), cfg, 1, 2, nullptr);
    { auto dropped = checkpoint::save_async(engine, comm, d.path()); }  // never committed
    comm.barrier().wait();
    CHECK(checkpoint::read_latest(d.path()) == "global_step1");
    CHECK(fs::exists(d / ".tmp.global_step2"));
    CHECK(!fs::exists(d / "global_step2"));
    comm.barrier().wait();
    train_steps(engine, model, comm.rank(), cfg, 2, 3, nullptr);
    checkpoint::save(engine, comm, d.path());
    CHECK(!fs::exists(d / ".tmp.global_step2"));
    CHECK(checkpoint::read_latest(d.path()) == "global_step3");
  });
  checkpoint::verify(d.path());
}

}  // namespace test_async
