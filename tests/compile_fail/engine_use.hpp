// Shared by the engine compile-fail files: a one-parameter model and a use of the engine type `E`
// that the including file defines (the refused one, or its control's under ZEROTK_FAILTEST_CONTROL).
// Include it after defining E.
#include "zerotk/comm/threads.hpp"
#include "zerotk/core/param.hpp"

struct Model {
  zerotk::Param<float> w{"w", {4}};
  template <class V>
  void parameters(V&& visit) {
    visit(w.name(), w);
  }
};

int main() {
  zerotk::comm::run_threads(1, [](auto& c) {
    Model m;
    E engine(c, m);
    (void)engine.step(0.0);
  });
}
