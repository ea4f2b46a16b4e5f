#pragma once
/// \file zerotk/checkpoint/reshard.hpp
/// Loading on another world size, stage or bucket size: a loading rank's owned buffers are
/// assembled from the saved ranks' files by intersecting, parameter by parameter, the fragments it
/// owns now with the fragments each saved rank owned (manifest.hpp). No offline conversion step.
///
/// Each piece comes from the saved rank of the loading rank's own number when that rank held it
/// (so an unchanged layout reads one file), else from the lowest saved rank that held it (stage 0
/// saved every element on every rank: rank 0's file serves them all). Files are opened one at a
/// time, each verified against its checksum, and only the pieces needed are read into place (pread),
/// so memory stays at the rank's own state. Padding
/// elements (owned, but in no fragment) are zero, as in a freshly built engine.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "zerotk/checkpoint/manifest.hpp"
#include "zerotk/checkpoint/rank_file.hpp"
#include "zerotk/checkpoint/read.hpp"
#include "zerotk/checkpoint/signature.hpp"
#include "zerotk/engine/state.hpp"

namespace zerotk::checkpoint {

/// One copy of `numel` consecutive elements of flat group `group`, from a saved rank's owned
/// buffer to this rank's.
struct PieceCopy {
  std::size_t group = 0;
  std::uint64_t src_offset = 0, dst_offset = 0, numel = 0;
};

/// Which saved rank held which piece of every parameter, indexed once per manifest.
class FragmentIndex {
 public:
  FragmentIndex(const Manifest& m, std::string manifest_path) : m_(&m), path_(std::move(manifest_path)), held_(m.shards.params.size()) {
    for (std::size_t g = 0; g < m.shards.fragments.size(); ++g) {
      for (int r = 0; r < m.world_size; ++r) {
        for (const zero::Fragment& f : m.shards.fragments[g][static_cast<std::size_t>(r)]) held_[f.param].push_back({r, &f});
      }
    }
  }

  /// Adds to `plan` (by saved rank) the copies that fill `want`, a fragment of a parameter of flat
  /// group `group` placed at want.owned_offset; each element is covered exactly once, preferring
  /// saved rank `prefer`, else the lowest saved rank that held it. io_error if none did.
  void cover(const zero::Fragment& want, std::size_t group, int prefer, std::map<int, std::vector<PieceCopy>>& plan) const {
    for (std::uint64_t at = want.param_offset, end = want.param_offset + want.numel; at < end;) {
      const Held* best = nullptr;
      for (const Held& h : held_[want.param]) {
        const zero::Fragment& f = *h.fragment;
        if (f.param_offset <= at && at < f.param_offset + f.numel && (!best || h.rank == prefer)) best = &h;
      }
      if (!best) {
        throw io_error("no saved rank holds element " + std::to_string(at) + " of parameter \"" +
                           m_->shards.params[want.param].name + "\"",
                       path_);
      }
      const zero::Fragment& f = *best->fragment;
      const std::uint64_t n = std::min(end, f.param_offset + f.numel) - at;
      plan[best->rank].push_back(
          PieceCopy{group, f.owned_offset + (at - f.param_offset), want.owned_offset + (at - want.param_offset), n});
      at += n;
    }
  }

 private:
  struct Held {
    int rank;
    const zero::Fragment* fragment;
  };
  const Manifest* m_;
  std::string path_;
  std::vector<std::vector<Held>> held_;  // [param]
};

/// For every saved rank, the copies that fill this rank's fragments `want[g]` (rank `rank` of the
/// loading engine).
inline std::map<int, std::vector<PieceCopy>> plan_reshard(const Manifest& m,
                                                          const std::vector<std::vector<zero::Fragment>>& want, int rank,
                                                          const std::string& manifest_path) {
  const FragmentIndex index(m, manifest_path);
  std::map<int, std::vector<PieceCopy>> plan;
  for (std::size_t g = 0; g < want.size(); ++g) {
    for (const zero::Fragment& w : want[g]) index.cover(w, g, rank, plan);
  }
  return plan;
}

/// This rank's groups (fp32 master, optimizer state) of checkpoint `tdir` for an engine whose
/// shard table is `sig.shards`, read from the saved ranks' files.
inline std::vector<EngineGroupState> reshard(const std::filesystem::path& tdir, const Manifest& m, const EngineSignature& sig) {
  const std::string manifest_path = (tdir / kManifestFile).string();
  std::vector<std::vector<zero::Fragment>> want;
  std::vector<EngineGroupState> groups(sig.shards.owned_numel.size());
  for (std::size_t g = 0; g < groups.size(); ++g) {
    want.push_back(sig.shards.fragments[g][static_cast<std::size_t>(sig.rank)]);
    const std::size_t n = sig.shards.owned_numel[g][static_cast<std::size_t>(sig.rank)];
    for (const auto& [what, into] : element_sections(groups[g], m.optimizer_states)) into->assign(n, 0.0f);
    groups[g].optimizer.step = m.optimizer_steps[g];
  }
  // 1-bit LAMB's per-tensor states do not depend on the world size and every rank saved the same:
  // rank 0's.
  if (has_fresh_state(m.optimizer_states)) {
    const DataFileReader f = open_rank_file(tdir, m, 0);
    check_rank_file(f, m, 0);
    for (std::size_t g = 0; g < groups.size(); ++g) read_tensor_states(f, g, groups[g].optimizer.tensor_scalars);
  }
  for (const auto& [src, copies] : plan_reshard(m, want, sig.rank, manifest_path)) {
    const DataFileReader f = open_rank_file(tdir, m, src);
    check_rank_file(f, m, src);
    for (const PieceCopy& c : copies) {
      EngineGroupState& to = groups[c.group];
      for (const auto& [what, into] : element_sections(to, m.optimizer_states)) {
        f.read(section_name(c.group, what), ElementType::fp32, c.src_offset,
               std::span<float>(*into).subspan(static_cast<std::size_t>(c.dst_offset), static_cast<std::size_t>(c.numel)));
      }
    }
  }
  return groups;
}

}  // namespace zerotk::checkpoint
