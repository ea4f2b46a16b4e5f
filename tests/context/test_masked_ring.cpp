// The mask-aware ring (context/masked_ring.hpp) on thread ranks, with the block-sparse operator as
// the kernel: forward (o) and backward (dq, dk, dv) equal the dense ring's (context/ring.hpp, the
// same kernel over whole chunks) bit for bit, and dense attention under the mask on one rank to fp32
// rounding, for a causal sliding window, a BigBird layout with random blocks and a unidirectional
// Fixed layout at P 4; a sliding window W <= N/P at P 8 moves at most 1/(P-1) of the dense ring's
// KV bytes (exactly that at W = N/P, 1/28 of it at a window of one block), as the planner's
// plan::masked_ring_forward and plan::context_traffic say.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "../comm/reference.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/context/block_sparse.hpp"
#include "zerotk/context/masked_ring.hpp"
#include "zerotk/context/ring.hpp"
#include "zerotk/context/sparsity.hpp"
#include "zerotk/plan/context.hpp"

namespace test_masked_ring {

using namespace zerotk;
using comm::ThreadsCommunicator;
using context::SparsityConfig;
using context::SparsityMode;

namespace {

constexpr std::size_t kD = 4, kHeads = 2, kRow = kHeads * kD, kBlock = 4;
constexpr float kNone = -std::numeric_limits<float>::infinity();

std::vector<float> data(std::uint64_t seed, std::size_t first, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = test::value<float>(seed, 0, first + i, false);
  return v;
}

struct Out {
  std::vector<float> o, dq, dk, dv;
  std::uint64_t forward_bytes = 0;
};

// Rank r's chunk of the whole sequence's q, k, v, d_o (tokens [r n, (r + 1) n)).
struct Chunk {
  std::vector<float> q, k, v, d_o;
  Chunk(std::size_t r, std::size_t n)
      : q(data(1, r * n * kRow, n * kRow)), k(data(2, r * n * kRow, n * kRow)), v(data(3, r * n * kRow, n * kRow)),
        d_o(data(4, r * n * kRow, n * kRow)) {}
};

template <bool Masked>
Out run(ThreadsCommunicator& c, const context::BlockLayout& l, bool causal, std::size_t n) {
  const auto r = static_cast<std::size_t>(c.rank());
  const Chunk in(r, n);
  const context::BlockSparseAttention attn{.layout = &l, .head_dim = kD, .causal = causal};
  Out out;
  out.o.assign(n * kRow, 0.f), out.dq.assign(n * kRow, 0.f), out.dk.assign(n * kRow, 0.f), out.dv.assign(n * kRow, 0.f);
  std::vector<float> lse(n * kHeads, kNone), o_b(n * kRow), lse_b(n * kHeads);
  if constexpr (Masked) {
    context::MaskedRing ring(c, l, n, kRow, causal);
    ring.forward(in.k, in.v, [&](int, std::span<const int> blocks, std::span<const float> kb, std::span<const float> vb) {
      attn.forward(in.q, kb, vb, o_b, lse_b, {.queries_from = r * n, .key_blocks = blocks});
      context::merge_partial(out.o, lse, o_b, lse_b, kD);
    });
    out.forward_bytes = c.stats().total_wire_bytes();
    ring.backward(in.k, in.v, std::span<float>(out.dk), std::span<float>(out.dv),
                  [&](int, std::span<const int> blocks, std::span<const float> kb, std::span<const float> vb,
                      std::span<float> dkb, std::span<float> dvb) {
                    attn.backward(in.q, kb, vb, out.o, lse, in.d_o, out.dq, dkb, dvb,
                                  {.queries_from = r * n, .key_blocks = blocks});
                  });
  } else {
    context::Ring ring(c, n * kRow);
    ring.forward(in.k, in.v, [&](int source, std::span<const float> kb, std::span<const float> vb) {
      attn.forward(in.q, kb, vb, o_b, lse_b, {.queries_from = r * n, .keys_from = static_cast<std::size_t>(source) * n});
      context::merge_partial(out.o, lse, o_b, lse_b, kD);
    });
    out.forward_bytes = c.stats().total_wire_bytes();
    ring.backward(in.k, in.v, std::span<float>(out.dk), std::span<float>(out.dv),
                  [&](int source, std::span<const float> kb, std::span<const float> vb, std::span<float> dkb,
                      std::span<float> dvb) {
                    attn.backward(in.q, kb, vb, out.o, lse, in.d_o, out.dq, dkb, dvb,
                                  {.queries_from = r * n, .keys_from = static_cast<std::size_t>(source) * n});
                  });
  }
  return out;
}

struct Case {
  const char* name;
  SparsityConfig config;
  bool causal;
};

}  // namespace

TEST_CASE("masked ring: equals the dense ring bit for bit, and dense attention under the mask to fp32 rounding") {
  const int P = 4;
  const std::size_t n = 16, N = n * P;
  for (const Case& c : {Case{"sliding window, causal",
                             {.mode = SparsityMode::local_sliding_window, .heads = kHeads, .block = kBlock, .unidirectional = true,
                              .num_sliding_window_blocks = 5},
                             true},
                        Case{"bigbird, random blocks",
                             {.mode = SparsityMode::bigbird, .heads = kHeads, .block = kBlock, .different_layout_per_head = true,
                              .num_random_blocks = 1, .seed = 5},
                             false},
                        Case{"fixed, unidirectional", {.mode = SparsityMode::fixed, .heads = kHeads, .block = kBlock, .unidirectional = true}, true}}) {
    CAPTURE(c.name);
    const context::BlockLayout l = context::make_layout(c.config, N);
    const std::vector<Out> masked = comm::run_threads(P, [&](ThreadsCommunicator& g) { return run<true>(g, l, c.causal, n); });
    const std::vector<Out> dense = comm::run_threads(P, [&](ThreadsCommunicator& g) { return run<false>(g, l, c.causal, n); });
    const std::vector<Out> one = comm::run_threads(1, [&](ThreadsCommunicator& g) { return run<false>(g, l, c.causal, N); });
    for (std::size_t r = 0; r < static_cast<std::size_t>(P); ++r) {
      CAPTURE(r);
      const Out& a = masked[r];
      const Out& b = dense[r];
      CHECK(test::compare_bits("o", a.o.data(), b.o.data(), a.o.size()) == "");
      CHECK(test::compare_bits("dq", a.dq.data(), b.dq.data(), a.dq.size()) == "");
      CHECK(test::compare_bits("dk", a.dk.data(), b.dk.data(), a.dk.size()) == "");
      CHECK(test::compare_bits("dv", a.dv.data(), b.dv.data(), a.dv.size()) == "");
      CHECK(a.forward_bytes < b.forward_bytes);  // these layouts leave blocks out
      const std::size_t at = r * n * kRow;
      for (std::size_t i = 0; i < a.o.size(); ++i) {
        CHECK(a.o[i] == doctest::Approx(one[0].o[at + i]).epsilon(1e-4).scale(1e-3));
        CHECK(a.dk[i] == doctest::Approx(one[0].dk[at + i]).epsilon(1e-3).scale(1e-3));
      }
    }
  }
}

TEST_CASE("masked ring: a sliding window W <= N/P at P 8 moves at most 1/(P-1) of the dense ring's KV bytes") {
  const int P = 8;
  const std::size_t n = 16, N = n * P;
  // Window blocks 9: four blocks back = W = 16 = N/P tokens; 3: one block back.
  for (const int window : {9, 3}) {
    CAPTURE(window);
    const SparsityConfig cfg{.mode = SparsityMode::local_sliding_window, .heads = kHeads, .block = kBlock, .unidirectional = true,
                             .num_sliding_window_blocks = window};
    const context::BlockLayout l = context::make_layout(cfg, N);
    const std::vector<Out> masked = comm::run_threads(P, [&](ThreadsCommunicator& g) { return run<true>(g, l, true, n); });
    const std::vector<Out> dense = comm::run_threads(P, [&](ThreadsCommunicator& g) { return run<false>(g, l, true, n); });
    for (std::size_t r = 0; r < static_cast<std::size_t>(P); ++r) {
      CAPTURE(r);
      const std::uint64_t ring = 2 * N * kRow * (P - 1) / P * sizeof(float);  // SEMANTICS.md: 2 N h_kv (P-1)/P
      CHECK(dense[r].forward_bytes == ring);
      // Each rank sends only to the next: its last window / 2 blocks (all of them at W = N/P).
      const std::uint64_t edge = 2 * static_cast<std::uint64_t>(window / 2) * kBlock * kRow * sizeof(float);
      CHECK(masked[r].forward_bytes == (r + 1 < static_cast<std::size_t>(P) ? edge : 0));
      CHECK(masked[r].forward_bytes * (P - 1) <= ring);
      // The planner's bound (plan::masked_ring_forward: the most any rank sends) is rank 0's.
      const plan::ContextShape shape{.sequence = N, .hidden = kRow, .heads = kHeads, .cp = P, .mode = plan::CpMode::p2p};
      CHECK(plan::masked_ring_forward(shape, l, true) * sizeof(float) == masked[0].forward_bytes);
      CHECK(plan::context_traffic(shape).ring_forward * sizeof(float) == ring);
      CHECK(test::compare_bits("o", masked[r].o.data(), dense[r].o.data(), masked[r].o.size()) == "");
    }
  }
}

}  // namespace test_masked_ring
