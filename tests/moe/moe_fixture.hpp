#pragma once
// A mixture-of-experts layer for tests (tests/moe on thread ranks, tests/mpi across processes):
// row-wise experts y = tanh(W_e x) with their backward, and one forward + backward through the
// router and the dispatcher.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "../comm/reference.hpp"
#include "zerotk/moe/dispatcher.hpp"
#include "zerotk/moe/router.hpp"

namespace zerotk::test {

inline std::vector<float> logits_of(std::uint64_t seed, int rank, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = test::value<float>(seed, rank, i, false);
  return v;
}

// An expert y = tanh(W x) row by row, W [h x h]: its forward, and its backward (dx of the rows; dw
// accumulates over the rows in their order).
inline void expert_forward(std::span<const float> w, std::span<const float> x, std::span<float> y, std::size_t h) {
  for (std::size_t r = 0; r < x.size() / h; ++r) {
    for (std::size_t i = 0; i < h; ++i) {
      float a = 0;
      for (std::size_t m = 0; m < h; ++m) a += w[i * h + m] * x[r * h + m];
      y[r * h + i] = std::tanh(a);
    }
  }
}
inline void expert_backward(std::span<const float> w, std::span<const float> x, std::span<const float> dy,
                            std::span<float> dx, std::span<float> dw, std::size_t h) {
  std::vector<float> y(x.size());
  expert_forward(w, x, y, h);
  for (std::size_t r = 0; r < x.size() / h; ++r) {
    for (std::size_t m = 0; m < h; ++m) dx[r * h + m] = 0;
    for (std::size_t i = 0; i < h; ++i) {
      const float da = dy[r * h + i] * (1 - y[r * h + i] * y[r * h + i]);
      for (std::size_t m = 0; m < h; ++m) {
        dx[r * h + m] += w[i * h + m] * da;
        dw[i * h + m] += da * x[r * h + m];
      }
    }
  }
}

// The mean squared error of y against target (accumulated in double), its gradient into dy.
inline double mse(std::span<const float> y, std::span<const float> target, std::span<float> dy) {
  double loss = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    const float err = y[i] - target[i];
    loss += static_cast<double>(err) * err / static_cast<double>(y.size());
    dy[i] = 2.0f * err / static_cast<float>(y.size());
  }
  return loss;
}

// The router's logits [T x E] of tokens x [T x h] under its weights wr [E x h].
inline std::vector<float> router_logits(std::span<const float> wr, std::span<const float> x, std::size_t E,
                                        std::size_t h) {
  const std::size_t T = x.size() / h;
  std::vector<float> logits(T * E, 0.0f);
  for (std::size_t t = 0; t < T; ++t) {
    for (std::size_t e = 0; e < E; ++e) {
      for (std::size_t m = 0; m < h; ++m) logits[t * E + e] += wr[e * h + m] * x[t * h + m];
    }
  }
  return logits;
}
// The router's weight gradient: gr [E x h] += d_logits^T x.
inline void add_router_grads(std::span<float> gr, std::span<const float> d_logits, std::span<const float> x,
                             std::size_t E, std::size_t h) {
  const std::size_t T = x.size() / h;
  for (std::size_t t = 0; t < T; ++t) {
    for (std::size_t e = 0; e < E; ++e) {
      for (std::size_t m = 0; m < h; ++m) gr[e * h + m] += d_logits[t * E + e] * x[t * h + m];
    }
  }
}
// Local expert e's weight gradient (weights w) added into `grads`, summed per source rank with the
// sources in order: the bits of a rank-order all-reduce of per-rank gradients (expert parallel 1's).
template <class Dispatcher>
void add_expert_grads(Dispatcher& d, int e, int sources, std::span<const float> w, std::span<float> grads,
                      std::size_t h) {
  const auto in = d.input(e);
  const auto dout = d.output_grad(e);
  const auto din = d.input_grad(e);
  std::size_t at = 0;
  std::vector<float> partial(h * h);
  for (int s = 0; s < sources; ++s) {
    const std::size_t n = d.rows(e, s) * h;
    std::fill(partial.begin(), partial.end(), 0.0f);
    expert_backward(w, in.subspan(at, n), dout.subspan(at, n), din.subspan(at, n), partial, h);
    for (std::size_t i = 0; i < h * h; ++i) grads[i] += partial[i];
    at += n;
  }
}

// The test's experts: expert e's W_e from a seed of its own.
struct Experts {
  int h = 0;
  std::vector<std::vector<float>> w;  // [E][h*h]
  Experts(int experts, int hidden) : h(hidden) {
    for (int e = 0; e < experts; ++e) w.push_back(logits_of(900 + static_cast<std::uint64_t>(e), 0, std::size_t(hidden * hidden)));
    for (auto& m : w) for (float& x : m) x *= 0.25f;
  }
  void forward(int e, std::span<const float> x, std::span<float> y) const {
    expert_forward(w[static_cast<std::size_t>(e)], x, y, static_cast<std::size_t>(h));
  }
  void backward(int e, std::span<const float> x, std::span<const float> dy, std::span<float> dx, std::vector<float>& dw) const {
    expert_backward(w[static_cast<std::size_t>(e)], x, dy, dx, dw, static_cast<std::size_t>(h));
  }
};

// What one rank ends a forward + backward with.
struct Result {
  std::vector<float> y, dx, d_logits;
  std::vector<std::vector<float>> dw;  // this rank's experts' weight gradients, by global expert
  std::size_t dropped = 0;
  std::uint64_t a2a_wire = 0;
  bool rows_agree = true;  // each local expert's rows(e, source) add up to rows(e)
};

// One layer on `c` (the expert group): route the logits, dispatch x, run the experts, combine,
// then the backward from dy.
template <class C, class Drop>
Result moe_layer(C& c, const Experts& ex, int E, int k, const std::vector<float>& x,
             const std::vector<float>& logits, const std::vector<float>& dy, Drop drop) {
  const int h = ex.h;
  const int T = static_cast<int>(x.size()) / h;
  const auto routing = moe::route(logits, T, E, {.top_k = k, .renormalize = true});
  moe::Dispatcher d(c, E, h, drop);
  d.dispatch(x, routing);
  Result res;
  for (int e = 0; e < d.local_experts(); ++e) {
    ex.forward(d.first_expert() + e, d.input(e), d.output(e));
    std::size_t by_source = 0;
    for (int s = 0; s < c.size(); ++s) by_source += d.rows(e, s);
    res.rows_agree = res.rows_agree && by_source == d.rows(e);
  }
  res.y.resize(x.size());
  d.combine(res.y);
  std::vector<float> d_gate(routing.gate.size());
  d.combine_backward(dy, d_gate);
  res.dw.resize(static_cast<std::size_t>(E));
  for (int e = 0; e < d.local_experts(); ++e) {
    auto& dw = res.dw[static_cast<std::size_t>(d.first_expert() + e)];
    dw.assign(static_cast<std::size_t>(h * h), 0.f);
    ex.backward(d.first_expert() + e, d.input(e), d.output_grad(e), d.input_grad(e), dw);
  }
  res.dx.assign(x.size(), 0.f);
  d.dispatch_backward(res.dx);
  res.d_logits.resize(logits.size());
  moe::route_backward(routing, d_gate, res.d_logits);
  res.dropped = d.dropped();
  res.a2a_wire = c.stats()[comm::OpKind::all_to_all_v].wire_bytes;
  return res;
}

}  // namespace zerotk::test
