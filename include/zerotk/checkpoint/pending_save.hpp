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
#include <span>
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

/// The manifest rank 0 writes: counters, scaler and scheduler from `s`, step counts from `groups`;
/// `gathered` is every rank's {bytes, checksum} of its file; `sparsity_groups` the ranks' agreed
/// answer to which groups hold Sparsity's masks (empty: none).
inline Manifest make_manifest(const EngineSignature& sig, const EngineState& s, std::span<const EngineGroupView> groups,
                              const std::string& tag, const std::vector<std::uint64_t>& gathered,
                              const std::vector<char>& sparsity_groups = {}) {
  Manifest m;
  m.tag = tag;
  m.world_size = sig.world_size;
  m.stage = sig.stage;
  m.precision = sig.precision;
  m.optimizer = sig.optimizer;
  m.optimizer_states = optimizer_state_names(sig.optimizer);
  m.rank_local = has_rank_local(groups);
  m.sparsity_groups = sparsity_groups;
  m.parameter_count = sig.parameter_count;
  m.flat_numel = sig.flat_numel;
  m.shards = sig.shards;
  for (const EngineGroupView& g : groups) m.optimizer_steps.push_back(g.step);
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

/// The model's declared structure is `model.<key> <value>` lines: a key of letters, digits, '_', '.'
/// and '-', a value without line breaks.
inline void check_model_structure(const ModelStructure& s) {
  for (const auto& [key, value] : s) {
    const bool key_ok = !key.empty() && std::all_of(key.begin(), key.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
    });
    if (!key_ok) throw usage_error("a model structure key is letters, digits, '_', '.' and '-'", "checkpoint::SaveOptions::model_structure", key);
    if (value.find_first_of("\r\n") != std::string::npos) {
      throw usage_error("a model structure value cannot hold a line break", "checkpoint::SaveOptions::model_structure", key);
    }
  }
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

/// The second half of a save: this rank's file being written, then commit(). save_async starts one
/// whose file a background thread writes from the save's own snapshot, while training goes on;
/// save() starts one that writes on the calling thread straight from the engine's memory (the
/// views; no snapshot) and commits at once. Call commit() on every rank, or on none: a PendingSave
/// dropped without commit() waits for its writer and leaves only a temporary directory, which the
/// next save removes; `latest` still names the previous checkpoint.
template <HostCommunicator C>
class PendingSave {
 public:
  struct Parts {
    std::filesystem::path dir, temp;
    std::string tag;
    EngineSignature sig;
    EngineState state;                    ///< counters, scaler, scheduler (and the snapshot's groups)
    std::vector<EngineGroupView> groups;  ///< what the rank file holds: views into `state` or the engine
    std::vector<std::byte> client_state;
    ModelStructure model;  ///< SaveOptions::model_structure
    /// Which groups hold Sparsity's masks on some rank (empty: none): agreed by every rank before
    /// the files are written, so that every file and the manifest have the same sections.
    std::vector<char> sparsity_groups;
  };

  /// Writes this rank's file, on a background thread if `background` (then `parts.groups` must view
  /// memory the PendingSave owns: `parts.state`'s groups).
  PendingSave(C& comm, Parts parts, bool background) : comm_(&comm), p_(std::move(parts)) {
    if (background) {
      writer_ = std::thread([this] { write(); });
    } else {
      write();
    }
  }
  PendingSave(const PendingSave&) = delete;
  PendingSave& operator=(const PendingSave&) = delete;
  ~PendingSave() {
    if (writer_.joinable()) writer_.join();
  }

  const std::string& tag() const noexcept { return p_.tag; }
  /// True once this rank's file is on disk (or its write failed): commit() would not wait for it.
  bool written() const noexcept { return done_.load(std::memory_order_acquire); }

  /// Collective: waits for every rank's file, then rank 0 writes the manifest and the client state
  /// and moves `latest`. Every rank returns, or every rank throws (a failed write on one rank
  /// included). Once only.
  SaveResult commit() {
    if (committed_) throw usage_error("commit() was already called", "checkpoint::PendingSave", p_.tag);
    committed_ = true;
    if (writer_.joinable()) writer_.join();
    agreed(*comm_, "checkpoint save (writing rank files)", [&] {
      if (error_) std::rethrow_exception(error_);
    });
    const std::vector<std::uint64_t> gathered = all_gather_u64(*comm_, {record_.bytes, record_.checksum});
    agreed(*comm_, "checkpoint save (commit)", [&] {
      if (comm_->rank() == 0) {
        Manifest m = detail::make_manifest(p_.sig, p_.state, p_.groups, p_.tag, gathered, p_.sparsity_groups);
        m.model = p_.model;
        publish(p_.dir, p_.temp, m, p_.client_state);
      }
    });
    return SaveResult{p_.tag, tag_path(p_.dir, p_.tag)};
  }

 private:
  void write() noexcept {
    try {
      record_ = write_rank_file(p_.temp, p_.groups, comm_->rank(), comm_->size(), optimizer_state_names(p_.sig.optimizer),
                                !p_.sparsity_groups.empty());
    } catch (...) {
      error_ = std::current_exception();
    }
    done_.store(true, std::memory_order_release);
  }

  C* comm_;
  Parts p_;
  FileRecord record_;
  std::exception_ptr error_;
  std::atomic<bool> done_{false};
  bool committed_ = false;
  std::thread writer_;
};

}  // namespace zerotk::checkpoint
