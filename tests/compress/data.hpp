#pragma once
// Seeded test data and the error-feedback bound shared by the compress tests.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "../kernels/kernel_test_util.hpp"  // Threads
#include "zerotk/core/error.hpp"

namespace zerotk::test {

/// n values ~ N(0, sigma^2), deterministic in (seed, n).
inline std::vector<float> normal(std::uint64_t seed, std::size_t n, float sigma = 1.0f) {
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + n);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

/// |d + e_new - (x + e_old)| (in fp64) and the bound the codecs promise for it: y = fl(x + e_old) and
/// e_new = fl(y - d) are one rounding each, so the gap is <= 2^-24 (|y| + |e_new|).
struct FeedbackGap {
  double gap, bound;
};
inline FeedbackGap feedback_gap(float x, float e_old, float d, float e_new) {
  const float y = x + e_old;
  const double gap = std::fabs(static_cast<double>(d) + static_cast<double>(e_new) -
                               (static_cast<double>(x) + static_cast<double>(e_old)));
  const double bound = std::ldexp(1.0, -24) * (std::fabs(static_cast<double>(y)) + std::fabs(static_cast<double>(e_new)));
  return {gap, bound};
}

/// A codec's payload and its decode, from fresh buffers filled with markers (0xff bytes, 123.0f) so a
/// value left unwritten shows; checks that encode returns payload_bytes(n).
struct Encoded {
  std::vector<std::uint8_t> payload;
  std::vector<float> decoded;
};
template <class Codec>
Encoded encode_decode(const std::vector<float>& x, std::vector<float>& err, const Codec& c = Codec()) {
  Encoded e;
  e.payload.assign(c.payload_bytes(x.size()), 0xff);
  CHECK(c.encode(x, err, e.payload) == c.payload_bytes(x.size()));
  e.decoded.assign(x.size(), 123.0f);
  c.decode(e.payload, e.decoded);
  return e;
}

/// Encodes and decodes x with codec c on `threads` OpenMP threads (the codecs' drivers run over
/// kernels/host/parallel.hpp's threads) from a copy of err; returns the payload,
/// the decoded values and the new error, to compare runs on different thread counts.
template <class Codec>
std::tuple<std::vector<std::uint8_t>, std::vector<float>, std::vector<float>> encode_on(int threads, const Codec& c,
                                                                                      const std::vector<float>& x,
                                                                                      std::vector<float> err) {
  Threads t(threads);
  Encoded e = encode_decode(x, err, c);
  return {std::move(e.payload), std::move(e.decoded), std::move(err)};
}

/// The codec over 2 and 3 threads equals one thread bit for bit (payload, decoded values, error) on
/// 200003 values: over 2 x 32Ki, so the drivers split them between the threads (the bit codecs in
/// shares of whole bytes, top-k in shares with a histogram each), and not a multiple of 64, so the
/// last share ends inside a byte. A NaN in the last share
/// is an error naming its index, with the error buffer and the output untouched.
template <class Codec>
void check_encode_over_threads(const Codec& c = Codec{}) {
  constexpr std::size_t n = 200003;
  const std::vector<float> x = normal(11, n), err0 = normal(12, n, 0.1f);
  const auto one = encode_on(1, c, x, err0);
  for (int threads : {2, 3}) {
    CAPTURE(threads);
    CHECK(encode_on(threads, c, x, err0) == one);
  }
  std::vector<float> bad = x, err = err0;
  bad[n - 2] = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::uint8_t> out(c.payload_bytes(n), 0x5a);
  Threads t(3);
  try {
    (void)c.encode(bad, err, out);
    FAIL("no error for a NaN");
  } catch (const numerics_error& e) {
    CHECK(std::string(e.what()).find("index " + std::to_string(n - 2)) != std::string::npos);
  }
  CHECK(err == err0);
  CHECK(std::all_of(out.begin(), out.end(), [](std::uint8_t v) { return v == 0x5a; }));
}

}  // namespace zerotk::test
