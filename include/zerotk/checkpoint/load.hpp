#pragma once
/// \file zerotk/checkpoint/load.hpp
/// checkpoint::load: every rank calls it at an optimizer boundary (a freshly built engine is at one),
/// with the communicator the engine was built on. Every rank reads and verifies everything it needs
/// (manifest, its own file, the client state) and the ranks agree that all succeeded before any
/// engine changes: a failed load throws on every rank and leaves every engine as it was.
///
///   auto loaded = zerotk::checkpoint::load(engine, comm, "ckpt");        // the tag in ckpt/latest
///   restore_trainer(loaded.client_state);

#include <algorithm>
#include <filesystem>
#include <string>

#include "zerotk/checkpoint/agree.hpp"
#include "zerotk/checkpoint/settle.hpp"
#include "zerotk/checkpoint/layout.hpp"
#include "zerotk/checkpoint/manifest.hpp"
#include "zerotk/checkpoint/options.hpp"
#include "zerotk/checkpoint/rank_file.hpp"
#include "zerotk/checkpoint/read.hpp"
#include "zerotk/checkpoint/reshard.hpp"
#include "zerotk/checkpoint/save.hpp"
#include "zerotk/checkpoint/signature.hpp"
#include "zerotk/engine/state.hpp"

namespace zerotk::checkpoint {

namespace detail {

/// The structure the checkpoint's model declared against this model's (LoadOptions::model_structure):
/// usage_error naming the first key that differs or that one side lacks; nothing when either side
/// declared none.
inline void check_same_structure(const ModelStructure& saved, const ModelStructure& here, const std::string& manifest_path) {
  if (saved.empty() || here.empty()) return;
  for (const auto& [key, value] : saved) {
    const auto it = here.find(key);
    if (it == here.end()) {
      throw usage_error("the checkpoint's model declares \"" + key + "\", this model does not", manifest_path + ": model." + key,
                        "saved " + value);
    }
    if (it->second != value) {
      throw usage_error("the checkpoint is for another model (its declared structure differs)", manifest_path + ": model." + key,
                        "saved " + value + ", this model " + it->second);
    }
  }
  for (const auto& [key, value] : here) {
    if (!saved.contains(key)) {
      throw usage_error("this model declares \"" + key + "\", the checkpoint's model does not", manifest_path + ": model." + key,
                        "this model " + value);
    }
  }
}

/// This rank's EngineState from checkpoint `<dir>/<tag>`, after checking it fits the engine with
/// signature `sig` and current state `current`: its own file when the layout is unchanged, else
/// resharded from the files that hold its elements (reshard.hpp). The rank-local state is kept only
/// from its own file and when its sizes are the engine's (else it is cleared: it starts from zero).
/// Fills the result's fields other than tag and global_steps.
inline EngineState read_rank_state(const std::filesystem::path& dir, const std::string& tag, const EngineSignature& sig,
                                   const EngineState& current, LoadResult& result, const ModelStructure& model = {}) {
  const Manifest m = read_manifest(dir, tag);
  const std::filesystem::path tdir = tag_path(dir, tag);
  check_compatible(m, sig, current, (tdir / kManifestFile).string());
  check_same_structure(m.model, model, (tdir / kManifestFile).string());
  result.saved_world_size = m.world_size;
  EngineState s;
  if (same_layout(m, sig)) {
    s.groups = read_rank_file(open_rank_file(tdir, m, sig.rank), m, sig.rank);
    // The saved rank-local state is taken whole or not at all: an engine configured differently
    // (another codec, another optimizer comm) starts it from zero rather than from a misfit.
    const bool fits = std::ranges::equal(s.groups, current.groups, {}, [](const EngineGroupState& gs) { return size_of(gs.rank_local); },
                                         [](const EngineGroupState& gs) { return size_of(gs.rank_local); });
    for (EngineGroupState& gs : s.groups) {
      if (!fits) gs.rank_local = {};
    }
    result.rank_local_restored = std::ranges::any_of(s.groups, [](const EngineGroupState& gs) { return !gs.rank_local.empty(); });
  } else {
    s.groups = reshard(tdir, m, sig);
    result.resharded = true;
  }
  s.micro_steps = m.micro_steps;
  s.global_steps = m.global_steps;
  s.skipped_steps = m.skipped_steps;
  s.scaler = m.scaler;
  s.scheduler = m.scheduler;
  result.client_state = read_client_state(tdir, m);
  return s;
}

/// load's collective body over `comm`; `check()` (local) refuses a communicator the engine was not
/// built on, `signature()` (local) gives the engine's structure over comm's ranks.
template <class E, HostCommunicator C, class Check, class Signature>
LoadResult load_with(E& engine, C& comm, const std::filesystem::path& dir, const LoadOptions& options, Check&& check,
                     Signature&& signature) {
  detail::settle(engine);
  engine.synchronize();
  EngineState current;
  std::string tag;
  agreed(comm, "checkpoint load", [&] {
    check();
    current = engine.state();  // usage_error between micro-steps; the shapes the checkpoint must have
    tag = options.tag ? *options.tag : read_latest(dir);
    check_tag(tag, "checkpoint::load");
  });
  tag = agree_on_tag(comm, tag, options.tag_validation, options.on_warning);
  LoadResult result;
  EngineState loaded;
  agreed(comm, "checkpoint load (reading " + tag_path(dir, tag).string() + ")", [&] {
    loaded = detail::read_rank_state(dir, tag, signature(), current, result, options.model_structure);
  });
  engine.load_state(loaded);  // cannot fail now: every size was checked above, on every rank
  result.tag = tag;
  result.global_steps = loaded.global_steps;
  return result;
}

}  // namespace detail

/// Loads `<dir>/<tag>` (default: the tag `<dir>/latest` holds) into `engine`. Collective over `comm`;
/// only at an optimizer boundary. The checkpoint must be of the same model, precision and optimizer
/// (signature.hpp); it may come from another world size, tensor size, stage or bucket size
/// (reshard.hpp). An engine on a process grid loads with load(engine, grid, dir) (grid.hpp).
template <TrainingEngine E, HostCommunicator C>
LoadResult load(E& engine, C& comm, const std::filesystem::path& dir, const LoadOptions& options = {}) {
  return detail::load_with(
      engine, comm, dir, options, [&] { detail::check_same_group(engine, comm, "checkpoint::load"); },
      [&] { return signature_of(engine); });
}

}  // namespace zerotk::checkpoint
