#pragma once
/// \file zerotk/checkpoint/reshard.hpp
/// Loading on another world size, stage or bucket size: a loading rank's owned buffers are
/// assembled from the saved ranks' files by intersecting, parameter by parameter, the fragments it
/// owns now with the fragments each saved rank owned (manifest.hpp). No offline conversion step.
///
/// Each piece comes from the saved rank of the loading rank's own number when that rank held it
/// (so an unchanged layout reads one file), else from the lowest saved rank that held it (stage 0
/// saved every element on every rank: rank 0's file serves them all). Files are read one at a
/// time, checksums verified, so memory stays at one saved file plus the rank's own state. Padding
/// elements (owned, but in no fragment) are zero, as in a freshly built engine.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
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

/// For every saved rank, the copies that fill this rank's fragments (`want[g]`); each element of
/// each wanted fragment is covered exactly once. io_error if the manifest leaves one uncovered.
inline std::map<int, std::vector<PieceCopy>> plan_reshard(const Manifest& m,
                                                          const std::vector<std::vector<zero::Fragment>>& want, int rank,
                                                          const std::string& manifest_path) {
  std::map<int, std::vector<PieceCopy>> plan;
  for (std::size_t g = 0; g < want.size(); ++g) {
    // The saved fragments of each parameter of group g, as (rank, fragment).
    std::vector<std::vector<std::pair<int, const zero::Fragment*>>> held(m.shards.params.size());
    for (int r = 0; r < m.world_size; ++r) {
      for (const zero::Fragment& f : m.shards.fragments[g][static_cast<std::size_t>(r)]) held[f.param].emplace_back(r, &f);
    }
    for (const zero::Fragment& w : want[g]) {
      for (std::uint64_t at = w.param_offset, end = w.param_offset + w.numel; at < end;) {
        const std::pair<int, const zero::Fragment*>* best = nullptr;
        for (const auto& h : held[w.param]) {
          const zero::Fragment& f = *h.second;
          if (f.param_offset <= at && at < f.param_offset + f.numel && (!best || h.first == rank)) best = &h;
        }
        if (!best) {
          throw io_error("no saved rank holds element " + std::to_string(at) + " of parameter \"" +
                             m.shards.params[w.param].name + "\"",
                         manifest_path);
        }
        const zero::Fragment& f = *best->second;
        const std::uint64_t n = std::min(end, f.param_offset + f.numel) - at;
        plan[best->first].push_back(PieceCopy{g, f.owned_offset + (at - f.param_offset), w.owned_offset + (at - w.param_offset), n});
        at += n;
      }
    }
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
    groups[g].master.assign(n, 0.0f);
    groups[g].optimizer.m.assign(n, 0.0f);
    groups[g].optimizer.v.assign(n, 0.0f);
    groups[g].optimizer.step = m.optimizer_steps[g];
  }
  for (const auto& [src, copies] : plan_reshard(m, want, sig.rank, manifest_path)) {
    const FileRecord& rec = m.rank_files[static_cast<std::size_t>(src)];
    const std::vector<EngineGroupState> saved = decode_rank_file(read_verified(tdir, rec), (tdir / rec.name).string(), m, src);
    for (const PieceCopy& c : copies) {
      const EngineGroupState& from = saved[c.group];
      EngineGroupState& to = groups[c.group];
      const auto copy = [&](const std::vector<float>& a, std::vector<float>& b) {
        std::copy_n(a.begin() + static_cast<std::ptrdiff_t>(c.src_offset), c.numel, b.begin() + static_cast<std::ptrdiff_t>(c.dst_offset));
      };
      copy(from.master, to.master);
      copy(from.optimizer.m, to.optimizer.m);
      copy(from.optimizer.v, to.optimizer.v);
    }
  }
  return groups;
}

}  // namespace zerotk::checkpoint
