#pragma once
/// \file zerotk/engine/boundary.hpp
/// The boundary's global reduction: one pass for the bound, one for the sum.
///
///   phase 1   every rank: the largest square and "any inf/NaN" over its share of the gradients;
///             one fp64 all-reduce (max) of {largest square, non-finite flag}: every rank now knows
///             whether the step overflows (DeepSpeed's overflow agreement) without a second check
///   phase 2   from the global bound, a grid (kernels::NormGrid, kernels/elementwise.hpp) on which every square is added
///             exactly; one fp64 all-reduce (sum) of {fold sums, loss}
///
/// Because the sum is exact on the grid, the global sum of squares does not depend on how the
/// gradients are cut into buckets, blocks or shards, on the order of any addition, on threads or on
/// the device: every ZeRO stage, host or CUDA, gets the same bits (DESIGN.md, decisions).
///
/// Both reductions run over `norm`, every rank the parameters span (engine/comms.hpp): with a
/// process grid its world, where phase 1 agrees on overflow over every rank and phase 2 adds each
/// element once (engine/norm_share.hpp, NormShare: one tensor rank adds what every tensor rank holds
/// whole, and the loss; every tensor rank adds its shards of split parameters). A rank that adds
/// nothing sends zeros, which change no sum.

#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/engine/comms.hpp"
#include "zerotk/engine/norm_share.hpp"
#include "zerotk/kernels/elementwise.hpp"
#include "zerotk/kernels/tensor_list.hpp"

namespace zerotk::engine {

struct GlobalNorm {
  bool nonfinite = false;    ///< some rank's gradients hold inf or NaN: the step overflows
  double sum_squares = 0.0;  ///< of every rank's owned gradients (0 when nonfinite)
  double loss_sum = 0.0;     ///< sum over ranks of the `loss` arguments
};

/// `each_group(f)` calls f(group) for each flat group; a group offers
/// `with_norm_blocks(g)` calling g(std::span<const kernels::TensorRef<const E>>).
/// `count_bound`: an upper bound on the number of elements added over all ranks, equal on every rank.
/// `rank_local`: the gradients differ by rank (1-bit Adam's compressed phase) and each rank's share is its
/// whole buffer: the sum of squares is then this rank's own (not summed over ranks), while the
/// non-finite flag is still agreed by all (so every rank skips the same steps). (The 1-bit
/// optimizers run on a data group alone: engine/compat.hpp.)
template <class Comm, class Ops, class EachGroup>
GlobalNorm global_norm(Comm& comm, const NormShare& share, Ops& ops, std::size_t count_bound, double loss,
                       EachGroup&& each_group, bool rank_local = false) {
  kernels::SquareBound local;
  each_group([&](auto& g) { g.with_norm_blocks([&](auto blocks) { local = kernels::combine(local, ops.square_bound(blocks)); }); });
  double bound[2] = {local.nonfinite ? 0.0 : local.max_square, local.nonfinite ? 1.0 : 0.0};
  comm.all_reduce_host(bound, bound, 2, comm::ReduceOp::max);

  GlobalNorm r;
  r.nonfinite = bound[1] != 0.0;
  kernels::FoldSums folds;
  loss = share.loss_addend(loss, rank_local);
  if (!r.nonfinite) {  // each group hands over only what this rank counts (with_norm_blocks' `counted`)
    const kernels::NormGrid grid = kernels::NormGrid::make(bound[0], count_bound);
    each_group([&](auto& g) {
      g.with_norm_blocks([&](auto blocks) { ops.add_squares(blocks, grid, folds); }, /*counted=*/true);
    });
  }
  constexpr std::size_t kFolds = std::size(kernels::FoldSums{}.fold);
  double sums[kFolds + 1];
  for (std::size_t i = 0; i < kFolds; ++i) sums[i] = folds.fold[i];
  sums[kFolds] = loss;
  if (rank_local) {
    comm.all_reduce_host(sums + kFolds, sums + kFolds, 1, comm::ReduceOp::sum);
  } else {
    comm.all_reduce_host(sums, sums, kFolds + 1, comm::ReduceOp::sum);
  }
  for (std::size_t i = 0; i < kFolds; ++i) folds.fold[i] = sums[i];
  r.sum_squares = r.nonfinite ? 0.0 : kernels::fold_finish(folds);
  r.loss_sum = sums[kFolds];
  return r;
}

}  // namespace zerotk::engine
