#pragma once
// Seeded test data and the error-feedback bound shared by the compress tests.
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

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
  e.payload.assign(Codec::payload_bytes(x.size()), 0xff);
  CHECK(c.encode(x, err, e.payload) == Codec::payload_bytes(x.size()));
  e.decoded.assign(x.size(), 123.0f);
  c.decode(e.payload, e.decoded);
  return e;
}

}  // namespace zerotk::test
