// zerotk/comm/nccl.hpp in a build without NCCL (its ZEROTK_HAS_* macro is 0): the first error must say what
// to define or link.
#include "zerotk/comm/nccl.hpp"
