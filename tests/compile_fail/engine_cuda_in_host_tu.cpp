// Device<Cuda> in a translation unit not compiled by nvcc is refused, saying what to do.
#include "zerotk/engine.hpp"
using namespace zerotk;
#ifdef ZEROTK_FAILTEST_CONTROL
using E = Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Device<Host>>;
#else
using E = Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Device<Cuda>>;
#endif
using B = E::ops_type;
int main() { return sizeof(B*) ? 0 : 1; }
