// bench/compile/typed_trainer.cpp: the 20-line trainer typed over one engine type. Compiled with
// -DZEROTK_ENGINES_ADAMW_BF16=1 it includes zerotk/engines.hpp's extern declarations and links the
// compiled set (what a typed trainer that links zerotk::engines pays); without, the whole engine is
// instantiated here (header-only use).
#include <zerotk/comm/threads.hpp>
#include <zerotk/engines.hpp>

#include "../../examples/05_any_engine/mlp.hpp"

int main() {
  using E = zerotk::Engine<zerotk::Partitioner<zerotk::Stage<2>>, zerotk::Optimizer<zerotk::AdamW>,
                           zerotk::Precision<zerotk::bf16>>;
  zerotk::comm::run_threads(2, [&](zerotk::comm::ThreadsCommunicator& comm) {
    demo::Mlp model;
    E engine(comm, model);
    { auto g = engine.gather(model, 0); model.init(); }
    engine.initialize_master();
    for (int step = 0; step < 10; ++step) {
      demo::Batch b = demo::batch(step, comm.rank());
      for (auto& l : model.layers) { auto s = engine.forward(l); b.x = l.forward(b.x); }
      std::vector<float> dy;
      const double loss = demo::mse(b.x, b.t, engine.loss_scale(), dy);
      for (auto l = model.layers.rbegin(); l != model.layers.rend(); ++l) { auto s = engine.backward(*l); dy = l->backward(dy); }
      engine.step(loss);
    }
  });
}
