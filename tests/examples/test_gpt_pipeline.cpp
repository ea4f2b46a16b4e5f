// The GPT example's layers split into pipeline stages (examples/02_gpt/pipeline_stage.hpp: an engine
// per chunk over its layers, a stage-level recompute, zerotk::pipeline's executor and engine hooks):
//  - pipeline alone (pp 2 and 4, data 1; GPipe, 1F1B, ZB-H1 (its weight gradients deferred) and
//    interleaved 1F1B; fp32 and bf16): the losses
//    and the whole parameters after 3 steps of 4 micro-batches are bitwise those of one rank training
//    the whole model over the same micro-batches;
//  - pipeline 2 x tensor 2 x data 2 (8 thread ranks): ZeRO stages 0-3 give bitwise-identical losses and
//    parameters (stages 0 and 1 reducing every micro-step, as 2 and 3 do), and each pipeline stage's
//    model states are what the planner predicts for that stage's layers (plan/pipeline.hpp).
#include <doctest/doctest.h>

#include <memory>
#include <mutex>
#include <utility>
#include <string>
#include <vector>

#include "data.hpp"
#include "gpt.hpp"
#include "gpt_whole.hpp"
#include "pipeline_stage.hpp"
#include "tensor_group.hpp"
#include "zerotk/comm/grid.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/engines.hpp"  // the compiled engine set, when the suite links zerotk::engines
#include "zerotk/pipeline.hpp"
#include "zerotk/plan/pipeline.hpp"
#include "zerotk/plan/search.hpp"
#include "zerotk/plan/transformer.hpp"

namespace test_gpt_pipeline {  // the file's own names, apart from its suite's other files in a unity build

namespace {

namespace pl = zerotk::pipeline;
constexpr int kMicro = 2, kM = 4, kSteps = 3;

gpt::Config config(int layers) {
  gpt::Config c;
  c.vocab_size = 11;
  c.context = 8;
  c.d_model = 16;
  c.n_heads = 4;
  c.n_layers = layers;
  return c;
}

zerotk::EngineOptions options(double clip) {
  zerotk::EngineOptions o;
  o.optimizer.lr = 3e-3f;
  o.gradient_clipping = clip;
  o.gradient_accumulation_steps = kM;  // one engine micro-step per micro-batch
  o.reduce_bucket_size = 1024;
  o.stage3.param_persistence_threshold = 0;
  return o;
}

template <int S, class P = zerotk::fp32, class When = zerotk::when::every_micro_step>
using E = zerotk::Engine<zerotk::Partitioner<zerotk::Stage<S>, When>, zerotk::Optimizer<zerotk::AdamW>, zerotk::Precision<P>>;

struct Run {
  std::vector<double> losses;
  gpt_test::Whole params;
  std::vector<std::size_t> model_states;  // [pipeline stage] of tensor rank 0, data rank 0 (one chunk)
};

std::size_t model_states(const zerotk::MemoryLedger& m) {
  using C = zerotk::MemoryCategory;
  return m.live(C::params16) + m.live(C::grads) + m.live(C::master32) + m.live(C::optimizer_state);
}

/// One engine's gather scope, built in place (scopes neither copy nor move).
template <class Engine>
struct Gathered {
  decltype(std::declval<Engine&>().gather(std::declval<gpt_demo::GptStage&>(), 0)) g;
  Gathered(Engine& e, gpt_demo::GptStage& s, int modifier) : g(e.gather(s, modifier)) {}
};

const gpt::DigitTask& task() {
  static const gpt::DigitTask t(gpt::DigitTaskKind::sort, 4, 7);
  return t;
}

/// One rank, the whole model, the same micro-batches.
template <class Engine>
Run single_rank(int layers, double clip) {
  Run run;
  zerotk::comm::run_threads(1, [&](zerotk::comm::ThreadsCommunicator& comm) {
    gpt::Gpt model(config(layers));
    Engine engine(comm, model, options(clip));
    {
      auto g = engine.gather(model, 0);
      gpt::init_parameters(model, 11);
    }
    engine.initialize_master();
    gpt::Batch batch;
    for (int s = 0; s < kSteps; ++s) {
      zerotk::StepReport r;
      for (int m = 0; m < kM; ++m) {
        task().fill_batch(static_cast<std::uint64_t>(s * kM + m), 0, 1, kMicro, batch);
        r = engine.step(model.train_step(batch, engine));
      }
      run.losses.push_back(r.loss);
    }
    auto g = engine.gather(model);
    gpt_test::merge_shards(model, 0, 1, run.params);
  });
  return run;
}

/// pipeline x tensor x data thread ranks under `schedule`.
template <class Engine>
Run pipelined(int layers, int pipeline, int tensor, int data, const std::string& schedule, double clip) {
  Run run;
  std::mutex mu;
  zerotk::comm::run_threads(pipeline * tensor * data, [&](zerotk::comm::ThreadsCommunicator& world) {
    zerotk::comm::ProcessGrid grid(world, {.pipeline = pipeline, .tensor = tensor});
    gpt::Gpt model(config(layers), gpt::tensor_parallel(grid.tensor(), false));
    const pl::ScheduleSpec spec = pl::ScheduleSpec::parse(schedule);
    const auto bounds = gpt_demo::stage_bounds(model, pipeline * spec.chunks, zerotk::config::PipelinePartition::parameters);
    std::vector<gpt_demo::GptStage> chunks;
    for (int c = 0; c < spec.chunks; ++c) {
      const auto k = static_cast<std::size_t>(c * pipeline + grid.pipeline_index());
      chunks.push_back({&model, static_cast<int>(bounds[k]), static_cast<int>(bounds[k + 1])});
    }
    zerotk::EngineOptions o = options(clip);
    std::vector<std::unique_ptr<Engine>> owned;
    std::vector<Engine*> engines;
    for (auto& c : chunks) {
      owned.push_back(std::make_unique<Engine>(grid, c, o));
      engines.push_back(owned.back().get());
    }
    {  // every chunk gathered, the values written once (gpt_demo::Replica::initialize says why)
      std::vector<std::unique_ptr<Gathered<Engine>>> all;
      for (std::size_t c = 0; c < chunks.size(); ++c) all.push_back(std::make_unique<Gathered<Engine>>(*engines[c], chunks[c], 0));
      gpt::init_parameters(model, 11);
    }
    for (Engine* e : engines) e->initialize_master();
    const pl::Schedule s = pl::make_schedule(spec, pipeline, kM);
    pl::Executor exec(grid, s);
    gpt_demo::PipelineStages<Engine> stages(
        model, chunks, engines,
        [&](std::uint64_t i, gpt::Batch& b) { task().fill_batch(i, grid.data_index(), data, kMicro, b); }, 8);
    pl::EngineHooks<Engine> hooks(s, engines);
    pl::StageFunctions f = stages.functions();
    hooks.attach(f);
    std::vector<double> losses;
    for (int step = 0; step < kSteps; ++step) {
      stages.set_first_index(static_cast<std::uint64_t>(step * kM));
      exec.run(f);
      losses.push_back(hooks.report(spec.chunks - 1).loss);  // the last chunk's engine has the loss
    }
    for (std::size_t c = 0; c < chunks.size(); ++c) {
      auto g = engines[c]->gather(chunks[c]);
      if (grid.data_index() != 0) continue;
      std::lock_guard lock(mu);
      gpt_test::merge_shards(model, grid.tensor_index(), tensor, run.params);
    }
    std::lock_guard lock(mu);
    if (world.rank() == 0) run.losses = losses;
    if (grid.tensor_index() == 0 && grid.data_index() == 0) {
      run.model_states.resize(static_cast<std::size_t>(pipeline));
      run.model_states[static_cast<std::size_t>(grid.pipeline_index())] = model_states(engines[0]->memory());
    }
  });
  return run;
}

}  // namespace

TEST_CASE_TEMPLATE("GPT pipeline alone: every schedule at pp 2 and 4 equals one rank, bit for bit", P, zerotk::fp32, zerotk::bf16) {
  using Engine = E<2, P>;
  for (const double clip : {1.0, 0.0}) {  // interleaved refuses clipping (each chunk's engine would clip alone)
    CAPTURE(clip);
    const Run one = single_rank<Engine>(6, clip);
    CHECK(one.losses.back() < one.losses.front());
    for (const int p : {2, 4}) {
      for (const std::string schedule : {"gpipe", "1f1b", "zbh1", "interleaved:2"}) {
        if ((schedule == "interleaved:2") != (clip == 0.0)) continue;
        CAPTURE(p);
        CAPTURE(schedule);
        const Run split = pipelined<Engine>(6, p, 1, 1, schedule, clip);
        CHECK(split.losses == one.losses);
        CHECK(split.params == one.params);
      }
    }
  }
}

TEST_CASE("GPT at pipeline 2 x tensor 2 x data 2: ZeRO stages 0-3 bitwise identical; the planner's stages are the ledger's") {
  const Run s2 = pipelined<E<2>>(2, 2, 2, 2, "1f1b", 1.0);
  CHECK(s2.losses.back() < s2.losses.front());
  const Run s0 = pipelined<E<0>>(2, 2, 2, 2, "1f1b", 1.0);
  const Run s1 = pipelined<E<1>>(2, 2, 2, 2, "1f1b", 1.0);
  const Run s3 = pipelined<E<3>>(2, 2, 2, 2, "1f1b", 1.0);
  CHECK(s0.losses == s2.losses);
  CHECK(s0.params == s2.params);
  CHECK(s1.losses == s2.losses);
  CHECK(s1.params == s2.params);
  CHECK(s3.losses == s2.losses);
  CHECK(s3.params == s2.params);

  // Each stage's model states: the planner on that stage's layers of one tensor rank, over the data
  // group of 2, byte for byte.
  zerotk::plan::TransformerShape shape;
  shape.layers = 2;
  shape.hidden = 16;
  shape.heads = 4;
  shape.sequence = 8;
  shape.micro_batch = kMicro;
  shape.vocab = 11;
  shape.tensor = 2;
  const zerotk::plan::ModelDescription whole = zerotk::plan::gpt_model(shape);
  const auto bounds = zerotk::plan::stage_bounds(whole, 2, zerotk::plan::StagePartition::parameters);
  zerotk::plan::EngineSettings settings;
  settings.reduce_bucket_size = 1024;
  settings.param_persistence_threshold = 0;
  settings.gradient_accumulation_steps = kM;
  settings.compute_space = zerotk::MemorySpace::host;
  zerotk::plan::Budget unlimited;
  unlimited.device_bytes = unlimited.host_bytes = std::size_t{1} << 50;
  for (const auto& [stage, run] : {std::pair{2, &s2}, std::pair{3, &s3}}) {
    zerotk::plan::Choice choice;
    choice.stage = stage;
    choice.precision = zerotk::DType::fp32;
    for (int p = 0; p < 2; ++p) {
      CAPTURE(stage);
      CAPTURE(p);
      const auto e = zerotk::plan::evaluate(zerotk::plan::stage_model(whole, bounds, p), 2, choice, settings, unlimited);
      CHECK(run->model_states.at(static_cast<std::size_t>(p)) == e.memory.model_states());
    }
  }
}

}  // namespace test_gpt_pipeline
