// The config holds each layer's own options struct, filled directly by the reader, and every value
// that a layer would narrow (an int micro-step count, fp32 optimizer kernels) is range-checked
// where it is assigned, with an error naming the JSON key and the value.
#include "common.hpp"

#include <limits>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace test_options {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using namespace zerotk::config;
using zerotk_test::error_lines;

// One struct per layer: the config's blocks are (or hold) the layers' structs, not mirrors of them.
static_assert(std::is_base_of_v<precision::LossScalerOptions, Fp16Options>);
static_assert(std::is_same_v<decltype(OptimizerBlock::params), zerotk::OptimizerOptions>);
static_assert(std::is_same_v<decltype(SchedulerOptions::params), optim::LrSchedulerOptions>);
static_assert(std::is_same_v<decltype(WarmupLROptions::warmup_type), optim::WarmupType>);

namespace {

bool has_error(const ParseResult& r, const std::string& path, const std::string& rule, const std::string& value) {
  for (const auto& e : r.errors) {
    if (e.where() == path && e.message().find(rule) != std::string::npos && e.value() == value) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("the fp16 block fills LossScalerOptions: loss_scale is the static scale") {
  ResolveContext ctx;
  const ParseResult r = parse(R"({"train_batch_size": 8, "fp16": {"enabled": true, "loss_scale": 512,
                                  "initial_scale_power": 12, "loss_scale_window": 100, "hysteresis": 3,
                                  "consecutive_hysteresis": true, "min_loss_scale": 0.5}})",
                              ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  const precision::LossScalerOptions& s = r.config->fp16;
  CHECK(s.static_scale == 512);
  CHECK(s.initial_scale_power == 12);
  CHECK(s.loss_scale_window == 100);
  CHECK(s.hysteresis == 3);
  CHECK(s.consecutive_hysteresis);
  CHECK(s.min_loss_scale == 0.5);
  CHECK(s.raise_error_at_min_scale);  // API only: DeepSpeed's default
  CHECK(r.config->scaler() == ScalerKind::static_scale);
  // Written back under DeepSpeed's names, the power as the integer DeepSpeed reads.
  const Json j = to_json(*r.config);
  CHECK(j["fp16"]["loss_scale"] == 512.0);
  CHECK(j["fp16"]["initial_scale_power"].is_number_integer());
}

TEST_CASE("the optimizer block fills OptimizerOptions; schedules fill optim's options") {
  ResolveContext ctx;
  const ParseResult r = parse(R"({"train_batch_size": 8,
      "optimizer": {"type": "Lamb", "params": {"lr": 0.003, "betas": [0.8, 0.95], "eps": 1e-6,
                                               "weight_decay": 0.01, "max_coeff": 5, "min_coeff": 0.1}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10, "last_batch_iteration": 4}}})",
                              ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  const zerotk::OptimizerOptions& o = r.config->optimizer->params;
  CHECK(o.lr == 0.003);  // a double: exactly what the file says
  CHECK(o.beta1 == 0.8);
  CHECK(o.beta2 == 0.95);
  CHECK(o.eps == 1e-6);
  CHECK(o.weight_decay == 0.01);
  CHECK(o.lamb_max_coeff == 5);
  CHECK(o.lamb_min_coeff == 0.1);
  const auto& w = std::get<WarmupLROptions>(r.config->scheduler->params);
  CHECK(w.warmup_max_lr == 0.003);  // resolved from the optimizer lr, not left unset
  CHECK(w.warmup_num_steps == 10);
  CHECK(r.config->scheduler->last_batch_iteration == 4);
  // Written back under DeepSpeed's names.
  const Json j = to_json(*r.config);
  CHECK(j["optimizer"]["params"]["betas"] == Json::array({0.8, 0.95}));
  CHECK(j["optimizer"]["params"]["max_coeff"] == 5.0);
  CHECK(j["scheduler"]["params"]["last_batch_iteration"] == 4);
}

TEST_CASE("a Config built in code writes unset schedule optionals as their resolved values or null") {
  Config c;
  c.train_batch_size = 8;
  c.train_micro_batch_size_per_gpu = 8;
  c.optimizer = OptimizerBlock{};
  c.optimizer->params.lr = 0.02;
  c.scheduler = SchedulerOptions{WarmupLROptions{}};
  CHECK(to_json(c)["scheduler"]["params"]["warmup_max_lr"] == 0.02);  // WarmupLR's peak is the optimizer lr
  OneCycleOptions oc;
  oc.cycle_max_lr = 0.1;
  oc.cycle_first_step_size = 7;
  c.scheduler = SchedulerOptions{oc};
  const Json p = to_json(c)["scheduler"]["params"];
  CHECK(p["cycle_min_lr"].is_null());  // required, never resolved: reading it back is an error
  CHECK(p["cycle_second_step_size"] == 7);
}

// Hostile-input issue, item 6: options narrowed without range checks.
TEST_CASE("gradient_accumulation_steps beyond an int is an error, not a wrapped count") {
  ResolveContext ctx;
  for (const char* gas : {"4294967297", "2147483648"}) {
    CAPTURE(gas);
    const ParseResult r =
        parse(std::string(R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": )") + gas + "}", ctx);
    CHECK(has_error(r, "/gradient_accumulation_steps", "must be an integer in [1, 2147483647]", gas));
  }
  // The largest int is fine; derived from the batch sizes, a count above it is reported too.
  CHECK(parse(R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2147483647})", ctx).ok());
  const ParseResult derived = parse(R"({"train_batch_size": 4294967296, "train_micro_batch_size_per_gpu": 1})", ctx);
  CHECK_MESSAGE(has_error(derived, "/gradient_accumulation_steps", "above 2147483647", "4294967296"),
                error_lines(derived));
}

TEST_CASE("optimizer values the fp32 kernels cannot carry are errors at their JSON path") {
  struct Case {
    const char* params;
    const char* path;
    const char* rule;
    const char* value;
  };
  const Case cases[] = {
      {R"("lr": 1e300)", "/optimizer/params/lr", "beyond float's range", "1e+300"},
      {R"("lr": 3.5e38)", "/optimizer/params/lr", "beyond float's range", "3.5e+38"},
      {R"("eps": 1e-50)", "/optimizer/params/eps", "below float's smallest normal", "1e-50"},
      {R"("weight_decay": 1e-40)", "/optimizer/params/weight_decay", "below float's smallest normal", "1e-40"},
      {R"("betas": [0.9, 0.99999999999])", "/optimizer/params/betas", "beta2 must be in [0, 1) in float too",
       "[0.9, 0.99999999999]"},
      {R"("betas": [1e-45, 0.999])", "/optimizer/params/betas", "beta1 is non-zero but below", "[1e-45, 0.999]"},
      {R"("max_coeff": 1e39)", "/optimizer/params/max_coeff", "beyond float's range", "1e+39"},
  };
  ResolveContext ctx;
  for (const Case& k : cases) {
    CAPTURE(std::string(k.params));
    const ParseResult r =
        parse(std::string(R"({"train_batch_size": 8, "optimizer": {"type": "Lamb", "params": {)") + k.params + "}}}",
              ctx);
    CHECK_MESSAGE(has_error(r, k.path, k.rule, k.value), error_lines(r));
    CHECK(r.errors.size() == 1);
  }
  // The edges float does carry are accepted.
  CHECK(parse(R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"lr": 3.4e38, "eps": 1.2e-38,
                  "weight_decay": 0}}})",
              ctx)
            .ok());
  // Already-reported rules are not repeated by the library's check.
  const ParseResult coeffs = parse(
      R"({"train_batch_size": 8, "optimizer": {"type": "Lamb", "params": {"min_coeff": 2, "max_coeff": 1}}})", ctx);
  REQUIRE(coeffs.errors.size() == 1);
  CHECK(coeffs.errors[0].where() == "/optimizer/params/min_coeff");
}

TEST_CASE("optimizer values resolved from engine hints obey the same rules") {
  const char* json = R"({"train_batch_size": 8, "optimizer": {"type": "AdamW",
      "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}}})";
  ResolveContext ctx;
  ctx.betas = std::array<double, 2>{1.5, -2};
  CHECK_FALSE(parse(json, ctx).ok());
  ctx = {};
  ctx.eps = -1e-8;
  CHECK_FALSE(parse(json, ctx).ok());
  ctx = {};
  ctx.weight_decay = std::numeric_limits<double>::infinity();
  CHECK_FALSE(parse(json, ctx).ok());
  ctx = {};
  ctx.lr = 1e300;
  CHECK_FALSE(parse(json, ctx).ok());
  ctx = {};
  ctx.lr = 0.003;
  const ParseResult ok = parse(json, ctx);
  REQUIRE_MESSAGE(ok.ok(), error_lines(ok));
  CHECK(ok.config->optimizer->params.lr == 0.003);
}

TEST_CASE("schedule learning rates the fp32 kernels cannot carry are errors at their JSON path") {
  ResolveContext ctx;
  ParseResult r = parse(R"({"train_batch_size": 8, "scheduler": {"type": "OneCycle",
                            "params": {"cycle_min_lr": 1e-50, "cycle_max_lr": 1e39}}})",
                        ctx);
  CHECK(has_error(r, "/scheduler/params/cycle_min_lr", "below float's smallest normal", "1e-50"));
  CHECK(has_error(r, "/scheduler/params/cycle_max_lr", "beyond float's range", "1e+39"));
  r = parse(R"({"train_batch_size": 8, "scheduler": {"type": "WarmupDecayLR",
               "params": {"total_num_steps": 10, "warmup_max_lr": 1e300}}})",
            ctx);
  CHECK(has_error(r, "/scheduler/params/warmup_max_lr", "beyond float's range", "1e+300"));
}

TEST_CASE("data_types.grad_accum_dtype: DeepSpeed's spellings, written back canonical") {
  struct Case {
    const char* json;
    DType dtype;
  };
  const Case cases[] = {{"\"fp32\"", DType::fp32},     {"\"fp16\"", DType::fp16},         {"\"bf16\"", DType::bf16},
                        {"\"float\"", DType::fp32},    {"\"torch.float16\"", DType::fp16}, {"\"half\"", DType::fp16},
                        {"\"bfloat16\"", DType::bf16}, {"\"BF16\"", DType::bf16}};
  ResolveContext ctx;
  for (const Case& k : cases) {
    CAPTURE(std::string(k.json));
    const ParseResult r =
        parse(std::string(R"({"train_batch_size": 8, "data_types": {"grad_accum_dtype": )") + k.json + "}}", ctx);
    REQUIRE_MESSAGE(r.ok(), error_lines(r));
    CHECK(r.config->grad_accum_dtype == k.dtype);
    const Json j = to_json(*r.config);
    CHECK(j["data_types"]["grad_accum_dtype"] == std::string(to_string(k.dtype)));
    const ParseResult back = parse(j.dump(), ctx);
    REQUIRE(back.ok());
    CHECK(back.config->grad_accum_dtype == k.dtype);
  }
  // Absent or null: the training precision, and nothing is written (the JSON of older configs is unchanged).
  for (const char* json : {R"({"train_batch_size": 8})", R"({"train_batch_size": 8, "data_types": {"grad_accum_dtype": null}})"}) {
    const ParseResult r = parse(json, ctx);
    REQUIRE(r.ok());
    CHECK_FALSE(r.config->grad_accum_dtype);
    CHECK_FALSE(to_json(*r.config).contains("data_types"));
  }
  ParseResult bad = parse(R"({"train_batch_size": 8, "data_types": {"grad_accum_dtype": "int8"}})", ctx);
  CHECK(has_error(bad, "/data_types/grad_accum_dtype", "must be one of \"fp32\", \"fp16\", \"bf16\"", "\"int8\""));
  bad = parse(R"({"train_batch_size": 8, "data_types": {"grad_accum_dtyp": "fp32"}})", ctx);
  CHECK(has_error(bad, "/data_types/grad_accum_dtyp", "did you mean \"grad_accum_dtype\"", "\"fp32\""));
  // DeepSpeed 0.19.5's other data_types keys are known, and reported as not acted on.
  const ParseResult other = parse(R"({"train_batch_size": 8, "data_types": {"param_dtype": "bf16"}})", ctx);
  REQUIRE(other.ok());
  CHECK(zerotk_test::has_notice(other, "/data_types/param_dtype", "not supported"));
}

TEST_CASE("fp16_override_modules: zerotk's list of module types kept in fp32") {
  ResolveContext ctx;
  const ParseResult r =
      parse(R"({"train_batch_size": 8, "bf16": {"enabled": true}, "fp16_override_modules": ["LayerNorm", "Embedding"]})",
            ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  CHECK(r.config->fp16_override_modules == std::vector<std::string>{"LayerNorm", "Embedding"});
  const Json j = to_json(*r.config);
  CHECK(j["fp16_override_modules"] == Json::array({"LayerNorm", "Embedding"}));
  CHECK(parse(j.dump(), ctx).config->fp16_override_modules == r.config->fp16_override_modules);
  // Empty or null: nothing kept in fp32, nothing written.
  for (const char* json : {R"({"train_batch_size": 8, "fp16_override_modules": []})",
                           R"({"train_batch_size": 8, "fp16_override_modules": null})"}) {
    const ParseResult e = parse(json, ctx);
    REQUIRE(e.ok());
    CHECK(e.config->fp16_override_modules.empty());
    CHECK_FALSE(to_json(*e.config).contains("fp16_override_modules"));
  }
  ParseResult bad = parse(R"({"train_batch_size": 8, "fp16_override_modules": "LayerNorm"})", ctx);
  CHECK(has_error(bad, "/fp16_override_modules", "expected an array of module type names", "\"LayerNorm\""));
  bad = parse(R"({"train_batch_size": 8, "fp16_override_modules": ["LayerNorm", "", 3, "LayerNorm"]})", ctx);
  CHECK(has_error(bad, "/fp16_override_modules/1", "non-empty string", "\"\""));
  CHECK(has_error(bad, "/fp16_override_modules/2", "non-empty string", "3"));
  CHECK(has_error(bad, "/fp16_override_modules/3", "listed twice", "\"LayerNorm\""));
  CHECK(bad.errors.size() == 3);
}

TEST_CASE("zero_allowed_param_types / zero_force_param_types: zerotk's lists of module types stage 3 partitions") {
  ResolveContext ctx;
  const ParseResult r = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3},
      "zero_allowed_param_types": ["Block"], "zero_force_param_types": ["Embedding", "LayerNorm"]})",
                              ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  const auto& z = *r.config;
  CHECK(z.zero_optimization.stage3.partitioned_module_types == std::vector<std::string>{"Block"});
  CHECK(z.zero_optimization.stage3.replicated_module_types == std::vector<std::string>{"Embedding", "LayerNorm"});
  const Json j = to_json(*r.config);
  CHECK(j["zero_force_param_types"] == Json::array({"Embedding", "LayerNorm"}));
  const ParseResult again = parse(j.dump(), ctx);
  REQUIRE(again.ok());
  CHECK(again.config->zero_optimization.stage3.partitioned_module_types == z.zero_optimization.stage3.partitioned_module_types);
  CHECK(again.config->zero_optimization.stage3.replicated_module_types == z.zero_optimization.stage3.replicated_module_types);
  CHECK_FALSE(to_json(*parse(R"({"train_batch_size": 8})", ctx).config).contains("zero_allowed_param_types"));

  ParseResult bad = parse(R"({"train_batch_size": 8, "zero_force_param_types": "Embedding"})", ctx);
  CHECK(has_error(bad, "/zero_force_param_types", "expected an array of module type names",
                  "\"Embedding\""));
  bad = parse(R"({"train_batch_size": 8, "zero_allowed_param_types": ["Block", 1, "Block"]})",
              ctx);
  CHECK(has_error(bad, "/zero_allowed_param_types/1", "non-empty string", "1"));
  CHECK(has_error(bad, "/zero_allowed_param_types/2", "listed twice", "\"Block\""));
  bad = parse(R"({"train_batch_size": 8, "zero_allowed_param_types": ["Block"],
      "zero_force_param_types": ["Block"]})",
              ctx);
  CHECK(has_error(bad, "/zero_force_param_types", "either partitioned or not", "\"Block\""));
}

}  // namespace test_options
