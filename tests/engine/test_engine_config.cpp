// A DeepSpeed JSON config drives the engine: numbers into EngineOptions, the scheduler, and a clear
// error naming both sides when the config asks for a structure the engine was not compiled with.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "zerotk/config/reader.hpp"
#include "zerotk/engine_config.hpp"

namespace test_engine_config {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;

namespace {
constexpr const char* kStage2 = R"({
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 2,
  "gradient_clipping": 0.5,
  "fp16": {"enabled": true, "initial_scale_power": 12, "loss_scale_window": 500, "hysteresis": 3},
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.8, 0.95], "eps": 1e-6, "weight_decay": 0.1}},
  "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-4, "warmup_num_steps": 10,
                                               "warmup_type": "linear"}},
  "zero_optimization": {"stage": 2, "reduce_bucket_size": 5e5, "overlap_comm": true}
})";
using Stage2 = Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Precision<fp16>>;
using Stage1Bf16 = Engine<Partitioner<Stage<1>>, Optimizer<AdamW>, Precision<bf16>>;
}  // namespace

TEST_CASE("DeepSpeed JSON numbers become EngineOptions") {
  config::ResolveContext ctx;
  ctx.world_size = 4;
  const config::Config cfg = config::load(kStage2, ctx);
  const EngineOptions o = engine_options<Stage2>(cfg);
  CHECK(o.reduce_bucket_size == 500000);  // elements in JSON and in the engine
  CHECK(o.gradient_accumulation_steps == 2);
  CHECK(o.gradient_clipping == 0.5);
  CHECK(o.overlap_comm);
  CHECK(o.optimizer.lr == doctest::Approx(3e-4));
  CHECK(o.optimizer.beta1 == doctest::Approx(0.8));
  CHECK(o.optimizer.beta2 == doctest::Approx(0.95));
  CHECK(o.optimizer.eps == doctest::Approx(1e-6));
  CHECK(o.optimizer.weight_decay == doctest::Approx(0.1));
  CHECK(o.loss_scaler.initial_scale_power == 12);
  CHECK(o.loss_scaler.loss_scale_window == 500);
  CHECK(o.loss_scaler.hysteresis == 3);
  CHECK(cfg.train_batch_size == 4 * 2 * 4);

  auto sched = lr_scheduler(cfg);
  REQUIRE(sched.has_value());
  CHECK(sched->name() == "WarmupLR");
  CHECK(sched->lr_at(4) == doctest::Approx(3e-4 * 4 / 10));
}

TEST_CASE("a config that asks for another structure names both sides") {
  config::ResolveContext ctx;
  ctx.world_size = 2;
  const config::Config cfg = config::load(kStage2, ctx);
  try {
    (void)engine_options<Stage1Bf16>(cfg);
    FAIL("expected a config_error");
  } catch (const config_error& e) {
    const std::string what = e.what();
    CHECK(what.find("stage") != std::string::npos);
    CHECK(what.find("2") != std::string::npos);
    CHECK(what.find("1") != std::string::npos);
    CHECK(what.find("bf16") != std::string::npos);
    CHECK(what.find("fp16") != std::string::npos);
  }
}

TEST_CASE("settings this version cannot honour are errors, not silently ignored") {
  config::ResolveContext ctx;
  const std::string text = R"({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": true},
                               "zero_optimization": {"stage": 2}, "gradient_predivide_factor": 2.0,
                               "prescale_gradients": true})";
  const config::Config cfg = config::load(text, ctx);
  try {
    (void)engine_options<Stage2>(cfg);
    FAIL("expected a config_error");
  } catch (const config_error& e) {
    const std::string what = e.what();
    CHECK(what.find("/gradient_predivide_factor") != std::string::npos);
    CHECK(what.find("/prescale_gradients") != std::string::npos);
  }
}

TEST_CASE("engine_options copies the layers' structs whole: doubles stay what the file says") {
  config::ResolveContext ctx;
  ctx.world_size = 4;
  const config::Config cfg = config::load(kStage2, ctx);
  const EngineOptions o = engine_options<Stage2>(cfg);
  CHECK(o.optimizer.lr == 3e-4);  // exact: no float in between
  CHECK(o.optimizer.beta1 == 0.8);
  CHECK(o.optimizer.eps == 1e-6);
  CHECK(o.loss_scaler.initial_scale_power == 12);
  CHECK(o.loss_scaler.static_scale == 0);
  CHECK(o.loss_scaler.raise_error_at_min_scale);
  CHECK(lr_scheduler(cfg)->lr_at(10) == 3e-4);  // after the warm-up: exactly the double the file gives
}

// Hostile-input issue, item 6, where engine_options used to narrow (bytes = elements * sizeof(storage)
// wrapped; an int64 GAS went into an int). The bucket size now counts elements end to end and GAS is
// the StepOptions int the engine takes, so nothing narrows: a huge bucket is one bucket, and what a
// Config built in code gets wrong is still named.
TEST_CASE("engine_options takes sizes as they are and rejects values out of range, naming the key") {
  using Fp32Stage2 = Engine<Partitioner<Stage<2>>, Optimizer<AdamW>>;
  config::ResolveContext ctx;
  const config::Config big = config::load(
      R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "reduce_bucket_size": 4611686018427387904}})", ctx);
  CHECK(engine_options<Fp32Stage2>(big).reduce_bucket_size == std::size_t{4611686018427387904});

  config::Config cfg = config::load(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2}})", ctx);
  cfg.gradient_accumulation_steps = 0;
  CHECK_THROWS_WITH_AS(engine_options<Fp32Stage2>(cfg),
                       doctest::Contains("/gradient_accumulation_steps: must be >= 1 (got 0)"), config_error);
  cfg.zero_optimization.reduce_bucket_size = 0;  // 0 would be "the Bucketer policy's" to the engine
  cfg.gradient_accumulation_steps = 1;
  CHECK_THROWS_WITH_AS(engine_options<Fp32Stage2>(cfg),
                       doctest::Contains("/zero_optimization/reduce_bucket_size: must be >= 1 (elements per bucket)"),
                       config_error);
  cfg.zero_optimization.reduce_bucket_size = 1000;
  cfg.optimizer = config::OptimizerBlock{};
  cfg.optimizer->params.lr = 1e300;
  cfg.optimizer->params.beta2 = -2;
  try {
    (void)engine_options<Fp32Stage2>(cfg);
    FAIL("expected a config_error");
  } catch (const config_error& e) {
    const std::string what = e.what();
    CHECK(what.find("/optimizer/params/lr: is beyond float's range") != std::string::npos);
    CHECK(what.find("(got 1e+300)") != std::string::npos);
    CHECK(what.find("/optimizer/params/betas: beta2 must be in [0, 1) (got -2)") != std::string::npos);
  }
}

TEST_CASE("grad_accum_dtype and fp16_override_modules reach EngineOptions") {
  config::ResolveContext ctx;
  config::Config cfg = config::load(R"({"train_batch_size": 8, "fp16": {"enabled": true}, "zero_optimization": {"stage": 2},
                                        "data_types": {"grad_accum_dtype": "fp32"},
                                        "fp16_override_modules": ["LayerNorm"]})",
                                    ctx);
  EngineOptions o = engine_options<Stage2>(cfg);
  CHECK(o.grad_accum_dtype == DType::fp32);
  CHECK(o.fp32_module_types == std::vector<std::string>{"LayerNorm"});
  cfg = config::load(R"({"train_batch_size": 8, "fp16": {"enabled": true}, "zero_optimization": {"stage": 2}})", ctx);
  o = engine_options<Stage2>(cfg);
  CHECK(o.grad_accum_dtype == DType::fp16);  // absent: DeepSpeed's order, the training precision
  CHECK(o.fp32_module_types.empty());
}

TEST_CASE("the stage3_* keys and the module type lists reach EngineOptions::stage3") {
  using Stage3 = Engine<Partitioner<Stage<3>>, Optimizer<AdamW>>;
  config::ResolveContext ctx;
  const config::Config cfg = config::load(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
      "stage3_prefetch_bucket_size": 1000, "stage3_param_persistence_threshold": 10,
      "stage3_model_persistence_threshold": 100, "stage3_max_live_parameters": 5000, "stage3_max_reuse_distance": 7},
      "zero_allowed_param_types": ["Block"], "zero_force_param_types": ["Embedding"]})",
                                          ctx);
  const Stage3Options s = engine_options<Stage3>(cfg).stage3;
  CHECK(s.prefetch_bucket_size == 1000);
  CHECK(s.param_persistence_threshold == 10);
  CHECK(s.model_persistence_threshold == 100);
  CHECK(s.max_live_parameters == 5000);
  CHECK(s.max_reuse_distance == 7);
  CHECK(s.partitioned_module_types == std::vector<std::string>{"Block"});
  CHECK(s.replicated_module_types == std::vector<std::string>{"Embedding"});
}

TEST_CASE("zero_hpz_partition_size becomes Stage3Options::reshard_after_forward = group(g)") {
  using Stage3 = Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, Precision<fp16>>;
  config::ResolveContext ctx;
  ctx.world_size = 4;
  config::Config cfg = config::load(
      R"({"train_batch_size": 8, "fp16": {"enabled": true}, "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2}})",
      ctx);
  EngineOptions o = engine_options<Stage3>(cfg);
  CHECK(o.stage3.reshard_after_forward.group_size() == 2);
  CHECK(o.stage3.reshard_after_forward.hierarchical());
  cfg = config::load(R"({"train_batch_size": 8, "fp16": {"enabled": true}, "zero_optimization": {"stage": 3}})", ctx);
  o = engine_options<Stage3>(cfg);
  CHECK(o.stage3.reshard_after_forward == ReshardAfterForward(true));  // absent: 1, hpZ off
}

TEST_CASE("gradient_compression: the engine's codec matches the algorithm, its knobs reach EngineOptions::compression") {
  using TopKEngine = Engine<Partitioner<Stage<0>>, Optimizer<AdamW>, Precision<fp32>, GradientCompression<TopK>>;
  using PlainEngine = Engine<Partitioner<Stage<0>>, Optimizer<AdamW>, Precision<fp32>>;
  config::ResolveContext ctx;
  const config::Config cfg = config::load(R"({"train_batch_size": 1, "zero_optimization": {"stage": 0},
      "gradient_compression": {"algorithm": "topk", "topk_ratio": 0.05, "huffman_coding": true}})", ctx);
  const EngineOptions o = engine_options<TopKEngine>(cfg);
  CHECK(o.compression.topk_ratio == 0.05);
  CHECK(o.compression.huffman_coding);
  CHECK_THROWS_WITH_AS(engine_options<PlainEngine>(cfg),
                       doctest::Contains("gradient_compression.algorithm \"topk\" needs GradientCompression<TopK>, the "
                                         "engine was compiled with GradientCompression<None>"),
                       config_error);
  // A Config built in code is checked again: a ratio the reader would refuse.
  config::Config bad = cfg;
  bad.gradient_compression.topk_ratio = 0;
  CHECK_THROWS_WITH_AS(engine_options<TopKEngine>(bad), doctest::Contains("/gradient_compression/topk_ratio"),
                       config_error);
}

TEST_CASE("the 1-bit optimizers' keys reach EngineOptions::onebit (OneBitLamb, ZeroOneAdam)") {
  using LambEngine = Engine<Partitioner<Stage<0>>, Optimizer<OneBitLamb>, Precision<fp32>>;
  const config::ResolveContext ctx;
  const config::Config lamb = config::load(R"({"train_batch_size": 8, "zero_optimization": {"stage": 0},
      "optimizer": {"type": "OneBitLamb", "params": {"lr": 1e-3, "freeze_step": 23, "max_coeff": 0.5, "min_coeff": 0.25,
      "coeff_beta": 0.75, "factor_max": 3.5, "factor_min": 0.125, "factor_threshold": 0.0625}}})",
                                           ctx);
  const EngineOptions o = engine_options<LambEngine>(lamb);
  CHECK(o.onebit.freeze_step == 23);
  CHECK(o.optimizer.lamb_max_coeff == 0.5);
  CHECK(o.optimizer.lamb_min_coeff == 0.25);
  CHECK(o.onebit.lamb.coeff_beta == 0.75);
  CHECK(o.onebit.lamb.factor_max == 3.5);
  CHECK(o.onebit.lamb.factor_min == 0.125);
  CHECK(o.onebit.lamb.factor_threshold == 0.0625);

  using ZeroOneEngine = Engine<Partitioner<Stage<0>>, Optimizer<ZeroOneAdam>, Precision<fp32>>;
  const config::Config zo = config::load(R"({"train_batch_size": 8, "zero_optimization": {"stage": 0},
      "optimizer": {"type": "ZeroOneAdam", "params": {"var_freeze_step": 7, "var_update_scaler": 3,
      "local_step_scaler": 9, "local_step_clipper": 2}}})",
                                         ctx);
  const EngineOptions z = engine_options<ZeroOneEngine>(zo);
  CHECK(z.onebit.zero_one.var_freeze_step == 7);
  CHECK(z.onebit.zero_one.var_update_scaler == 3);
  CHECK(z.onebit.zero_one.local_step_scaler == 9);
  CHECK(z.onebit.zero_one.local_step_clipper == 2);
}

}  // namespace test_engine_config
