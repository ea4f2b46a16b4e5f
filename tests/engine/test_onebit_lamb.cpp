// Optimizer<OneBitLamb> in the engine (stage 0, threads communicator): DeepSpeed's 1-bit LAMB
// (docs/design/onebit_next.md section B) against a serial reference of all W ranks written from
// that description, bit for bit: the first step changes nothing; the warm-up (trust ratios, their
// EMA c_f, v_f = v at freeze_step); the compression phase (scaling coefficients from the momentum's
// rms, one 1-bit all-reduce of the whole model's flat momentum with its persistent tail, the fresh
// variance from the implied gradient, the clamped factor, p -= lr c_f f upd). W = 1..4, with and
// without weight decay. Wire bytes per step; state()/load_state() and a resumed run; errors.
#include <doctest/doctest.h>

#include <algorithm>
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
#include "zerotk/kernels/host/lamb.hpp"
#include "zerotk/kernels/host/reduce.hpp"

namespace test_onebit_lamb {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using zt_test::Mlp;
using zt_test::same_bits;
using Run = zt_test::ThreadsRun;

namespace {

using LambEngine = Engine<Partitioner<Stage<0>>, Optimizer<OneBitLamb>, Precision<fp32>>;

EngineOptions options(std::int64_t freeze_step, double weight_decay = 0.0, std::size_t bucket_bytes = 256) {
  EngineOptions o;
  o.reduce_bucket_size = bucket_bytes / sizeof(float);  // fp32 elements
  o.optimizer.lr = 2e-3;
  o.optimizer.beta2 = 0.95;
  o.optimizer.eps = 1e-2;  // a short warm-up leaves v near 0 (see test_onebit_adam.cpp)
  o.optimizer.weight_decay = weight_decay;
  o.optimizer.lamb_max_coeff = 1.0;  // both clamps of the trust ratio are reached (checked below)
  o.optimizer.lamb_min_coeff = 0.05;
  o.onebit.freeze_step = freeze_step;
  o.onebit.lamb.factor_threshold = 0.2;
  return o;
}

/// The serial reference of 1-bit LAMB over all W ranks (fp32, one micro-step, no clipping), per
/// tensor in the engine's order. The warm-up's moments and per-tensor norms come from LAMB's phase-1
/// kernel (kernels/host/lamb.hpp, tested against DeepSpeed's FusedLamb); everything else is written
/// here: trust ratio and its EMA, scaling coefficients, the exchange of the whole model's momentum
/// through the serial 1-bit reference (one flat vector, tail kept), the fresh variance, the factor.
struct Reference {
  std::vector<float> vals;
  std::vector<double> coeff_freeze, last_factor, scaling;
  int ratio_at_max = 0, ratio_at_min = 0;  // warm-up trust ratios clamped by max_coeff, by min_coeff
};
Reference reference(int world, int steps, const EngineOptions& o) {
  zt_test::SerialMlp net;
  const auto& tensors = net.tensors;
  const std::size_t n = net.n, T = tensors.size();
  const OptimizerOptions& h = o.optimizer;
  const OneBitLambOptions& lo = o.onebit.lamb;
  const std::int64_t freeze = o.onebit.freeze_step;
  Reference ref{net.values(), std::vector<double>(T, 0.0), std::vector<double>(T, 1.0), std::vector<double>(T, 0.0)};
  std::vector<float>& p = ref.vals;
  const float b1 = static_cast<float>(h.beta1), b2 = static_cast<float>(h.beta2);
  const float omb1 = static_cast<float>(1.0 - static_cast<double>(b1));
  const float omb2 = static_cast<float>(1.0 - static_cast<double>(b2));
  const float eps = static_cast<float>(h.eps), wd = static_cast<float>(h.weight_decay);
  const kernels::LambStepConsts k = kernels::LambStepConsts::make(
      {static_cast<float>(h.lr), b1, b2, eps, wd, false, static_cast<float>(h.lamb_min_coeff),
       static_cast<float>(h.lamb_max_coeff)},
      1);
  std::vector<float> m(n, 0.0f), v(n, 0.0f), vf(n, 0.0f);
  const std::size_t padded = compress::OneBitLayout::make(n, world).padded;
  test::OneBitReference exchange(padded, world);
  std::vector<float> tail(padded - n, 0.0f);
  bool compressed = false, scaled = false;
  auto sumsq = [](const std::vector<float>& x) { return kernels::host::sum_squares(x.data(), x.size()); };
  for (int s = 0; s < steps; ++s) {
    const std::int64_t t = s + 1;
    std::vector<std::vector<float>> g(static_cast<std::size_t>(world));
    for (int r = 0; r < world; ++r) g[static_cast<std::size_t>(r)] = net.gradient(s, r, p);
    if (t == 1) continue;
    if (!compressed) {
      std::vector<float> avg(n);
      for (std::size_t i = 0; i < n; ++i) {
        float a = g[0][i];
        for (int r = 1; r < world; ++r) a += g[static_cast<std::size_t>(r)][i];
        avg[i] = a / static_cast<float>(world);
      }
      for (std::size_t ti = 0; ti < T; ++ti) {
        const auto [off, len] = tensors[ti];
        const kernels::Segment seg{0, len, 0, 0};
        double sums[2] = {0.0, 0.0};
        kernels::host::lamb_phase1<float>({&seg, 1}, {&k, 1}, p.data() + off, m.data() + off, v.data() + off,
                                          avg.data() + off, 1.0f, sums);
        const double w = std::sqrt(sums[0]), ru = std::sqrt(sums[1]);
        double r = 1.0;
        if (w != 0.0 && ru != 0.0) {
          r = w / ru;
          if (r > h.lamb_max_coeff) r = h.lamb_max_coeff, ++ref.ratio_at_max;
          if (r < h.lamb_min_coeff) r = h.lamb_min_coeff, ++ref.ratio_at_min;
        }
        if (r != 1.0) ref.coeff_freeze[ti] = lo.coeff_beta * ref.coeff_freeze[ti] + (1.0 - lo.coeff_beta) * r;
        const float step = static_cast<float>(h.lr * r);
        for (std::size_t j = off; j < off + len; ++j) {
          const float upd = std::fma(wd, p[j], m[j] / (std::sqrt(v[j]) + eps));
          p[j] = std::fma(-step, upd, p[j]);
        }
      }
      if (t == freeze) vf = v;
    } else {
      if (!scaled) {
        std::vector<double> rms(T);
        double total = 0.0;
        for (std::size_t ti = 0; ti < T; ++ti) {
          const auto [off, len] = tensors[ti];
          rms[ti] = std::sqrt(sumsq(std::vector<float>(m.begin() + static_cast<long>(off),
                                                       m.begin() + static_cast<long>(off + len)))) /
                    std::sqrt(static_cast<double>(len));
          total += rms[ti];
        }
        for (std::size_t ti = 0; ti < T; ++ti) ref.scaling[ti] = total / static_cast<double>(T) / rms[ti];
        scaled = true;
      }
      const std::vector<float> m_prev = m;
      std::vector<std::vector<float>> local(static_cast<std::size_t>(world), std::vector<float>(padded));
      for (int r = 0; r < world; ++r) {
        std::vector<float>& x = local[static_cast<std::size_t>(r)];
        for (std::size_t ti = 0; ti < T; ++ti) {
          const auto [off, len] = tensors[ti];
          const float kf = static_cast<float>(ref.scaling[ti]);
          for (std::size_t j = off; j < off + len; ++j) {
            x[j] = std::fma(b1, m[j], omb1 * g[static_cast<std::size_t>(r)][j]) * kf;
          }
        }
        std::copy(tail.begin(), tail.end(), x.begin() + static_cast<long>(n));
      }
      std::vector<float> out = local[0];
      if (world > 1) {
        out = exchange.step(local);
        tail.assign(out.begin() + static_cast<long>(n), out.end());
      }
      for (std::size_t ti = 0; ti < T; ++ti) {
        const auto [off, len] = tensors[ti];
        const float kf = static_cast<float>(ref.scaling[ti]);
        std::vector<float> u0(len), upd(len);
        float best = 0.0f;
        for (std::size_t j = 0; j < len; ++j) {
          const std::size_t i = off + j;
          m[i] = out[i] / kf;
          const float gh = (m[i] - m_prev[i] * b1) / omb1;
          vf[i] = std::fma(b2, vf[i], (omb2 * gh) * gh);
          const float den = std::sqrt(v[i]) + eps;
          u0[j] = m[i] / den;
          upd[j] = std::fma(wd, p[i], u0[j]);
          best = std::max(best, den / (std::sqrt(vf[i]) + eps));
        }
        double f = best;
        if (wd > 0) {
          const double q = std::sqrt(sumsq(u0)) / std::sqrt(sumsq(upd));
          const double rho = q < 1.0 ? q : 1.0;
          f = f * rho + (1.0 - rho);
        }
        f = std::max(std::min(f, lo.factor_max), lo.factor_min);
        const double last = ref.last_factor[ti];
        f = std::max(std::min(f, last * (1.0 + lo.factor_threshold)), last * (1.0 - lo.factor_threshold));
        ref.last_factor[ti] = f;
        const float step = static_cast<float>(h.lr * (ref.coeff_freeze[ti] * f));
        for (std::size_t j = 0; j < len; ++j) p[off + j] = std::fma(-step, upd[j], p[off + j]);
      }
    }
    if (t >= std::max<std::int64_t>(2, freeze)) compressed = true;
  }
  return ref;
}

}  // namespace

TEST_CASE("OneBitLamb: the first step changes nothing; warm-up and compression equal the serial reference, W = 1..4") {
  for (int w = 1; w <= 4; ++w) {
    for (double wd : {0.0, 0.01}) {
      CAPTURE(w);
      CAPTURE(wd);
      const int steps = 12;
      const EngineOptions o = options(/*freeze_step=*/6, wd);
      const Run first = zt_test::train_threads<LambEngine>(w, 1, o);
      CHECK(same_bits(first.finals[0], first.initial));
      CHECK(first.reports[0].global_steps == 1);

      const Run got = zt_test::train_threads<LambEngine>(w, steps, o);
      for (const StepReport& rep : got.reports) REQUIRE_FALSE(rep.skipped);
      const Reference want = reference(w, steps, o);
      for (float x : want.vals) REQUIRE(std::isfinite(x));
      for (int r = 0; r < w; ++r) {
        CAPTURE(r);
        CHECK(same_bits(got.finals[static_cast<std::size_t>(r)], want.vals));
      }
      // The run exercised what it claims: both clamps of the trust ratio, c_f moved, k was set.
      CHECK(want.ratio_at_max > 0);
      CHECK(want.ratio_at_min > 0);
      for (std::size_t t = 0; t < want.coeff_freeze.size(); ++t) {
        CHECK(want.coeff_freeze[t] > 0.0);
        CHECK(want.scaling[t] > 0.0);
      }
      // The compression phase really ran: a run that stays in the warm-up ends elsewhere.
      EngineOptions warm = o;
      warm.onebit.freeze_step = 1000;
      CHECK_FALSE(same_bits(zt_test::train_threads<LambEngine>(w, steps, warm).finals[0], want.vals));
    }
  }
}

TEST_CASE("OneBitLamb: the optimizer's per-tensor scalars equal the reference's after the run") {
  const EngineOptions o = options(/*freeze_step=*/4, 0.01);
  const int steps = 9;
  const Reference want = reference(3, steps, o);
  std::vector<double> cf, F, k;
  comm::run_threads(3, [&](comm::ThreadsCommunicator& c) {
    Mlp<float> model;
    LambEngine e(c, model, o);
    zt_test::init_model(e, model, 42);
    (void)zt_test::train_boundaries(e, model, c.rank(), 0, steps);
    if (c.rank() == 0) {
      const EngineState s = e.state();
      REQUIRE(s.groups.size() == 1);
      const std::vector<double>& x = s.groups[0].optimizer.tensor_scalars;
      constexpr std::size_t R = optim::kLambScalarsPerTensor;
      REQUIRE(x.size() == R * want.scaling.size());
      for (std::size_t t = 0; R * t < x.size(); ++t) {
        cf.push_back(x[R * t]);
        F.push_back(x[R * t + 1]);
        k.push_back(x[R * t + 2]);
        CHECK(x[R * t + 2] > 0.0);  // k is set
      }
      CHECK(s.groups[0].optimizer.v_fresh.size() == s.groups[0].optimizer.m.size());
    }
  });
  CHECK(cf == want.coeff_freeze);
  CHECK(F == want.last_factor);
  CHECK(k == want.scaling);
}

TEST_CASE("OneBitLamb: wire bytes per step: the gradient all-reduce in the warm-up, one flat 1-bit exchange after it") {
  using comm::OpKind;
  using comm::ring_wire_bytes;
  for (int w : {2, 3}) {
    CAPTURE(w);
    const std::size_t one_bucket = 1 << 20;
    const Run got = zt_test::train_threads<LambEngine>(w, 6, options(/*freeze_step=*/3, 0.0, one_bucket));
    std::size_t n = 0;
    Mlp<float> model;
    model.parameters([&](std::string_view, auto& p) { n += p.numel(); });
    const compress::OneBitLayout l = compress::OneBitLayout::make(n, w);
    const std::uint64_t exchange = ring_wire_bytes(OpKind::all_to_all, l.padded / 8, w) +
                                   2 * ring_wire_bytes(OpKind::all_gather, 4 * static_cast<std::uint64_t>(w), w) +
                                   ring_wire_bytes(OpKind::all_gather, l.padded / 8, w);
    const std::uint64_t bound = ring_wire_bytes(OpKind::all_reduce, 16, w);
    const std::uint64_t grads = ring_wire_bytes(OpKind::all_reduce, 4 * got.flat_numel, w);
    const std::uint64_t loss = ring_wire_bytes(OpKind::all_reduce, 8, w);
    for (int s = 1; s < 3; ++s) CHECK(got.reports[s].comm_dense_bytes == got.reports[s].comm_wire_bytes);
    for (int s = 3; s < 6; ++s) {
      CAPTURE(s);
      CHECK(got.reports[s].comm_wire_bytes == exchange + bound + loss);
      CHECK(got.reports[s].comm_dense_bytes == grads + bound + loss);
    }
  }
}

TEST_CASE("OneBitLamb: a run resumed from state() equals the uninterrupted one bit for bit, loaded at a warm-up "
          "step or in the compression phase; without the rank-local part the errors and the tail start from zero") {
  const int world = 2;
  const EngineOptions o = options(/*freeze_step=*/5, 0.01);
  // Loaded in the warm-up (4 steps, then 6 more through the switch): nothing is lost, the errors are
  // still zero at the load, so all three runs agree.
  const zt_test::ResumeRuns warm = zt_test::resume_runs<LambEngine>(world, o, 4, 6);
  // Loaded in the compression phase: A, B and C are equal (errors and tail travel with the
  // state); D, loaded without them, differs from A whose errors carried on.
  const zt_test::ResumeRuns comp = zt_test::resume_runs<LambEngine>(world, o, 7, 3);
  for (std::size_t r = 0; r < world; ++r) {
    CAPTURE(r);
    CHECK(same_bits(warm.a[r], warm.b[r]));
    CHECK(same_bits(warm.b[r], warm.c[r]));
    CHECK(same_bits(warm.a[r], warm.d[r]));  // the warm-up's errors are still zero
    CHECK(comp.had_rank_local[r] == 1);
    CHECK(same_bits(comp.a[r], comp.b[r]));
    CHECK(same_bits(comp.b[r], comp.c[r]));
    CHECK_FALSE(same_bits(comp.a[r], comp.d[r]));
    const StepReport& first = comp.c_reports[r].front();
    CHECK(first.comm_dense_bytes > first.comm_wire_bytes);  // the phase came back with the step count
  }
}

TEST_CASE("OneBitLamb: bad options, bad states and fp32-kept parameters are refused with nothing changed") {
  comm::run_threads(1, [&](comm::ThreadsCommunicator& c) {
    Mlp<float> model;
    CHECK_THROWS_AS(LambEngine(c, model, options(-1)), config_error);
    EngineOptions o = options(3);
    o.onebit.lamb.coeff_beta = 1.5;
    CHECK_THROWS_WITH_AS(LambEngine(c, model, o), doctest::Contains("coeff_beta"), config_error);
    o = options(3);
    o.onebit.lamb.factor_min = -1;
    CHECK_THROWS_WITH_AS(LambEngine(c, model, o), doctest::Contains("factor_min"), config_error);

    o = options(3);  // bf16 storage emulated over float Params, the biases kept in fp32: two flat groups
    o.keep_fp32 = [](std::string_view name) { return name.ends_with(".bias"); };
    using Bf16Lamb = Engine<Partitioner<Stage<0>>, Optimizer<OneBitLamb>, Precision<bf16>>;
    CHECK_THROWS_WITH_AS(Bf16Lamb(c, model, o), doctest::Contains("one flat vector"), config_error);

    LambEngine e(c, model, options(2));
    zt_test::init_model(e, model, 42);
    (void)zt_test::train_boundaries(e, model, 0, 0, 4);
    const EngineState good = e.state();
    const std::vector<float> before = model.values();
    EngineState bad = good;
    bad.groups[0].optimizer.v_fresh.pop_back();
    CHECK_THROWS_WITH_AS(e.load_state(bad), doctest::Contains("fresh variance"), usage_error);
    bad = good;
    bad.groups[0].optimizer.tensor_scalars.resize(3);
    CHECK_THROWS_WITH_AS(e.load_state(bad), doctest::Contains("per-tensor scalars"), usage_error);
    bad = good;
    bad.groups[0].optimizer.tensor_scalars[2] = -0.5;  // tensor 0's k
    CHECK_THROWS_WITH_AS(e.load_state(bad), doctest::Contains("scaling coefficient >= 0"), usage_error);
    bad = good;
    bad.groups[0].optimizer.tensor_scalars[0] = std::numeric_limits<double>::quiet_NaN();
    CHECK_THROWS_WITH_AS(e.load_state(bad), doctest::Contains("must be finite"), usage_error);
    CHECK(same_bits(model.values(), before));
    CHECK(same_bits(e.state().groups[0].optimizer.v_fresh, good.groups[0].optimizer.v_fresh));
  });
  // A state without LAMB's extras does not load into an AdamW engine either way round.
  comm::run_threads(1, [&](comm::ThreadsCommunicator& c) {
    Mlp<float> model;
    LambEngine lamb(c, model, options(2));
    zt_test::init_model(lamb, model, 42);
    const EngineState s = lamb.state();
    Mlp<float> model2;
    Engine<Partitioner<Stage<0>>, Optimizer<AdamW>, Precision<fp32>> adam(c, model2, options(2));
    zt_test::init_model(adam, model2, 42);
    CHECK_THROWS_WITH_AS(adam.load_state(s), doctest::Contains("1-bit LAMB"), usage_error);
    CHECK_THROWS_WITH_AS(lamb.load_state(adam.state()), doctest::Contains("fresh variance"), usage_error);
  });
}

TEST_CASE("OneBitLamb: bf16 runs both phases with every rank in step") {
  std::vector<std::vector<float>> finals(2), initial(2);
  comm::run_threads(2, [&](comm::ThreadsCommunicator& c) {
    Mlp<bfloat16> model;
    Engine<Partitioner<Stage<0>>, Optimizer<OneBitLamb>, Precision<bf16>> e(c, model, options(3));
    zt_test::init_model(e, model, 42);
    initial[static_cast<std::size_t>(c.rank())] = model.values();
    const std::vector<StepReport> reps = zt_test::train_boundaries(e, model, c.rank(), 0, 8);
    CHECK(reps[2].comm_dense_bytes == reps[2].comm_wire_bytes);
    CHECK(reps.back().comm_dense_bytes > reps.back().comm_wire_bytes);
    finals[static_cast<std::size_t>(c.rank())] = model.values();
  });
  CHECK(same_bits(finals[0], finals[1]));
  CHECK_FALSE(same_bits(finals[0], initial[0]));
}

}  // namespace test_onebit_lamb
