#pragma once
/// \file zerotk/checkpoint/options.hpp
/// What save() and load() take and return.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zerotk/core/validation.hpp"

namespace zerotk::checkpoint {

/// What happens when ranks pass different tags (DeepSpeed's checkpoint.tag_validation, which the
/// config reader fills as config::Config::checkpoint.tag_validation). Every rank then uses rank 0's
/// tag; `warn` reports the difference through `on_warning`, `fail` throws a usage_error on every rank
/// before anything is written or loaded.
using TagValidation = ValidationMode;

/// Receives warnings; an empty one writes them to stderr.
using WarningSink = std::function<void(std::string_view)>;

/// What a model declares about itself that its parameters' names and shapes do not show: attention
/// heads, the head dimension, a tied head, ... as key -> value (keys: letters, digits, '_', '.',
/// '-'; values: one line). Saved in the manifest (`model.<key> <value>`) and compared on load.
using ModelStructure = std::map<std::string, std::string>;

struct SaveOptions {
  std::optional<std::string> tag{};          ///< default "global_step<N>" (N = engine.global_steps())
  std::span<const std::byte> client_state{}; ///< the user's bytes, returned by load(); rank 0's are saved
  TagValidation tag_validation = TagValidation::warn;
  WarningSink on_warning{};
  ModelStructure model_structure{};          ///< recorded in the manifest (rank 0's)
};

struct LoadOptions {
  std::optional<std::string> tag{};  ///< default: the tag in <dir>/latest
  TagValidation tag_validation = TagValidation::warn;
  WarningSink on_warning{};
  /// Compared with the structure the checkpoint recorded: a key whose value differs, or that only
  /// one side has, is a usage_error naming it (a model with another head count has the same shapes,
  /// issue 57 item 12). Not compared when either side is empty (a checkpoint saved without one).
  ModelStructure model_structure{};
};

struct SaveResult {
  std::string tag{};
  std::filesystem::path path{};  ///< <dir>/<tag>
};

struct LoadResult {
  std::string tag{};
  std::vector<std::byte> client_state{};
  std::int64_t global_steps = 0;
  int saved_world_size = 0;  ///< the world size that saved it
  bool resharded = false;    ///< this rank's state was assembled from other ranks' files (reshard.hpp)
  /// This rank's error feedback (and 0/1 Adam's accumulator, 1-bit LAMB's tail: engine/state.hpp's
  /// RankLocalState) came back as saved, so compressed training goes on exactly. False when the
  /// checkpoint has none, was resharded, or its sizes are not this engine's (saved with compression,
  /// loaded without, or the reverse): then it starts from zero, as after every DeepSpeed load.
  bool rank_local_restored = false;
};

}  // namespace zerotk::checkpoint
