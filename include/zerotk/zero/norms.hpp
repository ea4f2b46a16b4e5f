#pragma once
/// \file zerotk/zero/norms.hpp
/// Deprecated (0.2.0): this header only forwarded to the kernels' reproducible sum of squares. Use
/// kernels/host/reduce.hpp (`kernels::host::square_bound`, `add_squares`, `sum_squares`) and
/// kernels/elementwise.hpp (`kernels::SquareBound`, `NormGrid`, `FoldSums`, `combine`,
/// `fold_finish`): the same functions, the same bits. The protocol of a norm over ranks is written at
/// the top of kernels/host/reduce.hpp. Removed in 0.3.

#include <cstddef>
#include <span>

#include "zerotk/core/dtype.hpp"
#include "zerotk/kernels/elementwise.hpp"
#include "zerotk/kernels/host/reduce.hpp"
#include "zerotk/kernels/tensor_list.hpp"

namespace zerotk::zero {

using SquareBound [[deprecated("use kernels::SquareBound")]] = kernels::SquareBound;
using NormGrid [[deprecated("use kernels::NormGrid")]] = kernels::NormGrid;
using FoldSums [[deprecated("use kernels::FoldSums")]] = kernels::FoldSums;

[[deprecated("use kernels::combine")]] inline kernels::SquareBound combine(const kernels::SquareBound& a,
                                                                          const kernels::SquareBound& b) {
  return kernels::combine(a, b);
}
[[deprecated("use kernels::combine")]] inline kernels::FoldSums combine(const kernels::FoldSums& a,
                                                                       const kernels::FoldSums& b) {
  return kernels::combine(a, b);
}
template <FloatingElement T>
[[deprecated("use kernels::host::square_bound")]] kernels::SquareBound square_bound(const T* x, std::size_t n) {
  return kernels::host::square_bound(x, n);
}
template <FloatingElement T>
[[deprecated("use kernels::host::square_bound")]] kernels::SquareBound square_bound(
    std::span<const kernels::TensorRef<const T>> blocks) {
  return kernels::host::square_bound<T>(blocks);
}
template <FloatingElement T>
[[deprecated("use kernels::host::add_squares")]] void add_squares(const T* x, std::size_t n,
                                                                 const kernels::NormGrid& grid, kernels::FoldSums& acc) {
  kernels::host::add_squares(x, n, grid, acc);
}
template <FloatingElement T>
[[deprecated("use kernels::host::add_squares")]] void add_squares(std::span<const kernels::TensorRef<const T>> blocks,
                                                                 const kernels::NormGrid& grid, kernels::FoldSums& acc) {
  kernels::host::add_squares<T>(blocks, grid, acc);
}
[[deprecated("use kernels::fold_finish")]] inline double finish(const kernels::FoldSums& global) {
  return kernels::fold_finish(global);
}
template <FloatingElement T>
[[deprecated("use kernels::host::sum_squares")]] double sum_squares(const T* x, std::size_t n) {
  return kernels::host::sum_squares(x, n);
}

}  // namespace zerotk::zero
