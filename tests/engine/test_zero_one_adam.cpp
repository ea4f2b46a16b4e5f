// Optimizer<ZeroOneAdam> in the engine (stage 0, threads communicator) against independent
// references, bit for bit: the first step changes nothing; with the variance phase never ending and
// I_v never doubling it equals AdamW without bias correction; a whole run through var, grad, sync and
// local steps equals a serial reference of all W ranks written from docs/design/onebit_next.md
// section A (W = 1..4, weight decay 0 and 0.01; each rank's p on its own in the frozen phase); the
// errors are reset before the first frozen step (a reference without the reset ends elsewhere); wire
// bytes per step kind; overflow on grad and local steps; a load in the middle of a local interval.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "../compress/onebit_reference.hpp"
#include "engine_fixture.hpp"
#include "zerotk/comm/accounting.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/engine.hpp"

namespace test_zero_one_adam {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using zt_test::Mlp;
using zt_test::same_bits;
using Run = zt_test::ThreadsRun;
using Kind = optim::ZeroOneSchedule::Kind;

namespace {

using ZeroOneEngine = Engine<Partitioner<Stage<0>>, Optimizer<ZeroOneAdam>, Precision<fp32>>;

/// The schedule of docs/design/onebit_next.md's worked table: variance phase t = 2..13 (var steps at
/// 2, 3, 4, 6, 8, 12), frozen from 14, syncs at 14, 15, 16, 18, 20, 24, 28.
constexpr optim::ZeroOneOptions kTable{.var_freeze_step = 12, .var_update_scaler = 2, .local_step_scaler = 3,
                                       .local_step_clipper = 4};

EngineOptions options(const optim::ZeroOneOptions& z, double wd = 0.01, std::size_t bucket_bytes = 256) {
  EngineOptions o;
  o.reduce_bucket_size = bucket_bytes / sizeof(float);  // fp32 elements
  // As in the 1-bit Adam tests: eps = 1e-2 keeps short runs with v frozen early finite.
  o.optimizer.lr = 1e-3;
  o.optimizer.beta2 = 0.95;
  o.optimizer.eps = 1e-2;
  o.optimizer.weight_decay = wd;
  o.onebit.zero_one = z;
  return o;
}

/// The serial reference of 0/1 Adam over all W ranks (fp32, no clipping, one micro-step), written from
/// the step description, not from the library's kernels: per rank p, m, u (they part in the frozen
/// phase), one v, one lr sum L, one error pair per tensor (test::OneBitReference) shared by the
/// gradient and the accumulator exchanges. Each rank's gradient comes from the fixture's backward at
/// that rank's own p on its own batch.
std::vector<std::vector<float>> reference(int world, int steps, const optim::ZeroOneOptions& z,
                                          const OptimizerOptions& h, bool reset_errors = true) {
  const auto uw = static_cast<std::size_t>(world);
  zt_test::SerialMlp net;
  const auto& tensors = net.tensors;
  const std::size_t n = net.n;
  const float lr = static_cast<float>(h.lr), b1 = static_cast<float>(h.beta1), b2 = static_cast<float>(h.beta2);
  const float omb1 = static_cast<float>(1.0 - static_cast<double>(b1));
  const float omb2 = static_cast<float>(1.0 - static_cast<double>(b2));
  const float eps = static_cast<float>(h.eps), wd = static_cast<float>(h.weight_decay);
  std::vector<std::vector<float>> p(uw, net.values());
  std::vector<std::vector<float>> m(uw, std::vector<float>(n, 0.0f)), u(uw, std::vector<float>(n, 0.0f));
  std::vector<float> v(n, 0.0f);
  double lr_sum = 0.0;
  std::vector<test::OneBitReference> errors;
  auto fresh_errors = [&] {
    errors.clear();
    for (const auto& t : tensors) errors.emplace_back(t.second, world);
  };
  fresh_errors();
  // x[r] (n values per rank) -> the common all-reduced values, tensor by tensor (W = 1: rank 0's).
  auto all_reduce = [&](const std::vector<std::vector<float>>& x) {
    if (world == 1) return x[0];
    std::vector<float> out(n);
    for (std::size_t k = 0; k < tensors.size(); ++k) {
      const auto [o, len] = tensors[k];
      std::vector<std::vector<float>> in(uw);
      for (std::size_t r = 0; r < uw; ++r) in[r].assign(x[r].begin() + static_cast<long>(o), x[r].begin() + static_cast<long>(o + len));
      const std::vector<float> avg = errors[k].step(in);
      std::copy(avg.begin(), avg.end(), out.begin() + static_cast<long>(o));
    }
    return out;
  };
  auto den = [&](std::size_t i) { return std::sqrt(v[i]) + eps; };
  // Schedule state, advanced by hand as DeepSpeed's counters are.
  std::int64_t var_interval = 1, var_counter = 0, local_interval = 1, local_counter = 0;
  bool frozen = false;
  for (int s = 0; s < steps; ++s) {
    const std::int64_t t = s + 1;
    std::vector<std::vector<float>> g(uw);
    for (std::size_t r = 0; r < uw; ++r) g[r] = net.gradient(s, static_cast<int>(r), p[r]);
    if (t == 1) continue;  // the set-up step
    if (!frozen) {
      if (t % var_interval == 0) {  // var: averaged gradient, Adam without bias correction
        for (std::size_t i = 0; i < n; ++i) {
          float a = g[0][i];
          for (std::size_t r = 1; r < uw; ++r) a += g[r][i];
          a = a / static_cast<float>(world);
          for (std::size_t r = 0; r < uw; ++r) m[r][i] = std::fma(b1, m[r][i], omb1 * a);
          v[i] = std::fma(b2, v[i], (omb2 * a) * a);
        }
      } else {  // grad: the 1-bit all-reduced gradient into m; v unchanged
        const std::vector<float> gh = all_reduce(g);
        for (std::size_t r = 0; r < uw; ++r) {
          for (std::size_t i = 0; i < n; ++i) m[r][i] = std::fma(b1, m[r][i], omb1 * gh[i]);
        }
      }
      for (std::size_t r = 0; r < uw; ++r) {
        for (std::size_t i = 0; i < n; ++i) p[r][i] = std::fma(-lr, std::fma(wd, p[r][i], m[r][i] / den(i)), p[r][i]);
      }
      if (t % var_interval == 0 && ++var_counter == z.var_update_scaler) {
        var_counter = 0;
        var_interval *= 2;
      }
      if (t > z.var_freeze_step) {  // the phase flips after this step; the errors restart once
        frozen = true;
        if (reset_errors) fresh_errors();
      }
      continue;
    }
    lr_sum += h.lr;
    for (std::size_t r = 0; r < uw; ++r) {
      for (std::size_t i = 0; i < n; ++i) {
        m[r][i] = std::fma(b1, m[r][i], omb1 * g[r][i]);
        const float d = -lr * std::fma(wd, p[r][i], m[r][i] / den(i));
        p[r][i] = p[r][i] + d;
        u[r][i] = u[r][i] + d;
      }
    }
    if (t % local_interval == 0) {  // sync
      for (std::size_t r = 0; r < uw; ++r) {
        for (std::size_t i = 0; i < n; ++i) {
          p[r][i] = p[r][i] - u[r][i];
          u[r][i] = u[r][i] * den(i);
        }
      }
      const std::vector<float> avg = all_reduce(u);
      const auto l = static_cast<float>(lr_sum);
      for (std::size_t r = 0; r < uw; ++r) {
        for (std::size_t i = 0; i < n; ++i) {
          m[r][i] = -(avg[i] / l);
          p[r][i] = p[r][i] + avg[i] / den(i);
          u[r][i] = 0.0f;
        }
      }
      lr_sum = 0.0;
    }
    if (++local_counter == z.local_step_scaler) {
      local_counter = 0;
      local_interval = std::min(z.local_step_clipper, 2 * local_interval);
    }
  }
  return p;
}

}  // namespace

TEST_CASE("ZeroOneSchedule: the worked 28-step table, intervals, replay after a jump back, key ranges") {
  const optim::ZeroOneSchedule s(kTable);
  //                 t: 1     2    3    4    5     6    7     8    9     10    11    12   13    14
  const Kind want[] = {Kind::init, Kind::var, Kind::var, Kind::var, Kind::grad, Kind::var, Kind::grad, Kind::var,
                       Kind::grad, Kind::grad, Kind::grad, Kind::var, Kind::grad, Kind::sync,
                       // 15       16          17           18          19           20          21
                       Kind::sync, Kind::sync, Kind::local, Kind::sync, Kind::local, Kind::sync, Kind::local,
                       // 22        23           24          25           26           27           28
                       Kind::local, Kind::local, Kind::sync, Kind::local, Kind::local, Kind::local, Kind::sync};
  for (std::int64_t t = 1; t <= 28; ++t) {
    CAPTURE(t);
    CHECK(s.kind(t) == want[t - 1]);
  }
  CHECK(s.var_interval(3) == 1);
  CHECK(s.var_interval(4) == 2);
  CHECK(s.var_interval(7) == 4);
  CHECK(s.var_interval(13) == 8);
  CHECK(s.local_interval(16) == 1);
  CHECK(s.local_interval(17) == 2);
  CHECK(s.local_interval(20) == 4);
  CHECK(s.local_interval(1000) == 4);  // clipped
  // Asking for an earlier step replays from the start: the same answers (the cache is invisible).
  for (std::int64_t t = 28; t >= 1; --t) CHECK(s.kind(t) == want[t - 1]);
  // var_freeze_step 0 and 1 both end the variance phase after t = 2.
  for (std::int64_t f : {0, 1}) {
    const optim::ZeroOneSchedule z({.var_freeze_step = f, .local_step_scaler = 1, .local_step_clipper = 1});
    CHECK(z.kind(2) == Kind::var);
    CHECK(z.kind(3) == Kind::sync);
    CHECK(z.kind(4) == Kind::sync);
  }
  // A huge clipper with the interval doubling every step does not overflow.
  const optim::ZeroOneSchedule big({.var_freeze_step = 0, .local_step_scaler = 1,
                                    .local_step_clipper = std::numeric_limits<std::int64_t>::max()});
  CHECK(big.local_interval(200) > 0);
  CHECK_THROWS_AS(optim::ZeroOneSchedule({.var_freeze_step = -1}), config_error);
  CHECK_THROWS_AS(optim::ZeroOneSchedule({.var_update_scaler = 0}), config_error);
  CHECK_THROWS_AS(optim::ZeroOneSchedule({.local_step_scaler = 0}), config_error);
  try {
    (void)optim::ZeroOneSchedule({.local_step_clipper = -3});
    FAIL("no error");
  } catch (const config_error& e) {
    CHECK(std::string(e.what()).find("local_step_clipper") != std::string::npos);
    CHECK(std::string(e.what()).find("-3") != std::string::npos);
  }
}

TEST_CASE("ZeroOneAdam: the first step changes nothing; a variance phase of var steps only equals AdamW") {
  // var_update_scaler beyond the run: I_v stays 1, every step is a var step.
  const EngineOptions o = options({.var_freeze_step = 1000, .var_update_scaler = 1000});
  const Run first = zt_test::train_threads<ZeroOneEngine>(2, 1, o);
  CHECK(same_bits(first.finals[0], first.initial));
  CHECK(first.reports[0].global_steps == 1);

  const Run zo = zt_test::train_threads<ZeroOneEngine>(2, 7, o);
  EngineOptions adam = o;
  adam.optimizer.bias_correction = false;
  const Run adamw = zt_test::train_threads<Engine<Partitioner<Stage<0>>, Optimizer<AdamW>, Precision<fp32>>>(2, 6, adam, 1);
  CHECK_FALSE(same_bits(zo.finals[0], zo.initial));
  for (int r = 0; r < 2; ++r) CHECK(same_bits(zo.finals[static_cast<std::size_t>(r)], adamw.finals[0]));
}

TEST_CASE("ZeroOneAdam: var, grad, sync and local steps equal the serial reference bit for bit, W = 1..4") {
  const int steps = 24;  // the table's schedule: every kind, the error reset, I_l doubling twice
  for (int w = 1; w <= 4; ++w) {
    for (double wd : {0.0, 0.01}) {
      CAPTURE(w);
      CAPTURE(wd);
      const EngineOptions o = options(kTable, wd);
      const Run got = zt_test::train_threads<ZeroOneEngine>(w, steps, o);
      for (const StepReport& rep : got.reports) REQUIRE_FALSE(rep.skipped);
      const std::vector<std::vector<float>> want = reference(w, steps, kTable, o.optimizer);
      for (int r = 0; r < w; ++r) {
        CAPTURE(r);
        for (float x : want[static_cast<std::size_t>(r)]) REQUIRE(std::isfinite(x));
        CHECK(same_bits(got.finals[static_cast<std::size_t>(r)], want[static_cast<std::size_t>(r)]));
      }
      if (w > 1) {
        // The frozen phase's local steps really ran on each rank's own gradients (step 23 is local).
        CHECK_FALSE(same_bits(got.finals[0], got.finals[1]));
        // The errors restart before the first frozen step: a reference that keeps them ends elsewhere.
        const auto kept = reference(w, steps, kTable, o.optimizer, /*reset_errors=*/false);
        CHECK_FALSE(same_bits(kept[0], want[0]));
      }
    }
  }
}

TEST_CASE("ZeroOneAdam: wire bytes per step kind: dense in var steps, one 1-bit exchange in grad and sync, none in local") {
  using comm::OpKind;
  using comm::ring_wire_bytes;
  for (int w : {2, 3}) {
    CAPTURE(w);
    const Run got = zt_test::train_threads<ZeroOneEngine>(w, 24, options(kTable, 0.01, /*one bucket*/ 1 << 20));
    std::vector<std::size_t> tensors;
    Mlp<float> model;
    model.parameters([&](std::string_view, auto& p) { tensors.push_back(p.numel()); });
    std::uint64_t exchange = 0;
    for (std::size_t n : tensors) {
      const compress::OneBitLayout l = compress::OneBitLayout::make(n, w);
      exchange += ring_wire_bytes(OpKind::all_to_all, l.padded / 8, w) +
                  2 * ring_wire_bytes(OpKind::all_gather, 4 * static_cast<std::uint64_t>(w), w) +
                  ring_wire_bytes(OpKind::all_gather, l.padded / 8, w);
    }
    constexpr std::uint64_t kFolds = std::size(kernels::FoldSums{}.fold);
    const std::uint64_t bound = ring_wire_bytes(OpKind::all_reduce, 16, w);
    const std::uint64_t grads = ring_wire_bytes(OpKind::all_reduce, 4 * got.flat_numel, w);
    const std::uint64_t norm_and_loss = ring_wire_bytes(OpKind::all_reduce, 8 * (kFolds + 1), w);
    const std::uint64_t loss = ring_wire_bytes(OpKind::all_reduce, 8, w);
    const optim::ZeroOneSchedule s(kTable);
    for (int i = 1; i < 24; ++i) {  // step 1's report also counts the broadcast of the initial values
      const std::int64_t t = i + 1;
      CAPTURE(t);
      const StepReport& rep = got.reports[static_cast<std::size_t>(i)];
      switch (s.kind(t)) {
        case Kind::var:
          CHECK(rep.comm_wire_bytes == grads + bound + norm_and_loss);
          CHECK(rep.comm_dense_bytes == rep.comm_wire_bytes);
          break;
        case Kind::grad:
        case Kind::sync:
          CHECK(rep.comm_wire_bytes == exchange + bound + loss);
          CHECK(rep.comm_dense_bytes == grads + bound + loss);
          break;
        case Kind::local:
          CHECK(rep.comm_wire_bytes == bound + loss);
          CHECK(rep.comm_dense_bytes == grads + bound + loss);
          break;
        case Kind::init:
          FAIL("t >= 2 is never init");
      }
    }
  }
}

TEST_CASE("ZeroOneAdam: an overflow on a grad and on a local step is skipped by every rank and advances nothing") {
  // Rank 0's gradient is poisoned at batch 4 (the step would be t = 5, a grad step: gradients local)
  // and at batch 17 (t = 17 after the skip, a local step). Both ranks skip both; every later step
  // still does what the schedule says for the count of steps taken (its bytes show the kind).
  using comm::OpKind;
  using comm::ring_wire_bytes;
  const int world = 2;
  const optim::ZeroOneSchedule s(kTable);
  REQUIRE(s.kind(5) == Kind::grad);
  REQUIRE(s.kind(17) == Kind::local);
  const std::uint64_t local_wire = ring_wire_bytes(OpKind::all_reduce, 16, world) + ring_wire_bytes(OpKind::all_reduce, 8, world);
  std::vector<std::vector<StepReport>> reports(world);
  comm::run_threads(world, [&](comm::ThreadsCommunicator& c) {
    Mlp<float> model;
    ZeroOneEngine engine(c, model, options(kTable, 0.01, 1 << 20));
    zt_test::init_model(engine, model, 42);
    for (int b = 0; b < 26; ++b) {
      const bool poison = c.rank() == 0 && (b == 4 || b == 17);
      reports[static_cast<std::size_t>(c.rank())].push_back(
          engine.step(zt_test::micro_step(engine, model, zt_test::make_batch(b, 0, c.rank()), poison)));
    }
  });
  for (std::size_t r = 0; r < world; ++r) {
    CAPTURE(r);
    std::int64_t taken = 0;
    for (std::size_t b = 0; b < reports[r].size(); ++b) {
      CAPTURE(b);
      const StepReport& rep = reports[r][b];
      CHECK(rep.skipped == (b == 4 || b == 17));
      if (rep.skipped) continue;
      const std::int64_t t = ++taken;
      CAPTURE(t);
      if (t == 1) continue;  // its report also counts the initial broadcast
      switch (s.kind(t)) {
        case Kind::var: CHECK(rep.comm_dense_bytes == rep.comm_wire_bytes); break;
        case Kind::grad:
        case Kind::sync:
          CHECK(rep.comm_dense_bytes > rep.comm_wire_bytes);
          CHECK(rep.comm_wire_bytes > local_wire);
          break;
        case Kind::local: CHECK(rep.comm_wire_bytes == local_wire); break;
        case Kind::init: FAIL("t >= 2 is never init");
      }
    }
    CHECK(taken == 24);
  }
}

TEST_CASE("ZeroOneAdam: a load inside a local interval continues the schedule with u, L and the errors as saved; "
          "without them, from zero") {
  // Load after step 21 (a local step; the next sync is 24): A runs 24 steps straight; B saves and
  // loads its own state after 21; C is a fresh engine loading that state. A, B and C are equal on
  // every rank (u, L and the errors are the state's rank-local part). D loads the state without it:
  // u, L and the errors restart from zero, and it differs from A (whose u held step 21's local
  // update into the sync at 24).
  const int world = 2;
  const zt_test::ResumeRuns runs = zt_test::resume_runs<ZeroOneEngine>(world, options(kTable), 21, 3);
  const optim::ZeroOneSchedule s(kTable);
  REQUIRE(s.kind(21) == Kind::local);
  REQUIRE(s.kind(24) == Kind::sync);
  for (std::size_t r = 0; r < world; ++r) {
    CAPTURE(r);
    CHECK(runs.had_rank_local[r] == 1);
    CHECK(same_bits(runs.a[r], runs.b[r]));
    CHECK(same_bits(runs.b[r], runs.c[r]));
    CHECK_FALSE(same_bits(runs.a[r], runs.d[r]));
    // Steps 22 and 23 stay local (their gradients are not all-reduced; 23 sends nothing but the
    // bound and the loss; 22's report also counts the load's own agreement), 24 syncs.
    REQUIRE(runs.c_reports[r].size() == 3);
    const std::vector<StepReport>& rep = runs.c_reports[r];
    CHECK(rep[0].comm_dense_bytes > rep[0].comm_wire_bytes);
    CHECK(rep[1].comm_wire_bytes ==
          comm::ring_wire_bytes(comm::OpKind::all_reduce, 16, world) + comm::ring_wire_bytes(comm::OpKind::all_reduce, 8, world));
    CHECK(rep[2].comm_wire_bytes > rep[1].comm_wire_bytes);
    CHECK(rep[2].comm_dense_bytes > rep[2].comm_wire_bytes);
  }
}

TEST_CASE("ZeroOneAdam: out-of-range schedule keys are config errors naming the key; bf16 runs every kind") {
  comm::run_threads(1, [&](comm::ThreadsCommunicator& c) {
    Mlp<float> model;
    CHECK_THROWS_AS(ZeroOneEngine(c, model, options({.var_freeze_step = -1})), config_error);
    CHECK_THROWS_AS(ZeroOneEngine(c, model, options({.local_step_clipper = 0})), config_error);
  });
  std::vector<std::vector<float>> finals(2), initial(2);
  comm::run_threads(2, [&](comm::ThreadsCommunicator& c) {
    Mlp<bfloat16> model;
    Engine<Partitioner<Stage<0>>, Optimizer<ZeroOneAdam>, Precision<bf16>> e(c, model, options(kTable));
    zt_test::init_model(e, model, 42);
    initial[static_cast<std::size_t>(c.rank())] = model.values();
    const std::vector<StepReport> reps = zt_test::train_boundaries(e, model, c.rank(), 0, 24);
    for (const StepReport& rep : reps) CHECK_FALSE(rep.skipped);
    CHECK(reps[1].comm_dense_bytes == reps[1].comm_wire_bytes);       // t = 2: var
    CHECK(reps[23].comm_dense_bytes > reps[23].comm_wire_bytes);      // t = 24: sync
    finals[static_cast<std::size_t>(c.rank())] = model.values();
  });
  CHECK_FALSE(same_bits(finals[0], initial[0]));
  for (float x : finals[0]) CHECK(std::isfinite(x));
}

}  // namespace test_zero_one_adam
