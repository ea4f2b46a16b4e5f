#pragma once
/// \file zerotk/kernels/cuda.cuh
/// The CUDA kernels (namespace zerotk::kernels::cuda), compiled with nvcc (target zerotk::cuda):
/// fused Adam/AdamW and LAMB over lists of thousands of tensors in one launch, casts, scaling,
/// sums of squares and the inf/NaN flag with CUB block reductions, batched flatten/unflatten, the
/// accumulation folds of the engine.
#include "zerotk/kernels/cuda/accumulate.cuh"
#include "zerotk/kernels/cuda/adam.cuh"
#include "zerotk/kernels/cuda/cast.cuh"
#include "zerotk/kernels/cuda/elementwise_step.cuh"
#include "zerotk/kernels/cuda/flatten.cuh"
#include "zerotk/kernels/cuda/lamb.cuh"
#include "zerotk/kernels/cuda/multi_tensor.cuh"
#include "zerotk/kernels/cuda/reduce.cuh"
