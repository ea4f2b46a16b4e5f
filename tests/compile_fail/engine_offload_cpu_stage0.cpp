// Offload<Cpu> offloads a partitioned optimizer state: with stage 0 the first error says to use
// stage 1 or 2 (DeepSpeed: offload_optimizer needs ZeRO stage >= 1). The control builds stage 1.
#include "zerotk/engine.hpp"
using namespace zerotk;
#ifdef ZEROTK_FAILTEST_CONTROL
using E = Engine<Partitioner<Stage<1>>, Optimizer<AdamW>, Offload<Cpu>>;
#else
using E = Engine<Partitioner<Stage<0>>, Optimizer<AdamW>, Offload<Cpu>>;
#endif
#include "engine_use.hpp"
