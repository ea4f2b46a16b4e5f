// Sparsity prunes the master and the output where the host holds them: with Offload<Nvme> the first
// error says which stores it takes. The control builds it with Offload<Cpu>.
#include "zerotk/engine.hpp"
using namespace zerotk;
#ifdef ZEROTK_FAILTEST_CONTROL
using E = Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Offload<Cpu>, Sparsity<NofM<2, 4>>>;
#else
using E = Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Offload<Nvme>, Sparsity<NofM<2, 4>>>;
#endif
#include "engine_use.hpp"
