#pragma once
/// \file zerotk/kernels/host.hpp
/// The host kernel drivers (namespace zerotk::kernels::host): fused Adam/AdamW and LAMB, casts,
/// scaling, sums of squares and inf/NaN checks, flatten/unflatten. OpenMP across threads (when the
/// zerotk::openmp component is linked), AVX2/AVX-512 chosen at run time, no compiler flags needed.
#include "zerotk/kernels/elementwise.hpp"
#include "zerotk/kernels/host/adam.hpp"
#include "zerotk/kernels/host/cast.hpp"
#include "zerotk/kernels/host/elementwise_step.hpp"
#include "zerotk/kernels/host/flatten.hpp"
#include "zerotk/kernels/host/lamb.hpp"
#include "zerotk/kernels/host/parallel.hpp"
#include "zerotk/kernels/host/reduce.hpp"
#include "zerotk/kernels/host/simd.hpp"
#include "zerotk/kernels/tensor_list.hpp"
