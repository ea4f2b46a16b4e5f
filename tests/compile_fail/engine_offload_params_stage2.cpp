// OffloadParams<Cpu> (and <Nvme>) offload stage 3's parameter shards: below stage 3 the first error says so
// (DeepSpeed ignores offload_param there). The control builds stage 3.
#include "zerotk/engine.hpp"
using namespace zerotk;
#ifdef ZEROTK_FAILTEST_CONTROL
using E = Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, OffloadParams<Cpu>>;
#else
using E = Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, OffloadParams<Cpu>>;
#endif
#include "engine_use.hpp"
