// Param<double> is refused: zerotk stores parameters as float, half or bfloat16.
#include "zerotk/core/param.hpp"
#ifdef ZEROTK_FAILTEST_CONTROL
zerotk::Param<float> p;
#else
zerotk::Param<double> p;
#endif
int main() { return 0; }
