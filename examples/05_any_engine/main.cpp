// examples/05_any_engine: a trainer that chooses its engine at run time from a DeepSpeed config and
// compiles none of it: it includes zerotk/any_engine.hpp and links zerotk::engines.
//
//   build/default/examples/05_any_engine/zerotk_example_05_any_engine examples/05_any_engine/ds_config.json
#include <cstdio>
#include <vector>

#include <zerotk/any_engine.hpp>
#include <zerotk/comm/threads.hpp>

#include "mlp.hpp"  // the user's own layers: Dense, Mlp, a teacher to regress

int main(int argc, char** argv) {
  const char* config = argc > 1 ? argv[1] : "ds_config.json";
  double first = 0, last = 0;
  zerotk::comm::run_threads(2, [&](zerotk::comm::ThreadsCommunicator& comm) {
    demo::Mlp model;
    zerotk::AnyEngine engine = zerotk::make_engine_from_file(config, comm, model);
    { auto g = engine.gather(model, 0); model.init(); }  // rank 0's values become every rank's
    engine.initialize_master();
    if (comm.rank() == 0) std::printf("engine: %s\n", engine.description().c_str());
    for (int step = 0; step < 200; ++step) {
      demo::Batch b = demo::batch(step, comm.rank());
      for (auto& l : model.layers) { auto s = engine.forward(l); b.x = l.forward(b.x); }
      std::vector<float> dy;
      const double loss = demo::mse(b.x, b.t, engine.loss_scale(), dy);
      for (auto l = model.layers.rbegin(); l != model.layers.rend(); ++l) { auto s = engine.backward(*l); dy = l->backward(dy); }
      const zerotk::StepReport r = engine.step(loss);
      if (comm.rank() == 0 && (step == 0 ? (first = r.loss) : (last = r.loss)) && step % 50 == 0)
        std::printf("step %3d  loss %.5f  lr %.5f\n", step, r.loss, engine.lr());
    }
  });
  std::printf("loss %.5f -> %.5f: %s\n", first, last, last < 0.1 * first ? "PASS (below 10%)" : "FAIL");
  return last < 0.1 * first ? 0 : 1;
}
