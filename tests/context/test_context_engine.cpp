// Context parallelism under the engine (issue 59): a causal self-attention layer (4 heads of 2,
// projections Wq, Wk, Wv, Wo) trained by the engine on a grid whose data ranks are folded as
// context x replicas (GridShape::context). Each rank of a context group holds a contiguous chunk of
// every sequence; attention runs through Ulysses' re-layout or around the ring, the kernel being the
// test's (attention_kernel.hpp). The engine reduces and shards over the data group, which is data x
// context, and learns nothing of the context layout:
//  - Ulysses at context 2 x 2 replicas, context 3 (uneven heads: 2, 1, 1) and context 4, and the ring
//    at context 2 x 2 replicas and context 4, train as context 1 on the same replicas (whole
//    sequences per rank): losses, norms and parameters to fp32 rounding after 6 steps (the weight
//    gradients add the chunks' sums instead of one sum over the sequence);
//  - at context 2 x 2 replicas, ZeRO stages 1, 2 and 3 give stage 0's bits, and stage 1 keeps half the
//    optimizer state per rank that context 1 on the same 2 replicas keeps (it partitions over 4).
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "../comm/reference.hpp"
#include "attention_kernel.hpp"
#include "zerotk/comm/grid.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/context/ring.hpp"
#include "zerotk/context/ulysses.hpp"
#include "zerotk/engine.hpp"

namespace test_context_engine {

using namespace zerotk;
using comm::ThreadsCommunicator;

namespace {

constexpr std::size_t kHeads = 4, kD = 2, kH = kHeads * kD, kN = 12;  // kN: tokens of a whole sequence

enum class Mode { ulysses, ring };

std::vector<float> values(std::size_t n, std::uint32_t seed, float scale) { return test::lcg_values(n, seed, scale, 12345u); }

// y[t][o] = sum_i w[o][i] x[t][i] (+= when `add`), rows t of `x` [rows x kH].
void project(std::span<const float> w, std::span<const float> x, std::span<float> y) {
  const std::size_t rows = x.size() / kH;
  for (std::size_t t = 0; t < rows; ++t) {
    for (std::size_t o = 0; o < kH; ++o) {
      float acc = 0;
      for (std::size_t i = 0; i < kH; ++i) acc += w[o * kH + i] * x[t * kH + i];
      y[t * kH + o] = acc;
    }
  }
}
// dw[o][i] += sum_t dy[t][o] x[t][i]; dx[t][i] += sum_o dy[t][o] w[o][i] (when dx is not empty).
void project_backward(std::span<const float> w, std::span<const float> x, std::span<const float> dy, std::span<float> dw,
                      std::span<float> dx) {
  const std::size_t rows = x.size() / kH;
  for (std::size_t t = 0; t < rows; ++t) {
    for (std::size_t o = 0; o < kH; ++o) {
      for (std::size_t i = 0; i < kH; ++i) {
        dw[o * kH + i] += dy[t * kH + o] * x[t * kH + i];
        if (!dx.empty()) dx[t * kH + i] += dy[t * kH + o] * w[o * kH + i];
      }
    }
  }
}

struct AttentionModel {
  Param<float> wq{"attn.q.weight", {kH, kH}}, wk{"attn.k.weight", {kH, kH}}, wv{"attn.v.weight", {kH, kH}},
      wo{"attn.o.weight", {kH, kH}};
  std::array<std::vector<float>, 4> init;

  AttentionModel() {
    Param<float>* ps[4] = {&wq, &wk, &wv, &wo};
    for (std::size_t i = 0; i < 4; ++i) {
      init[i] = values(kH * kH, 10 + static_cast<std::uint32_t>(i), 0.5f);
      ps[i]->bind(init[i].data(), nullptr);
    }
  }
  template <class V>
  void parameters(V&& visit) {
    visit(wq.name(), wq);
    visit(wk.name(), wk);
    visit(wv.name(), wv);
    visit(wo.name(), wo);
  }
};

struct Setup {
  Mode mode = Mode::ulysses;
  int context = 1;
  int world = 2;  // replicas = world / context
  int steps = 6;
};

struct Run {
  std::vector<double> losses, norms;
  std::array<std::vector<float>, 4> params;
  std::size_t optimizer_bytes = 0;  // optimizer state live on this rank (host)
};

EngineOptions options() {
  EngineOptions o;
  o.optimizer.lr = 1e-2f;
  o.gradient_clipping = 0.02;  // below every step's norm: the norm enters the update
  o.stage3.param_persistence_threshold = 0;
  return o;
}

// One micro-step on sample `sample` (its whole sequence the same on every rank of the replica);
// this rank holds tokens [c n, (c + 1) n) of it. Returns the mean squared error over its chunk.
template <class E>
double step(E& engine, AttentionModel& m, ThreadsCommunicator& cp, Mode mode, int sample) {
  const auto P = static_cast<std::size_t>(cp.size()), c = static_cast<std::size_t>(cp.rank());
  const std::size_t n = kN / P;
  const std::vector<float> X = values(kN * kH, 1000 + static_cast<std::uint32_t>(sample), 1.0f);
  const std::vector<float> Y = values(kN * kH, 5000 + static_cast<std::uint32_t>(sample), 0.5f);
  const std::span<const float> x(X.data() + c * n * kH, n * kH), target(Y.data() + c * n * kH, n * kH);
  std::vector<std::size_t> mine(n), all(kN);
  for (std::size_t i = 0; i < n; ++i) mine[i] = c * n + i;
  for (std::size_t i = 0; i < kN; ++i) all[i] = i;

  std::vector<float> q(n * kH), k(n * kH), v(n * kH), o(n * kH, 0.f), y(n * kH);
  // Ulysses: this rank's heads over the whole sequence; the ring: every head, this rank's queries.
  const context::HeadSplit split = context::split_heads(static_cast<int>(kHeads), cp.size());
  const auto my_heads = static_cast<std::size_t>(split.count[c]);
  context::Ulysses<ThreadsCommunicator> u(cp, n, kD);
  context::Ring<ThreadsCommunicator> ring(cp, n * kH);
  zt_test::AttentionKernel ker{.d = kD, .heads = mode == Mode::ulysses ? my_heads : kHeads, .causal = true};
  std::vector<float> q_all(kN * my_heads * kD), k_all(q_all.size()), v_all(q_all.size()), o_all, lse;
  {
    auto scope = engine.forward(m);
    project(m.wq.values(), x, q), project(m.wk.values(), x, k), project(m.wv.values(), x, v);
    if (mode == Mode::ulysses) {
      u.seq_to_heads(q, split, q_all), u.seq_to_heads(k, split, k_all), u.seq_to_heads(v, split, v_all);
      ker.forward(q_all, all, k_all, v_all, all, o_all, lse);
      u.heads_to_seq(o_all, split, o);
    } else {
      lse.assign(n * kHeads, zt_test::kNoKeys);
      std::vector<float> o_b, lse_b;
      ring.forward(k, v, [&](int source, std::span<const float> kb, std::span<const float> vb) {
        std::vector<std::size_t> theirs(n);
        for (std::size_t i = 0; i < n; ++i) theirs[i] = static_cast<std::size_t>(source) * n + i;
        ker.forward(q, mine, kb, vb, theirs, o_b, lse_b);
        context::merge_partial(o, lse, o_b, lse_b, kD);
      });
    }
    project(m.wo.values(), o, y);
  }
  double loss = 0;
  std::vector<float> dy(y.size());
  for (std::size_t i = 0; i < y.size(); ++i) {
    const float e = y[i] - target[i];
    loss += static_cast<double>(e) * e / static_cast<double>(y.size());
    dy[i] = 2.f * e / static_cast<float>(y.size());
  }
  {
    auto scope = engine.backward(m);
    std::vector<float> d_o(o.size(), 0.f), dq(q.size(), 0.f), dk(k.size(), 0.f), dv(v.size(), 0.f);
    project_backward(m.wo.values(), o, dy, m.wo.grads(), d_o);
    if (mode == Mode::ulysses) {
      std::vector<float> do_all(q_all.size()), dq_all(q_all.size(), 0.f), dk_all(q_all.size(), 0.f), dv_all(q_all.size(), 0.f);
      u.seq_to_heads(d_o, split, do_all);
      ker.backward(q_all, all, k_all, v_all, all, o_all, lse, do_all, dq_all, dk_all, dv_all);
      u.heads_to_seq(dq_all, split, dq), u.heads_to_seq(dk_all, split, dk), u.heads_to_seq(dv_all, split, dv);
    } else {
      ring.backward(k, v, dk, dv,
                    [&](int source, std::span<const float> kb, std::span<const float> vb, std::span<float> dkb,
                        std::span<float> dvb) {
                      std::vector<std::size_t> theirs(n);
                      for (std::size_t i = 0; i < n; ++i) theirs[i] = static_cast<std::size_t>(source) * n + i;
                      ker.backward(q, mine, kb, vb, theirs, o, lse, d_o, dq, dkb, dvb);
                    });
    }
    const std::span<float> none;
    project_backward(m.wq.values(), x, dq, m.wq.grads(), none);
    project_backward(m.wk.values(), x, dk, m.wk.grads(), none);
    project_backward(m.wv.values(), x, dv, m.wv.grads(), none);
  }
  return loss;
}

template <class... Policies>
std::vector<Run> train(const Setup& s) {
  return comm::run_threads(s.world, [&](ThreadsCommunicator& world) {
    comm::ProcessGrid grid(world, {.context = s.context});
    AttentionModel m;
    Engine<Policies...> engine(grid, m, options());
    Run r;
    for (int i = 0; i < s.steps; ++i) {
      const int sample = i * grid.replica_count() + grid.replica_index();
      const StepReport rep = engine.step(step(engine, m, grid.context(), s.mode, sample));
      r.losses.push_back(rep.loss);
      r.norms.push_back(rep.grad_norm);
    }
    r.optimizer_bytes = engine.memory().live(MemorySpace::host, MemoryCategory::optimizer_state);
    auto g = engine.gather(m);
    Param<float>* ps[4] = {&m.wq, &m.wk, &m.wv, &m.wo};
    for (std::size_t i = 0; i < 4; ++i) r.params[i].assign(ps[i]->values().begin(), ps[i]->values().end());
    return r;
  });
}

using Adam = Optimizer<AdamW>;

// Every rank of `got` against the context-1 run's rank of the same replica, to fp32 rounding.
void check_near(const std::vector<Run>& got, const std::vector<Run>& one, int context) {
  for (std::size_t w = 0; w < got.size(); ++w) {
    CAPTURE(w);
    const Run& want = one[w / static_cast<std::size_t>(context)];
    REQUIRE(got[w].losses.size() == want.losses.size());
    for (std::size_t i = 0; i < want.losses.size(); ++i) {
      CAPTURE(i);
      CHECK(got[w].losses[i] == doctest::Approx(want.losses[i]).epsilon(1e-5));
      CHECK(got[w].norms[i] == doctest::Approx(want.norms[i]).epsilon(1e-5));
      CHECK(got[w].norms[i] > 0.02);  // clipped: the norm entered the update
    }
    for (std::size_t p = 0; p < 4; ++p) {
      for (std::size_t i = 0; i < want.params[p].size(); ++i) {
        CHECK(got[w].params[p][i] == doctest::Approx(want.params[p][i]).epsilon(1e-4).scale(1e-2));
      }
    }
  }
  // Not trivially equal: the weights moved from their start by more than the tolerance.
  const std::vector<float> start = values(kH * kH, 10, 0.5f);
  double moved = 0;
  for (std::size_t i = 0; i < start.size(); ++i) moved = std::max(moved, static_cast<double>(std::abs(one[0].params[0][i] - start[i])));
  CHECK(moved > 1e-2);
}

}  // namespace

TEST_CASE("context parallel: Ulysses and the ring under the engine train as context 1 (6 steps, to fp32 rounding)") {
  using S2 = Partitioner<Stage<2>>;
  const std::vector<Run> two = train<S2, Adam>({.context = 1, .world = 2});
  const std::vector<Run> one = train<S2, Adam>({.context = 1, .world = 1});
  SUBCASE("Ulysses, context 2 x 2 replicas") { check_near(train<S2, Adam>({.context = 2, .world = 4}), two, 2); }
  SUBCASE("Ulysses, context 3 (uneven heads)") { check_near(train<S2, Adam>({.context = 3, .world = 3}), one, 3); }
  SUBCASE("Ulysses, context 4") { check_near(train<S2, Adam>({.context = 4, .world = 4}), one, 4); }
  SUBCASE("ring, context 2 x 2 replicas") { check_near(train<S2, Adam>({.mode = Mode::ring, .context = 2, .world = 4}), two, 2); }
  SUBCASE("ring, context 4") { check_near(train<S2, Adam>({.mode = Mode::ring, .context = 4, .world = 4}), one, 4); }
}

TEST_CASE("context parallel: ZeRO stages 0-3 give the same bits at context 2 x 2 replicas, partitioned over all 4") {
  const Setup s{.context = 2, .world = 4};
  const std::vector<Run> s0 = train<Partitioner<Stage<0>>, Adam>(s);
  const std::vector<Run> s1 = train<Partitioner<Stage<1>>, Adam>(s);
  const std::vector<Run> s2 = train<Partitioner<Stage<2>>, Adam>(s);
  const std::vector<Run> s3 = train<Partitioner<Stage<3>>, Adam>(s);
  for (const std::vector<Run>* got : {&s1, &s2, &s3}) {
    for (std::size_t w = 0; w < 4; ++w) {
      CAPTURE(w);
      CHECK((*got)[w].losses == s0[w].losses);
      CHECK((*got)[w].norms == s0[w].norms);
      for (std::size_t p = 0; p < 4; ++p) {
        CHECK(test::compare_bits("param", (*got)[w].params[p].data(), s0[w].params[p].data(), kH * kH) == "");
      }
    }
  }
  // Stage 1 partitions the optimizer state over data x context: half of what 2 replicas alone keep.
  const std::vector<Run> flat = train<Partitioner<Stage<1>>, Adam>({.context = 1, .world = 2});
  CHECK(s1[0].optimizer_bytes > 0);
  CHECK(s1[0].optimizer_bytes * 2 == flat[0].optimizer_bytes);
}

}  // namespace test_context_engine
