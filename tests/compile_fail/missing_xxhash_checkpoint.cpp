// zerotk/checkpoint.hpp in a build without libxxhash (its ZEROTK_HAS_* macro is 0): the first error must say what
// to define or link.
#include "zerotk/checkpoint.hpp"
