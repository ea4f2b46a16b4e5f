#pragma once
/// \file zerotk/checkpoint/reshard.hpp
/// Loading on another world size, tensor size, stage or bucket size: a loading rank's owned buffers
/// are assembled from the saved ranks' files by intersecting, parameter by parameter and in the
/// whole parameter's coordinates (whole.hpp), the fragments it owns now with the fragments each
/// saved rank owned (manifest.hpp). No offline conversion step.
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
#include "zerotk/checkpoint/whole.hpp"
#include "zerotk/engine/state.hpp"

namespace zerotk::checkpoint {

/// For every saved rank, the copies that fill this rank's fragments `want[g]` (rank `rank` of the
/// loading engine; fragments of the entries of `table`, the loading engine's shard table), through
/// the whole parameters' coordinates: so a tensor-split checkpoint loads on another tensor size.
inline std::map<int, std::vector<PieceCopy>> plan_reshard(const Manifest& m, const engine::ShardTable& table,
                                                          const std::vector<std::vector<zero::Fragment>>& want, int rank,
                                                          const std::string& manifest_path) {
  const WholeIndex index(m, manifest_path);
  std::map<int, std::vector<PieceCopy>> plan;
  for (std::size_t g = 0; g < want.size(); ++g) {
    for (const zero::Fragment& w : want[g]) index.cover(table.params[w.param], w, g, rank, plan);
  }
  return plan;
}

/// This rank's groups (fp32 master, optimizer state, Sparsity's masks) of checkpoint `tdir` for an engine whose
/// shard table is `sig.shards`, read from the saved ranks' files.
inline std::vector<EngineGroupState> reshard(const std::filesystem::path& tdir, const Manifest& m, const EngineSignature& sig) {
  const std::string manifest_path = (tdir / kManifestFile).string();
  std::vector<std::vector<zero::Fragment>> want;
  std::vector<EngineGroupState> groups(sig.shards.owned_numel.size());
  for (std::size_t g = 0; g < groups.size(); ++g) {
    want.push_back(sig.shards.fragments[g][static_cast<std::size_t>(sig.rank)]);
    const std::size_t n = sig.shards.owned_numel[g][static_cast<std::size_t>(sig.rank)];
    for (const auto& [what, into] : element_sections(groups[g], m.optimizer_states)) into->assign(n, 0.0f);
    // A group whose masks were saved gets them (from the agreed manifest, so every loading rank
    // decides alike): padding and pieces from files without masks stay 1, kept.
    if (m.sparsity_masks() && m.sparsity_groups[g]) groups[g].sparsity_keep.assign(n, 1);
    groups[g].optimizer.step = m.optimizer_steps[g];
  }
  // 1-bit LAMB's per-tensor states do not depend on the world size and every rank saved the same:
  // rank 0's.
  if (has_fresh_state(m.optimizer_states)) {
    const DataFileReader f = open_rank_file(tdir, m, 0);
    check_rank_file(f, m, 0);
    for (std::size_t g = 0; g < groups.size(); ++g) read_tensor_states(f, g, groups[g].optimizer.tensor_scalars);
  }
  for (const auto& [src, copies] : plan_reshard(m, sig.shards, want, sig.rank, manifest_path)) {
    const DataFileReader f = open_rank_file(tdir, m, src);
    check_rank_file(f, m, src);
    for (const PieceCopy& c : copies) {
      EngineGroupState& to = groups[c.group];
      for (const auto& [what, into] : element_sections(to, m.optimizer_states)) {
        f.read(section_name(c.group, what), ElementType::fp32, c.src_offset,
               std::span<float>(*into).subspan(static_cast<std::size_t>(c.dst_offset), static_cast<std::size_t>(c.numel)));
      }
      if (!to.sparsity_keep.empty() && f.section(section_name(c.group, kSparsityKeep), ElementType::byte).numel != 0) {
        f.read(section_name(c.group, kSparsityKeep), ElementType::byte, c.src_offset,
               std::as_writable_bytes(std::span<std::uint8_t>(to.sparsity_keep))
                   .subspan(static_cast<std::size_t>(c.dst_offset), static_cast<std::size_t>(c.numel)));
      }
    }
  }
  return groups;
}

}  // namespace zerotk::checkpoint
