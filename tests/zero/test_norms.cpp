// The reproducible sum of squares behind the global gradient norm (kernels/host/reduce.hpp):
//  - the same bits for the same elements split into random pieces over simulated ranks, in random
//    order, through the pointer and the list entry points, over 1 and 2 threads and every ISA build;
//  - within the stated error bound of an exact (big-integer) sum, including adversarial mixes: one
//    huge element among many tiny ones, subnormals, all zeros, n = 0 and 1, sizes around the vector
//    widths, a count bound far above the element count;
//  - inf, -inf and NaN found at the first, a middle and the last position.
// This file is also built with -ffast-math (suite zero_fast_math): the results must not change.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "../kernels/kernel_test_util.hpp"
#include "zerotk/kernels/host/reduce.hpp"
#include "zerotk/zero/norms.hpp"  // deprecated: its forwarders are checked at the end

using namespace zerotk;
using kernels::TensorRef;
using kernels::FoldSums;
using kernels::NormGrid;
using kernels::SquareBound;

namespace {

// ---- an exact reference -------------------------------------------------------------------------------

/// Non-negative fixed-point number with its lowest bit at 2^-512 and 14 64-bit limbs (up to 2^384):
/// holds every square of a float (multiples of 2^-298, at most ~2^256) and sums of them exactly.
class ExactSum {
 public:
  static constexpr int kLsb = -512;
  static constexpr int kLimbs = 14;

  void add(double v) {
    REQUIRE(v >= 0.0);
    REQUIRE(!kernels::is_nonfinite(v));
    if (v == 0.0) return;
    int e = 0;
    const double f = std::frexp(v, &e);  // v = f 2^e, f in [0.5, 1)
    const auto mant = static_cast<std::uint64_t>(std::ldexp(f, 53));
    const int shift = e - 53 - kLsb;
    REQUIRE(shift >= 0);
    REQUIRE(std::ldexp(static_cast<double>(mant), e - 53) == v);
    const int w = shift / 64, b = shift % 64;
    add_at(w, mant << b);
    if (b != 0) add_at(w + 1, mant >> (64 - b));
  }

  /// |a - b| as a double (relative error ~2^-52: enough to compare against a bound).
  static double abs_diff(const ExactSum& a, const ExactSum& b) {
    const ExactSum* hi = &a;
    const ExactSum* lo = &b;
    for (int i = kLimbs - 1; i >= 0; --i) {
      if (a.limb_[i] != b.limb_[i]) {
        if (a.limb_[i] < b.limb_[i]) std::swap(hi, lo);
        break;
      }
    }
    ExactSum d;
    std::uint64_t borrow = 0;
    for (int i = 0; i < kLimbs; ++i) {
      const std::uint64_t x = hi->limb_[i], y = lo->limb_[i];
      d.limb_[i] = x - y - borrow;
      borrow = (x < y || (x == y && borrow)) ? 1 : 0;
    }
    return d.value();
  }

  /// The value, rounded (long double accumulation from the top limbs down).
  double value() const {
    long double s = 0;
    for (int i = kLimbs - 1; i >= 0; --i) s += std::ldexp(static_cast<long double>(limb_[i]), 64 * i + kLsb);
    return static_cast<double>(s);
  }

 private:
  void add_at(int i, std::uint64_t x) {
    for (; x != 0; ++i) {
      REQUIRE(i < kLimbs);
      const std::uint64_t before = limb_[i];
      limb_[i] += x;
      x = limb_[i] < before ? 1 : 0;
    }
  }
  std::array<std::uint64_t, kLimbs> limb_{};
};

template <class T>
ExactSum exact_sum(const std::vector<T>& x) {
  ExactSum s;
  for (const T& v : x) s.add(kernels::exact_square(v));
  return s;
}

// ---- data ------------------------------------------------------------------------------------------

template <class T>
struct Range;  // binary exponents of T's smallest subnormal and largest binade
template <> struct Range<float> { static constexpr int lo = -149, hi = 127; };
template <> struct Range<half> { static constexpr int lo = -24, hi = 15; };
template <> struct Range<bfloat16> { static constexpr int lo = -133, hi = 127; };

/// Values spread over T's whole exponent range (subnormals to the largest binade), signs mixed,
/// 1 in 16 an exact zero.
template <class T>
std::vector<T> spread(std::size_t n, std::uint64_t seed, int lo = Range<T>::lo, int hi = Range<T>::hi) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> e(lo, hi);
  std::uniform_real_distribution<float> m(1.0f, 1.99f);
  std::vector<T> v(n);
  for (auto& x : v) {
    const float f = rng() % 16 == 0 ? 0.0f : std::ldexp(m(rng), e(rng)) * (rng() % 2 ? 1.0f : -1.0f);
    x = from_float<T>(f);
  }
  return v;
}

template <class T>
std::vector<T> normal(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  return test::convert<T>(test::randn(n, seed, scale));
}

template <class T>
T largest() {
  if constexpr (std::is_same_v<T, float>) return std::numeric_limits<float>::max();
  if constexpr (std::is_same_v<T, half>) return half::from_bits(0x7bff);
  if constexpr (std::is_same_v<T, bfloat16>) return bfloat16::from_bits(0x7f7f);
}

template <class T>
T smallest_subnormal() {
  if constexpr (std::is_same_v<T, float>) return std::numeric_limits<float>::denorm_min();
  if constexpr (std::is_same_v<T, half>) return half::from_bits(0x0001);
  if constexpr (std::is_same_v<T, bfloat16>) return bfloat16::from_bits(0x0001);
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }
bool same_bits(const SquareBound& a, const SquareBound& b) {
  return same_bits(a.max_square, b.max_square) && a.nonfinite == b.nonfinite;
}

// ---- the protocol, as ranks would run it ---------------------------------------------------------------

/// Both phases over `pieces` (each one rank's block list), ranks combined in `order`; `global_count`
/// as every rank would pass it. Non-finite data gives +inf.
template <class T>
double two_phase(const std::vector<std::vector<TensorRef<const T>>>& ranks, const std::vector<std::size_t>& order,
                 std::uint64_t global_count, bool list_api) {
  std::vector<SquareBound> local(ranks.size());
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    if (list_api) {
      local[r] = kernels::host::square_bound<T>(ranks[r]);
    } else {
      for (const auto& b : ranks[r]) local[r] = kernels::combine(local[r], kernels::host::square_bound(b.data, b.numel));
    }
  }
  SquareBound global;
  for (std::size_t r : order) global = kernels::combine(global, local[r]);  // the max all-reduce
  if (global.nonfinite) return std::numeric_limits<double>::infinity();
  const NormGrid grid = NormGrid::make(global.max_square, global_count);
  std::vector<FoldSums> folds(ranks.size());
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    if (list_api) {
      kernels::host::add_squares<T>(ranks[r], grid, folds[r]);
    } else {
      for (const auto& b : ranks[r]) kernels::host::add_squares(b.data, b.numel, grid, folds[r]);
    }
  }
  FoldSums sum;  // the sum all-reduce, in some rank order
  for (std::size_t r : order) {
    for (int k = 0; k < 3; ++k) sum.fold[k] += folds[r].fold[k];
  }
  return kernels::fold_finish(sum);
}

/// x cut at random points into pieces (empty ones included), each copied to its own allocation at a
/// random misalignment, dealt to `world` ranks in random order.
template <class T>
struct Split {
  std::vector<std::vector<T>> storage;
  std::vector<std::vector<TensorRef<const T>>> ranks;
  std::vector<std::size_t> order;

  Split(const std::vector<T>& x, int world, std::mt19937_64& rng) {
    const std::size_t pieces = 1 + rng() % 40;
    std::vector<std::size_t> cuts{0, x.size()};
    for (std::size_t i = 1; i < pieces; ++i) cuts.push_back(x.size() ? rng() % (x.size() + 1) : 0);
    std::sort(cuts.begin(), cuts.end());
    std::vector<std::size_t> ids(cuts.size() - 1);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    ranks.resize(static_cast<std::size_t>(world));
    storage.reserve(ids.size());
    for (std::size_t id : ids) {
      const std::size_t shift = rng() % 8;
      storage.emplace_back(shift + cuts[id + 1] - cuts[id]);
      const auto from = x.begin() + static_cast<std::ptrdiff_t>(cuts[id]);
      std::copy(from, from + static_cast<std::ptrdiff_t>(cuts[id + 1] - cuts[id]),
                storage.back().begin() + static_cast<std::ptrdiff_t>(shift));
      ranks[rng() % ranks.size()].push_back({storage.back().data() + shift, cuts[id + 1] - cuts[id]});
    }
    order.resize(ranks.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
  }
};

/// Checks |got - S| against the grid's bound and the headline bound of elementwise.hpp.
template <class T>
void check_accuracy(const std::vector<T>& x, std::uint64_t global_count) {
  const SquareBound b = kernels::host::square_bound(x.data(), x.size());
  REQUIRE_FALSE(b.nonfinite);
  const NormGrid g = NormGrid::make(b.max_square, global_count);
  FoldSums f;
  kernels::host::add_squares(x.data(), x.size(), g, f);
  // The folds are exact multiples of their units, at most 2^52 units in magnitude.
  for (int k = 0; k < 3; ++k) {
    CHECK(std::fmod(f.fold[k], g.unit[k]) == 0.0);
    CHECK(std::fabs(f.fold[k]) <= 0x1p52 * g.unit[k]);
  }
  const double got = kernels::fold_finish(f);
  const ExactSum exact = exact_sum(x);
  const double s = exact.value();
  ExactSum as_sum;
  as_sum.add(got);
  const double err = ExactSum::abs_diff(as_sum, exact);
  const double bound = g.error_bound(s);
  CAPTURE(s);
  CAPTURE(got);
  CAPTURE(err);
  CAPTURE(bound);
  CHECK(err <= bound * (1 + 1e-9));
  const double N = static_cast<double>(global_count), M = b.max_square;
  CHECK(err <= (0x1p-53 * s + N * M * (N * 0x1p-103 + N * N * N * 0x1p-155)) * (1 + 1e-9));
  if (x.size() == global_count) CHECK(same_bits(got, kernels::host::sum_squares(x.data(), x.size())));
  if (M == 0.0) CHECK(got == 0.0);
}

}  // namespace

// ---- order independence ----------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("norm: the same bits for any split, rank count, order, thread count and ISA", T, float, half,
                   bfloat16) {
  std::mt19937_64 rng(20261122);
  for (const auto& x : {normal<T>(150001, 1), spread<T>(70003, 2), normal<T>(1000, 3, 1e-3f)}) {
    const std::uint64_t N = x.size();
    const double whole = kernels::host::sum_squares(x.data(), x.size());
    CHECK(whole > 0.0);
    const SquareBound bound = kernels::host::square_bound(x.data(), x.size());
    const std::vector<std::vector<TensorRef<const T>>> one{{TensorRef<const T>{x.data(), x.size()}}};
    CHECK(same_bits(two_phase(one, {0}, N, false), whole));
    for (const test::Isa isa : test::supported_isas()) {
      kernels::host::simd::IsaCap cap(isa);
      CAPTURE(kernels::host::simd::to_string(isa));
      for (int threads : {1, 2}) {
        test::Threads th(threads);
        CAPTURE(threads);
        REQUIRE(same_bits(kernels::host::sum_squares(x.data(), x.size()), whole));
        REQUIRE(same_bits(kernels::host::square_bound(x.data(), x.size()), bound));
        for (int trial = 0; trial < 6; ++trial) {
          const int world = 1 + static_cast<int>(rng() % 5);
          Split<T> split(x, world, rng);
          CAPTURE(world);
          CAPTURE(split.storage.size());
          REQUIRE(same_bits(two_phase(split.ranks, split.order, N, trial % 2 == 0), whole));
          // A count bound above the element count (e.g. with padding) is another grid, but again one
          // result for every split.
          REQUIRE(same_bits(two_phase(split.ranks, split.order, 3 * N + 5, trial % 2 == 1),
                            two_phase(one, {0}, 3 * N + 5, false)));
        }
      }
    }
  }
}

TEST_CASE_TEMPLATE("norm: concatenated vs chunked through the kernels' list and segment entry points", T, float, half,
                   bfloat16) {
  const auto x = spread<T>(40000, 7, Range<T>::lo, Range<T>::hi / 2);
  const double whole = kernels::host::sum_squares(x.data(), x.size());
  std::vector<TensorRef<const T>> chunks;
  std::vector<kernels::Segment> segs;
  for (std::size_t at = 0, len = 1; at < x.size(); at += len, len = len * 3 + 1) {
    const std::size_t n = std::min(len, x.size() - at);
    chunks.push_back({x.data() + at, n});
    segs.push_back({at, n, 0, 0});
  }
  std::reverse(segs.begin(), segs.end());
  CHECK(same_bits(kernels::host::l2_norm<T>(chunks), std::sqrt(whole)));
  std::vector<double> per(1, 0.0);
  kernels::host::sum_squares<T>(segs, x.data(), per);
  CHECK(same_bits(per[0], whole));
  // Per tensor: each chunk alone equals the standalone sum of that chunk.
  std::vector<double> each(chunks.size());
  kernels::host::sum_squares<T>(chunks, each);
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    CHECK(same_bits(each[i], kernels::host::sum_squares(chunks[i].data, chunks[i].numel)));
  }
}

// ---- accuracy --------------------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("norm: within the stated bound of the exact sum", T, float, half, bfloat16) {
  SUBCASE("normal data") {
    for (std::size_t n : {std::size_t{1}, std::size_t{2}, std::size_t{7}, std::size_t{15}, std::size_t{17},
                          std::size_t{31}, std::size_t{33}, std::size_t{63}, std::size_t{65}, std::size_t{1000},
                          std::size_t{100003}}) {
      CAPTURE(n);
      const auto x = normal<T>(n, 100 + n);
      check_accuracy(x, n);
      // Far against plain fp64 sums too: 2^-52 of S.
      long double ref = 0;
      for (const T& v : x) ref += static_cast<long double>(kernels::exact_square(v));
      CHECK(std::fabs(static_cast<long double>(kernels::host::sum_squares(x.data(), n)) - ref) <= ref * 0x1p-52L);
    }
  }
  SUBCASE("the whole exponent range, subnormals included") {
    for (std::size_t n : {std::size_t{1}, std::size_t{33}, std::size_t{4099}, std::size_t{200001}}) {
      CAPTURE(n);
      check_accuracy(spread<T>(n, 200 + n), n);
    }
  }
  SUBCASE("one huge element among many tiny ones") {
    for (std::size_t n : {std::size_t{2}, std::size_t{1000}, std::size_t{100001}}) {
      CAPTURE(n);
      auto x = spread<T>(n, 300 + n, Range<T>::lo, Range<T>::lo + 20);
      x[n / 2] = largest<T>();
      check_accuracy(x, n);
      auto y = spread<T>(n, 400 + n, -10, 10);  // many moderate ones: they must still count
      y[0] = largest<T>();
      check_accuracy(y, n);
    }
  }
  SUBCASE("subnormals only, and the largest values only") {
    std::vector<T> tiny(5003);
    for (std::size_t i = 0; i < tiny.size(); ++i) {
      if constexpr (std::is_same_v<T, float>) {
        tiny[i] = std::ldexp(static_cast<float>(1 + i % 37), -149);
      } else {
        tiny[i] = T::from_bits(static_cast<std::uint16_t>(1 + i % 37));
      }
    }
#if !defined(__FAST_MATH__)  // a -ffast-math executable reads float and bfloat16 subnormals as 0 (DAZ)
    CHECK(kernels::host::sum_squares(tiny.data(), tiny.size()) > 0.0);
#endif
    check_accuracy(tiny, tiny.size());
    std::vector<T> big(70001, largest<T>());
    check_accuracy(big, big.size());
    const double S = kernels::host::sum_squares(big.data(), big.size());
    CHECK(!kernels::is_nonfinite(S));
    CHECK(S == doctest::Approx(70001.0 * kernels::exact_square(largest<T>())).epsilon(1e-15));
  }
  SUBCASE("all zeros, n = 0, n = 1") {
    std::vector<T> zeros(1000, from_float<T>(0.0f));
    zeros[3] = from_float<T>(-0.0f);
    check_accuracy(zeros, zeros.size());
    CHECK(kernels::host::sum_squares(zeros.data(), zeros.size()) == 0.0);
    CHECK(kernels::host::sum_squares(zeros.data(), 0) == 0.0);
    const SquareBound b0 = kernels::host::square_bound(zeros.data(), 0);
    CHECK(b0.max_square == 0.0);
    CHECK_FALSE(b0.nonfinite);
    FoldSums f;
    kernels::host::add_squares(zeros.data(), 0, NormGrid::make(0.0, 0), f);
    CHECK(kernels::fold_finish(f) == 0.0);
    const std::vector<T> one{from_float<T>(-3.0f)};
    CHECK(kernels::host::sum_squares(one.data(), 1) == 9.0);
    check_accuracy(one, 1);
  }
  SUBCASE("a count bound far above the element count (a 2^40-element model)") {
    const std::uint64_t N = std::uint64_t{1} << 40;
    check_accuracy(normal<T>(10007, 500), N);
    check_accuracy(spread<T>(10007, 501), N);
    auto x = spread<T>(10007, 502, -10, 10);
    x[5] = largest<T>();
    check_accuracy(x, N);
  }
}

TEST_CASE("norm grid: units, extractors and the checks of make") {
  const NormGrid g = NormGrid::make(4.0, 1000);  // M = 2^2 exactly: m = 2; N <= 2^10: n = 10, W = 43
  CHECK(g.max_exponent == 2);
  CHECK(g.count_log2 == 10);
  CHECK(g.unit[0] == 0x1p-40);
  CHECK(g.unit[1] == 0x1p-83);
  CHECK(g.unit[2] == 0x1p-126);
  for (int k = 0; k < 3; ++k) CHECK(g.extractor[k] == 1.5 * 0x1p52 * g.unit[k]);
  CHECK(NormGrid::make(4.000001, 1000).max_exponent == 3);
  CHECK(NormGrid::make(0.0, 0).max_exponent == NormGrid::kMinExponent);
  CHECK(NormGrid::make(0.0, 0).count_log2 == 1);
  CHECK(NormGrid::make(1.0, 1).count_log2 == 1);
  CHECK(NormGrid::make(1.0, 3).count_log2 == 2);
  CHECK(NormGrid::make(1.0, 4).count_log2 == 2);
  // The largest fp32 square with the largest count: every constant stays finite.
  const double fmax2 = kernels::exact_square(std::numeric_limits<float>::max());
  const NormGrid big = NormGrid::make(fmax2, std::uint64_t{1} << NormGrid::kMaxCountLog2);
  CHECK(big.max_exponent == 256);
  for (int k = 0; k < 3; ++k) CHECK_FALSE(kernels::is_nonfinite(big.extractor[k]));
  // The smallest: still normal fp64 units.
  const NormGrid small = NormGrid::make(0x1p-298, 1);
  CHECK(small.unit[2] >= std::numeric_limits<double>::min());
  CHECK_THROWS_AS(NormGrid::make(std::numeric_limits<double>::infinity(), 10), usage_error);
  CHECK_THROWS_AS(NormGrid::make(std::numeric_limits<double>::quiet_NaN(), 10), usage_error);
  CHECK_THROWS_AS(NormGrid::make(-1.0, 10), usage_error);
  CHECK_THROWS_AS(NormGrid::make(0x1p957, 10), usage_error);
  CHECK_THROWS_AS(NormGrid::make(1.0, (std::uint64_t{1} << 44) + 1), usage_error);
}

// ---- inf / NaN -------------------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("norm: inf, -inf and NaN anywhere make the bound non-finite", T, float, half, bfloat16) {
  for (std::size_t n : {std::size_t{1}, std::size_t{33}, std::size_t{100003}}) {
    const auto clean = normal<T>(n, 600 + n);
    CHECK_FALSE(kernels::host::square_bound(clean.data(), n).nonfinite);
    for (std::size_t at : {std::size_t{0}, n / 2, n - 1}) {
      for (float bad : {test::inf(), -test::inf(), test::qnan(), -test::qnan()}) {
        CAPTURE(n);
        CAPTURE(at);
        CAPTURE(bad);
        auto x = clean;
        x[at] = from_float<T>(bad);
        const SquareBound b = kernels::host::square_bound(x.data(), n);
        CHECK(b.nonfinite);
        CHECK(b.max_square == std::numeric_limits<double>::infinity());
        CHECK(kernels::host::sum_squares(x.data(), n) == std::numeric_limits<double>::infinity());
        CHECK(kernels::host::norm_and_check(x.data(), n).nonfinite);
        // Split: the flag survives the combine, whichever piece holds the bad element.
        const std::size_t cut = n / 3;
        const SquareBound parts =
            kernels::combine(kernels::host::square_bound(x.data(), cut), kernels::host::square_bound(x.data() + cut, n - cut));
        CHECK(same_bits(parts, b));
        const std::vector<TensorRef<const T>> list{{x.data(), cut}, {x.data() + cut, n - cut}};
        CHECK(same_bits(kernels::host::square_bound<T>(list), b));
      }
    }
  }
}

// zero/norms.hpp's deprecated names (removed in 0.3) still give the kernels' bits.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
TEST_CASE("norm: zero/norms.hpp's deprecated forwarders give the same bits as the kernels") {
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> x(1031);
  for (float& v : x) v = d(rng);
  const std::vector<TensorRef<const float>> halves{{x.data(), 500}, {x.data() + 500, x.size() - 500}};
  const SquareBound b = kernels::host::square_bound<float>(halves);
  CHECK(same_bits(zero::square_bound(x.data(), x.size()), b));
  CHECK(same_bits(zero::combine(zero::square_bound<float>(halves), zero::SquareBound{}), b));
  const zero::NormGrid grid = zero::NormGrid::make(b.max_square, x.size());
  zero::FoldSums mine, theirs;
  zero::add_squares<float>(halves, grid, mine);
  kernels::host::add_squares(x.data(), x.size(), grid, theirs);
  CHECK(same_bits(zero::finish(mine), kernels::fold_finish(theirs)));
  CHECK(same_bits(zero::finish(zero::combine(mine, zero::FoldSums{})), kernels::fold_finish(theirs)));
  CHECK(same_bits(zero::sum_squares(x.data(), x.size()), kernels::host::sum_squares(x.data(), x.size())));
  CHECK(zero::sum_squares(x.data(), x.size()) > 0.0);
}
#pragma GCC diagnostic pop
