#pragma once
/// \file zerotk/pipeline/simulator.hpp
/// Runs a schedule on per-action costs, in exact integer time, and reports what it costs.
///
///   auto s = make_schedule(ScheduleSpec::parse("1f1b"), 4, 8);
///   SimulationReport r = simulate(s);                  // unit costs: F = BI = BW = 1, B = 2
///   r.bubble() == Fraction(3, 11);                     // (p-1)/(m+p-1), exactly
///
/// The model, which the executor's virtual clock (pipeline/executor.hpp) follows to the tick: every
/// rank starts at 0 and runs its actions in order; a compute or engine-facing action takes its cost;
/// a send takes no time on the sender (the transfer is non-blocking) and its tensor arrives
/// `transfer` ticks later; a receive waits until the tensor has arrived. Since sends never wait
/// and every receive is matched to one send (pipeline/checks.hpp), the run is a dataflow whose
/// times do not depend on the order ranks are stepped in: if it ends, every send met its receive;
/// if it cannot go on, that is a deadlock, reported with the chain of ranks waiting on each other.
///
/// Reported (`Figures`, the executor reports the same): the makespan, each rank's busy time (the
/// sum of its actions' costs), the bubble = idle / (p x makespan) as an exact fraction, each rank's
/// peak of live activations (micro-batches whose forward ran and whose backward (B, or BW) has
/// not, over the rank's chunks), and each rank's messages (activation and gradient sends).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <numeric>
#include <string>
#include <tuple>
#include <map>
#include <vector>

#include "zerotk/core/error.hpp"
#include "zerotk/pipeline/checks.hpp"
#include "zerotk/pipeline/schedule.hpp"

namespace zerotk::pipeline {

/// num / den in lowest terms, den > 0.
struct Fraction {
  std::int64_t num = 0, den = 1;

  constexpr Fraction() = default;
  constexpr Fraction(std::int64_t n, std::int64_t d) : num(n), den(d) {
    if (den < 0) num = -num, den = -den;
    const std::int64_t g = std::gcd(num, den);
    if (g > 1) num /= g, den /= g;
  }
  constexpr bool operator==(const Fraction&) const = default;
  constexpr Fraction operator*(const Fraction& o) const { return Fraction(num * o.num, den * o.den); }
  double value() const noexcept { return static_cast<double>(num) / static_cast<double>(den); }
  std::string to_string() const { return std::to_string(num) + "/" + std::to_string(den); }
};

/// Ticks per action. Unit costs by default: forward = backward_input = backward_weight = 1, a full
/// backward their sum (2), transfers and the engine-facing actions free.
struct CostModel {
  std::int64_t forward = 1, backward_input = 1, backward_weight = 1;
  std::int64_t backward = -1;  ///< full backward; -1: backward_input + backward_weight
  std::int64_t transfer = 0;   ///< from a send's post to its tensor's arrival
  std::int64_t gather = 0, release = 0, reduce = 0, optimizer_step = 0;
  /// When set, the cost of every compute and engine-facing action (rank, action) instead.
  std::function<std::int64_t(int, const Action&)> custom;

  std::int64_t cost(int rank, const Action& a) const {
    if (is_transfer(a.op)) return 0;
    if (custom) return custom(rank, a);
    switch (a.op) {
      case Op::forward: return forward;
      case Op::backward: return backward >= 0 ? backward : backward_input + backward_weight;
      case Op::backward_input: return backward_input;
      case Op::backward_weight: return backward_weight;
      case Op::gather: return gather;
      case Op::release: return release;
      case Op::reduce: return reduce;
      case Op::optimizer_step: return optimizer_step;
      default: return 0;
    }
  }
};

/// One step's figures: what the simulator predicts and the executor measures.
struct Figures {
  std::int64_t makespan = 0;
  std::vector<std::int64_t> busy;      ///< [p] sum of the rank's action costs
  std::vector<int> peak_live;          ///< [p] live micro-batch activations at most
  std::vector<std::int64_t> messages;  ///< [p] activation and gradient sends

  std::int64_t total_messages() const { return std::accumulate(messages.begin(), messages.end(), std::int64_t{0}); }
  std::int64_t total_idle() const {
    return makespan * static_cast<std::int64_t>(busy.size()) - std::accumulate(busy.begin(), busy.end(), std::int64_t{0});
  }
  /// idle / (p x makespan): exact.
  Fraction bubble() const {
    const std::int64_t all = makespan * static_cast<std::int64_t>(busy.size());
    return all == 0 ? Fraction() : Fraction(total_idle(), all);
  }
  bool operator==(const Figures&) const = default;
};

struct SimulationReport : Figures {
  std::vector<std::vector<std::int64_t>> start;  ///< [p][action] when each action began
  std::vector<std::int64_t> finish;              ///< [p] when the rank's last action ended
  /// Whether, between every two ranks, the messages meet in posting order whatever their tags
  /// (what a transport that ignores tags, NCCL, needs).
  bool pair_ordered = true;
};

namespace detail {

// The chain "rank 1 waits at ... for rank 0, which waits at ..." from a blocked rank, until a rank
// repeats (a cycle) or one is not waiting (it finished without sending).
inline std::string wait_chain(const Schedule& s, const std::vector<std::size_t>& pc, int from) {
  std::string out;
  std::vector<char> seen(static_cast<std::size_t>(s.stages), 0);
  int r = from;
  while (true) {
    const auto& list = s.ranks[static_cast<std::size_t>(r)];
    const std::size_t i = pc[static_cast<std::size_t>(r)];
    if (!out.empty()) out += "; ";
    if (i >= list.size()) {
      out += "rank " + std::to_string(r) + " has finished its actions without sending it";
      break;
    }
    out += "rank " + std::to_string(r) + " waits at " + action_at(s, r, i);
    if (seen[static_cast<std::size_t>(r)]) {
      out += " (a cycle)";
      break;
    }
    seen[static_cast<std::size_t>(r)] = 1;
    r = list[i].peer;
  }
  return out;
}

inline bool pairs_in_order(const Schedule& s) {
  // (sender, receiver) -> the messages' (tag, micro) in posting order, on each side
  std::map<std::pair<int, int>, std::vector<std::pair<int, int>>> sent, got;
  for (int r = 0; r < s.stages; ++r) {
    for (const Action& a : s.ranks[static_cast<std::size_t>(r)]) {
      if (!is_transfer(a.op)) continue;
      auto& seq = is_send(a.op) ? sent[{r, a.peer}] : got[{a.peer, r}];
      seq.emplace_back(message_tag(s, r, a), a.micro);
    }
  }
  return sent == got;
}

}  // namespace detail

/// Checks the schedule (pipeline/checks.hpp), runs it on `costs` and reports its figures; a
/// usage_error naming the ranks and actions on a deadlock.
inline SimulationReport simulate(const Schedule& s, const CostModel& costs = {}) {
  check_well_formed(s);
  check_generator(s);
  check_dataflow(s);
  check_matching(s);
  const auto p = static_cast<std::size_t>(s.stages);
  SimulationReport rep;
  rep.busy.assign(p, 0);
  rep.peak_live.assign(p, 0);
  rep.messages.assign(p, 0);
  rep.finish.assign(p, 0);
  rep.start.resize(p);
  for (std::size_t r = 0; r < p; ++r) rep.start[r].assign(s.ranks[r].size(), 0);

  // Arrival time of each posted message, by (sender, receiver, tag), oldest first.
  std::map<std::tuple<int, int, int>, std::vector<std::int64_t>> arrivals;
  std::map<std::tuple<int, int, int>, std::size_t> taken;
  std::vector<std::size_t> pc(p, 0);
  std::vector<int> live(p, 0);
  std::vector<std::int64_t> t(p, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < s.stages; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      const auto& list = s.ranks[ur];
      for (; pc[ur] < list.size(); ++pc[ur]) {
        const Action& a = list[pc[ur]];
        if (is_recv(a.op)) {
          const std::tuple<int, int, int> key{a.peer, r, message_tag(s, r, a)};
          const auto& posted = arrivals[key];
          std::size_t& k = taken[key];
          if (k >= posted.size()) break;  // blocked: the tensor has not been sent yet
          rep.start[ur][pc[ur]] = t[ur];
          t[ur] = std::max(t[ur], posted[k++]);
        } else if (is_send(a.op)) {
          rep.start[ur][pc[ur]] = t[ur];
          arrivals[{r, a.peer, message_tag(s, r, a)}].push_back(t[ur] + costs.transfer);
          ++rep.messages[ur];
        } else {
          rep.start[ur][pc[ur]] = t[ur];
          const std::int64_t c = costs.cost(r, a);
          t[ur] += c;
          rep.busy[ur] += c;
          if (a.op == Op::forward) rep.peak_live[ur] = std::max(rep.peak_live[ur], ++live[ur]);
          if (a.op == Op::backward || a.op == Op::backward_weight) --live[ur];
        }
        progress = true;
      }
    }
  }
  for (int r = 0; r < s.stages; ++r) {
    if (pc[static_cast<std::size_t>(r)] < s.ranks[static_cast<std::size_t>(r)].size()) {
      throw usage_error("the schedule deadlocks: " + detail::wait_chain(s, pc, r),
                        "pipeline schedule " + s.generator + ": " + action_site(s, r, pc[static_cast<std::size_t>(r)]));
    }
  }
  rep.finish = t;
  rep.makespan = p == 0 ? 0 : *std::max_element(t.begin(), t.end());
  rep.pair_ordered = detail::pairs_in_order(s);
  return rep;
}

}  // namespace zerotk::pipeline
