// 1-bit Adam already compresses its exchange: with a gradient codec too the first error says to drop
// one. The control builds 1-bit Adam alone.
#include "zerotk/engine.hpp"
using namespace zerotk;
#ifdef ZEROTK_FAILTEST_CONTROL
using E = Engine<Partitioner<Stage<0>>, Optimizer<OneBitAdam>, GradientCompression<None>>;
#else
using E = Engine<Partitioner<Stage<0>>, Optimizer<OneBitAdam>, GradientCompression<Sign>>;
#endif
#include "engine_use.hpp"
