// Offload<Nvme> is named but not built yet: the first error says so (and nothing else cascades).
// The control builds Offload<Cpu> at stage 2.
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
using E = Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Offload<Cpu>>;
#else
using E = Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Offload<Nvme>>;
#endif
int main() {
  comm::run_threads(1, [](auto& c) {
    Model m;
    E engine(c, m);
    (void)engine.step(0.0);
  });
}
