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

/// The members of both groups, in the model's visiting order. `unit_of(entry)` is the fetch
/// schedule's rule: std::optional<FetchUnit>, empty below stage 3.
template <class UnitRule>
std::pair<GroupMembers, GroupMembers> plan_groups(const ParamRegistry& registry, UnitRule&& unit_of) {
  GroupMembers main, f32;
  for (ParamId i = 0; i < registry.size(); ++i) {
    const ParamEntry& e = registry[i];
    GroupMembers& m = e.group == GroupKind::main ? main : f32;
    m.ids.push_back(i);
    m.numels.push_back(e.numel);
    m.opt_groups.push_back(e.optimizer_group);
    m.split.push_back(e.tensor_split.is_split() ? 1 : 0);
    if (const std::optional<FetchUnit> u = unit_of(e)) {
      m.units.push_back(u->key);
      m.persistent.push_back(u->persistent ? 1 : 0);
    }
  }
  return {std::move(main), std::move(f32)};
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
/// refuses an fp32-kept group. offload_param.max_in_cpu is spent over both groups, the
/// working-precision group's leading blocks first (DeepSpeed counts its groups in order against one
/// budget too).
template <class Main, class F32, class Context, class StoreOptionsOf, class... Extra>
Groups<Main, F32> make_groups(std::pair<GroupMembers, GroupMembers> plan, const GroupBuild& b, Context&& context,
                              StoreOptionsOf&& store_options, const Extra&... extra) {
  auto& [main, f32] = plan;
  if constexpr (Main::kOneFlatVector) {
    if (!main.ids.empty() && !f32.ids.empty()) {
      throw config_error("this optimizer (1-bit LAMB) steps the whole model as one flat vector; parameters kept in fp32 "
                         "(keep_fp32, fp32_module_types) would form a second one. Train them in the working "
                         "precision, or use another optimizer",
                         "EngineOptions.keep_fp32 / fp32_module_types",
                         std::to_string(f32.ids.size()) + " fp32-kept parameters");
    }
  }
  std::size_t in_cpu_left = b.param_max_in_cpu;
  std::unique_ptr<Main> m;
  std::unique_ptr<F32> f;
  if (!main.ids.empty()) {
    m = std::make_unique<Main>(context(b.accumulate_fp32), std::move(main), b.bucket_numel, b.overlap_param_gather,
                               store_options("main", in_cpu_left), extra...);
    in_cpu_left -= offload::elements_in_cpu(m->layout(), in_cpu_left);
  }
  if (!f32.ids.empty()) {
    f = std::make_unique<F32>(context(true), std::move(f32), b.bucket_numel, b.overlap_param_gather,
                              store_options("fp32", in_cpu_left), extra...);
  }
  return Groups<Main, F32>(std::move(m), std::move(f));
}

/// The engine's groups over `registry`, from its options: each group's path context (the data
/// group's communicator, hpZ's, the ledger, the reduction settings) and store options (sub-groups,
/// swap files named by the data rank), the fetch schedule's units. `o` must outlive the groups (the
/// paths keep a pointer to its compression options).
template <class Main, class F32, class Fetch, class Ops, class Comms>
Groups<Main, F32> assemble_groups(const EngineOptions& o, const ParamRegistry& registry, Ops& ops, Comms& comms,
                                  MemoryLedger& ledger, std::size_t bucket_numel, bool shard_file) {
  GroupBuild b;
  b.bucket_numel = bucket_numel;
  b.overlap_param_gather = o.overlap_param_gather;
  b.accumulate_fp32 = !o.grad_accum_dtype || *o.grad_accum_dtype == DType::fp32;
  b.param_max_in_cpu = o.param_nvme.max_in_cpu;
  const auto context = [&](bool accumulate_fp32) {
    zero::PathContext<Ops> c;
    c.ops = &ops;
    c.comm = &comms.data();
    c.group_comm = comms.hpz();
    c.ledger = &ledger;
    c.gradient_accumulation_steps = o.gradient_accumulation_steps;
    c.overlap_comm = o.overlap_comm;
    c.bucket_buffers = o.bucket_buffers;
    c.accumulate_fp32 = accumulate_fp32;
    c.compression = &o.compression;
    c.reduce_scatter = comms.gradient_reduce_scatter();
    c.weight_gather = comms.weight_gather();
    return c;
  };
  // `param_max_in_cpu`: what is left of offload_param.max_in_cpu for this group (one budget over both).
  const auto store = [&](const char* name, std::size_t param_max_in_cpu) {
    offload::StoreOptions s;
    s.sub_group_size = o.sub_group_size;
    s.rank = comms.data().rank();
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
