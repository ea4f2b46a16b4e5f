// Ring attention's schedule (docs/context.md) on thread ranks, with a plain causal attention kernel
// written here: forward and backward equal a serial reference that visits the blocks in the ring's
// order bit for bit, and the unsplit attention to fp32 rounding; the zigzag split balances causal
// work; the bytes equal SEMANTICS.md's formulas.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "../comm/reference.hpp"
#include "attention_kernel.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/context/ring.hpp"

namespace test_ring {

using namespace zerotk;
using comm::ThreadsCommunicator;

namespace {

constexpr float kNone = zt_test::kNoKeys;

std::vector<float> data(std::uint64_t seed, int rank, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = test::value<float>(seed, rank, i, false);
  return v;
}

using Kernel = zt_test::AttentionKernel;  // one head (heads 1)

struct Out {
  std::vector<float> o, lse, dq, dk, dv;
};

// One rank's inputs: queries, keys, values and the output gradient at its positions.
struct Inputs {
  std::vector<float> q, k, v, d_o;
  Inputs(int rank, std::size_t n, std::size_t d)
      : q(data(1, rank, n * d)), k(data(2, rank, n * d)), v(data(3, rank, n * d)), d_o(data(4, rank, n * d)) {}
};

// The ring on `c`: forward, then backward.
Out ring_attention(ThreadsCommunicator& c, const Kernel& ker, const std::vector<std::vector<std::size_t>>& pos,
                   std::size_t n) {
  const auto r = static_cast<std::size_t>(c.rank());
  const Inputs in(c.rank(), n, ker.d);
  context::Ring ring(c, n * ker.d);
  Out out;
  out.o.assign(n * ker.d, 0.f), out.lse.assign(n, kNone);
  std::vector<float> o_b, lse_b;
  ring.forward(in.k, in.v, [&](int source, std::span<const float> kb, std::span<const float> vb) {
    ker.forward(in.q, pos[r], kb, vb, pos[static_cast<std::size_t>(source)], o_b, lse_b);
    context::merge_partial(out.o, out.lse, o_b, lse_b, ker.d);
  });
  out.dq.assign(n * ker.d, 0.f), out.dk.assign(n * ker.d, 0.f), out.dv.assign(n * ker.d, 0.f);
  ring.backward(in.k, in.v, std::span<float>(out.dk), std::span<float>(out.dv),
                [&](int source, std::span<const float> kb, std::span<const float> vb, std::span<float> dkb,
                    std::span<float> dvb) {
                  ker.backward(in.q, pos[r], kb, vb, pos[static_cast<std::size_t>(source)], out.o, out.lse, in.d_o,
                               out.dq, dkb, dvb);
                });
  return out;
}

// The same in one process, blocks visited in the ring's order (sources r, r-1, ...), each block's
// key gradient its owner's contribution plus the others' in ring order (r+1, r+2, ...).
std::vector<Out> serial(const Kernel& ker, const std::vector<std::vector<std::size_t>>& pos, std::size_t n, int P) {
  std::vector<Inputs> in;
  for (int r = 0; r < P; ++r) in.emplace_back(r, n, ker.d);
  std::vector<Out> out(static_cast<std::size_t>(P));
  std::vector<float> o_b, lse_b;
  for (int r = 0; r < P; ++r) {
    auto& x = out[static_cast<std::size_t>(r)];
    x.o.assign(n * ker.d, 0.f), x.lse.assign(n, kNone);
    for (int s = 0; s < P; ++s) {
      const auto src = static_cast<std::size_t>((r - s + P) % P);
      ker.forward(in[std::size_t(r)].q, pos[std::size_t(r)], in[src].k, in[src].v, pos[src], o_b, lse_b);
      context::merge_partial(x.o, x.lse, o_b, lse_b, ker.d);
    }
  }
  // Step s: rank r meets block r - s (as in the ring): dq in each rank's ring order, each block's
  // key gradient from its owner (step 0) and then ranks b+1, b+2, ... (steps 1, 2, ...).
  const std::size_t m = n * ker.d;
  std::vector<std::vector<float>> own_k(std::size_t(P), std::vector<float>(m, 0.f)), own_v = own_k, tr_k = own_k,
                                                                                    tr_v = own_k;
  for (auto& x : out) x.dq.assign(m, 0.f);
  for (int s = 0; s < P; ++s) {
    for (int r = 0; r < P; ++r) {
      const auto ur = static_cast<std::size_t>(r), b = static_cast<std::size_t>((r - s + P) % P);
      auto& x = out[ur];
      ker.backward(in[ur].q, pos[ur], in[b].k, in[b].v, pos[b], x.o, x.lse, in[ur].d_o, x.dq, s == 0 ? own_k[b] : tr_k[b],
                   s == 0 ? own_v[b] : tr_v[b]);
    }
  }
  for (std::size_t b = 0; b < std::size_t(P); ++b) {
    auto& x = out[b];
    x.dk.resize(m), x.dv.resize(m);
    for (std::size_t i = 0; i < m; ++i) {
      x.dk[i] = P > 1 ? own_k[b][i] + tr_k[b][i] : own_k[b][i];
      x.dv[i] = P > 1 ? own_v[b][i] + tr_v[b][i] : own_v[b][i];
    }
  }
  return out;
}

}  // namespace

TEST_CASE("ring attention: forward and backward equal the ring-ordered serial reference bit for bit, and the unsplit attention to fp32 rounding") {
  for (const bool causal : {true, false}) {
    for (const int P : {1, 2, 3, 4}) {
      const std::string mask = causal ? "causal" : "full";
      INFO("P ", P, ", ", mask);
      const std::size_t n = 4;
      Kernel ker;
      ker.causal = causal;
      std::vector<std::vector<std::size_t>> pos;
      for (int r = 0; r < P; ++r) pos.push_back(context::zigzag_positions(n * std::size_t(P), P, r));
      const auto got = comm::run_threads(P, [&](ThreadsCommunicator& c) { return ring_attention(c, ker, pos, n); });
      const auto want = serial(ker, pos, n, P);
      // One rank holding everything: every key in one block.
      std::vector<std::size_t> all_pos;
      std::vector<float> q, k, v, d_o;
      for (int r = 0; r < P; ++r) {
        const Inputs in(r, n, ker.d);
        all_pos.insert(all_pos.end(), pos[std::size_t(r)].begin(), pos[std::size_t(r)].end());
        q.insert(q.end(), in.q.begin(), in.q.end()), k.insert(k.end(), in.k.begin(), in.k.end());
        v.insert(v.end(), in.v.begin(), in.v.end()), d_o.insert(d_o.end(), in.d_o.begin(), in.d_o.end());
      }
      std::vector<float> o, lse, dq(q.size(), 0.f), dk(k.size(), 0.f), dv(v.size(), 0.f);
      ker.forward(q, all_pos, k, v, all_pos, o, lse);
      ker.backward(q, all_pos, k, v, all_pos, o, lse, d_o, dq, dk, dv);
      for (int r = 0; r < P; ++r) {
        const auto ur = std::size_t(r);
        const auto& g = got[ur];
        CHECK(test::compare_bits("o", g.o.data(), want[ur].o.data(), g.o.size()) == "");
        CHECK(test::compare_bits("dq", g.dq.data(), want[ur].dq.data(), g.dq.size()) == "");
        CHECK(test::compare_bits("dk", g.dk.data(), want[ur].dk.data(), g.dk.size()) == "");
        CHECK(test::compare_bits("dv", g.dv.data(), want[ur].dv.data(), g.dv.size()) == "");
        for (std::size_t i = 0; i < g.o.size(); ++i) {
          const std::size_t at = ur * n * ker.d + i;
          CHECK(g.o[i] == doctest::Approx(o[at]).epsilon(1e-4).scale(1e-3));  // fp32: merges round
          CHECK(g.dq[i] == doctest::Approx(dq[at]).epsilon(1e-3).scale(1e-3));
          CHECK(g.dk[i] == doctest::Approx(dk[at]).epsilon(1e-3).scale(1e-3));
          CHECK(g.dv[i] == doctest::Approx(dv[at]).epsilon(1e-3).scale(1e-3));
        }
      }
    }
  }
}

TEST_CASE("ring attention: bf16 blocks give the float ring's bits on the same (bf16-rounded) values; dk, dv rounded once") {
  const int P = 3;
  const std::size_t n = 4, d = 4;
  Kernel ker;
  ker.d = d;
  std::vector<std::vector<std::size_t>> pos;
  for (int r = 0; r < P; ++r) pos.push_back(context::zigzag_positions(n * P, P, r));
  const auto rounded = [](std::vector<float> v) {
    for (float& x : v) x = static_cast<float>(bfloat16(x));
    return v;
  };
  comm::run_threads(P, [&](ThreadsCommunicator& c) {
    const auto r = std::size_t(c.rank());
    const Inputs raw(c.rank(), n, d);
    const auto q = rounded(raw.q), k = rounded(raw.k), v = rounded(raw.v), d_o = rounded(raw.d_o);
    std::vector<bfloat16> k16, v16;
    for (float x : k) k16.push_back(bfloat16(x));
    for (float x : v) v16.push_back(bfloat16(x));
    // The same kernel on float copies of whatever blocks arrive.
    const auto run = [&](auto& ring, const auto& kk, const auto& vv, auto&& as_float) {
      Out out;
      out.o.assign(n * d, 0.f), out.lse.assign(n, kNone), out.dq.assign(n * d, 0.f);
      std::vector<float> o_b, lse_b;
      ring.forward(kk, vv, [&](int source, auto kb, auto vb) {
        ker.forward(q, pos[r], as_float(kb), as_float(vb), pos[std::size_t(source)], o_b, lse_b);
        context::merge_partial(out.o, out.lse, o_b, lse_b, d);
      });
      return out;
    };
    const auto same = [](auto b) { return std::vector<float>(b.begin(), b.end()); };
    const auto widen = [](auto b) {
      std::vector<float> f;
      for (bfloat16 x : b) f.push_back(static_cast<float>(x));
      return f;
    };
    context::Ring ring32(c, n * d);
    context::Ring<ThreadsCommunicator, bfloat16> ring16(c, n * d);
    Out a = run(ring32, k, v, same), b = run(ring16, k16, v16, widen);
    CHECK(test::compare_bits("o", b.o.data(), a.o.data(), a.o.size()) == "");
    std::vector<float> dk(n * d), dv(n * d);
    std::vector<bfloat16> dk16(n * d), dv16(n * d);
    ring32.backward(k, v, std::span<float>(dk), std::span<float>(dv),
                    [&](int source, std::span<const float> kb, std::span<const float> vb, std::span<float> dkb,
                        std::span<float> dvb) {
                      ker.backward(q, pos[r], kb, vb, pos[std::size_t(source)], a.o, a.lse, d_o, a.dq, dkb, dvb);
                    });
    ring16.backward(k16, v16, std::span<bfloat16>(dk16), std::span<bfloat16>(dv16),
                    [&](int source, std::span<const bfloat16> kb, std::span<const bfloat16> vb, std::span<float> dkb,
                        std::span<float> dvb) {
                      ker.backward(q, pos[r], widen(kb), widen(vb), pos[std::size_t(source)], b.o, b.lse, d_o, b.dq, dkb, dvb);
                    });
    CHECK(test::compare_bits("dq", b.dq.data(), a.dq.data(), a.dq.size()) == "");
    for (std::size_t i = 0; i < dk.size(); ++i) {
      CHECK(dk16[i] == bfloat16(dk[i]));
      CHECK(dv16[i] == bfloat16(dv[i]));
    }
  });
}

TEST_CASE("ring attention: the zigzag split gives every rank the same causal work; contiguous chunks do not") {
  const int P = 4;
  const std::size_t N = 32;
  const auto pairs = [&](const std::vector<std::size_t>& qp) {
    std::size_t n = 0;  // (query, key) pairs a causal kernel computes, over every key
    for (std::size_t q : qp) n += q + 1;
    return n;
  };
  std::vector<std::size_t> zig, flat;
  for (int r = 0; r < P; ++r) {
    zig.push_back(pairs(context::zigzag_positions(N, P, r)));
    std::vector<std::size_t> contiguous;
    for (std::size_t i = 0; i < N / P; ++i) contiguous.push_back(std::size_t(r) * N / P + i);
    flat.push_back(pairs(contiguous));
  }
  for (std::size_t w : zig) CHECK(w == zig[0]);
  CHECK(flat.back() > 3 * flat.front());
  CHECK_THROWS_AS(context::zigzag_positions(30, 4, 0), usage_error);
}

TEST_CASE("ring attention: forward sends 2 N h_kv (P-1)/P per rank, forward and backward 6 N h_kv (P-1)/P") {
  const int P = 4;
  const std::size_t n = 4, d = 4, N = n * P;
  Kernel ker;
  ker.d = d;
  std::vector<std::vector<std::size_t>> pos;
  for (int r = 0; r < P; ++r) pos.push_back(context::zigzag_positions(N, P, r));
  comm::run_threads(P, [&](ThreadsCommunicator& c) {
    const Inputs in(c.rank(), n, d);
    context::Ring ring(c, n * d);
    std::vector<float> o(n * d, 0.f), lse(n, kNone), o_b, lse_b;
    ring.forward(in.k, in.v, [&](int source, std::span<const float> kb, std::span<const float> vb) {
      ker.forward(in.q, pos[std::size_t(c.rank())], kb, vb, pos[std::size_t(source)], o_b, lse_b);
      context::merge_partial(o, lse, o_b, lse_b, d);
    });
    const std::uint64_t h_kv = d;  // one head: elements per token of K (and of V)
    CHECK(c.stats().total_wire_bytes() == 2 * N * h_kv * (P - 1) / P * sizeof(float));
    std::vector<float> dk(n * d), dv(n * d);
    ring.backward(in.k, in.v, std::span<float>(dk), std::span<float>(dv),
                  [](int, std::span<const float>, std::span<const float>, std::span<float>, std::span<float>) {});
    CHECK(c.stats().total_wire_bytes() == 6 * N * h_kv * (P - 1) / P * sizeof(float));
    std::vector<float> short_k(n * d - 1);
    CHECK_THROWS_AS(ring.forward(short_k, in.v, [](int, std::span<const float>, std::span<const float>) {}), usage_error);
  });
}

}  // namespace test_ring
