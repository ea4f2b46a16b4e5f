// A new optimizer (its own tag, groups and step constants) with no kernels for host memory is refused
// by optim::Run in words; it never falls through to another optimizer's kernels.
#include <span>
#include <vector>

#include "new_optimizer.hpp"
#include "zerotk/optim/run.hpp"

#ifdef ZEROTK_FAILTEST_CONTROL
using Opt = zerotk::Optimizer<zerotk::AdamW>;
#else
using Opt = zerotk::Optimizer<Sgd>;
#endif

int main() {
  Opt opt({zerotk::ParamGroup{}});
  std::vector<float> master(4), m(4), v(4), g(4);
  const std::vector<zerotk::Segment> segs = {{0, 4, 0, 0}};
  zerotk::optim::Run<Opt, zerotk::HostSpace>::step<float, void>(opt, segs, master.data(), {m.data(), v.data(), 4},
                                                               g.data(), nullptr, 1.0f, [](std::span<double>) {});
  return 0;
}
