#pragma once
/// \file zerotk/checkpoint/save.hpp
/// checkpoint::save: every rank calls it at an optimizer boundary, with the communicator the engine
/// was built on. Each rank writes its own file; rank 0 writes the manifest and commits
/// (commit.hpp). Every rank returns, or every rank throws: a failure on one rank (a full disk, a call
/// between micro-steps) reaches all of them, and `latest` still names the previous checkpoint.
///
///   auto saved = zerotk::checkpoint::save(engine, comm, "ckpt");          // ckpt/global_step<N>
///   std::string blob = ...;                                               // the trainer's own state
///   zerotk::checkpoint::save(engine, comm, "ckpt", {.tag = "best", .client_state = std::as_bytes(std::span(blob))});

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "zerotk/checkpoint/agree.hpp"
#include "zerotk/checkpoint/commit.hpp"
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
}

/// The manifest rank 0 writes; `gathered` is every rank's {bytes, checksum} of its file.
inline Manifest make_manifest(const EngineSignature& sig, const EngineState& s, const std::string& tag,
                              const std::vector<std::uint64_t>& gathered) {
  Manifest m;
  m.tag = tag;
  m.world_size = sig.world_size;
  m.stage = sig.stage;
  m.precision = sig.precision;
  m.optimizer = sig.optimizer;
  m.optimizer_states = optimizer_state_names();
  m.parameter_count = sig.parameter_count;
  m.flat_numel = sig.flat_numel;
  m.shards = sig.shards;
  for (const EngineGroupState& g : s.groups) m.optimizer_steps.push_back(g.optimizer.step);
  m.micro_steps = s.micro_steps;
  m.global_steps = s.global_steps;
  m.skipped_steps = s.skipped_steps;
  m.scaler = s.scaler;
  m.scheduler = s.scheduler;
  for (int r = 0; r < sig.world_size; ++r) {
    const std::uint64_t* rec = gathered.data() + 2 * static_cast<std::size_t>(r);
    m.rank_files.push_back(FileRecord{rank_file_name(r), rec[0], rec[1]});
  }
  return m;
}

/// A parameter name is the rest of its manifest line: it cannot hold a line break.
inline void check_names(const EngineSignature& sig) {
  for (const engine::ShardParam& p : sig.shards.params) {
    if (p.name.find_first_of("\r\n") != std::string::npos) {
      throw usage_error("a parameter name with a line break cannot be saved", "checkpoint::save", p.name);
    }
  }
}

}  // namespace detail

/// Saves `engine` into `<dir>/<tag>` and points `<dir>/latest` at it. Collective over `comm` (the
/// engine's communicator); only at an optimizer boundary (usage_error otherwise, on every rank).
template <class E, HostCommunicator C>
SaveResult save(E& engine, C& comm, const std::filesystem::path& dir, const SaveOptions& options = {}) {
  engine.synchronize();  // no parameter gather of the engine's in flight under our collectives
  EngineState state;
  EngineSignature sig;
  std::string tag;
  agreed(comm, "checkpoint save", [&] {
    detail::check_same_group(engine, comm, "checkpoint::save");
    state = engine.state();  // usage_error between micro-steps
    sig = signature_of(engine);
    detail::check_names(sig);
    tag = options.tag ? *options.tag : default_tag(state.global_steps);
    check_tag(tag, "checkpoint::save");
  });
  tag = agree_on_tag(comm, tag, options.tag_validation, options.on_warning);
  const std::filesystem::path temp = temp_path(dir, tag);
  agreed(comm, "checkpoint save (preparing " + temp.string() + ")", [&] {
    if (comm.rank() == 0) prepare_temp(dir, temp);
  });
  std::vector<std::uint64_t> mine;
  agreed(comm, "checkpoint save (writing rank files)", [&] {
    const FileRecord rec =
        write_data_file(temp, rank_file_name(comm.rank()), encode_rank_file(state, comm.rank(), comm.size()));
    mine = {rec.bytes, rec.checksum};
  });
  const std::vector<std::uint64_t> gathered = all_gather_u64(comm, mine);
  agreed(comm, "checkpoint save (commit)", [&] {
    if (comm.rank() == 0) {
      publish(dir, temp, detail::make_manifest(sig, state, tag, gathered), options.client_state);
    }
  });
  return SaveResult{tag, tag_path(dir, tag)};
}

}  // namespace zerotk::checkpoint
