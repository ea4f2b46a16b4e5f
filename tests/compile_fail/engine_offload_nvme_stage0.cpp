// Offload<Nvme> swaps a partitioned optimizer state: with stage 0 the first error says to use stage
// 1, 2 or 3 (DeepSpeed: offload_optimizer needs ZeRO stage >= 1). The control builds stage 3.
#include "zerotk/engine.hpp"
using namespace zerotk;
#ifdef ZEROTK_FAILTEST_CONTROL
using E = Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, Offload<Nvme>>;
#else
using E = Engine<Partitioner<Stage<0>>, Optimizer<AdamW>, Offload<Nvme>>;
#endif
#include "engine_use.hpp"
