// Stage 3 keeps only its gradient partition too, so it cannot reduce once at the boundary.
#include "zerotk/engine.hpp"
using namespace zerotk;
#ifdef ZEROTK_FAILTEST_CONTROL
using P = Partitioner<Stage<3>>;
#else
using P = Partitioner<Stage<3>, when::at_boundary>;
#endif
int main() { return P::stage; }
