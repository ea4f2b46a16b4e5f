// Canonical Huffman coding: exact round trips, the exact encoded size from the histogram, canonical
// codes on a hand-made case, ratios on real payloads (top-k with gaps, 2-bit codes), long codes, and
// corrupt payloads.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "data.hpp"
#include "zerotk/compress/huffman.hpp"
#include "zerotk/compress/topk.hpp"
#include "zerotk/compress/two_bit.hpp"

namespace test_huffman {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
namespace huffman = compress::huffman;

namespace {

/// Encodes, checks the size against encoded_bytes and max_encoded_bytes, decodes, returns the size.
std::size_t round_trip(const std::vector<std::uint8_t>& in) {
  const std::vector<std::uint8_t> enc = huffman::encode(in);
  CHECK(enc.size() == huffman::encoded_bytes(huffman::histogram(in)));
  CHECK(enc.size() <= huffman::max_encoded_bytes(in.size()));
  CHECK(huffman::decoded_size(enc) == in.size());
  std::vector<std::uint8_t> out(in.size(), 0xee);
  huffman::decode(enc, out);
  CHECK(out == in);
  return enc.size();
}

}  // namespace

TEST_CASE("huffman: canonical codes on a hand-made case") {
  // counts: 'c' 2, 'a' 1, 'b' 1 -> lengths c 1, a 2, b 2; canonical: c = 0, a = 10, b = 11.
  const std::vector<std::uint8_t> in = {'c', 'a', 'c', 'b'};
  const auto len = huffman::code_lengths(huffman::histogram(in));
  CHECK(len['c'] == 1);
  CHECK(len['a'] == 2);
  CHECK(len['b'] == 2);
  const auto enc = huffman::encode(in);
  REQUIRE(enc.size() == huffman::kHeaderBytes + 1);
  CHECK(enc[huffman::kHeaderBytes] == 0x4c);  // 0 10 0 11 + 00 padding = 0100 1100
  CHECK(round_trip(in) == huffman::kHeaderBytes + 1);
}

TEST_CASE("huffman: exact round trips and sizes: empty, one byte, one symbol, uniform, skewed, all 256") {
  CHECK(round_trip({}) == huffman::kHeaderBytes);
  CHECK(round_trip({42}) == huffman::kHeaderBytes + 1);
  CHECK(round_trip(std::vector<std::uint8_t>(1000, 7)) == huffman::kHeaderBytes + 125);  // 1 bit each

  std::mt19937_64 rng(1);
  std::vector<std::uint8_t> uniform(100000);
  for (auto& b : uniform) b = static_cast<std::uint8_t>(rng());
  round_trip(uniform);

  std::geometric_distribution<int> geo(0.3);
  std::vector<std::uint8_t> skewed(100000);
  for (auto& b : skewed) b = static_cast<std::uint8_t>(std::min(geo(rng), 255));
  const std::size_t s = round_trip(skewed);
  CHECK(s < skewed.size() / 2);  // entropy about 2.9 bits per byte
  MESSAGE("geometric(0.3) bytes: ratio " << huffman::ratio(skewed.size(), s));

  std::vector<std::uint8_t> all(256 * 3);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint8_t>(i);
  CHECK(round_trip(all) == huffman::kHeaderBytes + all.size());  // 256 equal counts: 8 bits each
}

TEST_CASE("huffman: long codes (Fibonacci counts) round trip") {
  std::vector<std::uint8_t> in;
  std::uint64_t a = 1, b = 1;
  for (int sym = 0; sym < 26; ++sym) {
    in.insert(in.end(), a, static_cast<std::uint8_t>(sym));
    const std::uint64_t c = a + b;
    a = b;
    b = c;
  }
  const auto len = huffman::code_lengths(huffman::histogram(in));
  CHECK(len[0] == 25);  // the rarest two symbols sit at depth m - 1
  CHECK(len[25] == 1);
  round_trip(in);
}

TEST_CASE("huffman: below the raw size on a top-k payload with gaps and on 2-bit codes (ratios reported)") {
  const std::size_t n = std::size_t{1} << 20;
  const compress::TopKCodec topk(compress::TopKOptions{0.01});
  std::vector<float> x = test::normal(21, n), err(n, 0.0f);
  std::vector<std::uint8_t> payload(topk.payload_bytes(n));
  (void)topk.encode(x, err, payload);
  const std::size_t raw_bytes = payload.size();
  const std::size_t plain = round_trip(payload);
  compress::topk::indices_to_gaps(payload);
  const std::size_t gapped = round_trip(payload);
  CHECK(gapped < raw_bytes);
  CHECK(gapped < plain);
  MESSAGE("top-k 1% of 2^20 fp32: payload " << raw_bytes << " B (4 MiB raw fp32); Huffman " << plain << " B (ratio "
                                            << huffman::ratio(raw_bytes, plain) << "), with gaps " << gapped
                                            << " B (ratio " << huffman::ratio(raw_bytes, gapped) << ")");

  const compress::TwoBitCodec two;
  std::vector<float> err2(n, 0.0f);
  std::vector<std::uint8_t> codes(two.payload_bytes(n));
  (void)two.encode(x, err2, codes);
  const std::size_t coded = round_trip(codes);
  CHECK(coded < codes.size());
  MESSAGE("2-bit codes of 2^20 N(0,1) values: " << codes.size() << " B; Huffman " << coded << " B (ratio "
                                                << huffman::ratio(codes.size(), coded) << ")");
}

TEST_CASE("huffman: corrupt payloads are usage errors") {
  std::vector<std::uint8_t> in(500);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<std::uint8_t>(i % 7 == 0 ? 3 : i % 3);
  const auto enc = huffman::encode(in);
  std::vector<std::uint8_t> out(in.size());

  auto truncated = enc;
  truncated.pop_back();
  CHECK_THROWS_WITH_AS(huffman::decode(truncated, out), doctest::Contains("truncated"), usage_error);
  auto padded = enc;
  padded.push_back(0);
  CHECK_THROWS_WITH_AS(huffman::decode(padded, out), doctest::Contains("after its last code"), usage_error);
  auto kraft = enc;
  kraft[4 + 10] = kraft[4 + 11] = kraft[4 + 12] = 1;  // three 1-bit codes
  CHECK_THROWS_WITH_AS(huffman::decode(kraft, out), doctest::Contains("Kraft"), usage_error);
  std::vector<std::uint8_t> wrong(in.size() + 1);
  CHECK_THROWS_WITH_AS(huffman::decode(enc, wrong), doctest::Contains("(got 501)"), usage_error);
  std::vector<std::uint8_t> short_header(10);
  CHECK_THROWS_AS((void)huffman::decoded_size(short_header), usage_error);
}

}  // namespace test_huffman
