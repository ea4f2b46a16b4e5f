#pragma once
/// \file zerotk/checkpoint/layout.hpp
/// Where things are in a checkpoint directory, and which tags are valid names:
///
///   <dir>/latest                     the tag of the newest complete checkpoint (no newline)
///   <dir>/<tag>/manifest.txt         structure, counters, scaler, scheduler, each file's size + checksum
///   <dir>/<tag>/rank<r>.bin          rank r's fp32 master partitions and optimizer states (format.hpp)
///   <dir>/<tag>/client_state.bin     the user's bytes (format.hpp, one section)
///   <dir>/.tmp.<tag>/                a save in progress (or one a crash interrupted; removed by the next)

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "zerotk/core/error.hpp"
#include "zerotk/core/utf8.hpp"

namespace zerotk::checkpoint {

inline constexpr std::string_view kLatestFile = "latest";
inline constexpr std::string_view kManifestFile = "manifest.txt";
inline constexpr std::string_view kClientStateFile = "client_state.bin";
inline constexpr std::string_view kTempPrefix = ".tmp.";

inline std::string rank_file_name(int rank) { return "rank" + std::to_string(rank) + ".bin"; }

/// DeepSpeed's default tag.
inline std::string default_tag(std::int64_t global_steps) { return "global_step" + std::to_string(global_steps); }

inline std::filesystem::path tag_path(const std::filesystem::path& dir, std::string_view tag) { return dir / tag; }
inline std::filesystem::path temp_path(const std::filesystem::path& dir, std::string_view tag) {
  return dir / (std::string(kTempPrefix) + std::string(tag));
}

/// Longest tag, in bytes.
inline constexpr std::size_t kMaxTagBytes = 200;

/// A tag names one directory entry of the checkpoint directory and nothing else: non-empty, at most
/// kMaxTagBytes of printable ASCII without '/' or spaces, not "latest", not starting with '.' (so
/// not "." or "..", and not a temporary). Save, load, verify and export all check it, whether the
/// tag came from the caller, a command line or the `latest` file. The error shows the tag escaped
/// (printable()): it may hold terminal escape sequences.
inline void check_tag(std::string_view tag, const char* where) {
  auto bad = [&](const char* why) {
    throw usage_error(std::string("invalid checkpoint tag: ") + why, where, "\"" + printable(tag, kMaxTagBytes + 40) + "\"");
  };
  if (tag.empty()) bad("empty");
  if (tag.size() > kMaxTagBytes) bad("longer than 200 bytes");
  if (tag.front() == '.') bad("starts with '.' (reserved for temporary directories)");
  if (tag == kLatestFile) bad("\"latest\" is the name of the file holding the newest tag");
  for (char c : tag) {
    if (c == '/' || c < 0x21 || c > 0x7e) bad("only printable ASCII without '/' or spaces");
  }
}

}  // namespace zerotk::checkpoint
