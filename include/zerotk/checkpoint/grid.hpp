#pragma once
/// \file zerotk/checkpoint/grid.hpp
/// Checkpoints of an engine on a process grid: save, save_async and load over the grid's world, with
/// one rank file per world rank and one manifest whose table holds every tensor rank's shards
/// (grid_table.hpp). A parameter split across the tensor group is recorded with its split and each
/// shard's tensor index, so the checkpoint loads on another tensor size, data size or stage (the
/// shards merge or split on load, reshard.hpp), loads into an engine on a plain communicator
/// (tensor size 1), and exports whole tensors (export.hpp).
///
///   zerotk::comm::ProcessGrid grid(world, {.tensor = 2});
///   Engine engine(grid, model, options);                   // ModelOptions::tensor_split declared
///   zerotk::checkpoint::save(engine, grid, "ckpt");        // every rank of the world
///   ...
///   zerotk::checkpoint::load(engine2, grid4, "ckpt");      // e.g. tensor 4 x data 1, or tensor 1 x data 4

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "zerotk/checkpoint/agree.hpp"
#include "zerotk/checkpoint/grid_table.hpp"
#include "zerotk/checkpoint/load.hpp"
#include "zerotk/checkpoint/options.hpp"
#include "zerotk/checkpoint/save.hpp"
#include "zerotk/checkpoint/signature.hpp"
#include "zerotk/comm/grid.hpp"
#include "zerotk/core/error.hpp"

namespace zerotk::checkpoint {

namespace detail {

/// usage_error unless `engine` was built on `grid` (its place and group sizes are the grid's).
template <class E, HostCommunicator C>
void check_on_grid(const E& engine, comm::ProcessGrid<C>& grid, const char* where) {
  const auto& p = engine.grid_place();  // engine::GridPlace
  // The expert layout too where either side has one (an engine built without one keeps its expert
  // fields at their defaults).
  const bool experts = p.expert_size > 1 || grid.expert_size() > 1;
  const bool same = p.data_size == grid.size(comm::GridDim::data) && p.tensor_size == grid.size(comm::GridDim::tensor) &&
                    p.pipeline_size == grid.size(comm::GridDim::pipeline) && p.data_index == grid.data_index() &&
                    p.tensor_index == grid.tensor_index() && p.pipeline_index == grid.pipeline_index() &&
                    (!experts || (p.expert_size == grid.expert_size() && p.expert_index == grid.expert_index() &&
                                  p.expert_data_size == grid.expert_data_size() &&
                                  p.expert_data_index == grid.expert_data_index()));
  if (!same) {
    const auto at = [](int i, int n) { return std::to_string(i) + "/" + std::to_string(n); };
    std::string engine_at = "engine at data " + at(p.data_index, p.data_size) + ", tensor " + at(p.tensor_index, p.tensor_size) +
                            ", pipeline " + at(p.pipeline_index, p.pipeline_size);
    std::string grid_at = "grid at data " + std::to_string(grid.data_index()) + ", tensor " + std::to_string(grid.tensor_index()) +
                          ", pipeline " + std::to_string(grid.pipeline_index());
    if (experts) {
      engine_at += ", expert " + at(p.expert_index, p.expert_size) + ", expert data " + at(p.expert_data_index, p.expert_data_size);
      grid_at += ", expert " + at(grid.expert_index(), grid.expert_size()) + ", expert data " +
                 at(grid.expert_data_index(), grid.expert_data_size());
    }
    throw usage_error("pass the process grid the engine was built on", where, engine_at + "; " + grid_at);
  }
}

}  // namespace detail

/// The structure of `engine` over the whole grid: world rank and size, every part's table (collective
/// over grid.world(); the same table on every rank). `where` names the caller in errors.
template <class E, HostCommunicator C>
EngineSignature grid_signature(const E& engine, comm::ProcessGrid<C>& grid, const char* where) {
  agreed(grid.world(), where, [&] { detail::check_on_grid(engine, grid, where); });
  EngineSignature s = signature_of(engine);
  s.world_size = grid.world().size();
  s.rank = grid.world().rank();
  s.shards = gather_grid_table(grid.world(), engine.shard_table(), grid.data_index(), grid.expert_data_index(),
                               grid.size(comm::GridDim::data));
  s.parameter_count = 0;  // the whole model: each split parameter's shards add up to it once
  for (const engine::ShardParam& p : s.shards.params) s.parameter_count += p.numel;
  return s;
}

/// save_async for an engine on `grid` (collective over its world): see save.hpp.
template <TrainingEngine E, HostCommunicator C>
std::unique_ptr<PendingSave<C>> save_async(E& engine, comm::ProcessGrid<C>& grid, const std::filesystem::path& dir,
                                           const SaveOptions& options = {}) {
  const EngineSignature sig = grid_signature(engine, grid, "checkpoint::save");
  return detail::start_save(engine, grid.world(), dir, options, true, detail::snapshot_of(engine), [&] { return sig; });
}

/// save for an engine on `grid` (collective over its world): rank<world rank>.bin per rank, one
/// manifest; see save.hpp.
template <TrainingEngine E, HostCommunicator C>
SaveResult save(E& engine, comm::ProcessGrid<C>& grid, const std::filesystem::path& dir, const SaveOptions& options = {}) {
  const EngineSignature sig = grid_signature(engine, grid, "checkpoint::save");
  return detail::start_save(engine, grid.world(), dir, options, false, detail::views_into(engine), [&] { return sig; })
      ->commit();
}

/// load for an engine on `grid` (collective over its world): any checkpoint of the same model,
/// whatever grid (or plain communicator) saved it; see load.hpp. LoadResult::saved_world_size is
/// the saving world's size.
template <TrainingEngine E, HostCommunicator C>
LoadResult load(E& engine, comm::ProcessGrid<C>& grid, const std::filesystem::path& dir, const LoadOptions& options = {}) {
  const EngineSignature sig = grid_signature(engine, grid, "checkpoint::load");
  return detail::load_with(engine, grid.world(), dir, options, [] {}, [&] { return sig; });
}

}  // namespace zerotk::checkpoint
