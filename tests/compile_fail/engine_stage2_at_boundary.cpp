// Stage 2 keeps only its gradient partition, so it cannot reduce once at the boundary.
#include "zerotk/engine.hpp"
using namespace zerotk;
#ifdef ZEROTK_FAILTEST_CONTROL
using P = Partitioner<Stage<1>, when::at_boundary>;
#else
using P = Partitioner<Stage<2>, when::at_boundary>;
#endif
int main() { return P::stage; }
