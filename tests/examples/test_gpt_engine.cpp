// The GPT example under zerotk's Engine: the same seed trained with stage 0 and stage 2 (threads,
// fp32) gives bitwise-identical losses and parameters, and the tied head works through
// external_parameters at stage 2 (the head writes into wte's gradient bucket before the embedding's).
#include <doctest/doctest.h>

#include <mutex>
#include <vector>

#include "data.hpp"
#include "gpt.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/engine.hpp"

namespace {

struct Trace {
  std::vector<double> losses;
  std::vector<float> params;  // rank 0's, after training
};

template <int Stage>
Trace train(bool tied, int world, int steps) {
  gpt::Config c;
  c.vocab_size = 11;
  c.context = 8;
  c.d_model = 16;
  c.n_heads = 2;
  c.n_layers = 2;
  c.tied_head = tied;
  const gpt::DigitTask task(gpt::DigitTaskKind::sort, 4, 7);
  Trace trace;
  std::mutex mu;
  zerotk::comm::run_threads(world, [&](zerotk::comm::ThreadsCommunicator& comm) {
    gpt::Gpt model(c);
    zerotk::EngineOptions o;
    o.optimizer.lr = 3e-3f;
    o.gradient_clipping = 1.0;
    o.bucket_bytes = 4096;  // many buckets
    zerotk::Engine<zerotk::Partitioner<zerotk::Stage<Stage>>, zerotk::Optimizer<zerotk::AdamW>> engine(comm, model, o);
    gpt::init_parameters(model, 11);
    engine.initialize_master();
    gpt::Batch batch;
    std::vector<double> losses;
    for (int s = 0; s < steps; ++s) {
      task.fill_batch(static_cast<std::uint64_t>(s), comm.rank(), world, 4, batch);
      const float loss = model.train_step(batch, engine, static_cast<float>(engine.loss_scale()));
      losses.push_back(engine.step(loss).loss);
    }
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

}  // namespace

TEST_CASE("GPT: stage 0 and stage 2 give bitwise-identical losses and parameters (threads, fp32)") {
  for (int world : {2, 3}) {
    CAPTURE(world);
    const Trace a = train<0>(false, world, 12);
    const Trace b = train<2>(false, world, 12);
    CHECK(a.losses == b.losses);
    CHECK(a.params == b.params);
    CHECK(a.losses.back() < a.losses.front());  // it learns
  }
}

TEST_CASE("GPT with a tied head trains at stage 2 (external_parameters) like stage 0") {
  const Trace a = train<0>(true, 2, 8);
  const Trace b = train<2>(true, 2, 8);
  CHECK(a.losses == b.losses);
  CHECK(a.params == b.params);
}
