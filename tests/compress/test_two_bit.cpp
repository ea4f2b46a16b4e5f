// The 2-bit codec: exact payload sizes (2 bits per value + the fp32 step), the levels and code
// boundaries on hand-made values, the error-feedback identity and bound, the edges.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "data.hpp"
#include "zerotk/compress/two_bit.hpp"

namespace test_two_bit {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using compress::TwoBitCodec;

static_assert(compress::ErrorFeedbackCodec<TwoBitCodec>);

namespace {
using test::Encoded;
Encoded encode_decode(const std::vector<float>& x, std::vector<float>& err) { return test::encode_decode<TwoBitCodec>(x, err); }
}  // namespace

TEST_CASE("two_bit: payload is 4 bytes of step + 2 bits per value, rounded up to a byte") {
  for (std::size_t n : {0u, 1u, 3u, 4u, 5u, 1000u, 1001u, 65537u}) {
    CAPTURE(n);
    CHECK(TwoBitCodec::payload_bytes(n) == 4 + (n + 3) / 4);
    std::vector<float> x = test::normal(1, n), err(n, 0.0f);
    CHECK(encode_decode(x, err).payload.size() == TwoBitCodec::payload_bytes(n));
  }
  CHECK((TwoBitCodec::payload_bytes(4000) - TwoBitCodec::kHeaderBytes) * 8 == 2 * 4000);
}

TEST_CASE("two_bit: levels -1.5, -0.5, +0.5, +1.5 step with step = max|y| / 1.5; nearest level, ties up") {
  // max |y| = 3, so step = 2: levels -3, -1, 1, 3 and boundaries -2, 0, 2.
  std::vector<float> x = {3, -3, 0, -0.5f, 2, -2, 1.9f, -1.9f};
  std::vector<float> err(x.size(), 0.0f);
  const Encoded e = encode_decode(x, err);
  CHECK(compress::detail::load_le_f32(e.payload.data()) == 2.0f);
  CHECK(e.payload[4] == 0xc9);  // codes 3 0 2 1
  CHECK(e.payload[5] == 0xd9);  // codes 3 1 2 1
  const std::vector<float> want = {3, -3, 1, -1, 3, -1, 1, -1};
  for (std::size_t i = 0; i < x.size(); ++i) {
    CAPTURE(i);
    CHECK(e.decoded[i] == want[i]);
    CHECK(err[i] == x[i] - want[i]);
  }
}

TEST_CASE("two_bit: error feedback identity and |error| <= step / 2 on random data") {
  for (std::size_t n : {1u, 6u, 4099u, 100003u}) {
    CAPTURE(n);
    const std::vector<float> x = test::normal(5, n);
    std::vector<float> err = test::normal(6, n, 0.3f);
    const std::vector<float> old = err;
    const Encoded e = encode_decode(x, err);
    const float step = compress::detail::load_le_f32(e.payload.data());
    float m = 0;
    for (std::size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i] + old[i]));
    CHECK(step == m / 1.5f);
    std::size_t over = 0, far = 0, off_level = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const auto g = test::feedback_gap(x[i], old[i], e.decoded[i], err[i]);
      if (g.gap > g.bound) ++over;
      if (std::fabs(err[i]) > 0.5f * step * (1.0f + std::ldexp(1.0f, -22))) ++far;
      const float d = e.decoded[i];
      if (d != -1.5f * step && d != -0.5f * step && d != 0.5f * step && d != 1.5f * step) ++off_level;
    }
    CHECK(over == 0);
    CHECK(far == 0);
    CHECK(off_level == 0);
  }
}

TEST_CASE("two_bit: error feedback carries what was dropped over many steps") {
  const std::size_t n = 2049, steps = 40;
  std::vector<float> err(n, 0.0f);
  std::vector<double> sent(n, 0.0), given(n, 0.0), slack(n, 0.0);
  for (std::size_t t = 0; t < steps; ++t) {
    const std::vector<float> x = test::normal(200 + t, n);
    const std::vector<float> old = err;
    const Encoded e = encode_decode(x, err);
    for (std::size_t i = 0; i < n; ++i) {
      sent[i] += e.decoded[i];
      given[i] += x[i];
      slack[i] += test::feedback_gap(x[i], old[i], e.decoded[i], err[i]).bound;
    }
  }
  std::size_t over = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (std::fabs(sent[i] + err[i] - given[i]) > slack[i] + 1e-9 * std::fabs(given[i])) ++over;
  }
  CHECK(over == 0);
}

TEST_CASE("two_bit: edges: n = 0, n = 1, all zeros, the largest float") {
  std::vector<float> none, none_err;
  CHECK(encode_decode(none, none_err).payload.size() == 4);

  std::vector<float> one = {-2.0f}, one_err = {0.0f};
  const Encoded e1 = encode_decode(one, one_err);
  CHECK(std::fabs(e1.decoded[0] + 2.0f) <= 2.0f * std::ldexp(1.0f, -23));
  CHECK(e1.decoded[0] + one_err[0] == -2.0f);

  std::vector<float> zeros(9, 0.0f), zero_err(9, 0.0f);
  const Encoded ez = encode_decode(zeros, zero_err);
  for (std::size_t i = 0; i < 9; ++i) {
    CHECK(ez.decoded[i] == 0.0f);
    CHECK(zero_err[i] == 0.0f);
  }

  const float big = std::numeric_limits<float>::max();
  std::vector<float> huge = {big, -big, 1.0f}, huge_err(3, 0.0f);
  const Encoded eh = encode_decode(huge, huge_err);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(std::isfinite(eh.decoded[i]));
    CHECK(std::isfinite(huge_err[i]));
  }
}

TEST_CASE("two_bit: inf/NaN is an error naming the index; error buffer and output untouched") {
  TwoBitCodec c;
  std::vector<float> x = test::normal(7, 6), err(6, 0.5f);
  x[3] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> before = err;
  std::vector<std::uint8_t> out(TwoBitCodec::payload_bytes(6), 0x5a);
  CHECK_THROWS_WITH_AS((void)c.encode(x, err, out), doctest::Contains("index 3"), numerics_error);
  CHECK(std::memcmp(err.data(), before.data(), err.size() * sizeof(float)) == 0);
  for (std::uint8_t v : out) CHECK(v == 0x5a);
}

TEST_CASE("two_bit: the host drivers (vector paths and tails) equal the per-element functions bit for bit") {
  for (std::size_t n : {0u, 1u, 3u, 4u, 5u, 31u, 1000u, 40003u}) {
    for (float step : {0.0f, 0.8f}) {
      CAPTURE(n);
      CAPTURE(step);
      std::vector<float> y = test::normal(n + 7, n);
      // Boundaries and signed zeros throughout: -step, 0, -0, +step hit exactly.
      const float special[] = {-step, 0.0f, -0.0f, step, 1.5f * step, -1.5f * step};
      for (std::size_t i = 0; i < n; i += 3) y[i] = special[(i / 3) % 6];
      std::vector<std::uint8_t> codes(compress::two_bit::packed_bytes(n), 0xa5), want(compress::two_bit::packed_bytes(n), 0);
      for (std::size_t b = 0; b * 4 < n; ++b) {
        want[b] = compress::two_bit::pack_byte(y.data() + 4 * b, static_cast<unsigned>(std::min<std::size_t>(4, n - 4 * b)), step);
      }
      compress::two_bit::pack(y.data(), n, step, codes.data());
      CHECK(codes == want);
      std::vector<float> fed = y;
      std::vector<std::uint8_t> codes2(codes.size(), 0x5a);
      compress::two_bit::pack_with_feedback(fed.data(), n, step, codes2.data());
      CHECK(codes2 == want);
      std::vector<float> out(n);
      compress::two_bit::unpack(want.data(), n, step, out.data());
      std::vector<float> sum(y.begin(), y.begin() + static_cast<std::ptrdiff_t>(n));  // unpack_add onto y
      compress::two_bit::unpack_add(want.data(), n, step, sum.data());
      std::size_t bad = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const float lv = compress::two_bit::level(compress::two_bit::code_at(want.data(), i), step);
        const float r = y[i] - compress::two_bit::level(compress::two_bit::code_of(y[i], step), step);
        const float s = y[i] + lv;
        if (std::memcmp(&fed[i], &r, 4) != 0 || std::memcmp(&out[i], &lv, 4) != 0 || std::memcmp(&sum[i], &s, 4) != 0) ++bad;
      }
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("two_bit: over threads the encode and decode equal one thread's bit for bit; a NaN in the last share changes nothing") {
  test::check_encode_over_threads<TwoBitCodec>();
}

}  // namespace test_two_bit
