// OffloadParams<Cpu> on a device keeps stage 3's shard in host memory, which a step on the device
// (Offload<None>) cannot write: the first error names the Offload policies that step on the host.
// The control builds the same combination on Device<Host>, where the shard is the compute space's.
#include "zerotk/device/host_async_ops.hpp"
#include "zerotk/engine.hpp"
using namespace zerotk;
#ifdef ZEROTK_FAILTEST_CONTROL
using E = Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, OffloadParams<Cpu>, Device<Host>>;
#else
using E = Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, OffloadParams<Cpu>, Device<HostAsync>>;
#endif
#include "engine_use.hpp"
