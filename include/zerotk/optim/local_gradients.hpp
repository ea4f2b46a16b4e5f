#pragma once
/// \file zerotk/optim/local_gradients.hpp
/// The 1-bit optimizers' switch of stage 0's gradient all-reduce (optim/onebit_exchange.hpp sets
/// it, the gradient paths read it: zero/grads/): while `on`, in the optimizer's compressed phase,
/// the all-reduce is skipped, each rank keeps its own gradients, and the bytes it would have sent
/// are counted (the uncompressed traffic the report compares against). Owned by the flat group.

#include <cstdint>

namespace zerotk::optim {

struct LocalGradients {
  bool on = false;
  std::uint64_t skipped_wire_bytes = 0;
};

}  // namespace zerotk::optim
