// `zero_optimization.offload_optimizer.device: cpu` selects Offload<Cpu> (config/structure.hpp) and
// `sub_group_size` reaches EngineOptions (engine_config.hpp); what Offload<Cpu> cannot run is
// refused naming the key.
#include <doctest/doctest.h>

#include <string>

#include "zerotk/comm/threads.hpp"
#include "zerotk/config/reader.hpp"
#include "zerotk/engine_config.hpp"
#include "engine_fixture.hpp"

namespace test_offload_config {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;

namespace {
using CpuStage2 = Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Precision<fp16>, Offload<Cpu>>;
using NoneStage2 = Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Precision<fp16>>;
using CpuStage1 = Engine<Partitioner<Stage<1>>, Optimizer<AdamW>, Precision<fp16>, Offload<Cpu>>;

config::Config load(const std::string& zero) {
  config::ResolveContext ctx;
  ctx.world_size = 2;
  return config::load(R"({"train_batch_size": 8, "fp16": {"enabled": true, "initial_scale_power": 8},
                          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                          "zero_optimization": )" + zero + "}",
                      ctx);
}
std::string error_of(auto&& f) {
  try {
    f();
  } catch (const config_error& e) {
    return e.what();
  }
  return {};
}
}  // namespace

TEST_CASE("offload_optimizer.device cpu maps to Offload<Cpu>; sub_group_size reaches the engine") {
  const config::Config cfg = load(R"({"stage": 2, "sub_group_size": 1000, "offload_optimizer": {"device": "cpu"}})");
  const EngineOptions o = engine_options<CpuStage2>(cfg);
  CHECK(o.sub_group_size == 1000);
  // The Offload<None> engine is not what this config asks for.
  const std::string none = error_of([&] { (void)engine_options<NoneStage2>(cfg); });
  CHECK(none.find("/zero_optimization/offload_optimizer/device") != std::string::npos);
  // dispatch picks the Offload<Cpu> engine and it trains.
  const int picked = config::dispatch<NoneStage2, CpuStage2>(cfg, [&]<class E>(std::type_identity<E>) {
    return std::is_same_v<E, CpuStage2> ? 1 : 0;
  });
  CHECK(picked == 1);
  comm::run_threads(2, [&](auto& comm) {
    zt_test::Mlp<half> model;
    CpuStage2 engine(comm, model, o);
    model.init(42);
    engine.initialize_master();
    const std::vector<float> before = model.values();
    zt_test::RunConfig rc;
    zt_test::train_steps(engine, model, comm.rank(), rc, 0, 3, nullptr);
    engine.synchronize();
    CHECK(model.values() != before);
    CHECK(engine.memory().live(MemorySpace::pinned_host, MemoryCategory::optimizer_state) > 0);
  });
}

TEST_CASE("optimizer offload the engine cannot run is refused naming the key") {
  const std::string stage0 = error_of([&] {
    (void)engine_options<CpuStage1>(load(R"({"stage": 0, "offload_optimizer": {"device": "cpu"}})"));
  });
  CAPTURE(stage0);
  // The reader refuses it already (DeepSpeed's rule); an engine with stage 0 and Offload<Cpu> does not compile.
  CHECK(stage0.find("offload_optimizer needs ZeRO stage 1, 2 or 3 (stage is 0)") != std::string::npos);
  const std::string lamb = error_of([&] {
    config::ResolveContext ctx;
    ctx.world_size = 2;
    (void)engine_options<CpuStage1>(config::load(
        R"({"train_batch_size": 8, "fp16": {"enabled": true}, "optimizer": {"type": "Lamb", "params": {"lr": 1e-3}},
            "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}})",
        ctx));
  });
  CHECK(lamb.find("Offload<Cpu>, Offload<Nvme> and OffloadParams<Nvme> step the optimizer sub-group by sub-group and "
                  "run optimizers that step each element alone (Adam, AdamW") != std::string::npos);
}

TEST_CASE("offload_optimizer.device nvme maps to Offload<Nvme> with its swap keys and the aio block") {
  const std::string dir = std::string(ZEROTK_TEST_BINARY_DIR);
  using NvmeStage3 = Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, Precision<fp16>, Offload<Nvme>>;
  using CpuStage3 = Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, Precision<fp16>, Offload<Cpu>>;
  config::ResolveContext ctx;
  ctx.world_size = 2;
  auto with_aio = [&](const std::string& aio) {
    return config::load(R"({"train_batch_size": 8, "fp16": {"enabled": true, "initial_scale_power": 8},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": 3, "sub_group_size": 100, "offload_optimizer": {"device": "nvme",
            "nvme_path": ")" + dir + R"(", "buffer_count": 5, "pipeline_read": true, "pipeline_write": true,
            "fast_init": false}},
        "aio": )" + aio + "}",
                        ctx);
  };
  const config::Config cfg =
      with_aio(R"({"block_size": 262144, "queue_depth": 16, "intra_op_parallelism": 2, "single_submit": true,
                   "overlap_events": false})");
  const EngineOptions o = engine_options<NvmeStage3>(cfg);
  CHECK(o.sub_group_size == 100);
  CHECK(o.nvme.path == dir);
  CHECK(o.nvme.buffer_count == 5);
  CHECK(o.nvme.pipeline_read);
  CHECK(o.nvme.pipeline_write);
  CHECK(o.nvme.aio.block_size == 262144);
  CHECK(o.nvme.aio.queue_depth == 16);
  CHECK(o.nvme.aio.intra_op_parallelism == 2);
  CHECK(o.nvme.aio.single_submit);
  CHECK(!o.nvme.aio.overlap_events);
  const int picked = config::dispatch<CpuStage3, NvmeStage3>(cfg, [&]<class E>(std::type_identity<E>) {
    return std::is_same_v<E, NvmeStage3> ? 1 : 0;
  });
  CHECK(picked == 1);
  comm::run_threads(2, [&](auto& comm) {
    zt_test::Mlp<half> model;
    NvmeStage3 engine(comm, model, o);
    {
      auto g = engine.gather(model, 0);
      model.init(42);
    }
    engine.initialize_master();
    zt_test::RunConfig rc;
    zt_test::train_steps(engine, model, comm.rank(), rc, 0, 3, nullptr);
    CHECK(engine.memory().live(MemorySpace::disk, MemoryCategory::optimizer_state) > 0);
    CHECK(engine.memory().live(MemorySpace::pinned_host, MemoryCategory::optimizer_state) == 0);
  });
  // A block size O_DIRECT cannot use is refused naming the key.
  const std::string bad = error_of([&] { (void)engine_options<NvmeStage3>(with_aio(R"({"block_size": 1000})")); });
  CAPTURE(bad);
  CHECK(bad.find("/aio/block_size") != std::string::npos);
  // Parameter offload stays refused.
  const std::string param = error_of([&] {
    (void)engine_options<NvmeStage3>(config::load(
        R"({"train_batch_size": 8, "fp16": {"enabled": true}, "zero_optimization": {"stage": 3,
            "offload_optimizer": {"device": "nvme", "nvme_path": "/n"}, "offload_param": {"device": "nvme", "nvme_path": "/n"}}})",
        ctx));
  });
  CHECK(param.find("/zero_optimization/offload_param/device") != std::string::npos);
  // ... and reaches an engine with OffloadParams<Nvme>: the path and its read-ahead buffers.
  using BothNvme = Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, Precision<fp16>, Offload<Nvme>, OffloadParams<Nvme>>;
  const EngineOptions both = engine_options<BothNvme>(config::load(
      R"({"train_batch_size": 8, "fp16": {"enabled": true}, "zero_optimization": {"stage": 3,
          "offload_optimizer": {"device": "nvme", "nvme_path": "/n"},
          "offload_param": {"device": "nvme", "nvme_path": "/p", "buffer_count": 3, "buffer_size": 4096,
                            "max_in_cpu": 12345}}})",
      ctx));
  CHECK(both.param_nvme.path == "/p");
  CHECK(both.param_nvme.buffer_count == 3);
  CHECK(both.param_nvme.buffer_size == 4096);
  CHECK(both.param_nvme.max_in_cpu == 12345);
  // Absent, max_in_cpu is DeepSpeed's default (1e9), as in ParamNvmeOptions.
  const EngineOptions fallback = engine_options<BothNvme>(config::load(
      R"({"train_batch_size": 8, "fp16": {"enabled": true}, "zero_optimization": {"stage": 3,
          "offload_optimizer": {"device": "nvme", "nvme_path": "/n"}, "offload_param": {"device": "nvme", "nvme_path": "/p"}}})",
      ctx));
  CHECK(fallback.param_nvme.max_in_cpu == 1'000'000'000);
  CHECK(offload::ParamNvmeOptions{}.max_in_cpu == 1'000'000'000);
}

}  // namespace test_offload_config
