#pragma once
/// \file zerotk/checkpoint/rank_file.hpp
/// One rank's data file <-> that rank's part of an EngineState. Per flat group g (the working-
/// precision group, then the fp32-kept group), four sections over the rank's owned elements:
///   group<g>.step         int64[1]        the optimizer's step count
///   group<g>.master       fp32[owned]     the fp32 master partition (padding included, as owned)
///   group<g>.exp_avg      fp32[owned]     Adam's m
///   group<g>.exp_avg_sq   fp32[owned]     Adam's v
/// Counters, scaler and scheduler are the same on every rank and live in the manifest.
///
/// Written streamed (file_writer.hpp) and read through a verified DataFileReader (file_reader.hpp):
/// neither side holds the file in memory, only the state it is made of.

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

inline constexpr std::size_t kSectionsPerGroup = 4;

inline std::string section_name(std::size_t group, std::string_view what) {
  return "group" + std::to_string(group) + "." + std::string(what);
}

/// Calls `add(name, span)` for every section of the rank file of groups `groups`, in file order.
template <class Add>
void for_each_rank_section(std::span<const EngineGroupView> groups, Add&& add) {
  const std::vector<std::string>& states = optimizer_state_names();
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const EngineGroupView& gs = groups[g];
    add(section_name(g, "step"), std::span<const std::int64_t>(&gs.step, 1));
    add(section_name(g, "master"), gs.master);
    add(section_name(g, states[0]), gs.m);
    add(section_name(g, states[1]), gs.v);
  }
}

/// Streams the rank file of `groups` to `dir/<rank file name>` (O_DIRECT where the file system
/// allows), fsyncs it and the directory; returns its manifest record.
inline FileRecord write_rank_file(const std::filesystem::path& dir, std::span<const EngineGroupView> groups, int rank,
                                  int world_size) {
  const std::string name = rank_file_name(rank);
  std::vector<std::pair<std::string, std::uint64_t>> sizes;
  for_each_rank_section(groups, [&](const std::string& section, auto span) { sizes.emplace_back(section, span.size_bytes()); });
  DataFileStreamWriter w(dir / name, rank, world_size, static_cast<std::uint32_t>(kSectionsPerGroup * groups.size()),
                         DataFileStreamWriter::file_size(sizes));
  for_each_rank_section(groups, [&](const std::string& section, auto span) { w.add(section, span); });
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
  if (f.sections().size() != kSectionsPerGroup * groups) {
    throw io_error("unexpected number of sections", f.path(),
                   std::to_string(f.sections().size()) + ", expected " + std::to_string(kSectionsPerGroup * groups));
  }
  for (std::size_t g = 0; g < groups; ++g) {
    const std::uint64_t n = m.shards.owned_numel[g][static_cast<std::size_t>(rank)];
    f.section(section_name(g, "step"), ElementType::int64, 1);
    for (const std::string& what : {std::string("master"), optimizer_state_names()[0], optimizer_state_names()[1]}) {
      f.section(section_name(g, what), ElementType::fp32, n);
    }
    std::int64_t step = 0;
    f.read(section_name(g, "step"), ElementType::int64, 0, std::span<std::int64_t>(&step, 1));
    if (step != m.optimizer_steps[g]) {
      throw io_error("optimizer step count differs from the manifest's", f.path(),
                     std::to_string(step) + ", manifest says " + std::to_string(m.optimizer_steps[g]));
    }
  }
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
    std::vector<float>* into[3] = {&gs.master, &gs.optimizer.m, &gs.optimizer.v};
    const std::string names[3] = {"master", optimizer_state_names()[0], optimizer_state_names()[1]};
    for (int k = 0; k < 3; ++k) {
      into[k]->resize(n);
      f.read(section_name(g, names[k]), ElementType::fp32, 0, std::span<float>(*into[k]));
    }
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
