// A new user's trainer without an Optimizer policy: the first error line (and the only one) names
// what is missing, even though the engine is constructed and used.
#include <vector>

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
using E = Engine<Partitioner<Stage<2>>, Optimizer<AdamW>>;
#else
using E = Engine<Partitioner<Stage<2>>>;
#endif

int main() {
  comm::run_threads(2, [](auto& c) {
    Model m;
    E engine(c, m);
    { auto s = engine.backward(m); }
    const StepReport r = engine.step(1.0);
    (void)r;
  });
}
