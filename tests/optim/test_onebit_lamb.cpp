// Optimizer<OneBitLamb> without an engine: the host-side scalars of a step (trust ratio and its EMA,
// scaling coefficients, the factor's clamps) against closed forms, the standalone form's buffers and
// state round trip, and the errors (an all-zero momentum at the switch, missing buffers), each with
// nothing changed. The whole algorithm over W ranks is tested in the engine (tests/engine).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "../kernels/kernel_test_util.hpp"
#include "zerotk/optim/optimizer.hpp"
#include "zerotk/optim/run.hpp"

namespace test_onebit_lamb {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using Phase = Optimizer<OneBitLamb>::Phase;

namespace {

using zerotk::test::randn;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

constexpr std::size_t kN = 900;

struct Fixture {
  optim::Standalone<Optimizer<OneBitLamb>> opt;
  std::vector<Segment> segs{Segment{0, 500, 0, 0}, Segment{500, kN - 500, 0, 1}};
  std::vector<float> p = randn(kN, 1);

  explicit Fixture(std::int64_t freeze = 3, double wd = 0.0)
      : opt({ParamGroup{{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-3, .weight_decay = wd}}}) {
    opt.set_freeze_step(freeze);
    opt.init_state(kN);
  }
  void step(const std::vector<float>& g) { opt.step(std::span<const Segment>(segs), p.data(), g.data(), nullptr, 1.0f); }
  void step(std::uint64_t seed) { step(randn(kN, seed)); }
};

}  // namespace

TEST_CASE("OneBitLamb (standalone): phases, v_f = v at freeze_step, scaling coefficients k = U / rms(m)") {
  Fixture f(/*freeze_step=*/3);
  const std::vector<float> p0 = f.p;
  CHECK(f.opt.next_phase() == Phase::first);
  f.step(10);
  CHECK(same_bits(f.p, p0));  // t = 1 changes nothing
  CHECK(f.opt.next_phase() == Phase::warmup);
  f.step(11);
  const std::vector<float> fresh_before(f.opt.fresh_variance(), f.opt.fresh_variance() + kN);
  for (float x : fresh_before) REQUIRE(x == 0.0f);  // t = 2 < freeze_step: v_f untouched
  f.step(12);                                        // t = 3 = freeze_step: v_f = v
  CHECK(std::memcmp(f.opt.fresh_variance(), f.opt.exp_avg_sq().data(), kN * sizeof(float)) == 0);
  CHECK(f.opt.next_phase() == Phase::compressed);
  CHECK(f.opt.gradients_local());
  for (const optim::LambTensorState& t : f.opt.tensor_states()) {
    CHECK(t.coeff_freeze > 0.0);  // two warm-up steps moved the EMA off 0
    CHECK_FALSE(t.scaled());
  }
  // The first compression step sets k from the momentum before it: U / (||m_t|| / sqrt(n_t)).
  double rms[2];
  for (int t = 0; t < 2; ++t) {
    const Segment& s = f.segs[static_cast<std::size_t>(t)];
    double sum = 0;
    for (std::size_t i = s.offset; i < s.offset + s.numel; ++i) sum += double(f.opt.exp_avg()[i]) * f.opt.exp_avg()[i];
    rms[t] = std::sqrt(sum) / std::sqrt(static_cast<double>(s.numel));
  }
  f.step(13);
  const double U = (rms[0] + rms[1]) / 2;
  for (int t = 0; t < 2; ++t) {
    CHECK(f.opt.tensor_states()[static_cast<std::size_t>(t)].scaled());
    CHECK(f.opt.tensor_states()[static_cast<std::size_t>(t)].scaling == doctest::Approx(U / rms[t]).epsilon(1e-12));
  }
  // The compression step reports c_f * f as each tensor's coefficient (DeepSpeed's get_lamb_coeffs).
  for (std::size_t t = 0; t < 2; ++t) {
    const optim::LambTensorState& s = f.opt.tensor_states()[t];
    CHECK(f.opt.last_coefficients()[t] == s.coeff_freeze * s.last_factor);
  }
}

TEST_CASE("OneBitLamb: the trust ratio is clamped by max_coeff, then min_coeff; c_f moves only when r != 1") {
  Optimizer<OneBitLamb> opt({ParamGroup{{.lr = 0.5, .lamb_min_coeff = 0.25, .lamb_max_coeff = 4.0}}});
  opt.set_lamb_options({.coeff_beta = 0.75});
  opt.reserve_tensors(4);
  const std::vector<Segment> segs{{0, 1, 0, 0}, {1, 1, 0, 1}, {2, 1, 0, 2}, {3, 1, 0, 3}};
  // ||p||^2, ||upd||^2 per tensor: ratio 10 (-> 4), 0.01 (-> 0.25), 2 (kept), and ||p|| = 0 (-> 1).
  const std::vector<double> sums{100.0, 1.0, 1e-4, 1.0, 4.0, 1.0, 0.0, 1.0};
  const std::vector<float> steps = opt.warmup_steps(segs, sums);
  CHECK(steps == std::vector<float>{2.0f, 0.125f, 1.0f, 0.5f});
  CHECK(opt.tensor_states()[0].coeff_freeze == 0.25 * 4.0);
  CHECK(opt.tensor_states()[1].coeff_freeze == 0.25 * 0.25);
  CHECK(opt.tensor_states()[2].coeff_freeze == 0.25 * 2.0);
  CHECK(opt.tensor_states()[3].coeff_freeze == 0.0);  // r = 1: no update (DeepSpeed's rule)
}

TEST_CASE("OneBitLamb: the factor is clamped to [factor_min, factor_max], then to within factor_threshold of F") {
  Optimizer<OneBitLamb> opt({ParamGroup{{.lr = 1.0, .weight_decay = 0.1}}});
  opt.set_lamb_options({.coeff_beta = 0.9, .factor_max = 4.0, .factor_min = 0.5, .factor_threshold = 0.1});
  opt.reserve_tensors(3);
  OptimizerState s;
  s.v_fresh = {};
  s.tensor_scalars = {2.0, 1.0, 1.0, 2.0, 1.0, 1.0, 2.0, 1.0, 1.0};  // c_f 2, F 1, k 1
  opt.load_extra(s);
  const std::vector<Segment> segs{{0, 1, 0, 0}, {1, 1, 0, 1}, {2, 1, 0, 2}};
  // Tensor 0: f = 9 -> 4 -> 1.1 (threshold). Tensor 1: f = 0.95, rho = 0.5 -> 0.975 (inside both).
  // Tensor 2: ||upd|| = 0: rho is min(1, NaN) = 1 as in Python, f = 0.2 -> 0.5 -> 0.9.
  const std::vector<double> fmax{9.0, 0.95, 0.2}, u0{1.0, 1.0, 0.0}, upd{1.0, 4.0, 0.0};
  const std::vector<float> steps = opt.compression_steps(segs, fmax, u0, upd);
  CHECK(opt.tensor_states()[0].last_factor == 1.0 * (1.0 + 0.1));
  CHECK(opt.tensor_states()[1].last_factor == 0.95 * 0.5 + 0.5);
  CHECK(opt.tensor_states()[2].last_factor == 1.0 * (1.0 - 0.1));
  CHECK(steps[0] == static_cast<float>(2.0 * 1.1));
  CHECK(steps[1] == static_cast<float>(2.0 * 0.975));
  CHECK(steps[2] == static_cast<float>(2.0 * 0.9));
}

TEST_CASE("OneBitLamb (standalone): state() and load_state() carry v_f and the per-tensor scalars bit for bit") {
  Fixture a, b;
  for (std::uint64_t s = 0; s < 5; ++s) a.step(20 + s);
  const OptimizerState st = a.opt.state();
  CHECK(st.v_fresh.size() == kN);
  CHECK(st.tensor_scalars.size() == 2 * optim::kLambScalarsPerTensor);
  b.opt.load_state(st);
  b.p = a.p;
  for (std::uint64_t s = 5; s < 8; ++s) {
    a.step(20 + s);
    b.step(20 + s);
  }
  CHECK(same_bits(a.p, b.p));
  CHECK(same_bits(a.opt.state().v_fresh, b.opt.state().v_fresh));
  CHECK(a.opt.state().tensor_scalars == b.opt.state().tensor_scalars);
}

TEST_CASE("OneBitLamb: an all-zero momentum at the switch and missing buffers are errors with nothing changed") {
  Fixture f(/*freeze_step=*/2);
  std::vector<float> g = randn(kN, 3);
  for (std::size_t i = 500; i < kN; ++i) g[i] = 0.0f;  // tensor 1 never gets a gradient
  f.step(g);
  f.step(g);  // t = 2: the only warm-up step
  const std::vector<float> p = f.p;
  const OptimizerState before = f.opt.state();
  CHECK_THROWS_WITH_AS(f.step(g), doctest::Contains("tensor 1"), numerics_error);
  CHECK(same_bits(f.p, p));
  CHECK(f.opt.step_count() == before.step);
  CHECK(same_bits(f.opt.state().m, before.m));
  CHECK(f.opt.state().tensor_scalars == before.tensor_scalars);

  Optimizer<OneBitLamb> bare({ParamGroup{}});
  std::vector<float> m(kN), v(kN), master(kN);
  const std::vector<Segment> segs{{0, kN, 0, 0}};
  CHECK_THROWS_WITH_AS((optim::Run<Optimizer<OneBitLamb>, HostSpace>::step<float, void>(
                           bare, segs, master.data(), {m.data(), v.data(), kN}, g.data(), nullptr, 1.0f,
                           [](std::span<double>) {})),
                       doctest::Contains("set_buffers"), usage_error);
  CHECK(bare.step_count() == 0);
  CHECK_THROWS_AS(bare.set_lamb_options({.coeff_beta = -0.1}), config_error);
  CHECK_THROWS_AS(bare.set_lamb_options({.factor_threshold = std::numeric_limits<double>::infinity()}), config_error);
}

}  // namespace test_onebit_lamb
