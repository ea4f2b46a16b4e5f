// zerotk/core/cuda.hpp in a build without the CUDA runtime (its ZEROTK_HAS_* macro is 0): the first error must say what
// to define or link.
#include "zerotk/core/cuda.hpp"
