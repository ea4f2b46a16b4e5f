#pragma once
/// \file zerotk/moe/balance.hpp
/// Load balance of a router (docs/moe.md): the Switch Transformer's balance loss over one rank's
/// tokens or over a group's (the fractions from every rank's counts: Megatron's global-batch
/// balancing), its gradient, the per-expert load summed over a group, and the aux-loss-free expert
/// bias (DeepSeek-V3) that load drives.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/moe/router.hpp"

namespace zerotk::moe {

/// The Switch Transformer's balance loss over one rank's tokens: E * sum_i f_i * P_i, with f_i the
/// fraction of the T * k routed slots that chose expert i and P_i the mean probability of expert i
/// (SEMANTICS.md, section 16). The user scales it by a coefficient and adds it to the loss.
struct Balance {
  double loss = 0;
  std::vector<double> fraction;   // f_i
  std::vector<double> mean_prob;  // P_i
};

namespace detail {

// The loss from per-expert slot counts (`slots` in all) and this rank's probabilities.
inline Balance balance_of(const Routing& r, std::span<const double> counts, double slots) {
  const auto T = static_cast<std::size_t>(r.tokens), E = static_cast<std::size_t>(r.experts);
  Balance b;
  b.fraction.assign(E, 0.0), b.mean_prob.assign(E, 0.0);
  if (T == 0 || slots == 0) return b;
  for (std::size_t t = 0; t < T; ++t) {
    for (std::size_t e = 0; e < E; ++e) b.mean_prob[e] += r.probs[t * E + e];
  }
  for (std::size_t e = 0; e < E; ++e) {
    b.fraction[e] = counts[e] / slots;
    b.mean_prob[e] /= static_cast<double>(T);
    b.loss += b.fraction[e] * b.mean_prob[e];
  }
  b.loss *= static_cast<double>(E);
  return b;
}

// Per-expert slot counts of one rank's routing, then its slot total.
inline std::vector<double> slot_counts(const Routing& r) {
  std::vector<double> c(static_cast<std::size_t>(r.experts) + 1, 0.0);
  for (int e : r.expert) c[static_cast<std::size_t>(e)] += 1.0;
  c.back() = static_cast<double>(r.expert.size());
  return c;
}

}  // namespace detail

inline Balance switch_balance(const Routing& r) {
  const std::vector<double> c = detail::slot_counts(r);
  return detail::balance_of(r, std::span(c).first(c.size() - 1), c.back());
}

/// The same with f_i over every rank of `group` (its slot counts summed: Megatron's global-batch
/// balancing, which a small micro-batch per rank needs), P_i still this rank's. Collective over
/// `group` (one fp64 all-reduce of E + 1 values); host-memory communicators.
template <comm::Communicator C>
Balance switch_balance(const Routing& r, C& group) {
  std::vector<double> c = detail::slot_counts(r);
  group.all_reduce(c.data(), c.data(), c.size(), DType::fp64, comm::ReduceOp::sum).wait();
  return detail::balance_of(r, std::span(c).first(c.size() - 1), c.back());
}

/// Each expert's load summed over `group` (e.g. Dispatcher::kept_per_expert() of every rank of the
/// expert group and the data group: what ExpertBias::update takes). Collective; host memory.
template <comm::Communicator C>
std::vector<std::uint64_t> global_load(std::span<const std::size_t> local, C& group) {
  std::vector<double> sum(local.begin(), local.end());  // exact below 2^53 slots
  group.all_reduce(sum.data(), sum.data(), sum.size(), DType::fp64, comm::ReduceOp::sum).wait();
  std::vector<std::uint64_t> load(sum.size());
  for (std::size_t e = 0; e < sum.size(); ++e) load[e] = static_cast<std::uint64_t>(sum[e]);
  return load;
}

/// Adds coef * d(switch loss)/d(logits) to d_logits (f_i is a count: no gradient flows through it).
inline void switch_balance_backward(const Routing& r, const Balance& b, double coef, std::span<float> d_logits) {
  const auto T = static_cast<std::size_t>(r.tokens), E = static_cast<std::size_t>(r.experts);
  detail::check_shape(d_logits.size(), T * E, "d_logits", "zerotk::moe::switch_balance_backward");
  if (T == 0) return;
  const double scale = coef * static_cast<double>(E) / static_cast<double>(T);  // dLoss/dp_{t,i} = scale * f_i
  for (std::size_t t = 0; t < T; ++t) {
    const float* p = r.probs.data() + t * E;
    double inner = 0;
    for (std::size_t e = 0; e < E; ++e) inner += p[e] * b.fraction[e];
    for (std::size_t e = 0; e < E; ++e) {
      d_logits[t * E + e] += static_cast<float>(scale * p[e] * (b.fraction[e] - inner));
    }
  }
}

/// Aux-loss-free balancing (DeepSeek-V3): a per-expert bias added to the scores for selection only,
/// updated once per optimizer step from the global load: bias_i += rate * sign(mean load - load_i).
/// The load must be the same on every rank (global_load), so every rank keeps the same bias.
struct ExpertBias {
  std::vector<float> bias;
  float rate = 1e-3f;

  ExpertBias(int experts, float update_rate) : bias(static_cast<std::size_t>(experts), 0.f), rate(update_rate) {}

  void update(std::span<const std::uint64_t> load) {
    detail::check_shape(load.size(), bias.size(), "load", "zerotk::moe::ExpertBias::update");
    double mean = 0;
    for (std::uint64_t l : load) mean += static_cast<double>(l);
    mean /= static_cast<double>(load.size());
    for (std::size_t e = 0; e < bias.size(); ++e) {
      const double l = static_cast<double>(load[e]);
      bias[e] += l < mean ? rate : (l > mean ? -rate : 0.f);
    }
  }
};

}  // namespace zerotk::moe
