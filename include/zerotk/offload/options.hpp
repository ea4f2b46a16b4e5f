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

/// OffloadParams<Nvme> (DeepSpeed `offload_param` with `device: nvme`; the `aio` block is
/// NvmeOptions::aio, shared).
struct ParamNvmeOptions {
  /// Directory of the parameter shard files (`nvme_path`); one file per rank and parameter group.
  std::filesystem::path path;
  /// Read buffers of one block each (`buffer_count`): all but one read the blocks the fetch schedule
  /// expects next while the layers before them compute; 1 reads every block when it is fetched.
  std::size_t buffer_count = 5;
  /// Elements a buffer may take (`buffer_size`): the largest block must fit (an error says so).
  std::size_t buffer_size = 100'000'000;
  /// Elements of this rank's shard kept in host memory (`max_in_cpu`): the blocks of the first
  /// buckets, as many as fit whole, are fetched from there and never read from the file (which is
  /// still written, so that a failed step can be undone). DeepSpeed's default, 1e9, keeps all of a
  /// model below a billion elements per rank in host memory; 0 puts every block on NVMe only. The
  /// engine spends it over both of its groups, the working-precision group's blocks first.
  std::size_t max_in_cpu = 1'000'000'000;
};

struct StoreOptions {
  /// Elements stepped at once (`zero_optimization.sub_group_size`); Offload<None> ignores it.
  std::size_t sub_group_size = 1'000'000'000;
  /// This rank and the group's name: they name the swap file.
  int rank = 0;
  std::string name = "main";
  NvmeOptions nvme;
  /// OffloadParams<Nvme>: the parameter shard file's directory and buffers. Not the store's: the
  /// group hands them, with rank, name and nvme.aio, to its parameter path.
  ParamNvmeOptions param_nvme;
  /// The optimizer's output goes through a writer that must not see a half-applied step
  /// (OffloadParams<Nvme>): Offload<None>'s store then builds the sub-group loop that writes each
  /// sub-group's values before it steps the state (offload/writer_passes.hpp; Offload<Cpu>'s and
  /// Offload<Nvme>'s have one anyway).
  bool output_writer = false;
};

}  // namespace zerotk::offload
