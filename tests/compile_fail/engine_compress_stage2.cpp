// Gradient compression replaces stage 0's gradient all-reduce: with stage 2 the first error says to
// use stage 0. The control builds stage 0 with top-k.
#include "zerotk/engine.hpp"
using namespace zerotk;
#ifdef ZEROTK_FAILTEST_CONTROL
using E = Engine<Partitioner<Stage<0>>, Optimizer<AdamW>, GradientCompression<TopK>>;
#else
using E = Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, GradientCompression<TopK>>;
#endif
#include "engine_use.hpp"
