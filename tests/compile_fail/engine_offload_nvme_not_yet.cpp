// Offload<Nvme> is named but not built yet: the first error says so (and nothing else cascades).
// The control builds Offload<Cpu> at stage 2.
#include "zerotk/engine.hpp"
using namespace zerotk;
#ifdef ZEROTK_FAILTEST_CONTROL
using E = Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Offload<Cpu>>;
#else
using E = Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Offload<Nvme>>;
#endif
#include "engine_use.hpp"
