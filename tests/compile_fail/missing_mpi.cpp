// zerotk/comm/mpi.hpp in a build without MPI (its ZEROTK_HAS_* macro is 0): the first error must say what
// to define or link.
#include "zerotk/comm/mpi.hpp"
