// The per-element math of kernels/elementwise.hpp against fp64 references written here from
// SEMANTICS.md section 3, and the inf/NaN bit tests against std::isfinite.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "kernel_test_util.hpp"
#include "zerotk/kernels/elementwise.hpp"

using namespace zerotk;
using namespace zerotk::kernels;

namespace {

struct AdamRef {
  double p, m, v, u;  // u: the update direction the step multiplies by lr
};

// Adam / AdamW in fp64, SEMANTICS.md section 3.
AdamRef adam_ref(double p, double m, double v, double g, const AdamHyper& h, std::int64_t t) {
  const double b1 = h.beta1, b2 = h.beta2, wd = h.weight_decay;
  if (!h.adamw_mode) g += wd * p;
  m = b1 * m + (1 - b1) * g;
  v = b2 * v + (1 - b2) * g * g;
  const double bc1 = h.bias_correction ? 1 - std::pow(b1, static_cast<double>(t)) : 1.0;
  const double bc2 = h.bias_correction ? 1 - std::pow(b2, static_cast<double>(t)) : 1.0;
  double u = (m / bc1) / (std::sqrt(v / bc2) + h.eps);
  if (h.adamw_mode) u += wd * p;
  return {p - h.lr * u, m, v, u};
}

}  // namespace

TEST_CASE("AdamStepConsts: bias corrections for t >= 1 and 1 - beta in fp64") {
  AdamHyper h;
  h.beta1 = 0.9f;
  h.beta2 = 0.999f;
  for (std::int64_t t : {1, 2, 10, 1000, 100000}) {
    const auto k = AdamStepConsts::make(h, t);
    CHECK(k.inv_bc1 == static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(0.9f), static_cast<double>(t)))));
    CHECK(k.inv_bc2 == static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(0.999f), static_cast<double>(t)))));
    CHECK(k.one_minus_beta1 == static_cast<float>(1.0 - static_cast<double>(0.9f)));
  }
  h.bias_correction = false;
  const auto k = AdamStepConsts::make(h, 7);
  CHECK(k.inv_bc1 == 1.0f);
  CHECK(k.inv_bc2 == 1.0f);
  // Far into training the corrections tend to 1.
  h.bias_correction = true;
  CHECK(AdamStepConsts::make(h, 1000000).inv_bc2 == 1.0f);
}

TEST_CASE("adam_update matches the fp64 formula within a few roundings") {
  std::mt19937_64 rng(7);
  std::normal_distribution<double> nd;
  for (int mode = 0; mode < 4; ++mode) {
    AdamHyper h;
    h.lr = 1e-2f;
    h.weight_decay = 0.1f;
    h.adamw_mode = mode & 1;
    h.bias_correction = mode & 2;
    for (int trial = 0; trial < 2000; ++trial) {
      const std::int64_t t = 1 + trial % 50;
      const float p0 = static_cast<float>(nd(rng)), m0 = static_cast<float>(0.1 * nd(rng));
      const float v0 = static_cast<float>(0.01 * std::fabs(nd(rng))), g = static_cast<float>(nd(rng) * std::pow(10.0, trial % 7 - 3));
      float p = p0, m = m0, v = v0;
      adam_update(p, m, v, g, AdamStepConsts::make(h, t));
      const AdamRef r = adam_ref(p0, m0, v0, g, h, t);
      // m and v: a few roundings of their two terms (1 - beta to float, the product, the fma); the
      // terms may cancel, so the bound is relative to them, not to the result.
      const double gl = h.adamw_mode ? g : g + static_cast<double>(h.weight_decay) * p0;
      CHECK(std::fabs(m - r.m) <= 0x1p-21 * (0.9 * std::fabs(m0) + 0.1 * std::fabs(gl)));
      CHECK(std::fabs(v - r.v) <= 0x1p-21 * (std::fabs(v0) + 1e-3 * gl * gl));
      // p from the kernel's own m and v: the final fma rounds once; the update carries ~6 roundings
      // (bias corrections rounded to float included).
      const double bc1 = h.bias_correction ? 1 - std::pow(static_cast<double>(h.beta1), static_cast<double>(t)) : 1.0;
      const double bc2 = h.bias_correction ? 1 - std::pow(static_cast<double>(h.beta2), static_cast<double>(t)) : 1.0;
      double u = (m / bc1) / (std::sqrt(v / bc2) + h.eps);
      if (h.adamw_mode) u += static_cast<double>(h.weight_decay) * p0;
      const double pr = p0 - static_cast<double>(h.lr) * u;
      CHECK(std::fabs(p - pr) <= 0x1p-23 * std::fabs(pr) + 0x1p-20 * h.lr * (std::fabs(u) + 0.1 * std::fabs(p0)) + 1e-30);
      CHECK(std::fabs(p - r.p) <= 0x1p-10 * h.lr * (std::fabs(r.u) + 1.0));  // and near the all-fp64 result
    }
  }
}

TEST_CASE("adam_update: AdamW with zero decay equals L2 mode with zero decay bit for bit") {
  AdamHyper w, l;
  w.adamw_mode = true;
  l.adamw_mode = false;
  const auto v = test::randn(1000, 3);
  for (std::size_t i = 0; i + 1 < v.size(); i += 2) {
    float p1 = v[i], m1 = 0.1f, v1 = 0.2f, p2 = v[i], m2 = 0.1f, v2 = 0.2f;
    adam_update(p1, m1, v1, v[i + 1], AdamStepConsts::make(w, 3));
    adam_update(p2, m2, v2, v[i + 1], AdamStepConsts::make(l, 3));
    CHECK(std::memcmp(&p1, &p2, 4) == 0);
  }
}

TEST_CASE("adam_update propagates inf and NaN gradients into the parameter") {
  AdamHyper h;
  const auto k = AdamStepConsts::make(h, 1);
  float p = 1.0f, m = 0.0f, v = 0.0f;
  adam_update(p, m, v, test::qnan(), k);
  CHECK(std::isnan(p));
  p = 1.0f, m = 0.0f, v = 0.0f;
  adam_update(p, m, v, test::inf(), k);  // m/v = inf/inf
  CHECK(std::isnan(p));
  CHECK(std::isinf(v));
}

TEST_CASE("adam_update with subnormal gradients stays finite and exact in m") {
  AdamHyper h;
  h.beta1 = 0.5f;  // 1 - beta1 = 0.5: m = g/2 is exact even for subnormal g
  const auto k = AdamStepConsts::make(h, 1);
  float p = 0.0f, m = 0.0f, v = 0.0f;
  const float g = std::ldexp(1.0f, -140);
  adam_update(p, m, v, g, k);
  CHECK(m == std::ldexp(1.0f, -141));
  CHECK(v == 0.0f);  // g^2 underflows
  CHECK(std::isfinite(p));
  CHECK(p < 0.0f);  // m / (0 + eps) > 0 moves p down, by a tiny but representable amount
}

TEST_CASE("lamb_moments and lamb_direction match the fp64 formula") {
  std::mt19937_64 rng(11);
  std::normal_distribution<double> nd;
  LambHyper h;
  h.weight_decay = 0.01f;
  const auto k = LambStepConsts::make(h, 5);
  CHECK(k.step_size == static_cast<float>(1e-3f * std::sqrt(1 - std::pow(static_cast<double>(0.999f), 5.0)) /
                                          (1 - std::pow(static_cast<double>(0.9f), 5.0))));
  for (int trial = 0; trial < 2000; ++trial) {
    const float p = static_cast<float>(nd(rng)), g = static_cast<float>(nd(rng));
    float m = static_cast<float>(0.1 * nd(rng)), v = static_cast<float>(0.01 * std::fabs(nd(rng)));
    const double m0 = m, v0 = v;
    const double md = 0.9f * m0 + (1 - static_cast<double>(0.9f)) * g;
    const double vd = 0.999f * v0 + (1 - static_cast<double>(0.999f)) * g * static_cast<double>(g);
    const float u = lamb_moments(p, m, v, g, k);
    CHECK(std::fabs(m - md) <= 0x1p-21 * (0.9 * std::fabs(m0) + 0.1 * std::fabs(g)));
    CHECK(std::fabs(v - vd) <= 0x1p-21 * (v0 + 1e-3 * g * static_cast<double>(g)));
    // The direction from the kernel's m, v: a division, a sqrt, two adds.
    const double q = m / (std::sqrt(static_cast<double>(v)) + static_cast<double>(1e-8f));
    const double ud = q + static_cast<double>(0.01f) * p;
    CHECK(std::fabs(u - ud) <= 0x1p-21 * (std::fabs(q) + std::fabs(0.01 * p)));
    // Phase 2 recomputes the direction from the stored moments: the same bits.
    const float u2 = lamb_direction(p, m, v, k);
    CHECK(std::memcmp(&u, &u2, 4) == 0);
  }
  LambHyper nb = h;
  nb.bias_correction = false;
  CHECK(LambStepConsts::make(nb, 5).step_size == 1e-3f);
}

TEST_CASE("lamb_trust_ratio: ratio of norms, clamped, 1 when a norm is zero") {
  LambHyper h;
  h.min_coeff = 0.01f;
  h.max_coeff = 10.0f;
  const auto k = LambStepConsts::make(h, 1);
  CHECK(lamb_trust_ratio(4.0, 1.0, k) == 2.0f);
  CHECK(lamb_trust_ratio(1.0, 4.0, k) == 0.5f);
  CHECK(lamb_trust_ratio(1e6, 1.0, k) == 10.0f);
  CHECK(lamb_trust_ratio(1.0, 1e6, k) == 0.01f);
  CHECK(lamb_trust_ratio(0.0, 3.0, k) == 1.0f);
  CHECK(lamb_trust_ratio(3.0, 0.0, k) == 1.0f);
  CHECK(std::isnan(lamb_trust_ratio(std::numeric_limits<double>::quiet_NaN(), 1.0, k)));
  float p = 2.0f;
  lamb_apply(p, 4.0f, 0.25f);
  CHECK(p == 1.0f);
}

TEST_CASE("is_nonfinite: exponent-bit test for float, half and bfloat16") {
  for (std::uint32_t e = 0; e < 256; ++e) {
    for (std::uint32_t mant : {0u, 1u, 0x400000u, 0x7fffffu}) {
      for (std::uint32_t s : {0u, 0x80000000u}) {
        const std::uint32_t b = s | (e << 23) | mant;
        float x;
        std::memcpy(&x, &b, 4);
        CHECK(is_nonfinite(x) == !std::isfinite(x));
      }
    }
  }
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto h = half::from_bits(static_cast<std::uint16_t>(b));
    const auto f = bfloat16::from_bits(static_cast<std::uint16_t>(b));
    REQUIRE(is_nonfinite(h) == !std::isfinite(half_bits_to_float(h.bits)));
    REQUIRE(is_nonfinite(f) == !std::isfinite(bf16_bits_to_float(f.bits)));
  }
  CHECK(unscale(3.0f, 0.5f) == 1.5f);
}
