#pragma once
/// \file zerotk/checkpoint/pending_save.hpp
/// PendingSave: the second half of a save. A background thread writes this rank's file from the
/// snapshot save_async took; commit() then agrees that every rank's file is on disk, and rank 0
/// writes the manifest and commits (commit.hpp).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <string>
#include <thread>
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

/// A save whose rank files are being written by a background thread (save_async). Training may go
/// on; commit() then finishes the save collectively. Call commit() on every rank, or on none: a
/// PendingSave dropped without commit() waits for its writer and leaves only a temporary directory,
/// which the next save removes; `latest` still names the previous checkpoint.
template <HostCommunicator C>
class PendingSave {
 public:
  PendingSave(C& comm, std::filesystem::path dir, std::filesystem::path temp, std::string tag, EngineSignature sig,
              EngineState state, std::vector<std::byte> client_state)
      : comm_(&comm),
        dir_(std::move(dir)),
        temp_(std::move(temp)),
        tag_(std::move(tag)),
        sig_(std::move(sig)),
        state_(std::move(state)),
        client_state_(std::move(client_state)) {
    writer_ = std::thread([this] {
      try {
        record_ = write_rank_file(temp_, state_, comm_->rank(), comm_->size());
      } catch (...) {
        error_ = std::current_exception();
      }
      done_.store(true, std::memory_order_release);
    });
  }
  PendingSave(const PendingSave&) = delete;
  PendingSave& operator=(const PendingSave&) = delete;
  ~PendingSave() {
    if (writer_.joinable()) writer_.join();
  }

  const std::string& tag() const noexcept { return tag_; }
  /// True once this rank's file is on disk (or its write failed): commit() would not wait for it.
  bool written() const noexcept { return done_.load(std::memory_order_acquire); }

  /// Collective: waits for every rank's file, then rank 0 writes the manifest and the client state
  /// and moves `latest`. Every rank returns, or every rank throws (a failed write on one rank
  /// included). Once only.
  SaveResult commit() {
    if (!writer_.joinable()) throw usage_error("commit() was already called", "checkpoint::PendingSave", tag_);
    writer_.join();
    agreed(*comm_, "checkpoint save (writing rank files)", [&] {
      if (error_) std::rethrow_exception(error_);
    });
    const std::vector<std::uint64_t> gathered = all_gather_u64(*comm_, {record_.bytes, record_.checksum});
    agreed(*comm_, "checkpoint save (commit)", [&] {
      if (comm_->rank() == 0) publish(dir_, temp_, detail::make_manifest(sig_, state_, tag_, gathered), client_state_);
    });
    return SaveResult{tag_, tag_path(dir_, tag_)};
  }

 private:
  C* comm_;
  std::filesystem::path dir_, temp_;
  std::string tag_;
  EngineSignature sig_;
  EngineState state_;
  std::vector<std::byte> client_state_;
  FileRecord record_;
  std::exception_ptr error_;
  std::atomic<bool> done_{false};
  std::thread writer_;
};

}  // namespace zerotk::checkpoint
