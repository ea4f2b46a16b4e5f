#pragma once
// examples/02_gpt/replica.hpp: this rank's part of one model replica, and how it takes an optimizer
// step. Without a pipeline that is the whole model and one engine, stepping once per micro-batch of
// the accumulation; with one (the config's pipeline.stages > 1), this rank's chunks of the layers
// (pipeline_stage.hpp), an engine per chunk, and the schedule's executor running the step's
// micro-batches through the stages. Each engine is a zerotk::AnyEngine that make_engine builds from
// the config: the compiled engine set's engine for it (zerotk::engines).
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <zerotk/any_engine.hpp>
#include <zerotk/comm/grid.hpp>
#include <zerotk/engine/options.hpp>
#include <zerotk/pipeline.hpp>

#include "run.hpp"
#include "evaluate.hpp"
#include "gpt.hpp"
#include "pipeline_stage.hpp"
#include "sparse_engine.hpp"

namespace gpt_demo {

/// The engine as the model's LayerScope, adding the time spent opening and closing each layer's
/// scope (gathers, waits for buckets or for slower ranks) to `*ms`. The engine's scopes can be
/// neither copied nor moved, so each is built in place inside its Timed.
template <class E>
struct TimedScope {
  using Clock = std::chrono::steady_clock;
  E* engine;
  double* ms;
  struct Stopwatch {
    double* ms;
    Clock::time_point t0;
    ~Stopwatch() { *ms += std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }
  };
  template <class Guard>
  struct Timed {
    Stopwatch close;  // destroyed after `guard`: times its closing
    Guard guard;
    template <class Open>
    Timed(double* ms, Open&& open) : close{ms, Clock::now()}, guard(open()) {
      *ms += std::chrono::duration<double, std::milli>(Clock::now() - close.t0).count();
    }
    Timed(const Timed&) = delete;
    Timed& operator=(const Timed&) = delete;
    ~Timed() { close.t0 = Clock::now(); }
  };
  template <class L>
  auto forward(L& layer) {
    return Timed<decltype(engine->forward(layer))>(ms, [&] { return engine->forward(layer); });
  }
  template <class L>
  auto backward(L& layer) {
    return Timed<decltype(engine->backward(layer))>(ms, [&] { return engine->backward(layer); });
  }
};

template <class Comm>
class Replica {
 public:
  using Clock = std::chrono::steady_clock;
  using Engine = zerotk::AnyEngine;

  /// `edit`: what this model adds to the options the config gives each chunk's engine.
  Replica(zerotk::comm::ProcessGrid<Comm>& grid, gpt::Gpt& model, const TrainContext& ctx, const zerotk::EngineOptionsEdit& edit)
      : grid_(grid), model_(model), ctx_(ctx), pp_(grid.size(zerotk::comm::GridDim::pipeline)) {
    const int layers = model.layer_count();
    if (pp_ == 1) {
      chunks_.push_back(GptStage{&model, 0, layers});
    } else {
      if (model.config.tied_head) {
        throw zerotk::usage_error("a tied head reads the embedding's wte, which another pipeline stage holds", "--pp",
                                  std::to_string(pp_));
      }
      spec_ = zerotk::pipeline::ScheduleSpec::parse(ctx.cfg.pipeline.schedule);
      bounds_ = stage_bounds(model, pp_ * spec_.chunks, ctx.cfg.pipeline.partition);
      for (int c = 0; c < spec_.chunks; ++c) {
        const auto k = static_cast<std::size_t>(c * pp_ + grid.pipeline_index());
        chunks_.push_back(GptStage{&model, static_cast<int>(bounds_[k]), static_cast<int>(bounds_[k + 1])});
      }
    }
    for (GptStage& c : chunks_) {
      // --sparsity: an engine the example compiles itself (sparse_engine.cpp); else the compiled set's.
      engines_.push_back(std::make_unique<Engine>(
          ctx.o.sparsity != "none" ? make_sparse_engine(ctx.cfg, zerotk::engine::erase_inputs(grid, c), edit)
                                   : zerotk::make_engine(ctx.cfg, grid, c, edit)));
    }
    if (pp_ > 1) {
      schedule_ = zerotk::pipeline::make_schedule(spec_, pp_, static_cast<int>(ctx.cfg.gradient_accumulation_steps));
      // Busy time in the rank thread's CPU time: a stage descheduled for want of a core is not busy
      // (issue 57 item 11). The makespan stays wall time.
      zerotk::pipeline::ExecutorOptions xo;
      xo.busy_clock = [] { return static_cast<std::int64_t>(thread_cpu_ms() * 1e6); };
      executor_ = std::make_unique<zerotk::pipeline::Executor<Comm>>(grid, schedule_, std::move(xo));
      // A context rank's blocks see its chunk of each sequence: n = T / P tokens.
      const int seq = ctx.model_config.context / (model.context_split() ? model.context.size : 1);
      stages_ = std::make_unique<PipelineStages<Engine>>(model, chunks_, raw(), [this](std::uint64_t i, gpt::Batch& b) { fill(i, b); },
                                                         seq);
      hooks_ = std::make_unique<zerotk::pipeline::EngineHooks<Engine>>(schedule_, raw());
      functions_ = stages_->functions();
      hooks_->attach(functions_);
    }
  }

  int chunks() const noexcept { return static_cast<int>(engines_.size()); }
  Engine& engine(int c = 0) { return *engines_.at(static_cast<std::size_t>(c)); }
  GptStage& chunk(int c = 0) { return chunks_.at(static_cast<std::size_t>(c)); }
  bool pipelined() const noexcept { return pp_ > 1; }
  const zerotk::pipeline::Schedule& schedule() const noexcept { return schedule_; }

  /// Every engine's bound parameters get the model's initial values, written by `init` once while
  /// every chunk is gathered (at stage 3 into the shards; data rank 0's for its data group). Once:
  /// `init` writes every bound parameter, and a second call inside another chunk's gather would
  /// leave the first chunk's float compute copies unrounded behind its engine's back. (make_engine
  /// gave each engine the config's LR scheduler.)
  template <class Init>
  void initialize(Init&& init) {
    {
      Gathered g(*this, 0);
      init();
    }
    for (auto& e : engines_) e->initialize_master();
  }

  /// One optimizer step (`index`: the step's number, which decides its data). `user_ms` gets the time
  /// in the model's own code, `scope_ms` the part of it spent opening and closing the engine's scopes.
  zerotk::StepReport step(int index, double& user_ms, double& scope_ms) {
    const int gas = static_cast<int>(ctx_.cfg.gradient_accumulation_steps);
    if (pp_ > 1) {
      stages_->set_first_index(static_cast<std::uint64_t>(index) * static_cast<std::uint64_t>(gas));
      const double before = stages_->times().forward_ms + stages_->times().backward_ms;
      const zerotk::pipeline::StepResult r = executor_->run(functions_);
      user_ms += stages_->times().forward_ms + stages_->times().backward_ms - before;
      if (++steps_ > 1) {  // the first step records stage 3's order and sizes the buffers
        idle_ += static_cast<double>(r.figures.total_idle());
        span_ += static_cast<double>(r.figures.makespan) * static_cast<double>(r.figures.busy.size());
      }
      return whole_report();
    }
    zerotk::StepReport r;
    for (int m = 0; m < gas; ++m) {
      fill(static_cast<std::uint64_t>(index * gas + m), batch_);
      const auto u0 = Clock::now();
      const float loss = model_.train_step(batch_, TimedScope<Engine>{&engine(), &scope_ms}, static_cast<float>(engine().loss_scale()));
      user_ms += std::chrono::duration<double, std::milli>(Clock::now() - u0).count();
      r = engine().step(loss);
    }
    return r;
  }

  /// Data micro-batch `i` of this rank: its data group's share of the stream, or under context
  /// parallelism its replica's micro-batch (every context rank reads the same samples) and of each
  /// sequence this context rank's chunk (gpt::context_share).
  void fill(std::uint64_t i, gpt::Batch& out) {
    const int micro = static_cast<int>(ctx_.cfg.train_micro_batch_size_per_gpu);
    if (!model_.context_split()) {
      ctx_.fill_batch(i, grid_.data_index(), grid_.size(zerotk::comm::GridDim::data), micro, out);
      return;
    }
    ctx_.fill_batch(i, grid_.replica_index(), grid_.replica_count(), micro, whole_);
    gpt::context_share(whole_, grid_.context_size(), grid_.context_index(), out);
  }

  /// The logits of a batch's tokens, for evaluation on every rank of data group 0: the whole model's,
  /// or through the pipeline (every rank gets the last stage's).
  gpt::LogitsOf logits() {
    if (pp_ == 1) return [this](const gpt::TokenView& t) -> const gpt::Matrix& { return model_.logits(t); };
    pipelined_logits_ = std::make_unique<PipelinedLogits<Comm>>(model_, grid_.pipeline(), bounds_);
    return [this](const gpt::TokenView& t) -> const gpt::Matrix& { return (*pipelined_logits_)(t); };
  }

  /// Every chunk's parameters gathered for as long as the result lives (stage 3; others hold them).
  /// With `modifier_rank`: the values written meanwhile on that data rank become every data rank's.
  class Gathered {
   public:
    explicit Gathered(Replica& r, std::optional<int> modifier_rank = std::nullopt) {
      for (std::size_t c = 0; c < r.engines_.size(); ++c) {
        scopes_.push_back(std::make_unique<Scope>(*r.engines_[c], r.chunks_[c], modifier_rank));
      }
    }

   private:
    struct Scope {
      decltype(std::declval<Engine&>().gather(std::declval<GptStage&>())) g;
      Scope(Engine& e, GptStage& s, std::optional<int> modifier) : g(e.gather(s, modifier)) {}
    };
    std::vector<std::unique_ptr<Scope>> scopes_;
  };

  /// What the schedule's bubble measured over the steps after the first (each stage's busy time in
  /// its thread's CPU time, the step's makespan in wall time), and what the simulator predicts from
  /// this rank's mean forward and backward times. Rank 0 prints both with the formula, and says so
  /// when this process runs more rank threads than the machine has cores (then stages also wait for
  /// a core, and the measured bubble is not the schedule's alone); every rank must call it (the
  /// figures are every rank's already).
  void report_bubble(bool print) const {
    if (pp_ == 1 || !print || span_ <= 0) return;
    const ActionTimes& t = stages_->times();
    zerotk::pipeline::CostModel costs;
    costs.forward = static_cast<std::int64_t>(1000.0 * t.forward_ms / static_cast<double>(std::max<long long>(1, t.forwards)));
    const double per = static_cast<double>(std::max<long long>(1, t.backwards));
    costs.backward = static_cast<std::int64_t>(1000.0 * t.backward_ms / per);
    costs.backward_input = static_cast<std::int64_t>(1000.0 * t.input_ms / per);  // split schedules' halves
    costs.backward_weight = static_cast<std::int64_t>(1000.0 * t.weight_ms / per);
    const double simulated = zerotk::pipeline::simulate(schedule_, costs).bubble().value();
    const double p = pp_, m = static_cast<double>(ctx_.cfg.gradient_accumulation_steps), v = spec_.chunks;
    // ZB-H1: a third of 1F1B's with equal forward, input- and weight-gradient costs (m >= p).
    const bool zb = spec_.kind == zerotk::pipeline::ScheduleKind::zb_h1;
    const double formula = zb ? (p - 1) / (3 * m + p - 1) : (p - 1) / (v * m + p - 1);
    std::printf("pipeline %s, %d stages x %d micro-batches%s: bubble %.3f measured (busy in thread CPU time, steps after the first), "
                "%.3f simulated with this rank's mean forward %.2f ms and backward %.2f ms (backward recomputes the "
                "stage's forward), formula (p-1)/(%sm+p-1) = %.3f\n",
                spec_.name().c_str(), pp_, static_cast<int>(m), spec_.chunks > 1 ? (" x " + std::to_string(spec_.chunks) + " chunks").c_str() : "",
                idle_ / span_, simulated, t.forward_ms / static_cast<double>(std::max<long long>(1, t.forwards)),
                t.backward_ms / static_cast<double>(std::max<long long>(1, t.backwards)), zb ? "3" : spec_.chunks > 1 ? "v " : "", formula);
    const unsigned cores = std::thread::hardware_concurrency();
    if (!ctx_.o.mpi && cores > 0 && static_cast<unsigned>(ctx_.o.ranks) > cores) {
      std::printf("  note: %d rank threads on %u cores: stages also wait for a core, not only for each other, so the "
                  "measured bubble is not the schedule's alone (bench/pipeline times schedules on their own)\n",
                  ctx_.o.ranks, cores);
    }
  }

 private:
  /// The step's report for the whole model: the last chunk's engine carries the last virtual stage's
  /// loss (and the bytes: the chunks' engines share the grid's communicators, whose counters it
  /// read); under an interleaved schedule each chunk's engine measured its own chunk's gradient norm
  /// (across the pipeline), so the model's is the root of their squares' sum (issue 57 item 9: the
  /// progress line and csv showed chunk v-1's alone).
  zerotk::StepReport whole_report() const {
    zerotk::StepReport r = hooks_->report(chunks() - 1);
    if (chunks() == 1) return r;
    double squares = 0;
    bool finite = true;
    for (int c = 0; c < chunks(); ++c) {
      const zerotk::StepReport& rc = hooks_->report(c);
      finite = finite && rc.grad_norm >= 0;
      squares += rc.grad_norm * rc.grad_norm;
    }
    r.grad_norm = finite ? std::sqrt(squares) : -1.0;
    return r;
  }

  std::vector<Engine*> raw() {
    std::vector<Engine*> out;
    for (auto& e : engines_) out.push_back(e.get());
    return out;
  }

  zerotk::comm::ProcessGrid<Comm>& grid_;
  gpt::Gpt& model_;
  const TrainContext& ctx_;
  int pp_ = 1;
  zerotk::pipeline::ScheduleSpec spec_;
  std::vector<std::size_t> bounds_;
  std::vector<GptStage> chunks_;
  std::vector<std::unique_ptr<Engine>> engines_;
  zerotk::pipeline::Schedule schedule_;
  std::unique_ptr<zerotk::pipeline::Executor<Comm>> executor_;
  std::unique_ptr<PipelineStages<Engine>> stages_;
  std::unique_ptr<zerotk::pipeline::EngineHooks<Engine>> hooks_;
  std::unique_ptr<PipelinedLogits<Comm>> pipelined_logits_;
  zerotk::pipeline::StageFunctions functions_;
  gpt::Batch batch_, whole_;  // whole_: the replica's micro-batch a context rank takes its share of
  int steps_ = 0;
  double idle_ = 0, span_ = 0;
};

}  // namespace gpt_demo
