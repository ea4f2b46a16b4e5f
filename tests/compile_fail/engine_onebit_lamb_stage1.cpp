// 1-bit LAMB exchanges the momentum every rank holds in full, in place of stage 0's gradient
// all-reduce: with stage 1 the first error says to use stage 0 (DeepSpeed asserts it too). The
// control builds stage 0.
#include "zerotk/engine.hpp"
using namespace zerotk;
#ifdef ZEROTK_FAILTEST_CONTROL
using E = Engine<Partitioner<Stage<0>>, Optimizer<OneBitLamb>>;
#else
using E = Engine<Partitioner<Stage<1>>, Optimizer<OneBitLamb>>;
#endif
#include "engine_use.hpp"
