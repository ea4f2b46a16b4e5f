// a2a+p2p (context/hybrid.hpp) on thread ranks: Ulysses inside groups of A adjacent context ranks,
// the ring across them, with the test's causal attention kernel (attention_kernel.hpp):
//  - forward (o) and backward (dq, dk, dv) equal, bit for bit, the ring over R = P / A ranks on the
//    a2a groups' super-chunks with every head (the all-to-all only moves rows, and heads are
//    independent), and the unsplit attention to fp32 rounding; at A 2 x R 2, A 3 x R 2 (6 heads),
//    A 4 x R 1 (Ulysses alone) and A 1 x R 4 (the ring alone);
//  - the bytes per rank equal SEMANTICS.md's: a2a 4 N h (A-1)/(P A) for Q, K, V and O, ring
//    2 N h (R-1)/(R A) forward, and the planner's (plan::context_traffic);
//  - an a2a degree that does not divide the context group is refused naming it.
#include <doctest/doctest.h>

#include <cstdint>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../comm/reference.hpp"
#include "attention_kernel.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/context/hybrid.hpp"
#include "zerotk/context/ring.hpp"
#include "zerotk/context/ulysses.hpp"
#include "zerotk/plan/context.hpp"

namespace test_hybrid {

using namespace zerotk;
using comm::ThreadsCommunicator;

namespace {

constexpr std::size_t kD = 2, kN = 12;  // head size; tokens of the whole sequence

// The whole sequence's Q, K, V and output gradient [kN x heads x kD], the same for every run.
struct Whole {
  std::vector<float> q, k, v, d_o;
  explicit Whole(std::size_t heads) {
    for (auto [out, seed] : {std::pair{&q, 1}, std::pair{&k, 2}, std::pair{&v, 3}, std::pair{&d_o, 4}}) {
      out->resize(kN * heads * kD);
      for (std::size_t i = 0; i < out->size(); ++i) (*out)[i] = test::value<float>(static_cast<std::uint64_t>(seed), 0, i, false);
    }
  }
  // Tokens [first, first + count) of `all`.
  static std::vector<float> rows(const std::vector<float>& all, std::size_t heads, std::size_t first, std::size_t count) {
    return {all.begin() + static_cast<std::ptrdiff_t>(first * heads * kD),
            all.begin() + static_cast<std::ptrdiff_t>((first + count) * heads * kD)};
  }
};

struct Out {
  std::vector<float> o, dq, dk, dv;  // this rank's tokens, every head
};

// Causal attention of `q` (positions `mine`) around `ring` of K and V blocks (every block `width`
// tokens, block b at positions [b width, (b + 1) width)), forward then backward.
Out ring_attention(ThreadsCommunicator& ring, std::size_t heads, std::size_t width, const std::vector<float>& q,
                   const std::vector<float>& k, const std::vector<float>& v, const std::vector<float>& d_o) {
  const zt_test::AttentionKernel ker{.d = kD, .heads = heads, .causal = true};
  const auto at = [&](int b) {
    std::vector<std::size_t> p(width);
    for (std::size_t i = 0; i < width; ++i) p[i] = static_cast<std::size_t>(b) * width + i;
    return p;
  };
  const std::vector<std::size_t> mine = at(ring.rank());
  context::Ring r(ring, k.size());
  Out out;
  out.o.assign(q.size(), 0.f);
  std::vector<float> lse(width * heads, zt_test::kNoKeys), o_b, lse_b;
  r.forward(k, v, [&](int source, std::span<const float> kb, std::span<const float> vb) {
    ker.forward(q, mine, kb, vb, at(source), o_b, lse_b);
    context::merge_partial(out.o, lse, o_b, lse_b, kD);
  });
  out.dq.assign(q.size(), 0.f), out.dk.assign(k.size(), 0.f), out.dv.assign(v.size(), 0.f);
  r.backward(k, v, std::span<float>(out.dk), std::span<float>(out.dv),
             [&](int source, std::span<const float> kb, std::span<const float> vb, std::span<float> dkb, std::span<float> dvb) {
               ker.backward(q, mine, kb, vb, at(source), out.o, lse, d_o, out.dq, dkb, dvb);
             });
  return out;
}

// a2a+p2p on context rank c of P = A x R: returns this rank's chunk of o, dq, dk, dv (every head).
Out hybrid(ThreadsCommunicator& context, int A, std::size_t heads, const Whole& w) {
  const std::size_t n = kN / static_cast<std::size_t>(context.size()), c = static_cast<std::size_t>(context.rank());
  auto g = context::split_hybrid(context, A, n);
  const context::HeadSplit split = context::split_heads(static_cast<int>(heads), A);
  const auto mine = static_cast<std::size_t>(split.count[static_cast<std::size_t>(g.a2a.rank())]);
  context::Ulysses u(g.a2a, n, kD);
  const auto relay = [&](const std::vector<float>& all) {
    std::vector<float> out(static_cast<std::size_t>(A) * n * mine * kD);
    u.seq_to_heads(Whole::rows(all, heads, c * n, n), split, out);
    return out;
  };
  const Out a = ring_attention(g.ring, mine, static_cast<std::size_t>(A) * n, relay(w.q), relay(w.k), relay(w.v), relay(w.d_o));
  Out out;
  for (auto [from, to] : {std::pair{&a.o, &out.o}, std::pair{&a.dq, &out.dq}, std::pair{&a.dk, &out.dk}, std::pair{&a.dv, &out.dv}}) {
    to->resize(n * heads * kD);
    u.heads_to_seq(*from, split, *to);
  }
  return out;
}

}  // namespace

TEST_CASE("a2a+p2p: equals the ring over the a2a groups' super-chunks bit for bit, and unsplit attention to fp32 rounding") {
  struct Case {
    int A, R;
    std::size_t heads;
  };
  for (const Case cs : {Case{2, 2, 4}, Case{3, 2, 6}, Case{4, 1, 4}, Case{1, 4, 4}}) {
    const int P = cs.A * cs.R;
    INFO("A ", cs.A, " x R ", cs.R, ", ", cs.heads, " heads");
    const Whole w(cs.heads);
    const std::size_t n = kN / static_cast<std::size_t>(P), width = static_cast<std::size_t>(cs.A) * n;
    const std::vector<Out> got = comm::run_threads(P, [&](ThreadsCommunicator& c) { return hybrid(c, cs.A, cs.heads, w); });
    // The ring alone over R ranks, each holding its a2a group's super-chunk with every head.
    const std::vector<Out> ring = comm::run_threads(cs.R, [&](ThreadsCommunicator& c) {
      const std::size_t first = static_cast<std::size_t>(c.rank()) * width;
      return ring_attention(c, cs.heads, width, Whole::rows(w.q, cs.heads, first, width), Whole::rows(w.k, cs.heads, first, width),
                            Whole::rows(w.v, cs.heads, first, width), Whole::rows(w.d_o, cs.heads, first, width));
    });
    // Unsplit: one rank, one block.
    const std::vector<Out> whole = comm::run_threads(1, [&](ThreadsCommunicator& c) {
      return ring_attention(c, cs.heads, kN, w.q, w.k, w.v, w.d_o);
    });
    const std::size_t row = cs.heads * kD;
    for (int r = 0; r < P; ++r) {
      CAPTURE(r);
      const Out& mine = got[static_cast<std::size_t>(r)];
      const Out& sup = ring[static_cast<std::size_t>(r / cs.A)];
      const std::size_t off = static_cast<std::size_t>(r % cs.A) * n * row, at = static_cast<std::size_t>(r) * n * row;
      for (auto [name, a, b] : {std::tuple{"o", &mine.o, &sup.o}, std::tuple{"dq", &mine.dq, &sup.dq},
                                std::tuple{"dk", &mine.dk, &sup.dk}, std::tuple{"dv", &mine.dv, &sup.dv}}) {
        REQUIRE(a->size() == n * row);
        CHECK(test::compare_bits(name, a->data(), b->data() + off, n * row) == "");
      }
      // fp32 rounding as test_ring.cpp's against the unsplit attention: the merges round, and the
      // gradients add the blocks' contributions in another order.
      for (auto [a, b, eps] : {std::tuple{&mine.o, &whole[0].o, 1e-4}, std::tuple{&mine.dq, &whole[0].dq, 1e-3},
                               std::tuple{&mine.dk, &whole[0].dk, 1e-3}, std::tuple{&mine.dv, &whole[0].dv, 1e-3}}) {
        for (std::size_t i = 0; i < n * row; ++i) CHECK((*a)[i] == doctest::Approx((*b)[at + i]).epsilon(eps).scale(1e-3));
      }
    }
  }
}

TEST_CASE("a2a+p2p: bytes per rank equal a2a 4 N h (A-1)/(P A) and ring 2 N h (R-1)/(R A) forward") {
  const int A = 2, R = 2, P = A * R;
  const std::size_t heads = 4, n = kN / P, h = heads * kD;
  const Whole w(heads);
  comm::run_threads(P, [&](ThreadsCommunicator& c) {
    auto g = context::split_hybrid(c, A, n);
    CHECK(g.a2a.size() == A);
    CHECK(g.ring.size() == R);
    CHECK(g.a2a.rank() == c.rank() % A);  // adjacent ranks share an a2a group
    CHECK(g.positions(1) == std::vector<std::size_t>{6, 7, 8, 9, 10, 11});
    const context::HeadSplit split = context::split_heads(static_cast<int>(heads), A);
    const std::size_t mine = static_cast<std::size_t>(split.count[static_cast<std::size_t>(g.a2a.rank())]);
    context::Ulysses u(g.a2a, n, kD);
    std::vector<float> q(A * n * mine * kD), k(q.size()), v(q.size()), o(n * h);
    const auto chunk = [&](const std::vector<float>& all) { return Whole::rows(all, heads, static_cast<std::size_t>(c.rank()) * n, n); };
    u.seq_to_heads(chunk(w.q), split, q), u.seq_to_heads(chunk(w.k), split, k), u.seq_to_heads(chunk(w.v), split, v);
    context::Ring ring(g.ring, k.size());
    ring.forward(k, v, [](int, std::span<const float>, std::span<const float>) {});
    u.heads_to_seq(q, split, o);  // the output has the query's shape
    CHECK(g.a2a.stats()[comm::OpKind::all_to_all_v].wire_bytes == 4 * kN * h * (A - 1) / (P * A) * sizeof(float));
    CHECK(g.ring.stats().total_wire_bytes() == 2 * kN * h * (R - 1) / (R * A) * sizeof(float));
    // The planner's figures (plan/context.hpp) are these counts.
    const plan::ContextTraffic t = plan::context_traffic({.sequence = kN, .hidden = h, .heads = heads, .cp = P,
                                                          .mode = plan::CpMode::a2a_p2p, .a2a = A});
    CHECK(t.a2a_forward * sizeof(float) == g.a2a.stats()[comm::OpKind::all_to_all_v].wire_bytes);
    CHECK(t.ring_forward * sizeof(float) == g.ring.stats().total_wire_bytes());
  });
  CHECK_THROWS_WITH_AS(comm::run_threads(4, [](ThreadsCommunicator& c) { (void)context::split_hybrid(c, 3); }),
                       doctest::Contains("must divide the context group's 4 ranks"), usage_error);
}

TEST_CASE("a2a+p2p: node_a2a_size reads the context ranks a node holds from the grid's placement") {
  // 8 thread ranks on simulated nodes of 4: a context group of 8 (tensor 1) spans 2 nodes, 4 each;
  // with tensor 2 a context group of 4 holds 2 ranks a node; nodes of 8 hold the whole group.
  struct Case {
    int ranks_per_node, tensor, want;
  };
  for (const Case k : {Case{4, 1, 4}, Case{4, 2, 2}, Case{8, 1, 8}, Case{1, 1, 1}, Case{2, 2, 1}}) {
    CAPTURE(k.ranks_per_node);
    CAPTURE(k.tensor);
    std::vector<int> got(8, -1);
    comm::run_threads(8, [&](ThreadsCommunicator& world) {
      comm::ProcessGrid grid(world, comm::GridShape{.tensor = k.tensor, .context = 8 / k.tensor});
      got[static_cast<std::size_t>(world.rank())] = context::node_a2a_size(grid.context());
    }, {.ranks_per_node = k.ranks_per_node});
    for (int g : got) CHECK(g == k.want);
  }
  // Nodes of 3 over a context group of 8: uneven, refused naming the placement.
  std::vector<std::string> errors(8);
  comm::run_threads(8, [&](ThreadsCommunicator& world) {
    comm::ProcessGrid grid(world, comm::GridShape{.context = 8});
    try {
      (void)context::node_a2a_size(grid.context());
    } catch (const usage_error& e) {
      errors[static_cast<std::size_t>(world.rank())] = e.what();
    }
  }, {.ranks_per_node = 3});
  for (const std::string& e : errors) CHECK(e.find("node of each context rank: 0 0 0 3 3 3 6 6") != std::string::npos);
}

}  // namespace test_hybrid
