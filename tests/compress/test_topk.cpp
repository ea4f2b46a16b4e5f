// Top-k with error feedback: k from the ratio, exact payload sizes (8 + 8 k), the selection against a
// sorting reference (ties included), the exact round trip of the kept values, the exact feedback
// identity, gaps, bad options, corrupt payloads and inf/NaN; the threaded encode equal to one thread.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "data.hpp"
#include "zerotk/compress/topk.hpp"

namespace test_topk {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using compress::TopKCodec;
using compress::TopKOptions;

static_assert(compress::ErrorFeedbackCodec<TopKCodec>);

namespace {

/// The reference: indices ordered by (|y| descending, index ascending), the first k, sorted.
std::vector<std::uint32_t> reference_topk(const std::vector<float>& y, std::size_t k) {
  std::vector<std::uint32_t> idx(y.size());
  std::iota(idx.begin(), idx.end(), 0u);
  std::sort(idx.begin(), idx.end(), [&](std::uint32_t a, std::uint32_t b) {
    const float fa = std::fabs(y[a]), fb = std::fabs(y[b]);
    return fa != fb ? fa > fb : a < b;
  });
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

std::vector<std::uint32_t> payload_indices(const std::vector<std::uint8_t>& p) {
  const std::size_t k = compress::detail::load_le32(p.data() + 4);
  std::vector<std::uint32_t> idx(k);
  for (std::size_t j = 0; j < k; ++j) idx[j] = compress::detail::load_le32(p.data() + 8 + 4 * j);
  return idx;
}

/// Values with many exact ties (small integers and their negatives, zeros included).
std::vector<float> tied(std::uint64_t seed, std::size_t n) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> d(-6, 6);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(d(rng)) * 0.25f;
  return v;
}

}  // namespace

TEST_CASE("topk: k = ceil(ratio n), products within 4 ulp of an integer taken as it, clamped to [1, n]") {
  CHECK(compress::topk_count(0.01, 100) == 1);
  CHECK(compress::topk_count(0.07, 100) == 7);  // fp64 product 7.000000000000001
  CHECK(compress::topk_count(0.3, 10) == 3);    // fp64 product 3.0000000000000004
  CHECK(compress::topk_count(0.5, 3) == 2);
  CHECK(compress::topk_count(0.01, 1001) == 11);
  CHECK(compress::topk_count(1.0, 5) == 5);
  CHECK(compress::topk_count(1e-12, 10) == 1);
  CHECK(compress::topk_count(0.5, 1) == 1);
  CHECK(compress::topk_count(0.5, 0) == 0);
  // Large n: 0.5000001 * 2^30 = 536871019.374...; an integer within 4 ulp only counts, so this rounds up.
  CHECK(compress::topk_count(0.5000001, std::size_t{1} << 30) == 536871020);
}

TEST_CASE("topk: payload is an 8-byte header + 8 bytes per kept value, exactly") {
  const TopKCodec c(TopKOptions{0.01});
  for (std::size_t n : {0u, 1u, 99u, 100u, 1000u, 1001u, 65537u}) {
    CAPTURE(n);
    const std::size_t k = compress::topk_count(0.01, n);
    CHECK(c.payload_bytes(n) == 8 + 8 * k);
    std::vector<float> x = test::normal(1, n), err(n, 0.0f);
    std::vector<std::uint8_t> out(c.payload_bytes(n));
    CHECK(c.encode(x, err, out) == 8 + 8 * k);
    CHECK(compress::detail::load_le32(out.data()) == n);
    CHECK(compress::detail::load_le32(out.data() + 4) == k);
  }
}

TEST_CASE("topk: the kept indices are the k largest |y| (lower index first among ties), ascending") {
  for (double ratio : {0.001, 0.01, 0.1, 0.5, 0.999, 1.0}) {
    for (std::size_t n : {1u, 2u, 17u, 1000u, 40000u}) {
      for (int kind = 0; kind < 2; ++kind) {
        CAPTURE(ratio);
        CAPTURE(n);
        CAPTURE(kind);
        const TopKCodec c(TopKOptions{ratio});
        const std::vector<float> x = kind == 0 ? test::normal(n, n) : tied(n, n);
        std::vector<float> err = kind == 0 ? test::normal(n + 1, n, 0.01f) : std::vector<float>(n, 0.0f);
        std::vector<float> y(n);
        for (std::size_t i = 0; i < n; ++i) y[i] = x[i] + err[i];
        const std::vector<float> old = err;
        std::vector<std::uint8_t> out(c.payload_bytes(n));
        (void)c.encode(x, err, out);
        const auto want = reference_topk(y, c.kept(n));
        CHECK(payload_indices(out) == want);
        std::vector<std::uint32_t> sel(c.kept(n));
        compress::topk::select(y.data(), n, sel.size(), sel.data());
        CHECK(sel == want);
        // Decoding gives y where kept and 0 elsewhere; the error is the rest: decoded + error == y exactly.
        std::vector<float> d(n, 7.0f);
        c.decode(out, d);
        std::size_t bad = 0;
        std::vector<char> kept(n, 0);
        for (std::uint32_t i : want) kept[i] = 1;
        for (std::size_t i = 0; i < n; ++i) {
          const bool ok = kept[i] ? (d[i] == y[i] && err[i] == 0.0f) : (d[i] == 0.0f && err[i] == y[i]);
          if (!ok || d[i] + err[i] != y[i]) ++bad;
        }
        CHECK(bad == 0);
      }
    }
  }
}

TEST_CASE("topk: error feedback delivers every value eventually: sum of decoded + error = sum of inputs") {
  const TopKCodec c(TopKOptions{0.05});
  const std::size_t n = 5000, steps = 60;
  std::vector<float> err(n, 0.0f), d(n);
  std::vector<double> sent(n, 0.0), given(n, 0.0), slack(n, 0.0);
  std::vector<std::uint8_t> out(c.payload_bytes(n));
  for (std::size_t t = 0; t < steps; ++t) {
    const std::vector<float> x = test::normal(300 + t, n);
    for (std::size_t i = 0; i < n; ++i) slack[i] += std::ldexp(1.0, -24) * std::fabs(static_cast<double>(x[i] + err[i]));
    (void)c.encode(x, err, out);
    c.decode(out, d);
    for (std::size_t i = 0; i < n; ++i) {
      sent[i] += d[i];
      given[i] += x[i];
    }
  }
  std::size_t over = 0, never_sent = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (std::fabs(sent[i] + err[i] - given[i]) > slack[i] + 1e-12) ++over;
    if (sent[i] == 0.0) ++never_sent;
  }
  CHECK(over == 0);
  CHECK(never_sent < n / 2);  // the accumulated error pushes small coordinates out too
}

TEST_CASE("topk: gaps round trip and are small") {
  const TopKCodec c(TopKOptions{0.01});
  const std::size_t n = 1 << 16;
  std::vector<float> x = test::normal(9, n), err(n, 0.0f);
  std::vector<std::uint8_t> out(c.payload_bytes(n));
  (void)c.encode(x, err, out);
  const std::vector<std::uint8_t> original = out;
  compress::topk::indices_to_gaps(out);
  const std::size_t k = c.kept(n);
  std::uint64_t sum = 0;
  for (std::size_t j = 0; j < k; ++j) sum += compress::detail::load_le32(out.data() + 8 + 4 * j);
  CHECK(sum == payload_indices(original).back());
  compress::topk::gaps_to_indices(out);
  CHECK(out == original);
}

TEST_CASE("topk: topk_ratio outside (0, 1] is a config error naming the value") {
  for (double bad : {0.0, -0.25, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    CAPTURE(bad);
    try {
      const TopKCodec c(TopKOptions{bad});
      FAIL("accepted topk_ratio " << bad);
    } catch (const config_error& e) {
      const std::string what = e.what();
      CHECK(what.find("topk_ratio") != std::string::npos);
      CHECK(e.value() == to_text(bad));
    }
  }
  CHECK_THROWS_WITH_AS(TopKCodec(TopKOptions{1.5}), doctest::Contains("(got 1.5)"), config_error);
  CHECK_NOTHROW(TopKCodec(TopKOptions{1.0}));
}

TEST_CASE("topk: edges: n = 0, n = 1, all zeros") {
  const TopKCodec c(TopKOptions{0.3});
  std::vector<float> none, none_err;
  std::vector<std::uint8_t> out0(c.payload_bytes(0));
  CHECK(out0.size() == 8);
  CHECK(c.encode(none, none_err, out0) == 8);

  std::vector<float> one = {-4.0f}, one_err = {1.0f}, d1(1);
  std::vector<std::uint8_t> out1(c.payload_bytes(1));
  CHECK(out1.size() == 16);
  (void)c.encode(one, one_err, out1);
  c.decode(out1, d1);
  CHECK(d1[0] == -3.0f);
  CHECK(one_err[0] == 0.0f);

  std::vector<float> zeros(10, 0.0f), zero_err(10, 0.0f), dz(10, 1.0f);
  std::vector<std::uint8_t> outz(c.payload_bytes(10));
  (void)c.encode(zeros, zero_err, outz);
  c.decode(outz, dz);
  CHECK(payload_indices(outz) == std::vector<std::uint32_t>{0, 1, 2});
  for (std::size_t i = 0; i < 10; ++i) CHECK(dz[i] == 0.0f);
}

TEST_CASE("topk: inf/NaN is an error naming the index, nothing changed; corrupt payloads are rejected") {
  const TopKCodec c(TopKOptions{0.5});
  std::vector<float> x = test::normal(11, 8), err(8, 0.125f);
  x[6] = -std::numeric_limits<float>::infinity();
  const std::vector<float> before = err;
  std::vector<std::uint8_t> out(c.payload_bytes(8), 0x5a);
  CHECK_THROWS_WITH_AS((void)c.encode(x, err, out), doctest::Contains("index 6"), numerics_error);
  CHECK(std::memcmp(err.data(), before.data(), err.size() * sizeof(float)) == 0);
  for (std::uint8_t v : out) CHECK(v == 0x5a);

  x[6] = 1.0f;
  (void)c.encode(x, err, out);
  std::vector<float> d(8, 7.0f);
  std::vector<std::uint8_t> bad = out;
  compress::detail::store_le32(bad.data() + 8 + 4 * 3, 8);  // the last index (k = 4) out of range
  CHECK_THROWS_WITH_AS(c.decode(bad, d), doctest::Contains("(got 8)"), usage_error);
  for (float v : d) CHECK(v == 7.0f);  // checked before any write
  bad = out;
  compress::detail::store_le32(bad.data() + 12, compress::detail::load_le32(out.data() + 8));  // repeated index
  CHECK_THROWS_AS(c.decode(bad, d), usage_error);
  for (float v : d) CHECK(v == 7.0f);
  std::vector<float> d9(9);
  CHECK_THROWS_AS(c.decode(out, d9), usage_error);  // payload of n = 8 read as n = 9
}

TEST_CASE("topk: the encode over 2 and 3 threads equals one thread bit for bit (payload, decode, error)") {
  test::check_encode_over_threads(TopKCodec{});
  test::check_encode_over_threads(TopKCodec(TopKOptions{0.3}));
}

TEST_CASE("topk: over threads, the kept ties are the lowest indices, whichever share holds them") {
  // Every third |y| is 1, the rest 0.5: at ratio 0.8 all the 1s are kept and the 0.5s up to index
  // ~140000, so the last kept tie lies in the second of 2 shares and the third of 3.
  constexpr std::size_t n = 200003;
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = i % 3 == 0 ? (i % 2 ? -1.0f : 1.0f) : (i % 2 ? 0.5f : -0.5f);
  const TopKCodec codec(TopKOptions{0.8});
  const std::size_t k = codec.kept(n);
  const std::vector<std::uint32_t> want = reference_topk(x, k);
  REQUIRE(want.back() > n / 2);  // the ties reach past the first of 2 shares
  for (int threads : {1, 2, 3}) {
    CAPTURE(threads);
    const auto [payload, decoded, err] = test::encode_on(threads, codec, x, std::vector<float>(n, 0.0f));
    CHECK(payload_indices(payload) == want);
    std::size_t kept = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const bool is_kept = decoded[i] != 0.0f;
      kept += is_kept;
      CHECK((is_kept ? decoded[i] : err[i]) == x[i]);
      if (is_kept) CHECK(err[i] == 0.0f);
    }
    CHECK(kept == k);
  }
}

}  // namespace test_topk
