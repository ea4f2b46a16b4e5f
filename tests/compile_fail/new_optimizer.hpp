// A new optimizer as a user would add one: its own tag, groups and step count (optim::detail::OptimizerCore),
// and no kernels yet. Shared by optimizer_without_kernels.cpp (host) and optimizer_without_cuda_kernels.cu.
#pragma once
#include "zerotk/optim/optimizer.hpp"

struct Sgd {};
template <>
class zerotk::Optimizer<Sgd> : public zerotk::optim::detail::OptimizerCore {
 public:
  using policy_kind = zerotk::policy::optimizer;
  using tag = Sgd;
  using OptimizerCore::OptimizerCore;
};
