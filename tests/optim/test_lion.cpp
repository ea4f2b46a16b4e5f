// Optimizer<Lion> (optim/lion.hpp) through optim::Standalone: bitwise against the formula written
// here on every host ISA and thread count, the working copy's values without a state change (the
// two-pass step's first pass), one moment only, DeepSpeed's FusedLion at a zero sign argument, and
// the Lion paper's / torch formula to a rounding.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "../kernels/kernel_test_util.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/kernels/host/simd.hpp"
#include "zerotk/optim/optimizer.hpp"
#include "zerotk/optim/run.hpp"

namespace test_lion {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
namespace test = zerotk::test;

static_assert(optim::ElementwiseOptimizer<Optimizer<Lion>>);
static_assert(!optim::ElementwiseOptimizer<Optimizer<AdamW>>);  // Adam keeps its own tuned kernels
static_assert(optim::moments_v<Optimizer<Lion>> == 1 && optim::moments_v<Optimizer<AdamW>> == 2);

namespace {

// Two tensors per group, sizes that leave SIMD tails; group 1 without weight decay.
const std::vector<Segment> kSegments = {{0, 1000, 0, 0}, {1000, 37, 1, 1}, {1037, 4097, 0, 2}, {5134, 3, 1, 3}};
constexpr std::size_t kN = 5137;

std::vector<ParamGroup> groups() {
  OptimizerOptions a, b;
  a.lr = 3e-3;
  a.beta1 = 0.9;
  a.beta2 = 0.99;
  a.weight_decay = 0.1;
  b = a;
  b.lr = 1e-3;
  b.weight_decay = 0.0;
  return {ParamGroup{a}, ParamGroup{b}};
}

/// The formula of optim/lion.hpp, element by element, with the same roundings.
void reference_step(const std::vector<ParamGroup>& gs, std::vector<float>& p, std::vector<float>& m,
                    const std::vector<float>& g, float scale) {
  for (const Segment& s : kSegments) {
    const OptimizerOptions& o = gs[s.group].options;
    const float lr = static_cast<float>(o.lr), b1 = static_cast<float>(o.beta1), b2 = static_cast<float>(o.beta2);
    const float decay = static_cast<float>(1.0 - double(lr) * double(static_cast<float>(o.weight_decay)));
    const float omb1 = static_cast<float>(1.0 - double(b1)), omb2 = static_cast<float>(1.0 - double(b2));
    for (std::size_t i = s.offset; i < s.offset + s.numel; ++i) {
      const float gi = g[i] * scale;
      const float c = std::fma(b1, m[i], omb1 * gi);
      p[i] = std::fma(p[i], decay, c > 0.0f ? -lr : lr);
      m[i] = std::fma(b2, m[i], omb2 * gi);
    }
  }
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("Lion equals its formula bit for bit on every host ISA and thread count, over three steps") {
  const std::vector<float> p0 = test::randn(kN, 1), g1 = test::randn(kN, 2), g2 = test::randn(kN, 3);
  for (const auto isa : test::supported_isas()) {
    kernels::host::simd::IsaCap cap(isa);
    for (int threads : {1, 3}) {
      CAPTURE(kernels::host::simd::to_string(isa));
      CAPTURE(threads);
      test::Threads th(threads);
      optim::Standalone<Optimizer<Lion>> opt(groups());
      MemoryLedger ledger;
      opt.init_state(kN, &ledger);
      CHECK(ledger.live(MemorySpace::host, MemoryCategory::optimizer_state) == kN * sizeof(float));  // m alone
      CHECK(opt.exp_avg_sq().empty());
      std::vector<float> p = p0, rp = p0, rm(kN, 0.0f);
      std::vector<bfloat16> out(kN);
      for (int step = 0; step < 3; ++step) {
        const std::vector<float>& g = step % 2 ? g2 : g1;
        opt.step(kSegments, p.data(), g.data(), out.data(), 0.5f);
        reference_step(opt.groups(), rp, rm, g, 0.5f);
      }
      CHECK(same_bits(p, rp));
      CHECK(same_bits(std::vector<float>(opt.exp_avg().begin(), opt.exp_avg().end()), rm));
      bool out_ok = true;
      for (std::size_t i = 0; i < kN; ++i) out_ok = out_ok && out[i] == bfloat16(p[i]);
      CHECK(out_ok);
      CHECK(opt.step_count() == 3);
    }
  }
}

TEST_CASE("Lion's values() are step()'s working copy, with the state and the step count unchanged") {
  const std::vector<float> p0 = test::randn(kN, 4), g = test::randn(kN, 5);
  optim::Standalone<Optimizer<Lion>> a(groups()), b(groups());
  a.init_state(kN);
  b.init_state(kN);
  std::vector<float> pa = p0, pb = p0, m_before(kN);
  std::vector<half> out_a(kN), out_b(kN);
  a.step(kSegments, pa.data(), g.data(), out_a.data(), 1.0f);  // a moment that is not zero
  b.step(kSegments, pb.data(), g.data(), out_b.data(), 1.0f);
  std::memcpy(m_before.data(), b.exp_avg().data(), kN * sizeof(float));
  const std::vector<float> pb_before = pb;
  optim::Run<Optimizer<Lion>, HostSpace>::values<float, half>(b, kSegments, pb.data(), b.moments(), g.data(),
                                                             out_b.data(), 1.0f);
  CHECK(same_bits(pb, pb_before));
  CHECK(std::memcmp(b.exp_avg().data(), m_before.data(), kN * sizeof(float)) == 0);
  CHECK(b.step_count() == 1);
  a.step(kSegments, pa.data(), g.data(), out_a.data(), 1.0f);
  CHECK(std::memcmp(out_a.data(), out_b.data(), kN * sizeof(half)) == 0);
}

TEST_CASE("Lion at a zero sign argument steps by +lr (DeepSpeed's FusedLion), and agrees with torch's formula") {
  optim::Standalone<Optimizer<Lion>> opt({ParamGroup{[] {
    OptimizerOptions o;
    o.lr = 0.25;
    o.weight_decay = 0.0;
    return o;
  }()}});
  opt.init_state(3);
  std::vector<float> p = {1.0f, 1.0f, 1.0f};
  const std::vector<float> g = {0.0f, 2.0f, -2.0f};  // c = 0, > 0, < 0
  opt.step(std::vector<Segment>{{0, 3, 0, 0}}, p.data(), g.data(), nullptr, 1.0f);
  CHECK(p == std::vector<float>{1.25f, 0.75f, 1.25f});
  CHECK(opt.exp_avg()[1] == doctest::Approx(0.002));  // (1 - 0.999) * 2

  // torch's Lion (lucidrains' lion-pytorch, which the paper's code follows): p *= 1 - lr wd, then
  // p -= lr sign(c), m = b2 m + (1 - b2) g, in fp32. The same steps up to one rounding of each update.
  const std::vector<float> p0 = test::randn(kN, 6), g1 = test::randn(kN, 7);
  optim::Standalone<Optimizer<Lion>> z(groups());
  z.init_state(kN);
  std::vector<float> pz = p0;
  z.step(kSegments, pz.data(), g1.data(), nullptr, 1.0f);
  double worst = 0;
  for (const Segment& s : kSegments) {
    const OptimizerOptions& o = z.groups()[s.group].options;
    for (std::size_t i = s.offset; i < s.offset + s.numel; ++i) {
      const float c = static_cast<float>((1.0 - o.beta1) * g1[i]);  // m = 0 before the first step
      const float sign = c > 0 ? 1.0f : (c < 0 ? -1.0f : 0.0f);
      const float torch = p0[i] * static_cast<float>(1.0 - o.lr * o.weight_decay) - static_cast<float>(o.lr) * sign;
      worst = std::max(worst, std::fabs(double(torch) - pz[i]));
    }
  }
  CHECK(worst <= 1e-6);
}

TEST_CASE("Lion's state is m alone: state() and load_state() round trip, Adam's state is refused") {
  optim::Standalone<Optimizer<Lion>> opt(groups());
  opt.init_state(kN);
  std::vector<float> p = test::randn(kN, 8);
  const std::vector<float> g = test::randn(kN, 9);
  opt.step(kSegments, p.data(), g.data(), nullptr, 1.0f);
  const OptimizerState s = opt.state();
  CHECK(s.m.size() == kN);
  CHECK(s.v.empty());
  optim::Standalone<Optimizer<Lion>> back(groups());
  back.init_state(kN);
  back.load_state(s);
  CHECK(back.step_count() == 1);
  CHECK(std::memcmp(back.exp_avg().data(), opt.exp_avg().data(), kN * sizeof(float)) == 0);
  OptimizerState adam = s;
  adam.v.assign(kN, 0.0f);  // a two-moment state
  CHECK_THROWS_WITH_AS(back.load_state(adam), doctest::Contains("and 1 moments"), usage_error);
}

}  // namespace test_lion
