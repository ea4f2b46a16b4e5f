#pragma once
/// \file zerotk/engine/compat.hpp
/// Which policy combinations an Engine can be built from, as one table of rules in words. A rule
/// that a feature lifts is deleted here when the feature lands; nothing else in the engine checks
/// policies against each other.

#include <type_traits>

#include "zerotk/policies.hpp"

namespace zerotk::engine {

template <class Partitioner, class Optimizer, class Precision, class Offload, class Device>
struct Compat {
  static_assert(Partitioner::stage <= 2,
                "Engine: Partitioner<Stage<3>> (ZeRO stage 3) is not available yet; use Stage<0>, Stage<1> or Stage<2>");
  static_assert(std::is_same_v<typename Offload::tag, None>,
                "Engine: Offload<Cpu> and Offload<Nvme> are not available yet; use Offload<None>");
  static constexpr bool value = true;
};

}  // namespace zerotk::engine
