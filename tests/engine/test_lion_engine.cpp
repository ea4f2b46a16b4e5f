// Optimizer<Lion> in the engine: the stages give the same bits (one elementwise update over the
// same reduced gradients), Offload<Cpu> (the rule through the sub-group loop on pinned memory) gives
// the bits of Offload<None>, and so does Offload<Nvme>; the stores keep one moment (the ledger's
// optimizer state is 4 bytes per owned element, in memory and on disk), and a DeepSpeed config of
// type "Lion" builds it.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "engine_fixture.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/engine.hpp"
#if ZEROTK_HAS_JSON
#include "zerotk/config.hpp"
#include "zerotk/engine_config.hpp"
#endif

namespace test_lion_engine {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using zt_test::RunConfig;
using zt_test::RunResult;

namespace {

RunConfig lion_config() {
  RunConfig cfg;
  cfg.world = 2;
  cfg.steps = 10;
  cfg.gas = 2;
  cfg.clip = 0.5;
  cfg.poison_steps = {4};  // a skipped step leaves m as it was
  cfg.reduce_every_micro_step = true;
  cfg.stage3.param_persistence_threshold = 0;
  cfg.sub_group_size = 50;  // Offload<Cpu> steps in several sub-groups
  return cfg;
}

template <int S, class... Policies>
RunResult lion_run(const RunConfig& cfg) {
  RunResult out;
  std::mutex mu;
  comm::run_threads(cfg.world, [&](comm::ThreadsCommunicator& c) {
    // train_rank honours cfg.reduce_every_micro_step for stages 0 and 1 (train_on takes the policy's default).
    RunResult r = zt_test::train_rank<S, fp32, comm::ThreadsCommunicator, zt_test::Mlp<float>, Optimizer<Lion>, Policies...>(c, cfg);
    std::lock_guard lock(mu);
    if (c.rank() == 0) out = std::move(r);
  });
  return out;
}

}  // namespace

TEST_CASE("Lion in the engine: stages 0-3 give the same bits; Offload<Cpu> gives Offload<None>'s") {
  const RunConfig cfg = lion_config();
  // Stages 0 and 1 reduce every micro-step here, as 2 and 3 always do: the same order everywhere.
  const RunResult s0 = lion_run<0>(cfg);
  CHECK(s0.params != s0.initial);
  CHECK(s0.skipped[4]);
  for (const RunResult& other : {lion_run<1>(cfg), lion_run<2>(cfg), lion_run<3>(cfg), lion_run<2, Offload<Cpu>>(cfg)}) {
    CHECK(other.params == s0.params);
    CHECK(other.norms == s0.norms);
    CHECK(other.losses == s0.losses);
  }
}

TEST_CASE("Lion in the engine keeps one moment: 4 bytes of optimizer state per owned element") {
  comm::run_threads(2, [](comm::ThreadsCommunicator& c) {
    zt_test::Mlp<float> model;
    Engine<Partitioner<Stage<2>>, Optimizer<Lion>> lion(c, model);
    Engine<Partitioner<Stage<2>>, Optimizer<AdamW>> adam(c, model);
    const auto state = [](const auto& e) { return e.memory().live(MemorySpace::host, MemoryCategory::optimizer_state); };
    const auto master = [](const auto& e) { return e.memory().live(MemorySpace::host, MemoryCategory::master32); };
    CHECK(state(lion) == master(lion));      // m: one fp32 per owned element, as the master
    CHECK(state(adam) == 2 * master(adam));  // m and v
    CHECK(lion.state().groups[0].optimizer.v.empty());
  });
}

TEST_CASE("Lion with its state in a swap file (Offload<Nvme>): Offload<None>'s bits, one moment on disk") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("zerotk_test_lion_nvme." + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  RunConfig cfg = lion_config();
  cfg.nvme.path = dir;
  const RunResult ref = lion_run<2>(cfg);
  for (const RunResult& nvme : {lion_run<2, Offload<Nvme>>(cfg), lion_run<3, Offload<Nvme>>(cfg)}) {
    CHECK(nvme.params == ref.params);
    CHECK(nvme.norms == ref.norms);
  }
  comm::run_threads(2, [&](comm::ThreadsCommunicator& c) {
    zt_test::Mlp<float> model;
    EngineOptions o;
    o.nvme.path = dir;
    Engine<Partitioner<Stage<2>>, Optimizer<Lion>, Offload<Nvme>> lion(c, model, o);
    const auto disk = [&](MemoryCategory k) { return lion.memory().live(MemorySpace::disk, k); };
    CHECK(disk(MemoryCategory::master32) > 0);
    CHECK(disk(MemoryCategory::optimizer_state) == disk(MemoryCategory::master32));  // m only, both slots
  });
  fs::remove_all(dir);
}

#if ZEROTK_HAS_JSON
TEST_CASE("a DeepSpeed config of type Lion builds Optimizer<Lion> with its keys, and refuses Adam's eps") {
  config::ResolveContext ctx;
  const config::Config cfg = config::load(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2},
      "optimizer": {"type": "lion", "params": {"lr": 2e-4, "betas": [0.9, 0.99], "weight_decay": 0.1}}})", ctx);
  using E = Engine<Partitioner<Stage<2>>, Optimizer<Lion>>;
  const EngineOptions o = engine_options<E>(cfg);
  CHECK(o.optimizer.lr == 2e-4);
  CHECK(o.optimizer.beta2 == 0.99);
  CHECK(o.optimizer.weight_decay == 0.1);
  CHECK(config::describe<E>().find("Optimizer<Lion>") != std::string::npos);
  using AdamWEngine = Engine<Partitioner<Stage<2>>, Optimizer<AdamW>>;  // one macro argument
  CHECK_THROWS_WITH_AS(
      engine_options<AdamWEngine>(cfg),
      doctest::Contains("config asks for Optimizer<Lion>, the engine was compiled with Optimizer<AdamW>"), config_error);
  const config::ParseResult eps = config::parse(
      R"({"train_batch_size": 8, "optimizer": {"type": "Lion", "params": {"eps": 1e-8}}})", ctx);
  CHECK_FALSE(eps.ok());
  const config::Json j = config::to_json(cfg);
  CHECK(j["optimizer"]["type"] == "Lion");
  CHECK_FALSE(j["optimizer"]["params"].contains("eps"));
  CHECK(j["optimizer"]["params"]["betas"][1] == 0.99);
}
#endif

}  // namespace test_lion_engine
