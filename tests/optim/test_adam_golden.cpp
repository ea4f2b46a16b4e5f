// Optimizer<Adam> / Optimizer<AdamW> against torch.optim.Adam / AdamW trajectories (100 steps, fp32)
// written by tests/golden/make_golden.py.
//
// Tolerance. zerotk uses the fused form p -= lr * (m * (1/bc1) / (sqrt(v * (1/bc2)) + eps) + wd p)
// with FMAs; torch decays first (p *= 1 - lr wd), forms sqrt(v) / sqrt(bc2) + eps, multiplies by
// lr / bc1 and adds. Both are exact in real arithmetic and differ in how each step's ~8 operations
// round. Per step the two results differ by at most a few ulps of |p| (the final add) plus a few
// ulps of the step lr * |update| <= lr * (1 + wd |p|) * max|m_hat / sqrt(v_hat)|, which is <= ~3.2
// for these betas. Such per-step errors add up at most linearly over t steps (m and v forget theirs
// geometrically), so after step t we allow
//     |p_zerotk - p_torch| <= t * 2^-21 * (|p| + 4 * lr)            (about 16 ulps per step).
// The observed error is printed (MESSAGE); it stays below a quarter of the bound. To show the bound bites, the
// same comparison with a deliberately wrong variant (bias correction off) must fail it by orders of
// magnitude.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "../golden/golden_fixture.hpp"
#include "zerotk/optim/optimizer.hpp"
#include "zerotk/optim/run.hpp"

namespace test_adam_golden {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using zerotk::test::GoldenCase;
using zerotk::test::load_golden;

namespace {

std::vector<ParamGroup> groups_of(const GoldenCase& c, bool bias_correction = true) {
  std::vector<ParamGroup> g;
  for (const auto& h : c.groups) {
    OptimizerOptions o;
    o.lr = h.lr;
    o.beta1 = h.beta1;
    o.beta2 = h.beta2;
    o.eps = h.eps;
    o.weight_decay = h.weight_decay;
    o.bias_correction = bias_correction && h.bias_correction;
    o.lamb_min_coeff = h.min_coeff;
    o.lamb_max_coeff = h.max_coeff;
    g.push_back({o});
  }
  return g;
}

std::vector<Segment> segments_of(const GoldenCase& c) {
  std::vector<Segment> s;
  for (std::size_t t = 0; t < c.numels.size(); ++t) {
    s.push_back({c.offset(t), c.numels[t], c.tensor_group[t], static_cast<std::uint32_t>(t)});
  }
  return s;
}

float max_lr(const GoldenCase& c) {
  float lr = 0;
  for (const auto& g : c.groups) lr = std::max(lr, g.lr);
  return lr;
}

// Largest |error| / allowed over all steps and elements (<= 1 passes), and the largest |error|.
struct Deviation {
  double worst_ratio = 0, worst_abs = 0;
};

template <class Opt>
Deviation run_against(const GoldenCase& c, bool bias_correction, float grad_multiplier = 1.0f) {
  optim::Standalone<Opt> opt(groups_of(c, bias_correction));
  opt.init_state(c.n);
  const auto segs = segments_of(c);
  std::vector<float> master = c.p0, g(c.n);
  Deviation d;
  const double lr = max_lr(c);
  for (int t = 1; t <= c.steps; ++t) {
    const auto& ref = c.params[static_cast<std::size_t>(t - 1)];
    for (std::size_t i = 0; i < c.n; ++i) g[i] = c.grads[static_cast<std::size_t>(t - 1)][i] * grad_multiplier;
    opt.step(segs, master.data(), g.data(), nullptr, 1.0f / grad_multiplier);
    for (std::size_t i = 0; i < c.n; ++i) {
      const double err = std::fabs(static_cast<double>(master[i]) - ref[i]);
      const double allowed = t * std::ldexp(1.0, -21) * (std::fabs(ref[i]) + 4 * lr);
      d.worst_ratio = std::max(d.worst_ratio, err / allowed);
      d.worst_abs = std::max(d.worst_abs, err);
    }
  }
  return d;
}

template <class Opt>
void check_case(const char* name) {
  const GoldenCase c = load_golden(name);
  REQUIRE(c.steps == 100);
  const Deviation d = run_against<Opt>(c, true);
  MESSAGE(std::string(name) << ": max |p - p_torch| = " << d.worst_abs << ", max error / tolerance = " << d.worst_ratio);
  CHECK(d.worst_ratio <= 1.0);

  // The final moments match torch's state too (same rounding argument, no step-size factor).
  optim::Standalone<Opt> opt(groups_of(c));
  opt.init_state(c.n);
  const auto segs = segments_of(c);
  std::vector<float> master = c.p0;
  for (int t = 0; t < c.steps; ++t) opt.step(segs, master.data(), c.grads[static_cast<std::size_t>(t)].data(), nullptr, 1.0f);
  const auto st = opt.state();
  CHECK(st.step == 100);
  for (std::size_t i = 0; i < c.n; ++i) {
    CHECK(st.m[i] == doctest::Approx(c.m[i]).epsilon(1e-5).scale(1e-6));
    CHECK(st.v[i] == doctest::Approx(c.v[i]).epsilon(1e-5).scale(1e-12));
  }

  // Negative control: without bias correction the trajectory leaves the tolerance by far.
  const Deviation wrong = run_against<Opt>(c, false);
  CHECK(wrong.worst_ratio > 100.0);
}

}  // namespace

TEST_CASE("Optimizer<AdamW> follows torch.optim.AdamW for 100 steps") { check_case<Optimizer<AdamW>>("adamw"); }

TEST_CASE("Optimizer<Adam> (L2 decay) follows torch.optim.Adam for 100 steps") {
  check_case<Optimizer<Adam>>("adam_l2");
}

TEST_CASE("Optimizer<AdamW> with a no-decay group follows torch's param groups") {
  check_case<Optimizer<AdamW>>("adamw_groups");
}

TEST_CASE("scaled gradients with the inverse factor folded in give the same bits") {
  // Power-of-two loss scales are exact: g * 2^k * 2^-k == g, so the trajectories are bitwise equal.
  const GoldenCase c = load_golden("adamw");
  const auto segs = segments_of(c);
  optim::Standalone<Optimizer<AdamW>> a(groups_of(c)), b(groups_of(c));
  a.init_state(c.n);
  b.init_state(c.n);
  std::vector<float> pa = c.p0, pb = c.p0, g(c.n);
  for (int t = 0; t < 20; ++t) {
    const auto& gt = c.grads[static_cast<std::size_t>(t)];
    for (std::size_t i = 0; i < c.n; ++i) g[i] = gt[i] * 1024.0f;
    a.step(segs, pa.data(), gt.data(), nullptr, 1.0f);
    b.step(segs, pb.data(), g.data(), nullptr, 1.0f / 1024.0f);
  }
  CHECK(std::memcmp(pa.data(), pb.data(), c.n * sizeof(float)) == 0);
}

}  // namespace test_adam_golden
