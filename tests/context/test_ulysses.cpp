// DeepSpeed-Ulysses' re-layout (docs/context.md) on thread ranks: attention over the re-laid heads
// equals the unsplit attention bit for bit at P 1-4, with grouped-query attention and head counts
// P does not divide; shared KV heads' gradients come back summed in rank order; the bytes equal
// SEMANTICS.md's formula.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "../comm/reference.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/context/ulysses.hpp"

namespace test_ulysses {

using namespace zerotk;
using comm::ThreadsCommunicator;

namespace {

std::vector<float> data(std::uint64_t seed, int rank, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = test::value<float>(seed, rank, i, false);
  return v;
}

// Causal attention over N tokens, query head a reading KV head kv_of[a]; q [N x hq x d], k and v
// [N x hkv x d]; fp32 in a fixed order (the same bits wherever it runs on the same rows).
std::vector<float> attention(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                             std::size_t N, std::size_t hq, std::size_t hkv, std::size_t d,
                             const std::vector<std::size_t>& kv_of) {
  std::vector<float> o(N * hq * d, 0.f), s(N);
  for (std::size_t a = 0; a < hq; ++a) {
    const std::size_t b = kv_of[a];
    for (std::size_t t = 0; t < N; ++t) {
      float top = -1e30f;
      for (std::size_t j = 0; j <= t; ++j) {
        float dot = 0;
        for (std::size_t i = 0; i < d; ++i) dot += q[(t * hq + a) * d + i] * k[(j * hkv + b) * d + i];
        s[j] = dot / std::sqrt(static_cast<float>(d));
        top = std::max(top, s[j]);
      }
      float sum = 0;
      for (std::size_t j = 0; j <= t; ++j) sum += (s[j] = std::exp(s[j] - top));
      for (std::size_t j = 0; j <= t; ++j) {
        for (std::size_t i = 0; i < d; ++i) o[(t * hq + a) * d + i] += s[j] / sum * v[(j * hkv + b) * d + i];
      }
    }
  }
  return o;
}

}  // namespace

TEST_CASE("Ulysses: attention over the re-laid heads equals the unsplit attention bit for bit (GQA, uneven heads)") {
  const std::size_t n = 5, d = 4;
  const int H = 6, Hkv = 2;  // query head i reads KV head i / 3
  for (int P : {1, 2, 3, 4}) {
    INFO("P ", P);
    const std::size_t N = n * static_cast<std::size_t>(P);
    // The whole sequence on one rank.
    std::vector<float> q, k, v;
    for (int r = 0; r < P; ++r) {
      for (auto [out, seed, h] : {std::tuple{&q, 1, H}, std::tuple{&k, 2, Hkv}, std::tuple{&v, 3, Hkv}}) {
        const auto part = data(static_cast<std::uint64_t>(seed), r, n * static_cast<std::size_t>(h) * d);
        out->insert(out->end(), part.begin(), part.end());
      }
    }
    std::vector<std::size_t> kv_all;
    for (int a = 0; a < H; ++a) kv_all.push_back(static_cast<std::size_t>(a / (H / Hkv)));
    const auto whole = attention(q, k, v, N, H, Hkv, d, kv_all);
    const auto errors = comm::run_threads(P, [&](ThreadsCommunicator& c) {
      const auto qs = context::split_heads(H, P);
      const auto kvs = context::kv_heads_for(qs, H, Hkv);
      const auto ur = static_cast<std::size_t>(c.rank());
      const auto hq = static_cast<std::size_t>(qs.count[ur]), hkv = static_cast<std::size_t>(kvs.count[ur]);
      context::Ulysses u(c, n, d);
      std::vector<float> q_all(N * hq * d), k_all(N * hkv * d), v_all(N * hkv * d);
      u.seq_to_heads(data(1, c.rank(), n * H * d), qs, q_all);
      u.seq_to_heads(data(2, c.rank(), n * Hkv * d), kvs, k_all);
      u.seq_to_heads(data(3, c.rank(), n * Hkv * d), kvs, v_all);
      std::vector<std::size_t> kv_of;  // local KV index of each local query head
      for (std::size_t a = 0; a < hq; ++a) {
        kv_of.push_back((static_cast<std::size_t>(qs.first[ur]) + a) / (H / Hkv) - static_cast<std::size_t>(kvs.first[ur]));
      }
      const auto o_heads = attention(q_all, k_all, v_all, N, hq, hkv, d, kv_of);
      std::vector<float> o(n * H * d);
      u.heads_to_seq(o_heads, qs, o);
      return test::compare_bits("o", o.data(), whole.data() + ur * n * H * d, o.size());
    });
    for (const auto& e : errors) CHECK(e == "");
  }
}

TEST_CASE("Ulysses: a KV head several ranks hold gets their gradients summed in rank order; seq_to_heads inverts heads_to_seq") {
  const std::size_t n = 3, d = 2;
  const int H = 8, Hkv = 2, P = 4;  // KV head 0 is needed by ranks 0 and 1, head 1 by ranks 2 and 3
  comm::run_threads(P, [&](ThreadsCommunicator& c) {
    const auto qs = context::split_heads(H, P);
    const auto kvs = context::kv_heads_for(qs, H, Hkv);
    const auto ur = static_cast<std::size_t>(c.rank());
    CHECK(kvs.first[ur] == c.rank() / 2);
    CHECK(kvs.count[ur] == 1);
    context::Ulysses u(c, n, d);
    const std::size_t N = n * P;
    // d(K) in the heads layout on every rank, then back to the sequence.
    const auto dk_heads = data(7, c.rank(), N * d);
    std::vector<float> dk(n * Hkv * d);
    u.heads_to_seq_sum(dk_heads, kvs, dk);
    for (std::size_t t = 0; t < n; ++t) {
      for (std::size_t h = 0; h < std::size_t(Hkv); ++h) {
        for (std::size_t i = 0; i < d; ++i) {
          float want = 0.f;  // ranks 2h and 2h+1 hold head h: rank order
          for (int s = 2 * int(h); s < 2 * int(h) + 2; ++s) want += data(7, s, N * d)[(ur * n + t) * d + i];
          CHECK(dk[(t * Hkv + h) * d + i] == want);
        }
      }
    }
    // Query heads: seq -> heads -> seq is the identity.
    const auto x = data(8, c.rank(), n * H * d);
    std::vector<float> heads(N * static_cast<std::size_t>(qs.count[ur]) * d), back(x.size());
    u.seq_to_heads(x, qs, heads);
    u.heads_to_seq(heads, qs, back);
    CHECK(back == x);
    std::vector<float> wrong(back.size() + 1);
    CHECK_THROWS_AS(u.heads_to_seq(heads, qs, wrong), usage_error);
    // bf16 elements: the same moves, and the shared head's sum rounded once from fp32.
    context::Ulysses<ThreadsCommunicator, bfloat16> u16(c, n, d);
    std::vector<bfloat16> x16, heads16(heads.size()), back16(x.size()), dk_heads16, dk16(dk.size());
    for (float f : x) x16.push_back(bfloat16(f));
    for (float f : dk_heads) dk_heads16.push_back(bfloat16(f));
    u16.seq_to_heads(x16, qs, heads16);
    u16.heads_to_seq(heads16, qs, back16);
    CHECK(back16 == x16);
    u16.heads_to_seq_sum(dk_heads16, kvs, dk16);
    for (std::size_t t = 0; t < n; ++t) {
      for (std::size_t h = 0; h < std::size_t(Hkv); ++h) {
        for (std::size_t i = 0; i < d; ++i) {
          float want = 0.f;
          for (int s = 2 * int(h); s < 2 * int(h) + 2; ++s) {
            want += static_cast<float>(bfloat16(data(7, s, N * d)[(ur * n + t) * d + i]));
          }
          CHECK(dk16[(t * Hkv + h) * d + i] == bfloat16(want));
        }
      }
    }
  });
}

TEST_CASE("Ulysses: the forward's Q, K, V and O move N (2h + 2h_kv)(P-1)/P^2 elements per rank") {
  const std::size_t n = 4, d = 3;
  const int H = 8, Hkv = 4, P = 4;
  comm::run_threads(P, [&](ThreadsCommunicator& c) {
    const auto qs = context::split_heads(H, P);
    const auto kvs = context::kv_heads_for(qs, H, Hkv);
    const auto ur = static_cast<std::size_t>(c.rank());
    const std::size_t N = n * P, hq = std::size_t(qs.count[ur]), hkv = std::size_t(kvs.count[ur]);
    context::Ulysses u(c, n, d);
    std::vector<float> q_all(N * hq * d), kv_all(N * hkv * d), o(n * H * d);
    u.seq_to_heads(data(1, c.rank(), n * H * d), qs, q_all);
    u.seq_to_heads(data(2, c.rank(), n * Hkv * d), kvs, kv_all);
    u.seq_to_heads(data(3, c.rank(), n * Hkv * d), kvs, kv_all);
    u.heads_to_seq(q_all, qs, o);  // the output has the query's shape
    const std::uint64_t h = H * d, h_kv = Hkv * d;  // elements per token
    const std::uint64_t want = N * (2 * h + 2 * h_kv) * (P - 1) / (P * P) * sizeof(float);
    CHECK(c.stats()[comm::OpKind::all_to_all_v].wire_bytes == want);
  });
}

}  // namespace test_ulysses
