// The block-sparse attention operator (context/block_sparse.hpp) against dense attention under the
// same element mask (the layout's blocks, and the causal mask where asked), written here with every
// key visited in ascending order and the masked ones skipped: forward (o, lse) and backward (dq,
// dk, dv) bit for bit, for DeepSpeed's Fixed (unidirectional), BigBird (bidirectional, random
// blocks, different layouts per head) and BSLongformer layouts, and for a window of the keys (a
// ring step's block) merged with merge_partial against the whole. The host's fused drivers give the
// per-row definitions' bits (what the CUDA kernels run), whole and over a masked ring step's blocks.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "../comm/reference.hpp"
#include "zerotk/context/block_sparse.hpp"
#include "zerotk/context/ring.hpp"
#include "zerotk/context/sparsity.hpp"

namespace test_block_sparse {

using namespace zerotk;
using context::SparsityConfig;
using context::SparsityMode;

namespace {

constexpr std::size_t kD = 4, kN = 64;  // head size, tokens
constexpr float kNone = -std::numeric_limits<float>::infinity();

std::vector<float> data(std::uint64_t seed, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = test::value<float>(seed, 0, i, false);
  return v;
}

struct Grads {
  std::vector<float> o, lse, dq, dk, dv;
};

// Dense attention under the element mask: every key j of row t visited ascending, masked ones skipped.
Grads dense_masked(const context::BlockLayout& l, bool causal, const std::vector<float>& q, const std::vector<float>& k,
                   const std::vector<float>& v, const std::vector<float>& d_o) {
  const auto H = static_cast<std::size_t>(l.heads()), B = static_cast<std::size_t>(l.block_size());
  const float scale = 1.f / std::sqrt(static_cast<float>(kD));
  const auto sees = [&](std::size_t a, std::size_t t, std::size_t j) {
    return l.has(static_cast<int>(a), static_cast<int>(t / B), static_cast<int>(j / B)) && (!causal || j <= t);
  };
  Grads g;
  g.o.assign(kN * H * kD, 0.f), g.lse.assign(kN * H, kNone);
  g.dq.assign(q.size(), 0.f), g.dk.assign(k.size(), 0.f), g.dv.assign(v.size(), 0.f);
  std::vector<float> s(kN);
  for (std::size_t t = 0; t < kN; ++t) {
    for (std::size_t a = 0; a < H; ++a) {
      const std::size_t qa = (t * H + a) * kD;
      float top = kNone;
      for (std::size_t j = 0; j < kN; ++j) {
        if (!sees(a, t, j)) continue;
        float dot = 0;
        for (std::size_t i = 0; i < kD; ++i) dot += q[qa + i] * k[(j * H + a) * kD + i];
        s[j] = dot * scale;
        top = std::max(top, s[j]);
      }
      if (top == kNone) continue;
      float sum = 0;
      for (std::size_t j = 0; j < kN; ++j) {
        if (sees(a, t, j)) sum += std::exp(s[j] - top);
      }
      for (std::size_t j = 0; j < kN; ++j) {
        if (!sees(a, t, j)) continue;
        const float p = std::exp(s[j] - top) / sum;
        for (std::size_t i = 0; i < kD; ++i) g.o[qa + i] += p * v[(j * H + a) * kD + i];
      }
      g.lse[t * H + a] = top + std::log(sum);
    }
  }
  for (std::size_t t = 0; t < kN; ++t) {
    for (std::size_t a = 0; a < H; ++a) {
      const std::size_t qa = (t * H + a) * kD;
      if (g.lse[t * H + a] == kNone) continue;
      float D = 0;
      for (std::size_t i = 0; i < kD; ++i) D += d_o[qa + i] * g.o[qa + i];
      for (std::size_t j = 0; j < kN; ++j) {
        if (!sees(a, t, j)) continue;
        const std::size_t ka = (j * H + a) * kD;
        float dot = 0, dp = 0;
        for (std::size_t i = 0; i < kD; ++i) dot += q[qa + i] * k[ka + i], dp += d_o[qa + i] * v[ka + i];
        const float p = std::exp(dot * scale - g.lse[t * H + a]);
        const float ds = p * (dp - D) * scale;
        for (std::size_t i = 0; i < kD; ++i) {
          g.dv[ka + i] += p * d_o[qa + i];
          g.dq[qa + i] += ds * k[ka + i];
          g.dk[ka + i] += ds * q[qa + i];
        }
      }
    }
  }
  return g;
}

struct Case {
  const char* name;
  SparsityConfig config;
  bool causal;
};

std::vector<Case> cases() {
  return {{"fixed, unidirectional", {.mode = SparsityMode::fixed, .heads = 2, .block = 8, .unidirectional = true}, true},
          {"bigbird, different layout per head",
           {.mode = SparsityMode::bigbird, .heads = 2, .block = 8, .different_layout_per_head = true, .num_random_blocks = 1, .seed = 3},
           false},
          {"bslongformer, unidirectional",
           {.mode = SparsityMode::bslongformer, .heads = 2, .block = 8, .unidirectional = true, .global_block_indices = {0, 5}},
           true}};
}

}  // namespace

TEST_CASE("block-sparse attention equals dense attention under the same mask bit for bit, forward and backward") {
  for (const Case& c : cases()) {
    CAPTURE(c.name);
    const context::BlockLayout l = context::make_layout(c.config, kN);
    CHECK(l.kept() < static_cast<std::size_t>(l.heads() * l.blocks() * l.blocks()));  // sparse indeed
    const std::size_t n = kN * 2 * kD;
    const auto q = data(1, n), k = data(2, n), v = data(3, n), d_o = data(4, n);
    const Grads want = dense_masked(l, c.causal, q, k, v, d_o);
    const context::BlockSparseAttention attn{.layout = &l, .head_dim = kD, .causal = c.causal};
    Grads got;
    got.o.resize(n), got.lse.resize(kN * 2), got.dq.assign(n, 0.f), got.dk.assign(n, 0.f), got.dv.assign(n, 0.f);
    attn.forward(q, k, v, got.o, got.lse);
    attn.backward(q, k, v, got.o, got.lse, d_o, got.dq, got.dk, got.dv);
    CHECK(test::compare_bits("o", got.o.data(), want.o.data(), n) == "");
    CHECK(test::compare_bits("lse", got.lse.data(), want.lse.data(), kN * 2) == "");
    CHECK(test::compare_bits("dq", got.dq.data(), want.dq.data(), n) == "");
    CHECK(test::compare_bits("dk", got.dk.data(), want.dk.data(), n) == "");
    CHECK(test::compare_bits("dv", got.dv.data(), want.dv.data(), n) == "");
  }
}

TEST_CASE("block-sparse attention over windows of the keys, merged, equals the whole to fp32 rounding") {
  const Case c = cases()[1];
  const context::BlockLayout l = context::make_layout(c.config, kN);
  const std::size_t n = kN * 2 * kD, rows = kN / 4;
  const auto q = data(1, n), k = data(2, n), v = data(3, n), d_o = data(4, n);
  const Grads want = dense_masked(l, c.causal, q, k, v, d_o);
  const context::BlockSparseAttention attn{.layout = &l, .head_dim = kD, .causal = c.causal};
  // Queries [16, 32) against four windows of 16 keys, merged in order.
  const std::size_t q0 = rows, row = 2 * kD;
  const std::span<const float> qs(q.data() + q0 * row, rows * row);
  std::vector<float> o(rows * row, 0.f), lse(rows * 2, kNone), o_b(rows * row), lse_b(rows * 2);
  for (std::size_t w = 0; w < 4; ++w) {
    const std::span<const float> kw(k.data() + w * rows * row, rows * row), vw(v.data() + w * rows * row, rows * row);
    attn.forward(qs, kw, vw, o_b, lse_b, {.queries_from = q0, .keys_from = w * rows});
    context::merge_partial(o, lse, o_b, lse_b, kD);
  }
  for (std::size_t i = 0; i < o.size(); ++i) CHECK(o[i] == doctest::Approx(want.o[q0 * row + i]).epsilon(1e-4).scale(1e-3));
  CHECK_THROWS_WITH_AS(attn.forward(qs, std::span<const float>(k.data(), rows * row), std::span<const float>(v.data(), rows * row),
                                    o_b, lse_b, {.queries_from = q0, .keys_from = kN - 8}),
                       doctest::Contains("run past the layout's 64 tokens"), usage_error);
}

TEST_CASE("the host's fused drivers give the per-row definitions' bits (the CUDA kernels' form), whole and over key blocks") {
  for (const Case& c : cases()) {
    CAPTURE(c.name);
    const context::BlockLayout l = context::make_layout(c.config, kN);
    const std::size_t H = 2, row = H * kD;
    // Whole keys, then queries [16, 48) against the key blocks {1, 3, 4} (a masked ring step's).
    const std::vector<int> blocks{1, 3, 4};
    for (const bool window : {false, true}) {
      CAPTURE(window);
      const std::size_t nq = window ? 32 : kN, nk = window ? blocks.size() * 8 : kN;
      const auto q = data(1, nq * row), k = data(2, nk * row), v = data(3, nk * row), d_o = data(4, nq * row);
      const context::BlockSparseAttention attn{.layout = &l, .head_dim = kD, .causal = c.causal};
      const context::AttentionWindow w{.queries_from = window ? 16u : 0u, .key_blocks = window ? std::span<const int>(blocks)
                                                                                               : std::span<const int>()};
      Grads got, want;
      for (Grads* g : {&got, &want}) {
        g->o.resize(nq * row), g->lse.resize(nq * H);
        g->dq.assign(nq * row, 0.f), g->dk.assign(nk * row, 0.f), g->dv.assign(nk * row, 0.f);
      }
      attn.forward(q, k, v, got.o, got.lse, w);
      attn.backward(q, k, v, got.o, got.lse, d_o, got.dq, got.dk, got.dv, w);
      // The per-row definitions, row by row as a CUDA thread runs them.
      const context::rows::Rows r = attn.shape(q.size(), k.size(), v.size(), want.o.size(), want.lse.size(), w, "test");
      const context::rows::MaskView m = attn.mask();
      for (std::size_t t = 0; t < nq; ++t) {
        for (std::size_t a = 0; a < H; ++a) context::rows::forward_row(m, r, q.data(), k.data(), v.data(), want.o.data(), want.lse.data(), t, a);
      }
      for (std::size_t t = 0; t < nq; ++t) {
        for (std::size_t a = 0; a < H; ++a) {
          context::rows::dq_row(m, r, q.data(), k.data(), v.data(), want.o.data(), want.lse.data(), d_o.data(), want.dq.data(), t, a);
        }
      }
      for (std::size_t j = 0; j < nk; ++j) {
        for (std::size_t a = 0; a < H; ++a) {
          context::rows::dkv_row(m, r, q.data(), k.data(), v.data(), want.o.data(), want.lse.data(), d_o.data(), want.dk.data(),
                                 want.dv.data(), j, a);
        }
      }
      std::size_t live = 0;
      for (float x : want.lse) live += x != kNone ? 1 : 0;
      CHECK(live > nq);  // most rows attend to something
      CHECK(test::compare_bits("o", got.o.data(), want.o.data(), nq * row) == "");
      CHECK(test::compare_bits("lse", got.lse.data(), want.lse.data(), nq * H) == "");
      CHECK(test::compare_bits("dq", got.dq.data(), want.dq.data(), nq * row) == "");
      CHECK(test::compare_bits("dk", got.dk.data(), want.dk.data(), nk * row) == "");
      CHECK(test::compare_bits("dv", got.dv.data(), want.dv.data(), nk * row) == "");
    }
  }
}

}  // namespace test_block_sparse
