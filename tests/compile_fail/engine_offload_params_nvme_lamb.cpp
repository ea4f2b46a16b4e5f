// OffloadParams<Nvme> with the optimizer state in the compute space (Offload<None>) steps it
// sub-group by sub-group, its values written before the state steps, so that a failed shard write changes
// nothing; LAMB needs the whole partition's per-tensor norms at once, so it is refused in words.
// The control builds the same engine with AdamW.
#include "zerotk/engine.hpp"
using namespace zerotk;
#ifdef ZEROTK_FAILTEST_CONTROL
using E = Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, OffloadParams<Nvme>>;
#else
using E = Engine<Partitioner<Stage<3>>, Optimizer<Lamb>, OffloadParams<Nvme>>;
#endif
#include "engine_use.hpp"
