// Offload<Cpu> (offload/host_pinned.hpp) with the threads communicator on Device<Host>:
//  - bitwise-identical parameters, losses, scales, skips and norms to Offload<None> at stages 1,
//    2 and 3, W = 1..3, fp32, fp16 (with an overflow step), bf16, GAS > 1 with clipping, sub-group
//    sizes of 1 element, odd sizes and larger than the partition;
//  - the ledger by space: the compute space holds no master or optimizer state; stage 2 fp16 holds
//    2 Psi + 2 Psi / N there (the formula), the rest is in pinned host memory;
//  - state() / load_state() round trip, also across Offload<Cpu> and Offload<None>;
//  - a refused page lock is an error naming the limit and the bytes asked.
#include <doctest/doctest.h>

#include <sys/mman.h>

#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "blob_model.hpp"
#include "engine_fixture.hpp"
#include "offload_runs.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/engine.hpp"

namespace test_host_pinned {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using namespace zt_test;

namespace {

template <int S>
using Part = Partitioner<zerotk::Stage<S>>;

template <int S, class Prec, class Off>
using E = OffloadEngine<S, Prec, Off>;

template <int S, class Prec, class Off>
RunResult train(const RunConfig& cfg, std::size_t sub_group_size) {
  EngineOptions o = engine_options(cfg);
  o.sub_group_size = sub_group_size;
  return train_with<S, Prec, Off>(cfg, o, [](const MemoryLedger& m) {
    // The store really is the pinned one: no master or optimizer state in the compute space.
    return !std::is_same_v<Off, Offload<Cpu>> || (m.live(MemorySpace::host, MemoryCategory::master32) == 0 &&
                                                  m.live(MemorySpace::host, MemoryCategory::optimizer_state) == 0 &&
                                                  m.live(MemorySpace::pinned_host, MemoryCategory::master32) != 0);
  });
}

template <int S, class Prec>
void check_same_as_resident(const RunConfig& cfg, bool expect_skip) {
  const RunResult ref = train<S, Prec, Offload<None>>(cfg, 1'000'000'000);
  check_reference(ref, expect_skip);
  // 1 element, odd sizes, about a partition, larger than any partition.
  for (std::size_t sub : {std::size_t{1}, std::size_t{7}, std::size_t{61}, std::size_t{250}, std::size_t{1'000'000}}) {
    CAPTURE(sub);
    check_same_run(train<S, Prec, Offload<Cpu>>(cfg, sub), ref);  // bitwise
  }
}

template <class Prec>
void sweep(bool fp16) {
  for (int world : {1, 2, 3}) {
    for (int variant = 0; variant < 2; ++variant) {
      RunConfig cfg;
      cfg.world = world;
      cfg.steps = 12;
      if (variant == 1) {
        cfg.gas = 2;
        cfg.clip = 0.5;
      }
      if (fp16) cfg.poison_steps = {3};
      cfg.stage3.param_persistence_threshold = 0;  // stage 3 fetches every parameter
      CAPTURE(world);
      CAPTURE(cfg.gas);
      CAPTURE(cfg.clip);
      check_same_as_resident<1, Prec>(cfg, fp16);
      check_same_as_resident<2, Prec>(cfg, fp16);
      check_same_as_resident<3, Prec>(cfg, fp16);
    }
  }
}

}  // namespace

TEST_CASE("Offload<Cpu> equals Offload<None> bitwise: fp32, stages 1, 2 and 3, W = 1..3, sub-group sizes") {
  sweep<fp32>(false);
}
TEST_CASE("Offload<Cpu> equals Offload<None> bitwise: fp16 with an overflow step") { sweep<fp16>(true); }
TEST_CASE("Offload<Cpu> equals Offload<None> bitwise: bf16") { sweep<bf16>(false); }

TEST_CASE("Offload<Cpu> equals Offload<None> bitwise: stage 1 reducing every micro-step, GAS 3") {
  RunConfig cfg;
  cfg.world = 3;
  cfg.steps = 8;
  cfg.gas = 3;
  cfg.clip = 1.0;
  cfg.reduce_every_micro_step = true;
  using P = Partitioner<zerotk::Stage<1>, when::every_micro_step>;
  // Reuses train<> through a Partitioner alias is not possible (it fixes the default When): inline.
  auto run = [&]<class Off>(std::type_identity<Off>, std::size_t sub) {
    std::vector<float> out;
    comm::run_threads(cfg.world, [&](auto& comm) {
      Mlp<half> model;
      EngineOptions o = engine_options(cfg);
      o.sub_group_size = sub;
      Engine<P, Optimizer<AdamW>, Precision<fp16>, Off> engine(comm, model, o);
      model.init(42);
      engine.initialize_master();
      train_steps(engine, model, comm.rank(), cfg, 0, cfg.steps, nullptr);
      engine.synchronize();
      if (comm.rank() == 0) out = model.values();
    });
    return out;
  };
  const std::vector<float> ref = run(std::type_identity<Offload<None>>{}, 0 + 1'000'000'000);
  CHECK(run(std::type_identity<Offload<Cpu>>{}, 5) == ref);
  CHECK(run(std::type_identity<Offload<Cpu>>{}, 1) == ref);
}

namespace {

template <int S, class Off>
void ledger_by_space(int world, std::size_t sub_group_size) {
  using Eng = Engine<Part<S>, Optimizer<AdamW>, Precision<fp16>, Off, Bucketer<Bytes<(1 << 20)>>>;
  comm::run_threads(world, [&](auto& comm) {
    Blob model(kBlob);
    EngineOptions o;
    o.sub_group_size = sub_group_size;
    Eng engine(comm, model, o);
    engine.initialize_master();
    for (auto it = model.ps.rbegin(); it != model.ps.rend(); ++it) {
      OneParam one{&*it};
      auto s = engine.backward(one);
    }
    (void)engine.step(0.0);
    if (comm.rank() != 0) return;
    const double pad = static_cast<double>(engine.flat_numel()), N = world, part = pad / N;
    const MemoryLedger& m = engine.memory();
    auto at = [&](MemorySpace sp, MemoryCategory c) { return static_cast<double>(m.live(sp, c)); };
    const double compute = at(MemorySpace::host, MemoryCategory::params16) + at(MemorySpace::host, MemoryCategory::grads) +
                           at(MemorySpace::host, MemoryCategory::master32) +
                           at(MemorySpace::host, MemoryCategory::optimizer_state);
    const double pinned_state =
        at(MemorySpace::pinned_host, MemoryCategory::master32) + at(MemorySpace::pinned_host, MemoryCategory::optimizer_state);
    const double staging =
        at(MemorySpace::pinned_host, MemoryCategory::grads) + at(MemorySpace::pinned_host, MemoryCategory::params16);
    const bool offloaded = std::is_same_v<Off, Offload<Cpu>>;
    // The ZeRO formula for fp16 Adam on padded Psi: K = 12 bytes of master + m + v per element.
    const double full = S == 1 ? 4 * pad + 12 * part : 2 * pad + 14 * part;
    const double expect_compute = offloaded ? full - 12 * part : full;  // stage 2: 2 Psi + 2 Psi / N
    const double expect_staging = offloaded ? 2.0 * 4.0 * std::min<double>(part, static_cast<double>(sub_group_size)) : 0;
    std::printf("offload %s stage %d W=%d sub_group %zu  padded Psi %.0f  compute space %.0f B (formula %.0f)  "
                "pinned host state %.0f B (12 Psi/N = %.0f) + staging %.0f B\n",
                offloaded ? "cpu " : "none", S, world, sub_group_size, pad, compute, expect_compute, pinned_state,
                12 * part, staging);
    CHECK(compute == expect_compute);
    CHECK(pinned_state == (offloaded ? 12 * part : 0));
    CHECK(staging == expect_staging);
    CHECK(m.live_total(MemorySpace::pinned_host) == static_cast<std::size_t>(pinned_state + staging));
  });
}
}  // namespace

TEST_CASE("ledger by space: Offload<Cpu> moves master and optimizer state to pinned host memory") {
  for (int world : {2, 4}) {
    CAPTURE(world);
    ledger_by_space<1, Offload<None>>(world, 1'000'000'000);
    ledger_by_space<2, Offload<None>>(world, 1'000'000'000);
    ledger_by_space<1, Offload<Cpu>>(world, 1'000'000'000);
    ledger_by_space<2, Offload<Cpu>>(world, 1'000'000'000);
    ledger_by_space<2, Offload<Cpu>>(world, 4096);  // staging bounded by the sub-group
  }
}

namespace {
/// K steps, state(); then either M more steps, or a fresh engine (of store Off2) that loads the state
/// and runs the same M steps. Rank 0's parameters of both.
template <int S, class Off1, class Off2>
void round_trip(int world, std::size_t sub) {
  RunConfig cfg;
  cfg.world = world;
  cfg.gas = 2;
  cfg.clip = 0.5;
  cfg.poison_steps = {2};
  std::vector<float> straight, resumed;
  std::vector<EngineState> states(static_cast<std::size_t>(world));
  std::vector<EngineState> states_other(static_cast<std::size_t>(world));
  comm::run_threads(world, [&](auto& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    EngineOptions o = engine_options(cfg);
    o.sub_group_size = sub;
    Mlp<half> model;
    E<S, fp16, Off1> engine(comm, model, o);
    model.init(42);
    engine.initialize_master();
    train_steps(engine, model, comm.rank(), cfg, 0, 5, nullptr);
    states[r] = engine.state();
    train_steps(engine, model, comm.rank(), cfg, 5, 10, nullptr);
    engine.synchronize();
    if (r == 0) straight = model.values();

    Mlp<half> model2;
    E<S, fp16, Off2> other(comm, model2, o);
    model2.init(7);  // other values: everything must come from the state
    other.initialize_master();
    other.load_state(states[r]);
    states_other[r] = other.state();
    train_steps(other, model2, comm.rank(), cfg, 5, 10, nullptr);
    other.synchronize();
    if (r == 0) resumed = model2.values();
  });
  check_same_states(states, states_other);
  CHECK(!straight.empty());
  CHECK(resumed == straight);
}
}  // namespace

TEST_CASE("state() / load_state() round trip with Offload<Cpu>, and across Offload<Cpu> and Offload<None>") {
  for (int world : {1, 2, 3}) {
    CAPTURE(world);
    round_trip<2, Offload<Cpu>, Offload<Cpu>>(world, 7);
    round_trip<1, Offload<Cpu>, Offload<Cpu>>(world, 1);
    round_trip<2, Offload<Cpu>, Offload<None>>(world, 7);
    round_trip<2, Offload<None>, Offload<Cpu>>(world, 3);
  }
}

TEST_CASE("Offload<Cpu> state equals Offload<None> state after training (master, m, v, step)") {
  RunConfig cfg;
  cfg.world = 2;
  cfg.gas = 2;
  std::vector<EngineState> a(2), b(2);
  comm::run_threads(2, [&](auto& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    EngineOptions o = engine_options(cfg);
    o.sub_group_size = 5;
    Mlp<bfloat16> m1, m2;
    E<2, bf16, Offload<None>> e1(comm, m1, o);
    E<2, bf16, Offload<Cpu>> e2(comm, m2, o);
    m1.init(42);
    m2.init(42);
    e1.initialize_master();
    e2.initialize_master();
    train_steps(e1, m1, comm.rank(), cfg, 0, 6, nullptr);
    train_steps(e2, m2, comm.rank(), cfg, 0, 6, nullptr);
    a[r] = e1.state();
    b[r] = e2.state();
  });
  for (std::size_t r = 0; r < 2; ++r) {
    REQUIRE(a[r].groups.size() == 1);
    CHECK(a[r].groups[0].optimizer.step == 6);
    CHECK(b[r].groups[0].optimizer.step == 6);  // one step per optimizer step, not per sub-group
    CHECK(a[r].groups[0].master == b[r].groups[0].master);
    CHECK(a[r].groups[0].optimizer.m == b[r].groups[0].optimizer.m);
    CHECK(a[r].groups[0].optimizer.v == b[r].groups[0].optimizer.v);
  }
}

TEST_CASE("Offload<Cpu>: sub_group_size 0 is a config_error") {
  comm::run_threads(1, [&](auto& comm) {
    Mlp<float> model;
    EngineOptions o;
    o.sub_group_size = 0;
    CHECK_THROWS_AS((E<2, fp32, Offload<Cpu>>(comm, model, o)), config_error);
  });
}


TEST_CASE("Offload<Cpu>: a refused page lock names RLIMIT_MEMLOCK and the bytes asked") {
  rlimit saved{};
  REQUIRE(::getrlimit(RLIMIT_MEMLOCK, &saved) == 0);
  std::string what;
  bool threw_usage = false, could_restrict = false;
  std::thread t([&] {
    could_restrict = drop_capability(CAP_IPC_LOCK) || ::geteuid() != 0;
    rlimit tiny = saved;
    tiny.rlim_cur = 0;  // the soft limit may always be lowered
    if (::setrlimit(RLIMIT_MEMLOCK, &tiny) != 0) could_restrict = false;
    // Sanitizer runtimes replace mlock with a no-op that succeeds: then nothing can be refused.
    if (void* page = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0); page != MAP_FAILED) {
      if (::mlock(page, 4096) == 0) {
        could_restrict = false;
        ::munlock(page, 4096);
      }
      ::munmap(page, 4096);
    }
    try {
      comm::run_threads(1, [&](auto& comm) {
        Mlp<float> model;
        E<2, fp32, Offload<Cpu>> engine(comm, model, EngineOptions{});
      });
    } catch (const usage_error& e) {
      threw_usage = true;
      what = e.what();
    } catch (const std::exception& e) {
      what = e.what();
    }
    ::setrlimit(RLIMIT_MEMLOCK, &saved);
  });
  t.join();
  if (!could_restrict) {
    MESSAGE("cannot restrict page locking here (CAP_IPC_LOCK kept, or a sanitizer's no-op mlock); the error path is not "
            "exercised");
    return;
  }
  CAPTURE(what);
  CHECK(threw_usage);
  CHECK(what.find("RLIMIT_MEMLOCK is 0 bytes") != std::string::npos);
  CHECK(what.find("bytes asked") != std::string::npos);
  CHECK(what.find("mlock of") != std::string::npos);
}

}  // namespace test_host_pinned
