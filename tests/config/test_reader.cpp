// Configs written the way DeepSpeed's docs and the Hugging Face integration write them load into
// the expected options; "auto" resolves from what the engine knows; defaults are DeepSpeed's.
#include "common.hpp"

#include <algorithm>
#include <cstdio>
#include <string>
#include <variant>

namespace test_reader {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using namespace zerotk::config;
using zerotk_test::error_lines;
using zerotk_test::fixture;
using zerotk_test::has_notice;

TEST_CASE("HF ZeRO-2 template: every \"auto\" resolves from the engine's facts") {
  ResolveContext ctx;
  ctx.world_size = 4;
  ctx.precision = DType::fp16;
  ctx.micro_batch_size = 8;
  ctx.gradient_accumulation_steps = 2;
  ctx.lr = 3e-5;
  ctx.betas = std::array<double, 2>{0.9, 0.98};
  ctx.eps = 1e-6;
  ctx.weight_decay = 0.01;
  ctx.max_grad_norm = 0.5;
  ctx.warmup_num_steps = 100;
  const ParseResult r = parse(fixture("hf_zero2_auto.json"), ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  const Config& c = *r.config;

  CHECK(c.fp16.enabled);
  CHECK_FALSE(c.bf16.enabled);
  CHECK(c.precision() == DType::fp16);
  CHECK(c.scaler() == ScalerKind::dynamic);
  CHECK(c.fp16.initial_scale() == 65536.0);
  CHECK(c.fp16.loss_scale_window == 1000);
  CHECK(c.fp16.hysteresis == 2);
  CHECK(c.fp16.min_loss_scale == 1.0);

  REQUIRE(c.optimizer);
  CHECK(c.optimizer->kind == OptimizerKind::adamw);
  CHECK(c.optimizer->params.lr == 3e-5);
  CHECK(std::array{c.optimizer->params.beta1, c.optimizer->params.beta2} == std::array<double, 2>{0.9, 0.98});
  CHECK(c.optimizer->params.eps == 1e-6);
  CHECK(c.optimizer->params.weight_decay == 0.01);

  REQUIRE(c.scheduler);
  REQUIRE(c.scheduler->kind() == SchedulerKind::warmup_lr);
  const auto& w = std::get<WarmupLROptions>(c.scheduler->params);
  CHECK(w.warmup_min_lr == 0.0);
  CHECK(w.warmup_max_lr == 3e-5);  // follows the (resolved) optimizer lr
  CHECK(w.warmup_num_steps == 100);
  CHECK(w.warmup_type == WarmupType::log);

  const ZeroOptions& z = c.zero_optimization;
  CHECK(z.stage == 2);
  CHECK(z.offload_optimizer.device == OffloadDevice::cpu);
  CHECK(z.offload_optimizer.pin_memory);
  CHECK(z.allgather_bucket_size == 200'000'000);  // written 2e8
  CHECK(z.reduce_bucket_size == 200'000'000);
  CHECK(z.overlap_comm);
  CHECK(z.reduce_scatter);
  CHECK(z.contiguous_gradients);

  CHECK(c.train_micro_batch_size_per_gpu == 8);
  CHECK(c.gradient_accumulation_steps == 2);
  CHECK(c.train_batch_size == 64);  // 8 * 2 * 4
  CHECK(c.gradient_clipping == 0.5);
  CHECK(c.steps_per_print == 2000);
  CHECK_FALSE(c.wall_clock_breakdown);

  CHECK(has_notice(r, "/optimizer/params/lr", "3e-05"));
  CHECK(has_notice(r, "/train_batch_size", "64"));
  CHECK(has_notice(r, "/fp16/enabled", "true"));
}

TEST_CASE("HF ZeRO-2 template without hints: optimizer defaults, but the batch cannot be decided") {
  ResolveContext ctx;
  ctx.world_size = 2;
  ctx.precision = DType::bf16;
  ParseResult r = parse(fixture("hf_zero2_auto.json"), ctx);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].where() == "/train_micro_batch_size_per_gpu");
  CHECK(r.errors[0].message().find("--micro-batch") != std::string::npos);

  ctx.micro_batch_size = 4;
  r = parse(fixture("hf_zero2_auto.json"), ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  const Config& c = *r.config;
  CHECK_FALSE(c.fp16.enabled);
  CHECK(c.bf16.enabled);
  CHECK(c.scaler() == ScalerKind::none);
  CHECK(c.optimizer->params.lr == 1e-3);  // DeepSpeed's Adam defaults
  CHECK(std::array{c.optimizer->params.beta1, c.optimizer->params.beta2} == std::array<double, 2>{0.9, 0.999});
  CHECK(c.optimizer->params.eps == 1e-8);
  CHECK(c.optimizer->params.weight_decay == 0.0);
  CHECK(std::get<WarmupLROptions>(c.scheduler->params).warmup_num_steps == 1000);
  CHECK(c.gradient_accumulation_steps == 1);
  CHECK(c.train_batch_size == 8);
  CHECK(c.gradient_clipping == 1.0);
}

TEST_CASE("HF ZeRO-3 template: bucket sizes from the hidden size, offload blocks") {
  ResolveContext ctx;
  ctx.world_size = 8;
  ctx.hidden_size = 1024;
  ctx.precision = DType::bf16;
  ctx.micro_batch_size = 2;
  ctx.total_num_steps = 5000;
  const ParseResult r = parse(fixture("hf_zero3_auto.json"), ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  const Config& c = *r.config;
  const ZeroOptions& z = c.zero_optimization;
  CHECK(z.stage == 3);
  CHECK(z.reduce_bucket_size == 1024 * 1024);
  CHECK(z.stage3.prefetch_bucket_size == 943718);  // floor(0.9 * 1024^2)
  CHECK(z.stage3.param_persistence_threshold == 10240);
  CHECK(z.sub_group_size == 1'000'000'000);
  CHECK(z.stage3.max_live_parameters == 1'000'000'000);
  CHECK(z.stage3.max_reuse_distance == 1'000'000'000);
  CHECK(z.stage3_gather_16bit_weights_on_model_save);
  CHECK(z.offload_optimizer.device == OffloadDevice::cpu);
  CHECK(z.offload_param.device == OffloadDevice::cpu);
  CHECK(z.param_nvme.buffer_count == 5);
  CHECK(z.param_nvme.buffer_size == 100'000'000);
  CHECK(z.param_nvme.max_in_cpu == 1'000'000'000);
  CHECK(c.precision() == DType::bf16);
  const auto& s = std::get<WarmupDecayLROptions>(c.scheduler->params);
  CHECK(s.total_num_steps == 5000);
  CHECK(s.warmup_max_lr == 1e-3);
  CHECK(s.warmup_num_steps == 1000);
  CHECK(c.train_batch_size == 16);

  const Structure st = c.structure();
  CHECK(st.stage == 3);
  CHECK(st.precision == DType::bf16);
  CHECK(st.scaler == ScalerKind::none);
  CHECK(st.optimizer == OptimizerKind::adamw);
  CHECK(st.offload_optimizer == OffloadDevice::cpu);
  CHECK(st.offload_param == OffloadDevice::cpu);
}

TEST_CASE("HF ZeRO-3 template without hidden size or step count: every unresolvable \"auto\" is reported") {
  ResolveContext ctx;
  ctx.world_size = 8;
  ctx.precision = DType::fp16;
  ctx.micro_batch_size = 2;
  const ParseResult r = parse(fixture("hf_zero3_auto.json"), ctx);
  REQUIRE(r.errors.size() == 4);
  CHECK(r.errors[0].where() == "/zero_optimization/reduce_bucket_size");
  CHECK(r.errors[1].where() == "/zero_optimization/stage3_prefetch_bucket_size");
  CHECK(r.errors[2].where() == "/zero_optimization/stage3_param_persistence_threshold");
  CHECK(r.errors[3].where() == "/scheduler/params/total_num_steps");
  CHECK(r.errors[3].message().find("--total-steps") != std::string::npos);
  for (const auto& e : r.errors) {
    CHECK(e.value() == "\"auto\"");
    if (e.where().starts_with("/zero")) CHECK(e.message().find("--hidden") != std::string::npos);
  }
}

TEST_CASE("stage3_* \"auto\" below stage 3 keeps the default instead of failing") {
  ResolveContext ctx;
  ctx.world_size = 1;
  const ParseResult r = parse(
      R"({"train_batch_size": 4, "zero_optimization": {"stage": 2, "stage3_prefetch_bucket_size": "auto",
          "stage3_param_persistence_threshold": "auto"}})",
      ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  CHECK(r.config->zero_optimization.stage3.prefetch_bucket_size == 50'000'000);
  CHECK(r.config->zero_optimization.stage3.param_persistence_threshold == 100'000);
}

TEST_CASE("ZeRO-Infinity config: nvme offload, aio, cosine schedule, csv monitor") {
  ResolveContext ctx;
  ctx.world_size = 8;
  const ParseResult r = parse(fixture("ds_zero3_nvme.json"), ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  const Config& c = *r.config;
  CHECK(c.train_batch_size == 64);
  CHECK(c.train_micro_batch_size_per_gpu == 4);
  CHECK(c.gradient_accumulation_steps == 2);  // 64 / 4 / 8
  CHECK(c.fp16.initial_scale() == 4096.0);
  CHECK(c.fp16.loss_scale_window == 500);
  CHECK(c.fp16.consecutive_hysteresis);
  CHECK(c.optimizer->kind == OptimizerKind::adamw);  // "Adam" with adam_w_mode defaulting to true
  CHECK(c.optimizer->adam_w_mode);
  CHECK(c.optimizer->params.lr == 0.00015);
  CHECK(std::array{c.optimizer->params.beta1, c.optimizer->params.beta2} == std::array<double, 2>{0.9, 0.95});
  CHECK(c.optimizer->params.weight_decay == 0.1);
  const auto& s = std::get<WarmupCosineLROptions>(c.scheduler->params);
  CHECK(s.total_num_steps == 10000);
  CHECK(s.warmup_num_steps == 500);
  CHECK(s.warmup_min_ratio == 0.01);
  CHECK(s.cos_min_ratio == 0.1);
  const ZeroOptions& z = c.zero_optimization;
  CHECK(z.reduce_bucket_size == 50'000'000);
  CHECK(z.stage3.prefetch_bucket_size == 45'000'000);
  CHECK(z.stage3.param_persistence_threshold == 10'000);
  CHECK(z.stage3.max_live_parameters == 300'000'000);
  CHECK(z.sub_group_size == 100'000'000);
  CHECK(z.offload_optimizer.device == OffloadDevice::nvme);
  CHECK(z.nvme.path == "/local_nvme");
  CHECK(z.nvme.buffer_count == 4);
  CHECK(z.offload_param.device == OffloadDevice::nvme);
  CHECK(z.param_nvme.buffer_size == 100'000'000);
  CHECK(c.zero_optimization.nvme.aio.block_size == 1 << 20);
  CHECK(c.zero_optimization.nvme.aio.queue_depth == 16);
  CHECK(c.zero_optimization.nvme.aio.intra_op_parallelism == 2);  // from its old name thread_count
  CHECK(has_notice(r, "/aio/thread_count", "intra_op_parallelism"));
  CHECK(c.csv_monitor.enabled);
  CHECK(c.csv_monitor.output_path == "logs/");
  CHECK(c.csv_monitor.job_name == "zero3_nvme");
  CHECK(c.wall_clock_breakdown);
  CHECK(r.notices.size() == 1);  // fast_init: false is the default, no notice
}

TEST_CASE("batch triad: a world size the batch does not divide prints all four numbers") {
  ResolveContext ctx;
  ctx.world_size = 3;
  const ParseResult r = parse(fixture("ds_zero3_nvme.json"), ctx);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].where() == "/train_batch_size");
  CHECK(r.errors[0].message().find("64 != 4 * 5 * 3 (= 60)") != std::string::npos);
}

TEST_CASE("batch rules of SEMANTICS.md section 5") {
  struct Case {
    const char* json;
    int world;
    std::int64_t tbs, mbs, gas;
  };
  const Case cases[] = {
      {R"({"train_batch_size": 32})", 4, 32, 8, 1},
      {R"({"train_micro_batch_size_per_gpu": 3})", 5, 15, 3, 1},
      {R"({"train_batch_size": 48, "train_micro_batch_size_per_gpu": 2})", 3, 48, 2, 8},
      {R"({"train_batch_size": 48, "gradient_accumulation_steps": 4})", 3, 48, 4, 4},
      {R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 7})", 3, 42, 2, 7},
      {R"({"train_batch_size": 42, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 7})", 3, 42, 2, 7},
      {R"({"train_batch_size": 1})", 1, 1, 1, 1},
  };
  for (const Case& k : cases) {
    CAPTURE(k.json);
    ResolveContext ctx;
    ctx.world_size = k.world;
    const ParseResult r = parse(k.json, ctx);
    REQUIRE_MESSAGE(r.ok(), error_lines(r));
    CHECK(r.config->train_batch_size == k.tbs);
    CHECK(r.config->train_micro_batch_size_per_gpu == k.mbs);
    CHECK(r.config->gradient_accumulation_steps == k.gas);
    CHECK(r.config->world_size == k.world);
  }
}

TEST_CASE("LAMB with OneCycle, bf16, stage 1 and activation checkpointing") {
  ResolveContext ctx;
  ctx.world_size = 2;
  const ParseResult r = parse(fixture("ds_onecycle_lamb.json"), ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  const Config& c = *r.config;
  CHECK(c.train_batch_size == 64);
  CHECK(c.precision() == DType::bf16);
  CHECK(c.scaler() == ScalerKind::none);
  CHECK(c.gradient_clipping == 0.5);
  CHECK(c.communication_data_type == DType::fp32);
  CHECK(c.gradient_predivide_factor == 2.0);
  CHECK(c.optimizer->kind == OptimizerKind::lamb);  // "LAMB": types are case-insensitive
  CHECK(c.optimizer->params.lamb_max_coeff == 0.3);
  CHECK(c.optimizer->params.lamb_min_coeff == 0.01);
  CHECK(c.optimizer->params.lr == 0.002);
  const auto& o = std::get<OneCycleOptions>(c.scheduler->params);
  CHECK(o.cycle_min_lr == 0.0001);
  CHECK(o.cycle_max_lr == 0.002);
  CHECK(o.cycle_first_step_size == 1000);
  CHECK(o.cycle_second_step_size == 1000);  // defaults to the first
  CHECK(o.cycle_second_stair_count == 0);
  CHECK(o.decay_lr_rate == 0.001);
  CHECK(o.decay_step_size == 100);
  CHECK(o.cycle_momentum);
  CHECK(o.cycle_min_mom == 0.85);
  CHECK(o.cycle_max_mom == 0.99);
  CHECK(c.zero_optimization.stage == 1);
  CHECK_FALSE(c.zero_optimization.overlap_comm);
  const auto& a = c.activation_checkpointing;
  CHECK(a.partition_activations);
  CHECK(a.cpu_checkpointing);
  CHECK(a.contiguous_memory_optimization);
  CHECK(a.number_checkpoints == 24);
}

TEST_CASE("1-bit Adam with a static fp16 scale and LRRangeTest") {
  ResolveContext ctx;
  ctx.world_size = 16;
  const ParseResult r = parse(fixture("ds_onebit_rangetest.json"), ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  const Config& c = *r.config;
  CHECK(c.train_micro_batch_size_per_gpu == 32);  // 4096 / 16 / 8
  CHECK(c.scaler() == ScalerKind::static_scale);
  CHECK(c.fp16.initial_scale() == 128.0);
  CHECK(c.optimizer->kind == OptimizerKind::onebit_adam);
  CHECK(c.optimizer->freeze_step == 400);
  CHECK(c.optimizer->comm_backend_name == "mpi");
  const auto& l = std::get<LRRangeTestOptions>(c.scheduler->params);
  CHECK(l.lr_range_test_min_lr == 1e-5);
  CHECK(l.lr_range_test_step_size == 200);
  CHECK(l.lr_range_test_step_rate == 5.0);
  CHECK(l.lr_range_test_staircase);
  CHECK(c.zero_optimization.stage == 0);
}

TEST_CASE("0/1 Adam: its schedule keys with DeepSpeed's defaults, and back out through the writer") {
  ResolveContext ctx;
  ctx.world_size = 2;
  const ParseResult d = parse(R"({"train_batch_size": 8, "optimizer": {"type": "zerooneadam"}})", ctx);
  REQUIRE_MESSAGE(d.ok(), error_lines(d));
  CHECK(d.config->optimizer->kind == OptimizerKind::zero_one_adam);  // types are case-insensitive
  CHECK(d.config->optimizer->zero_one == zerotk::optim::ZeroOneOptions{});
  CHECK(d.config->optimizer->zero_one.local_step_scaler == 32678);  // DeepSpeed's default, as it is spelled there
  const ParseResult r = parse(R"({"train_batch_size": 8, "optimizer": {"type": "ZeroOneAdam", "params": {"lr": 1e-3,
      "var_freeze_step": 400, "var_update_scaler": 8, "local_step_scaler": 1000, "local_step_clipper": 4,
      "comm_backend_name": "mpi", "cuda_aware": false}}})", ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  const zerotk::optim::ZeroOneOptions want{400, 8, 1000, 4};
  CHECK(r.config->optimizer->zero_one == want);
  CHECK(r.config->optimizer->comm_backend_name == "mpi");
  const ParseResult back = parse(to_json(*r.config).dump(), ctx);
  REQUIRE_MESSAGE(back.ok(), error_lines(back));
  CHECK(back.config->optimizer->kind == OptimizerKind::zero_one_adam);
  CHECK(back.config->optimizer->zero_one == want);
}

TEST_CASE("a minimal config gets DeepSpeed's defaults") {
  ResolveContext ctx;
  ctx.world_size = 4;
  const ParseResult r = parse(fixture("ds_minimal.json"), ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  const Config& c = *r.config;
  CHECK(c.train_micro_batch_size_per_gpu == 8);
  CHECK(c.gradient_accumulation_steps == 1);
  CHECK(c.gradient_clipping == 1.0);
  CHECK(c.steps_per_print == 10);  // zerotk's default; DeepSpeed 0.19 has none (no progress line)
  CHECK_FALSE(c.wall_clock_breakdown);
  CHECK_FALSE(c.prescale_gradients);
  CHECK(c.gradient_predivide_factor == 1.0);
  CHECK_FALSE(c.communication_data_type);
  CHECK(c.precision() == DType::fp32);
  CHECK(c.fp16.initial_scale_power == 16);
  CHECK(c.zero_optimization.stage == 0);
  CHECK(c.zero_optimization.reduce_bucket_size == 500'000'000);
  CHECK(c.zero_optimization.allgather_bucket_size == 500'000'000);
  CHECK(c.zero_optimization.stage3.prefetch_bucket_size == 50'000'000);
  CHECK(c.zero_optimization.stage3.param_persistence_threshold == 100'000);
  CHECK(c.zero_optimization.stage3.max_live_parameters == 1'000'000'000);
  CHECK(c.zero_optimization.stage3.max_reuse_distance == 1'000'000'000);
  CHECK(c.zero_optimization.sub_group_size == 1'000'000'000);
  CHECK(c.zero_optimization.nvme.buffer_count == 4);
  CHECK(c.zero_optimization.offload_optimizer.pin_memory);
  CHECK(c.zero_optimization.nvme.aio.block_size == 1048576);
  CHECK(c.zero_optimization.nvme.aio.queue_depth == 8);
  CHECK(c.zero_optimization.nvme.aio.intra_op_parallelism == 1);
  CHECK(c.zero_optimization.nvme.aio.overlap_events);
  CHECK_FALSE(c.zero_optimization.nvme.aio.single_submit);
  CHECK_FALSE(c.optimizer);
  CHECK_FALSE(c.scheduler);
  CHECK_FALSE(c.csv_monitor.enabled);
  CHECK(c.csv_monitor.job_name == "DeepSpeedJobName");
  CHECK(r.notices.empty());
}

TEST_CASE("overlap_comm defaults to true for stage 3 only") {
  ResolveContext ctx;
  for (int stage = 0; stage <= 3; ++stage) {
    const std::string json =
        R"({"train_batch_size": 2, "zero_optimization": {"stage": )" + std::to_string(stage) + "}}";
    const ParseResult r = parse(json, ctx);
    REQUIRE(r.ok());
    CHECK(r.config->zero_optimization.overlap_comm == (stage == 3));
  }
}

TEST_CASE("\"Adam\" is AdamW unless adam_w_mode is false; fp16/bf16 auto follows the engine") {
  ResolveContext ctx;
  ctx.precision = DType::fp32;
  ParseResult r = parse(R"({"train_batch_size": 2, "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
                           "optimizer": {"type": "adam", "params": {"adam_w_mode": false, "weight_decay": 0.01}}})",
                        ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  CHECK(r.config->optimizer->kind == OptimizerKind::adam);
  CHECK_FALSE(r.config->optimizer->adam_w_mode);
  CHECK(r.config->precision() == DType::fp32);
  r = parse(R"({"train_batch_size": 2, "optimizer": {"type": "ADAMW"}})", ctx);
  REQUIRE(r.ok());
  CHECK(r.config->optimizer->kind == OptimizerKind::adamw);
}

TEST_CASE("old spellings are read and reported as deprecated") {
  ResolveContext ctx;
  const ParseResult r = parse(R"({"train_batch_size": 2, "bfloat16": {"enabled": true},
      "zero_optimization": {"stage": 3, "cpu_offload": true, "cpu_offload_param": true,
                            "stage3_gather_fp16_weights_on_model_save": true, "prefetch_bucket_size": 1000}})",
                              ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  const Config& c = *r.config;
  CHECK(c.bf16.enabled);
  CHECK(c.zero_optimization.offload_optimizer.device == OffloadDevice::cpu);
  CHECK(c.zero_optimization.offload_param.device == OffloadDevice::cpu);
  CHECK(c.zero_optimization.stage3_gather_16bit_weights_on_model_save);
  CHECK(c.zero_optimization.stage3.prefetch_bucket_size == 1000);  // pydantic alias
  CHECK(has_notice(r, "/bfloat16"));
  CHECK(has_notice(r, "/zero_optimization/cpu_offload"));
  CHECK(has_notice(r, "/zero_optimization/cpu_offload_param"));
  CHECK(has_notice(r, "/zero_optimization/stage3_gather_fp16_weights_on_model_save"));

  const ParseResult b = parse(R"({"train_batch_size": 2, "zero_optimization": true})", ctx);
  REQUIRE(b.ok());
  CHECK(b.config->zero_optimization.stage == 1);
}

TEST_CASE("keys for features not built yet are accepted and reported, never silently dropped") {
  ResolveContext ctx;
  ParseResult r = parse(fixture("ds_unsupported_keys.json"), ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  CHECK(has_notice(r, "/tensorboard", "not supported"));
  CHECK(has_notice(r, "/flops_profiler", "not supported"));
  CHECK(has_notice(r, "/zero_allow_untested_optimizer", "no effect"));
  CHECK(has_notice(r, "/zero_optimization/zero_quantized_gradients", "has effect only at ZeRO stage 3 (stage is 2"));
  // Disabled features and DeepSpeed's default values say nothing.
  CHECK_FALSE(has_notice(r, "/wandb"));
  CHECK_FALSE(has_notice(r, "/memory_breakdown"));
  CHECK_FALSE(has_notice(r, "/zero_optimization/memory_efficient_linear"));
  CHECK_FALSE(has_notice(r, "/bf16/immediate_grad_update"));
  CHECK(r.notices.size() == 4);

  ctx.strict = true;
  r = parse(fixture("ds_unsupported_keys.json"), ctx);
  REQUIRE(r.errors.size() == 4);
  CHECK(r.errors[0].where() == "/zero_optimization/zero_quantized_gradients");
  CHECK(r.errors[1].where() == "/tensorboard");
  CHECK(r.errors[2].where() == "/flops_profiler");
  CHECK(r.errors[3].where() == "/zero_allow_untested_optimizer");
}

TEST_CASE("load() throws one config_error listing every problem; validate() returns them all") {
  ResolveContext ctx;
  const std::string text = fixture("invalid_many.json");
  const auto errors = validate(text, ctx);
  REQUIRE(errors.size() == 5);
  // Reading order: values as read, then cross-block rules, then unknown keys with suggestions.
  CHECK(errors[0].where() == "/optimizer/params/max_grad_norm");
  CHECK(errors[1].where() == "/train_batch_size");                 // 10 != 3 * 3 * 1
  CHECK(errors[2].where() == "/bf16/enabled");                     // with fp16
  CHECK(errors[3].where() == "/zero_optimization/offload_optimizer/device");  // nvme below stage 3
  CHECK(errors[4].where() == "/zero_optimization/stage3_max_live_params");
  try {
    (void)load(text, ctx, "invalid_many.json");
    FAIL("load() must throw");
  } catch (const config_error& e) {
    CHECK(e.where() == "invalid_many.json");
    const std::string what = e.what();
    CHECK(what.find("5 problems") != std::string::npos);
    for (const auto& x : errors) CHECK(what.find(format_line(x)) != std::string::npos);
  }
  CHECK_THROWS_AS(load_file(zerotk_test::fixture_path("no_such_file.json"), ctx), io_error);
}

TEST_CASE("gradient_compression: each algorithm, its knobs, and no block meaning no compression") {
  ResolveContext ctx;
  ctx.world_size = 4;
  {
    const ParseResult r = parse(fixture("ds_gradient_compression.json"), ctx);
    REQUIRE_MESSAGE(r.ok(), error_lines(r));
    const GradientCompressionConfig& g = r.config->gradient_compression;
    REQUIRE(g.algorithm.has_value());
    CHECK(*g.algorithm == CompressionAlgorithm::topk);
    CHECK(g.topk_ratio == 0.01);
    CHECK(g.huffman_coding);
    CHECK(r.config->structure().compression == CompressionAlgorithm::topk);
    CHECK(r.notices.empty());  // every key of the block is honoured
  }
  struct Case {
    const char* name;
    CompressionAlgorithm algorithm;
  };
  for (const Case& k : {Case{"topk", CompressionAlgorithm::topk}, Case{"2bit", CompressionAlgorithm::two_bit},
                        Case{"1bit", CompressionAlgorithm::one_bit}, Case{"TopK", CompressionAlgorithm::topk}}) {
    CAPTURE(std::string(k.name));
    const Config c = load(std::string(R"({"train_batch_size": 8, "gradient_compression": {"algorithm": ")") + k.name +
                              R"(", "topk_ratio": 0.25}})",
                          ctx);
    REQUIRE(c.gradient_compression.algorithm.has_value());
    CHECK(*c.gradient_compression.algorithm == k.algorithm);
    CHECK(c.gradient_compression.topk_ratio == 0.25);  // read for every algorithm; only top-k uses it
    CHECK_FALSE(c.gradient_compression.huffman_coding);
  }
  CHECK(to_string(CompressionAlgorithm::two_bit) == "2bit");
  // No block, an empty block, a null algorithm, or knobs alone: no compression.
  for (const char* json : {R"({"train_batch_size": 8})", R"({"train_batch_size": 8, "gradient_compression": {}})",
                           R"({"train_batch_size": 8, "gradient_compression": {"algorithm": null}})",
                           R"({"train_batch_size": 8, "gradient_compression": {"topk_ratio": 1, "huffman_coding": true}})"}) {
    CAPTURE(std::string(json));
    const ParseResult r = parse(json, ctx);
    REQUIRE_MESSAGE(r.ok(), error_lines(r));
    CHECK_FALSE(r.config->gradient_compression.algorithm.has_value());
    CHECK_FALSE(r.config->structure().compression.has_value());
  }
  // The knobs reach EngineOptions::compression unchanged (config/engine_config.hpp maps them).
  const Config knobs = load(R"({"train_batch_size": 8, "gradient_compression": {"topk_ratio": 1, "huffman_coding": true}})", ctx);
  CHECK(knobs.gradient_compression.topk_ratio == 1.0);
  CHECK(knobs.gradient_compression.huffman_coding);
  // Without the block, to_json writes none (resolved configs of older files are unchanged).
  CHECK_FALSE(to_json(load(R"({"train_batch_size": 8})", ctx)).contains("gradient_compression"));
}

TEST_CASE("to_json writes a config that reads back to the same options") {
  struct Case {
    const char* file;
    int world;
  };
  for (const Case& k : {Case{"ds_zero3_nvme.json", 8}, Case{"ds_onecycle_lamb.json", 2},
                        Case{"ds_onebit_rangetest.json", 16}, Case{"ds_minimal.json", 4},
                        Case{"ds_gradient_compression.json", 4}}) {
    CAPTURE(k.file);
    ResolveContext ctx;
    ctx.world_size = k.world;
    const Config a = load(fixture(k.file), ctx);
    const Json written = to_json(a);
    const ParseResult back = parse(written.dump(), ctx);
    REQUIRE_MESSAGE(back.ok(), error_lines(back));
    // no notes, but for partition_activations: true (written back as read; a note of its own)
    for (const auto& n : back.notices) CHECK(n.path == "/activation_checkpointing/partition_activations");
    CHECK(to_json(*back.config) == written);
    CHECK(back.config->structure() == a.structure());
  }
}

TEST_CASE("offload settings follow DeepSpeed 0.19: offload_param below stage 3 is ignored, partial offload needs stage 3") {
  ResolveContext ctx;
  // DeepSpeed builds stages 0-2 without reading offload_param; zerotk says so and drops it.
  ParseResult r = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2,
                          "offload_param": {"device": "cpu", "pin_memory": true}}})",
                        ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  CHECK(r.config->zero_optimization.offload_param.device == OffloadDevice::none);
  CHECK(r.config->structure().offload_param == OffloadDevice::none);
  CHECK(has_notice(r, "/zero_optimization/offload_param", "has effect only at ZeRO stage 3 (stage is 2"));
  CHECK(to_json(*r.config)["zero_optimization"].count("offload_param") == 0);
  ctx.strict = true;
  r = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 1, "offload_param": {"device": "nvme"}}})", ctx);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].where() == "/zero_optimization/offload_param");
  CHECK(r.errors[0].value() == R"({"device": "nvme"})");
  ctx.strict = false;
  // ratio < 1 asks for partial offload, which DeepSpeed asserts to be stage 3; at stage 3 it is a note.
  r = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
              "offload_optimizer": {"device": "cpu", "ratio": 0.3}}})",
            ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  CHECK(has_notice(r, "/zero_optimization/offload_optimizer/ratio", "not supported by zerotk yet"));
  r = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 1, "offload_optimizer": {"ratio": 1}}})", ctx);
  CHECK_MESSAGE(r.ok(), error_lines(r));
}

TEST_CASE("zero_hpz_partition_size: hpZ at stage 3 when it divides the world size; ignored below stage 3") {
  ResolveContext ctx;
  ctx.world_size = 8;
  for (int g : {1, 2, 4, 8}) {
    CAPTURE(g);
    ParseResult r = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "zero_hpz_partition_size": )" +
                              std::to_string(g) + "}}",
                          ctx);
    REQUIRE_MESSAGE(r.ok(), error_lines(r));
    CHECK(r.notices.empty());
    CHECK(r.config->zero_optimization.stage3.reshard_after_forward.group_size() == g);
    CHECK(to_json(*r.config)["zero_optimization"]["zero_hpz_partition_size"] == g);  // written back
  }
  for (const char* bad : {"3", "16"}) {  // does not divide 8
    CAPTURE(bad);
    ParseResult r = parse(std::string(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "zero_hpz_partition_size": )") +
                              bad + "}}",
                          ctx);
    REQUIRE(r.errors.size() == 1);
    CHECK(r.errors[0].where() == "/zero_optimization/zero_hpz_partition_size");
    CHECK(r.errors[0].value() == bad);
    CHECK(r.errors[0].message().find("must divide the world size (8)") != std::string::npos);
  }
  ParseResult r = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 0}})", ctx);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].where() == "/zero_optimization/zero_hpz_partition_size");
  // Below stage 3 nothing is partitioned that hpZ could shard again: a note, an error when strict.
  r = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "zero_hpz_partition_size": 2}})", ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  CHECK(has_notice(r, "/zero_optimization/zero_hpz_partition_size", "has effect only at ZeRO stage 3 (stage is 2"));
  CHECK(r.config->zero_optimization.stage3.reshard_after_forward.group_size() == 1);
  ctx.strict = true;
  r = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 1, "zero_hpz_partition_size": 4}})", ctx);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].where() == "/zero_optimization/zero_hpz_partition_size");
  CHECK(r.errors[0].value() == "4");
}

TEST_CASE("expert size: expert_parallel.autoep_size when enabled, dividing the data size; the AutoEP model keys say why they do nothing") {
  ResolveContext ctx;
  ctx.world_size = 8;
  ParseResult r = parse(R"({"train_micro_batch_size_per_gpu": 1, "tensor_model_parallel_size": 2,
                            "expert_parallel": {"enabled": true, "autoep_size": 4, "preset_model": "mixtral"}})",
                        ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  CHECK(r.config->expert_parallel_size == 4);
  CHECK(r.config->data_parallel_size == 4);
  CHECK(has_notice(r, "/expert_parallel/preset_model", "declares its experts"));
  CHECK(r.notices.size() == 1);
  const ParseResult back = parse(to_json(*r.config).dump(), ctx);  // written back, and reads back the same
  REQUIRE_MESSAGE(back.ok(), error_lines(back));
  CHECK(back.config->expert_parallel_size == 4);
  // Not enabled: no expert size; nothing written back.
  r = parse(R"({"train_micro_batch_size_per_gpu": 1, "expert_parallel": {"enabled": false, "autoep_size": 4}})", ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  CHECK(r.config->expert_parallel_size == 1);
  CHECK_FALSE(to_json(*r.config).contains("expert_parallel"));
  // A size the data ranks do not divide: named, with where the data size came from.
  r = parse(R"({"train_micro_batch_size_per_gpu": 1, "tensor_model_parallel_size": 2,
                "expert_parallel": {"enabled": true, "autoep_size": 3}})",
            ctx);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].where() == "/expert_parallel/autoep_size");
  CHECK(r.errors[0].value() == "3");
  CHECK(r.errors[0].message().find("must divide the data-parallel size (4 = world 8 / tensor 2)") != std::string::npos);
}

TEST_CASE("sequence_parallel_size: the grid's context size, dividing the data ranks; the batch triad counts replicas") {
  ResolveContext ctx;
  ctx.world_size = 8;
  // world 8 / tensor 2 = 4 data ranks, 2 of them per replica: 2 replicas, so 16 = 4 x 2 x 2.
  ParseResult r = parse(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "tensor_model_parallel_size": 2,
                            "sequence_parallel_size": 2})",
                        ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  CHECK(r.config->sequence_parallel_size == 2);
  CHECK(r.config->data_parallel_size == 4);
  CHECK(r.config->replica_count() == 2);
  CHECK(r.config->gradient_accumulation_steps == 2);
  const ParseResult back = parse(to_json(*r.config).dump(), ctx);  // written back, and reads back the same
  REQUIRE_MESSAGE(back.ok(), error_lines(back));
  CHECK(back.config->sequence_parallel_size == 2);
  // The triad counting every data rank is off by the context size: said with where W came from.
  r = parse(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
                "tensor_model_parallel_size": 2, "sequence_parallel_size": 2})",
            ctx);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].message().find("(the data-parallel replicas: (world 8 / tensor 2) / sequence_parallel_size 2)") !=
        std::string::npos);
  // A size the data ranks do not divide: named.
  r = parse(R"({"train_micro_batch_size_per_gpu": 1, "tensor_model_parallel_size": 2, "sequence_parallel_size": 3})", ctx);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].where() == "/sequence_parallel_size");
  CHECK(r.errors[0].value() == "3");
  CHECK(r.errors[0].message().find("must divide the data-parallel size (4 = world 8 / tensor 2)") != std::string::npos);
  // Absent: 1, and nothing written back.
  r = parse(R"({"train_micro_batch_size_per_gpu": 1})", ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  CHECK(r.config->sequence_parallel_size == 1);
  CHECK_FALSE(to_json(*r.config).contains("sequence_parallel_size"));
}

TEST_CASE("sparse_attention: DeepSpeed's block read per mode, with its config defaults; written back; refusals name the key") {
  ResolveContext ctx;
  ctx.world_size = 2;
  ParseResult r = parse(R"({"train_micro_batch_size_per_gpu": 1,
                            "sparse_attention": {"mode": "fixed", "block": 32, "different_layout_per_head": true,
                                                 "num_local_blocks": 4, "num_global_blocks": 2, "attention": "unidirectional",
                                                 "num_different_global_patterns": 2, "num_sliding_window_blocks": 5}})",
                        ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  REQUIRE(r.config->sparse_attention.has_value());
  context::SparsityConfig s = *r.config->sparse_attention;
  CHECK(s.mode == context::SparsityMode::fixed);
  CHECK(s.block == 32);
  CHECK(s.different_layout_per_head);
  CHECK(s.num_global_blocks == 2);
  CHECK(s.unidirectional);
  CHECK(s.num_different_global_patterns == 2);
  CHECK(s.num_sliding_window_blocks == 3);  // fixed does not read it: the default stays, and a note says so
  CHECK(has_notice(r, "/sparse_attention/num_sliding_window_blocks", "not read in mode \"fixed\""));
  // Written back, it reads back to the same layout.
  const ParseResult back = parse(to_json(*r.config).dump(), ctx);
  REQUIRE_MESSAGE(back.ok(), error_lines(back));
  REQUIRE(back.config->sparse_attention.has_value());
  s.heads = 4;
  context::SparsityConfig t = *back.config->sparse_attention;
  t.heads = 4;
  CHECK(context::make_layout(s, 512) == context::make_layout(t, 512));
  // bigbird through the config: DeepSpeed's config default of num_random_blocks is 0 (its class's is 1).
  r = parse(R"({"train_micro_batch_size_per_gpu": 1, "sparse_attention": {"mode": "bigbird"}})", ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  CHECK(r.config->sparse_attention->num_random_blocks == 0);
  CHECK(r.config->sparse_attention->num_sliding_window_blocks == 3);
  // No block: none.
  r = parse(R"({"train_micro_batch_size_per_gpu": 1})", ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  CHECK_FALSE(r.config->sparse_attention.has_value());
  CHECK_FALSE(to_json(*r.config).contains("sparse_attention"));
  // Refusals, each at its key.
  r = parse(R"({"train_micro_batch_size_per_gpu": 1, "sparse_attention": {"mode": "strided"}})", ctx);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].where() == "/sparse_attention/mode");
  r = parse(R"({"train_micro_batch_size_per_gpu": 1, "sparse_attention": {"mode": "variable", "attention": "causal"}})", ctx);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].where() == "/sparse_attention/attention");
  r = parse(R"({"train_micro_batch_size_per_gpu": 1, "sparse_attention": {"num_local_blocks": 4, "num_global_blocks": 3}})", ctx);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].where() == "/sparse_attention/num_local_blocks");
  CHECK(r.errors[0].message().find("multiple of num_global_blocks") != std::string::npos);
  r = parse(R"({"train_micro_batch_size_per_gpu": 1, "sparse_attention": {"mode": "variable", "local_window_blocks": [2, 0]}})", ctx);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].where() == "/sparse_attention/local_window_blocks/1");
}

TEST_CASE("tensor size: tensor_model_parallel_size or tensor_parallel.autotp_size; the batch triad counts world / tensor") {
  ResolveContext ctx;
  ctx.world_size = 8;
  // The seeds' key: 8 ranks = tensor 4 x data 2, so the micro batch is 64 / (2 x 4) = 8, not 64 / 8 / 4.
  ParseResult r = parse(R"({"train_batch_size": 64, "gradient_accumulation_steps": 4, "tensor_model_parallel_size": 4,
                            "zero_optimization": {"stage": 3}})",
                        ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  CHECK(r.config->world_size == 8);
  CHECK(r.config->tensor_parallel_size == 4);
  CHECK(r.config->data_parallel_size == 2);
  CHECK(r.config->train_micro_batch_size_per_gpu == 8);
  CHECK(to_json(*r.config)["tensor_model_parallel_size"] == 4);  // written back, and reads back the same
  const ParseResult back = parse(to_json(*r.config).dump(), ctx);
  REQUIRE_MESSAGE(back.ok(), error_lines(back));
  CHECK(back.config->tensor_parallel_size == 4);
  CHECK(back.config->train_micro_batch_size_per_gpu == 8);

  // DeepSpeed's key; 0 (its default) is off. The keys of its automatic module replacement say why they do nothing.
  r = parse(R"({"train_micro_batch_size_per_gpu": 2, "tensor_parallel": {"autotp_size": 2, "preset_model": "llama",
                "tp_overlap_comm": true}})",
            ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  CHECK(r.config->tensor_parallel_size == 2);
  CHECK(r.config->train_batch_size == 2 * 4);  // micro x data 4
  CHECK(has_notice(r, "/tensor_parallel/preset_model", "declares its own splits"));
  CHECK(has_notice(r, "/tensor_parallel/tp_overlap_comm", "inside the model's own layers"));
  CHECK(r.notices.size() == 2);
  r = parse(R"({"train_micro_batch_size_per_gpu": 2, "tensor_parallel": {"autotp_size": 0}})", ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  CHECK(r.config->tensor_parallel_size == 1);
  CHECK(r.config->data_parallel_size == 8);
  CHECK(r.notices.empty());
  CHECK_FALSE(to_json(*r.config).contains("tensor_model_parallel_size"));  // unchanged output without a split

  // Both keys, disagreeing; a tensor size the world does not divide; a batch the data size does not divide.
  r = parse(R"({"train_batch_size": 8, "tensor_model_parallel_size": 2, "tensor_parallel": {"autotp_size": 4}})", ctx);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].where() == "/tensor_parallel/autotp_size");
  CHECK(r.errors[0].value() == "4");
  CHECK(r.errors[0].message().find("differs from /tensor_model_parallel_size (2)") != std::string::npos);
  r = parse(R"({"train_batch_size": 8, "tensor_model_parallel_size": 3})", ctx);
  REQUIRE(r.errors.size() >= 1);
  CHECK(r.errors[0].where() == "/tensor_model_parallel_size");
  CHECK(r.errors[0].value() == "3");
  CHECK(r.errors[0].message().find("must divide the world size (8)") != std::string::npos);
  r = parse(R"({"train_batch_size": 6, "train_micro_batch_size_per_gpu": 1, "tensor_model_parallel_size": 2})", ctx);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].where() == "/train_batch_size");
  CHECK(r.errors[0].message().find("6 != 1 * 1 * 4 (the data-parallel size: world 8 / tensor 2)") != std::string::npos);
  r = parse(R"({"train_batch_size": 8, "tensor_model_parallel_size": 0})", ctx);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].where() == "/tensor_model_parallel_size");

  // hpZ groups live inside the data group: 4 divides the world (8) but not the data size (2).
  r = parse(R"({"train_batch_size": 8, "tensor_model_parallel_size": 4, "zero_optimization": {"stage": 3,
                "zero_hpz_partition_size": 4}})",
            ctx);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].where() == "/zero_optimization/zero_hpz_partition_size");
  CHECK(r.errors[0].message().find("must divide the data-parallel size (2 = world 8 / tensor 4)") != std::string::npos);
}

TEST_CASE("communication block: topology as a number or a map, the slow-rank keys, written back as read") {
  ResolveContext ctx;
  ctx.world_size = 4;
  // The seed config's block: levels 3 (detected where the ranks run) and a tolerance.
  ParseResult r = parse(R"({"train_batch_size": 8, "communication": {"topology": 3, "slow_node_tolerance": 0.1}})", ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  const CommunicationOptions& c = r.config->communication;
  CHECK(c.topology.levels == 3);
  CHECK(c.topology.ranks_per_node == 0);
  CHECK(c.slow_ranks.enabled);
  CHECK(c.slow_ranks.tolerance == 0.1);
  CHECK(c.slow_ranks.window == 20);
  CHECK(c.slow_ranks.count == 3);
  CHECK(c.slow_ranks.action == SlowRankAction::report);
  CHECK(c.slow_ranks.micro_batch_size == 2);  // 8 / 4 ranks: what rebalance would split
  Json j = to_json(*r.config);
  CHECK(j["communication"]["topology"] == 3);
  CHECK(j["communication"]["slow_node_action"] == "report");
  ParseResult back = parse(j.dump(), ctx);
  REQUIRE_MESSAGE(back.ok(), error_lines(back));
  CHECK(back.config->communication.topology == c.topology);
  CHECK(back.config->communication.slow_ranks.tolerance == 0.1);

  r = parse(R"({"train_batch_size": 8, "communication": {"topology": {"node_of_rank": [0, 1, 0, 1]},
                "slow_node_window": 5, "slow_node_count": 2, "slow_node_action": "Rebalance"}})",
            ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  const CommunicationOptions& m = r.config->communication;
  CHECK(m.topology.levels == 2);  // a node map alone: two levels
  CHECK(m.topology.node_of_rank == std::vector<int>{0, 1, 0, 1});
  CHECK(m.slow_ranks.action == SlowRankAction::rebalance);
  CHECK(m.slow_ranks.window == 5);
  back = parse(to_json(*r.config).dump(), ctx);
  REQUIRE_MESSAGE(back.ok(), error_lines(back));
  CHECK(back.config->communication.topology == m.topology);
  CHECK(back.config->communication.slow_ranks.count == 2);

  r = parse(R"({"train_batch_size": 8, "communication": {"topology": {"ranks_per_node": 4, "ranks_per_socket": 2}}})", ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  CHECK(r.config->communication.topology.levels == 3);
  CHECK_FALSE(r.config->communication.slow_ranks.enabled);
  // "inner" with two levels names no level: a note, the default kept, and the JSON written back is a
  // fixed point of to_json -> parse -> to_json (issue 57 item 7: it was dropped without a word).
  r = parse(R"({"train_batch_size": 8, "communication": {"topology": {"ranks_per_node": 2, "inner": "numa"}}})", ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  REQUIRE(r.notices.size() == 1);
  CHECK(r.notices[0].path == "/communication/topology/inner");
  CHECK(r.notices[0].message.find("this topology has 2") != std::string::npos);
  CHECK(r.config->communication.topology.inner == comm::TopologyOptions{}.inner);
  {
    const Json once = to_json(*r.config);
    ParseResult again = parse(once.dump(), ctx);
    REQUIRE_MESSAGE(again.ok(), error_lines(again));
    CHECK(to_json(*again.config) == once);
    CHECK(again.config->communication.topology == r.config->communication.topology);
  }
  ResolveContext strict = ctx;
  strict.strict = true;
  CHECK_FALSE(parse(R"({"train_batch_size": 8, "communication": {"topology": {"ranks_per_node": 2, "inner": "numa"}}})",
                    strict).ok());
  // With three levels "inner" is kept and written back.
  r = parse(R"({"train_batch_size": 8, "communication": {"topology": {"ranks_per_node": 4, "ranks_per_socket": 2,
             "inner": "numa"}}})", ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  CHECK(r.notices.empty());
  CHECK(to_json(*r.config)["communication"]["topology"]["inner"] == "numa");
  CHECK(to_json(*parse(to_json(*r.config).dump(), ctx).config) == to_json(*r.config));
  // Without the block: nothing written, detection off.
  r = parse(R"({"train_batch_size": 8})", ctx);
  REQUIRE(r.ok());
  CHECK_FALSE(r.config->communication.slow_ranks.enabled);
  CHECK_FALSE(to_json(*r.config).contains("communication"));
}

TEST_CASE("load prints the notices where ResolveContext says, parse never (issue 57 item 16)") {
  const char* text = R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"lr": 0.001, "torch_adam": true}}})";
  auto printed = [&](std::FILE* to, bool use_load) {
    ResolveContext ctx;
    ctx.print_notices_to = to;
    if (use_load) {
      (void)load(text, ctx, "ds.json");
    } else {
      (void)parse(text, ctx);
    }
  };
  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  printed(f, true);
  const long after_load = std::ftell(f);
  printed(f, false);  // parse() returns the notices, prints none
  CHECK(std::ftell(f) == after_load);
  printed(nullptr, true);  // asked not to: nothing anywhere (no crash on null)
  std::rewind(f);
  std::string got(static_cast<std::size_t>(after_load), '\0');
  REQUIRE(std::fread(got.data(), 1, got.size(), f) == got.size());
  std::fclose(f);
  INFO(got);
  CHECK(got.find("zerotk config: ds.json: ignored: /optimizer/params/torch_adam: ") == 0);
  CHECK(std::count(got.begin(), got.end(), '\n') == 1);
}

TEST_CASE("ZeRO++ qwZ and qgZ: zero_quantized_weights / zero_quantized_gradients at stage 3, written back") {
  ResolveContext ctx;
  ctx.world_size = 4;
  ParseResult r = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "zero_quantized_weights": true,
                           "zero_quantized_gradients": true}})",
                        ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  CHECK(r.notices.empty());
  CHECK(r.config->zero_optimization.stage3.quantized_weights);
  CHECK(r.config->zero_optimization.stage3.quantized_gradients);
  const Json j = to_json(*r.config);
  CHECK(j["zero_optimization"]["zero_quantized_weights"] == true);
  ParseResult back = parse(j.dump(), ctx);
  REQUIRE_MESSAGE(back.ok(), error_lines(back));
  CHECK(back.config->zero_optimization.stage3.quantized_gradients);
  r = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "zero_quantized_weights": 1}})", ctx);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].where() == "/zero_optimization/zero_quantized_weights");
}

TEST_CASE("pipeline stages: pipeline_parallelism.num_stages or pipeline.stages; the batch counts world / (tensor x pipeline)") {
  ResolveContext ctx;
  ctx.world_size = 64;
  // The seeds' 3D config as written: 64 ranks = pipeline 8 x tensor 4 x data 2.
  ParseResult r = parse(read_text_file(std::string(ZEROTK_TEST_SOURCE_DIR) + "/../examples/configs/seed_3d.json"), ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  CHECK(r.config->pipeline.stages == 8);
  CHECK(r.config->pipeline.schedule == "1f1b");
  CHECK(r.config->tensor_parallel_size == 4);
  CHECK(r.config->data_parallel_size == 2);
  CHECK(r.config->train_batch_size == 4 * 16 * 2);
  const Json j = to_json(*r.config);
  CHECK(j["pipeline_parallelism"]["num_stages"] == 8);
  const ParseResult back = parse(j.dump(), ctx);
  REQUIRE_MESSAGE(back.ok(), error_lines(back));
  CHECK(back.config->pipeline.stages == 8);
  CHECK(back.config->train_batch_size == 128);

  // DeepSpeed's block: stages, partition ("best" is by parameters), activation_checkpoint_interval; a
  // key that does nothing here says why.
  ctx.world_size = 4;
  r = parse(R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
                "pipeline": {"stages": 2, "partition": "uniform", "activation_checkpoint_interval": 1, "seed_layers": true},
                "pipeline_parallelism": {"schedule": "zbh1"}})",
            ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  CHECK(r.config->pipeline.stages == 2);
  CHECK(r.config->pipeline.schedule == "zbh1");
  CHECK(r.config->pipeline.partition == PipelinePartition::uniform);
  CHECK(r.config->pipeline.activation_checkpoint_interval == 1);
  CHECK(r.config->train_batch_size == 2 * 4 * 2);
  CHECK(has_notice(r, "/pipeline/seed_layers", "initialised by the trainer"));
  r = parse(R"({"train_micro_batch_size_per_gpu": 2, "pipeline": {"stages": "auto", "partition": "best"}})", ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  CHECK(r.config->pipeline.stages == 1);
  CHECK(r.config->pipeline.partition == PipelinePartition::parameters);

  // Errors, each at its key: stages the world does not hold, the two keys disagreeing, a schedule
  // unknown or unable to run the step's micro-batches (interleaved needs m a multiple of p).
  r = parse(R"({"train_batch_size": 8, "pipeline_parallelism": {"num_stages": 3}})", ctx);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].where() == "/pipeline_parallelism/num_stages");
  CHECK(r.errors[0].message().find("the pipeline stages must divide the world size (4)") != std::string::npos);
  r = parse(R"({"train_batch_size": 8, "tensor_model_parallel_size": 2, "pipeline_parallelism": {"num_stages": 4}})", ctx);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].message().find("tensor x pipeline (2 x 4) must divide the world size (4)") != std::string::npos);
  r = parse(R"({"train_batch_size": 8, "pipeline_parallelism": {"num_stages": 2}, "pipeline": {"stages": 4}})", ctx);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].where() == "/pipeline/stages");
  CHECK(r.errors[0].message().find("differs from /pipeline_parallelism/num_stages (2)") != std::string::npos);
  r = parse(R"({"train_batch_size": 8, "pipeline_parallelism": {"num_stages": 2, "schedule": "zigzag"}})", ctx);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].where() == "/pipeline_parallelism/schedule");
  CHECK(r.errors[0].value() == "zigzag");
  r = parse(R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 3,
                "pipeline_parallelism": {"num_stages": 2, "schedule": "interleaved:2"}})",
            ctx);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].where() == "/pipeline_parallelism/schedule");
  CHECK(r.errors[0].message().find("multiple of the pipeline stages") != std::string::npos);
  CHECK(r.errors[0].message().find("gradient_accumulation_steps (3)") != std::string::npos);
  // The batch names where its data size came from.
  r = parse(R"({"train_batch_size": 3, "train_micro_batch_size_per_gpu": 1, "pipeline_parallelism": {"num_stages": 2}})", ctx);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].message().find("(the data-parallel size: world 4 / pipeline 2)") != std::string::npos);
}

}  // namespace test_reader
