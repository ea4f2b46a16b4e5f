#pragma once
/// \file zerotk/checkpoint/rank_file.hpp
/// One rank's data file <-> that rank's part of an EngineState. Per flat group g (the working-
/// precision group, then the fp32-kept group), sections over the rank's owned elements:
///   group<g>.step         int64[1]        the optimizer's step count
///   group<g>.master       fp32[owned]     the fp32 master partition (padding included, as owned)
/// then one per name in the manifest's optimizer_states (the optimizer tag's states, policies.hpp):
///   group<g>.exp_avg      fp32[owned]     m (every optimizer)
///   group<g>.exp_avg_sq   fp32[owned]     v (all but the one-moment optimizers: Lion)
///   group<g>.exp_avg_sq_fresh    fp32[owned]    1-bit LAMB's fresh variance v_f
/// and for 1-bit LAMB (exp_avg_sq_fresh among the states):
///   group<g>.lamb_tensor_states  fp64[3 T]      per tensor c_f, F, k (T tensors; k = 0 while unset)
/// and two more per group when the manifest says `rank_local_state yes` (compressed communication:
/// engine/state.hpp's RankLocalState, meaningful only to the same rank of the same layout):
///   group<g>.rank_local          fp32[any]     error feedback, 0/1 Adam's u, 1-bit LAMB's tail
///   group<g>.rank_local_scalars  fp64[any]     0/1 Adam's lr sums
/// and one more per group when it has `sparsity_masks` (Sparsity<NofM<N, M>>'s masks, chosen):
///   group<g>.sparsity_keep       byte[owned or 0]   1: kept, 0: pruned; empty where this rank holds
///                                                   none for the group. Resharded like the master.
/// Counters, scaler and scheduler are the same on every rank and live in the manifest.
///
/// Written streamed (file_writer.hpp) and read through a verified DataFileReader (file_reader.hpp):
/// neither side holds the file in memory, only the state it is made of.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "zerotk/checkpoint/file_reader.hpp"
#include "zerotk/checkpoint/file_writer.hpp"
#include "zerotk/checkpoint/format.hpp"
#include "zerotk/checkpoint/layout.hpp"
#include "zerotk/checkpoint/manifest.hpp"
#include "zerotk/checkpoint/signature.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/engine/state.hpp"

namespace zerotk::checkpoint {

/// step and master, before the per-element optimizer states.
inline constexpr std::size_t kFixedSectionsPerGroup = 2;
inline constexpr std::string_view kFreshState = "exp_avg_sq_fresh";
inline constexpr std::string_view kLambTensorStates = "lamb_tensor_states";
inline constexpr std::string_view kRankLocal = "rank_local";
inline constexpr std::string_view kRankLocalScalars = "rank_local_scalars";
inline constexpr std::string_view kSparsityKeep = "sparsity_keep";

/// Whether the optimizer states named in a manifest include 1-bit LAMB's.
inline bool has_fresh_state(const std::vector<std::string>& states) {
  return std::find(states.begin(), states.end(), kFreshState) != states.end();
}
/// Sections per group of a checkpoint with manifest `m`.
inline std::size_t sections_per_group(const Manifest& m) {
  return kFixedSectionsPerGroup + m.optimizer_states.size() + (has_fresh_state(m.optimizer_states) ? 1 : 0) +
         (m.rank_local ? 2 : 0) + (m.sparsity_masks() ? 1 : 0);
}

/// This rank's answer to "which groups hold Sparsity's masks": one flag per group. Ranks may differ
/// (a pipeline stage without sparse parameters): the save takes the maximum over its ranks
/// (save.hpp), which the manifest records and every rank file follows.
inline std::vector<char> sparsity_groups_of(std::span<const EngineGroupView> groups) {
  std::vector<char> out;
  for (const EngineGroupView& g : groups) out.push_back(g.sparsity_keep.empty() ? 0 : 1);
  if (std::none_of(out.begin(), out.end(), [](char c) { return c != 0; })) out.clear();
  return out;
}

/// Whether rank files of `groups` carry rank-local sections: when any group has rank-local state
/// (then every group has both sections, empty where it has none). Every rank answers the same: the
/// sizes depend on the layout and the world size only, and rank 0's answer goes into the manifest.
inline bool has_rank_local(std::span<const EngineGroupView> groups) {
  return std::any_of(groups.begin(), groups.end(), [](const EngineGroupView& g) { return g.has_rank_local(); });
}

inline std::string section_name(std::size_t group, std::string_view what) {
  return "group" + std::to_string(group) + "." + std::string(what);
}

/// The view of per-element state `what` (an optimizer_states name) of group view `gs`.
inline std::span<const float> state_span(const EngineGroupView& gs, std::string_view what) {
  if (what == "exp_avg") return gs.m;
  if (what == "exp_avg_sq") return gs.v;
  if (what == kFreshState) return gs.v_fresh;
  throw usage_error("no such per-element optimizer state", "checkpoint::state_span", std::string(what));
}

/// Calls `add(name, span)` for every section of the rank file of groups `groups`, in file order;
/// `states`: the optimizer's per-element states (optimizer_state_names); `masks`: whether the files
/// of this save hold Sparsity's masks (the ranks' agreed answer).
template <class Add>
void for_each_rank_section(std::span<const EngineGroupView> groups, const std::vector<std::string>& states, bool masks,
                           Add&& add) {
  const bool rank_local = has_rank_local(groups);
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const EngineGroupView& gs = groups[g];
    add(section_name(g, "step"), std::span<const std::int64_t>(&gs.step, 1));
    add(section_name(g, "master"), gs.master);
    for (const std::string& what : states) add(section_name(g, what), state_span(gs, what));
    if (has_fresh_state(states)) add(section_name(g, kLambTensorStates), std::span<const double>(gs.tensor_scalars));
    if (rank_local) {
      add(section_name(g, kRankLocal), gs.rank_local_values);
      add(section_name(g, kRankLocalScalars), gs.rank_local_scalars);
    }
    if (masks) add(section_name(g, kSparsityKeep), std::as_bytes(gs.sparsity_keep));
  }
}

/// Streams the rank file of `groups` to `dir/<rank file name>` (O_DIRECT where the file system
/// allows), fsyncs it and the directory; returns its manifest record. `states`: the optimizer's
/// per-element states (optimizer_state_names; Adam's two by default); `masks`: the files of this save
/// hold Sparsity's masks (the manifest's sparsity_masks, agreed by every rank).
inline FileRecord write_rank_file(const std::filesystem::path& dir, std::span<const EngineGroupView> groups, int rank,
                                  int world_size,
                                  const std::vector<std::string>& states = optimizer_state_names("AdamW"),
                                  bool masks = false) {
  const std::string name = rank_file_name(rank);
  std::vector<std::pair<std::string, std::uint64_t>> sizes;
  for_each_rank_section(groups, states, masks,
                        [&](const std::string& section, auto span) { sizes.emplace_back(section, span.size_bytes()); });
  DataFileStreamWriter w(dir / name, rank, world_size, static_cast<std::uint32_t>(sizes.size()),
                         DataFileStreamWriter::file_size(sizes));
  for_each_rank_section(groups, states, masks, [&](const std::string& section, auto span) { w.add(section, span); });
  FileRecord rec = w.finish(name);
  io::fsync_directory(dir);
  return rec;
}

/// Checks that rank file `f` (opened and checksum-verified) is rank `rank`'s of the checkpoint
/// whose manifest is `m`: header, section count, every section's type and size, the step counts.
/// io_error naming the file on any inconsistency.
inline void check_rank_file(const DataFileReader& f, const Manifest& m, int rank) {
  if (f.rank() != static_cast<std::uint32_t>(rank) || f.world_size() != static_cast<std::uint32_t>(m.world_size)) {
    throw io_error("the file was written by another rank or world size", f.path(),
                   "rank " + std::to_string(f.rank()) + " of " + std::to_string(f.world_size()) + ", expected rank " +
                       std::to_string(rank) + " of " + std::to_string(m.world_size));
  }
  const std::size_t groups = m.shards.owned_numel.size();
  if (m.sparsity_masks() && m.sparsity_groups.size() != groups) {
    throw io_error("the manifest's sparsity_masks has another number of groups", f.path(),
                   std::to_string(m.sparsity_groups.size()) + " for " + std::to_string(groups));
  }
  const std::size_t per_group = sections_per_group(m);
  if (f.sections().size() != per_group * groups) {
    throw io_error("unexpected number of sections", f.path(),
                   std::to_string(f.sections().size()) + ", expected " + std::to_string(per_group * groups));
  }
  for (std::size_t g = 0; g < groups; ++g) {
    const std::uint64_t n = m.shards.owned_numel[g][static_cast<std::size_t>(rank)];
    f.section(section_name(g, "step"), ElementType::int64, 1);
    f.section(section_name(g, "master"), ElementType::fp32, n);
    for (const std::string& what : m.optimizer_states) f.section(section_name(g, what), ElementType::fp32, n);
    if (has_fresh_state(m.optimizer_states)) {
      const std::uint64_t k = f.section(section_name(g, kLambTensorStates), ElementType::fp64).numel;
      if (k % optim::kLambScalarsPerTensor != 0) {
        throw io_error("1-bit LAMB's per-tensor states are not whole records of " +
                           std::to_string(optim::kLambScalarsPerTensor),
                       f.path(),
                       section_name(g, kLambTensorStates) + ": " + std::to_string(k) + " values");
      }
    }
    if (m.rank_local) {
      f.section(section_name(g, kRankLocal), ElementType::fp32);
      f.section(section_name(g, kRankLocalScalars), ElementType::fp64);
    }
    if (m.sparsity_masks()) {
      const std::uint64_t k = f.section(section_name(g, kSparsityKeep), ElementType::byte).numel;
      if (k != 0 && k != n) {
        throw io_error("sparsity masks of another size than the owned elements", f.path(),
                       section_name(g, kSparsityKeep) + ": " + std::to_string(k) + ", owned " + std::to_string(n));
      }
    }
    std::int64_t step = 0;
    f.read(section_name(g, "step"), ElementType::int64, 0, std::span<std::int64_t>(&step, 1));
    if (step != m.optimizer_steps[g]) {
      throw io_error("optimizer step count differs from the manifest's", f.path(),
                     std::to_string(step) + ", manifest says " + std::to_string(m.optimizer_steps[g]));
    }
  }
}

/// The per-element sections of one group, by name, and the state's vector each is read into:
/// master, then each of the optimizer's `states` (m, v, 1-bit LAMB's v_f; Lion has m only).
inline std::vector<std::pair<std::string, std::vector<float>*>> element_sections(EngineGroupState& gs,
                                                                                const std::vector<std::string>& states) {
  std::vector<std::pair<std::string, std::vector<float>*>> out = {{"master", &gs.master}};
  for (const std::string& what : states) {
    std::vector<float>* into = what == "exp_avg"      ? &gs.optimizer.m
                               : what == "exp_avg_sq" ? &gs.optimizer.v
                               : what == kFreshState  ? &gs.optimizer.v_fresh
                                                      : nullptr;
    if (into == nullptr) throw usage_error("no such per-element optimizer state", "checkpoint::element_sections", what);
    out.emplace_back(what, into);
  }
  return out;
}

/// Group g's 1-bit LAMB per-tensor states from `f` (checked with check_rank_file first).
inline void read_tensor_states(const DataFileReader& f, std::size_t g, std::vector<double>& out) {
  const std::string name = section_name(g, kLambTensorStates);
  out.resize(f.section(name, ElementType::fp64).numel);
  f.read(name, ElementType::fp64, 0, std::span<double>(out));
}

/// `out.size()` flags of group g's masks from `f`, from element `first` (nothing when the group's
/// section is empty: then `out` is cleared). Checked with check_rank_file first.
inline void read_sparsity_keep(const DataFileReader& f, std::size_t g, std::uint64_t first, std::vector<std::uint8_t>& out) {
  const std::string name = section_name(g, kSparsityKeep);
  if (f.section(name, ElementType::byte).numel == 0) {
    out.clear();
    return;
  }
  if (out.empty()) out.resize(f.section(name, ElementType::byte).numel);
  f.read(name, ElementType::byte, first, std::span<std::byte>(reinterpret_cast<std::byte*>(out.data()), out.size()));
}

/// Rank `rank`'s groups from its file `f` (checked with check_rank_file first), each section read
/// straight into the state's vectors.
inline std::vector<EngineGroupState> read_rank_file(const DataFileReader& f, const Manifest& m, int rank) {
  check_rank_file(f, m, rank);
  std::vector<EngineGroupState> groups(m.shards.owned_numel.size());
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const std::size_t n = m.shards.owned_numel[g][static_cast<std::size_t>(rank)];
    EngineGroupState& gs = groups[g];
    gs.optimizer.step = m.optimizer_steps[g];
    for (const auto& [what, into] : element_sections(gs, m.optimizer_states)) {
      into->resize(n);
      f.read(section_name(g, what), ElementType::fp32, 0, std::span<float>(*into));
    }
    if (has_fresh_state(m.optimizer_states)) read_tensor_states(f, g, gs.optimizer.tensor_scalars);
    if (m.rank_local) {
      RankLocalState& local = gs.rank_local;
      local.values.resize(f.section(section_name(g, kRankLocal), ElementType::fp32).numel);
      f.read(section_name(g, kRankLocal), ElementType::fp32, 0, std::span<float>(local.values));
      local.scalars.resize(f.section(section_name(g, kRankLocalScalars), ElementType::fp64).numel);
      f.read(section_name(g, kRankLocalScalars), ElementType::fp64, 0, std::span<double>(local.scalars));
    }
    if (m.sparsity_masks()) read_sparsity_keep(f, g, 0, gs.sparsity_keep);
  }
  return groups;
}

/// Opens rank `rank`'s file of the checkpoint in `tdir`, verified against the manifest's record.
inline DataFileReader open_rank_file(const std::filesystem::path& tdir, const Manifest& m, int rank) {
  const FileRecord& rec = m.rank_files[static_cast<std::size_t>(rank)];
  if (rec.name.empty() || rec.name.find('/') != std::string::npos || rec.name.front() == '.') {
    throw io_error("manifest names an invalid data file", (tdir / kManifestFile).string(), "\"" + rec.name + "\"");
  }
  return DataFileReader(tdir / rec.name, rec);
}

}  // namespace zerotk::checkpoint
