// 0/1 Adam all-reduces (1-bit) gradients and accumulated updates every rank holds in full, in place
// of stage 0's gradient all-reduce: with stage 2 the first error says to use stage 0 (DeepSpeed
// asserts it too). The control builds stage 0.
#include "zerotk/engine.hpp"
using namespace zerotk;
#ifdef ZEROTK_FAILTEST_CONTROL
using E = Engine<Partitioner<Stage<0>>, Optimizer<ZeroOneAdam>>;
#else
using E = Engine<Partitioner<Stage<2>>, Optimizer<ZeroOneAdam>>;
#endif
#include "engine_use.hpp"
