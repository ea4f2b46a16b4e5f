// Optimizer<ZeroOneAdam> through optim::Standalone on one rank (no exchange): the sync's closed form,
// the lr weighting of the rebuilt momentum over an interval with two learning rates, a sync over an
// interval whose lr sum is 0, the set-up step,
// the accumulator Standalone allocates, load resetting u and L, and the error for a missing
// accumulator. The whole algorithm over W ranks is tested in the engine (tests/engine).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../kernels/kernel_test_util.hpp"
#include "zerotk/optim/optimizer.hpp"
#include "zerotk/optim/run.hpp"

namespace test_zero_one_adam {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using Kind = optim::ZeroOneSchedule::Kind;

namespace {

using zerotk::test::randn;

bool same_bits(const float* a, const float* b, std::size_t n) { return n == 0 || std::memcmp(a, b, n * sizeof(float)) == 0; }

constexpr std::size_t kN = 1000;

struct Fixture {
  optim::Standalone<Optimizer<ZeroOneAdam>> opt;
  std::vector<Segment> segs{Segment{0, 600, 0, 0}, Segment{600, kN - 600, 0, 1}};
  std::vector<float> p = randn(kN, 1);

  explicit Fixture(double lr = 1e-2, double wd = 0.0)
      : opt({ParamGroup{{.lr = lr, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-3, .weight_decay = wd}}}) {
    opt.set_schedule({.var_freeze_step = 0, .local_step_scaler = 1000, .local_step_clipper = 1000});
    opt.init_state(kN);
  }
  void step(std::uint64_t seed) { opt.step(std::span<const Segment>(segs), p.data(), randn(kN, seed).data(), nullptr, 1.0f); }
};

}  // namespace

TEST_CASE("ZeroOneAdam (standalone): set-up step, a var step, then a sync at W = 1 in closed form") {
  Fixture f;
  const std::vector<float> p0 = f.p;
  CHECK(f.opt.next_kind() == Kind::init);
  f.step(10);
  CHECK(f.opt.step_count() == 1);
  CHECK(same_bits(f.p.data(), p0.data(), kN));  // nothing changes at t = 1
  CHECK(f.opt.next_kind() == Kind::var);
  CHECK_FALSE(f.opt.gradients_local());
  f.step(11);
  CHECK(f.opt.next_kind() == Kind::sync);  // var_freeze_step 0: frozen from t = 3, I_l = 1
  CHECK(f.opt.gradients_local());

  // t = 3: a local step then its sync. With one rank and I_l = 1: u = d, p = ((p + d) - d) + (d den) / den,
  // m = -((d den) / L) with L = lr.
  const std::vector<float> p1 = f.p;
  const std::vector<float> m1(f.opt.exp_avg().begin(), f.opt.exp_avg().end());
  const std::vector<float> v(f.opt.exp_avg_sq().begin(), f.opt.exp_avg_sq().end());
  const std::vector<float> g = randn(kN, 12);
  f.step(12);
  const float lr = 1e-2f, b1 = 0.9f, omb1 = static_cast<float>(1.0 - static_cast<double>(0.9f)), eps = 1e-3f;
  for (std::size_t i = 0; i < kN; ++i) {
    CAPTURE(i);
    const float m = std::fma(b1, m1[i], omb1 * g[i]);
    const float den = std::sqrt(v[i]) + eps;
    const float d = -lr * (m / den);
    const float ud = d * den;
    const float want_p = ((p1[i] + d) - d) + ud / den;
    const float want_m = -(ud / lr);
    REQUIRE(std::memcmp(&f.p[i], &want_p, 4) == 0);
    REQUIRE(std::memcmp(&f.opt.exp_avg()[i], &want_m, 4) == 0);
    REQUIRE(f.opt.exp_avg_sq()[i] == v[i]);  // frozen
  }
  CHECK(f.opt.lr_sums()[0] == 0.0);
}

TEST_CASE("ZeroOneAdam (standalone): the rebuilt momentum is weighted by the interval's lr sum, in double") {
  Fixture f;
  f.opt.set_schedule({.var_freeze_step = 0, .local_step_scaler = 1, .local_step_clipper = 2});
  // t = 1 set-up, t = 2 var, t = 3 sync (then I_l = 2), t = 4 sync (a multiple of 2), t = 5 local,
  // t = 6 sync: one interval with a local step before its sync.
  const optim::ZeroOneSchedule& s = f.opt.schedule();
  REQUIRE(s.kind(3) == Kind::sync);
  REQUIRE(s.kind(4) == Kind::sync);
  REQUIRE(s.kind(5) == Kind::local);
  REQUIRE(s.kind(6) == Kind::sync);
  for (std::uint64_t k = 0; k < 4; ++k) f.step(20 + k);
  const double lr1 = 1e-2, lr2 = 3e-3;
  f.opt.groups()[0].options.lr = lr1;
  f.step(30);  // t = 5: local
  CHECK(f.opt.lr_sums()[0] == lr1);
  const std::vector<float> p5 = f.p;
  const std::vector<float> m5(f.opt.exp_avg().begin(), f.opt.exp_avg().end());
  const std::vector<float> v(f.opt.exp_avg_sq().begin(), f.opt.exp_avg_sq().end());
  // u after t = 5 is p5 - p4's d; recompute it: u5 = d5 exactly (u was 0 after the t = 4 sync).
  f.opt.groups()[0].options.lr = lr2;
  const std::vector<float> g6 = randn(kN, 31);
  // Read u5 from the accumulator the Standalone gave the optimizer.
  const std::vector<float> u5(f.opt.accumulator(), f.opt.accumulator() + kN);
  f.step(31);  // t = 6: sync
  const auto L = static_cast<float>(lr1 + lr2);
  const float b1 = 0.9f, omb1 = static_cast<float>(1.0 - static_cast<double>(0.9f)), eps = 1e-3f;
  for (std::size_t i = 0; i < kN; ++i) {
    CAPTURE(i);
    const float m = std::fma(b1, m5[i], omb1 * g6[i]);
    const float den = std::sqrt(v[i]) + eps;
    const float d = -static_cast<float>(lr2) * (m / den);
    const float u = (u5[i] + d) * den;
    const float want_m = -(u / L);
    const float want_p = ((p5[i] + d) - (u5[i] + d)) + u / den;
    REQUIRE(std::memcmp(&f.opt.exp_avg()[i], &want_m, 4) == 0);
    REQUIRE(std::memcmp(&f.p[i], &want_p, 4) == 0);
    REQUIRE(f.opt.accumulator()[i] == 0.0f);
  }
  bool any_u = false;
  for (float x : u5) any_u = any_u || x != 0.0f;
  CHECK(any_u);  // the local step really accumulated
}

TEST_CASE("ZeroOneAdam (standalone): a sync after an interval of lr 0 keeps m (DeepSpeed's m = -(u / 0) is NaN)") {
  Fixture f;
  f.step(50);  // t = 1 set-up
  f.step(51);  // t = 2 var: m and v move
  REQUIRE(f.opt.next_kind() == Kind::sync);
  f.opt.groups()[0].options.lr = 0.0;  // e.g. a schedule at its end, or training paused
  const std::vector<float> p2 = f.p;
  const std::vector<float> m2(f.opt.exp_avg().begin(), f.opt.exp_avg().end());
  const std::vector<float> g = randn(kN, 52);
  f.step(52);  // t = 3: a local step with lr 0, then the sync over L = 0
  const float b1 = 0.9f, omb1 = static_cast<float>(1.0 - static_cast<double>(0.9f));
  for (std::size_t i = 0; i < kN; ++i) {
    CAPTURE(i);
    const float want_m = std::fma(b1, m2[i], omb1 * g[i]);  // the local step's m, kept by the sync
    REQUIRE(std::memcmp(&f.opt.exp_avg()[i], &want_m, 4) == 0);
    REQUIRE(std::isfinite(f.p[i]));
    REQUIRE(f.p[i] == p2[i]);  // nothing moved
  }
  f.opt.groups()[0].options.lr = 1e-2;  // training goes on from there
  f.step(53);
  for (std::size_t i = 0; i < kN; ++i) REQUIRE(std::isfinite(f.p[i]));
  CHECK_FALSE(same_bits(f.p.data(), p2.data(), kN));
}

TEST_CASE("ZeroOneAdam (standalone): load_state zeroes u and L; a missing accumulator is a usage error") {
  Fixture f;
  f.opt.set_schedule({.var_freeze_step = 0, .local_step_scaler = 1000, .local_step_clipper = 1000});
  for (std::uint64_t k = 0; k < 2; ++k) f.step(40 + k);
  f.opt.set_schedule({.var_freeze_step = 0, .local_step_scaler = 1, .local_step_clipper = 8});
  // I_l doubles every frozen step: t = 3 sync (I_l 1 -> 2), t = 4 sync (2 -> 4), t = 5 local.
  f.step(42);
  f.step(43);
  REQUIRE(f.opt.next_kind() == Kind::local);
  f.step(44);
  CHECK(f.opt.lr_sums()[0] > 0.0);
  const OptimizerState st = f.opt.state();
  f.opt.load_state(st);
  CHECK(f.opt.lr_sums()[0] == 0.0);
  for (std::size_t i = 0; i < kN; ++i) REQUIRE(f.opt.accumulator()[i] == 0.0f);
  CHECK(f.opt.step_count() == 5);

  // The bare optimizer without an accumulator: fine for the set-up and var steps, an error naming
  // the step kind at the first step that needs u, with nothing changed.
  Optimizer<ZeroOneAdam> bare({ParamGroup{{.lr = 1e-3}}});
  bare.set_schedule({.var_freeze_step = 0});
  std::vector<float> p = randn(8, 2), m(8, 0.0f), v(8, 0.0f);
  const std::vector<Segment> segs{Segment{0, 8, 0, 0}};
  const std::vector<float> g = randn(8, 3);
  const optim::Moments mv{m.data(), v.data(), 8};
  for (int t = 1; t <= 2; ++t) {
    optim::Run<Optimizer<ZeroOneAdam>, HostSpace>::step<float, void>(bare, segs, p.data(), mv, g.data(), nullptr, 1.0f,
                                                                     [](std::span<double>) {});
  }
  const std::vector<float> before = p;
  try {
    optim::Run<Optimizer<ZeroOneAdam>, HostSpace>::step<float, void>(bare, segs, p.data(), mv, g.data(), nullptr, 1.0f,
                                                                     [](std::span<double>) {});
    FAIL("no error");
  } catch (const usage_error& e) {
    CHECK(std::string(e.what()).find("sync") != std::string::npos);
  }
  CHECK(bare.step_count() == 2);
  CHECK(same_bits(p.data(), before.data(), 8));
}

}  // namespace test_zero_one_adam
