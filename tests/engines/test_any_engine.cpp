// AnyEngine (zerotk/any_engine.hpp) over the compiled engine set: make_engine picks the engine a
// DeepSpeed config asks for, which trains to the bits of the typed engine of the same policies
// built with the same options (a control instantiated in this TU: the policy's default bucket plus
// 2 bytes makes it another type, and the config's bucket size overrides the policy's); a config no
// compiled engine fits is refused naming the nearest; an AnyEngine checkpoint resumes bit for bit;
// both models of the engine's face pass its check.
#include <doctest/doctest.h>

#include <string>
#include <unistd.h>

#include "zerotk/any_engine.hpp"
#include "zerotk/config/reader.hpp"
#include "zerotk/engine/api.hpp"
#include "zerotk/engine_config.hpp"
#include "zerotk/engines.hpp"
#include "zerotk/erased_engine.hpp"
#if ZEROTK_HAS_XXHASH
#include "zerotk/checkpoint.hpp"
#endif
// the fixture after engines.hpp: the extern declarations come before any use of the set's types
#include "../engine/engine_fixture.hpp"
#include "zerotk/comm/threads.hpp"

namespace {

using namespace zerotk;

static_assert(check_training_engine_v<AnyEngine>);
static_assert(check_training_engine_v<Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, Precision<bf16>>>);

std::string config_text(int stage, const char* precision) {
  return std::string(R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
    "gradient_clipping": 0.5, ")") + precision + R"(": {"enabled": true},
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.01, "warmup_num_steps": 3}},
    "zero_optimization": {"stage": )" + std::to_string(stage) + R"(, "reduce_bucket_size": 64}})";
}

config::Config load(int stage, const char* precision, int world) {
  config::ResolveContext ctx;
  ctx.world_size = world;
  return config::load(config_text(stage, precision), ctx);
}

zt_test::RunConfig run_config() {
  zt_test::RunConfig cfg;
  cfg.world = 2;
  cfg.steps = 6;
  cfg.gas = 2;
  return cfg;
}

/// Trains `model` with `engine` on this rank; the result (rank 0's is kept by the callers).
template <class E>
zt_test::RunResult train(E& engine, zt_test::Mlp<bfloat16>& model, int rank, const zt_test::RunConfig& cfg) {
  zt_test::init_model(engine, model, 42);
  zt_test::RunResult mine;
  zt_test::train_steps(engine, model, rank, cfg, 0, cfg.steps, &mine);
  auto g = engine.gather(model);
  mine.params = model.values();
  return mine;
}

/// make_engine's AnyEngine over the config.
template <int S>
zt_test::RunResult run_any(const zt_test::RunConfig& rc, const config::Config& cfg) {
  zt_test::RunResult result;
  comm::run_threads(rc.world, [&](auto& comm) {
    zt_test::Mlp<bfloat16> model;
    AnyEngine e = make_engine(cfg, comm, model);
    CHECK(e.stage() == S);
    CHECK(e.storage_dtype() == DType::bf16);
    CHECK(e.optimizer_name() == "AdamW");
    zt_test::RunResult mine = train(e, model, comm.rank(), rc);
    if (comm.rank() == 0) result = std::move(mine);
  });
  return result;
}

/// The typed engine E with the config's options and scheduler, as a trainer without AnyEngine
/// would build it.
template <class E>
zt_test::RunResult run_typed(const zt_test::RunConfig& rc, const config::Config& cfg) {
  zt_test::RunResult result;
  comm::run_threads(rc.world, [&](auto& comm) {
    zt_test::Mlp<bfloat16> model;
    E e(comm, model, engine_options<E>(cfg));
    e.set_scheduler(*lr_scheduler(cfg));
    zt_test::RunResult mine = train(e, model, comm.rank(), rc);
    if (comm.rank() == 0) result = std::move(mine);
  });
  return result;
}

/// AnyEngine::of<E>: a typed engine erased here (E compiled in this TU).
template <class E>
zt_test::RunResult run_erased(const zt_test::RunConfig& rc, const config::Config& cfg) {
  zt_test::RunResult result;
  comm::run_threads(rc.world, [&](auto& comm) {
    zt_test::Mlp<bfloat16> model;
    AnyEngine e = AnyEngine::of<E>(comm, model, engine_options<E>(cfg));
    e.set_scheduler(*lr_scheduler(cfg));
    zt_test::RunResult mine = train(e, model, comm.rank(), rc);
    if (comm.rank() == 0) result = std::move(mine);
  });
  return result;
}

template <int S>
void compare_stage() {
  const zt_test::RunConfig rc = run_config();
  const config::Config cfg = load(S, "bf16", rc.world);
  // Not the compiled type (its bucketer differs, which the config's reduce_bucket_size overrides):
  // instantiated here. The policies in another order would be the compiled type itself.
  using Local = Engine<Precision<bf16>, Optimizer<AdamW>, Partitioner<Stage<S>>, Bucketer<Bytes<1'000'000'002>>>;
  static_assert(!std::is_same_v<Local, Engine<Partitioner<Stage<S>>, Optimizer<AdamW>, Precision<bf16>>>);
  const zt_test::RunResult any = run_any<S>(rc, cfg);
  const zt_test::RunResult typed = run_typed<Local>(rc, cfg);
  REQUIRE(any.losses.size() == static_cast<std::size_t>(rc.steps));
  CHECK(any.params == typed.params);  // bitwise
  CHECK(any.losses == typed.losses);
  CHECK(any.norms == typed.norms);
  CHECK(any.params != any.initial);
  if constexpr (S == 3) {  // the same typed engine behind AnyEngine::of: the erasure changes no bit
    const zt_test::RunResult erased = run_erased<Local>(rc, cfg);
    CHECK(erased.params == typed.params);
    CHECK(erased.losses == typed.losses);
  }
}

}  // namespace

TEST_CASE("make_engine's engine trains to the bits of the typed engine of the same policies and options") {
  compare_stage<2>();
  compare_stage<3>();
}

TEST_CASE("make_engine picks stage, precision and optimizer from the config") {
  for (const char* precision : {"fp16", "bf16"}) {
    for (int stage = 0; stage <= 3; ++stage) {
      const config::Config cfg = load(stage, precision, 1);
      comm::run_threads(1, [&](auto& comm) {
        zt_test::Mlp<float> model;  // float Params over 16-bit storage (emulated 16-bit)
        AnyEngine e = make_engine(cfg, comm, model);
        CHECK(e.stage() == stage);
        CHECK(e.storage_dtype() == (std::string(precision) == "fp16" ? DType::fp16 : DType::bf16));
        CHECK(e.description().find("Stage<" + std::to_string(stage) + ">") != std::string::npos);
      });
    }
  }
}

TEST_CASE("a config no compiled engine fits is refused naming its combination and the nearest compiled ones") {
  config::ResolveContext ctx;
  const config::Config cfg = config::load(R"({"train_micro_batch_size_per_gpu": 1,
      "optimizer": {"type": "Lamb", "params": {"lr": 0.01}}, "zero_optimization": {"stage": 1}})", ctx);
  comm::run_threads(1, [&](auto& comm) {
    zt_test::Mlp<float> model;
    try {
      (void)make_engine(cfg, comm, model);
      FAIL("make_engine accepted a config no compiled engine fits");
    } catch (const config_error& e) {
      const std::string what = e.what();
      CHECK(what.find("no engine of the compiled set fits this config") != std::string::npos);
      CHECK(what.find("Lamb") != std::string::npos);  // the config's combination
      CHECK(what.find("the nearest of the") != std::string::npos);
      CHECK(what.find("Stage<1>") != std::string::npos);  // a near one: same stage, other optimizer
      CHECK(what.find("ZEROTK_ENGINES") != std::string::npos);
      // compiled_engine_for refuses it with the same words, without a communicator or a model
      try {
        (void)compiled_engine_for(cfg);
        FAIL("compiled_engine_for accepted a config no compiled engine fits");
      } catch (const config_error& e2) {
        CHECK(std::string(e2.what()) == what);
      }
    }
  });
}

TEST_CASE("a config asking for tensor or pipeline parallelism is refused on a communicator that is no such grid") {
  // Issue 57 item 15: a trainer that builds no grid trained plain data parallel on such a config.
  config::ResolveContext ctx;
  ctx.world_size = 2;
  for (const char* key : {"tensor_model_parallel_size", "pipeline_parallelism"}) {
    CAPTURE(key);
    const bool tensor = std::string(key) == "tensor_model_parallel_size";
    const config::Config cfg = config::load(
        std::string(R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "bf16": {"enabled": true},
                        "zero_optimization": {"stage": 2}, )") +
            (tensor ? R"("tensor_model_parallel_size": 2})" : R"("pipeline_parallelism": {"num_stages": 2}})"),
        ctx);
    std::string what;
    comm::run_threads(2, [&](auto& comm) {
      zt_test::Mlp<float> model;
      try {
        (void)make_engine(cfg, comm, model);
      } catch (const config_error& e) {
        if (comm.rank() == 0) what = e.what();
      }
    });
    CHECK(what.find(tensor ? "/tensor_model_parallel_size" : "/pipeline_parallelism/num_stages") != std::string::npos);
    CHECK(what.find("a plain communicator (data parallel only)") != std::string::npos);
    CHECK(what.find("grid_shape(cfg)") != std::string::npos);
    if (tensor) {  // on the grid the config describes, the same config builds
      comm::run_threads(2, [&](auto& comm) {
        comm::ProcessGrid grid(comm, grid_shape(cfg));
        zt_test::Mlp<float> model;
        AnyEngine e = make_engine(cfg, grid, model);
        CHECK(e.grid_place().tensor_size == 2);
      });
    }
  }
}

TEST_CASE("compiled_engine_for names the engine make_engine builds; AnyEngine reports its links and offload") {
  const config::Config cfg = load(2, "bf16", 2);
  const std::string name = compiled_engine_for(cfg);
  CHECK(name.find("Stage<2>") != std::string::npos);
  CHECK(name.find("Precision<bf16>") != std::string::npos);
  comm::run_threads(2, [&](auto& comm) {
    zt_test::Mlp<float> model;
    AnyEngine e = make_engine(cfg, comm, model);
    CHECK(e.description() == name);
    CHECK(e.topology().levels() == 1);  // flat: no hierarchical collectives, no ZeRO++ exchanges
    CHECK(e.link_stats() == nullptr);
    CHECK(e.group_comm_stats() == nullptr);
    CHECK(e.quantized_weights_stats() == nullptr);
    CHECK(e.quantized_gradients_stats() == nullptr);
    CHECK(e.param_bytes_in_cpu() == 0);  // parameters not offloaded to NVMe
  });
}

#if ZEROTK_HAS_XXHASH
TEST_CASE("an AnyEngine checkpoint resumes bit for bit (stage 3, bf16, 3 + 3 steps against 6)") {
  zt_test::RunConfig rc = run_config();
  const config::Config cfg = load(3, "bf16", rc.world);
  const zt_test::RunResult whole = run_any<3>(rc, cfg);
  const std::filesystem::path dir = std::filesystem::path(ZEROTK_TEST_BINARY_DIR) /
                                    ("any_engine_ckpt." + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  zt_test::RunResult resumed;
  comm::run_threads(rc.world, [&](auto& comm) {
    {  // 3 steps, then a checkpoint
      zt_test::Mlp<bfloat16> model;
      AnyEngine e = make_engine(cfg, comm, model);
      zt_test::init_model(e, model, 42);
      zt_test::train_steps(e, model, comm.rank(), rc, 0, 3, nullptr);
      checkpoint::save(e, comm, dir);
    }
    zt_test::Mlp<bfloat16> model;  // a new model and engine: load, then steps 3..5
    AnyEngine e = make_engine(cfg, comm, model);
    const checkpoint::LoadResult r = checkpoint::load(e, comm, dir);
    CHECK(e.global_steps() == 3);
    CHECK(!r.resharded);
    zt_test::RunResult mine;
    zt_test::train_steps(e, model, comm.rank(), rc, 3, rc.steps, &mine);
    {
      auto g = e.gather(model);
      mine.params = model.values();
    }
    if (comm.rank() == 0) resumed = std::move(mine);
  });
  std::filesystem::remove_all(dir);
  REQUIRE(resumed.losses.size() == 3);
  CHECK(resumed.params == whole.params);  // bitwise
  for (std::size_t i = 0; i < 3; ++i) CHECK(resumed.losses[i] == whole.losses[3 + i]);
}
#endif
