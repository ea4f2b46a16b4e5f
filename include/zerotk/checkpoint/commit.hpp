#pragma once
/// \file zerotk/checkpoint/commit.hpp
/// The commit protocol of one save, so that a crash at any instant leaves `latest` naming a
/// complete checkpoint (the previous one, or the new one):
///   1. prepare_temp (rank 0): remove temporaries of interrupted saves, create <dir>/.tmp.<tag>
///   2. every rank writes its file into it and fsyncs the file (its data is on disk) and the
///      temporary directory (its name is)
///   3. publish (rank 0, after all ranks succeeded): client state and manifest written and fsynced;
///      fsync the temporary directory; rename it to <dir>/<tag> (or, if that tag exists, exchange
///      the two atomically and remove the old one); fsync <dir> so the rename survives a power cut;
///      then replace `latest` atomically (write latest.tmp, fsync, rename, fsync <dir>).
/// Until the rename in 3 nothing a reader looks at has changed; the rename makes the complete tag
/// directory appear at once; `latest` moves only after that rename is durable.

#include <cstddef>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "zerotk/checkpoint/format.hpp"
#include "zerotk/checkpoint/layout.hpp"
#include "zerotk/checkpoint/manifest.hpp"
#include "zerotk/io/durable_file.hpp"

namespace zerotk::checkpoint {

/// Removes `<dir>/.tmp.*` left by interrupted saves and creates an empty `temp`.
inline void prepare_temp(const std::filesystem::path& dir, const std::filesystem::path& temp) {
  io::create_directories(dir);
  std::vector<std::filesystem::path> stale;  // collected first: no removal while iterating
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().filename().string().starts_with(kTempPrefix)) stale.push_back(it->path());
  }
  if (ec) throw io_error("cannot list directory", dir.string(), ec.message());
  for (const auto& p : stale) io::remove_all(p);
  io::create_directories(temp);
}

/// Writes `bytes` as `temp/name`, durable (file and directory entry); returns its manifest record.
inline FileRecord write_data_file(const std::filesystem::path& temp, const std::string& name,
                                  std::span<const std::byte> bytes) {
  io::write_file_durable(temp / name, bytes);
  io::fsync_directory(temp);
  return FileRecord{name, bytes.size(), checksum(bytes)};
}

inline std::vector<std::byte> encode_client_state(std::span<const std::byte> client_state, int world_size) {
  DataFileWriter w(0, world_size);
  w.add("client_state", client_state);
  return std::move(w).finish();
}

/// Step 3 of the protocol (rank 0): `m` lacks only the client state's record, filled in here.
inline void publish(const std::filesystem::path& dir, const std::filesystem::path& temp, Manifest m,
                    std::span<const std::byte> client_state) {
  m.client_state = write_data_file(temp, std::string(kClientStateFile), encode_client_state(client_state, m.world_size));
  io::write_file_durable(temp / kManifestFile, to_text(m));
  io::fsync_directory(temp);
  const std::filesystem::path final_dir = tag_path(dir, m.tag);
  const bool replacing = io::exists(final_dir);
  if (replacing) {
    io::exchange_paths(temp, final_dir);  // temp now holds the old checkpoint of this tag
  } else {
    io::rename_path(temp, final_dir);
  }
  io::fsync_directory(dir);
  if (replacing) io::remove_all(temp);
  io::replace_file_atomically(dir / kLatestFile, m.tag);
}

}  // namespace zerotk::checkpoint
