// Host LAMB (two phases) against a serial reference built from the per-element functions with norms
// summed in long double; bit-identical across ISA builds and thread counts; tensors split over
// simulated ranks give the single-process result up to the order of the fp64 norm sums.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernel_test_util.hpp"
#include "zerotk/kernels/host/lamb.hpp"

using namespace zerotk;
using namespace zerotk::kernels;
using zerotk::test::Isa;

namespace {

struct Model {
  std::vector<float> p, m, v, g;
  std::vector<Segment> segs;  // one per tensor
};

// Five tensors, one of them all zeros (||p|| = 0 -> ratio 1) and one large (ratio clamps).
Model make_model() {
  Model md;
  const std::size_t numels[] = {1, 33, 5000, 70001, 17};
  std::size_t at = 0;
  for (std::uint32_t t = 0; t < 5; ++t) {
    md.segs.push_back({at, numels[t], t == 2 ? 1u : 0u, t});
    auto p = test::randn(numels[t], 10 + t, t == 3 ? 50.0f : 0.5f);
    if (t == 1) std::fill(p.begin(), p.end(), 0.0f);
    md.p.insert(md.p.end(), p.begin(), p.end());
    at += numels[t];
  }
  md.m = test::randn(at, 1, 0.01f);
  md.v = test::randn(at, 2, 0.001f);
  for (auto& x : md.v) x = std::fabs(x);
  md.g = test::randn(at, 3);
  return md;
}

std::vector<LambStepConsts> consts() {
  LambHyper a, b;
  a.lr = 1e-2f;
  a.weight_decay = 0.01f;
  b.lr = 2e-3f;
  b.weight_decay = 0.0f;
  b.min_coeff = 0.1f;
  b.max_coeff = 2.0f;
  return {LambStepConsts::make(a, 3), LambStepConsts::make(b, 3)};
}

// Serial reference: per-element functions, long double norms.
void reference(Model& md, float scale, std::vector<half>& out) {
  const auto k = consts();
  for (const Segment& s : md.segs) {
    std::vector<float> u(s.numel);
    long double pp = 0, uu = 0;
    for (std::size_t i = 0; i < s.numel; ++i) {
      const std::size_t j = s.offset + i;
      u[i] = lamb_moments(md.p[j], md.m[j], md.v[j], md.g[j] * scale, k[s.group]);
      pp += static_cast<long double>(md.p[j]) * md.p[j];
      uu += static_cast<long double>(u[i]) * u[i];
    }
    const float ratio = lamb_trust_ratio(static_cast<double>(pp), static_cast<double>(uu), k[s.group]);
    for (std::size_t i = 0; i < s.numel; ++i) {
      const std::size_t j = s.offset + i;
      lamb_apply(md.p[j], u[i], k[s.group].step_size * ratio);
      out[j] = half(md.p[j]);
    }
  }
}

void run_kernel(Model& md, float scale, std::vector<half>& out) {
  const auto k = consts();
  std::vector<double> sums(2 * md.segs.size(), 0.0);
  host::lamb_phase1<float>(md.segs, k, md.p.data(), md.m.data(), md.v.data(), md.g.data(), scale, sums);
  host::lamb_phase2<half>(md.segs, k, md.p.data(), md.m.data(), md.v.data(), out.data(), sums);
}

}  // namespace

TEST_CASE("LAMB phases equal the serial reference; every ISA and thread count gives the same bits") {
  const Model start = make_model();
  Model ref = start;
  std::vector<half> out_ref(ref.p.size());
  reference(ref, 0.5f, out_ref);

  std::vector<float> first_p;
  for (const Isa isa : test::supported_isas()) {
    kernels::host::simd::IsaCap cap(isa);
    for (int threads : {1, 2, 3}) {
      CAPTURE(kernels::host::simd::to_string(isa));
      CAPTURE(threads);
      test::Threads th(threads);
      Model md = start;
      std::vector<half> out(md.p.size());
      run_kernel(md, 0.5f, out);
      REQUIRE(test::same_bits(md.m, ref.m));  // elementwise: exact
      REQUIRE(test::same_bits(md.v, ref.v));
      // p: the trust ratio comes from fp64 sums in another order: at most one rounding apart.
      for (std::size_t i = 0; i < md.p.size(); ++i) {
        REQUIRE(std::fabs(md.p[i] - ref.p[i]) <= 0x1p-22f * std::fabs(ref.p[i]) + 1e-12f);
        REQUIRE(out[i].bits == float_to_half_bits(md.p[i]));
      }
      if (first_p.empty()) first_p = md.p;
      REQUIRE(test::same_bits(md.p, first_p));
    }
  }
}

TEST_CASE("LAMB with tensors split over three ranks: per-tensor sums reduced, same result") {
  const Model start = make_model();
  Model single = start;
  std::vector<half> out_single(single.p.size());
  run_kernel(single, 1.0f, out_single);

  // Cut the concatenated parameters into 3 unequal partitions; tensors straddle the cuts.
  const std::size_t total = start.p.size();
  const std::size_t cuts[] = {0, 2500, 40000, total};
  Model md = start;
  std::vector<half> out(total);
  std::vector<std::vector<Segment>> rank_segs(3);
  for (int r = 0; r < 3; ++r) {
    for (const Segment& s : start.segs) {
      const std::size_t b = std::max(s.offset, cuts[r]), e = std::min(s.offset + s.numel, cuts[r + 1]);
      if (e > b) rank_segs[r].push_back({b, e - b, s.group, s.tensor});
    }
  }
  // Phase 1 on every rank, "all-reduce" (sum in rank order), phase 2 on every rank.
  const auto k = consts();
  std::vector<std::vector<double>> sums(3, std::vector<double>(2 * start.segs.size(), 0.0));
  for (int r = 0; r < 3; ++r) {
    host::lamb_phase1<float>(rank_segs[r], k, md.p.data(), md.m.data(), md.v.data(), md.g.data(), 1.0f, sums[r]);
  }
  std::vector<double> reduced(2 * start.segs.size(), 0.0);
  for (int r = 0; r < 3; ++r) {
    for (std::size_t i = 0; i < reduced.size(); ++i) reduced[i] += sums[r][i];
  }
  for (int r = 0; r < 3; ++r) {
    host::lamb_phase2<half>(rank_segs[r], k, md.p.data(), md.m.data(), md.v.data(), out.data(), reduced);
  }
  CHECK(test::same_bits(md.m, single.m));
  CHECK(test::same_bits(md.v, single.v));
  for (std::size_t i = 0; i < total; ++i) {
    REQUIRE(std::fabs(md.p[i] - single.p[i]) <= 0x1p-22f * std::fabs(single.p[i]) + 1e-12f);
  }
}

TEST_CASE("fused_lamb: zero tensor keeps ratio 1; argument checks") {
  std::vector<float> p(100, 0.0f), m(100, 0.0f), v(100, 0.0f), g(100, 1.0f);
  LambHyper h;
  h.lr = 0.5f;
  h.bias_correction = false;
  const auto k = LambStepConsts::make(h, 1);
  host::fused_lamb(p.data(), m.data(), v.data(), g.data(), nullptr, 100, k, 1.0f);
  // m = 0.1, v = 0.001, u = 0.1 / (sqrt(0.001) + 1e-8); ||p|| = 0 -> ratio 1; p = -0.5 u.
  const float u = lamb_direction(0.0f, m[0], v[0], k);
  for (float x : p) REQUIRE(x == -0.5f * u);
  const std::vector<Segment> bad = {{0, 10, 0, 3}};
  std::vector<double> sums(2);
  CHECK_THROWS_AS(host::lamb_phase1<float>(bad, {&k, 1}, p.data(), m.data(), v.data(), g.data(), 1.0f, sums),
                  usage_error);
}
