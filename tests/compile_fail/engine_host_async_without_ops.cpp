// Device<HostAsync> without device/host_async_ops.hpp is refused, saying which header to include.
#include "zerotk/engine.hpp"
using namespace zerotk;
#ifdef ZEROTK_FAILTEST_CONTROL
using E = Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Device<Host>>;
#else
using E = Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Device<HostAsync>>;
#endif
using B = E::ops_type;
int main() { return sizeof(B*) ? 0 : 1; }
