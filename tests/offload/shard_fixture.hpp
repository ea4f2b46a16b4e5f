#pragma once
// NvmeShard on its own (offload/nvme_shard.hpp): a small layout, values by generation, and a fault
// hook that fails the shard file's reads or writes on demand. Shared by the read-ahead and the
// max_in_cpu tests.
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "zerotk/device/host_ops.hpp"
#include "zerotk/io/swap_file.hpp"
#include "zerotk/offload/nvme_shard.hpp"

namespace zt_test::shard {

namespace fs = std::filesystem;
using HostOps = zerotk::device::Ops<zerotk::Host>;
using Shard = zerotk::offload::NvmeShard<float, HostOps>;

/// An empty scratch directory under the test binary's directory.
inline fs::path scratch_dir(const std::string& name) {
  const fs::path d = fs::path(ZEROTK_TEST_BINARY_DIR) / "scratch" / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

/// Six parameters of different sizes, one per bucket, world 2: rank 0's blocks.
struct Fixture {
  std::vector<std::size_t> numels{700, 1300, 64, 2048, 513, 9};
  std::vector<std::uint32_t> groups = std::vector<std::uint32_t>(numels.size(), 0);
  std::vector<std::uint32_t> units{0, 1, 2, 3, 4, 5};
  zerotk::zero::BucketLayout layout{numels, groups, 2, 4096, units};
  HostOps ops;
  zerotk::MemoryLedger ledger;

  /// buffer_count read buffers; every block read from the file unless max_in_cpu says otherwise.
  zerotk::offload::ShardFileOptions options(const fs::path& dir, std::size_t buffer_count, std::size_t max_in_cpu = 0) const {
    zerotk::offload::ShardFileOptions o;
    o.nvme.path = dir;
    o.nvme.buffer_count = buffer_count;
    o.nvme.max_in_cpu = max_in_cpu;
    return o;
  }
  std::size_t buckets() const { return layout.buckets().size(); }
  std::size_t block(std::size_t k) const { return layout.buckets()[k].block; }
  /// Block k's values in "generation" g.
  float value(std::size_t k, std::size_t i, int g) const { return static_cast<float>(g * 100000 + k * 1000) + static_cast<float>(i); }
  void write_all(Shard& s, int g) {
    for (std::size_t k = 0; k < buckets(); ++k) {
      s.write(k, [&](float* b) {
        for (std::size_t i = 0; i < block(k); ++i) b[i] = value(k, i, g);
      });
    }
  }
  /// The fetch's view of block k equals generation g.
  bool fetched_is(Shard& s, std::size_t k, int g) {
    std::vector<float> slot(block(k), -1.0f);
    s.gather_source(ops, k, slot.data());
    for (std::size_t i = 0; i < slot.size(); ++i) {
      if (slot[i] != value(k, i, g)) return false;
    }
    return true;
  }
  /// The optimizer's output: every block := generation g, through the writer.
  void write_through_writer(Shard& s, int g) {
    for (std::size_t k = 0; k < buckets(); ++k) {
      std::vector<float> v(block(k));
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = value(k, i, g);
      s.writer().write(layout.buckets()[k].part_offset, v.data(), v.size());
    }
    s.writer().end_sub_group();
  }
};

/// While set (with fault_hook installed), the shard file's reads / writes fail with EIO.
inline std::atomic<bool> g_fail_reads{false};
inline std::atomic<bool> g_fail_writes{false};
/// The shard files' reads and writes asked for while fault_hook is installed, failed ones included.
inline std::atomic<std::uint64_t> g_reads{0};
inline std::atomic<std::uint64_t> g_writes{0};
inline int fault_hook(const zerotk::io::FaultSite& s) {
  if (std::strstr(s.path, "zerotk_params.") == nullptr) return 0;
  ++(s.write ? g_writes : g_reads);
  return (s.write ? g_fail_writes.load() : g_fail_reads.load()) ? EIO : 0;
}

}  // namespace zt_test::shard
