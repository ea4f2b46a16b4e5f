#pragma once
/// \file zerotk/checkpoint/save.hpp
/// checkpoint::save and save_async: every rank calls them at an optimizer boundary, with the
/// communicator the engine was built on. Each rank writes its own file; rank 0 writes the manifest
/// and commits (commit.hpp). Every rank returns, or every rank throws: a failure on one rank (a full
/// disk, a call between micro-steps) reaches all of them, and `latest` still names the previous
/// checkpoint. save_async returns after the snapshot; the files are written while training goes on.
///
///   auto saved = zerotk::checkpoint::save(engine, comm, "ckpt");          // ckpt/global_step<N>
///   std::string blob = ...;                                               // the trainer's own state
///   zerotk::checkpoint::save(engine, comm, "ckpt", {.tag = "best", .client_state = std::as_bytes(std::span(blob))});

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zerotk/checkpoint/agree.hpp"
#include "zerotk/checkpoint/settle.hpp"
#include "zerotk/checkpoint/pending_save.hpp"
#include "zerotk/checkpoint/layout.hpp"
#include "zerotk/checkpoint/manifest.hpp"
#include "zerotk/checkpoint/options.hpp"
#include "zerotk/checkpoint/rank_file.hpp"
#include "zerotk/checkpoint/signature.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/engine/state.hpp"

namespace zerotk::checkpoint {

namespace detail {

template <class E, class C>
void check_same_group(const E& engine, const C& comm, const char* where) {
  if (engine.rank() != comm.rank() || engine.world_size() != comm.size()) {
    throw usage_error("pass the communicator the engine was built on", where,
                      "engine rank " + std::to_string(engine.rank()) + " of " + std::to_string(engine.world_size()) +
                          ", communicator rank " + std::to_string(comm.rank()) + " of " + std::to_string(comm.size()));
  }
  const auto& place = engine.grid_place();
  if (place.expert_params && place.experts_apart()) {  // the same on every rank
    throw usage_error("the engine's expert parameters live on an expert-data group apart from its data group: save and "
                      "load it through its grid (checkpoint::save(engine, grid, dir), checkpoint::load(engine, grid, dir))",
                      where, "expert size " + std::to_string(place.expert_size));
  }
}

/// Which groups hold Sparsity's masks on any rank of `comm` (empty: none): one small all-reduce, so
/// that a rank without masks for a group (a pipeline stage without sparse parameters) still writes
/// the group's (empty) section. Every rank has as many groups (the signature's check).
template <HostCommunicator C>
std::vector<char> agree_sparsity_groups(C& comm, std::span<const EngineGroupView> groups) {
  const std::vector<char> mine = sparsity_groups_of(groups);
  std::vector<std::int32_t> any(groups.size(), 0);
  for (std::size_t g = 0; g < mine.size(); ++g) any[g] = mine[g];
  if (!any.empty()) comm.all_reduce(any.data(), any.data(), any.size(), DType::int32, comm::ReduceOp::max).wait();
  std::vector<char> out(any.begin(), any.end());
  if (std::none_of(out.begin(), out.end(), [](char c) { return c != 0; })) out.clear();
  return out;
}

/// The collective first half of both saves: boundary check, scalar state, signature, the agreed
/// tag, the temporary directory. `groups(parts)` fills the parts' state and group views;
/// `signature()` (local, no communication) gives the engine's structure over `comm`'s ranks.
template <class E, HostCommunicator C, class Groups, class Signature>
std::unique_ptr<PendingSave<C>> start_save(E& engine, C& comm, const std::filesystem::path& dir, const SaveOptions& options,
                                           bool background, Groups&& groups, Signature&& signature) {
  detail::settle(engine);
  engine.synchronize();  // no parameter gather of the engine's in flight under our collectives
  typename PendingSave<C>::Parts p;
  p.dir = dir;
  agreed(comm, "checkpoint save", [&] {
    groups(p);  // usage_error between micro-steps
    p.sig = signature();
    check_names(p.sig);
    check_model_structure(options.model_structure);
    p.tag = options.tag ? *options.tag : default_tag(p.state.global_steps);
    check_tag(p.tag, "checkpoint::save");
  });
  p.tag = agree_on_tag(comm, p.tag, options.tag_validation, options.on_warning);
  p.sparsity_groups = agree_sparsity_groups(comm, p.groups);
  p.temp = temp_path(dir, p.tag);
  agreed(comm, "checkpoint save (preparing " + p.temp.string() + ")", [&] {
    if (comm.rank() == 0) prepare_temp(dir, p.temp);
  });
  p.client_state.assign(options.client_state.begin(), options.client_state.end());
  p.model = options.model_structure;
  return std::make_unique<PendingSave<C>>(comm, std::move(p), background);
}

/// save_async's rank state: a snapshot the PendingSave owns (training may go on).
template <class E>
auto snapshot_of(E& engine) {
  return [&engine](auto& p) {
    p.state = engine.state();
    p.groups = views_of(p.state);
  };
}

/// save's rank state: views of the engine's own buffers where it has them (no copy).
template <class E>
auto views_into(E& engine) {
  return [&engine](auto& p) {
    bool views = false;  // a typed engine has state_views() or not; AnyEngine says at run time
    if constexpr (requires { engine.views_state(); }) {
      views = engine.views_state();
    } else if constexpr (requires { engine.state_views(); }) {
      views = true;
    }
    if (views) {
      if constexpr (requires { engine.state_views(); }) {
        p.state = engine.scalar_state();
        p.groups = engine.state_views();
      }
    } else {
      p.state = engine.state();
      p.groups = views_of(p.state);
    }
  };
}

}  // namespace detail

/// Starts saving `engine` into `<dir>/<tag>`: collective over `comm` (the engine's communicator),
/// only at an optimizer boundary (usage_error otherwise, on every rank). It returns once this rank's
/// state is copied into host memory (the snapshot) and the ranks agree on the tag; a thread then
/// writes the rank's file while training goes on. PendingSave::commit() finishes the save.
///
///   auto pending = zerotk::checkpoint::save_async(engine, comm, "ckpt");
///   train_some_more();                       // the engine may step; the snapshot is its own
///   pending->commit();                       // every rank; ckpt/latest moves here
template <TrainingEngine E, HostCommunicator C>
std::unique_ptr<PendingSave<C>> save_async(E& engine, C& comm, const std::filesystem::path& dir,
                                           const SaveOptions& options = {}) {
  return detail::start_save(engine, comm, dir, options, true, detail::snapshot_of(engine), [&] {
    detail::check_same_group(engine, comm, "checkpoint::save");
    return signature_of(engine);
  });
}

/// Saves `engine` into `<dir>/<tag>` and points `<dir>/latest` at it. Every rank returns, or every
/// rank throws: a failure on one rank (a full disk, a call between micro-steps) reaches all of them,
/// and `latest` still names the previous checkpoint. On host-memory engines the rank file is
/// written straight from the engine's buffers (no copy of the state is made, except the rank-local
/// state of compressed communication, gathered from several buffers: engine/state.hpp).
template <TrainingEngine E, HostCommunicator C>
SaveResult save(E& engine, C& comm, const std::filesystem::path& dir, const SaveOptions& options = {}) {
  return detail::start_save(engine, comm, dir, options, false, detail::views_into(engine), [&] {
    detail::check_same_group(engine, comm, "checkpoint::save");
    return signature_of(engine);
  })->commit();
}

}  // namespace zerotk::checkpoint
