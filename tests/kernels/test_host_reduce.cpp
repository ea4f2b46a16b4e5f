// Sums of squares and inf/NaN checks on the host: against a long double reference, and bit for bit
// across ISA builds and thread counts (the reproducible binned sum, see kernels/host/reduce.hpp;
// tests/zero/test_norms.cpp tests the two phases and the error bound in depth).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernel_test_util.hpp"
#include "zerotk/kernels/host/parallel.hpp"
#include "zerotk/kernels/host/reduce.hpp"

#if ZEROTK_HAS_OPENMP
#include <omp.h>
#endif

using namespace zerotk;
using zerotk::test::Isa;

namespace {

template <class T>
long double reference_sum(const T* x, std::size_t n) {
  long double s = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const long double v = to_float(x[i]);
    s += v * v;
  }
  return s;
}

constexpr std::size_t kB = kernels::host::kSumBlock;

}  // namespace

TEST_CASE_TEMPLATE("sum_squares: fp64 accuracy, same bits for every ISA and thread count", T, float, half, bfloat16) {
  const auto data = test::convert<T>(test::randn(3 * kB + 100, 1));
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{31}, std::size_t{32}, std::size_t{33}, kB - 1, kB,
                        kB + 1, 3 * kB + 77}) {
    CAPTURE(n);
    double first = 0;
    bool have = false;
    for (const Isa isa : test::supported_isas()) {
      kernels::host::simd::IsaCap cap(isa);
      for (int threads : {1, 2, 3}) {
        test::Threads th(threads);
        const double s = kernels::host::sum_squares(data.data(), n);
        if (!have) {
          first = s;
          have = true;
          const long double r = reference_sum(data.data(), n);
          // fp64 accumulation of n exact squares: relative error <= n * 2^-53.
          CHECK(std::fabs(static_cast<long double>(s) - r) <= r * static_cast<long double>(n) * 0x1p-53L);
        }
        REQUIRE(std::memcmp(&s, &first, sizeof s) == 0);
      }
    }
  }
  // Unaligned start.
  CHECK(kernels::host::sum_squares(data.data() + 1, 1000) ==
        doctest::Approx(static_cast<double>(reference_sum(data.data() + 1, 1000))).epsilon(1e-14));
}

TEST_CASE("sum_squares of subnormal floats is exact in fp64") {
  std::vector<float> x(1000, std::ldexp(1.0f, -140));  // 2^-140 squared = 2^-280, a normal fp64
  CHECK(kernels::host::sum_squares(x.data(), x.size()) == 1000.0 * std::ldexp(1.0, -280));
}

TEST_CASE_TEMPLATE("has_nonfinite and norm_and_check find inf and NaN anywhere", T, float, half, bfloat16) {
  const std::size_t n = 2 * kB + 45;
  const auto clean = test::convert<T>(test::randn(n, 3));
  for (const Isa isa : test::supported_isas()) {
    kernels::host::simd::IsaCap cap(isa);
    CAPTURE(kernels::host::simd::to_string(isa));
    CHECK_FALSE(kernels::host::has_nonfinite(clean.data(), n));
    const auto nc = kernels::host::norm_and_check(clean.data(), n);
    CHECK_FALSE(nc.nonfinite);
    CHECK(nc.sum_squares == kernels::host::sum_squares(clean.data(), n));
    for (std::size_t at : {std::size_t{0}, std::size_t{17}, kB - 1, kB, n - 33, n - 1}) {
      for (float bad : {test::inf(), -test::inf(), test::qnan()}) {
        auto x = clean;
        x[at] = from_float<T>(bad);
        CAPTURE(at);
        CHECK(kernels::host::has_nonfinite(x.data(), n));
        CHECK(kernels::host::norm_and_check(x.data(), n).nonfinite);
      }
    }
  }
  CHECK_FALSE(kernels::host::has_nonfinite(clean.data(), 0));
  CHECK(kernels::host::norm_and_check(clean.data(), 0).sum_squares == 0.0);
}

TEST_CASE("norm_and_check: the largest finite floats do not overflow the fp64 sum") {
  std::vector<float> x(100000, 3.4e38f);
  const auto nc = kernels::host::norm_and_check(x.data(), x.size());
  CHECK_FALSE(nc.nonfinite);
  CHECK(nc.sum_squares == doctest::Approx(1e5 * 3.4e38 * 3.4e38));
  std::vector<half> h(1000, half(65504.0f));  // largest finite half
  CHECK_FALSE(kernels::host::norm_and_check(h.data(), h.size()).nonfinite);
}

TEST_CASE("per-tensor sums over a list and over segments match single-tensor sums") {
  test::Threads th(2);
  std::vector<std::vector<float>> ts;
  std::vector<kernels::TensorRef<const float>> refs;
  for (std::size_t t = 0; t < 300; ++t) {
    ts.push_back(test::randn((t * 131) % 700 + (t == 7 ? 3 * kB : 0), 100 + t));
  }
  for (const auto& t : ts) refs.push_back({t.data(), t.size()});
  std::vector<double> out(ts.size());
  kernels::host::sum_squares<float>(refs, out);
  double total = 0;
  for (std::size_t t = 0; t < ts.size(); ++t) {
    const double single = kernels::host::sum_squares(ts[t].data(), ts[t].size());
    REQUIRE(std::memcmp(&out[t], &single, 8) == 0);
    total += single;
  }
  // The list's norm is the norm of all its elements taken together: the concatenation's bits, and
  // within rounding of the per-tensor sums added up.
  std::vector<float> concat;
  for (const auto& t : ts) concat.insert(concat.end(), t.begin(), t.end());
  const double whole = kernels::host::sum_squares(concat.data(), concat.size());
  CHECK(kernels::host::l2_norm<float>(refs) == std::sqrt(whole));
  CHECK(whole == doctest::Approx(total).epsilon(1e-14));

  // Segments of one flat buffer; the two segments of tensor 1 count as one set of elements.
  const auto flat = test::randn(5000, 9);
  const std::vector<kernels::Segment> segs = {{0, 100, 0, 0}, {100, 2000, 0, 1}, {2100, 900, 0, 1}, {3000, 0, 0, 2}};
  std::vector<double> per(3, 0.0);
  kernels::host::sum_squares<float>(segs, flat.data(), per);
  CHECK(per[0] == kernels::host::sum_squares(flat.data(), 100));
  CHECK(per[1] == kernels::host::sum_squares(flat.data() + 100, 2900));
  CHECK(per[1] == doctest::Approx(kernels::host::sum_squares(flat.data() + 100, 2000) +
                                  kernels::host::sum_squares(flat.data() + 2100, 900)).epsilon(1e-14));
  CHECK(per[2] == 0.0);
  std::vector<double> too_small(2);
  CHECK_THROWS_AS(kernels::host::sum_squares<float>(segs, flat.data(), too_small), usage_error);
}

#if ZEROTK_HAS_OPENMP
TEST_CASE("parallel drivers cover every element when the team is smaller than asked for (nested region)") {
  // Called from inside a parallel region with nesting off, the drivers ask for 2 threads and get 1:
  // the shares must follow the team they got, not the count they asked for.
  const int saved_levels = omp_get_max_active_levels();
  omp_set_max_active_levels(1);
  test::Threads t(2);
  constexpr std::size_t n = std::size_t{1} << 18;
  std::vector<std::uint8_t> piece(n, 0), share(n, 0), blocks(n, 0), indexed(n, 0);
  int asked = 0;
#pragma omp parallel num_threads(2)
  {
#pragma omp single
    {
      asked = zerotk::kernels::host::detail::threads_for(n);
      zerotk::kernels::host::for_each_piece(
          2, [](std::size_t) { return n / 2; },
          [&](std::size_t item, std::size_t b, std::size_t e) {
            for (std::size_t i = b; i < e; ++i) ++piece[item * (n / 2) + i];
          });
      zerotk::kernels::host::for_each_share(n, [&](std::size_t b, std::size_t e) {
        for (std::size_t i = b; i < e; ++i) ++share[i];
      });
      std::vector<std::size_t> first;
      const auto bl = zerotk::kernels::host::make_blocks(1, [](std::size_t) { return n; }, first);
      zerotk::kernels::host::for_each_block(bl, [&](std::size_t, const zerotk::kernels::host::Block& b) {
        for (std::size_t i = b.begin; i < b.end; ++i) ++blocks[i];
      });
      zerotk::kernels::host::for_each_share_indexed(n, 2, [&](int, std::size_t b, std::size_t e) {
        for (std::size_t i = b; i < e; ++i) ++indexed[i];
      });
    }
  }
  omp_set_max_active_levels(saved_levels);
  CHECK(asked == 2);  // the drivers did ask for more threads than the nested region gives
  for (const auto* v : {&piece, &share, &blocks, &indexed}) {
    CHECK(std::all_of(v->begin(), v->end(), [](std::uint8_t c) { return c == 1; }));
  }
}
#endif
