// A policy slot filled twice (two Precisions) is refused, naming the slot.
#include "zerotk/engine.hpp"
using namespace zerotk;
#ifdef ZEROTK_FAILTEST_CONTROL
using E = Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Precision<bf16>>;
#else
using E = Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Precision<bf16>, Precision<fp16>>;
#endif
constexpr int stage = E::kStage;
int main() { return stage == 2 ? 0 : 1; }
