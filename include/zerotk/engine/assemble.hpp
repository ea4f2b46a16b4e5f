#pragma once
/// \file zerotk/engine/assemble.hpp
/// Building an engine's flat groups from its registry: which parameter goes into which group, in
/// which order, and (stage 3) in which fetch unit; then the groups themselves, the working-precision
/// group's bucket layout first. What depends on the stage comes in as the fetch schedule's rule
/// (engine/fetch_resident.hpp, engine/fetch_sharded.hpp: `unit_rule`), never as a branch here.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/engine/fetch.hpp"
#include "zerotk/engine/group.hpp"
#include "zerotk/engine/groups.hpp"
#include "zerotk/engine/options.hpp"
#include "zerotk/engine/registry.hpp"
#include "zerotk/offload/nvme_layout.hpp"
#include "zerotk/offload/options.hpp"
#include "zerotk/zero/grads/context.hpp"

namespace zerotk::engine {

/// The members of each group, in the model's visiting order.
struct GroupPlan {
  GroupMembers main, f32, expert;
  GroupPlan() {
    f32.kind = GroupKind::fp32;
    expert.kind = GroupKind::expert;
  }
  GroupMembers& of(GroupKind k) noexcept { return k == GroupKind::main ? main : k == GroupKind::fp32 ? f32 : expert; }
};

/// The members of every group, in the model's visiting order. `unit_of(entry)` is the fetch
/// schedule's rule: std::optional<FetchUnit>, empty below stage 3.
template <class UnitRule>
GroupPlan plan_groups(const ParamRegistry& registry, UnitRule&& unit_of) {
  GroupPlan plan;
  for (ParamId i = 0; i < registry.size(); ++i) {
    const ParamEntry& e = registry[i];
    GroupMembers& m = plan.of(e.group);
    m.ids.push_back(i);
    m.numels.push_back(e.numel);
    m.opt_groups.push_back(e.optimizer_group);
    m.split.push_back(e.tensor_split.is_split() ? 1 : 0);
    if (const std::optional<FetchUnit> u = unit_of(e)) {
      m.units.push_back(u->key);
      m.persistent.push_back(u->persistent ? 1 : 0);
    }
  }
  return plan;
}

/// What building one flat group takes besides its members: `context(accumulate_fp32)` gives its
/// path context, `store(name, max_in_cpu)` its store options.
struct GroupBuild {
  std::size_t bucket_numel = 0;  ///< elements per bucket, both groups (DeepSpeed's reduce_bucket_size)
  bool overlap_param_gather = false;
  bool accumulate_fp32 = true;   ///< the working-precision group's accumulation (the fp32 group: always)
  std::size_t param_max_in_cpu = 0;  ///< offload_param.max_in_cpu: one budget over both groups
};

/// Builds the groups. An optimizer that steps the whole model as one flat vector (1-bit LAMB)
/// refuses a second group (fp32-kept or experts'). offload_param.max_in_cpu is spent over the
/// groups, the working-precision group's leading blocks first (DeepSpeed counts its groups in order
/// against one budget too). `context(accumulate_fp32, kind)` gives a group's path context (the
/// expert group's reduces over the expert-data group).
template <class Main, class F32, class Context, class StoreOptionsOf, class... Extra>
Groups<Main, F32> make_groups(GroupPlan plan, const GroupBuild& b, Context&& context, StoreOptionsOf&& store_options,
                              const Extra&... extra) {
  if constexpr (Main::kOneFlatVector) {
    if (!plan.main.ids.empty() && (!plan.f32.ids.empty() || !plan.expert.ids.empty())) {
      const bool f32 = !plan.f32.ids.empty();
      throw config_error(std::string("this optimizer (1-bit LAMB) steps the whole model as one flat vector; ") +
                             (f32 ? "parameters kept in fp32 (keep_fp32, fp32_module_types)" : "expert parameters") +
                             " would form a second one. " +
                             (f32 ? "Train them in the working precision, or use another optimizer" : "Use another optimizer"),
                         f32 ? "EngineOptions.keep_fp32 / fp32_module_types" : "EngineOptions.expert",
                         std::to_string(f32 ? plan.f32.ids.size() : plan.expert.ids.size()) +
                             (f32 ? " fp32-kept parameters" : " expert parameters"));
    }
  }
  std::size_t in_cpu_left = b.param_max_in_cpu;
  std::unique_ptr<Main> m, e;
  std::unique_ptr<F32> f;
  if (!plan.main.ids.empty()) {
    m = std::make_unique<Main>(context(b.accumulate_fp32, GroupKind::main), std::move(plan.main), b.bucket_numel,
                               b.overlap_param_gather, store_options("main", GroupKind::main, in_cpu_left), extra...);
    in_cpu_left -= offload::elements_in_cpu(m->layout(), in_cpu_left);
  }
  if (!plan.f32.ids.empty()) {
    f = std::make_unique<F32>(context(true, GroupKind::fp32), std::move(plan.f32), b.bucket_numel, b.overlap_param_gather,
                              store_options("fp32", GroupKind::fp32, in_cpu_left), extra...);
    in_cpu_left -= offload::elements_in_cpu(f->layout(), in_cpu_left);
  }
  if (!plan.expert.ids.empty()) {
    e = std::make_unique<Main>(context(b.accumulate_fp32, GroupKind::expert), std::move(plan.expert), b.bucket_numel,
                               b.overlap_param_gather, store_options("expert", GroupKind::expert, in_cpu_left), extra...);
  }
  return Groups<Main, F32>(std::move(m), std::move(f), std::move(e));
}

/// The engine's groups over `registry`, from its options: each group's path context (the data
/// group's communicator, hpZ's, the ledger, the reduction settings; the expert group's: the
/// expert-data group's, engine/comms.hpp) and store options (sub-groups, swap files named by the
/// group's rank), the fetch schedule's units. `o` must outlive the groups (the
/// paths keep a pointer to its compression options).
template <class Main, class F32, class Fetch, class Ops, class Comms>
Groups<Main, F32> assemble_groups(const EngineOptions& o, const ParamRegistry& registry, Ops& ops, Comms& comms,
                                  MemoryLedger& ledger, std::size_t bucket_numel, bool shard_file) {
  GroupBuild b;
  b.bucket_numel = bucket_numel;
  b.overlap_param_gather = o.overlap_param_gather;
  b.accumulate_fp32 = !o.grad_accum_dtype || *o.grad_accum_dtype == DType::fp32;
  b.param_max_in_cpu = o.param_nvme.max_in_cpu;
  const auto context = [&](bool accumulate_fp32, GroupKind kind) {
    const bool own_group = kind == GroupKind::expert && comms.experts_apart();
    zero::PathContext<Ops> c;
    c.ops = &ops;
    c.comm = kind == GroupKind::expert ? &comms.expert_data() : &comms.data();
    c.group_comm = own_group ? nullptr : comms.hpz();
    c.ledger = &ledger;
    c.gradient_accumulation_steps = o.gradient_accumulation_steps;
    c.overlap_comm = o.overlap_comm;
    c.bucket_buffers = o.bucket_buffers;
    c.accumulate_fp32 = accumulate_fp32;
    c.compression = &o.compression;
    if (!own_group) {  // qgZ / qwZ: over the data group (the checker refuses them with experts apart)
      c.reduce_scatter = comms.gradient_reduce_scatter();
      c.weight_gather = comms.weight_gather();
    }
    return c;
  };
  // `param_max_in_cpu`: what is left of offload_param.max_in_cpu for this group (one budget over all).
  const auto store = [&](const char* name, GroupKind kind, std::size_t param_max_in_cpu) {
    offload::StoreOptions s;
    s.sub_group_size = o.sub_group_size;
    s.rank = (kind == GroupKind::expert ? comms.expert_data() : comms.data()).rank();
    s.name = name;
    s.nvme = o.nvme;
    s.param_nvme = o.param_nvme;
    s.param_nvme.max_in_cpu = param_max_in_cpu;
    s.output_writer = shard_file;
    return s;
  };
  return make_groups<Main, F32>(plan_groups(registry, Fetch::unit_rule(o.stage3)), b, context, store, o.groups, o.onebit);
}

}  // namespace zerotk::engine
