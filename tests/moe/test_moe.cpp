// Mixture of experts' building blocks (docs/moe.md) on thread ranks: the router against closed
// forms and finite differences, the dispatcher's expert parallelism against one expert rank bit for
// bit, its bytes against SEMANTICS.md's formula, and its drops against a serial reference.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../comm/reference.hpp"
#include "moe_fixture.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/moe/balance.hpp"
#include "zerotk/moe/dispatcher.hpp"
#include "zerotk/moe/router.hpp"

namespace test_moe {

using namespace zerotk;
using comm::OpKind;
using comm::ThreadsCommunicator;
using test::Experts;
using test::logits_of;
using test::Result;

namespace {

// A loss that weighs each gate: L = sum_s w_s gate_s (+ coef * balance loss).
double gate_loss(std::span<const float> logits, int T, int E, moe::RouterOptions o, std::span<const double> w,
                 double coef) {
  const auto r = moe::route(logits, T, E, o);
  double l = 0;
  for (std::size_t s = 0; s < r.gate.size(); ++s) l += w[s] * r.gate[s];
  if (coef != 0) l += coef * moe::switch_balance(r).loss;
  return l;
}

}  // namespace

TEST_CASE("router: softmax then top-k, gates renormalized or not, ties to the lower expert, bias only chooses") {
  // token 0: logits 0, ln 2, ln 3, 0 -> p = 1/7, 2/7, 3/7, 1/7; token 1: all equal.
  const std::vector<float> logits = {0.f, std::log(2.f), std::log(3.f), 0.f, 1.f, 1.f, 1.f, 1.f};
  const auto r = moe::route(logits, 2, 4, {.top_k = 2});
  CHECK(r.expert == std::vector<int>{2, 1, 0, 1});
  CHECK(r.gate[0] == doctest::Approx(3.0 / 7).epsilon(1e-6));
  CHECK(r.gate[1] == doctest::Approx(2.0 / 7).epsilon(1e-6));
  CHECK(r.gate[2] == doctest::Approx(0.25).epsilon(1e-6));
  const auto n = moe::route(logits, 2, 4, {.top_k = 2, .renormalize = true});
  CHECK(n.gate[0] == doctest::Approx(0.6).epsilon(1e-6));
  CHECK(n.gate[1] == doctest::Approx(0.4).epsilon(1e-6));
  const std::vector<float> bias = {0.f, 0.f, -1.f, 0.5f};  // expert 2 out, expert 3 first
  const auto b = moe::route(logits, 2, 4, {.top_k = 2}, bias);
  CHECK(b.expert == std::vector<int>{3, 1, 3, 0});
  CHECK(b.gate[0] == doctest::Approx(1.0 / 7).epsilon(1e-6));  // the probability, not the biased score
  CHECK_THROWS_AS(moe::route(logits, 2, 4, {.top_k = 5}), usage_error);
  CHECK_THROWS_AS(moe::route(std::span<const float>(logits).first(7), 2, 4, {.top_k = 1}), usage_error);
}

TEST_CASE("router: the backward and the Switch balance loss's gradient match central differences") {
  const int T = 5, E = 6;
  for (const bool renorm : {false, true}) {
    for (const int k : {1, 2, 3}) {
      const std::string norm = renorm ? ", renormalized" : "";
      INFO("top_k ", k, norm);
      auto logits = logits_of(7 + static_cast<std::uint64_t>(k), 0, T * E);
      std::vector<double> w(static_cast<std::size_t>(T * k));
      for (std::size_t s = 0; s < w.size(); ++s) w[s] = test::value<float>(3, 1, s, false);
      const moe::RouterOptions o{.top_k = k, .renormalize = renorm};
      const double coef = 0.3;
      const auto r = moe::route(logits, T, E, o);
      std::vector<float> d_gate(w.begin(), w.end()), d_logits(logits.size());
      moe::route_backward(r, d_gate, d_logits);
      moe::switch_balance_backward(r, moe::switch_balance(r), coef, d_logits);
      for (std::size_t i = 0; i < logits.size(); ++i) {
        const float keep = logits[i], eps = 1e-2f;
        logits[i] = keep + eps;
        const double up = gate_loss(logits, T, E, o, w, coef);
        logits[i] = keep - eps;
        const double down = gate_loss(logits, T, E, o, w, coef);
        logits[i] = keep;
        CHECK(d_logits[i] == doctest::Approx((up - down) / (2.0 * eps)).epsilon(1e-2).scale(1e-3));
      }
    }
  }
}

TEST_CASE("router: the Switch balance loss is E * sum f_i P_i; the expert bias moves against the load") {
  // 4 tokens, 2 experts, top-1: tokens 0-2 choose expert 0 (p 0.75), token 3 expert 1 (p 0.75).
  const float a = std::log(3.f);
  const std::vector<float> logits = {a, 0, a, 0, a, 0, 0, a};
  const auto r = moe::route(logits, 4, 2, {.top_k = 1});
  const auto b = moe::switch_balance(r);
  CHECK(b.fraction[0] == doctest::Approx(0.75));
  CHECK(b.mean_prob[0] == doctest::Approx((3 * 0.75 + 0.25) / 4).epsilon(1e-6));
  CHECK(b.loss == doctest::Approx(2 * (0.75 * 0.625 + 0.25 * 0.375)).epsilon(1e-6));
  moe::ExpertBias bias(3, 0.01f);
  const std::vector<std::uint64_t> load = {10, 4, 7};  // mean 7
  bias.update(load);
  CHECK(bias.bias == std::vector<float>{-0.01f, 0.01f, 0.f});
}

TEST_CASE("balance over a group: f_i from every rank's slots (the concatenated batch's), P_i local; the global load drives one bias") {
  const int W = 4, E = 8, k = 2, T = 5;
  const auto logits_all = [&] {
    std::vector<float> all;
    for (int r = 0; r < W; ++r) {
      const auto l = logits_of(41, r, T * E);
      all.insert(all.end(), l.begin(), l.end());
    }
    return all;
  }();
  const auto whole = moe::switch_balance(moe::route(logits_all, W * T, E, {.top_k = k}));
  const auto out = comm::run_threads(W, [&](ThreadsCommunicator& c) {
    const auto r = moe::route(logits_of(41, c.rank(), T * E), T, E, {.top_k = k});
    const auto local = moe::switch_balance(r);
    const auto global = moe::switch_balance(r, c);
    CHECK(global.fraction == whole.fraction);  // the same counts over the same total, in double
    CHECK(global.mean_prob == local.mean_prob);
    double loss = 0;
    for (int e = 0; e < E; ++e) loss += global.fraction[std::size_t(e)] * local.mean_prob[std::size_t(e)];
    CHECK(global.loss == doctest::Approx(E * loss).epsilon(1e-12));
    // Each rank's dispatch (dropless, one expert group) keeps all its slots: the global load is the
    // whole batch's count per expert.
    moe::Dispatcher d(c, E, 1, moe::Dropless{});
    std::vector<float> x(static_cast<std::size_t>(T), 1.f);
    d.dispatch(x, r);
    const auto load = moe::global_load(d.kept_per_expert(), c);
    moe::ExpertBias bias(E, 0.01f);
    bias.update(load);
    return std::pair(load, bias.bias);
  });
  std::vector<std::uint64_t> want(E, 0);
  for (std::size_t e = 0; e < std::size_t(E); ++e) want[e] = static_cast<std::uint64_t>(whole.fraction[e] * W * T * k + 0.5);
  for (const auto& [load, bias] : out) {
    CHECK(load == want);
    CHECK(bias == out[0].second);  // every rank keeps the same bias
  }
  CHECK(std::any_of(out[0].second.begin(), out[0].second.end(), [](float b) { return b != 0.f; }));
}

TEST_CASE("dispatcher: dropless expert parallel 4 gives the bits of one expert rank over the same tokens") {
  const int W = 4, E = 8, k = 2, h = 6, T = 12;
  const Experts ex(E, h);
  const auto inputs = [&](int rank) {
    return std::array<std::vector<float>, 3>{logits_of(1, rank, T * h), logits_of(2, rank, T * E), logits_of(3, rank, T * h)};
  };
  const auto ep4 = comm::run_threads(W, [&](ThreadsCommunicator& c) {
    const auto [x, logits, dy] = inputs(c.rank());
    return test::moe_layer(c, ex, E, k, x, logits, dy, moe::Dropless{});
  });
  // One expert rank holding every rank's tokens, in rank order.
  std::vector<float> x, logits, dy;
  for (int r = 0; r < W; ++r) {
    const auto in = inputs(r);
    x.insert(x.end(), in[0].begin(), in[0].end());
    logits.insert(logits.end(), in[1].begin(), in[1].end());
    dy.insert(dy.end(), in[2].begin(), in[2].end());
  }
  const auto ep1 = comm::run_threads(1, [&](ThreadsCommunicator& c) { return test::moe_layer(c, ex, E, k, x, logits, dy, moe::Dropless{}); });
  const Result& one = ep1[0];
  CHECK(one.dropped == 0);
  CHECK(one.a2a_wire == 0);
  const auto part = [](const std::vector<float>& v, int r, std::size_t n) {
    return std::vector<float>(v.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * n),
                              v.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r + 1) * n));
  };
  for (int r = 0; r < W; ++r) {
    INFO("rank ", r);
    const Result& got = ep4[static_cast<std::size_t>(r)];
    CHECK(got.dropped == 0);
    CHECK(got.rows_agree);
    CHECK(test::compare_bits("y", got.y.data(), part(one.y, r, T * h).data(), got.y.size()) == "");
    CHECK(test::compare_bits("dx", got.dx.data(), part(one.dx, r, T * h).data(), got.dx.size()) == "");
    CHECK(test::compare_bits("d_logits", got.d_logits.data(), part(one.d_logits, r, T * E).data(), got.d_logits.size()) == "");
    for (int e = r * E / W; e < (r + 1) * E / W; ++e) {
      const auto& dw = got.dw[static_cast<std::size_t>(e)];
      CHECK(test::compare_bits("dW of expert " + std::to_string(e), dw.data(), one.dw[static_cast<std::size_t>(e)].data(), dw.size()) == "");
    }
  }
  // Not trivially equal: the experts did change the output and the gradients reached the router.
  CHECK(std::any_of(one.y.begin(), one.y.end(), [](float v) { return v != 0.f; }));
  CHECK(std::any_of(one.d_logits.begin(), one.d_logits.end(), [](float v) { return v != 0.f; }));
}

TEST_CASE("dispatcher: bf16 rows: expert parallel 4 gives one expert rank's bits, near the fp32 layer, at half the bytes") {
  const int W = 4, E = 8, k = 2, h = 6, T = 12;
  const Experts ex(E, h);
  // One layer in 16-bit rows: the expert converts its rows to fp32 and back.
  const auto layer16 = [&](ThreadsCommunicator& c, const std::vector<float>& x32, const std::vector<float>& logits,
                           const std::vector<float>& dy32) {
    std::vector<bfloat16> x, dy;
    for (float v : x32) x.push_back(bfloat16(v));
    for (float v : dy32) dy.push_back(bfloat16(v));
    const int n = static_cast<int>(x.size()) / h;
    const auto r = moe::route(logits, n, E, {.top_k = k, .renormalize = true});
    moe::Dispatcher<ThreadsCommunicator, moe::Dropless, bfloat16> d(c, E, h);
    d.dispatch(x, r);
    for (int e = 0; e < d.local_experts(); ++e) {
      std::vector<float> in, out(d.rows(e) * std::size_t(h));
      for (bfloat16 v : d.input(e)) in.push_back(static_cast<float>(v));
      ex.forward(d.first_expert() + e, in, out);
      for (std::size_t i = 0; i < out.size(); ++i) d.output(e)[i] = bfloat16(out[i]);
    }
    std::vector<bfloat16> y(x.size());
    d.combine(y);
    std::vector<float> d_gate(r.gate.size());
    d.combine_backward(dy, d_gate);
    for (int e = 0; e < d.local_experts(); ++e) {  // a stand-in backward: dx = 2 dy
      for (std::size_t i = 0; i < d.output_grad(e).size(); ++i) {
        d.input_grad(e)[i] = bfloat16(2.f * static_cast<float>(d.output_grad(e)[i]));
      }
    }
    std::vector<bfloat16> dx(x.size(), bfloat16(0.f));
    d.dispatch_backward(dx);
    std::vector<float> out;
    for (bfloat16 v : y) out.push_back(static_cast<float>(v));
    for (bfloat16 v : dx) out.push_back(static_cast<float>(v));
    out.insert(out.end(), d_gate.begin(), d_gate.end());
    return std::pair(out, c.stats()[OpKind::all_to_all_v].wire_bytes);
  };
  const auto ep4 = comm::run_threads(W, [&](ThreadsCommunicator& c) {
    return layer16(c, logits_of(1, c.rank(), T * h), logits_of(2, c.rank(), T * E), logits_of(3, c.rank(), T * h));
  });
  std::vector<float> x, logits, dy;
  for (int r = 0; r < W; ++r) {
    for (auto [v, seed, width] : {std::tuple{&x, 1, h}, std::tuple{&logits, 2, E}, std::tuple{&dy, 3, h}}) {
      const auto part = logits_of(static_cast<std::uint64_t>(seed), r, std::size_t(T * width));
      v->insert(v->end(), part.begin(), part.end());
    }
  }
  const auto one = comm::run_threads(1, [&](ThreadsCommunicator& c) { return layer16(c, x, logits, dy); })[0].first;
  const auto fp32 = comm::run_threads(W, [&](ThreadsCommunicator& c) {
    return test::moe_layer(c, ex, E, k, logits_of(1, c.rank(), T * h), logits_of(2, c.rank(), T * E),
                           logits_of(3, c.rank(), T * h), moe::Dropless{});
  });
  const std::size_t n = std::size_t(T * h), slots = std::size_t(T * k);
  for (int r = 0; r < W; ++r) {
    INFO("rank ", r);
    const auto& got = ep4[std::size_t(r)].first;
    const auto ur = std::size_t(r);
    CHECK(test::compare_bits("y", got.data(), one.data() + ur * n, n) == "");
    CHECK(test::compare_bits("dx", got.data() + n, one.data() + W * n + ur * n, n) == "");
    CHECK(test::compare_bits("d_gate", got.data() + 2 * n, one.data() + 2 * W * n + ur * slots, slots) == "");
    for (std::size_t i = 0; i < n; ++i) {  // bf16 rows: 8 mantissa bits, a few roundings of O(1) values
      CHECK(got[i] == doctest::Approx(fp32[ur].y[i]).epsilon(2e-2).scale(0.5));
    }
    CHECK(ep4[ur].second * 2 == fp32[ur].a2a_wire);  // the same rows at 2 bytes instead of 4
  }
}

TEST_CASE("dispatcher: bytes are 4 T k h b (E_p-1)/E_p under uniform routing; skewed routing sends exactly the routed rows") {
  const int W = 4, E = 4, k = 2, h = 5, T = 8;
  const Experts ex(E, h);
  // Uniform: slot j of token t chooses expert (t k + j) mod E (logits 5 and 4 there, 0 elsewhere).
  // Skewed: every token's first choice is expert 0, its second expert 1.
  for (const bool skewed : {false, true}) {
    const std::string routing_kind = skewed ? "skewed" : "uniform";
    INFO(routing_kind);
    const auto wire = comm::run_threads(W, [&](ThreadsCommunicator& c) {
      std::vector<float> logits(T * E, 0.f);
      for (int t = 0; t < T; ++t) {
        for (int j = 0; j < k; ++j) {
          const int e = skewed ? j : (t * k + j) % E;
          logits[static_cast<std::size_t>(t * E + e)] = 5.f - static_cast<float>(j);
        }
      }
      const auto x = logits_of(5, c.rank(), T * h), dy = logits_of(6, c.rank(), T * h);
      return test::moe_layer(c, ex, E, k, x, logits, dy, moe::Dropless{}).a2a_wire;
    });
    for (int r = 0; r < W; ++r) {
      // uniform: 4 T k h b (E_p - 1) / E_p. Skewed: ranks 0 and 1 hold the two chosen experts;
      // every rank sends T rows to each of them (rank 0 and 1 keep their own T), and each of them
      // returns 4 T rows of which 3 T leave; forward and backward alike. Ranks 0, 1: 2 (T + 3 T)
      // rows; ranks 2, 3: 2 (2 T).
      const std::uint64_t uniform = 4ull * T * k * h * 4 * (W - 1) / W;
      const std::uint64_t routed = (r == 0 || r == 1 ? 8ull * T : 4ull * T) * h * 4;
      CHECK(wire[static_cast<std::size_t>(r)] == (skewed ? routed : uniform));
      if (skewed) {  // DeepSpeed's dropless pads every expert to the largest load: E x T rows per transfer
        const std::uint64_t padded = 4ull * E * T * h * 4 * (W - 1) / W;
        CHECK(wire[static_cast<std::size_t>(r)] < padded);
      }
    }
  }
}

TEST_CASE("dispatcher: dropped slots under capacity factors 1.0 and 1.25 (by position, by probability) equal a serial reference, and add nothing") {
  const int W = 2, E = 4, k = 2, h = 3, T = 10;
  const Experts ex(E, h);
  for (const auto& [factor, by] : {std::pair{1.0, moe::DropBy::position}, std::pair{1.25, moe::DropBy::position},
                                  std::pair{1.0, moe::DropBy::probability}, std::pair{1.25, moe::DropBy::probability}}) {
    const bool by_prob = by == moe::DropBy::probability;
    bool policies_differ = false;  // by probability keeps another set than by position would
    INFO("capacity factor ", factor, by_prob ? " by probability" : " by position");
    const auto results = comm::run_threads(W, [&](ThreadsCommunicator& c) {
      const auto x = logits_of(11, c.rank(), T * h), logits = logits_of(12, c.rank(), T * E),
                 dy = logits_of(13, c.rank(), T * h);
      return test::moe_layer(c, ex, E, k, x, logits, dy, moe::Capacity{.factor = factor, .drop_by = by});
    });
    for (int r = 0; r < W; ++r) {
      INFO("rank ", r);
      const auto x = logits_of(11, r, T * h), logits = logits_of(12, r, T * E);
      const auto routing = moe::route(logits, T, E, {.top_k = k, .renormalize = true});
      // The reference: a slot (t, j) of expert e is kept when fewer than `cap` of e's other slots
      // come before it: by position, those of an earlier choice or an earlier token of the same
      // choice; by probability, those whose token gives e a larger probability, or an equal one
      // and an earlier position.
      const auto cap = static_cast<std::size_t>(std::ceil(T * k / double(E) * factor));
      std::vector<char> kept(static_cast<std::size_t>(T * k), 0);
      std::size_t dropped = 0;
      const auto slot = [&](int t, int j) { return static_cast<std::size_t>(t * k + j); };
      const auto prob = [&](int t, int e) { return routing.probs[static_cast<std::size_t>(t * E + e)]; };
      for (int t = 0; t < T; ++t) {
        for (int j = 0; j < k; ++j) {
          const int e = routing.expert[slot(t, j)];
          std::size_t before = 0, before_by_position = 0;
          for (int u = 0; u < T; ++u) {
            for (int i = 0; i < k; ++i) {
              if ((u == t && i == j) || routing.expert[slot(u, i)] != e) continue;
              const bool earlier = i < j || (i == j && u < t);
              const bool ahead = by_prob ? prob(u, e) > prob(t, e) || (prob(u, e) == prob(t, e) && earlier) : earlier;
              before += ahead ? 1 : 0;
              before_by_position += earlier ? 1 : 0;
            }
          }
          policies_differ = policies_differ || (before < cap) != (before_by_position < cap);
          if (before < cap) {
            kept[slot(t, j)] = 1;
          } else {
            ++dropped;
          }
        }
      }
      const Result& got = results[static_cast<std::size_t>(r)];
      CHECK(got.dropped == dropped);
      if (factor == 1.0) CHECK(dropped > 0);  // the case does exercise the drop
      // y[t] = sum over kept slots of gate * expert(x[t]), directly
      std::vector<float> y(static_cast<std::size_t>(T * h), 0.f), row(static_cast<std::size_t>(h));
      for (int t = 0; t < T; ++t) {
        for (int j = 0; j < k; ++j) {
          const auto s = static_cast<std::size_t>(t * k + j);
          if (!kept[s]) continue;
          ex.forward(routing.expert[s], std::span<const float>(x).subspan(static_cast<std::size_t>(t * h), static_cast<std::size_t>(h)), row);
          for (int i = 0; i < h; ++i) y[static_cast<std::size_t>(t * h + i)] += routing.gate[s] * row[static_cast<std::size_t>(i)];
        }
      }
      CHECK(test::compare_bits("y", got.y.data(), y.data(), y.size()) == "");
    }
    if (by_prob && factor == 1.0) CHECK(policies_differ);  // the two policies are told apart here
  }
}

TEST_CASE("dispatcher: the layer's gradients (through combine, the experts and dispatch) match central differences") {
  // L = sum_t dy[t] . y[t] with y the whole layer: route, dispatch, experts, combine. dx and
  // d_logits from the backward passes against (L(v + eps) - L(v - eps)) / 2 eps, in one rank. (A
  // logit of an expert a token did not choose has no effect on renormalized gates: 0 both ways, up
  // to the fp32 noise of the difference, hence the absolute floor.)
  const int E = 4, k = 2, h = 3, T = 5;
  const Experts ex(E, h);
  const auto x0 = logits_of(31, 0, T * h), logits0 = logits_of(32, 0, T * E), dy = logits_of(33, 0, T * h);
  comm::run_threads(1, [&](ThreadsCommunicator& c) {
    const Result r = test::moe_layer(c, ex, E, k, x0, logits0, dy, moe::Dropless{});
    const auto loss = [&](const std::vector<float>& x, const std::vector<float>& logits) {
      const Result o = test::moe_layer(c, ex, E, k, x, logits, dy, moe::Dropless{});
      double l = 0;
      for (std::size_t i = 0; i < dy.size(); ++i) l += static_cast<double>(dy[i]) * o.y[i];
      return l;
    };
    const float eps = 1e-2f;
    for (std::size_t i = 0; i < x0.size(); ++i) {
      auto up = x0, down = x0;
      up[i] += eps, down[i] -= eps;
      CHECK(r.dx[i] == doctest::Approx((loss(up, logits0) - loss(down, logits0)) / (2.0 * eps)).epsilon(1e-2).scale(1e-2));
    }
    for (std::size_t i = 0; i < logits0.size(); ++i) {
      auto up = logits0, down = logits0;
      up[i] += eps, down[i] -= eps;
      CHECK(r.d_logits[i] == doctest::Approx((loss(x0, up) - loss(x0, down)) / (2.0 * eps)).epsilon(1e-2).scale(1e-2));
    }
  });
}

TEST_CASE("dispatcher: a rank whose layer differs from its peers' gets an error naming it, never a hang") {
  const int W = 4, k = 1, h = 3, T = 4;
  const auto what = [&](int odd_experts, int odd_hidden) {
    return comm::run_threads(W, [&](ThreadsCommunicator& c) -> std::string {
      const bool odd = c.rank() == 2;
      const int E = odd ? odd_experts : 8, hh = odd ? odd_hidden : h;
      const auto x = logits_of(21, c.rank(), std::size_t(T * hh)), logits = logits_of(22, c.rank(), std::size_t(T * E));
      const auto r = moe::route(logits, T, E, {.top_k = k});
      moe::Dispatcher d(c, E, hh, moe::Dropless{});
      try {
        d.dispatch(x, r);
      } catch (const comm_error& e) {
        return e.what();
      }
      return {};
    });
  };
  // 12 experts on rank 2 (3 per rank) against 8 (2 per rank): the count exchange's sizes differ.
  for (const auto& e : what(12, h)) {
    CHECK(e.find("mismatched collective") != std::string::npos);
    CHECK(e.find("rank 2: all_to_all(count 3, int32)") != std::string::npos);
  }
  // Rows of 5 elements on rank 2 against 3: the row exchange's counts disagree, naming rank 2 and a peer.
  for (const auto& e : what(8, 5)) {
    CHECK(e.find("all_to_all_v counts disagree") != std::string::npos);
    CHECK(e.find("rank 2") != std::string::npos);
  }
}

}  // namespace test_moe
