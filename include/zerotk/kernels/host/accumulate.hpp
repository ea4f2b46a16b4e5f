#pragma once
/// \file zerotk/kernels/host/accumulate.hpp
/// Gradient accumulation on the host: acc[i] = A(float(acc[i]) + float(x[i])).
///
/// One fold serves every accumulation the engine does: an fp32 accumulator over reduced micro-step
/// gradients (A = float), DeepSpeed's accumulation in the working precision (A = half/bfloat16: each
/// addition rounded to 16 bits), and 16-bit gradient storage filled from a float compute copy
/// (A = 16-bit, X = float). The CUDA kernel (kernels/cuda/accumulate.cuh) rounds identically.

#include <cstddef>

#include "zerotk/core/dtype.hpp"
#include "zerotk/core/macros.hpp"

namespace zerotk::kernels::host {

template <class A, class X>
void accumulate(A* ZEROTK_RESTRICT acc, const X* ZEROTK_RESTRICT x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) acc[i] = from_float<A>(to_float(acc[i]) + to_float(x[i]));
}

}  // namespace zerotk::kernels::host
