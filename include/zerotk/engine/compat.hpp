#pragma once
/// \file zerotk/engine/compat.hpp
/// Which policy combinations an Engine can be built from, as one table of rules in words. A rule
/// that a feature lifts is deleted here when the feature lands; nothing else in the engine checks
/// policies against each other.

#include <type_traits>

#include "zerotk/policies.hpp"

namespace zerotk::engine {

template <class Partitioner, class Optimizer, class Precision, class Offload, class Device,
          class OffloadParams = ::zerotk::OffloadParams<None>,
          class GradientCompression = ::zerotk::GradientCompression<None>>
struct Compat {
  static constexpr bool kCpu = std::is_same_v<typename Offload::tag, Cpu>;
  static constexpr bool kNvme = std::is_same_v<typename Offload::tag, Nvme>;
  static_assert(!kCpu || Partitioner::stage >= 1,
                "Engine: Offload<Cpu> (offload_optimizer) needs a partitioned optimizer state: use "
                "Partitioner<Stage<1>>, <2> or <3> (DeepSpeed: ZeRO stage >= 1)");
  static_assert(!kNvme || Partitioner::stage >= 1,
                "Engine: Offload<Nvme> (offload_optimizer) needs a partitioned optimizer state: use "
                "Partitioner<Stage<1>>, <2> or <3> (DeepSpeed: ZeRO stage >= 1)");
  // The stores step sub-group by sub-group for optimizer offload, and for a parameter shard file
  // (offload/writer_passes.hpp): only elementwise optimizers give one fused step's bits that way.
  static_assert(!(kCpu || kNvme || std::is_same_v<typename OffloadParams::tag, Nvme>) ||
                    !std::is_same_v<policy_tag_t<Optimizer>, Lamb>,
                "Engine: Offload<Cpu>, Offload<Nvme> and OffloadParams<Nvme> step the optimizer sub-group by "
                "sub-group and support Optimizer<Adam> and Optimizer<AdamW>; Optimizer<Lamb> needs the whole "
                "partition's per-tensor norms at once (use Offload<None> with OffloadParams<None> or "
                "OffloadParams<Cpu>)");
  static_assert(std::is_same_v<typename OffloadParams::tag, None> || Partitioner::stage == 3,
                "Engine: OffloadParams<Cpu> and OffloadParams<Nvme> (offload_param) offload the parameter shards of "
                "Partitioner<Stage<3>>; stages 0-2 keep every parameter in the compute space (DeepSpeed ignores "
                "offload_param there too)");
  static_assert(std::is_same_v<typename OffloadParams::tag, None> || std::is_same_v<typename Device::tag, Host>,
                "Engine: OffloadParams<Cpu> and OffloadParams<Nvme> with Device<Cuda> are not available yet "
                "(Device<Host> only)");
  // The 1-bit optimizers: 1-bit Adam, 0/1 Adam and 1-bit LAMB.
  static constexpr bool kOneBit = std::is_same_v<policy_tag_t<Optimizer>, OneBitAdam> ||
                                  std::is_same_v<policy_tag_t<Optimizer>, ZeroOneAdam> ||
                                  std::is_same_v<policy_tag_t<Optimizer>, OneBitLamb>;
  static_assert(!kOneBit || Partitioner::stage == 0,
                "Engine: Optimizer<OneBitAdam>, Optimizer<ZeroOneAdam> and Optimizer<OneBitLamb> compress what every rank holds in full "
                "(momentum, gradient, accumulated update) in place of stage 0's gradient all-reduce; use "
                "Partitioner<Stage<0>> (DeepSpeed asserts ZeRO stage 0 for all three too)");
  static_assert(!kOneBit || std::is_same_v<typename Device::tag, Host>,
                "Engine: Optimizer<OneBitAdam>, Optimizer<ZeroOneAdam> and Optimizer<OneBitLamb> with Device<Cuda> are not available yet "
                "(their compressed exchange runs on host memory); use Device<Host>");
  static constexpr bool kCompressed = !std::is_same_v<typename GradientCompression::tag, None>;
  static_assert(!kCompressed || Partitioner::stage == 0,
                "Engine: GradientCompression<TopK|TwoBit|Sign> replaces stage 0's gradient all-reduce; use "
                "Partitioner<Stage<0>> (stages 1-3 reduce-scatter into partitions, which no codec does yet)");
  static_assert(!kCompressed || std::is_same_v<typename Partitioner::when, when::at_boundary>,
                "Engine: GradientCompression compresses the accumulated gradient once per optimizer step; use "
                "Partitioner<Stage<0>> with when::at_boundary (its default)");
  static_assert(!kCompressed || !kOneBit,
                "Engine: Optimizer<OneBitAdam>, Optimizer<ZeroOneAdam> and Optimizer<OneBitLamb> already compress their own exchanges; use "
                "GradientCompression<None> with them");
  static_assert(!kCompressed || std::is_same_v<typename Device::tag, Host>,
                "Engine: GradientCompression with Device<Cuda> is not available yet (its codecs run on host memory); "
                "use Device<Host>");
  static constexpr bool value = true;
};

}  // namespace zerotk::engine
