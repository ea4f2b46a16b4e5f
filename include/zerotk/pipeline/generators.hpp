#pragma once
/// \file zerotk/pipeline/generators.hpp
/// The schedule generators: GPipe, 1F1B, interleaved 1F1B and ZB-H1, each as a compute order per
/// rank, then one lowering pass that adds the transfers and the engine-facing actions.
///
///   auto s = zerotk::pipeline::make_schedule(ScheduleSpec::parse("interleaved:2"), /*p*/ 4, /*m*/ 8);
///
/// Compute orders (p ranks, m micro-batches; rank s of a one-chunk pipeline is stage s):
///   gpipe        all forwards in micro-batch order, then all backwards in micro-batch order
///                (torch.distributed.pipelining's ScheduleGPipe order); m activations live per stage
///   1f1b         min(p - s - 1, m) warm-up forwards, then one forward and one backward in turn,
///                then the remaining backwards (PipeDream-flush, Megatron-LM's default)
///   interleaved  v chunks per rank (Megatron-LM's interleaved 1F1B): forwards walk the chunks in
///                groups of p micro-batches, chunk 0 first; backwards walk them from the last chunk;
///                (p - r - 1) * 2 + (v - 1) * p warm-up forwards on rank r (capped at m * v); m must
///                be a multiple of p, as Megatron-LM and torch assert
///   zbh1         zero bubble H1 (Qi et al., 2023): 1F1B's warm-up, the backward split into input
///                gradient BI (on the critical path) and weight gradient BW, rank s holding its
///                first s weight gradients back to fill the cool-down bubble; same peak
///                activation memory as 1F1B (p micro-batches on the busiest stage)
/// Every schedule runs each virtual stage's backwards in micro-batch order, so every parameter's
/// gradient accumulates in the same order as a single-rank run over the same micro-batches.
///
/// Lowering (`lower`): a recv before every compute that consumes a neighbour's tensor, a send right
/// after every compute that produces one, and (optionally) gather before a chunk's first compute,
/// release after its last, reduce after the compute that completes a micro-batch's gradients on a
/// chunk (BW, or B), and optimizer_step at the end.

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstddef>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zerotk/core/error.hpp"
#include "zerotk/pipeline/schedule.hpp"

namespace zerotk::pipeline {

enum class ScheduleKind : std::uint8_t { gpipe, one_f_one_b, interleaved, zb_h1 };

constexpr std::string_view to_string(ScheduleKind k) noexcept {
  switch (k) {
    case ScheduleKind::gpipe: return "gpipe";
    case ScheduleKind::one_f_one_b: return "1f1b";
    case ScheduleKind::interleaved: return "interleaved";
    case ScheduleKind::zb_h1: return "zbh1";
  }
  return "unknown";
}

/// A generator and its chunk count: "gpipe", "1f1b", "interleaved:V", "zbh1".
struct ScheduleSpec {
  ScheduleKind kind = ScheduleKind::one_f_one_b;
  int chunks = 1;

  std::string name() const {
    std::string s(to_string(kind));
    if (kind == ScheduleKind::interleaved) s += ":" + std::to_string(chunks);
    return s;
  }

  /// Parses the names above; a config_error listing them otherwise.
  static ScheduleSpec parse(std::string_view text) {
    const auto fail = [&](const std::string& why) -> ScheduleSpec {
      throw config_error(why + " (one of gpipe, 1f1b, interleaved:V with V >= 2 chunks per rank, zbh1)",
                         "pipeline schedule", std::string(text));
    };
    for (ScheduleKind k : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::zb_h1}) {
      if (text == to_string(k)) return {k, 1};
    }
    constexpr std::string_view prefix = "interleaved:";
    if (!text.starts_with(prefix)) return fail("unknown schedule");
    int v = 0;
    const std::string_view digits = text.substr(prefix.size());
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
    if (ec != std::errc() || end != digits.data() + digits.size() || digits.empty()) {
      return fail("interleaved needs a chunk count after the colon");
    }
    return {ScheduleKind::interleaved, v};
  }
};

/// Rejects, in words, the (stages, micro-batches, chunks) a generator cannot run.
inline void check_runnable(const ScheduleSpec& spec, int p, int m) {
  const std::string where = "pipeline schedule " + spec.name();
  const std::string sizes = "p " + std::to_string(p) + ", m " + std::to_string(m) + ", v " + std::to_string(spec.chunks);
  if (p < 1) throw config_error("needs at least 1 pipeline stage", where, sizes);
  if (m < 1) throw config_error("needs at least 1 micro-batch per step", where, sizes);
  if (spec.kind != ScheduleKind::interleaved) {
    if (spec.chunks != 1) {
      throw config_error("runs one model chunk per rank (interleaved:V runs V)", where, sizes);
    }
    return;
  }
  if (spec.chunks < 2) throw config_error("needs at least 2 model chunks per rank (1 chunk is 1f1b)", where, sizes);
  if (p < 2) throw config_error("needs at least 2 pipeline stages to interleave over", where, sizes);
  // p x v virtual stages, each at least one layer: a count past int's range is no model's (issue 57
  // item 6: it overflowed and failed later inside a generator).
  if (static_cast<long long>(p) * spec.chunks > std::numeric_limits<int>::max()) {
    throw config_error("has more virtual stages (p x v = " + std::to_string(static_cast<long long>(p) * spec.chunks) +
                           ") than any model has layers",
                       where, sizes);
  }
  if (m % p != 0) {
    throw config_error("needs the micro-batches per step to be a multiple of the pipeline stages (" + std::to_string(m) +
                           " is not a multiple of " + std::to_string(p) +
                           "; Megatron-LM and torch assert the same): use m = " +
                           std::to_string((m / p + 1) * p) + (m > p ? " or " + std::to_string(m / p * p) : std::string()),
                       where, sizes);
  }
}

/// Compute actions (F, B, BI, BW) per rank: the order only, no transfers.
using ComputeOrder = std::vector<std::vector<Action>>;

namespace detail {

inline Action compute(Op op, int chunk, int micro) { return Action{op, chunk, micro, -1}; }

inline ComputeOrder gpipe_order(int p, int m) {
  ComputeOrder out(static_cast<std::size_t>(p));
  for (auto& list : out) {
    for (int i = 0; i < m; ++i) list.push_back(compute(Op::forward, 0, i));
    for (int i = 0; i < m; ++i) list.push_back(compute(Op::backward, 0, i));
  }
  return out;
}

inline ComputeOrder one_f_one_b_order(int p, int m) {
  ComputeOrder out(static_cast<std::size_t>(p));
  for (int s = 0; s < p; ++s) {
    auto& list = out[static_cast<std::size_t>(s)];
    const int warmup = std::min(p - s - 1, m);
    for (int i = 0; i < warmup; ++i) list.push_back(compute(Op::forward, 0, i));
    for (int i = 0; i < m - warmup; ++i) {
      list.push_back(compute(Op::forward, 0, warmup + i));
      list.push_back(compute(Op::backward, 0, i));
    }
    for (int i = m - warmup; i < m; ++i) list.push_back(compute(Op::backward, 0, i));
  }
  return out;
}

// Megatron-LM's interleaved order on rank r: the k-th forward runs chunk (k / p) % v on micro-batch
// (k / (p v)) p + k % p; the k-th backward the same micro-batch on chunk v - 1 - (k / p) % v.
inline ComputeOrder interleaved_order(int p, int m, int v) {
  ComputeOrder out(static_cast<std::size_t>(p));
  const int total = m * v;
  const auto micro = [&](int k) { return (k / (p * v)) * p + k % p; };
  const auto fwd = [&](int k) { return compute(Op::forward, (k / p) % v, micro(k)); };
  const auto bwd = [&](int k) { return compute(Op::backward, v - 1 - (k / p) % v, micro(k)); };
  for (int r = 0; r < p; ++r) {
    auto& list = out[static_cast<std::size_t>(r)];
    const int warmup = std::min((p - r - 1) * 2 + (v - 1) * p, total);
    for (int k = 0; k < warmup; ++k) list.push_back(fwd(k));
    for (int k = 0; k < total - warmup; ++k) {
      list.push_back(fwd(warmup + k));
      list.push_back(bwd(k));
    }
    for (int k = total - warmup; k < total; ++k) list.push_back(bwd(k));
  }
  return out;
}

// ZB-H1: after its j-th input-gradient (j from 0), stage s runs the oldest pending weight gradient
// once j >= s; what is left runs at the end.
inline ComputeOrder zb_h1_order(int p, int m) {
  ComputeOrder out(static_cast<std::size_t>(p));
  for (int s = 0; s < p; ++s) {
    auto& list = out[static_cast<std::size_t>(s)];
    const int warmup = std::min(p - s - 1, m);
    int next_w = 0, j = 0;
    const auto input_grad = [&](int i) {
      list.push_back(compute(Op::backward_input, 0, i));
      if (j++ >= s) list.push_back(compute(Op::backward_weight, 0, next_w++));
    };
    for (int i = 0; i < warmup; ++i) list.push_back(compute(Op::forward, 0, i));
    for (int i = 0; i < m - warmup; ++i) {
      list.push_back(compute(Op::forward, 0, warmup + i));
      input_grad(i);
    }
    for (int i = m - warmup; i < m; ++i) input_grad(i);
    while (next_w < m) list.push_back(compute(Op::backward_weight, 0, next_w++));
  }
  return out;
}

}  // namespace detail

/// The compute order of a generator (after check_runnable).
inline ComputeOrder compute_order(const ScheduleSpec& spec, int p, int m) {
  check_runnable(spec, p, m);
  switch (spec.kind) {
    case ScheduleKind::gpipe: return detail::gpipe_order(p, m);
    case ScheduleKind::one_f_one_b: return detail::one_f_one_b_order(p, m);
    case ScheduleKind::interleaved: return detail::interleaved_order(p, m, spec.chunks);
    case ScheduleKind::zb_h1: return detail::zb_h1_order(p, m);
  }
  return {};
}

struct LowerOptions {
  /// Add gather / release / reduce / optimizer_step (the engine-facing actions).
  bool engine_actions = true;
};

/// Adds the transfers (and the engine-facing actions) to a compute order over p ranks, m
/// micro-batches and v chunks per rank.
inline Schedule lower(std::string generator, int p, int m, int v, const ComputeOrder& order, LowerOptions opt = {}) {
  Schedule s;
  s.generator = std::move(generator);
  s.stages = p;
  s.micro_batches = m;
  s.chunks = v;
  s.ranks.resize(static_cast<std::size_t>(p));
  const int last = s.virtual_stages() - 1;
  for (int r = 0; r < p && static_cast<std::size_t>(r) < order.size(); ++r) {
    const auto& comp = order[static_cast<std::size_t>(r)];
    auto& out = s.ranks[static_cast<std::size_t>(r)];
    // Per chunk: where its first and last computes sit; per (chunk, micro): whether it splits B.
    std::vector<std::size_t> first(static_cast<std::size_t>(v), comp.size()), final(static_cast<std::size_t>(v), 0);
    for (std::size_t i = 0; i < comp.size(); ++i) {
      const auto c = static_cast<std::size_t>(comp[i].chunk);
      first[c] = std::min(first[c], i);
      final[c] = i;
    }
    for (std::size_t i = 0; i < comp.size(); ++i) {
      const Action& a = comp[i];
      const int k = s.virtual_stage(r, a.chunk);
      if (opt.engine_actions && first[static_cast<std::size_t>(a.chunk)] == i) out.push_back({Op::gather, a.chunk, -1, -1});
      if (a.op == Op::forward && k > 0) out.push_back({Op::recv_activation, a.chunk, a.micro, s.rank_of(k - 1)});
      const bool grad_in = a.op == Op::backward || a.op == Op::backward_input;
      if (grad_in && k < last) out.push_back({Op::recv_gradient, a.chunk, a.micro, s.rank_of(k + 1)});
      out.push_back(a);
      if (a.op == Op::forward && k < last) out.push_back({Op::send_activation, a.chunk, a.micro, s.rank_of(k + 1)});
      if (grad_in && k > 0) out.push_back({Op::send_gradient, a.chunk, a.micro, s.rank_of(k - 1)});
      if (!opt.engine_actions) continue;
      if (a.op == Op::backward || a.op == Op::backward_weight) out.push_back({Op::reduce, a.chunk, a.micro, -1});
      if (final[static_cast<std::size_t>(a.chunk)] == i) out.push_back({Op::release, a.chunk, -1, -1});
    }
    if (opt.engine_actions) out.push_back({Op::optimizer_step, 0, -1, -1});
  }
  return s;
}

/// A generator's schedule, lowered: `check_runnable`, `compute_order`, `lower`.
inline Schedule make_schedule(const ScheduleSpec& spec, int p, int m, LowerOptions opt = {}) {
  return lower(std::string(to_string(spec.kind)), p, m, spec.chunks, compute_order(spec, p, m), opt);
}

}  // namespace zerotk::pipeline
