#pragma once
/// \file zerotk/plan/model_states.hpp
/// The bytes zerotk's engine allocates for one rank, by memory space and ledger category, computed
/// from the engine's own bucket layout (zero::BucketLayout is called, not re-derived, so padding is
/// the engine's). Each term names the engine part that allocates it:
///
///   params16        stages 0-2: the flat buffer (zero/params/replicated.hpp, bucket_gather.hpp);
///                   stage 3: the shard (fetch_on_demand.hpp); Offload<Cpu>: + the pinned output staging
///   grads           stages 0/1: the flat buffer (grads/context.hpp FlatGradBuffer); stages 2/3: the
///                   reduced partition (pooled_buckets.hpp); + the accumulator over micro-steps
///                   (grads/context.hpp Accumulator); Offload<Cpu>: + the pinned gradient staging
///   master32, optimizer_state   the state store (offload/resident.hpp, host_pinned.hpp, nvme.hpp):
///                   fp32 master, m, v of the owned elements (the flat buffer at stage 0); Offload<Nvme>:
///                   both slots on disk, the swap buffers pinned (`other`)
///   comm_buffers    stages 2/3: the bucket pool (pooled_buckets.hpp)
///   gathered        stage 3: persistent buckets' buffers and the pool of gathered buckets
///   secondary       stage 3 hpZ: the secondary shard (params/secondary_shard.hpp)
///   other           the scratch gradient of the largest parameter (engine/bindings.hpp); emulated
///                   16-bit: float copies (zero/float_view.hpp, fetched_float_view.hpp); NVMe: the
///                   pinned swap and staging buffers
///   params16 on NVMe   OffloadParams<Nvme> (offload/nvme_shard.hpp): the blocks kept under max_in_cpu
///                   in pinned host memory (two copies), both slots of every other block on disk
///                   (padded to 4 KiB)
///
/// One parameter group: the engine keeps a second one (and its own files) for fp32 parameters in
/// a 16-bit model, which the model description does not carry.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "zerotk/core/dtype.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/io/aio_options.hpp"
#include "zerotk/offload/nvme_layout.hpp"
#include "zerotk/plan/choice.hpp"
#include "zerotk/plan/model.hpp"
#include "zerotk/zero/layout.hpp"

namespace zerotk::plan {

/// Predicted per-rank bytes, the ledger's shape.
struct MemoryPlan {
  std::array<std::array<std::size_t, kMemoryCategoryCount>, kMemorySpaceCount> bytes{};
  std::size_t psi = 0;          ///< parameters
  std::size_t psi_padded = 0;   ///< flat elements with the layout's padding
  std::size_t partition = 0;    ///< elements each rank owns (stages 1-3)
  std::size_t buckets = 0;
  /// Terms that are bounds rather than exact (the stage-3 pool under custom fetch settings);
  /// empty when every figure is the engine's exact allocation.
  std::vector<std::string> approximate;
  /// Why the engine would refuse this configuration with these settings (its config_error's
  /// what()), or empty. A refused configuration never fits (plan/search.hpp).
  std::string refused;

  std::size_t& at(MemorySpace s, MemoryCategory c) noexcept {
    return bytes[static_cast<std::size_t>(s)][static_cast<std::size_t>(c)];
  }
  std::size_t at(MemorySpace s, MemoryCategory c) const noexcept {
    return bytes[static_cast<std::size_t>(s)][static_cast<std::size_t>(c)];
  }
  std::size_t space_total(MemorySpace s) const noexcept {
    std::size_t n = 0;
    for (std::size_t b : bytes[static_cast<std::size_t>(s)]) n += b;
    return n;
  }
  std::size_t category_total(MemoryCategory c) const noexcept {
    std::size_t n = 0;
    for (const auto& row : bytes) n += row[static_cast<std::size_t>(c)];
    return n;
  }
  /// params16 + grads + master32 + optimizer_state, every space (the ZeRO paper's "model states").
  std::size_t model_states() const noexcept {
    return category_total(MemoryCategory::params16) + category_total(MemoryCategory::grads) +
           category_total(MemoryCategory::master32) + category_total(MemoryCategory::optimizer_state);
  }
  std::size_t total() const noexcept {
    std::size_t n = 0;
    for (std::size_t s = 0; s < kMemorySpaceCount; ++s) n += space_total(static_cast<MemorySpace>(s));
    return n;
  }
};

namespace detail {

/// The engine's bucket layout for this model (engine.hpp build(): one optimizer group, every
/// parameter in the main group; stage 3: a bucket never spans two units, persistent parameters
/// units of their own). `persistent` receives a flag per bucket.
inline zero::BucketLayout engine_layout(const ModelDescription& m, int world, int stage, std::size_t elem_bytes,
                                        const EngineSettings& s, std::vector<char>& persistent_buckets) {
  std::vector<std::size_t> numels;
  std::vector<std::uint32_t> groups, units;
  std::vector<char> persistent;
  std::size_t persistent_numel = 0;
  for (std::size_t l = 0; l < m.layers.size(); ++l) {
    for (std::size_t n : m.layers[l].params) {
      numels.push_back(n);
      groups.push_back(0);
      if (stage == 3) {
        const bool small = n <= s.param_persistence_threshold && persistent_numel + n <= s.model_persistence_threshold;
        if (small) persistent_numel += n;
        units.push_back(static_cast<std::uint32_t>(2 * l + (small ? 1 : 0)));
        persistent.push_back(small ? 1 : 0);
      }
    }
  }
  zero::BucketLayout layout(numels, groups, world, s.bucket_numel(elem_bytes), units);
  persistent_buckets.assign(layout.buckets().size(), 0);
  if (stage == 3) {
    for (std::size_t k = 0; k < layout.buckets().size(); ++k) {
      persistent_buckets[k] = persistent[layout.buckets()[k].params.front()];
    }
  }
  return layout;
}

inline std::size_t bytes_of(DType t) {
  return t == DType::fp32 ? 4 : 2;
}

/// The largest figure a plan holds: 2^60 bytes (an exabyte). Every term stays below it and a
/// ledger cell sums fewer than sixteen terms, so no sum of a plan wraps around 2^64.
inline constexpr std::size_t kMaxPlanBytes = std::size_t{1} << 60;
/// The most parameters a model may have (every count a double holds exactly; 16 bytes each and
/// the layout's padding stay below kMaxPlanBytes).
inline constexpr std::size_t kMaxPlanParams = std::size_t{1} << 53;

/// a x b x ... bytes for `what`, or config_error when the product passes kMaxPlanBytes (the model
/// or the settings are too large to plan) instead of a product that wrapped.
template <class... Rest>
std::size_t bytes_product(const char* what, std::size_t a, Rest... rest) {
  std::size_t p = a;
  const std::size_t factors[] = {static_cast<std::size_t>(rest)...};
  for (std::size_t f : factors) {
    if (__builtin_mul_overflow(p, f, &p) || p > kMaxPlanBytes) {
      throw config_error("too large to plan: more than 2^60 bytes", what, "a product of counts and sizes");
    }
  }
  if (p > kMaxPlanBytes) throw config_error("too large to plan: more than 2^60 bytes", what, std::to_string(p));
  return p;
}

/// The most buckets any one layer's parameters touch, counting only those `counted` accepts (a
/// predicate on the bucket index). The layout fills buckets walking the parameters backwards, so
/// along the forward order a parameter's bucket index never grows: equal indices are adjacent and
/// one comparison with the previous counted bucket finds each new one. Linear in the parameters.
template <class Counted>
std::size_t most_buckets_per_layer(const ModelDescription& m, const zero::BucketLayout& L, Counted counted) {
  std::size_t most = 0, first = 0;
  for (const LayerDesc& l : m.layers) {
    std::size_t distinct = 0;
    std::uint32_t last = 0;
    for (std::size_t i = 0; i < l.params.size(); ++i) {
      const std::uint32_t k = L.param(first + i).bucket;
      if (!counted(k) || (distinct > 0 && k == last)) continue;
      ++distinct;
      last = k;
    }
    first += l.params.size();
    most = std::max(most, distinct);
  }
  return most;
}

/// The most buckets any one layer's parameters touch (the engine's pool holds at least that many).
inline std::size_t most_buckets_per_layer(const ModelDescription& m, const zero::BucketLayout& L) {
  return most_buckets_per_layer(m, L, [](std::uint32_t) { return true; });
}
}  // namespace detail

/// What model_state_plan needs of the engine's bucket layout, reduced to a few numbers. A layout
/// depends only on whether the stage is 3 (fetch units, persistent parameters), the element size
/// and the settings, never on the offload or checkpointing choice: the planner's search
/// (plan/search.hpp) computes these facts once per layout instead of once per configuration,
/// which is what keeps a search over a model of 100,000 layers under a second.
struct LayoutFacts {
  int world = 1;
  bool stage3 = false;          ///< the layout of stage 3 (units, persistent buckets)
  std::size_t element_bytes = 2;
  std::size_t psi = 0, flat = 0, partition = 0, buckets = 0;
  std::size_t largest_param = 0;
  std::size_t biggest = 0;         ///< the largest bucket (numel)
  std::size_t slot = 0;            ///< the largest non-persistent bucket (numel)
  std::size_t nonpersistent = 0;   ///< buckets that are not persistent
  std::size_t persistent_numel = 0;  ///< numel summed over persistent buckets (stage 3)
  std::size_t secondary_numel = 0;   ///< numel / hpz summed over non-persistent buckets (hpz > 1)
  std::size_t most_per_layer = 0;    ///< the most buckets one layer touches
  std::size_t most_nonpersistent_per_layer = 0;  ///< the same, non-persistent buckets only (stage 3)
  // OffloadParams<Nvme> (stage 3): blocks kept in pinned memory, the file's slot bytes, the largest
  // padded block, and the engine's refusal of the buffer size
  std::size_t nvme_kept_bytes = 0, nvme_slot_bytes = 0, nvme_largest_bytes = io::kDirectAlign;
  std::string nvme_refused;
};

namespace detail {

/// The facts of the engine's layout for `m` at `stage` (0-2 share one layout) with elements of
/// `element_bytes`. Linear in the parameter count.
inline LayoutFacts layout_facts(const ModelDescription& m, int world, int stage, std::size_t element_bytes,
                                const EngineSettings& s) {
  LayoutFacts f;
  f.world = world;
  f.stage3 = stage == 3;
  f.element_bytes = element_bytes;
  const std::size_t S = element_bytes;
  // The layout's offsets hold at most the parameters plus 2W of padding per tensor: both bounded
  // here, before anything is summed in size_t.
  std::size_t psi = 0, tensors = 0;
  for (const LayerDesc& l : m.layers) {
    for (std::size_t n : l.params) {
      if (__builtin_add_overflow(psi, n, &psi) || psi > kMaxPlanParams) {
        throw config_error("too large to plan: more than 2^53 parameters", "model", "a sum above 2^53");
      }
    }
    tensors += l.params.size();
  }
  if (bytes_product("model: the layout's padding (2 x world per tensor)", tensors, 2, static_cast<std::size_t>(world)) >
      kMaxPlanParams) {
    throw config_error("too large to plan: more than 2^53 elements of padding (2 x world per tensor)", "model",
                       std::to_string(tensors) + " tensors on " + std::to_string(world) + " ranks");
  }
  std::vector<char> persistent;
  const zero::BucketLayout L = engine_layout(m, world, stage, S, s, persistent);
  f.psi = psi;
  f.flat = L.flat_numel();
  f.partition = L.partition_numel();
  f.buckets = L.buckets().size();
  f.largest_param = m.largest_param();
  for (std::size_t k = 0; k < L.buckets().size(); ++k) {
    const zero::Bucket& b = L.buckets()[k];
    f.biggest = std::max(f.biggest, b.numel);
    if (f.stage3 && persistent[k]) {
      f.persistent_numel += b.numel;
    } else {
      f.slot = std::max(f.slot, b.numel);
      ++f.nonpersistent;
      if (s.hpz_partition_size > 1) f.secondary_numel += b.numel / static_cast<std::size_t>(s.hpz_partition_size);
    }
  }
  f.most_per_layer = most_buckets_per_layer(m, L);
  if (f.stage3) {
    f.most_nonpersistent_per_layer = most_buckets_per_layer(m, L, [&](std::uint32_t k) { return persistent[k] == 0; });
    // NvmeShard: the leading blocks that fit whole in max_in_cpu elements in pinned host memory
    // instead of the file, two copies each (unpadded); the file two slots of every other block,
    // each padded to 4 KiB (at least one page); buffer_count read buffers and one assembly
    // buffer of the largest padded block in the file (at least one page).
    const std::size_t in_cpu = offload::blocks_in_cpu(L, s.param_max_in_cpu);
    for (std::size_t k = 0; k < L.buckets().size(); ++k) {
      if (k < in_cpu) {
        f.nvme_kept_bytes += L.buckets()[k].block * S;
        continue;
      }
      const std::size_t padded = io::direct_round(L.buckets()[k].block * S);
      f.nvme_slot_bytes += padded;
      f.nvme_largest_bytes = std::max(f.nvme_largest_bytes, padded);
    }
    if (auto e = offload::param_buffer_size_error(L, s.param_buffer_size)) f.nvme_refused = e->what();
  }
  return f;
}

inline void check_settings(int world, const Choice& c, const EngineSettings& s) {
  if (world < 1) throw config_error("must be >= 1", "--world", std::to_string(world));
  if (!c.valid()) throw config_error("not a valid combination (offload needs stage >= 1; offload_param stage 3)", "choice", c.name());
  if (s.gradient_accumulation_steps < 1) {
    throw config_error("must be >= 1", "gradient_accumulation_steps", std::to_string(s.gradient_accumulation_steps));
  }
  if (s.hpz_partition_size < 1 || world % s.hpz_partition_size != 0) {
    throw config_error("must be >= 1 and divide the world size (" + std::to_string(world) + ")",
                       "zero_optimization.zero_hpz_partition_size", std::to_string(s.hpz_partition_size));
  }
  if (s.sub_group_size < 1) throw config_error("must be >= 1", "zero_optimization.sub_group_size", "0");
}

}  // namespace detail

/// The facts model_state_plan uses for `c`'s layout (its stage and precision) under `s`.
inline LayoutFacts layout_facts(const ModelDescription& m, int world, const Choice& c, const EngineSettings& s) {
  detail::check_settings(world, c, s);
  return detail::layout_facts(m, world, c.stage, detail::bytes_of(c.precision), s);
}

namespace detail {

/// model_state_plan's working-precision parameters: the flat buffer (stages 0-2), the partition on
/// the device or in pinned host memory, or stage 3's NVMe shard file and its buffers.
inline void add_working_params(MemoryPlan& p, const LayoutFacts& facts, const Choice& c, const EngineSettings& s) {
  using C = MemoryCategory;
  const MemorySpace dev = s.compute_space;
  const std::size_t S = facts.element_bytes, flat = facts.flat, part = facts.partition;
  // Working-precision parameters.
  if (c.stage <= 2) {
    p.at(dev, C::params16) += flat * S;
  } else {
    if (c.param != OffloadTarget::nvme) {
      p.at(c.param == OffloadTarget::none ? dev : MemorySpace::pinned_host, C::params16) += part * S;
    } else {
      // NvmeShard (layout_facts): pinned blocks, the file's two slots, the read and assembly buffers.
      if (!facts.nvme_refused.empty()) p.refused = facts.nvme_refused;
      p.at(MemorySpace::disk, C::params16) += 2 * std::max(facts.nvme_slot_bytes, io::kDirectAlign);
      p.at(MemorySpace::pinned_host, C::other) +=
          detail::bytes_product("zero_optimization.offload_param.buffer_count", s.param_buffer_count + 1,
                                facts.nvme_largest_bytes);
      p.at(MemorySpace::pinned_host, C::params16) += 2 * facts.nvme_kept_bytes;
    }
  }
}

/// model_state_plan's fp32 master and optimizer state over the `owned` elements, where the
/// optimizer offload puts them, and the staging of a store that steps sub-group by sub-group.
inline void add_master_and_state(MemoryPlan& p, const Choice& c, const EngineSettings& s, std::size_t owned) {
  using C = MemoryCategory;
  const MemorySpace dev = s.compute_space;
  const std::size_t F = sizeof(float);
  // Master and optimizer state, and the staging of an offloading store.
  const std::size_t staging = std::min(owned, s.sub_group_size) * F;
  const std::size_t moments = s.optimizer_moments;
  switch (c.optimizer) {
    case OffloadTarget::none:
      p.at(dev, C::master32) += owned * F;
      p.at(dev, C::optimizer_state) += detail::bytes_product("optimizer moments", moments, owned, F);
      break;
    case OffloadTarget::cpu:
      p.at(MemorySpace::pinned_host, C::master32) += owned * F;
      p.at(MemorySpace::pinned_host, C::optimizer_state) += detail::bytes_product("optimizer moments", moments, owned, F);
      break;
    case OffloadTarget::nvme: {
      // Offload<Nvme> (offload/nvme.hpp): master and the moments in two slots on disk (24 Psi/N
      // with two moments); pinned swap buffers of one sub-group's master and moments (each padded
      // to 4 KiB), as many as buffer_count and the pipelining ask, never more than the sub-groups.
      p.at(MemorySpace::disk, C::master32) += 2 * owned * F;
      p.at(MemorySpace::disk, C::optimizer_state) += detail::bytes_product("optimizer moments", 2, moments, owned, F);
      const std::size_t sub = std::max<std::size_t>(1, std::min(owned, s.sub_group_size));
      const std::size_t sub_groups = std::max<std::size_t>(1, (owned + s.sub_group_size - 1) / s.sub_group_size);
      const std::size_t buffers = offload::swap_buffer_count(s.optimizer_buffer_count, s.optimizer_pipeline_read,
                                                             s.optimizer_pipeline_write, sub_groups);
      p.at(MemorySpace::pinned_host, C::other) +=
          detail::bytes_product("zero_optimization.offload_optimizer.buffer_count", buffers, 1 + moments,
                                io::direct_round(sub * F));
      break;
    }
  }
  // A store that steps sub-group by sub-group (optimizer offload; Offload<None> with a parameter
  // shard file) stages one sub-group's gradients and output in pinned memory
  // (offload/sub_group_steps.hpp). One that steps its state in place while the values go to the
  // file (Offload<Cpu>, Offload<None>) writes the values before it steps the state
  // (offload/writer_passes.hpp), which takes no memory.
  const bool shard_file = c.stage == 3 && c.param == OffloadTarget::nvme;
  if (c.optimizer != OffloadTarget::none || shard_file) {
    p.at(MemorySpace::pinned_host, C::grads) += staging;
    p.at(MemorySpace::pinned_host, C::params16) += staging;
  }
}

/// model_state_plan's bucket pool (stages 2/3), stage 3's persistent buckets, gathered pool and hpZ
/// secondary shard. Returns the gathered pool's buffers (0 below stage 3).
inline std::size_t add_bucket_pools(MemoryPlan& p, const LayoutFacts& facts, const Choice& c, const EngineSettings& s) {
  using C = MemoryCategory;
  const MemorySpace dev = s.compute_space;
  const std::size_t S = facts.element_bytes, flat = facts.flat;
  // Bucket pool (stages 2/3): bucket_buffers buffers of the largest bucket; it grows when one
  // layer's parameters span more buckets than the pool holds.
  const std::size_t biggest = facts.biggest, slot = facts.slot, nonpersistent = facts.nonpersistent;
  if (c.stage == 3) p.at(dev, C::gathered) += facts.persistent_numel * S;  // the persistent buckets
  if (c.stage >= 2) {
    const std::size_t pool = std::max(std::min<std::size_t>(static_cast<std::size_t>(s.bucket_buffers), facts.buckets),
                                      facts.most_per_layer);
    p.at(dev, C::comm_buffers) += detail::bytes_product("the bucket pool", pool, biggest, S);
  }

  // Stage 3: the pool of gathered buckets and the hpZ secondary shard.
  std::size_t pool_buffers = 0;
  if (c.stage == 3) {
    const bool keeps_all = !s.reshard_after_forward ||
                           (s.max_reuse_distance >= 2 * flat && s.max_live_parameters >= flat);
    if (keeps_all) {
      pool_buffers = nonpersistent;  // every bucket stays gathered after its first use
    } else {
      const std::size_t per_unit = facts.most_nonpersistent_per_layer;
      const std::size_t ahead = slot ? s.prefetch_bucket_size / slot + (s.prefetch_bucket_size % slot ? 1 : 0) : 0;
      pool_buffers = std::min(nonpersistent, per_unit + ahead);
      if (s.prefetch_bucket_size > 0 || s.max_reuse_distance > 0) {
        p.approximate.push_back("stage-3 gathered pool: an upper bound under these prefetch / reuse settings");
      }
    }
    p.at(dev, C::gathered) += detail::bytes_product("the stage-3 gathered pool", pool_buffers, slot, S);
    p.at(dev, C::secondary) += facts.secondary_numel * S;
  }
  return pool_buffers;
}

}  // namespace detail

/// Per-rank bytes the engine allocates under `c`, from the facts of its layout (`facts` must come
/// from layout_facts with a choice of the same layout, that is of the same stage-3-or-not and
/// precision, and the same `s`). Throws config_error for a combination DeepSpeed refuses.
inline MemoryPlan model_state_plan(const LayoutFacts& facts, const Choice& c, const EngineSettings& s) {
  detail::check_settings(facts.world, c, s);
  if ((c.stage == 3) != facts.stage3 || detail::bytes_of(c.precision) != facts.element_bytes) {
    throw usage_error("the layout facts are of another layout (stage 3 or not, element size)", "model_state_plan",
                      c.name());
  }
  using C = MemoryCategory;
  const MemorySpace dev = s.compute_space;
  const std::size_t S = facts.element_bytes, F = sizeof(float);
  MemoryPlan p;
  const std::size_t flat = facts.flat, part = facts.partition;
  p.psi = facts.psi;
  p.psi_padded = flat;
  p.partition = part;
  p.buckets = facts.buckets;
  const bool partitioned = c.stage >= 1;
  const std::size_t owned = partitioned ? part : flat;
  const bool every_micro = c.stage >= 2 || s.reduce_every_micro_step;
  const bool emulated = s.emulated && c.precision != DType::fp32;

  detail::add_working_params(p, facts, c, s);

  // Gradients: the flat buffer (stages 0/1) or the reduced partition (2/3), and the accumulator.
  p.at(dev, C::grads) += (c.stage <= 1 ? flat : part) * S;
  if (every_micro && s.gradient_accumulation_steps > 1) {
    const std::size_t acc = c.stage == 0 ? flat : part;
    p.at(dev, C::grads) += acc * (s.grad_accum_fp32 ? F : S);
  }

  detail::add_master_and_state(p, c, s, owned);

  const std::size_t pool_buffers = detail::add_bucket_pools(p, facts, c, s);

  // The scratch gradient of the largest parameter, and the float compute copies of emulated 16-bit.
  p.at(dev, C::other) += std::max<std::size_t>(1, facts.largest_param) * F;
  if (emulated) {
    if (c.stage <= 2) {
      p.at(dev, C::other) += 2 * flat * F;
    } else {
      p.at(dev, C::other) += facts.persistent_numel * F;
      // Bound (docs/stage3.md): value buffers for the gathered buckets + gradient buffers for the
      // buckets of one open backward (+1 for a tied head's external parameter).
      const std::size_t per_unit = facts.most_per_layer;
      p.at(dev, C::other) += detail::bytes_product("the stage-3 float copies", pool_buffers + per_unit + 1, facts.slot, F);
      p.approximate.push_back("stage-3 emulated float copies: the documented bound");
    }
  }
  return p;
}

/// Per-rank bytes the engine allocates for `m` under `c` on `world` ranks (activations excluded:
/// plan/activations.hpp). Throws config_error for a combination DeepSpeed refuses.
inline MemoryPlan model_state_plan(const ModelDescription& m, int world, const Choice& c, const EngineSettings& s) {
  return model_state_plan(layout_facts(m, world, c, s), c, s);
}

}  // namespace zerotk::plan
