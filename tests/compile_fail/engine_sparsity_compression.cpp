// Sparsity masks the reduced gradients; a compressed exchange of the optimizer's own is not masked:
// with 1-bit Adam the first error says so. The control builds stage 0 with AdamW.
#include "zerotk/engine.hpp"
using namespace zerotk;
#ifdef ZEROTK_FAILTEST_CONTROL
using E = Engine<Partitioner<Stage<0>>, Optimizer<AdamW>, Sparsity<NofM<2, 4>>>;
#else
using E = Engine<Partitioner<Stage<0>>, Optimizer<OneBitAdam>, Sparsity<NofM<2, 4>>>;
#endif
#include "engine_use.hpp"
