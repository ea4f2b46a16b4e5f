// dtype_of<long double> has no DType: a static_assert with words, not a missing-member error.
#include "zerotk/core/dtype.hpp"
#ifdef ZEROTK_FAILTEST_CONTROL
constexpr auto d = zerotk::dtype_of_v<float>;
#else
constexpr auto d = zerotk::dtype_of_v<long double>;
#endif
int main() { return static_cast<int>(d); }
