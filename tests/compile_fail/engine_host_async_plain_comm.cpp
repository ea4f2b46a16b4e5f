// Device<HostAsync> on a communicator that does not run on a host_async stream (a plain threads
// communicator) is refused, naming the one to use. The control builds the Device<Host> engine.
#include "zerotk/device/host_async_ops.hpp"
#include "zerotk/engine.hpp"
using namespace zerotk;
#ifdef ZEROTK_FAILTEST_CONTROL
using E = Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Device<Host>>;
#else
using E = Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Device<HostAsync>>;
#endif
#include "engine_use.hpp"
