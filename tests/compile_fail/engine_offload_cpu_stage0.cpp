// Offload<Cpu> offloads a partitioned optimizer state: with stage 0 the first error says to use
// stage 1 or 2 (DeepSpeed: offload_optimizer needs ZeRO stage >= 1). The control builds stage 1.
#include "zerotk/comm/threads.hpp"
#include "zerotk/core/param.hpp"
#include "zerotk/engine.hpp"
using namespace zerotk;
struct Model {
  Param<float> w{"w", {4}};
  template <class V>
  void parameters(V&& visit) {
    visit(w.name(), w);
  }
};
#ifdef ZEROTK_FAILTEST_CONTROL
using E = Engine<Partitioner<Stage<1>>, Optimizer<AdamW>, Offload<Cpu>>;
#else
using E = Engine<Partitioner<Stage<0>>, Optimizer<AdamW>, Offload<Cpu>>;
#endif
int main() {
  comm::run_threads(1, [](auto& c) {
    Model m;
    E engine(c, m);
    (void)engine.step(0.0);
  });
}
