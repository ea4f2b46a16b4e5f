// Matching configs against compiled engines: check_structure names both sides of each mismatch;
// dispatch picks the first engine that fits or lists every candidate and why it did not.
#include "common.hpp"

#include <string>
#include <type_traits>

namespace test_structure {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using namespace zerotk::config;
using zerotk_test::error_lines;

namespace {

// Small stand-ins for zerotk::Engine<...>: only the compile-time structure matters here.
template <int S, class P, class L, class O, class Off = zerotk::None, class D = zerotk::Host>
struct FakeEngine {
  static constexpr int kStage = S;
  using precision_tag = P;
  using loss_scaler_tag = L;
  using optimizer_tag = O;
  using offload_tag = Off;
  using device_tag = D;
};

using Z2Fp16 = FakeEngine<2, fp16, Dynamic, AdamW>;
using Z2Fp16Static = FakeEngine<2, fp16, Static, AdamW>;
using Z3Bf16Cpu = FakeEngine<3, bf16, None, AdamW, Cpu, Cuda>;
using Z1Fp32Lamb = FakeEngine<1, fp32, None, Lamb>;
using Z2Fp16Adam = FakeEngine<2, fp16, Dynamic, Adam>;
/// Both offload blocks: a structure with the optional param_offload_tag.
struct Z3Bf16Both : FakeEngine<3, bf16, None, AdamW, Cpu> {
  using param_offload_tag = Cpu;
};
struct Z3Bf16Params : FakeEngine<3, bf16, None, AdamW> {
  using param_offload_tag = Cpu;
};

/// Gradient compression: a structure with the optional compression_tag (absent: None).
struct Z0TopK : FakeEngine<0, fp32, None, AdamW> {
  using compression_tag = TopK;
};
struct Z0Sign : FakeEngine<0, fp32, None, AdamW> {
  using compression_tag = Sign;
};
using Z0Plain = FakeEngine<0, fp32, None, AdamW>;

static_assert(EngineStructure<Z2Fp16>);
static_assert(std::is_same_v<compression_tag_t<Z0Plain>, None>);
static_assert(std::is_same_v<compression_tag_t<Z0TopK>, TopK>);
static_assert(!EngineStructure<int>);
struct NoDevice {
  static constexpr int kStage = 1;
  using precision_tag = fp32;
  using loss_scaler_tag = None;
  using optimizer_tag = Adam;
  using offload_tag = None;
};
static_assert(!EngineStructure<NoDevice>);

Config config_of(std::string_view json, int world = 1) {
  ResolveContext ctx;
  ctx.world_size = world;
  return load(json, ctx);
}

const char* kZero2Fp16 = R"({"train_batch_size": 8, "fp16": {"enabled": true},
    "zero_optimization": {"stage": 2}, "optimizer": {"type": "Adam"}})";

}  // namespace

TEST_CASE("describe() spells an engine's policies") {
  CHECK(describe<Z3Bf16Cpu>() ==
        "Stage<3>, Precision<bf16>, LossScaler<None>, Optimizer<AdamW>, Offload<Cpu>, Device<Cuda>");
  CHECK(describe(config_of(kZero2Fp16).structure()) ==
        "Stage<2>, Precision<fp16>, LossScaler<Dynamic>, Optimizer<AdamW>, Offload<None>");
  CHECK(describe<Z3Bf16Both>() ==
        "Stage<3>, Precision<bf16>, LossScaler<None>, Optimizer<AdamW>, Offload<Cpu>, OffloadParams<Cpu>, Device<Host>");
  CHECK(describe(config_of(R"({"train_batch_size": 8, "bf16": {"enabled": true}, "zero_optimization": {"stage": 3,
      "offload_param": {"device": "cpu"}}})").structure()) ==
        "Stage<3>, Precision<bf16>, LossScaler<None>, Offload<None>, OffloadParams<Cpu>");
}

TEST_CASE("offload_param at stage 3 matches the engine's OffloadParams, each block on its own") {
  const Config both = config_of(R"({"train_batch_size": 8, "bf16": {"enabled": true}, "zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}})");
  const Config params = config_of(R"({"train_batch_size": 8, "bf16": {"enabled": true}, "zero_optimization": {"stage": 3,
      "offload_param": {"device": "cpu"}}})");
  CHECK(check_structure<Z3Bf16Both>(both).empty());
  CHECK(check_structure<Z3Bf16Params>(params).empty());
  {
    const auto e = check_structure<Z3Bf16Cpu>(both);  // Offload<Cpu> only
    REQUIRE(e.size() == 1);
    CHECK(e[0].where() == "/zero_optimization/offload_param/device");
    CHECK(e[0].message() == "config asks for parameter offload to cpu, the engine was compiled with OffloadParams<None>");
  }
  {
    const auto e = check_structure<Z3Bf16Both>(params);  // an engine with both: the optimizer block is missing
    REQUIRE(e.size() == 1);
    CHECK(e[0].where() == "/zero_optimization/offload_optimizer/device");
  }
  {
    const auto e = check_structure<Z3Bf16Params>(config_of(R"({"train_batch_size": 8, "bf16": {"enabled": true},
        "zero_optimization": {"stage": 3}})"));
    REQUIRE(e.size() == 1);
    CHECK(e[0].message() == "config asks for parameter offload to none, the engine was compiled with OffloadParams<Cpu>");
  }
  // Below stage 3 the reader drops offload_param (with its note), so an engine without it fits.
  CHECK(check_structure<Z2Fp16>(config_of(R"({"train_batch_size": 8, "fp16": {"enabled": true},
      "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}, "optimizer": {"type": "Adam"}})")).empty());
  // dispatch picks the engine with both offloads, and lists the others' reasons when none fits.
  CHECK(dispatch<Z3Bf16Cpu, Z3Bf16Params, Z3Bf16Both>(both, []<class E>(std::type_identity<E>) { return describe<E>(); }) ==
        describe<Z3Bf16Both>());
  CHECK(dispatch<Z3Bf16Cpu, Z3Bf16Both, Z3Bf16Params>(params, []<class E>(std::type_identity<E>) { return describe<E>(); }) ==
        describe<Z3Bf16Params>());
  try {
    dispatch<Z3Bf16Cpu, Z2Fp16>(both, [](auto) { return 0; });
    FAIL("dispatch must throw");
  } catch (const config_error& e) {
    CHECK(std::string(e.what()).find("(Stage<3>, Precision<bf16>, LossScaler<None>, Offload<Cpu>, OffloadParams<Cpu>)") !=
          std::string::npos);
    CHECK(std::string(e.what()).find("/zero_optimization/offload_param/device: config asks for parameter offload to cpu, "
                                     "the engine was compiled with OffloadParams<None>") != std::string::npos);
  }
}

TEST_CASE("a config that fits has no structural errors") {
  const Config c = config_of(kZero2Fp16);
  CHECK(check_structure<Z2Fp16>(c).empty());
  // No optimizer block: the engine's own optimizer is used, whatever it is.
  CHECK(check_structure<Z1Fp32Lamb>(config_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 1}})")).empty());
}

TEST_CASE("each structural mismatch names the config's ask and the compiled policy") {
  SUBCASE("stage") {
    const auto e = check_structure<Z2Fp16>(config_of(R"({"train_batch_size": 8, "fp16": {"enabled": true},
        "zero_optimization": {"stage": 3}})"));
    REQUIRE(e.size() == 1);
    CHECK(e[0].where() == "/zero_optimization/stage");
    CHECK(e[0].message() == "config asks for ZeRO stage 3, the engine was compiled with Partitioner<Stage<2>>");
    CHECK(e[0].value() == "3");
  }
  SUBCASE("precision") {
    const auto e = check_structure<Z2Fp16>(config_of(R"({"train_batch_size": 8, "bf16": {"enabled": true},
        "zero_optimization": {"stage": 2}})"));
    REQUIRE(e.size() == 1);
    CHECK(e[0].where() == "/bf16/enabled");
    CHECK(e[0].message() == "config asks for bf16 training, the engine was compiled with Precision<fp16>");
  }
  SUBCASE("fp32 config against an fp16 engine") {
    const auto e = check_structure<Z2Fp16>(config_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2}})"));
    REQUIRE(e.size() == 1);
    CHECK(e[0].where() == "/fp16/enabled");
    CHECK(e[0].value() == "false");
  }
  SUBCASE("scaler kind") {
    const auto e = check_structure<Z2Fp16>(config_of(R"({"train_batch_size": 8,
        "fp16": {"enabled": true, "loss_scale": 1024}, "zero_optimization": {"stage": 2}})"));
    REQUIRE(e.size() == 1);
    CHECK(e[0].where() == "/fp16/loss_scale");
    CHECK(e[0].message().find("LossScaler<Static>") != std::string::npos);
    CHECK(e[0].message().find("compiled with LossScaler<Dynamic>") != std::string::npos);
    CHECK(e[0].value() == "1024");
    CHECK(check_structure<Z2Fp16Static>(config_of(R"({"train_batch_size": 8,
        "fp16": {"enabled": true, "loss_scale": 1024}, "zero_optimization": {"stage": 2}})")).empty());
  }
  SUBCASE("optimizer: \"Adam\" is AdamW by default, and the message says so") {
    const auto e = check_structure<Z2Fp16Adam>(config_of(kZero2Fp16));
    REQUIRE(e.size() == 1);
    CHECK(e[0].where() == "/optimizer/type");
    CHECK(e[0].message().find("\"Adam\" means AdamW unless \"adam_w_mode\": false") != std::string::npos);
    CHECK(e[0].message().find("Optimizer<Adam>") != std::string::npos);
  }
  SUBCASE("offload device, both blocks") {
    const Config c = config_of(R"({"train_batch_size": 8, "bf16": {"enabled": true}, "zero_optimization": {"stage": 3,
        "offload_optimizer": {"device": "nvme", "nvme_path": "/n"}, "offload_param": {"device": "nvme", "nvme_path": "/n"}}})");
    const auto e = check_structure<Z3Bf16Cpu>(c);
    REQUIRE(e.size() == 2);
    CHECK(e[0].where() == "/zero_optimization/offload_optimizer/device");
    CHECK(e[0].message() == "config asks for optimizer offload to nvme, the engine was compiled with Offload<Cpu>");
    CHECK(e[1].where() == "/zero_optimization/offload_param/device");
  }
  SUBCASE("several at once, all reported") {
    const Config c = config_of(R"({"train_batch_size": 8, "bf16": {"enabled": true}, "zero_optimization": {"stage": 3,
        "offload_optimizer": {"device": "cpu"}}, "optimizer": {"type": "Lamb"}})");
    const auto e = check_structure<Z2Fp16>(c);
    REQUIRE(e.size() == 4);
    CHECK(e[0].where() == "/zero_optimization/stage");
    CHECK(e[1].where() == "/bf16/enabled");
    CHECK(e[2].where() == "/optimizer/type");
    CHECK(e[3].where() == "/zero_optimization/offload_optimizer/device");
  }
}

TEST_CASE("dispatch calls f with the first engine that fits") {
  const Config z3 = config_of(R"({"train_batch_size": 8, "bf16": {"enabled": true},
      "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}})");
  const int picked = dispatch<Z2Fp16, Z1Fp32Lamb, Z3Bf16Both>(z3, []<class E>(std::type_identity<E>) {
    return E::kStage;
  });
  CHECK(picked == 3);

  std::string name;
  dispatch<Z2Fp16Static, Z2Fp16, Z2Fp16Adam>(config_of(kZero2Fp16), [&]<class E>(std::type_identity<E>) {
    name = describe<E>();
  });
  CHECK(name == describe<Z2Fp16>());

  // A reference result is passed through unchanged.
  static int storage = 7;
  int& ref = dispatch<Z2Fp16>(config_of(kZero2Fp16), [](auto) -> int& { return storage; });
  CHECK(&ref == &storage);
}

TEST_CASE("dispatch with no fitting engine lists every candidate and why") {
  const Config c = config_of(R"({"train_batch_size": 8, "fp16": {"enabled": true, "loss_scale": 64},
      "zero_optimization": {"stage": 1}, "optimizer": {"type": "OneBitLamb"}})");
  try {
    dispatch<Z2Fp16, Z1Fp32Lamb>(c, [](auto) { return 0; });
    FAIL("dispatch must throw");
  } catch (const config_error& e) {
    const std::string what = e.what();
    CHECK(what.find("no compiled engine fits this config (Stage<1>, Precision<fp16>, LossScaler<Static>, "
                    "Optimizer<OneBitLamb>, Offload<None>)") != std::string::npos);
    CHECK(what.find(zerotk::config::detail::cat("candidate 1: ", describe<Z2Fp16>())) != std::string::npos);
    CHECK(what.find(zerotk::config::detail::cat("candidate 2: ", describe<Z1Fp32Lamb>())) != std::string::npos);
    CHECK(what.find("/zero_optimization/stage: config asks for ZeRO stage 1") != std::string::npos);
    CHECK(what.find("/fp16/enabled: config asks for fp16 training, the engine was compiled with Precision<fp32>") !=
          std::string::npos);
    CHECK(what.find("Optimizer<OneBitLamb>, the engine was compiled with Optimizer<Lamb>") != std::string::npos);
  }
}

TEST_CASE("with_engine resolves fp16/bf16 \"auto\" from the engine's precision") {
  ResolveContext ctx = with_engine<Z3Bf16Cpu>(ResolveContext{});
  const ParseResult r = parse(R"({"train_batch_size": 8, "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
      "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}})",
                              ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  CHECK(r.config->precision() == DType::bf16);
  CHECK(check_structure<Z3Bf16Cpu>(*r.config).empty());
}

// ---- what this version of zerotk can build and act on -------------------------------------------------

TEST_CASE("gradient_compression.algorithm matches the engine's GradientCompression, both sides named") {
  const Config topk = config_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 0},
      "optimizer": {"type": "AdamW"}, "gradient_compression": {"algorithm": "topk"}})");
  const Config plain = config_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 0},
      "optimizer": {"type": "AdamW"}})");
  CHECK(check_structure<Z0TopK>(topk).empty());
  CHECK(check_structure<Z0Plain>(plain).empty());
  {
    INFO("config asks for topk, the engine has none (no compression_tag at all)");
    const auto e = check_structure<Z0Plain>(topk);
    REQUIRE(e.size() == 1);
    CHECK(e[0].where() == "/gradient_compression/algorithm");
    CHECK(e[0].value() == "\"topk\"");
    CHECK(e[0].message() == "gradient_compression.algorithm \"topk\" needs GradientCompression<TopK>, the engine was "
                            "compiled with GradientCompression<None>");
  }
  {
    INFO("the engine compresses, the config does not");
    const auto e = check_structure<Z0TopK>(plain);
    REQUIRE(e.size() == 1);
    CHECK(e[0].where() == "/gradient_compression/algorithm");
    CHECK(e[0].message().find("config asks for no gradient compression") == 0);
    CHECK(e[0].message().find("the engine was compiled with GradientCompression<TopK> (\"algorithm\": \"topk\")") !=
          std::string::npos);
  }
  {
    INFO("another algorithm: \"1bit\" is GradientCompression<Sign>");
    const Config one_bit = config_of(R"({"train_batch_size": 8, "gradient_compression": {"algorithm": "1bit"}})");
    CHECK(check_structure<Z0Sign>(one_bit).empty());
    const auto e = check_structure<Z0TopK>(one_bit);
    REQUIRE(e.size() == 1);
    CHECK(e[0].message() == "gradient_compression.algorithm \"1bit\" needs GradientCompression<Sign>, the engine was "
                            "compiled with GradientCompression<TopK>");
  }
  CHECK(describe<Z0TopK>() ==
        "Stage<0>, Precision<fp32>, LossScaler<None>, Optimizer<AdamW>, Offload<None>, GradientCompression<TopK>, "
        "Device<Host>");
  CHECK(describe(topk.structure()) ==
        "Stage<0>, Precision<fp32>, LossScaler<None>, Optimizer<AdamW>, Offload<None>, GradientCompression<TopK>");
  // dispatch picks the engine whose codec the config names.
  CHECK(dispatch<Z0Plain, Z0TopK>(topk, []<class E>(std::type_identity<E>) { return describe<E>(); }) ==
        describe<Z0TopK>());
  CHECK(dispatch<Z0TopK, Z0Plain>(plain, []<class E>(std::type_identity<E>) { return describe<E>(); }) ==
        describe<Z0Plain>());
}

TEST_CASE("check_buildable names what no engine of this version can run") {
  struct Case {
    const char* json;
    const char* path;
    const char* missing;
    const char* value;
  };
  const Case cases[] = {
      {R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/n"}},
           "optimizer": {"type": "Lamb"}})",
       "/optimizer/type", "Lamb with optimizer offload or NVMe parameter offload", "\"Lamb\""},
      {R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}, "optimizer": {"type": "Lamb"}})",
       "/optimizer/type", "Lamb with optimizer offload", "\"Lamb\""},
      {R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/n"}},
           "optimizer": {"type": "Lamb"}})", "/optimizer/type", "Lamb with optimizer offload", "\"Lamb\""},
      {R"({"optimizer": {"type": "OneBitAdam"}, "zero_optimization": {"stage": 1}})", "/zero_optimization/stage",
       "OneBitAdam, ZeroOneAdam or OneBitLamb with ZeRO stage 1, 2 or 3", "1"},
      {R"({"optimizer": {"type": "OneBitLamb"}, "zero_optimization": {"stage": 2}})", "/zero_optimization/stage",
       "OneBitAdam, ZeroOneAdam or OneBitLamb with ZeRO stage 1, 2 or 3", "2"},
      {R"({"gradient_compression": {"algorithm": "2bit"}, "optimizer": {"type": "OneBitLamb"}})", "/optimizer/type",
       "gradient_compression with OneBitAdam, ZeroOneAdam or OneBitLamb", "\"OneBitLamb\""},
      {R"({"optimizer": {"type": "ZeroOneAdam"}, "zero_optimization": {"stage": 2}})", "/zero_optimization/stage",
       "OneBitAdam, ZeroOneAdam or OneBitLamb with ZeRO stage 1, 2 or 3", "2"},
      {R"({"gradient_compression": {"algorithm": "topk"}, "optimizer": {"type": "ZeroOneAdam"}})", "/optimizer/type",
       "gradient_compression with OneBitAdam, ZeroOneAdam or OneBitLamb", "\"ZeroOneAdam\""},
      {R"({"gradient_compression": {"algorithm": "topk"}, "zero_optimization": {"stage": 1}})",
       "/zero_optimization/stage", "gradient_compression with ZeRO stage 1, 2 or 3", "1"},
      {R"({"gradient_compression": {"algorithm": "2bit"}, "zero_optimization": {"stage": 3}})",
       "/zero_optimization/stage", "gradient_compression with ZeRO stage 1, 2 or 3", "3"},
      {R"({"gradient_compression": {"algorithm": "1bit"}, "optimizer": {"type": "OneBitAdam"}})", "/optimizer/type",
       "gradient_compression with OneBitAdam, ZeroOneAdam or OneBitLamb", "\"OneBitAdam\""},
      {R"({"prescale_gradients": true})", "/prescale_gradients", "scaling gradients before the reduction", "true"},
      {R"({"gradient_predivide_factor": 2.0})", "/gradient_predivide_factor", "dividing gradients", "2"},
      {R"({"communication_data_type": "fp32", "bf16": {"enabled": true}})", "/communication_data_type",
       "reducing gradients in another precision", "\"fp32\""},
  };
  for (const Case& k : cases) {
    CAPTURE(std::string(k.json));
    std::string json = k.json;
    json.insert(1, R"("train_batch_size": 8, )");
    const auto errors = check_buildable(config_of(json));
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].where() == k.path);
    CHECK(errors[0].message().find(std::string("zerotk cannot build this yet: ") + k.missing) == 0);
    CHECK(errors[0].value() == k.value);
  }
  // Every missing piece at once.
  CHECK(check_buildable(config_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
      "offload_param": {"device": "nvme", "nvme_path": "/n"}}, "prescale_gradients": true,
      "optimizer": {"type": "OneBitAdam"}})")).size() == 2);
  // What the engine runs today: stages 0-3, Adam/AdamW/Lamb (and OneBitAdam, ZeroOneAdam, OneBitLamb at stage 0), fp16/bf16/fp32, Offload<Cpu> at stages 1-3,
  // Offload<Nvme> of the optimizer state (the reader allows nvme with stage 3 only, as DeepSpeed),
  // OffloadParams<Cpu> at stage 3, OffloadParams<Nvme> at stage 3 with Adam/AdamW.
  for (const char* ok : {kZero2Fp16, R"({"train_batch_size": 8, "zero_optimization": {"stage": 3}})",
                         R"({"train_batch_size": 8, "optimizer": {"type": "OneBitAdam"}, "zero_optimization": {"stage": 0}})",
                         R"({"train_batch_size": 8, "optimizer": {"type": "ZeroOneAdam"}, "zero_optimization": {"stage": 0}})",
                         R"({"train_batch_size": 8, "optimizer": {"type": "OneBitLamb", "params": {"freeze_step": 10,
                             "coeff_beta": 0.8, "factor_max": 3.0}}, "zero_optimization": {"stage": 0}})",
                         R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}})",
                         R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})",
                         R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                             "offload_param": {"device": "cpu", "pin_memory": false}}})",
                         R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})",
                         R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme",
                             "nvme_path": "/n"}}})",
                         R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme",
                             "nvme_path": "/n"}, "offload_param": {"device": "nvme", "nvme_path": "/n"}}})",
                         R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                             "offload_param": {"device": "nvme", "nvme_path": "/n"}}})",
                         R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
                             "offload_param": {"device": "nvme", "nvme_path": "/n"}}})",
                         R"({"train_batch_size": 8, "zero_optimization": {"stage": 2,
                             "offload_param": {"device": "nvme", "nvme_path": "/n"}}, "optimizer": {"type": "Lamb"}})",
                         R"({"train_batch_size": 8, "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}},
                             "optimizer": {"type": "AdamW"}})", R"({"train_batch_size": 8, "zero_optimization": {"stage": 1},
                                        "optimizer": {"type": "Lamb"}, "bf16": {"enabled": true},
                                        "communication_data_type": "bf16"})",
                         R"({"train_batch_size": 8, "activation_checkpointing": {"partition_activations": false}})",
                         R"({"train_batch_size": 8, "gradient_compression": {"algorithm": "topk", "topk_ratio": 0.05}})",
                         R"({"train_batch_size": 8, "gradient_compression": {"algorithm": "2bit", "huffman_coding": true},
                             "optimizer": {"type": "Lamb"}})",
                         // Knobs without an algorithm: no compression, buildable at any stage and with 1-bit Adam.
                         R"({"train_batch_size": 8, "gradient_compression": {"topk_ratio": 0.05}, "zero_optimization": {"stage": 2}})",
                         R"({"train_batch_size": 8, "gradient_compression": {"huffman_coding": true},
                             "optimizer": {"type": "OneBitAdam"}})",
                         R"({"train_batch_size": 8, "activation_checkpointing": {"partition_activations": true,
                             "cpu_checkpointing": true, "contiguous_memory_optimization": true, "number_checkpoints": 4,
                             "synchronize_checkpoint_boundary": true, "profile": true}})"}) {
    CAPTURE(std::string(ok));
    CHECK(check_buildable(config_of(ok)).empty());
  }
}

TEST_CASE("check_buildable runs the engine checker's rows over the engine and grid a config asks for") {
  // 1-bit Adam exchanges over the data group alone: on tensor 2 no engine runs it (the row
  // compressed_exchange_data_only, which Engine::build checks once it has a grid).
  const auto onebit_tp = check_buildable(config_of(R"({"train_batch_size": 8, "tensor_model_parallel_size": 2,
      "optimizer": {"type": "OneBitAdam"}, "zero_optimization": {"stage": 0}})", 2));
  REQUIRE(onebit_tp.size() == 1);
  CHECK(onebit_tp[0].message().find("compressed communication") == 0);
  CHECK(onebit_tp[0].value() == "2 x 1");
  // The same on a plain data group is buildable.
  CHECK(check_buildable(config_of(R"({"train_batch_size": 8, "optimizer": {"type": "OneBitAdam"},
      "zero_optimization": {"stage": 0}})", 2)).empty());
  // Accumulating bf16 gradients in fp16: no engine (the row accumulation_dtype), at the config's pointer.
  const auto accum = check_buildable(config_of(R"({"train_batch_size": 8, "bf16": {"enabled": true},
      "data_types": {"grad_accum_dtype": "fp16"}})"));
  REQUIRE(accum.size() == 1);
  CHECK(accum[0].where() == "/data_types/grad_accum_dtype");
  CHECK(accum[0].value() == "fp16");
  // fp32 accumulation of fp16 gradients at stage 1 with accumulation: the default Partitioner
  // reduces at the boundary and refuses it, but Partitioner<Stage<1>, when::every_micro_step> runs
  // it, so some engine can: not reported.
  const char* fp32_accum = R"({"train_batch_size": 8, "gradient_accumulation_steps": 2, "fp16": {"enabled": true},
      "zero_optimization": {"stage": 1}, "data_types": {"grad_accum_dtype": "fp32"}})";
  CHECK(check_buildable(config_of(fp32_accum)).empty());
}

TEST_CASE("settings the engine does not act on are notes, and errors under strict") {
  ResolveContext ctx;
  const char* json = R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "reduce_scatter": false,
      "allgather_bucket_size": 2e8, "contiguous_gradients": false, "round_robin_gradients": true,
      "allgather_partitions": false, "load_from_fp32_weights": false},
      "scheduler": {"type": "WarmupLR", "params": {"last_batch_iteration": 99}}})";
  const char* paths[] = {"/zero_optimization/contiguous_gradients", "/zero_optimization/reduce_scatter",
                         "/zero_optimization/allgather_partitions", "/zero_optimization/allgather_bucket_size",
                         "/zero_optimization/round_robin_gradients", "/zero_optimization/load_from_fp32_weights",
                         "/scheduler/params/last_batch_iteration"};
  ParseResult r = parse(json, ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  REQUIRE(r.notices.size() == std::size(paths));
  for (std::size_t i = 0; i < std::size(paths); ++i) {
    CHECK(r.notices[i].path == paths[i]);
    CHECK(r.notices[i].kind == Notice::Kind::unsupported);
    CHECK(r.notices[i].message.find("has no effect in zerotk: ") == 0);
  }
  ctx.strict = true;
  r = parse(json, ctx);
  REQUIRE(r.errors.size() == std::size(paths));
  CHECK(format_line(r.errors[3]) ==
        "/zero_optimization/allgather_bucket_size: has no effect in zerotk: updated parameters are all-gathered in "
        "the buckets of reduce_bucket_size; ignored (strict mode) (got 200000000)");
  // DeepSpeed's defaults, and stage 0 where DeepSpeed ignores the ZeRO switches too, say nothing.
  r = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "reduce_scatter": true,
      "allgather_bucket_size": 5e8, "contiguous_gradients": true, "round_robin_gradients": false}})",
            ctx);
  CHECK_MESSAGE(r.ok(), error_lines(r));
  r = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 0, "reduce_scatter": false}})", ctx);
  CHECK_MESSAGE(r.ok(), error_lines(r));
}

TEST_CASE("offload_param.max_in_cpu is acted on with nvme: any value is read without a note; a negative one is refused") {
  ResolveContext ctx;
  auto with = [&](const std::string& extra) {
    return parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
        "offload_optimizer": {"device": "nvme", "nvme_path": "/n"},
        "offload_param": {"device": "nvme", "nvme_path": "/n")" + extra + "}}}",
                 ctx);
  };
  for (const char* quiet : {"", R"(, "max_in_cpu": 0)", R"(, "max_in_cpu": 1e6)", R"(, "max_in_cpu": 1e9, "buffer_count": 3)"}) {
    CAPTURE(quiet);
    const ParseResult r = with(quiet);
    CHECK_MESSAGE(r.ok(), error_lines(r));
    CHECK(r.notices.empty());
  }
  const ParseResult bad = with(R"(, "max_in_cpu": -1)");
  REQUIRE_FALSE(bad.ok());
  CHECK(error_lines(bad).find("/zero_optimization/offload_param/max_in_cpu") != std::string::npos);
}

TEST_CASE("activation_checkpointing: partition_activations is a note (Recompute keeps whole inputs), the rest is read") {
  ResolveContext ctx;
  const char* json = R"({"train_batch_size": 8, "activation_checkpointing": {"partition_activations": true,
      "cpu_checkpointing": true, "contiguous_memory_optimization": true, "number_checkpoints": 6,
      "synchronize_checkpoint_boundary": true, "profile": true}})";
  ParseResult r = parse(json, ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  REQUIRE(r.notices.size() == 1);
  CHECK(r.notices[0].path == "/activation_checkpointing/partition_activations");
  CHECK(r.notices[0].kind == Notice::Kind::unsupported);
  CHECK(r.notices[0].message.find("across the tensor-parallel group") != std::string::npos);
  const auto& a = r.config->activation_checkpointing;
  CHECK(a.cpu_checkpointing);
  CHECK(a.number_checkpoints == 6);
  ctx.strict = true;
  r = parse(json, ctx);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].where() == "/activation_checkpointing/partition_activations");
}

TEST_CASE("checkpoint: tag_validation is read in any case; the keys without effect here say why, and errors under strict") {
  ResolveContext ctx;
  for (auto [text, mode] : {std::pair{"\"Ignore\"", TagValidation::ignore}, std::pair{"\"WARN\"", TagValidation::warn},
                            std::pair{"\"fail\"", TagValidation::fail}}) {
    CAPTURE(text);
    const ParseResult r = parse(std::string(R"({"train_batch_size": 8, "checkpoint": {"tag_validation": )") + text + "}}", ctx);
    REQUIRE_MESSAGE(r.ok(), error_lines(r));
    CHECK(r.notices.empty());
    CHECK(r.config->checkpoint.tag_validation == mode);
    // The resolved config says it back, so zerotk-config's output keeps the choice.
    CHECK(to_json(*r.config)["checkpoint"]["tag_validation"] == std::string(to_string(mode)));
  }
  CHECK(config_of(R"({"train_batch_size": 8})").checkpoint.tag_validation == TagValidation::warn);  // DeepSpeed's default
  const ParseResult bad = parse(R"({"train_batch_size": 8, "checkpoint": {"tag_validation": "Strict"}})", ctx);
  REQUIRE_FALSE(bad.ok());
  CHECK(error_lines(bad).find("/checkpoint/tag_validation") != std::string::npos);
  CHECK(error_lines(bad).find("\"Fail\"") != std::string::npos);  // the choices are named

  // DeepSpeed's defaults say nothing; each key set otherwise is a note naming why it does nothing here.
  ParseResult quiet = parse(R"({"train_batch_size": 8, "checkpoint": {"tag_validation": "Warn", "load_universal": false,
      "use_node_local_storage": false, "parallel_write": {"pipeline_stage": false}}})",
                            ctx);
  CHECK_MESSAGE(quiet.ok(), error_lines(quiet));
  CHECK(quiet.notices.empty());
  const char* json = R"({"train_batch_size": 8, "checkpoint": {"load_universal": true, "use_node_local_storage": true,
      "parallel_write": {"pipeline_stage": true}, "writer": {"type": "fast", "decoupled": true}}})";
  ParseResult r = parse(json, ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  REQUIRE(r.notices.size() == 4);
  const std::pair<const char*, const char*> expected[] = {
      {"/checkpoint/writer", "save_async"},
      {"/checkpoint/load_universal", "resharded online"},
      {"/checkpoint/use_node_local_storage", "shared checkpoint directory"},
      {"/checkpoint/parallel_write/pipeline_stage", "already writes its own file"}};
  for (std::size_t i = 0; i < std::size(expected); ++i) {
    CAPTURE(i);
    CHECK(r.notices[i].path == expected[i].first);
    CHECK(r.notices[i].kind == Notice::Kind::unsupported);
    CHECK(r.notices[i].message.find(expected[i].second) != std::string::npos);
  }
  CHECK(r.config->checkpoint.load_universal);
  ctx.strict = true;
  r = parse(json, ctx);
  CHECK(r.errors.size() == 4);
  ctx.strict = false;
  // A misspelt key is still an unknown key with a suggestion, not silently taken.
  r = parse(R"({"train_batch_size": 8, "checkpoint": {"tag_validaton": "Fail"}})", ctx);
  REQUIRE_FALSE(r.ok());
  CHECK(error_lines(r).find("tag_validation") != std::string::npos);
}

TEST_CASE("offload_param.pin_memory false is a note (the shards are always page-locked); the NVMe keys say nothing for cpu") {
  ResolveContext ctx;
  ParseResult r = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
      "offload_param": {"device": "cpu", "pin_memory": false, "buffer_count": 8, "buffer_size": 1e6, "max_in_cpu": 1e6}}})",
                        ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  REQUIRE(r.notices.size() == 1);
  CHECK(r.notices[0].path == "/zero_optimization/offload_param/pin_memory");
  CHECK(r.notices[0].message.find("always page-locked") != std::string::npos);
  CHECK(r.config->zero_optimization.param_nvme.buffer_count == 8);  // read, validated, not used by cpu
  r = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})", ctx);
  REQUIRE_MESSAGE(r.ok(), error_lines(r));
  CHECK(r.notices.empty());
}

}  // namespace test_structure
