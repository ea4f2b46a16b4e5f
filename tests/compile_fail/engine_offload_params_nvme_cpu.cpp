// OffloadParams<Nvme> writes the parameter shard file during the step; only with Offload<Nvme> can a
// failed write leave the whole step undone, so another optimizer store is refused in words.
// The control builds it with Offload<Nvme>.
#include "zerotk/engine.hpp"
using namespace zerotk;
#ifdef ZEROTK_FAILTEST_CONTROL
using E = Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, Offload<Nvme>, OffloadParams<Nvme>>;
#else
using E = Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, Offload<Cpu>, OffloadParams<Nvme>>;
#endif
#include "engine_use.hpp"
