#pragma once
/// \file zerotk/precision.hpp
/// The precision layer: loss-scaling policies (LossScaler<Dynamic|Static|None>) and the
/// cross-rank overflow agreement.
#include "zerotk/precision/loss_scaler.hpp"
#include "zerotk/precision/overflow.hpp"
