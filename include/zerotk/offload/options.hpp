#pragma once
/// \file zerotk/offload/options.hpp
/// What a state store is built with (offload/store.hpp picks the store; the engine fills
/// StoreOptions from OffloadOptions), and the offload parts' options.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "zerotk/core/error.hpp"
#include "zerotk/io/aio_options.hpp"
#include "zerotk/zero/params/replicated.hpp"

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

/// Where the optimizer state and the parameter shards go and how they are stepped: the offload
/// parts' run-time options (EngineOptions is composed of them; the config reader fills them from
/// DeepSpeed's `offload_optimizer`, `offload_param`, `aio` and `sub_group_size` keys).
struct OffloadOptions {
  /// Offload<Cpu> / Offload<Nvme> (and OffloadParams<Nvme>'s two-pass step): elements of the owned
  /// partition the optimizer steps at once (DeepSpeed `zero_optimization.sub_group_size`); bounds
  /// the pinned staging buffers. Must be >= 1. Offload<None> steps the partition in one piece and
  /// ignores it.
  std::size_t sub_group_size = 1'000'000'000;
  /// Offload<Cpu>: ZeRO-Offload's delayed parameter update (docs/offload.md). The host step of
  /// optimizer step t runs on a worker thread while the trainer goes on with the forward and backward
  /// of step t + 1, which still see the parameters from before step t's update: every update lands one
  /// step late (master_{t+1} = Adam(master_t, g(params_{t-1}))). Call Engine::settle() to publish the
  /// update in flight (state(), checkpoints and the end of training need it). Off by default.
  bool delayed_param_update = false;
  /// The number of optimizer steps taken immediately before the updates start to be delayed
  /// (ZeRO-Offload warms up this way; 0: from the first step).
  std::int64_t delayed_param_update_start = 0;
  /// Offload<Nvme>: where and how the optimizer state is swapped (DeepSpeed's
  /// `offload_optimizer.nvme_path`, `buffer_count`, `pipeline_read`, `pipeline_write` and `aio`).
  NvmeOptions nvme;
  /// OffloadParams<Nvme>: the directory of the parameter shard files, their read-ahead buffers and
  /// the part kept in host memory (DeepSpeed `offload_param.nvme_path`, `buffer_count`,
  /// `buffer_size`, `max_in_cpu`); one file per rank and group, read and written with nvme.aio.
  ParamNvmeOptions param_nvme;

  /// What is out of range, naming DeepSpeed's key and the value. `swaps`: the engine reads or
  /// writes a swap file (its aio block then matters).
  void check(std::vector<config_error>& out, bool swaps) const {
    if (sub_group_size < 1) out.emplace_back("must be >= 1", "zero_optimization.sub_group_size", "0");
    if (delayed_param_update_start < 0) {
      out.emplace_back("must be >= 0 (optimizer steps taken immediately first)", "delayed_param_update_start",
                       std::to_string(delayed_param_update_start));
    }
    if (swaps) {
      try {
        nvme.aio.check();
      } catch (const config_error& e) {
        out.push_back(e);
      }
    }
  }
};

/// OffloadParams<Nvme>: where stage 3's shard file goes and how it is read and written
/// (offload/nvme_shard.hpp's Options; the other shard homes take zero::NoHomeOptions).
struct ShardFileOptions {
  ParamNvmeOptions nvme;  ///< `offload_param`: nvme_path, buffer_count, buffer_size, max_in_cpu
  io::AioOptions aio;     ///< the `aio` block (shared with Offload<Nvme>)
  int rank = 0;           ///< with `name`, names the file
  std::string name = "main";
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

/// What a shard home of options type `HomeOptions` is built with, from the store's options: nothing
/// for every home but the NVMe shard file's.
template <class HomeOptions>
HomeOptions home_options(const StoreOptions&) {
  return {};
}
template <>
inline ShardFileOptions home_options<ShardFileOptions>(const StoreOptions& s) {
  return {s.param_nvme, s.nvme.aio, s.rank, s.name};
}

}  // namespace zerotk::offload

namespace zerotk::zero {
/// Deprecated: the shard file's options moved to the offload layer with the file itself.
using ShardFileOptions [[deprecated("use zerotk::offload::ShardFileOptions")]] = offload::ShardFileOptions;
}  // namespace zerotk::zero
