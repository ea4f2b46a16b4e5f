// Stage 3 is named but not built yet: the first error says so (and nothing else cascades).
#include "zerotk/engine.hpp"
using namespace zerotk;
#ifdef ZEROTK_FAILTEST_CONTROL
using E = Engine<Partitioner<Stage<2>>, Optimizer<AdamW>>;
#else
using E = Engine<Partitioner<Stage<3>>, Optimizer<AdamW>>;
#endif
#include "engine_use.hpp"
