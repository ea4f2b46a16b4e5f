#pragma once
/// \file zerotk/engine/optimizer_comm.hpp
/// The optimizers' own communication parts as the engine names them: defined next to the
/// optimizers, in optim/onebit_exchange.hpp (PlainOptimizerComm, OneBitMomentum, ZeroOneExchange,
/// OneBitLambExchange, OptimizerCommOf).

#include "zerotk/optim/onebit_exchange.hpp"

namespace zerotk::engine {

using optim::OneBitLambExchange;
using optim::OneBitMomentum;
using optim::OptimizerCommOf;
using optim::PlainOptimizerComm;
using optim::ZeroOneExchange;

}  // namespace zerotk::engine
