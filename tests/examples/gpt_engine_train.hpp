#pragma once
// The GPT example trained under zerotk's Engine on the threads communicator, for the tests that
// compare whole runs (stages, tied heads, activation checkpointing): rank 0's losses and final
// parameters. `attach(model, rank)` runs after initialisation, before the first step (e.g. to
// checkpoint blocks); `detach(model)` after the last step.
#include <functional>
#include <mutex>
#include <string_view>
#include <vector>

#include "data.hpp"
#include "gpt.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/engines.hpp"  // the compiled engine set, when the suite links zerotk::engines

namespace gpt_test {

struct Trace {
  std::vector<double> losses;
  std::vector<float> params;  // rank 0's, after training
};

template <int Stage, class Prec = zerotk::fp32>
Trace train_engine(const gpt::Config& c, int world, int steps, const std::function<void(gpt::Gpt&)>& attach = {},
                   const std::function<void(gpt::Gpt&)>& detach = {}) {
  const gpt::DigitTask task(gpt::DigitTaskKind::sort, 4, 7);
  Trace trace;
  std::mutex mu;
  zerotk::comm::run_threads(world, [&](zerotk::comm::ThreadsCommunicator& comm) {
    gpt::Gpt model(c);
    zerotk::EngineOptions o;
    o.optimizer.lr = 3e-3f;
    o.gradient_clipping = 1.0;
    o.reduce_bucket_size = 4096 / sizeof(typename zerotk::Precision<Prec>::storage);  // many buckets
    o.stage3.param_persistence_threshold = 0;  // stage 3: every parameter fetched by its layer
    zerotk::Engine<zerotk::Partitioner<zerotk::Stage<Stage>>, zerotk::Optimizer<zerotk::AdamW>,
                   zerotk::Precision<Prec>>
        engine(comm, model, o);
    {
      auto g = engine.gather(model, 0);  // stage 3: parameters have values only inside scopes
      gpt::init_parameters(model, 11);
    }
    engine.initialize_master();
    if (attach) attach(model);
    gpt::Batch batch;
    std::vector<double> losses;
    for (int s = 0; s < steps; ++s) {
      task.fill_batch(static_cast<std::uint64_t>(s), comm.rank(), world, 4, batch);
      const float loss = model.train_step(batch, engine, static_cast<float>(engine.loss_scale()));
      losses.push_back(engine.step(loss).loss);
    }
    if (detach) detach(model);
    auto g = engine.gather(model);
    if (comm.rank() == 0) {
      std::lock_guard lock(mu);
      trace.losses = losses;
      model.parameters([&](std::string_view, gpt::Param& p) {
        trace.params.insert(trace.params.end(), p.data(), p.data() + p.numel());
      });
    }
  });
  return trace;
}

}  // namespace gpt_test
