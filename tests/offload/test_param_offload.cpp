// OffloadParams<Cpu> (offload/pinned_shard.hpp): stage 3's parameter shards in page-locked host
// memory, staged into each bucket's gather buffer before its all-gather. Threads communicator on
// Device<Host>:
//  - bitwise-identical parameters, losses, scales, skips and norms to OffloadParams<None>, W = 1..4,
//    fp32, fp16 (with overflow steps), bf16, with and without Offload<Cpu> for the optimizer, GAS 2
//    with clipping; persistent buckets on and off, hpZ (g = 2), emulated 16-bit;
//  - the ledger by space: the compute space holds no params16 shard; pinned host holds 2 Psi / N
//    (16-bit) or 4 Psi / N (fp32); with both offloads the compute space holds only the gathered
//    buffers and the gradient partition (no master, optimizer state or parameter shard);
//  - state() / load_state() across OffloadParams<Cpu> and OffloadParams<None>.
#include <doctest/doctest.h>

#include <cstdio>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "blob_model.hpp"
#include "engine_fixture.hpp"
#include "offload_runs.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/engine.hpp"

namespace test_param_offload {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using namespace zt_test;

namespace {

template <class Prec, class Off, class ParamOff>
using E3 = OffloadEngine<3, Prec, Off, ParamOff>;

/// W ranks of `cfg` at stage 3 (offload_runs.hpp); with OffloadParams<Cpu> every rank's ledger must
/// show the shards in pinned host memory and none in the compute space.
template <class Prec, class Off, class ParamOff, class Model = Mlp<typename Precision<Prec>::storage>>
RunResult train3(const RunConfig& cfg, std::size_t sub_group_size = 1'000'000'000) {
  EngineOptions o = engine_options(cfg);
  o.sub_group_size = sub_group_size;
  return train_with<3, Prec, Off, ParamOff, Model>(cfg, o, [](const MemoryLedger& m) {
    if constexpr (std::is_same_v<ParamOff, OffloadParams<Cpu>>) {
      return m.live(MemorySpace::host, MemoryCategory::params16) == 0 &&
             m.live(MemorySpace::pinned_host, MemoryCategory::params16) != 0;
    }
    return true;
  });
}

template <class Prec>
void sweep(bool fp16) {
  for (int world : {1, 2, 3, 4}) {
    for (int variant = 0; variant < 3; ++variant) {
      RunConfig cfg;
      cfg.world = world;
      cfg.steps = 10;
      if (variant >= 1) {
        cfg.gas = 2;
        cfg.clip = 0.5;
      }
      // variant 2: the defaults (the biases persistent, prefetch and reuse); else every parameter fetched
      if (variant < 2) cfg.stage3.param_persistence_threshold = 0;
      if (fp16) cfg.poison_steps = {3, 7};
      CAPTURE(world);
      CAPTURE(variant);
      const RunResult ref = train3<Prec, Offload<None>, OffloadParams<None>>(cfg);
      REQUIRE(ref.ranks_agree);
      CHECK(ref.params != ref.initial);  // it trained
      check_same_run(train3<Prec, Offload<None>, OffloadParams<Cpu>>(cfg), ref);
      // Both offloads: the optimizer writes the updated values from its pinned staging into the
      // pinned shard.
      check_same_run(train3<Prec, Offload<Cpu>, OffloadParams<Cpu>>(cfg, 7), ref);
      check_same_run(train3<Prec, Offload<Cpu>, OffloadParams<Cpu>>(cfg), ref);
    }
  }
}

}  // namespace

TEST_CASE("OffloadParams<Cpu> equals OffloadParams<None> bitwise at stage 3: fp32, W = 1..4, with and without Offload<Cpu>") {
  sweep<fp32>(false);
}
TEST_CASE("OffloadParams<Cpu> equals OffloadParams<None> bitwise at stage 3: fp16 with overflow steps") { sweep<fp16>(true); }
TEST_CASE("OffloadParams<Cpu> equals OffloadParams<None> bitwise at stage 3: bf16") { sweep<bf16>(false); }

TEST_CASE("OffloadParams<Cpu> with hpZ (g = 2, W = 4) and with emulated bf16 keeps the bits") {
  RunConfig cfg;
  cfg.world = 4;
  cfg.steps = 8;
  cfg.gas = 2;
  cfg.clip = 0.05;
  cfg.stage3.param_persistence_threshold = 0;
  cfg.stage3.prefetch_bucket_size = 0;
  cfg.stage3.max_reuse_distance = 0;  // every backward gathers again: from the secondary shard
  cfg.stage3.reshard_after_forward = ReshardAfterForward::group(2);
  {
    const RunResult ref = train3<fp16, Offload<None>, OffloadParams<None>>(cfg);
    REQUIRE(ref.ranks_agree);
    check_same_run(train3<fp16, Offload<None>, OffloadParams<Cpu>>(cfg), ref);
    check_same_run(train3<fp16, Offload<Cpu>, OffloadParams<Cpu>>(cfg, 11), ref);
  }
  cfg.stage3.reshard_after_forward = true;
  {  // float Params over bf16 storage: the shard is bf16, in pinned memory; float copies of gathered buckets
    const RunResult ref = train3<bf16, Offload<None>, OffloadParams<None>, Mlp<float>>(cfg);
    REQUIRE(ref.ranks_agree);
    check_same_run(train3<bf16, Offload<None>, OffloadParams<Cpu>, Mlp<float>>(cfg), ref);
    check_same_run(train3<bf16, Offload<Cpu>, OffloadParams<Cpu>, Mlp<float>>(cfg), ref);
  }
}

namespace {

/// One step of Blob at stage 3 with every parameter fetched; rank 0 checks the ledger by space.
template <class Prec, class Off, class ParamOff>
void ledger_by_space(int world, std::size_t persistence_threshold) {
  using S = typename Precision<Prec>::storage;
  using Eng = Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, Precision<Prec>, Off, ParamOff, Bucketer<Bytes<(1 << 20)>>>;
  comm::run_threads(world, [&](auto& comm) {
    BasicBlob<S> model(kBlob);
    EngineOptions o;
    o.stage3.param_persistence_threshold = persistence_threshold;
    Eng engine(comm, model, o);
    engine.initialize_master();
    for (auto it = model.ps.rbegin(); it != model.ps.rend(); ++it) {
      BasicOneParam<S> one{&*it};
      auto s = engine.backward(one);
    }
    (void)engine.step(0.0);
    if (comm.rank() != 0) return;
    const double pad = static_cast<double>(engine.flat_numel()), N = world, part = pad / N;
    const MemoryLedger& m = engine.memory();
    auto at = [&](MemorySpace sp, MemoryCategory c) { return static_cast<double>(m.live(sp, c)); };
    constexpr bool params_off = std::is_same_v<ParamOff, OffloadParams<Cpu>>;
    constexpr bool opt_off = std::is_same_v<Off, Offload<Cpu>>;
    const double s = sizeof(S);  // bytes of a working-precision element
    // The shard: S Psi / N bytes, in pinned host memory with OffloadParams<Cpu>.
    CHECK(at(MemorySpace::host, MemoryCategory::params16) == (params_off ? 0 : s * part));
    const double pinned_params16 = at(MemorySpace::pinned_host, MemoryCategory::params16);
    const double staging = opt_off ? 4.0 * part : 0;  // Offload<Cpu>'s output staging (sub_group_size > partition)
    CHECK(pinned_params16 == (params_off ? s * part : 0) + staging);
    // What the compute space keeps of the model states: the gradient partition (4 B fp32 accumulation
    // or S B), master and optimizer state unless offloaded; the shard unless offloaded.
    const double grads = at(MemorySpace::host, MemoryCategory::grads);
    const double states = at(MemorySpace::host, MemoryCategory::master32) + at(MemorySpace::host, MemoryCategory::optimizer_state);
    CHECK(states == (opt_off ? 0 : 12 * part));
    const double gathered = at(MemorySpace::host, MemoryCategory::gathered);
    CHECK(gathered > 0);
    std::printf("stage 3 %s W=%d offload_param %s offload_optimizer %s: compute space params16 %.0f B, grads %.0f B, "
                "master+optimizer %.0f B, gathered %.0f B; pinned host params16 %.0f B (shard %.0f = %.0f Psi/N), "
                "master+optimizer %.0f B, total %zu B\n",
                std::string(to_string(dtype_of_v<S>)).c_str(), world, params_off ? "cpu " : "none", opt_off ? "cpu " : "none",
                at(MemorySpace::host, MemoryCategory::params16), grads, states, gathered, pinned_params16,
                params_off ? s * part : 0.0, s, at(MemorySpace::pinned_host, MemoryCategory::master32) +
                    at(MemorySpace::pinned_host, MemoryCategory::optimizer_state),
                m.live_total(MemorySpace::pinned_host));
    if constexpr (params_off && opt_off) {
      // The proof: no model state in the compute space beyond the gathered buffers and the
      // gradient partition the reduce-scatter fills (which the optimizer stages out of).
      CHECK(at(MemorySpace::host, MemoryCategory::params16) + states == 0);
      CHECK(at(MemorySpace::pinned_host, MemoryCategory::master32) == 4 * part);
      CHECK(at(MemorySpace::pinned_host, MemoryCategory::optimizer_state) == 8 * part);
    }
  });
}
}  // namespace

TEST_CASE("ledger by space: OffloadParams<Cpu> moves the parameter shards to pinned host memory") {
  for (int world : {1, 2, 4}) {
    CAPTURE(world);
    for (std::size_t persist : {std::size_t{0}, std::size_t{100'000}}) {
      CAPTURE(persist);
      ledger_by_space<fp16, Offload<None>, OffloadParams<None>>(world, persist);
      ledger_by_space<fp16, Offload<None>, OffloadParams<Cpu>>(world, persist);
      ledger_by_space<fp16, Offload<Cpu>, OffloadParams<Cpu>>(world, persist);
      ledger_by_space<bf16, Offload<Cpu>, OffloadParams<Cpu>>(world, persist);
      ledger_by_space<fp32, Offload<None>, OffloadParams<Cpu>>(world, persist);
      ledger_by_space<fp32, Offload<Cpu>, OffloadParams<Cpu>>(world, persist);
    }
  }
}

TEST_CASE("OffloadParams<Cpu>: the compute space's peak loses exactly the shard (no staging buffers of its own)") {
  // [0]: peak bytes of the compute space over two steps, [1]: the padded Psi / N
  auto peak_of = [](auto tag) {
    using ParamOff = typename decltype(tag)::type;
    std::size_t out[2] = {0, 0};
    comm::run_threads(2, [&](auto& comm) {
      Blob model(kBlob);
      EngineOptions o;
      o.stage3.param_persistence_threshold = 0;
      Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, Precision<fp16>, ParamOff, Bucketer<Bytes<(1 << 20)>>> engine(comm, model, o);
      engine.initialize_master();
      for (int step = 0; step < 2; ++step) {
        for (auto it = model.ps.rbegin(); it != model.ps.rend(); ++it) {
          OneParam one{&*it};
          auto s = engine.backward(one);
        }
        (void)engine.step(0.0);
      }
      if (comm.rank() == 0) {
        out[0] = engine.memory().peak_total(MemorySpace::host);
        out[1] = engine.flat_numel() / 2;
      }
    });
    return std::vector<std::size_t>{out[0], out[1]};
  };
  const auto with = peak_of(std::type_identity<OffloadParams<Cpu>>{});
  const auto without = peak_of(std::type_identity<OffloadParams<None>>{});
  CHECK(without[0] - with[0] == 2 * without[1]);  // 2 bytes x Psi / N: the fp16 shard
}

TEST_CASE("state() / load_state() across OffloadParams<Cpu> and OffloadParams<None>") {
  for (int world : {1, 2, 3}) {
    CAPTURE(world);
    RunConfig cfg;
    cfg.world = world;
    cfg.gas = 2;
    cfg.clip = 0.5;
    cfg.poison_steps = {2};
    cfg.stage3.param_persistence_threshold = 0;
    const EngineOptions o = engine_options(cfg);
    check_resume_across<E3<fp16, Offload<None>, OffloadParams<Cpu>>, E3<fp16, Offload<None>, OffloadParams<Cpu>>>(cfg, o);
    check_resume_across<E3<fp16, Offload<Cpu>, OffloadParams<Cpu>>, E3<fp16, Offload<Cpu>, OffloadParams<None>>>(cfg, o);
    check_resume_across<E3<fp16, Offload<Cpu>, OffloadParams<None>>, E3<fp16, Offload<Cpu>, OffloadParams<Cpu>>>(cfg, o);
  }
}

}  // namespace test_param_offload
