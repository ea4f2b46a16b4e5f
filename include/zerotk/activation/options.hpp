#pragma once
/// \file zerotk/activation/options.hpp
/// Options of activation checkpointing, and how DeepSpeed's `activation_checkpointing` block maps to
/// them (docs/activation.md):
///
///   cpu_checkpointing                saved inputs go to page-locked host memory, copied there and
///                                    back on a background thread (the copy back starts when the layer
///                                    above begins its backward)
///   contiguous_memory_optimization   saved inputs live in one arena of number_checkpoints slots
///   number_checkpoints               the arena's slot count (required with the one above)
///   synchronize_checkpoint_boundary  calls Checkpointing::synchronize (the device's synchronise; a
///                                    no-op on Device<Host>) before and after each checkpointed layer
///   profile                          times each layer's recompute; Checkpointing::profile_report()
///   partition_activations            splits saved inputs across tensor-parallel ranks in DeepSpeed;
///                                    zerotk has no tensor parallelism (a group of one rank), so it
///                                    changes nothing and the config reader says so in a note
///
/// Which layers are checkpointed is the model's choice (activation/select.hpp), as in DeepSpeed,
/// where the model calls checkpoint() around the layers it picks.

#include <cstdint>

#include "zerotk/config/options.hpp"

namespace zerotk::activation {

struct Options {
  bool cpu_checkpointing = false;
  bool contiguous_memory = false;
  std::int64_t number_checkpoints = 0;  ///< arena slots; used with contiguous_memory
  bool synchronize_boundary = false;
  bool profile = false;

  /// From a read DeepSpeed config (the reader has validated the block).
  static Options from(const config::Config& c) {
    const auto& a = c.activation_checkpointing;
    Options o;
    o.cpu_checkpointing = a.cpu_checkpointing;
    o.contiguous_memory = a.contiguous_memory_optimization;
    o.number_checkpoints = a.number_checkpoints.value_or(0);
    o.synchronize_boundary = a.synchronize_checkpoint_boundary;
    o.profile = a.profile;
    return o;
  }
};

}  // namespace zerotk::activation
