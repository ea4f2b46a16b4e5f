#pragma once
/// \file zerotk/engine_config.hpp
/// From a resolved DeepSpeed config (zerotk/config/) to an Engine: the structure check, the run-time
/// options and the LR scheduler.
///
///   auto cfg = zerotk::config::load_file("ds_config.json", {.world_size = W});
///   using E = zerotk::Engine<zerotk::Partitioner<zerotk::Stage<2>>, zerotk::Optimizer<zerotk::AdamW>,
///                            zerotk::Precision<zerotk::fp16>>;
///   E engine(comm, model, zerotk::engine_options<E>(cfg));   // throws if cfg asks for another structure
///   if (auto s = zerotk::lr_scheduler(cfg)) engine.set_scheduler(*s);
///
/// make_engine_of<E>(cfg, comm, model, edit) does the same behind AnyEngine, as make_engine does for
/// the compiled set's types: for an engine type outside the set (Sparsity<NofM<2, 4>>, a Bucketer
/// of your own), compiled where it is called.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "zerotk/any_engine.hpp"
#include "zerotk/comm/grid.hpp"
#include "zerotk/config/engine_options.hpp"
#include "zerotk/config/options.hpp"
#include "zerotk/config/structure.hpp"
#include "zerotk/engine.hpp"
#include "zerotk/erased_engine.hpp"
#include "zerotk/optim/schedulers.hpp"

namespace zerotk {

/// The numbers of `cfg` as EngineOptions for engine type E (config::engine_options_of composes
/// them, one assignment per part), checked. Throws one config_error listing every way `cfg` asks for
/// a structure E was not compiled with, a combination no engine of this version runs, or a value a
/// part refuses (a Config may be built in code, so the parts' checks run here too, naming the JSON
/// path).
template <class E>
EngineOptions engine_options(const config::Config& cfg) {
  std::vector<config_error> problems = config::check_structure<E>(cfg);
  for (config_error& e : config::check_buildable(cfg)) problems.push_back(std::move(e));
  if (cfg.zero_optimization.reduce_bucket_size == 0) {  // 0 would mean "the Bucketer policy's" to the engine
    problems.emplace_back("must be >= 1 (elements per bucket)", "/zero_optimization/reduce_bucket_size", "0");
  }

  EngineOptions o = config::engine_options_of(cfg);

  // The parts' own checks; the engine names keys with dots, a config with JSON pointers.
  const bool swaps = cfg.zero_optimization.offload_optimizer.device == config::OffloadDevice::nvme ||
                     cfg.zero_optimization.offload_param.device == config::OffloadDevice::nvme;
  for (const config_error& e : o.problems(swaps)) problems.push_back(config::at_json_pointer(e));
  for (const optim::OptionProblem& p : optim::problems(o.optimizer)) {
    const std::string key(config::optimizer_param_key(p.field));
    const std::string rule = key == p.field ? p.rule : std::string(p.field) + " " + p.rule;
    problems.emplace_back(rule, "/optimizer/params/" + key, optim::detail::double_text(p.value));
  }
  if (!problems.empty()) throw config::summarize(problems);
  return o;
}

/// The process grid `cfg` asks for: its tensor and pipeline sizes, data = the world's size / (tensor x
/// pipeline) (inferred by the grid, which refuses a world they do not divide), Megatron's rank order,
/// the context ranks (sequence_parallel_size) folded inside data. An engine built on `comm::ProcessGrid grid(world, grid_shape(cfg))`
/// partitions over the data group the config's batch triad counts.
///
///   zerotk::comm::ProcessGrid grid(world, zerotk::grid_shape(cfg));
///   E engine(grid, model, zerotk::engine_options<E>(cfg));   // plus ModelOptions::tensor_split
inline comm::GridShape grid_shape(const config::Config& cfg) {
  return comm::GridShape{.data = 0,
                         .pipeline = cfg.pipeline.stages,
                         .tensor = cfg.tensor_parallel_size,
                         .expert = cfg.expert_parallel_size,
                         .expert_tensor = cfg.tensor_parallel_size,
                         .context = cfg.sequence_parallel_size};
}

/// The scheduler of `cfg`, if it has one, at iteration -1 (the engine steps it).
inline std::optional<LrScheduler> lr_scheduler(const config::Config& cfg) {
  std::optional<LrScheduler> s;
  if (cfg.scheduler) {
    s.emplace(cfg.scheduler->params, cfg.optimizer ? cfg.optimizer->params.lr : optim::kDefaultOptimizerLr);
  }
  return s;
}

/// Engine type E built from `cfg` behind AnyEngine, as make_engine builds the compiled set's: the
/// config's options (engine_options<E>: a config_error naming what differs when cfg asks for another
/// structure), then `edit`'s, and the config's LR scheduler. `inputs`: the communicator or grid and
/// the model with their types forgotten (engine::erase_inputs). E's members are compiled where this
/// is called, unless E is in the compiled set and zerotk/engines.hpp was included first.
template <class E>
AnyEngine make_engine_of(const config::Config& cfg, engine::ErasedInputs inputs, const EngineOptionsEdit& edit = {}) {
  EngineOptions options = engine_options<E>(cfg);
  if (edit) edit(options);
  using Ops = typename E::ops_type;
  engine::EngineInputs<Ops> typed{inputs.comm, inputs.place, [](void*, void*) { return Ops{}; }, std::move(inputs.model)};
  auto impl = std::make_unique<engine::ErasedEngineOf<E>>(std::move(typed), std::move(options), config::describe<E>());
  if (auto s = lr_scheduler(cfg)) impl->set_scheduler(*s);
  return AnyEngine(std::move(impl));
}
/// The same over `comm_or_grid` (a host-memory communicator, or a comm::ProcessGrid of one) and `model`.
template <class E, class CommOrGrid, Module M>
AnyEngine make_engine_of(const config::Config& cfg, CommOrGrid& comm_or_grid, M& model, const EngineOptionsEdit& edit = {}) {
  return make_engine_of<E>(cfg, engine::erase_inputs(comm_or_grid, model), edit);
}

}  // namespace zerotk
