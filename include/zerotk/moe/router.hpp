#pragma once
/// \file zerotk/moe/router.hpp
/// Top-k gating over the user's router logits, with its backward (docs/moe.md; the balance terms:
/// moe/balance.hpp). The router's GEMM (logits = x W_g) is the user's; this
/// file starts from the logits of one rank's T tokens over E experts, fp32, token-major.
///
///   auto r = zerotk::moe::route(logits, T, E, {.top_k = 2});      // r.expert[t*k+j], r.gate[t*k+j]
///   ... dispatch, experts, combine (dispatcher.hpp) give d_gate ...
///   zerotk::moe::route_backward(r, d_gate, d_logits);             // d_logits = d(loss)/d(logits)
///
/// Forward (DeepSpeed's and Megatron's default order): p = softmax(logits) per token over the
/// experts; the k experts with the largest p + bias (ties: the lower expert id) in that order;
/// gate_j = p[e_j], divided by sum_j p[e_j] when `renormalize` (DeepSpeed's top-2). The bias
/// (ExpertBias) changes which experts are chosen, never the gates. Arithmetic: fp32 with the
/// softmax's max subtracted, exp and sum accumulated in double and rounded once per element, so
/// the result does not depend on the thread or the rank that computes a token.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "zerotk/core/error.hpp"

namespace zerotk::moe {

struct RouterOptions {
  int top_k = 1;
  /// Divide the k gates by their sum (DeepSpeed's top-2 gating); off: the gates are the
  /// probabilities themselves (Megatron's default).
  bool renormalize = false;
};

/// One rank's routing of `tokens` tokens, `top_k` slots each: slot j of token t is at t * top_k + j,
/// the best expert first.
struct Routing {
  int tokens = 0, experts = 0, top_k = 1;
  bool renormalize = false;
  std::vector<int> expert;   // [T * k]
  std::vector<float> gate;   // [T * k]
  std::vector<float> probs;  // [T * E]: the softmax, kept for the backward and the balance loss
};

namespace detail {

inline void check_shape(std::size_t have, std::size_t want, const char* what, const char* where) {
  if (have != want) {
    throw usage_error(std::string(what) + " has the wrong length", where,
                      std::to_string(have) + " (expected " + std::to_string(want) + ")");
  }
}

}  // namespace detail

/// Routes `tokens` tokens over `experts` experts. `bias` (empty, or one per expert) only changes
/// the choice (ExpertBias).
inline Routing route(std::span<const float> logits, int tokens, int experts, RouterOptions opts,
                     std::span<const float> bias = {}) {
  constexpr const char* where = "zerotk::moe::route";
  if (tokens < 0 || experts < 1) {
    throw usage_error("tokens must be >= 0 and experts >= 1", where,
                      std::to_string(tokens) + " tokens, " + std::to_string(experts) + " experts");
  }
  if (opts.top_k < 1 || opts.top_k > experts) {
    throw usage_error("top_k must be in [1, experts]", where,
                      "top_k " + std::to_string(opts.top_k) + ", " + std::to_string(experts) + " experts");
  }
  const auto T = static_cast<std::size_t>(tokens), E = static_cast<std::size_t>(experts);
  const auto k = static_cast<std::size_t>(opts.top_k);
  detail::check_shape(logits.size(), T * E, "logits", where);
  if (!bias.empty()) detail::check_shape(bias.size(), E, "bias", where);
  Routing r;
  r.tokens = tokens, r.experts = experts, r.top_k = opts.top_k, r.renormalize = opts.renormalize;
  r.expert.resize(T * k), r.gate.resize(T * k), r.probs.resize(T * E);
  std::vector<int> order(E);
  for (std::size_t t = 0; t < T; ++t) {
    const float* l = logits.data() + t * E;
    float* p = r.probs.data() + t * E;
    const float top = *std::max_element(l, l + E);
    double sum = 0;
    for (std::size_t e = 0; e < E; ++e) sum += std::exp(static_cast<double>(l[e] - top));
    for (std::size_t e = 0; e < E; ++e) p[e] = static_cast<float>(std::exp(static_cast<double>(l[e] - top)) / sum);
    for (std::size_t e = 0; e < E; ++e) order[e] = static_cast<int>(e);
    const auto score = [&](int e) { return p[e] + (bias.empty() ? 0.f : bias[static_cast<std::size_t>(e)]); };
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(), [&](int a, int b) {
      const float sa = score(a), sb = score(b);
      return sa > sb || (sa == sb && a < b);
    });
    double chosen = 0;
    for (std::size_t j = 0; j < k; ++j) chosen += p[order[j]];
    for (std::size_t j = 0; j < k; ++j) {
      r.expert[t * k + j] = order[j];
      r.gate[t * k + j] = opts.renormalize ? static_cast<float>(p[order[j]] / chosen) : p[order[j]];
    }
  }
  return r;
}

/// d_logits = d(loss)/d(logits) given d_gate = d(loss)/d(gate) (zero for dropped slots, as the
/// dispatcher writes them). Overwrites d_logits ([T * E]).
inline void route_backward(const Routing& r, std::span<const float> d_gate, std::span<float> d_logits) {
  constexpr const char* where = "zerotk::moe::route_backward";
  const auto T = static_cast<std::size_t>(r.tokens), E = static_cast<std::size_t>(r.experts);
  const auto k = static_cast<std::size_t>(r.top_k);
  detail::check_shape(d_gate.size(), T * k, "d_gate", where);
  detail::check_shape(d_logits.size(), T * E, "d_logits", where);
  std::vector<double> dp(E);
  for (std::size_t t = 0; t < T; ++t) {
    const float* p = r.probs.data() + t * E;
    const float* g = r.gate.data() + t * k;
    const float* dg = d_gate.data() + t * k;
    std::fill(dp.begin(), dp.end(), 0.0);
    if (r.renormalize) {  // g_j = p_{e_j} / S: dp_{e_m} = (dg_m - sum_j dg_j g_j) / S
      double s = 0, dot = 0;
      for (std::size_t j = 0; j < k; ++j) s += p[r.expert[t * k + j]], dot += static_cast<double>(dg[j]) * g[j];
      for (std::size_t j = 0; j < k; ++j) dp[static_cast<std::size_t>(r.expert[t * k + j])] += (dg[j] - dot) / s;
    } else {
      for (std::size_t j = 0; j < k; ++j) dp[static_cast<std::size_t>(r.expert[t * k + j])] += dg[j];
    }
    double inner = 0;  // softmax: dl_i = p_i (dp_i - sum_m p_m dp_m)
    for (std::size_t e = 0; e < E; ++e) inner += p[e] * dp[e];
    for (std::size_t e = 0; e < E; ++e) d_logits[t * E + e] = static_cast<float>(p[e] * (dp[e] - inner));
  }
}

}  // namespace zerotk::moe
