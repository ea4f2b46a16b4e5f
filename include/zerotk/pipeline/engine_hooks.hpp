#pragma once
/// \file zerotk/pipeline/engine_hooks.hpp
/// The engine-facing actions on a TrainingEngine (zerotk::Engine, or zerotk::AnyEngine as
/// examples/02_gpt uses): each stage's layers are trained by an engine built on the process grid (`Engine(grid, stage_model, options)`: ZeRO over the data group, the norm
/// and the loss over the whole grid), stepping once per micro-batch, with the optimizer boundary at
/// the last (EngineOptions::gradient_accumulation_steps = the schedule's micro-batches).
///
///   Engine<...> engine(grid, my_stage, options);            // options.gradient_accumulation_steps = m
///   pipeline::EngineHooks hooks(schedule, engine);
///   hooks.attach(functions);                                 // sets functions.reduce, .optimizer_step
///   executor.run(functions);                                 // hooks.report(): the boundary's StepReport
///
/// - `reduce` (a micro-batch's gradients of a chunk are complete) is Engine::step(loss): one
///   engine micro-step, in micro-batch order on every schedule, so each parameter's gradient
///   accumulates in the order of a single-rank run over the same micro-batches. The loss is the
///   micro-batch's on the last stage and 0 elsewhere: the engine sums it over the grid's world and
///   divides by the data-parallel size (engine/boundary_step.hpp), so every rank reports the loss.
/// - `optimizer_step` checks that every engine reached its boundary.
/// - The stage functions open the engine's scopes themselves, as in any trainer: engine.forward(l)
///   around a layer's forward (and its input gradient, which reads the weights: at stage 3 that
///   gathers them), engine.backward(l) around the code that writes its weight gradients.
/// - Interleaved schedules (v chunks per rank): one engine per chunk, since an engine gives every
///   parameter one backward per micro-step and chunk v-1 runs several micro-batches' backwards before
///   chunk 0 runs its first. Each chunk's last step() waits for optimizer_step, which steps the
///   chunks in order 0..v-1 on every rank (their boundaries' collectives meet in that order). Each
///   such engine's norm and overflow check cover its own chunk across the pipeline, not the whole
///   model: gradient clipping and loss scaling are refused there, and an overflow skips the step of
///   the chunks that overflowed only.
/// Only the engine's face is included (engine/api.hpp): this file sits above engine/ in the layer
/// order (docs/architecture.md), the rest of pipeline/ below it.

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "zerotk/core/error.hpp"
#include "zerotk/engine/api.hpp"
#include "zerotk/pipeline/executor.hpp"
#include "zerotk/pipeline/schedule.hpp"

namespace zerotk::pipeline {

template <TrainingEngine E>
class EngineHooks {
 public:
  using Report = decltype(std::declval<E&>().step(0.0));

  /// One engine per chunk of this rank, chunk 0 first (one, without interleaving).
  EngineHooks(const Schedule& s, std::vector<E*> engines) : engines_(std::move(engines)), m_(s.micro_batches) {
    const std::string where = "pipeline::EngineHooks";
    if (engines_.size() != static_cast<std::size_t>(s.chunks)) {
      throw usage_error("needs one engine per model chunk of the schedule (" + std::to_string(s.chunks) + ")", where,
                        std::to_string(engines_.size()));
    }
    for (E* e : engines_) {
      const int gas = e->options().gradient_accumulation_steps;
      if (gas != m_) {
        throw usage_error("EngineOptions::gradient_accumulation_steps must equal the schedule's micro-batches per step (" +
                              std::to_string(m_) + "): the engine steps once per micro-batch",
                          where, std::to_string(gas));
      }
      if (s.chunks > 1 && e->options().gradient_clipping > 0) {
        throw usage_error("gradient clipping under an interleaved schedule: each chunk's engine would clip by its own "
                          "chunk's norm, not the model's (run 1f1b or zbh1, or clip 0)",
                          where, std::to_string(e->options().gradient_clipping));
      }
      if (s.chunks > 1 && e->loss_scale() != 1.0) {
        throw usage_error("loss scaling under an interleaved schedule: the chunks' engines would keep separate scales "
                          "(use bf16 or fp32, or a one-chunk schedule)",
                          where, std::to_string(e->loss_scale()));
      }
    }
    reports_.resize(engines_.size());
    count_.assign(engines_.size(), 0);
    deferred_.assign(engines_.size(), 0.0);
  }

  EngineHooks(const Schedule& s, E& engine) : EngineHooks(s, std::vector<E*>{&engine}) {}

  /// Sets `f.reduce` and `f.optimizer_step`; the hooks must outlive `f`'s use.
  void attach(StageFunctions& f) {
    f.reduce = [this](const MicroBatch& mb, double loss) { reduce(mb, loss); };
    f.optimizer_step = [this] { finish(); };
  }

  /// The last step()'s report of chunk `c`'s engine: the boundary's after a run.
  const Report& report(int c = 0) const { return reports_.at(static_cast<std::size_t>(c)); }

 private:
  void reduce(const MicroBatch& mb, double loss) {
    const auto c = static_cast<std::size_t>(mb.chunk);
    if (++count_[c] == m_ && engines_.size() > 1) {
      deferred_[c] = loss;  // stepped by finish(), in chunk order
      return;
    }
    reports_[c] = engines_[c]->step(loss);
  }

  void finish() {
    for (std::size_t c = 0; c < engines_.size(); ++c) {
      if (engines_.size() > 1) reports_[c] = engines_[c]->step(deferred_[c]);
      if (count_[c] != m_ || !reports_[c].boundary) {
        throw usage_error("the engine of chunk " + std::to_string(c) + " did not reach its optimizer boundary at the "
                          "step's end (it was reduced " + std::to_string(count_[c]) + " times)",
                          "pipeline::EngineHooks", std::to_string(m_) + " micro-batches");
      }
      count_[c] = 0;
    }
  }

  std::vector<E*> engines_;
  int m_ = 1;
  std::vector<Report> reports_;
  std::vector<int> count_;
  std::vector<double> deferred_;
};

}  // namespace zerotk::pipeline
