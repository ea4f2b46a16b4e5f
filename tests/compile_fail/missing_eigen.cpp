// zerotk/core/eigen.hpp in a build without Eigen (its ZEROTK_HAS_* macro is 0): the first error must say what
// to define or link.
#include "zerotk/core/eigen.hpp"
