// An Engine without an Optimizer policy is refused with an example of one.
#include "zerotk/engine.hpp"
using namespace zerotk;
#ifdef ZEROTK_FAILTEST_CONTROL
using E = Engine<Precision<fp16>, Partitioner<Stage<1>>, Optimizer<Lamb>>;
#else
using E = Engine<Precision<fp16>, Partitioner<Stage<1>>>;
#endif
constexpr int stage = E::kStage;
int main() { return stage == 1 ? 0 : 1; }
