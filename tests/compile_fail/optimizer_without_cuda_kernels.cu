// A new optimizer (its own tag, groups and step constants) with no CUDA kernels is refused
// on Device<Cuda> by optim::Run in words (an nvcc compile; no GPU needed); it never falls through to another optimizer's kernels.
#include <span>
#include <vector>

#include "new_optimizer.hpp"
#include "zerotk/optim/run_cuda.cuh"

#ifdef ZEROTK_FAILTEST_CONTROL
using Opt = zerotk::Optimizer<zerotk::AdamW>;
#else
using Opt = zerotk::Optimizer<Sgd>;
#endif

int main() {
  Opt opt({zerotk::ParamGroup{}});
  zerotk::kernels::cuda::Workspace ws;
  float* master = nullptr; float* m = nullptr; float* v = nullptr; const float* g = nullptr;  // never run
  const std::vector<zerotk::Segment> segs = {{0, 4, 0, 0}};
  zerotk::optim::Run<Opt, zerotk::CudaSpace>::step<float, void>(opt, segs, master, {m, v, 4},
                                                               g, nullptr, 1.0f, [](double*, std::size_t) {}, nullptr, ws);
  return 0;
}
