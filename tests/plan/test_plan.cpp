// The memory planner (plan/): model states and buffers equal the ledger of real engines (threads
// communicator, Device<Host>, W = 1..4, stages 0-3, fp32/fp16/bf16, Offload<Cpu>, accumulation,
// hpZ); the ZeRO paper's table and DeepSpeed's estimators against their closed forms; the GPT
// shape's parameter count; the activation peak model; sizes and errors; the search order.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <filesystem>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine_fixture.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/engines.hpp"  // the compiled engine set, when the suite links zerotk::engines
#include "zerotk/plan.hpp"

using namespace zerotk;
using namespace zt_test;
namespace fs = std::filesystem;

namespace {

/// The fixture's Mlp as the planner sees it: each Dense layer {weight, bias}; at stage 3 (the Mlp
/// lists no modules) every parameter is a fetch unit of its own.
plan::ModelDescription mlp_description(int stage) {
  plan::ModelDescription m;
  for (std::size_t l = 0; l + 1 < kWidths.size(); ++l) {
    const std::size_t in = static_cast<std::size_t>(kWidths[l]), out = static_cast<std::size_t>(kWidths[l + 1]);
    if (stage == 3) {
      for (std::size_t n : {out * in, out}) {
        plan::LayerDesc d;
        d.params = {n};
        m.layers.push_back(d);
      }
    } else {
      plan::LayerDesc d;
      d.params = {out * in, out};
      m.layers.push_back(d);
    }
  }
  return m;
}

template <class Prec>
DType dtype_of_precision() {
  if constexpr (std::is_same_v<Prec, fp32>) return DType::fp32;
  else if constexpr (std::is_same_v<Prec, fp16>) return DType::fp16;
  else return DType::bf16;
}

/// The NVMe homes' settings for check_ledger (Offload<Nvme>, OffloadParams<Nvme>).
struct NvmeSettings {
  std::size_t optimizer_buffers = 4;
  bool pipeline = false;  ///< pipeline_read and pipeline_write
  std::size_t param_buffers = 5;
  std::size_t max_in_cpu = 0;
};

fs::path nvme_dir() {
  const fs::path d = fs::path(ZEROTK_TEST_BINARY_DIR) / "scratch" / "plan_nvme";
  fs::create_directories(d);
  return d;
}

/// Runs a few steps on `world` ranks and compares every rank's ledger (live bytes by space and
/// category) with the plan.
template <int S, class Prec, class Off, class ParamOff = OffloadParams<None>, class Opt = Optimizer<AdamW>>
void check_ledger(int world, int gas, int hpz = 1, std::size_t sub_group = 1'000'000'000, const NvmeSettings& nv = {}) {
  CAPTURE(S);
  CAPTURE(world);
  CAPTURE(gas);
  CAPTURE(hpz);
  CAPTURE(sub_group);
  CAPTURE(nv.optimizer_buffers);
  CAPTURE(nv.pipeline);
  CAPTURE(nv.param_buffers);
  CAPTURE(nv.max_in_cpu);
  RunConfig cfg;
  cfg.world = world;
  cfg.gas = gas;
  cfg.steps = 2;
  if (hpz > 1) cfg.stage3.reshard_after_forward = ReshardAfterForward::group(hpz);
  std::vector<std::array<std::array<std::size_t, kMemoryCategoryCount>, kMemorySpaceCount>> got(static_cast<std::size_t>(world));
  fs::path swap_dir;  // only the NVMe homes need one (the NVMe case removes it)
  if constexpr (std::is_same_v<Off, Offload<Nvme>> || std::is_same_v<ParamOff, OffloadParams<Nvme>>) swap_dir = nvme_dir();
  comm::run_threads(world, [&](auto& comm) {
    Mlp<typename Precision<Prec>::storage> model;
    EngineOptions o = engine_options(cfg);
    o.sub_group_size = sub_group;
    o.nvme.path = o.param_nvme.path = swap_dir;
    o.nvme.buffer_count = nv.optimizer_buffers;
    o.nvme.pipeline_read = o.nvme.pipeline_write = nv.pipeline;
    o.param_nvme.buffer_count = nv.param_buffers;
    o.param_nvme.max_in_cpu = nv.max_in_cpu;
    Engine<Partitioner<zerotk::Stage<S>>, Opt, Precision<Prec>, Off, ParamOff> engine(comm, model, o);
    {
      auto g = engine.gather(model, 0);
      model.init(42);
    }
    engine.initialize_master();
    train_steps(engine, model, comm.rank(), cfg, 0, cfg.steps, nullptr);
    auto& mine = got[static_cast<std::size_t>(comm.rank())];
    for (std::size_t s = 0; s < kMemorySpaceCount; ++s)
      for (std::size_t c = 0; c < kMemoryCategoryCount; ++c)
        mine[s][c] = engine.memory().live(static_cast<MemorySpace>(s), static_cast<MemoryCategory>(c));
  });
  plan::Choice c;
  c.stage = S;
  c.precision = dtype_of_precision<Prec>();
  c.optimizer = std::is_same_v<Off, Offload<Cpu>>    ? plan::OffloadTarget::cpu
                : std::is_same_v<Off, Offload<Nvme>> ? plan::OffloadTarget::nvme
                                                     : plan::OffloadTarget::none;
  c.param = std::is_same_v<ParamOff, OffloadParams<Cpu>>    ? plan::OffloadTarget::cpu
            : std::is_same_v<ParamOff, OffloadParams<Nvme>> ? plan::OffloadTarget::nvme
                                                            : plan::OffloadTarget::none;
  plan::EngineSettings s;
  s.reduce_bucket_size = cfg.bucket_bytes / (c.precision == DType::fp32 ? 4 : 2);  // the engine's elements
  s.gradient_accumulation_steps = gas;
  s.compute_space = MemorySpace::host;
  s.hpz_partition_size = hpz;
  s.sub_group_size = sub_group;
  s.optimizer_buffer_count = nv.optimizer_buffers;
  s.optimizer_pipeline_read = s.optimizer_pipeline_write = nv.pipeline;
  s.param_buffer_count = nv.param_buffers;
  s.param_max_in_cpu = nv.max_in_cpu;
  s.optimizer_moments = optim::moments_v<Opt>;
  const plan::MemoryPlan p = plan::model_state_plan(mlp_description(S), world, c, s);
  CHECK(p.approximate.empty());
  for (int r = 0; r < world; ++r) {
    for (std::size_t sp = 0; sp < kMemorySpaceCount; ++sp) {
      for (std::size_t ca = 0; ca < kMemoryCategoryCount; ++ca) {
        CAPTURE(r);
        CAPTURE(to_string(static_cast<MemorySpace>(sp)));
        CAPTURE(to_string(static_cast<MemoryCategory>(ca)));
        CHECK(got[static_cast<std::size_t>(r)][sp][ca] == p.bytes[sp][ca]);
      }
    }
  }
}

}  // namespace

TEST_CASE("plan: model states and buffers equal the engine's ledger, stages 0-3") {
  for (int world = 1; world <= 4; ++world) {
    for (int gas : {1, 2}) {
      check_ledger<0, fp32, Offload<None>>(world, gas);
      check_ledger<1, fp16, Offload<None>>(world, gas);
      check_ledger<2, bf16, Offload<None>>(world, gas);
      check_ledger<3, fp16, Offload<None>>(world, gas);
      check_ledger<2, fp32, Offload<None>>(world, gas);
      check_ledger<3, bf16, Offload<None>>(world, gas);
    }
  }
}

TEST_CASE("plan: Offload<Cpu> and hpZ equal the engine's ledger") {
  for (int world : {2, 4}) {
    check_ledger<1, fp16, Offload<Cpu>>(world, 1);
    check_ledger<2, bf16, Offload<Cpu>>(world, 2);
    check_ledger<3, fp16, Offload<Cpu>>(world, 2);
    check_ledger<2, fp16, Offload<Cpu>>(world, 1, 1, 16);  // staging bounded by the sub-group
    check_ledger<3, fp16, Offload<None>>(world, 1, 2);     // hpZ g = 2
  }
}

TEST_CASE("plan: Offload<Nvme> and OffloadParams<Nvme> equal the engine's ledger (disk, pinned buffers, max_in_cpu)") {
  for (int world : {1, 2, 3}) {
    check_ledger<1, fp16, Offload<Nvme>>(world, 1);
    check_ledger<2, bf16, Offload<Nvme>>(world, 2, 1, 64);                // several sub-groups: 4 buffers
    check_ledger<2, fp16, Offload<Nvme>>(world, 1, 1, 64, {1, true});     // pipelining raises the buffers
    check_ledger<3, fp16, Offload<Nvme>>(world, 1, 1, 1'000'000'000, {9});  // capped at the sub-groups
    check_ledger<3, fp16, Offload<Nvme>, OffloadParams<Cpu>>(world, 1);
    check_ledger<3, fp16, Offload<Cpu>, OffloadParams<Nvme>>(world, 1, 1, 100, {4, false, 3, 0});  // stagings, no more
    check_ledger<3, bf16, Offload<Cpu>, OffloadParams<Nvme>>(world, 2);
    check_ledger<3, fp16, Offload<None>, OffloadParams<Nvme>>(world, 1, 1, 100, {4, false, 3, 0});  // stagings
    check_ledger<3, fp32, Offload<None>, OffloadParams<Nvme>>(world, 2);
    for (std::size_t max_in_cpu : {std::size_t{0}, std::size_t{150}, std::size_t{1'000'000'000}}) {
      check_ledger<3, fp16, Offload<Nvme>, OffloadParams<Nvme>>(world, 1, 1, 100, {4, false, 3, max_in_cpu});
      check_ledger<3, fp32, Offload<Nvme>, OffloadParams<Nvme>>(world, 2, 1, 1'000'000'000, {4, false, 5, max_in_cpu});
    }
  }
  fs::remove_all(nvme_dir());
}

TEST_CASE("plan: OffloadParams<Nvme> with a buffer_size below the largest block is refused as the engine refuses it") {
  // The engine's error and the plan's refusal come from one function (offload/nvme_layout.hpp); here
  // they are compared on a real engine, with a buffer_size that is too small and the default.
  RunConfig cfg;
  cfg.world = 2;
  for (std::size_t buffer_size : {std::size_t{1}, std::size_t{100'000'000}}) {
    CAPTURE(buffer_size);
    std::vector<std::string> engine_error(2);
    comm::run_threads(2, [&](auto& comm) {
      Mlp<typename Precision<fp16>::storage> model;
      EngineOptions o = engine_options(cfg);
      o.nvme.path = o.param_nvme.path = nvme_dir();
      o.param_nvme.buffer_size = buffer_size;
      try {
        Engine<Partitioner<zerotk::Stage<3>>, Optimizer<AdamW>, Precision<fp16>, Offload<Nvme>, OffloadParams<Nvme>> e(comm, model, o);
      } catch (const config_error& err) {
        engine_error[static_cast<std::size_t>(comm.rank())] = err.what();
      }
    });
    plan::Choice c;
    c.stage = 3;
    c.precision = DType::fp16;
    c.optimizer = c.param = plan::OffloadTarget::nvme;
    plan::EngineSettings s;
    s.reduce_bucket_size = cfg.bucket_bytes / 2;  // fp16 elements, as the engine takes the fixture's bytes
    s.compute_space = MemorySpace::host;
    s.param_buffer_size = buffer_size;
    plan::Budget all;
    all.device_bytes = all.host_bytes = static_cast<std::size_t>(-1);
    const plan::Evaluation e = plan::evaluate(mlp_description(3), 2, c, s, all);
    CHECK(e.memory.refused == engine_error[0]);
    CHECK(engine_error[0] == engine_error[1]);
    if (buffer_size == 1) {
      CHECK(e.memory.refused.find("zero_optimization.offload_param.buffer_size") != std::string::npos);
      CHECK_FALSE(e.fits);  // however much memory there is
    } else {
      CHECK(e.memory.refused.empty());
      CHECK(e.fits);
    }
  }
  fs::remove_all(nvme_dir());
}

TEST_CASE("plan: a one-moment optimizer (Lion) equals the engine's ledger, in memory, pinned and on disk") {
  check_ledger<2, bf16, Offload<None>, OffloadParams<None>, Optimizer<Lion>>(2, 2);
  check_ledger<3, fp16, Offload<Cpu>, OffloadParams<None>, Optimizer<Lion>>(2, 1);
  check_ledger<2, fp16, Offload<Nvme>, OffloadParams<None>, Optimizer<Lion>>(3, 1, 1, 64);  // several sub-groups
  fs::remove_all(nvme_dir());
}

TEST_CASE("plan: the ZeRO paper's table (Psi = 7.5e9, N = 64, fp16 Adam)") {
  const double psi = 7.5e9, N = 64;
  const plan::ModelDescription m = plan::from_total(static_cast<std::size_t>(psi));
  const double expected[] = {16 * psi, 4 * psi + 12 * psi / N, 2 * psi + 14 * psi / N, 16 * psi / N};
  const char* gb[] = {"120.0", "31.4", "16.6", "1.9"};
  for (int stage = 0; stage <= 3; ++stage) {
    plan::Choice c;
    c.stage = stage;
    c.precision = DType::fp16;
    const plan::MemoryPlan p = plan::model_state_plan(m, 64, c, plan::EngineSettings{});
    CHECK(static_cast<double>(p.model_states()) == expected[stage]);  // 7.5e9 is a multiple of 2N: no padding
    char buf[16];
    std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(p.model_states()) / 1e9);
    CHECK(std::string(buf) == gb[stage]);
  }
}

TEST_CASE("plan: fp32 keeps params 4 + grads 4 + master 4 + m, v 8 bytes per element") {
  const plan::ModelDescription m = plan::from_total(1'000'000);  // a multiple of 2W for W = 4
  plan::Choice c;
  c.precision = DType::fp32;
  CHECK(plan::model_state_plan(m, 4, c, {}).model_states() == 20u * 1'000'000);
  c.stage = 3;
  CHECK(plan::model_state_plan(m, 4, c, {}).model_states() == 20u * 1'000'000 / 4);
}

TEST_CASE("plan: DeepSpeed's estimators equal their closed forms") {
  const double P = 1e9, L = 1e8, f = 1.5;
  // one node of 8 GPUs
  auto z2 = plan::deepspeed_zero2_table(P, 8, 1, f);
  CHECK(z2[0].gpu_bytes == 2 * P);
  CHECK(z2[0].cpu_bytes == P * 32 * f);  // max(4 x 8, 16) = 32
  CHECK(z2[1].gpu_bytes == 4 * P + 2 * P);
  CHECK(z2[1].cpu_bytes == P * 4 * 8 * f);
  // 4 nodes of 2 GPUs: max(4 G, 16) with G = 8 total
  CHECK(plan::deepspeed_zero2_estimate(P, 2, 4, true, f).cpu_bytes == P * 32 * f);
  CHECK(plan::deepspeed_zero2_estimate(P, 1, 1, true, f).cpu_bytes == P * 16 * f);
  auto z3 = plan::deepspeed_zero3_table(P, L, 8, 1, f);
  REQUIRE(z3.size() == 6);
  CHECK(z3[0].gpu_bytes == 4 * L);
  CHECK(z3[0].cpu_bytes == P * 18 * f);
  CHECK(z3[1].cpu_bytes == P * 32 * f);  // max(4 x 8, 18)
  CHECK(z3[2].gpu_bytes == 4 * L + 2 * P / 8);
  CHECK(z3[2].cpu_bytes == P * 16 * f);
  CHECK(z3[4].gpu_bytes == 4 * L + 18 * P / 8);
  CHECK(z3[4].cpu_bytes == L * 4 * 8 * f);
  CHECK(z3[5].cpu_bytes == P * 4 * 8 * f);
  // two nodes: the cpu figures are per node's share
  CHECK(plan::deepspeed_zero3_estimate(P, L, 1, 2, true, true, true, f).cpu_bytes == P * 18 * 0.5 * f);
  // int() truncation
  CHECK(plan::deepspeed_zero2_estimate(1000, 3, 1, false, 1.0).gpu_bytes == 4000 + 5333);
}

TEST_CASE("plan: the GPT shape has examples/02_gpt's parameter count") {
  plan::TransformerShape s;
  s.layers = 3;
  s.hidden = 64;
  s.heads = 4;
  s.sequence = 32;
  s.vocab = 100;
  const std::size_t d = 64;
  CHECK(plan::block_params(s) == 12 * d * d + 13 * d);
  CHECK(plan::gpt_model(s).total_params() == 100 * d + 32 * d + 3 * (12 * d * d + 13 * d) + 2 * d + 100 * d);
  s.tied_head = true;
  CHECK(plan::gpt_model(s).total_params() == 100 * d + 32 * d + 3 * (12 * d * d + 13 * d) + 2 * d);
  s.d_ff = 100;
  CHECK(plan::block_params(s) == 4 * d * d + 9 * d + 2 * 100 * d + 100);
}

TEST_CASE("plan: the activation peak model") {
  plan::ModelDescription m;
  for (int i = 0; i < 4; ++i) {
    plan::LayerDesc l;
    l.checkpointable = i > 0;
    l.activations.forward_bytes = 100 + static_cast<std::size_t>(i);
    l.activations.backward_scratch_bytes = 10;
    l.activations.input_bytes = 3;
    l.activations.output_bytes = 5;
    m.layers.push_back(l);
  }
  const auto none = plan::activation_peak(m, plan::checkpointed_layers(m, plan::CheckpointChoice::none()));
  CHECK(none.peak() == 100 + 101 + 102 + 103 + 4 * 10);
  const auto flags = plan::checkpointed_layers(m, plan::CheckpointChoice::all());
  CHECK(flags == std::vector<char>{0, 1, 1, 1});
  const auto all = plan::activation_peak(m, flags);
  // layer 0 plain (110); layers 1-3 checkpointed in a chain: at the end of the forward layer 1 keeps
  // its input (3), layer 2 layer 1's output (taken over, 5), layer 3 layer 2's output (5) and its own (5)
  CHECK(all.kept == 110 + 3 + 5 + 5 + 5);
  // the peak is layer 3's backward: layer 0's 110, the saved inputs of 1, 2, 3 (3 + 5 + 5; its output
  // dropped first), its recompute and scratch (103 + 10) and its input-gradient copy (3)
  CHECK(all.peak() == 110 + 3 + 5 + 5 + 103 + 10 + 3);
  CHECK(plan::checkpointed_layers(m, plan::CheckpointChoice::every(2)) == std::vector<char>{0, 1, 0, 1});
  CHECK_THROWS_AS(plan::CheckpointChoice::every(0), config_error);
}

TEST_CASE("plan: sizes with suffixes") {
  CHECK(plan::parse_count("--params", "7.5e9") == 7'500'000'000u);
  CHECK(plan::parse_count("--params", "1.5B") == 1'500'000'000u);
  CHECK(plan::parse_count("--params", "350M") == 350'000'000u);
  CHECK(plan::parse_bytes("--device-mem", "80GB") == 80'000'000'000u);
  CHECK(plan::parse_bytes("--device-mem", "80GiB") == 80ull << 30);
  CHECK(plan::parse_bytes("--device-mem", "512MiB") == 512ull << 20);
  CHECK(plan::parse_bytes("--device-mem", "1e9") == 1'000'000'000u);
  for (const char* bad : {"", "-1", "abc", "1.5", "nan", "inf", "0x10", "7.5x", "1e30"}) {
    CAPTURE(bad);
    try {
      (void)plan::parse_count("--params", bad);
      FAIL("no error");
    } catch (const config_error& e) {
      CHECK(std::string(e.what()).find("--params") != std::string::npos);
    }
  }
  CHECK_THROWS_AS((void)plan::parse_bytes("--host-mem", "80XB"), config_error);
}

TEST_CASE("plan: bad input names the key and the value") {
  const plan::ModelDescription m = plan::from_total(1000);
  plan::Choice c;
  c.stage = 0;
  c.optimizer = plan::OffloadTarget::cpu;
  CHECK_THROWS_AS((void)plan::model_state_plan(m, 2, c, {}), config_error);
  c.stage = 3;
  plan::EngineSettings s;
  s.hpz_partition_size = 3;
  try {
    (void)plan::model_state_plan(m, 4, c, s);
    FAIL("no error");
  } catch (const config_error& e) {
    CHECK(std::string(e.what()).find("zero_hpz_partition_size") != std::string::npos);
    CHECK(std::string(e.what()).find("3") != std::string::npos);
  }
  plan::TransformerShape t;
  t.layers = 2;
  t.hidden = 10;
  t.heads = 3;
  t.sequence = 4;
  t.vocab = 5;
  CHECK_THROWS_WITH_AS(plan::gpt_model(t), doctest::Contains("--hidden"), config_error);
}

TEST_CASE("plan: the cheapest fit is the first configuration in cost order that fits") {
  plan::TransformerShape t;
  t.layers = 4;
  t.hidden = 64;
  t.heads = 4;
  t.sequence = 64;
  t.vocab = 128;
  t.micro_batch = 4;
  const plan::ModelDescription m = plan::gpt_model(t);
  plan::Grid g;
  g.precisions = {DType::bf16};
  // A budget between stage 0 without checkpointing and stage 3 with everything checkpointed.
  plan::Choice small;
  small.stage = 3;
  small.precision = DType::bf16;
  small.checkpointing = plan::CheckpointChoice::all();
  plan::Choice big;
  big.precision = DType::bf16;
  plan::Budget huge;
  huge.device_bytes = huge.host_bytes = static_cast<std::size_t>(-1);
  const auto lo = plan::evaluate(m, 4, small, {}, huge), hi = plan::evaluate(m, 4, big, {}, huge);
  REQUIRE(lo.device() < hi.device());
  plan::Budget b;
  b.device_bytes = (lo.device() + hi.device()) / 2;
  b.host_bytes = 1ull << 40;
  const auto all = plan::plan_all(m, 4, {}, b, g);
  const auto best = plan::cheapest_fit(all);
  REQUIRE(best);
  CHECK(best->device() <= b.device_bytes);
  for (const auto& e : all) {
    if (!plan::cheaper(e.choice, best->choice)) break;
    CHECK_FALSE(e.fits);
  }
  // With everything allowed, stage 0 without offload or checkpointing comes first.
  CHECK(plan::cheapest_fit(plan::plan_all(m, 4, {}, huge, g))->choice == big);
}

TEST_CASE("plan: the grid offers NVMe parameter offload with every optimizer offload") {
  plan::Grid g;
  g.precisions = {DType::bf16};
  g.checkpointing = {plan::CheckpointChoice::none()};
  std::vector<plan::OffloadTarget> with_nvme_params;
  for (const plan::Choice& c : g.choices(plan::from_total(1'000'000))) {
    if (c.param == plan::OffloadTarget::nvme) with_nvme_params.push_back(c.optimizer);
  }
  std::sort(with_nvme_params.begin(), with_nvme_params.end());
  CHECK(with_nvme_params == std::vector{plan::OffloadTarget::none, plan::OffloadTarget::cpu, plan::OffloadTarget::nvme});
}

// Issue 49, item 5: the planner is linear in the layers and refuses what its arithmetic cannot hold.
namespace {

/// The activation peak as it was computed before issue 49: what is held re-summed over every layer
/// at each point of the replay (quadratic). The reference for the running sum.
plan::ActivationPeak activation_peak_resummed(const plan::ModelDescription& m, const std::vector<char>& checkpointed) {
  const std::size_t n = m.layers.size();
  auto ck = [&](std::size_t i) { return i < checkpointed.size() && checkpointed[i] != 0; };
  std::vector<std::size_t> saved(n, 0), output(n, 0), grad(n, 0);
  std::size_t plain = 0, peak = 0, kept = 0;
  auto held = [&] {
    std::size_t h = plain;
    for (std::size_t i = 0; i < n; ++i) h += saved[i] + output[i] + grad[i];
    return h;
  };
  auto at = [&](std::size_t extra) { peak = std::max(peak, held() + extra); };
  for (int step = 0; step < 2; ++step) {
    plain = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (!ck(i) && step > 0) plain += m.layers[i].activations.total();
    }
    for (std::size_t i = 0; i < n; ++i) {
      const plan::LayerActivations& a = m.layers[i].activations;
      if (!ck(i)) {
        if (step == 0) plain += a.forward_bytes;
        at(0);
        continue;
      }
      grad[i] = 0;
      const bool chained = i > 0 && ck(i - 1) && output[i - 1] != 0;
      saved[i] = chained ? std::exchange(output[i - 1], 0) : a.input_bytes;
      at(a.forward_bytes + a.output_bytes);
      output[i] = a.output_bytes;
    }
    if (step == 1) kept = held();
    for (std::size_t i = n; i-- > 0;) {
      const plan::LayerActivations& a = m.layers[i].activations;
      if (!ck(i)) {
        if (step == 0) plain += a.backward_scratch_bytes;
        at(0);
        continue;
      }
      output[i] = 0;
      at(a.total() + a.input_bytes);
      saved[i] = 0;
      if (i + 1 < n && ck(i + 1)) grad[i + 1] = 0;
      grad[i] = a.input_bytes;
      at(0);
    }
  }
  plan::ActivationPeak p;
  p.kept = kept;
  p.transient = peak - std::min(peak, kept);
  return p;
}

}  // namespace

TEST_CASE("plan: the activation peak's running sum equals re-summing every layer, on random models") {
  std::mt19937_64 rng(49);
  for (int trial = 0; trial < 300; ++trial) {
    plan::ModelDescription m;
    const std::size_t n = rng() % 24;  // 0 and 1 layer included
    for (std::size_t i = 0; i < n; ++i) {
      plan::LayerDesc l;
      l.checkpointable = rng() % 4 != 0;
      l.activations.forward_bytes = rng() % 1000;
      l.activations.backward_scratch_bytes = rng() % 300;
      l.activations.input_bytes = rng() % 3 == 0 ? 0 : rng() % 200;  // 0: a layer that breaks a chain
      l.activations.output_bytes = rng() % 3 == 0 ? 0 : rng() % 200;
      m.layers.push_back(l);
    }
    for (const auto& c : {plan::CheckpointChoice::none(), plan::CheckpointChoice::all(), plan::CheckpointChoice::every(2),
                          plan::CheckpointChoice::every(3)}) {
      CAPTURE(trial);
      CAPTURE(c.name());
      const auto flags = plan::checkpointed_layers(m, c);
      const auto got = plan::activation_peak(m, flags), want = activation_peak_resummed(m, flags);
      CHECK(got.kept == want.kept);
      CHECK(got.transient == want.transient);
    }
  }
}

TEST_CASE("plan: plan_all, which shares layouts and peaks, equals evaluate configuration by configuration") {
  plan::TransformerShape t;
  t.layers = 5;
  t.hidden = 64;
  t.heads = 4;
  t.sequence = 32;
  t.vocab = 300;
  t.micro_batch = 2;
  plan::EngineSettings tight;  // several buckets, persistent and gathered ones, hpZ, emulated copies
  tight.reduce_bucket_size = 20'000;
  tight.param_persistence_threshold = 100;
  tight.hpz_partition_size = 2;
  tight.emulated = true;
  tight.gradient_accumulation_steps = 2;
  tight.param_max_in_cpu = 30'000;
  tight.param_buffer_size = 5'000;  // below some blocks: refused configurations too
  plan::EngineSettings prefetch = tight;
  prefetch.max_reuse_distance = 0;
  prefetch.prefetch_bucket_size = 15'000;
  const plan::ModelDescription models[] = {plan::gpt_model(t), plan::from_layer_counts(std::vector<std::size_t>{7, 50'000, 0, 3, 12'345})};
  plan::Budget b;
  b.device_bytes = 4'000'000;
  b.host_bytes = 8'000'000;
  for (const auto& m : models) {
    for (const plan::EngineSettings& s : {plan::EngineSettings{}, tight, prefetch}) {
      for (int world : {1, 2, 4}) {
        if (world % s.hpz_partition_size != 0) continue;
        const auto all = plan::plan_all(m, world, s, b);
        REQUIRE(all.size() > 20);
        for (const plan::Evaluation& e : all) {
          CAPTURE(world);
          CAPTURE(e.choice.name());
          const plan::Evaluation want = plan::evaluate(m, world, e.choice, s, b);
          CHECK(e.memory.bytes == want.memory.bytes);
          CHECK(e.memory.psi == want.memory.psi);
          CHECK(e.memory.psi_padded == want.memory.psi_padded);
          CHECK(e.memory.partition == want.memory.partition);
          CHECK(e.memory.buckets == want.memory.buckets);
          CHECK(e.memory.approximate == want.memory.approximate);
          CHECK(e.memory.refused == want.memory.refused);
          CHECK(e.activations.kept == want.activations.kept);
          CHECK(e.activations.transient == want.activations.transient);
          CHECK(e.fits == want.fits);
        }
      }
    }
  }
  // Facts are one layout's: a choice of another layout is refused, not planned from the wrong one.
  plan::Choice c3;
  c3.stage = 3;
  plan::Choice c2 = c3;
  c2.stage = 2;
  const plan::LayoutFacts f = plan::layout_facts(models[0], 2, c3, tight);
  CHECK_THROWS_AS((void)plan::model_state_plan(f, c2, tight), usage_error);
  c3.precision = DType::fp32;
  CHECK_THROWS_AS((void)plan::model_state_plan(f, c3, tight), usage_error);
}

TEST_CASE("plan: a transformer's size estimate equals gpt_model's figures, and a shape past 2^53 is refused") {
  plan::TransformerShape t;
  t.layers = 3;
  t.hidden = 48;
  t.heads = 6;
  t.sequence = 20;
  t.vocab = 77;
  t.micro_batch = 3;
  for (bool tied : {false, true}) {
    for (std::size_t d_ff : {std::size_t{0}, std::size_t{100}}) {
      t.tied_head = tied;
      t.d_ff = d_ff;
      t.context = d_ff ? 25 : 0;
      const plan::ModelDescription m = plan::gpt_model(t);
      std::size_t activation_bytes = 0;
      for (const auto& l : m.layers) {
        activation_bytes += l.activations.total() + l.activations.input_bytes + l.activations.output_bytes;
      }
      const auto e = t.size_estimate();
      CHECK(e.params == static_cast<long double>(m.total_params()));
      CHECK(e.activation_bytes == static_cast<long double>(activation_bytes));
    }
  }
  // 10^6 blocks of hidden 2^20: 1.3e19 parameters, which wrapped size_t.
  t.layers = 1'000'000;
  t.hidden = 1 << 20;
  t.heads = 16;
  CHECK_THROWS_WITH_AS(plan::gpt_model(t), doctest::Contains("--layers"), config_error);
  CHECK_THROWS_WITH_AS(plan::gpt_model(t), doctest::Contains("2^53 parameters"), config_error);
  t.layers = 2;
  t.hidden = 1024;
  t.context = 0;
  t.sequence = 1 << 24;
  t.micro_batch = 1 << 20;
  CHECK_THROWS_WITH_AS(plan::gpt_model(t), doctest::Contains("2^53 activation bytes"), config_error);
}

TEST_CASE("plan: figures that would wrap size_t are refused, never printed wrapped") {
  plan::Choice c;
  c.stage = 1;
  // 2^54 parameters, and a sum of two tensors that wraps 2^64.
  CHECK_THROWS_WITH_AS((void)plan::model_state_plan(plan::from_total(std::size_t{1} << 54), 8, c, {}),
                       doctest::Contains("2^53 parameters"), config_error);
  const std::size_t wraps[] = {std::size_t{1} << 63, std::size_t{1} << 63, 5};
  CHECK_THROWS_AS((void)plan::model_state_plan(plan::from_layer_counts(wraps), 8, c, {}), config_error);
  // Within the limit the settings can still ask for more than 2^60 bytes: a billion optimizer moments.
  plan::EngineSettings s;
  s.optimizer_moments = 1'000'000'000'000;
  CHECK_THROWS_WITH_AS((void)plan::model_state_plan(plan::from_total(1'000'000'000), 8, c, s),
                       doctest::Contains("optimizer moments"), config_error);
  // DeepSpeed's estimators with an absurd buffer factor: +inf, never a negative size (a cast to
  // int64 made it -9.2e18).
  const auto e2 = plan::deepspeed_zero2_estimate(1e9, 8, 1, true, 1e308);
  CHECK(e2.cpu_bytes > 0);
  for (const auto& e3 : plan::deepspeed_zero3_table(1e9, 1e9, 8, 1, 1e308)) CHECK(e3.cpu_bytes > 0);
  CHECK(plan::deepspeed_zero2_estimate(1.3e9, 8, 1, false).gpu_bytes == 4 * 1.3e9 + 2.6e9);
}
