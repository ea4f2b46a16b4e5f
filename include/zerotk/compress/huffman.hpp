#pragma once
/// \file zerotk/compress/huffman.hpp
/// Canonical Huffman coding of a byte payload (a top-k payload with gaps, 2-bit codes, sign bits):
/// lossless, decoded exactly, with the encoded size known from the byte histogram before encoding.
///
/// Code lengths: Huffman's algorithm on the 256 byte counts, made deterministic (leaves ordered by
/// (count, byte value); on equal weights a leaf is merged before an internal node). A payload with a
/// single distinct byte gets a 1-bit code. Codes are canonical (DEFLATE's rule): ordered by (length,
/// byte value), each the previous one plus 1, shifted left when the length grows. So the 256 lengths
/// alone define the code.
///
/// Format: [u32 n, little-endian: bytes encoded][256 x u8 code length, 0 = absent][the codes of the n
/// bytes, most significant bit first, zero bits up to the next byte].
///   encoded_bytes(counts) = 260 + ceil(sum_b counts[b] * length[b] / 8)      exact
///   max_encoded_bytes(n)  = 260 + n     (a Huffman code is never longer than the fixed 8-bit code)
/// So Huffman pays off above a few hundred bytes; `ratio` reports raw / encoded.
/// n < 2^32, hence every code length is <= 46 (a length L needs a total count >= Fibonacci(L + 2)).

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "zerotk/compress/codec.hpp"
#include "zerotk/core/error.hpp"

namespace zerotk::compress::huffman {

using Counts = std::array<std::uint64_t, 256>;
using Lengths = std::array<std::uint8_t, 256>;

inline constexpr std::size_t kHeaderBytes = 4 + 256;
/// Longest code accepted by the decoder (the encoder never makes one above 46; see the file comment).
inline constexpr unsigned kMaxCodeBits = 56;

inline Counts histogram(std::span<const std::uint8_t> bytes) {
  Counts c{};
  for (std::uint8_t b : bytes) ++c[b];
  return c;
}

/// Huffman code lengths of the byte counts (0 for absent bytes).
inline Lengths code_lengths(const Counts& counts) {
  Lengths len{};
  std::array<std::uint16_t, 256> leaf{};  // byte values present, by (count, value)
  std::size_t m = 0;
  for (unsigned b = 0; b < 256; ++b) {
    if (counts[b] != 0) leaf[m++] = static_cast<std::uint16_t>(b);
  }
  if (m == 0) return len;
  if (m == 1) {
    len[leaf[0]] = 1;
    return len;
  }
  std::sort(leaf.begin(), leaf.begin() + static_cast<std::ptrdiff_t>(m),  // by count, ties by byte value
            [&](std::uint16_t a, std::uint16_t b) { return counts[a] != counts[b] ? counts[a] < counts[b] : a < b; });
  // Nodes 0..m-1 are the leaves in that order, m..2m-2 the internal nodes in creation order (their
  // weights never decrease, so the two queues stay sorted).
  std::array<std::uint64_t, 511> weight{};
  std::array<std::uint16_t, 511> parent{};
  for (std::size_t i = 0; i < m; ++i) weight[i] = counts[leaf[i]];
  std::size_t next_leaf = 0, next_inner = m, made = m;
  auto take = [&]() -> std::size_t {
    if (next_leaf < m && (next_inner == made || weight[next_leaf] <= weight[next_inner])) return next_leaf++;
    return next_inner++;
  };
  while (made < 2 * m - 1) {
    const std::size_t a = take(), b = take();
    weight[made] = weight[a] + weight[b];
    parent[a] = parent[b] = static_cast<std::uint16_t>(made);
    ++made;
  }
  std::array<std::uint8_t, 511> depth{};
  for (std::size_t i = made - 1; i-- > 0;) depth[i] = static_cast<std::uint8_t>(depth[parent[i]] + 1);
  for (std::size_t i = 0; i < m; ++i) {
    if (depth[i] > kMaxCodeBits) {
      throw usage_error("Huffman code longer than " + std::to_string(kMaxCodeBits) + " bits (more than 2^32 bytes?)",
                        "compress::huffman::code_lengths", std::to_string(depth[i]));
    }
    len[leaf[i]] = depth[i];
  }
  return len;
}

/// Exact size of the encoding of bytes with these counts.
inline std::size_t encoded_bytes(const Counts& counts) {
  const Lengths len = code_lengths(counts);
  std::uint64_t bits = 0;
  for (unsigned b = 0; b < 256; ++b) bits += counts[b] * len[b];
  return kHeaderBytes + static_cast<std::size_t>((bits + 7) / 8);
}

constexpr std::size_t max_encoded_bytes(std::size_t n) noexcept { return kHeaderBytes + n; }

/// raw / encoded (e.g. 2.0: half the bytes).
inline double ratio(std::size_t raw_bytes, std::size_t encoded) {
  return encoded == 0 ? 0.0 : static_cast<double>(raw_bytes) / static_cast<double>(encoded);
}

namespace detail {

/// Canonical codes from lengths: code[b] holds the `len[b]` low bits. Also checks Kraft's inequality
/// (a decoder's defence against a corrupt table).
inline std::array<std::uint64_t, 256> canonical_codes(const Lengths& len, const char* where) {
  std::array<std::uint32_t, kMaxCodeBits + 1> per_len{};
  for (unsigned b = 0; b < 256; ++b) {
    if (len[b] > kMaxCodeBits) {
      throw usage_error("code length of byte " + std::to_string(b) + " is above " + std::to_string(kMaxCodeBits), where,
                        std::to_string(len[b]));
    }
    ++per_len[len[b]];
  }
  per_len[0] = 0;
  std::array<std::uint64_t, kMaxCodeBits + 2> next{};
  std::uint64_t code = 0;
  for (unsigned l = 1; l <= kMaxCodeBits; ++l) {
    code = (code + per_len[l - 1]) << 1;
    next[l] = code;
    if (per_len[l] != 0 && next[l] + per_len[l] > (std::uint64_t{1} << l)) {
      throw usage_error("code lengths violate Kraft's inequality at length " + std::to_string(l), where,
                        std::to_string(per_len[l]) + " codes");
    }
  }
  std::array<std::uint64_t, 256> codes{};
  for (unsigned b = 0; b < 256; ++b) {
    if (len[b] != 0) codes[b] = next[len[b]]++;
  }
  return codes;
}

}  // namespace detail

/// Encodes `in` into `out` (at least encoded_bytes(histogram(in)) bytes); returns the bytes written.
inline std::size_t encode(std::span<const std::uint8_t> in, std::span<std::uint8_t> out) {
  constexpr const char* kWhere = "compress::huffman::encode";
  if (in.size() > std::numeric_limits<std::uint32_t>::max()) {
    throw usage_error("input must be shorter than 2^32 bytes", kWhere, std::to_string(in.size()));
  }
  const Counts counts = histogram(in);
  const std::size_t total = encoded_bytes(counts);
  if (out.size() < total) {
    throw usage_error("output smaller than encoded_bytes = " + std::to_string(total), kWhere, std::to_string(out.size()));
  }
  const Lengths len = code_lengths(counts);
  const auto codes = detail::canonical_codes(len, kWhere);
  compress::detail::store_le32(out.data(), static_cast<std::uint32_t>(in.size()));
  std::copy(len.begin(), len.end(), out.begin() + 4);
  std::uint8_t* p = out.data() + kHeaderBytes;
  std::uint64_t acc = 0;  // pending bits, right-aligned; fewer than 8 between symbols
  unsigned pending = 0;
  for (std::uint8_t b : in) {
    acc = (acc << len[b]) | codes[b];
    pending += len[b];
    while (pending >= 8) {
      pending -= 8;
      *p++ = static_cast<std::uint8_t>(acc >> pending);
    }
    acc &= (std::uint64_t{1} << pending) - 1;
  }
  if (pending != 0) *p++ = static_cast<std::uint8_t>(acc << (8 - pending));
  return static_cast<std::size_t>(p - out.data());
}

inline std::vector<std::uint8_t> encode(std::span<const std::uint8_t> in) {
  std::vector<std::uint8_t> out(encoded_bytes(histogram(in)));
  out.resize(encode(in, std::span<std::uint8_t>(out)));
  return out;
}

/// The n recorded in an encoding's header.
inline std::size_t decoded_size(std::span<const std::uint8_t> in) {
  if (in.size() < kHeaderBytes) {
    throw usage_error("Huffman payload shorter than its " + std::to_string(kHeaderBytes) + "-byte header",
                      "compress::huffman::decoded_size", std::to_string(in.size()));
  }
  return compress::detail::load_le32(in.data());
}

namespace detail {
/// Bits the decoder looks ahead by.
inline constexpr unsigned kLookBits = 11;
/// A table of every code up to kLookBits long, indexed by the next kLookBits bits of the stream:
/// (byte << 8) | length, 0 where the next code is longer.
template <class Codes>
std::array<std::uint16_t, std::size_t{1} << kLookBits> lookup_table(const Lengths& len, const Codes& codes) {
  std::array<std::uint16_t, std::size_t{1} << kLookBits> fast{};
  for (unsigned b = 0; b < 256; ++b) {
    if (len[b] == 0 || len[b] > kLookBits) continue;
    const unsigned spare = kLookBits - len[b];
    const std::size_t base = static_cast<std::size_t>(codes[b]) << spare;
    for (std::size_t s = 0; s < (std::size_t{1} << spare); ++s) fast[base | s] = static_cast<std::uint16_t>((b << 8) | len[b]);
  }
  return fast;
}
}  // namespace detail

/// Decodes exactly: out.size() must equal decoded_size(in), and the payload must end where the last
/// code ends (a truncated, padded or otherwise corrupt payload is a usage_error naming the offset).
inline void decode(std::span<const std::uint8_t> in, std::span<std::uint8_t> out) {
  constexpr const char* kWhere = "compress::huffman::decode";
  const std::size_t n = decoded_size(in);
  if (out.size() != n) {
    throw usage_error("output must have the header's size " + std::to_string(n), kWhere, std::to_string(out.size()));
  }
  Lengths len{};
  std::copy(in.begin() + 4, in.begin() + kHeaderBytes, len.begin());
  const auto codes = detail::canonical_codes(len, kWhere);
  // Canonical decoding tables: per length, the first code and where its bytes start in `sorted`.
  std::array<std::uint16_t, 256> sorted{};
  std::array<std::uint32_t, kMaxCodeBits + 1> count{}, start{};
  std::array<std::uint64_t, kMaxCodeBits + 1> first{};
  std::size_t present = 0;
  for (unsigned b = 0; b < 256; ++b) {
    if (len[b] != 0) ++count[len[b]], ++present;
  }
  if (n > 0 && present == 0) throw usage_error("no code lengths for a non-empty payload", kWhere, std::to_string(n));
  for (unsigned l = 1, s = 0; l <= kMaxCodeBits; ++l) {
    start[l] = s;
    s += count[l];
  }
  {
    auto fill = start;
    for (unsigned b = 0; b < 256; ++b) {
      if (len[b] != 0) {
        if (fill[len[b]] == start[len[b]]) first[len[b]] = codes[b];  // bytes of one length ascend
        sorted[fill[len[b]]++] = static_cast<std::uint16_t>(b);
      }
    }
  }
  // Codes up to kLookBits long decode through one table lookup. Longer codes, and codes that would
  // run past the payload's end, take the bit-at-a-time loop (which reports corrupt input).
  constexpr unsigned kLookBits = detail::kLookBits;
  const auto fast = detail::lookup_table(len, codes);
  const std::uint8_t* p = in.data() + kHeaderBytes;
  const std::size_t bytes = in.size() - kHeaderBytes;
  const std::size_t total_bits = 8 * bytes;
  // The kLookBits bits from `bit` on, zeros past the end.
  auto peek = [&](std::size_t at) {
    const std::size_t byte = at >> 3;
    std::uint32_t w = 0;
    if (byte + 3 <= bytes) {
      w = (std::uint32_t{p[byte]} << 16) | (std::uint32_t{p[byte + 1]} << 8) | p[byte + 2];
    } else {
      for (std::size_t k = 0; k < 3; ++k) w = (w << 8) | (byte + k < bytes ? p[byte + k] : 0u);
    }
    return (w >> (24 - kLookBits - (at & 7))) & ((1u << kLookBits) - 1);
  };
  std::size_t bit = 0;  // next bit to read
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint16_t hit = fast[peek(bit)];
    if (hit != 0 && bit + (hit & 0xffu) <= total_bits) {
      out[i] = static_cast<std::uint8_t>(hit >> 8);
      bit += hit & 0xffu;
      continue;
    }
    std::uint64_t code = 0;
    for (unsigned l = 1;; ++l) {
      if (l > kMaxCodeBits) throw usage_error("invalid code", kWhere, "bit offset " + std::to_string(bit));
      if (bit >= total_bits) throw usage_error("payload truncated", kWhere, "bit offset " + std::to_string(bit));
      code = (code << 1) | ((p[bit >> 3] >> (7 - (bit & 7))) & 1u);
      ++bit;
      if (count[l] != 0 && code - first[l] < count[l]) {
        out[i] = static_cast<std::uint8_t>(sorted[start[l] + (code - first[l])]);
        break;
      }
    }
  }
  if ((bit + 7) / 8 != bytes) {
    throw usage_error("payload has bytes after its last code", kWhere,
                      std::to_string(bytes) + " bytes, " + std::to_string((bit + 7) / 8) + " used");
  }
}

}  // namespace zerotk::compress::huffman
