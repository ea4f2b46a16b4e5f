#pragma once
/// \file zerotk/offload/options.hpp
/// What a state store is built with (offload/store.hpp picks the store; the engine fills these from
/// EngineOptions).

#include <cstddef>
#include <filesystem>
#include <string>

#include "zerotk/io/aio_options.hpp"

namespace zerotk::offload {

/// Offload<Nvme> (DeepSpeed `offload_optimizer` with `device: nvme`, and the `aio` block).
struct NvmeOptions {
  /// Directory of the swap files (`nvme_path`); must exist and be writable. One file per rank and
  /// parameter group, removed when the engine is destroyed.
  std::filesystem::path path;
  /// Pinned buffers of one sub-group's master, m and v each (`buffer_count`). Raised to what the
  /// pipelining needs (1, +1 for pipeline_read, +1 for pipeline_write); never more than the
  /// number of sub-groups (which then never share a buffer).
  std::size_t buffer_count = 4;
  /// Read sub-group i + 1 while i steps (`pipeline_read`).
  bool pipeline_read = false;
  /// Write sub-group i back while i + 1 steps (`pipeline_write`).
  bool pipeline_write = false;
  io::AioOptions aio;
};

struct StoreOptions {
  /// Elements stepped at once (`zero_optimization.sub_group_size`); Offload<None> ignores it.
  std::size_t sub_group_size = 1'000'000'000;
  /// This rank and the group's name: they name the swap file.
  int rank = 0;
  std::string name = "main";
  NvmeOptions nvme;
  /// OffloadParams<Nvme>: the directory of the parameter shard file (`offload_param.nvme_path`).
  /// Not the store's: the group hands it, with rank, name and nvme.aio, to its parameter path.
  std::filesystem::path param_path;
};

}  // namespace zerotk::offload
