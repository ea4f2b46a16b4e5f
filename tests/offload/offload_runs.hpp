#pragma once
// What the offload tests share: W ranks of a training run on the threads communicator with a given
// state store (rank 0's result, every rank's agreement, a check of each rank's ledger), the comparison
// of a run with its Offload<None> reference, state comparison, a resume across two engine types, and
// dropping one capability from the calling thread.
#include <doctest/doctest.h>

#include <linux/capability.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine_fixture.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/engine.hpp"

namespace zt_test {

template <int S, class Prec, class Off, class ParamOff = zerotk::OffloadParams<zerotk::None>>
using OffloadEngine = zerotk::Engine<zerotk::Partitioner<zerotk::Stage<S>>, zerotk::Optimizer<zerotk::AdamW>,
                                     zerotk::Precision<Prec>, Off, ParamOff>;

/// `cfg.steps` steps of the MLP from seed 42 with options `o`; `ledger_ok(memory)` on every rank
/// after training (or `ledger_ok(engine)`, where the check needs more of the engine than its ledger).
/// `Model` = Mlp<float> over a 16-bit Precision is emulated 16-bit.
template <int S, class Prec, class Off, class ParamOff = zerotk::OffloadParams<zerotk::None>,
          class Model = Mlp<typename zerotk::Precision<Prec>::storage>, class LedgerOk>
RunResult train_with(const RunConfig& cfg, const zerotk::EngineOptions& o, LedgerOk&& ledger_ok) {
  RunResult result;
  std::vector<std::vector<float>> finals(static_cast<std::size_t>(cfg.world));
  std::mutex mu;
  zerotk::comm::run_threads(cfg.world, [&](auto& comm) {
    RunResult mine;
    Model model;
    OffloadEngine<S, Prec, Off, ParamOff> engine(comm, model, o);
    {
      auto g = engine.gather(model, 0);  // stage 3: rank 0's writes go into every rank's shard
      model.init(42);
      mine.initial = model.values();
    }
    engine.initialize_master();
    train_steps(engine, model, comm.rank(), cfg, 0, cfg.steps, &mine);
    {
      auto g = engine.gather(model);
      mine.params = model.values();
    }
    bool ok;
    if constexpr (std::is_invocable_v<LedgerOk&, const decltype(engine)&>) {
      ok = ledger_ok(std::as_const(engine));
    } else {
      ok = ledger_ok(engine.memory());
    }
    if (!ok) mine.ranks_agree = false;
    std::lock_guard lock(mu);
    finals[static_cast<std::size_t>(comm.rank())] = mine.params;
    if (comm.rank() == 0) result = std::move(mine);
  });
  for (const auto& f : finals) result.ranks_agree = result.ranks_agree && f == finals[0];
  return result;
}

/// Bit for bit the reference's run: parameters, losses, scales, skips and norms.
inline void check_same_run(const RunResult& off, const RunResult& ref) {
  CHECK(off.ranks_agree);
  CHECK(off.params == ref.params);
  CHECK(off.losses == ref.losses);
  CHECK(off.scales == ref.scales);
  CHECK(off.skipped == ref.skipped);
  CHECK(off.norms == ref.norms);
}

/// Two states hold the same master, moments and step count, group by group, on every rank.
inline void check_same_states(const std::vector<zerotk::EngineState>& a, const std::vector<zerotk::EngineState>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t r = 0; r < a.size(); ++r) {
    CAPTURE(r);
    REQUIRE(a[r].groups.size() == b[r].groups.size());
    for (std::size_t g = 0; g < a[r].groups.size(); ++g) {
      CHECK(a[r].groups[g].master == b[r].groups[g].master);
      CHECK(a[r].groups[g].optimizer.m == b[r].groups[g].optimizer.m);
      CHECK(a[r].groups[g].optimizer.v == b[r].groups[g].optimizer.v);
      CHECK(a[r].groups[g].optimizer.step == b[r].groups[g].optimizer.step);
    }
  }
}

/// Two states are the same: steps, skips, loss scaler, and master, moments and step count group by
/// group.
inline bool same_state(const zerotk::EngineState& a, const zerotk::EngineState& b) {
  if (a.groups.size() != b.groups.size() || a.global_steps != b.global_steps || a.skipped_steps != b.skipped_steps ||
      !(a.scaler == b.scaler)) {
    return false;
  }
  for (std::size_t g = 0; g < a.groups.size(); ++g) {
    if (a.groups[g].master != b.groups[g].master || a.groups[g].optimizer.m != b.groups[g].optimizer.m ||
        a.groups[g].optimizer.v != b.groups[g].optimizer.v || a.groups[g].optimizer.step != b.groups[g].optimizer.step) {
      return false;
    }
  }
  return true;
}

/// The reference itself trained, agreed across ranks, and skipped a step exactly when expected.
inline void check_reference(const RunResult& ref, bool expect_skip) {
  REQUIRE(ref.ranks_agree);
  CHECK(ref.params != ref.initial);
  bool skipped = false;
  for (char s : ref.skipped) skipped = skipped || s;
  CHECK(skipped == expect_skip);
}

/// 5 steps of fp16 Mlp<half> on an E1 engine, state(), 5 more; then a fresh E2 (other initial values)
/// loads that state and runs the same 5: the final parameters must be equal (rank 0's).
template <class E1, class E2>
void check_resume_across(const RunConfig& cfg, const zerotk::EngineOptions& o) {
  std::vector<float> straight, resumed;
  std::vector<zerotk::EngineState> states(static_cast<std::size_t>(cfg.world));
  zerotk::comm::run_threads(cfg.world, [&](auto& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    Mlp<zerotk::half> model;
    E1 engine(comm, model, o);
    {
      auto g = engine.gather(model, 0);
      model.init(42);
    }
    engine.initialize_master();
    train_steps(engine, model, comm.rank(), cfg, 0, 5, nullptr);
    states[r] = engine.state();
    train_steps(engine, model, comm.rank(), cfg, 5, 10, nullptr);
    {
      auto g = engine.gather(model);
      if (r == 0) straight = model.values();
    }
    Mlp<zerotk::half> model2;
    E2 other(comm, model2, o);
    {
      auto g = other.gather(model2, 0);
      model2.init(7);  // other values: everything must come from the state
    }
    other.initialize_master();
    other.load_state(states[r]);
    train_steps(other, model2, comm.rank(), cfg, 5, 10, nullptr);
    {
      auto g = other.gather(model2);
      if (r == 0) resumed = model2.values();
    }
  });
  CHECK(!straight.empty());
  CHECK(resumed == straight);
}

/// Drops capability `cap` from this thread's effective set (threads it creates inherit it). False
/// where the kernel refuses.
inline bool drop_capability(int cap) {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (::syscall(SYS_capget, &hdr, data) != 0) return false;
  data[cap / 32].effective &= ~(1u << (cap % 32));
  return ::syscall(SYS_capset, &hdr, data) == 0;
}

}  // namespace zt_test
