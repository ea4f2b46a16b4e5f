#pragma once
/// \file zerotk/parallel.hpp
/// Tensor parallelism's building blocks (host): shard layouts, the region operators, column- and
/// row-parallel linear, vocab-parallel embedding and cross-entropy, the tensor-parallel RNG.
/// The CUDA kernels are in zerotk/parallel/cuda/kernels.cuh (nvcc only). docs/parallel.md
#include "zerotk/parallel/elementwise.hpp"
#include "zerotk/parallel/linear.hpp"
#include "zerotk/parallel/region.hpp"
#include "zerotk/parallel/rng.hpp"
#include "zerotk/parallel/split.hpp"
#include "zerotk/parallel/split_param.hpp"
#include "zerotk/parallel/vocab.hpp"
