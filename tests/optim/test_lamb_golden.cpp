// Optimizer<Lamb> against the fp64 numpy reference of SEMANTICS.md section 3 written by
// tests/golden/make_golden.py (100 steps, two groups, a zero tensor whose ratio is 1, a large tensor
// whose ratio clamps at max_coeff).
//
// Tolerance. The reference runs in fp64; zerotk in fp32 with fp64 norms. Per step zerotk's parameters
// carry a few fp32 roundings: of |p| (the final fma) and of the step step_size * ratio * |u|, with
// |u| <= ~3.2 + wd |p| for these betas, and the ratio <= max_coeff. Linear accumulation over t steps:
//     |p_zerotk - p_ref| <= t * 2^-21 * (|p| + 4 * step_size_max * max_coeff)
// The printed observed error stays well inside; a wrong variant (no bias correction) fails it by far.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "../golden/golden_fixture.hpp"
#include "zerotk/optim/optimizer.hpp"
#include "zerotk/optim/run.hpp"

namespace test_lamb_golden {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using zerotk::test::GoldenCase;
using zerotk::test::load_golden;

namespace {

std::vector<ParamGroup> lamb_groups(const GoldenCase& c, bool flip_bias_correction = false) {
  std::vector<ParamGroup> g;
  for (const auto& h : c.groups) {
    OptimizerOptions o;
    o.lr = h.lr;
    o.beta1 = h.beta1;
    o.beta2 = h.beta2;
    o.eps = h.eps;
    o.weight_decay = h.weight_decay;
    o.bias_correction = flip_bias_correction ? !h.bias_correction : h.bias_correction;
    o.lamb_min_coeff = h.min_coeff;
    o.lamb_max_coeff = h.max_coeff;
    g.push_back({o});
  }
  return g;
}

double run(const GoldenCase& c, bool flip, double* worst_abs) {
  optim::Standalone<Optimizer<Lamb>> opt(lamb_groups(c, flip));
  opt.init_state(c.n);
  std::vector<Segment> segs;
  double step_max = 0;
  for (std::size_t t = 0; t < c.numels.size(); ++t) {
    segs.push_back({c.offset(t), c.numels[t], c.tensor_group[t], static_cast<std::uint32_t>(t)});
  }
  for (const auto& h : c.groups) step_max = std::max(step_max, static_cast<double>(h.lr) * h.max_coeff * 1.1);
  std::vector<float> master = c.p0;
  std::vector<bfloat16> copy(c.n);
  double worst = 0;
  *worst_abs = 0;
  for (int t = 1; t <= c.steps; ++t) {
    opt.step(segs, master.data(), c.grads[static_cast<std::size_t>(t - 1)].data(), copy.data(), 1.0f);
    const auto& ref = c.params[static_cast<std::size_t>(t - 1)];
    for (std::size_t i = 0; i < c.n; ++i) {
      const double err = std::fabs(static_cast<double>(master[i]) - ref[i]);
      worst = std::max(worst, err / (t * std::ldexp(1.0, -21) * (std::fabs(ref[i]) + 4 * step_max)));
      *worst_abs = std::max(*worst_abs, err);
      if (!flip) REQUIRE(copy[i].bits == float_to_bf16_bits(master[i]));
    }
  }
  return worst;
}

void check_case(const std::string& name) {
  const GoldenCase c = load_golden(name);
  REQUIRE(c.optimizer == "lamb");
  double abs = 0;
  const double ratio = run(c, false, &abs);
  MESSAGE(name << ": max |p - p_ref| = " << abs << ", max error / tolerance = " << ratio);
  CHECK(ratio <= 1.0);
  double wrong_abs = 0;
  CHECK(run(c, true, &wrong_abs) > 100.0);
}

}  // namespace

TEST_CASE("Optimizer<Lamb> follows the LAMB reference for 100 steps (two groups, ratio 1 and clamped)") {
  check_case("lamb");
}

TEST_CASE("Optimizer<Lamb> without bias correction follows the reference") { check_case("lamb_nobc"); }

}  // namespace test_lamb_golden
