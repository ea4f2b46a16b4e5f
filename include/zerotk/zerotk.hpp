#pragma once
/// \file zerotk/zerotk.hpp
/// Umbrella header. Includes every layer whose dependencies this build has; layers that need an
/// optional package (Eigen, MPI, CUDA, ...) are included only when its feature macro is 1.
#include "zerotk/comm.hpp"
#include "zerotk/core.hpp"
#if ZEROTK_HAS_EIGEN
#include "zerotk/core/eigen.hpp"
#endif
