// Item 5 of the engine-composition issue: zerotk/zerotk.hpp alone is enough to train (nothing else
// included here).
#include <doctest/doctest.h>

#include <zerotk/zerotk.hpp>

namespace test_umbrella {  // the file's own names, apart from its suite's other files in a unity build

namespace {
struct Tiny {
  zerotk::Param<float> w{"w", {3}};
  template <class V>
  void parameters(V&& visit) {
    visit(w.name(), w);
  }
};
}  // namespace

TEST_CASE("the umbrella header gives the Engine, the policies and a communicator") {
  zerotk::comm::run_threads(2, [](auto& comm) {
    Tiny m;
    zerotk::Engine<zerotk::Partitioner<zerotk::Stage<1>>, zerotk::Optimizer<zerotk::AdamW>> engine(comm, m);
    {
      auto s = engine.backward(m);
      for (int i = 0; i < 3; ++i) m.w.grad()[i] = 1.0f;
    }
    const zerotk::StepReport r = engine.step(2.0);
    CHECK(r.boundary);
    CHECK(r.loss == 2.0);
    CHECK(m.w.data()[0] < 0.0f);  // moved against the gradient from 0
  });
}

}  // namespace test_umbrella
