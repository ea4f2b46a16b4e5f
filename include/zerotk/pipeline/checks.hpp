#pragma once
/// \file zerotk/pipeline/checks.hpp
/// The static checks of a schedule, before any timing: each one a usage_error naming the rank and
/// the action (pipeline/schedule.hpp's `action_site`).
///
///   check_generator   a schedule that names a generator (gpipe, 1f1b, interleaved, zbh1) has
///                     (stages, micro-batches, chunks) that generator can run (config_error in words)
///   check_dataflow    every (chunk, micro-batch) gets one forward and one backward (B, or BI then
///                     BW); a compute comes after the receive of its input; a send after the compute
///                     that produced its tensor; the engine-facing actions, where present, in place
///                     (a reduce after the micro-batch's last gradient compute, no compute of a
///                     chunk outside its gather/release, optimizer_step last)
///   check_matching    every send has exactly one receive on the peer and the other way round, and
///                     the messages of one tag between two ranks meet in posting order (the
///                     threads and MPI back ends match that way; the executor's tags come from
///                     `message_tag`)

#include <cstddef>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "zerotk/core/error.hpp"
#include "zerotk/pipeline/generators.hpp"
#include "zerotk/pipeline/schedule.hpp"

namespace zerotk::pipeline {

inline void check_generator(const Schedule& s) {
  for (ScheduleKind k : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved, ScheduleKind::zb_h1}) {
    if (s.generator == to_string(k)) check_runnable(ScheduleSpec{k, s.chunks}, s.stages, s.micro_batches);
  }
}

namespace detail {

[[noreturn]] inline void schedule_error(const Schedule& s, int rank, std::size_t index, const std::string& why) {
  throw usage_error(why, "pipeline schedule " + s.generator + ": " + action_site(s, rank, index));
}

// What has happened to one (chunk, micro-batch) on a rank while walking its list.
struct MicroState {
  bool received_input = false, forward = false, received_grad = false;
  bool backward = false, input_grad = false, weight_grad = false, reduced = false;
};

inline void check_compute(const Schedule& s, int r, std::size_t i, const Action& a, MicroState& m) {
  const int k = s.virtual_stage(r, a.chunk);
  const bool first = k == 0, last = k == s.virtual_stages() - 1;
  switch (a.op) {
    case Op::forward:
      if (m.forward) schedule_error(s, r, i, "a second forward of this micro-batch");
      if (!first && !m.received_input) schedule_error(s, r, i, "runs before its input is received (recv-act)");
      m.forward = true;
      break;
    case Op::backward:
    case Op::backward_input:
      if (m.backward || m.input_grad) schedule_error(s, r, i, "a second backward of this micro-batch");
      if (!m.forward) schedule_error(s, r, i, "runs before the micro-batch's forward");
      if (!last && !m.received_grad) schedule_error(s, r, i, "runs before its output's gradient is received (recv-grad)");
      (a.op == Op::backward ? m.backward : m.input_grad) = true;
      break;
    case Op::backward_weight:
      if (!m.input_grad) schedule_error(s, r, i, "runs before the micro-batch's input gradient (BI)");
      if (m.weight_grad) schedule_error(s, r, i, "a second weight gradient of this micro-batch");
      m.weight_grad = true;
      break;
    default: break;
  }
}

inline void check_other(const Schedule& s, int r, std::size_t i, const Action& a, MicroState& m) {
  switch (a.op) {
    case Op::recv_activation:
      if (m.received_input) schedule_error(s, r, i, "a second receive of this micro-batch's input");
      m.received_input = true;
      break;
    case Op::recv_gradient:
      if (!m.forward) schedule_error(s, r, i, "receives the output's gradient before the forward produced the output");
      if (m.received_grad) schedule_error(s, r, i, "a second receive of this micro-batch's output gradient");
      m.received_grad = true;
      break;
    case Op::send_activation:
      if (!m.forward) schedule_error(s, r, i, "sends an activation its forward has not produced yet");
      break;
    case Op::send_gradient:
      if (!m.backward && !m.input_grad) schedule_error(s, r, i, "sends an input gradient its backward has not produced yet");
      break;
    case Op::reduce:
      if (m.reduced) schedule_error(s, r, i, "a second reduce of this micro-batch");
      if (!m.backward && !m.weight_grad) schedule_error(s, r, i, "reduces before the micro-batch's gradients are complete");
      m.reduced = true;
      break;
    default: break;
  }
}

}  // namespace detail

inline void check_dataflow(const Schedule& s) {
  const auto v = static_cast<std::size_t>(s.chunks), m = static_cast<std::size_t>(s.micro_batches);
  for (int r = 0; r < s.stages; ++r) {
    const auto& list = s.ranks[static_cast<std::size_t>(r)];
    std::vector<detail::MicroState> state(v * m);
    std::vector<int> gathered(v, -1);  // -1: no gather seen (the chunk runs without the engine-facing actions)
    bool engine_actions = false, stepped = false;
    for (std::size_t i = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      if (stepped) detail::schedule_error(s, r, i, "comes after optimizer_step, which must be the rank's last action");
      const auto c = static_cast<std::size_t>(a.chunk);
      if (a.op == Op::optimizer_step) {
        stepped = engine_actions = true;
        continue;
      }
      if (a.op == Op::gather || a.op == Op::release) {
        engine_actions = true;
        const bool open = gathered[c] == 1;
        if ((a.op == Op::gather) == open) detail::schedule_error(s, r, i, open ? "gathers a chunk already gathered" : "releases a chunk not gathered");
        gathered[c] = a.op == Op::gather ? 1 : 0;
        continue;
      }
      detail::MicroState& ms = state[c * m + static_cast<std::size_t>(a.micro)];
      if (is_compute(a.op)) {
        if (gathered[c] == 0) detail::schedule_error(s, r, i, "runs on a chunk after its release");
        detail::check_compute(s, r, i, a, ms);
      } else {
        if (a.op == Op::reduce) engine_actions = true;
        detail::check_other(s, r, i, a, ms);
      }
    }
    const std::size_t end = list.size();
    for (std::size_t c = 0; c < v; ++c) {
      for (std::size_t mb = 0; mb < m; ++mb) {
        const detail::MicroState& ms = state[c * m + mb];
        const std::string which = "chunk " + std::to_string(c) + ", micro-batch " + std::to_string(mb);
        if (!ms.forward) detail::schedule_error(s, r, end, which + " never runs its forward");
        if (!ms.backward && !(ms.input_grad && ms.weight_grad)) {
          detail::schedule_error(s, r, end, which + " never completes its backward (B, or BI and BW)");
        }
        if (engine_actions && !ms.reduced) detail::schedule_error(s, r, end, which + " is never reduced");
      }
      if (gathered[c] == 1) detail::schedule_error(s, r, end, "chunk " + std::to_string(c) + " is never released");
    }
    if (engine_actions && !stepped) detail::schedule_error(s, r, end, "the engine-facing actions need optimizer_step last");
  }
}

inline void check_matching(const Schedule& s) {
  // key (sender, receiver, tag) -> the micro-batches in posting order, and where each was posted
  using Key = std::tuple<int, int, int>;
  struct Posts {
    std::vector<int> micro;
    std::vector<std::size_t> index;
  };
  std::map<Key, Posts> sends, recvs;
  for (int r = 0; r < s.stages; ++r) {
    const auto& list = s.ranks[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      if (!is_transfer(a.op)) continue;
      const int tag = message_tag(s, r, a);
      Posts& p = is_send(a.op) ? sends[{r, a.peer, tag}] : recvs[{a.peer, r, tag}];
      p.micro.push_back(a.micro);
      p.index.push_back(i);
    }
  }
  for (const auto& [key, sent] : sends) {
    const auto [from, to, tag] = key;
    const auto it = recvs.find(key);
    const std::size_t got = it == recvs.end() ? 0 : it->second.micro.size();
    for (std::size_t k = 0; k < sent.micro.size(); ++k) {
      if (k >= got) {
        detail::schedule_error(s, from, sent.index[k], "has no matching receive on rank " + std::to_string(to));
      }
      if (it->second.micro[k] != sent.micro[k]) {
        detail::schedule_error(s, to, it->second.index[k],
                               "would receive rank " + std::to_string(from) + "'s " +
                                   action_at(s, from, sent.index[k]) +
                                   ": messages of one tag between two ranks meet in posting order, so both must "
                                   "post them in the same micro-batch order");
      }
    }
    if (got > sent.micro.size()) {
      detail::schedule_error(s, to, it->second.index[sent.micro.size()], "has no matching send on rank " + std::to_string(from));
    }
  }
  for (const auto& [key, got] : recvs) {
    if (!sends.count(key)) {
      detail::schedule_error(s, std::get<1>(key), got.index[0], "has no matching send on rank " + std::to_string(std::get<0>(key)));
    }
  }
}

}  // namespace zerotk::pipeline
