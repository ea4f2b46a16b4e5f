#pragma once
// examples/02_gpt/tensor_group.hpp: the model's tensor-parallel group (gpt::TensorParallel) over a
// zerotk communicator, with zerotk::parallel's region operators as its collectives: an all-reduce for
// "g" (and "f"'s backward), and under sequence parallel the all-gather and reduce-scatter of token
// rows. `tp` must outlive the model (the functions hold a reference to it).
#include <span>

#include <zerotk/comm/communicator.hpp>
#include <zerotk/parallel/region.hpp>

#include "gpt.hpp"

namespace gpt {

template <zerotk::comm::Communicator C>
TensorParallel tensor_parallel(C& tp, bool sequence_parallel) {
  TensorParallel t;
  t.size = tp.size();
  t.rank = tp.rank();
  t.sequence_parallel = sequence_parallel && tp.size() > 1;
  if (tp.size() == 1) return t;
  t.all_reduce = [&tp](std::span<float> x) { zerotk::parallel::ReduceFromRegion::forward(tp, x); };
  t.all_gather_rows = [&tp](std::span<const float> mine, std::span<float> all) {
    zerotk::parallel::GatherFirstDim::forward(tp, mine, all);
  };
  t.reduce_scatter_rows = [&tp](std::span<const float> partial, std::span<float> mine) {
    zerotk::parallel::ReduceScatterFirstDim::forward(tp, partial, mine);
  };
  return t;
}

}  // namespace gpt
