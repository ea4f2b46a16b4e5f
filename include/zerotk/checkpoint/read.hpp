#pragma once
/// \file zerotk/checkpoint/read.hpp
/// Reading a checkpoint directory without an engine: the tag in `latest`, a tag's manifest, data
/// files checked against the manifest's size and checksum, and verify(), which checks a whole
/// checkpoint. Every failure is an io_error naming the file.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zerotk/checkpoint/checksum.hpp"
#include "zerotk/checkpoint/format.hpp"
#include "zerotk/checkpoint/layout.hpp"
#include "zerotk/checkpoint/manifest.hpp"
#include "zerotk/checkpoint/rank_file.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/io/durable_file.hpp"

namespace zerotk::checkpoint {

/// Largest `latest` file read, in bytes: a tag (at most kMaxTagBytes) and trailing whitespace fit.
inline constexpr std::uint64_t kMaxLatestBytes = 4096;

/// The tag `<dir>/latest` holds (trailing whitespace ignored). `latest` must be a regular file (a
/// link to one is followed) of at most kMaxLatestBytes holding a valid tag (check_tag); a FIFO or a
/// device is refused without blocking. Every failure is an io_error naming the file.
inline std::string read_latest(const std::filesystem::path& dir) {
  const std::filesystem::path p = dir / kLatestFile;
  if (!io::exists(p)) {
    throw io_error("no \"latest\" file: nothing was saved in this directory (or name a tag: LoadOptions::tag)", p.string());
  }
  std::string tag = io::read_text_file(p, kMaxLatestBytes, "the \"latest\" file");
  while (!tag.empty() && (tag.back() == '\n' || tag.back() == '\r' || tag.back() == ' ')) tag.pop_back();
  if (tag.empty()) throw io_error("the \"latest\" file is empty", p.string());
  try {
    check_tag(tag, "");
  } catch (const usage_error& e) {
    throw io_error(e.message() + " (the \"latest\" file is corrupt?)", p.string(), e.value());
  }
  return tag;
}

/// The manifest of `<dir>/<tag>`, verified. `tag` must be a valid tag (check_tag: a usage_error
/// otherwise), so that nothing outside `dir`'s own tags is read.
inline Manifest read_manifest(const std::filesystem::path& dir, std::string_view tag) {
  check_tag(tag, "checkpoint tag");
  const std::filesystem::path tdir = tag_path(dir, tag);
  if (!io::exists(tdir)) throw io_error("checkpoint directory is missing", tdir.string(), "tag \"" + std::string(tag) + "\"");
  const std::filesystem::path p = tdir / kManifestFile;
  return parse_manifest(io::read_text_file(p), p.string());
}

/// The bytes of `<tag dir>/<rec.name>`, which must have the size and checksum the manifest records.
inline std::vector<std::byte> read_verified(const std::filesystem::path& tdir, const FileRecord& rec) {
  if (rec.name.empty() || rec.name.find('/') != std::string::npos || rec.name.front() == '.') {
    throw io_error("manifest names an invalid data file", (tdir / kManifestFile).string(), "\"" + rec.name + "\"");
  }
  const std::filesystem::path p = tdir / rec.name;
  std::vector<std::byte> bytes = io::read_file(p);
  check_recorded_size(rec, bytes.size(), p.string());
  check_recorded_checksum(rec, checksum(std::span<const std::byte>(bytes)), p.string());
  return bytes;
}

/// The user's bytes saved with the checkpoint.
inline std::vector<std::byte> read_client_state(const std::filesystem::path& tdir, const Manifest& m) {
  const std::vector<std::byte> bytes = read_verified(tdir, m.client_state);
  const std::string path = (tdir / m.client_state.name).string();
  const DataFileView f = parse_data_file(bytes, path);
  if (f.sections.size() != 1) throw io_error("expected one section", path, std::to_string(f.sections.size()));
  const SectionView& s = f.sections.front();
  const SectionView& c = f.get("client_state", ElementType::byte, s.numel);
  return std::vector<std::byte>(c.data.begin(), c.data.end());
}

/// Checks the checkpoint `<dir>/<tag>` (default: the one `latest` names) completely: manifest,
/// every rank's file and the client state, sizes, checksums and structure. Returns its manifest.
inline Manifest verify(const std::filesystem::path& dir, std::optional<std::string> tag = std::nullopt) {
  const std::string t = tag ? *tag : read_latest(dir);
  const Manifest m = read_manifest(dir, t);
  const std::filesystem::path tdir = tag_path(dir, t);
  for (int r = 0; r < m.world_size; ++r) {
    check_rank_file(open_rank_file(tdir, m, r), m, r);
  }
  read_client_state(tdir, m);
  return m;
}

}  // namespace zerotk::checkpoint
