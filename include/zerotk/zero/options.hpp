#pragma once
/// \file zerotk/zero/options.hpp
/// The ZeRO paths' run-time options, each part's own struct with its own check (CUTLASS's
/// Arguments + can_implement): the buckets and their overlap (BucketOptions), stage 3's fetching
/// (Stage3Options). EngineOptions (engine/options.hpp) is composed of them; the config reader fills
/// them from DeepSpeed's keys, which the members' comments name. Sizes count ELEMENTS, as in
/// DeepSpeed.

#include <cstddef>
#include <string>
#include <vector>

#include "zerotk/core/error.hpp"

namespace zerotk::zero {

/// Gradient buckets and what overlaps what (DeepSpeed's `zero_optimization` keys).
struct BucketOptions {
  /// Elements per gradient bucket, the same in both flat groups (`reduce_bucket_size`); 0 takes
  /// the Bucketer policy's bytes over the working precision's element size.
  std::size_t reduce_bucket_size = 0;
  /// Reduce full buckets while backward goes on (`overlap_comm`; false: each full bucket is reduced
  /// and waited for before backward continues, so step time is compute + communication).
  bool overlap_comm = true;
  /// Stages 1/2: do not wait in step() for the all-gather of the updated parameters; each layer's
  /// forward (or backward) scope waits for the buckets holding its own parameters, so the gather
  /// overlaps the next forward. Outside scopes, parameter values are valid after `synchronize()`.
  bool overlap_param_gather = false;
  /// Stage 2: bucket buffers in the pool (>= 2 double-buffers communication against backward). The
  /// pool grows when one layer's parameters span more buckets than it holds.
  int bucket_buffers = 2;

  void check(std::vector<config_error>& out) const {
    if (bucket_buffers < 1) out.emplace_back("must be >= 1", "bucket_buffers", std::to_string(bucket_buffers));
  }
};

/// Stage 3: where a layer's parameters go after its forward, FSDP2's `reshard_after_forward =
/// True | False | int g`. A bool converts to it, so `o.stage3.reshard_after_forward = false` reads
/// as before; `if (!r)` is true only for "keep gathered".
///
///   group_size()  0: keep gathered until the backward (false)
///                 1: back to the primary shards over all W ranks (true; hpZ off)
///                 g > 1: hpZ: also a secondary shard within each group of g consecutive ranks
///                        ([i g, (i+1) g)); the backward gathers inside the group. g must divide W;
///                        g = W is allowed and makes the secondary the primary's twin (same bytes as
///                        off, the gathers on a communicator of its own, S Psi_pad / W more memory).
class ReshardAfterForward {
 public:
  constexpr ReshardAfterForward(bool reshard = true) noexcept : group_size_(reshard ? 1 : 0) {}  // implicit: a bool converts
  /// hpZ with groups of g ranks (`zero_hpz_partition_size`); group(1) is plain `true`. The engine
  /// checks g >= 1 and that g divides the world size.
  static constexpr ReshardAfterForward group(int g) noexcept {
    ReshardAfterForward r;
    r.group_size_ = g;
    return r;
  }
  constexpr int group_size() const noexcept { return group_size_; }
  /// A secondary shard is kept (g > 1).
  constexpr bool hierarchical() const noexcept { return group_size_ > 1; }
  /// False only for "keep gathered until the backward".
  constexpr explicit operator bool() const noexcept { return group_size_ != 0; }
  friend constexpr bool operator==(ReshardAfterForward, ReshardAfterForward) noexcept = default;

 private:
  int group_size_ = 1;
};

/// ZeRO stage 3's run-time settings (DeepSpeed's `stage3_*` keys; sizes count elements). Ignored
/// below stage 3.
struct Stage3Options {
  /// Elements gathered ahead of use, following the order recorded in the previous micro-step
  /// (`stage3_prefetch_bucket_size`); 0 disables prefetching.
  std::size_t prefetch_bucket_size = 50'000'000;
  /// Parameters of at most this many elements stay gathered (`stage3_param_persistence_threshold`).
  std::size_t param_persistence_threshold = 100'000;
  /// At most this many elements in all are persistent, first come first served in visitation order
  /// (`stage3_model_persistence_threshold`).
  std::size_t model_persistence_threshold = static_cast<std::size_t>(-1);
  /// Gathered elements that prefetching and reuse may hold besides what open scopes need
  /// (`stage3_max_live_parameters`).
  std::size_t max_live_parameters = 1'000'000'000;
  /// A released bucket that the recorded order needs again within this many fetched elements stays
  /// gathered (`stage3_max_reuse_distance`); 0 releases at once.
  std::size_t max_reuse_distance = 1'000'000'000;
  /// What a layer's parameters go back to after its forward (FSDP2's `reshard_after_forward`):
  /// true (the default) their shards over all W ranks, 3 Psi of traffic per step; false: nothing,
  /// they stay gathered until the layer's backward (2 Psi, the gathered model's peak is the whole
  /// model); `ReshardAfterForward::group(g)`: ZeRO++ hpZ (`zero_hpz_partition_size`), a secondary
  /// shard within groups of g ranks from which the backward gathers (docs/stage3.md).
  ReshardAfterForward reshard_after_forward = true;
  /// Only the parameters of modules whose `module_type` is listed are partitioned (empty: every
  /// module's). Matched against the model and, recursively, the sub-modules it lists with
  /// `modules(visit)` (`zero_allowed_param_types`, zerotk's own key).
  std::vector<std::string> partitioned_module_types;
  /// The parameters of modules of these types are never partitioned (`zero_force_param_types`).
  /// Parameters left unpartitioned by either list stay gathered on every rank like persistent ones
  /// (they do not count against `model_persistence_threshold`); their gradients and optimizer
  /// state are partitioned as usual.
  std::vector<std::string> replicated_module_types;
  /// ZeRO++ qwZ (`zero_quantized_weights`): the layers' gathers from the primary shards travel as
  /// int8 blocks (compress/quantized_collectives.hpp) and every rank computes with the dequantized
  /// values; Engine::gather() scopes and persistent buckets are gathered exactly. Host memory only.
  bool quantized_weights = false;
  /// ZeRO++ qgZ (`zero_quantized_gradients`): the gradient reduce-scatter travels as int4 through
  /// the topology's levels (all-to-all, fp32 sums). Host memory only.
  bool quantized_gradients = false;

  /// What is out of range, naming DeepSpeed's key and the value (the sizes cannot be: unsigned).
  void check(std::vector<config_error>& out) const {
    if (reshard_after_forward.group_size() < 0) {
      out.emplace_back("must be >= 1 (1: hpZ off)", "zero_optimization.zero_hpz_partition_size",
                       std::to_string(reshard_after_forward.group_size()));
    }
  }
};

}  // namespace zerotk::zero
