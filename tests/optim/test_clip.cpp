#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "../precision/fake_comm.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/optim/clip.hpp"

namespace test_clip {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using zerotk_test::BoardComm;
using zerotk_test::FakeGroup;
using zerotk_test::run_board;

TEST_CASE("clip_factor: closed forms of SEMANTICS.md section 2") {
  const double scale = 65536;
  SUBCASE("norm above the threshold clips: k = (norm/scale + 1e-6) / c") {
    // Scaled gradient (3*scale, 4*scale): scaled norm 5*scale, unscaled norm 5.
    const double sum_sq = (3 * scale) * (3 * scale) + (4 * scale) * (4 * scale);
    const ClipResult r = clip_factor(sum_sq, scale, 1.0);
    CHECK(r.total_norm == 5 * scale);
    CHECK(r.reported_norm == 5.0);
    CHECK(r.finite);
    CHECK(r.clipped);
    const double k = 5.000001;
    CHECK(r.combined_scale == static_cast<float>(k * scale));
    CHECK(r.grad_factor == static_cast<float>(1.0 / (k * scale)));
    // The unscaled, clipped gradient (3, 4) / k has norm 5 / 5.000001: just under c = 1.
    const double clipped_norm = std::hypot(3 * scale * r.grad_factor, 4 * scale * r.grad_factor);
    CHECK(clipped_norm == doctest::Approx(1.0 / 1.0000002).epsilon(1e-7));
  }
  SUBCASE("norm below the threshold only unscales, exactly") {
    const ClipResult r = clip_factor(0.25 * scale * scale, scale, 1.0);  // unscaled norm 0.5
    CHECK(r.reported_norm == 0.5);
    CHECK_FALSE(r.clipped);
    CHECK(r.combined_scale == 65536.0f);
    CHECK(r.grad_factor == 0x1p-16f);
  }
  SUBCASE("k = 1 exactly at (norm/scale + 1e-6) == c is not clipping") {
    const double c = 2.0 + 1e-6;
    const ClipResult r = clip_factor(4.0, 1.0, c);
    CHECK_FALSE(r.clipped);
    CHECK(r.combined_scale == 1.0f);
  }
  SUBCASE("gradient_clipping = 0 disables clipping") {
    const ClipResult r = clip_factor(1e30, 8.0, 0.0);
    CHECK_FALSE(r.clipped);
    CHECK(r.combined_scale == 8.0f);
    CHECK(r.grad_factor == 0.125f);
    CHECK(r.reported_norm == std::sqrt(1e30) / 8);
  }
  SUBCASE("an empty partition everywhere: norm 0") {
    const ClipResult r = clip_factor(0.0, 1024.0, 1.0);
    CHECK(r.total_norm == 0);
    CHECK(r.reported_norm == 0);
    CHECK_FALSE(r.clipped);
    CHECK(r.grad_factor == 1.0f / 1024);
  }
  SUBCASE("inf / NaN norm: -1, no clipping, still unscaled") {
    for (double bad : {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
      const ClipResult r = clip_factor(bad, scale, 1.0);
      CHECK(r.total_norm == -1);
      CHECK(r.reported_norm == -1);
      CHECK_FALSE(r.finite);
      CHECK_FALSE(r.clipped);
      CHECK(r.combined_scale == 65536.0f);
      // Even a threshold tiny enough that DeepSpeed's "-1 in the formula" would clip does not.
      CHECK_FALSE(clip_factor(bad, 0x1p30, 1e-12).clipped);
    }
  }
  SUBCASE("a large scale with a small norm: the factor is the exact reciprocal") {
    const ClipResult r = clip_factor(1.0, 0x1p24, 1.0);
    CHECK(r.grad_factor == 0x1p-24f);
  }
}

TEST_CASE("clip_factor: invalid arguments") {
  try {
    clip_factor(1.0, 1.0, -0.5);
    FAIL("expected config_error");
  } catch (const config_error& e) {
    CHECK(e.where() == "/gradient_clipping");
    CHECK(e.value() == "-0.5");
  }
  CHECK_THROWS_AS(clip_factor(1.0, 1.0, std::numeric_limits<double>::quiet_NaN()), config_error);
  CHECK_THROWS_AS(clip_factor(1.0, 1.0, std::numeric_limits<double>::infinity()), config_error);
  CHECK_THROWS_AS(clip_factor(1.0, 0.0, 1.0), usage_error);
  CHECK_THROWS_AS(clip_factor(1.0, -2.0, 1.0), usage_error);
  CHECK_THROWS_AS(clip_factor(1.0, std::numeric_limits<double>::infinity(), 1.0), usage_error);
  CHECK_THROWS_AS(clip_factor(-1.0, 1.0, 1.0), usage_error);
}

TEST_CASE("global_sum_squares: one fp64 all-reduce (sum)") {
  FakeGroup g(1, {2.5, 4.0});
  CHECK(global_sum_squares(g, 1.25) == 7.75);
  REQUIRE(g.calls.size() == 1);
  CHECK(g.calls[0].dtype == DType::fp64);
  CHECK(g.calls[0].op == comm::ReduceOp::sum);
  CHECK(g.calls[0].count == 1);
  CHECK(g.calls[0].in_place);
}

TEST_CASE("global norm over partitions not divisible by the world size, then clip (threads)") {
  std::mt19937_64 rng(2024);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1001}}) {
    for (int world : {1, 2, 3, 4}) {
      CAPTURE(n);
      CAPTURE(world);
      const double scale = 0x1p12;  // a power of two: scaling the fp32 gradients is exact
      std::vector<float> scaled(n);
      for (auto& g : scaled) g = static_cast<float>(normal(rng) * scale);

      // Serial reference: the whole vector, unscaled.
      double ref_sq = 0;
      for (float g : scaled) ref_sq += (static_cast<double>(g) / scale) * (static_cast<double>(g) / scale);
      const double ref_norm = std::sqrt(ref_sq);
      const double clip = n > 0 ? 0.5 * ref_norm : 1.0;  // forces clipping whenever there is a gradient

      // ZeRO-like partitions: ceil(n / world) per rank, the last ones short or empty.
      const std::size_t part = (n + static_cast<std::size_t>(world) - 1) / static_cast<std::size_t>(world);
      std::vector<ClipResult> results(static_cast<std::size_t>(world));
      run_board(world, [&](BoardComm& c) {
        const std::size_t lo = std::min(n, part * static_cast<std::size_t>(c.rank()));
        const std::size_t hi = std::min(n, lo + part);
        double local = 0;
        for (std::size_t i = lo; i < hi; ++i) local += static_cast<double>(scaled[i]) * scaled[i];
        results[static_cast<std::size_t>(c.rank())] = clip_factor(global_sum_squares(c, local), scale, clip);
      });
      for (const auto& r : results) {
        CHECK(r.combined_scale == results[0].combined_scale);  // bitwise equal on every rank
        CHECK(r.grad_factor == results[0].grad_factor);
      }
      const ClipResult& r = results[0];
      CHECK(r.reported_norm == doctest::Approx(ref_norm).epsilon(1e-12));
      // After g * grad_factor the norm is ref_norm / k = clip * ref / (ref + 1e-6 clip) when clipped.
      double out_sq = 0;
      for (float g : scaled) out_sq += (g * static_cast<double>(r.grad_factor)) * (g * static_cast<double>(r.grad_factor));
      const double expect = r.clipped ? clip * ref_norm / (ref_norm + 1e-6 * clip) : ref_norm;
      CHECK(r.clipped == (n > 0));
      CHECK(std::sqrt(out_sq) == doctest::Approx(expect).epsilon(1e-6));
    }
  }
}

TEST_CASE("global_sum_squares on the real threads communicator: rank-order fp64 sum on every rank") {
  const std::vector<double> local = {1e16, 1.0, -1e16 + 3.0, 0.25, 7.5};  // order matters in fp64
  for (int world : {1, 2, 5}) {
    CAPTURE(world);
    double want = local[0];
    for (int r = 1; r < world; ++r) want += local[static_cast<std::size_t>(r)];
    std::vector<double> got(static_cast<std::size_t>(world));
    comm::run_threads(world, [&](comm::ThreadsCommunicator& c) {
      const auto r = static_cast<std::size_t>(c.rank());
      got[r] = global_sum_squares(c, local[r]);
    });
    for (double g : got) CHECK(g == want);
  }
}

}  // namespace test_clip
