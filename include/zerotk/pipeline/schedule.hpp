#pragma once
/// \file zerotk/pipeline/schedule.hpp
/// A pipeline schedule as data: for every pipeline rank, the list of actions it runs in one
/// optimizer step, in order. Generators (pipeline/generators.hpp) write them, the simulator
/// (pipeline/simulator.hpp) proves and measures them, the executor (pipeline/executor.hpp) runs
/// them, and pipeline/text.hpp gives them a text form for golden files.
///
/// Placement: p pipeline ranks, v model chunks per rank, S = p * v virtual stages. Rank r holds
/// chunk c as virtual stage c * p + r (Megatron-LM's interleaved placement; v = 1: stage = rank).
/// Activations flow from virtual stage k to k + 1, gradients from k + 1 to k.
///
/// Actions (`Op`), with the chunk (local index on the rank) and micro-batch they act on:
///   forward            F   run the chunk's layers on the micro-batch (and, on the last virtual
///                          stage, the loss)
///   backward           B   the full backward (input and weight gradients)
///   backward_input     BI  the input gradient only (zero-bubble schedules split B = BI + BW)
///   backward_weight    BW  the weight gradient only
///   send/recv_activation   the chunk's output to / its input from the neighbouring virtual stage
///   send/recv_gradient     the gradient of the chunk's input to / of its output from it
///   gather, release    engine-facing: the chunk's parameters are needed from here / no longer
///                      this step (ZeRO stage 3 keeping them gathered through the step)
///   reduce             engine-facing: the chunk's gradients of the micro-batch are complete (one
///                      engine micro-step: Engine::step)
///   optimizer_step     engine-facing: the step's last action, after every reduce

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zerotk/core/error.hpp"

namespace zerotk::pipeline {

enum class Op : std::uint8_t {
  forward,
  backward,
  backward_input,
  backward_weight,
  send_activation,
  recv_activation,
  send_gradient,
  recv_gradient,
  gather,
  release,
  reduce,
  optimizer_step,
};
inline constexpr int kOpCount = 12;

/// The action's word in the text form ("F", "BI", "send-act", ...).
constexpr std::string_view to_string(Op op) noexcept {
  constexpr std::string_view names[kOpCount] = {"F",        "B",         "BI",        "BW",
                                                "send-act", "recv-act",  "send-grad", "recv-grad",
                                                "gather",   "release",   "reduce",    "step"};
  return names[static_cast<std::size_t>(op)];
}

constexpr bool is_compute(Op op) noexcept { return op <= Op::backward_weight; }
constexpr bool is_transfer(Op op) noexcept { return op >= Op::send_activation && op <= Op::recv_gradient; }
constexpr bool is_send(Op op) noexcept { return op == Op::send_activation || op == Op::send_gradient; }
constexpr bool is_recv(Op op) noexcept { return op == Op::recv_activation || op == Op::recv_gradient; }
/// Actions that name a micro-batch (compute, transfers, reduce).
constexpr bool has_micro(Op op) noexcept { return op <= Op::recv_gradient || op == Op::reduce; }
/// Actions that name a chunk (all but optimizer_step).
constexpr bool has_chunk(Op op) noexcept { return op != Op::optimizer_step; }

/// One action of one rank. `peer` is the pipeline rank on the other side of a transfer (-1
/// otherwise); `micro` is -1 where the action names no micro-batch, `chunk` 0 for optimizer_step.
struct Action {
  Op op = Op::forward;
  int chunk = 0;
  int micro = -1;
  int peer = -1;

  bool operator==(const Action&) const = default;
};

/// "F m3 c1", "send-act m0 c0 to 1", "step": the action as the text form writes it (the chunk is
/// written when the schedule has more than one).
inline std::string describe(const Action& a, bool with_chunk = true) {
  std::string s(to_string(a.op));
  if (has_micro(a.op)) s += " m" + std::to_string(a.micro);
  if (with_chunk && has_chunk(a.op)) s += " c" + std::to_string(a.chunk);
  if (is_send(a.op)) s += " to " + std::to_string(a.peer);
  if (is_recv(a.op)) s += " from " + std::to_string(a.peer);
  return s;
}

/// Every rank's actions for one optimizer step.
struct Schedule {
  std::string generator;  ///< "gpipe", "1f1b", "interleaved", "zbh1", or any name of a hand-written one
  int stages = 1;         ///< p: pipeline ranks
  int micro_batches = 1;  ///< m
  int chunks = 1;         ///< v: model chunks per rank
  std::vector<std::vector<Action>> ranks;  ///< [p][actions]

  int virtual_stages() const noexcept { return stages * chunks; }
  /// The virtual stage rank `rank` runs as its chunk `chunk`.
  int virtual_stage(int rank, int chunk) const noexcept { return chunk * stages + rank; }
  int rank_of(int virtual_stage) const noexcept { return virtual_stage % stages; }
  int chunk_of(int virtual_stage) const noexcept { return virtual_stage / stages; }
  bool first_stage(int rank, int chunk) const noexcept { return virtual_stage(rank, chunk) == 0; }
  bool last_stage(int rank, int chunk) const noexcept { return virtual_stage(rank, chunk) == virtual_stages() - 1; }

  bool operator==(const Schedule&) const = default;
};

/// The virtual stage that receives a transfer's tensor: activations go from k to k + 1, gradients
/// from k to k - 1 (k: the acting rank's virtual stage for `a.chunk`).
inline int receiving_stage(const Schedule& s, int rank, const Action& a) noexcept {
  const int k = s.virtual_stage(rank, a.chunk);
  switch (a.op) {
    case Op::send_activation: return k + 1;
    case Op::send_gradient: return k - 1;
    default: return k;  // a receive: this rank's own stage
  }
}

/// The point-to-point tag of a transfer: 2 x (receiving virtual stage) + (1 for gradients). The
/// micro-batch is not in the tag: every virtual stage runs its forwards, and its backwards, in
/// micro-batch order, so messages of one tag between two ranks meet in posting order (the
/// simulator checks it).
inline int message_tag(const Schedule& s, int rank, const Action& a) noexcept {
  const bool grad = a.op == Op::send_gradient || a.op == Op::recv_gradient;
  return 2 * receiving_stage(s, rank, a) + (grad ? 1 : 0);
}

/// "action 7 (recv-act m0 from 0)", or "the end of its actions".
inline std::string action_at(const Schedule& s, int rank, std::size_t index) {
  const auto& list = s.ranks[static_cast<std::size_t>(rank)];
  if (index >= list.size()) return "the end of its actions";
  return "action " + std::to_string(index) + " (" + describe(list[index], s.chunks > 1) + ")";
}

/// "rank 1, action 7 (recv-act m0 from 0)": where an action sits, for error messages.
inline std::string action_site(const Schedule& s, int rank, std::size_t index) {
  return "rank " + std::to_string(rank) + ", " + action_at(s, rank, index);
}

/// Checks what every schedule must satisfy before it is simulated or run: sizes >= 1, one list per
/// rank, chunks, micro-batches and peers in range, and transfers pointing at the neighbouring
/// virtual stage's rank. A usage_error naming the rank and action otherwise.
inline void check_well_formed(const Schedule& s) {
  if (s.stages < 1 || s.micro_batches < 1 || s.chunks < 1) {
    throw usage_error("stages, micro-batches and chunks must be >= 1", "pipeline schedule " + s.generator,
                      "p " + std::to_string(s.stages) + ", m " + std::to_string(s.micro_batches) + ", v " +
                          std::to_string(s.chunks));
  }
  if (s.ranks.size() != static_cast<std::size_t>(s.stages)) {
    throw usage_error("must hold one action list per pipeline rank (" + std::to_string(s.stages) + ")",
                      "pipeline schedule " + s.generator, std::to_string(s.ranks.size()) + " lists");
  }
  for (int r = 0; r < s.stages; ++r) {
    const auto& list = s.ranks[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      const auto bad = [&](const std::string& rule, int value) {
        throw usage_error(rule, "pipeline schedule " + s.generator + ": " + action_site(s, r, i), std::to_string(value));
      };
      if (static_cast<int>(a.op) >= kOpCount) bad("unknown action", static_cast<int>(a.op));
      if (a.chunk < 0 || a.chunk >= s.chunks) bad("chunk must be in [0, " + std::to_string(s.chunks) + ")", a.chunk);
      if (has_micro(a.op) && (a.micro < 0 || a.micro >= s.micro_batches)) {
        bad("micro-batch must be in [0, " + std::to_string(s.micro_batches) + ")", a.micro);
      }
      if (!is_transfer(a.op)) continue;
      const int k = s.virtual_stage(r, a.chunk);
      const bool downstream = a.op == Op::send_activation || a.op == Op::recv_gradient;
      const int other = downstream ? k + 1 : k - 1;
      if (other < 0 || other >= s.virtual_stages()) {
        bad(std::string("virtual stage ") + std::to_string(k) + " has no " + (downstream ? "next" : "previous") +
                " stage to exchange with",
            k);
      }
      if (a.peer != s.rank_of(other)) {
        bad("peer must be rank " + std::to_string(s.rank_of(other)) + ", which holds virtual stage " +
                std::to_string(other),
            a.peer);
      }
    }
  }
}

}  // namespace zerotk::pipeline
