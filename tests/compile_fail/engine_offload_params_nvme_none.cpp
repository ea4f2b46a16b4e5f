// OffloadParams<Nvme> writes the parameter shard file during the step; only a host-side optimizer
// store (Offload<Cpu>, Offload<Nvme>) keeps its state unchanged until every write has gone through,
// so the optimizer state in the compute space (Offload<None>, the default) is refused in words.
// The control builds it with Offload<Cpu>.
#include "zerotk/engine.hpp"
using namespace zerotk;
#ifdef ZEROTK_FAILTEST_CONTROL
using E = Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, Offload<Cpu>, OffloadParams<Nvme>>;
#else
using E = Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, OffloadParams<Nvme>>;
#endif
#include "engine_use.hpp"
