#pragma once
/// \file zerotk/zero/norms.hpp
/// The global gradient norm, bitwise identical whatever the partitioning (ZeRO stages 0-3 put the
/// same gradient elements into different buckets, shards and ranks), the thread count, the ISA, and
/// host vs CUDA: a reproducible binned sum of squares (the scheme, its grid and its error bound are
/// in kernels/elementwise.hpp, section "reproducible sum of squares"). Per boundary step:
///
///   // every rank, over the gradient elements it owns (any split into blocks):
///   zero::SquareBound b = zero::square_bound<T>(owned_blocks);            // phase 1, local
///   all-reduce max of b.max_square  (+inf carries "some element is inf/NaN"; or all-reduce the flag)
///   if (global nonfinite) -> overflow: skip the step, the norm is not needed
///   auto grid = zero::NormGrid::make(global_max_square, global_count);    // same inputs on every rank
///   zero::FoldSums f;  zero::add_squares<T>(owned_blocks, grid, f);       // phase 2, local
///   all-reduce sum of f.fold[0..3)   (plain fp64: the values are exact multiples, any order is exact)
///   double sum_squares = zero::finish(global_f);
///
/// `global_count` is any bound on the number of elements summed over all ranks that every rank
/// agrees on (the model's gradient element count; padding zeros may be counted or not). The result
/// depends on it only through ceil(log2(global_count)), and it must be <= 2^44.
/// CUDA: kernels::cuda::square_bound / add_squares over a TensorRef list give the same bits.

#include <cstddef>
#include <cstdint>
#include <span>

#include "zerotk/core/dtype.hpp"
#include "zerotk/kernels/elementwise.hpp"
#include "zerotk/kernels/host/reduce.hpp"
#include "zerotk/kernels/tensor_list.hpp"

namespace zerotk::zero {

using kernels::FoldSums;
using kernels::NormGrid;
using kernels::SquareBound;

/// Phase 1 result of the union of two sets of elements (max of the squares, or of the flags).
inline SquareBound combine(const SquareBound& a, const SquareBound& b) { return kernels::combine(a, b); }
/// Fold sums of the union of two disjoint sets of elements (exact).
inline FoldSums combine(const FoldSums& a, const FoldSums& b) { return kernels::combine(a, b); }

/// Phase 1 over x[0..n) (float, half or bfloat16): the largest square and the inf/NaN flag.
template <FloatingElement T>
SquareBound square_bound(const T* x, std::size_t n) {
  return kernels::host::square_bound(x, n);
}
/// Phase 1 over a list of blocks taken together.
template <FloatingElement T>
SquareBound square_bound(std::span<const kernels::TensorRef<const T>> blocks) {
  return kernels::host::square_bound<T>(blocks);
}

/// Phase 2: acc += the fold sums of x[0..n) on `grid` (made from the GLOBAL bound and count).
template <FloatingElement T>
void add_squares(const T* x, std::size_t n, const NormGrid& grid, FoldSums& acc) {
  kernels::host::add_squares(x, n, grid, acc);
}
/// Phase 2 over a list of blocks taken together.
template <FloatingElement T>
void add_squares(std::span<const kernels::TensorRef<const T>> blocks, const NormGrid& grid, FoldSums& acc) {
  kernels::host::add_squares<T>(blocks, grid, acc);
}

/// The sum of squares from the all-reduced (global) fold sums; fold0 + (fold1 + fold2) everywhere.
inline double finish(const FoldSums& global) { return kernels::fold_finish(global); }

/// Both phases over n elements on one rank (the grid from their own max and count): a sum of squares
/// that depends only on the values, not on the thread count, alignment or position in memory.
/// +inf when an element is inf or NaN (squares of finite 16/32-bit floats never overflow fp64).
template <FloatingElement T>
double sum_squares(const T* x, std::size_t n) {
  return kernels::host::sum_squares(x, n);
}

}  // namespace zerotk::zero
