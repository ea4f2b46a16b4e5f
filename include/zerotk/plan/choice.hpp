#pragma once
/// \file zerotk/plan/choice.hpp
/// One configuration the planner evaluates (stage x offload x precision x checkpointing) and the
/// engine's run-time settings that change its memory (EngineOptions' and DeepSpeed's keys).

#include <algorithm>
#include <cstddef>
#include <limits>
#include <string>
#include <string_view>

#include "zerotk/config/options.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/plan/activations.hpp"

namespace zerotk::plan {

enum class OffloadTarget { none, cpu, nvme };

constexpr std::string_view to_string(OffloadTarget t) noexcept {
  switch (t) {
    case OffloadTarget::none: return "none";
    case OffloadTarget::cpu: return "cpu";
    case OffloadTarget::nvme: return "nvme";
  }
  return "none";
}

inline config::OffloadDevice to_config(OffloadTarget t) {
  return t == OffloadTarget::none ? config::OffloadDevice::none
         : t == OffloadTarget::cpu ? config::OffloadDevice::cpu
                                   : config::OffloadDevice::nvme;
}

struct Choice {
  int stage = 0;
  OffloadTarget optimizer = OffloadTarget::none;  ///< offload_optimizer.device (stages 1-3)
  OffloadTarget param = OffloadTarget::none;      ///< offload_param.device (stage 3 only)
  DType precision = DType::fp16;
  CheckpointChoice checkpointing;

  /// e.g. "stage 2, offload_optimizer cpu, bf16, checkpointing every:2".
  std::string name() const {
    std::string s = "stage " + std::to_string(stage) + ", offload_optimizer " + std::string(to_string(optimizer));
    if (stage == 3) s += ", offload_param " + std::string(to_string(param));
    s += ", " + std::string(zerotk::to_string(precision)) + ", checkpointing " + checkpointing.name();
    return s;
  }
  /// Whether DeepSpeed (and zerotk's config reader) accept the combination at all.
  bool valid() const noexcept {
    if (stage < 0 || stage > 3) return false;
    if (stage == 0 && optimizer != OffloadTarget::none) return false;
    if (stage != 3 && param != OffloadTarget::none) return false;
    return true;
  }
  friend bool operator==(const Choice&, const Choice&) = default;
};

/// The engine's settings that change per-rank memory. Defaults are EngineOptions' and DeepSpeed's.
struct EngineSettings {
  // Out of line and out of -Wdeprecated-declarations' sight, so that only a use of bucket_bytes warns.
  EngineSettings();
  EngineSettings(const EngineSettings&);
  EngineSettings(EngineSettings&&) noexcept;
  EngineSettings& operator=(const EngineSettings&);
  EngineSettings& operator=(EngineSettings&&) noexcept;
  ~EngineSettings();

  /// Elements per gradient bucket, both groups (DeepSpeed's reduce_bucket_size, which the engine
  /// takes as it is); 0: DeepSpeed's default, 5e8.
  std::size_t reduce_bucket_size = 0;
  /// Deprecated: the bucket capacity in bytes of the working precision; a non-zero value is taken as
  /// bucket_bytes / element size elements.
  [[deprecated("use reduce_bucket_size (elements, as DeepSpeed counts it)")]] std::size_t bucket_bytes = 0;
  /// The bucket capacity in elements for an element of `element_bytes`.
  std::size_t bucket_numel(std::size_t element_bytes) const;
  int gradient_accumulation_steps = 1;
  /// Stages 0/1 with when::every_micro_step (their default is at_boundary; 2 and 3 always reduce
  /// every micro-step).
  bool reduce_every_micro_step = false;
  /// Reduced gradients accumulated in fp32 (EngineOptions' default) or in the working precision
  /// (a DeepSpeed config without data_types.grad_accum_dtype, read by engine_options).
  bool grad_accum_fp32 = true;
  int bucket_buffers = 2;
  /// Per-element moments the optimizer keeps beside the fp32 master: its tag's `moments`
  /// (policies.hpp): 2 for Adam, AdamW, LAMB and the 1-bit ones, 1 for Lion.
  std::size_t optimizer_moments = 2;
  std::size_t sub_group_size = 1'000'000'000;
  // stage 3 (Stage3Options)
  std::size_t prefetch_bucket_size = 50'000'000;
  std::size_t param_persistence_threshold = 100'000;
  std::size_t model_persistence_threshold = std::numeric_limits<std::size_t>::max();
  std::size_t max_live_parameters = 1'000'000'000;
  std::size_t max_reuse_distance = 1'000'000'000;
  bool reshard_after_forward = true;
  int hpz_partition_size = 1;  ///< zero_hpz_partition_size; 1: off
  /// Float Params over 16-bit storage (the GPT example): the engine keeps float compute copies.
  bool emulated = false;
  /// Where the engine's buffers live: MemorySpace::device on Device<Cuda>, host on Device<Host>.
  MemorySpace compute_space = MemorySpace::device;
  // NVMe (Offload<Nvme>, OffloadParams<Nvme>; docs/offload.md)
  std::size_t optimizer_buffer_count = 4;   ///< offload_optimizer.buffer_count
  bool optimizer_pipeline_read = false;     ///< offload_optimizer.pipeline_read
  bool optimizer_pipeline_write = false;    ///< offload_optimizer.pipeline_write
  std::size_t param_buffer_count = 5;       ///< offload_param.buffer_count
  std::size_t param_buffer_size = 100'000'000;  ///< offload_param.buffer_size, elements
  /// offload_param.max_in_cpu, elements kept in host memory. 0 here (DeepSpeed's default is 1e9):
  /// the planner offers nvme to save host memory, which a billion kept elements would not.
  std::size_t param_max_in_cpu = 0;
};

#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
inline EngineSettings::EngineSettings() = default;
inline EngineSettings::EngineSettings(const EngineSettings&) = default;
inline EngineSettings::EngineSettings(EngineSettings&&) noexcept = default;
inline EngineSettings& EngineSettings::operator=(const EngineSettings&) = default;
inline EngineSettings& EngineSettings::operator=(EngineSettings&&) noexcept = default;
inline EngineSettings::~EngineSettings() = default;
inline std::size_t EngineSettings::bucket_numel(std::size_t element_bytes) const {
  if (reduce_bucket_size) return reduce_bucket_size;
  if (bucket_bytes) return std::max<std::size_t>(1, bucket_bytes / element_bytes);
  return 500'000'000;
}
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

}  // namespace zerotk::plan
