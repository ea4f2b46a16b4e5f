// The 1-bit sign codec: exact payload sizes, bit order, sign(0) = +1, the scale, the error-feedback
// identity and its telescoping sum, and the edges (n = 0, 1, all zeros, inf/NaN, bad sizes).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "data.hpp"
#include "zerotk/compress/sign.hpp"

namespace test_sign {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using compress::SignCodec;

static_assert(compress::ErrorFeedbackCodec<SignCodec>);

namespace {
using test::Encoded;
Encoded encode_decode(const std::vector<float>& x, std::vector<float>& err) { return test::encode_decode<SignCodec>(x, err); }
}  // namespace

TEST_CASE("sign: payload is 4 bytes of scale + 1 bit per value, rounded up to a byte") {
  for (std::size_t n : {0u, 1u, 7u, 8u, 9u, 1000u, 1001u, 65537u}) {
    CAPTURE(n);
    CHECK(SignCodec::payload_bytes(n) == 4 + (n + 7) / 8);
    std::vector<float> x = test::normal(1, n), err(n, 0.0f);
    CHECK(encode_decode(x, err).payload.size() == SignCodec::payload_bytes(n));
  }
  CHECK(SignCodec::payload_bytes(8 * 1000) - SignCodec::kHeaderBytes == 1000);  // exactly 1 bit per value
}

TEST_CASE("sign: bit order is most significant first, sign(0) = sign(-0) = +1, unused bits 0") {
  std::vector<float> x = {-1, -1, -1, -1, -1, -1, -1, 1, 0.0f, -0.0f, -2};
  std::vector<float> err(x.size(), 0.0f);
  const Encoded e = encode_decode(x, err);
  CHECK(e.payload[4] == 0x01);
  CHECK(e.payload[5] == 0xc0);  // 0 -> 1, -0 -> 1, -2 -> 0, then five unused zero bits
  const float s = compress::detail::load_le_f32(e.payload.data());
  CHECK(e.decoded[8] == s);
  CHECK(e.decoded[9] == s);
  CHECK(e.decoded[10] == -s);
}

TEST_CASE("sign: scale = ||y|| / sqrt(n), decoded = +-scale, error = y - decoded bit for bit") {
  for (std::size_t n : {1u, 5u, 64u, 4097u, 100003u}) {
    CAPTURE(n);
    const std::vector<float> x = test::normal(2, n);
    std::vector<float> err = test::normal(3, n, 0.1f);
    const std::vector<float> old = err;
    const Encoded e = encode_decode(x, err);
    long double ss = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const long double y = static_cast<long double>(x[i] + old[i]);
      ss += y * y;
    }
    const float s = compress::detail::load_le_f32(e.payload.data());
    const double want = static_cast<double>(std::sqrt(ss / static_cast<long double>(n)));
    CHECK(std::fabs(static_cast<double>(s) - want) <= want * std::ldexp(1.0, -23));
    std::size_t bad = 0, over = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const float y = x[i] + old[i];
      const float d = y >= 0.0f ? s : -s;
      if (e.decoded[i] != d || err[i] != y - d) ++bad;
      const auto g = test::feedback_gap(x[i], old[i], e.decoded[i], err[i]);
      if (g.gap > g.bound) ++over;
    }
    CHECK(bad == 0);
    CHECK(over == 0);
  }
}

TEST_CASE("sign: error feedback carries what was dropped: sum of decoded + last error = sum of inputs") {
  const std::size_t n = 3001, steps = 40;
  std::vector<float> err(n, 0.0f);
  std::vector<double> sent(n, 0.0), given(n, 0.0), slack(n, 0.0);
  for (std::size_t t = 0; t < steps; ++t) {
    const std::vector<float> x = test::normal(100 + t, n);
    const std::vector<float> old = err;
    const Encoded e = encode_decode(x, err);
    for (std::size_t i = 0; i < n; ++i) {
      sent[i] += e.decoded[i];
      given[i] += x[i];
      slack[i] += test::feedback_gap(x[i], old[i], e.decoded[i], err[i]).bound;
    }
  }
  std::size_t over = 0;
  double largest_error = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (std::fabs(sent[i] + err[i] - given[i]) > slack[i] + 1e-9 * std::fabs(given[i])) ++over;
    largest_error = std::max(largest_error, std::fabs(static_cast<double>(err[i])));
  }
  CHECK(over == 0);
  CHECK(largest_error > 0.1);  // the error buffer really holds something (the test is not vacuous)
}

TEST_CASE("sign: edges: n = 0, n = 1, all zeros") {
  std::vector<float> none, none_err;
  const Encoded e0 = encode_decode(none, none_err);
  CHECK(e0.payload.size() == 4);
  CHECK(compress::detail::load_le_f32(e0.payload.data()) == 0.0f);

  std::vector<float> one = {-3.0f}, one_err = {0.0f};
  const Encoded e1 = encode_decode(one, one_err);
  CHECK(e1.decoded[0] == -3.0f);  // the RMS of one value is its magnitude
  CHECK(one_err[0] == 0.0f);

  std::vector<float> zeros(17, 0.0f), zero_err(17, 0.0f);
  const Encoded ez = encode_decode(zeros, zero_err);
  for (std::size_t i = 0; i < 17; ++i) {
    CHECK(ez.decoded[i] == 0.0f);
    CHECK(zero_err[i] == 0.0f);
  }
}

TEST_CASE("sign: inf/NaN in the input, the error or their sum is an error naming the index; nothing changes") {
  SignCodec c;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  struct Bad {
    float x, e;
    std::string index_text;
  };
  for (const Bad& b : {Bad{nan, 0.0f, "index 5"}, Bad{1.0f, inf, "index 5"}, Bad{3e38f, 3e38f, "index 5"}}) {
    std::vector<float> x = test::normal(4, 9), err(9, 0.25f);
    x[5] = b.x;
    err[5] = b.e;
    const std::vector<float> before = err;
    std::vector<std::uint8_t> out(SignCodec::payload_bytes(9), 0x5a);
    try {
      (void)c.encode(x, err, out);
      FAIL("no error for a non-finite input");
    } catch (const numerics_error& e) {
      CHECK(std::string(e.what()).find(b.index_text) != std::string::npos);
    }
    CHECK(std::memcmp(err.data(), before.data(), err.size() * sizeof(float)) == 0);
    for (std::uint8_t v : out) CHECK(v == 0x5a);
  }
}

TEST_CASE("sign: sizes that do not match are usage errors carrying the size") {
  SignCodec c;
  std::vector<float> x(10, 1.0f), err(9, 0.0f), dec(10);
  std::vector<std::uint8_t> out(SignCodec::payload_bytes(10));
  CHECK_THROWS_WITH_AS((void)c.encode(x, err, out), doctest::Contains("(got 9)"), usage_error);
  err.resize(10);
  // The size is hidden from the optimizer: with it known, GCC 12 warns (-Warray-bounds) about the
  // store after the check, on a path the check's throw makes unreachable.
  volatile std::size_t one = 1;
  std::vector<std::uint8_t> small(SignCodec::payload_bytes(10) - one);
  CHECK_THROWS_WITH_AS((void)c.encode(x, err, small), doctest::Contains("(got 5)"), usage_error);
  CHECK_THROWS_WITH_AS(c.decode(small, dec), doctest::Contains("(got 5)"), usage_error);
}

TEST_CASE("sign: the host drivers (vector paths and tails) equal the per-element functions bit for bit") {
  for (std::size_t n : {0u, 1u, 7u, 8u, 9u, 31u, 1000u, 40003u}) {
    for (float scale : {0.0f, 0.75f}) {
      CAPTURE(n);
      CAPTURE(scale);
      std::vector<float> y = test::normal(n + 5, n);
      for (std::size_t i = 0; i < n; i += 5) y[i] = (i % 10 == 0) ? 0.0f : -0.0f;  // signed zeros throughout
      std::vector<std::uint8_t> bits(compress::sign::packed_bytes(n), 0xa5), want(compress::sign::packed_bytes(n), 0);
      for (std::size_t b = 0; b * 8 < n; ++b) {
        want[b] = compress::sign::pack_byte(y.data() + 8 * b, static_cast<unsigned>(std::min<std::size_t>(8, n - 8 * b)));
      }
      compress::sign::pack(y.data(), n, bits.data());
      CHECK(bits == want);
      std::vector<float> fed = y;
      std::vector<std::uint8_t> bits2(bits.size(), 0x5a);
      compress::sign::pack_with_feedback(fed.data(), n, scale, bits2.data());
      CHECK(bits2 == want);
      std::vector<float> out(n), out_want(n);
      compress::sign::unpack(want.data(), n, scale, out.data());
      std::vector<float> sum(y.begin(), y.begin() + static_cast<std::ptrdiff_t>(n));  // unpack_add onto y
      compress::sign::unpack_add(want.data(), n, scale, sum.data());
      std::size_t bad = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const float r = compress::sign::residual(y[i], scale), v = compress::sign::value(want.data(), i, scale);
        const float s = y[i] + v;
        if (std::memcmp(&fed[i], &r, 4) != 0 || std::memcmp(&out[i], &v, 4) != 0 || std::memcmp(&sum[i], &s, 4) != 0) ++bad;
      }
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("sign: over threads the encode and decode equal one thread's bit for bit; a NaN in the last share changes nothing") {
  test::check_encode_over_threads<SignCodec>();
}

}  // namespace test_sign
