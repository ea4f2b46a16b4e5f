#pragma once
/// \file zerotk/offload/nvme_shard.hpp
/// NvmeShard: OffloadParams<Nvme>'s home for stage 3's parameter shard (DeepSpeed
/// `offload_param.device: nvme`, `nvme_path`). This rank's block of every bucket lives in a swap
/// file (io/swap_file.hpp: O_DIRECT, io_uring or the pread/pwrite pool), except the blocks kept in
/// host memory (`max_in_cpu`, below); host memory holds buffer_count + 1 staging buffers of the
/// largest block in the file. A bucket's block is read before its all-gather (ahead of it where the fetch
/// schedule foresees it; below):
///
///   fetch(k):  file (block k) -> staging -> this rank's block of k's gather buffer   (read, copy)
///              all-gather in place into the gather buffer                             (the communicator)
///
/// File layout: [2 slots][bucket k not kept in memory] blocks, each padded to 4096 bytes. Every
/// block has its own current slot. A block is never written over in place:
///
///   write(k, f)            block k := what f writes into staging, written to k's other slot, which
///                          then becomes current
///                          (initial values, load_state, a GatherScope's writes: one block at a time)
///   writer().write(at, host, n) ...   the optimizer's output, owned offsets; each touched block is
///   commit()                          assembled in staging and written to its other slot; commit()
///                          makes those the current ones, abort() drops them.
///
/// So a failed write (disk full, an injected fault, a truncated file) leaves every block as it was;
/// with Offload<Nvme>, whose state also flips only after a complete step, and with the stores that
/// step their state only after every value is written (offload/writer_passes.hpp), a failed step
/// changes nothing.
///
/// A transaction must write every parameter element of a block it touches: the rest of the block
/// (the padding behind the bucket's last parameter) is written as zeros, which is what the other
/// homes hold there too. The optimizer's output and the restore from the master both cover every
/// segment. A block that spans two sub-groups is assembled twice (read back from its other slot
/// for the second half): one extra block read per sub-group boundary.
///
/// Read-ahead (`buffer_count`): the fetch schedule names the buckets the trace fetches next
/// (stage_ahead, engine/fetch_sharded.hpp); up to buffer_count - 1 of their blocks are read into
/// buffers of their own while the layers before them compute, and their fetch then takes the block
/// from there (waiting only for what is still in flight). A bucket the schedule did not foresee is read
/// when it is fetched, into the buffer that read-ahead always leaves free. A staged block is a copy of
/// the current slot, so everything that makes another slot current (write, commit) drops it; a failed
/// read-ahead surfaces as the io_error of the fetch that needed the block. buffer_count = 1: no
/// read-ahead. Host memory: buffer_count read buffers and one assembly buffer, each the largest
/// block (padded), which must fit `buffer_size` elements.
///
/// Blocks kept in host memory (`max_in_cpu`, DeepSpeed's elements "in CPU"): the blocks of the first
/// buckets, as many as fit whole in max_in_cpu elements, live in host memory instead of the file, as
/// in DeepSpeed: nothing of them is ever read from or written to the disk, and their fetches copy
/// from memory. Their two slots are two host copies, so they follow the same rules as the file's
/// blocks (the writer's new values wait in the other copy until commit(), and abort() leaves them
/// there unused): a failed step changes them no more than the others. Host memory: twice their
/// elements, unpadded.
///
/// Every device: the blocks live in host memory (staging, the kept copies) and reach the compute
/// space by the Ops' copies (gather_source: copy_from_host; on a device, FetchOnDemand stages what
/// read and write hand out through the compute space), and the optimizer's output comes from a step
/// on the host (engine/compat.hpp refuses Offload<None> on a device with it).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "zerotk/core/error.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/core/pinned_host_space.hpp"
#include "zerotk/io/swap_file.hpp"
#include "zerotk/offload/nvme_layout.hpp"
#include "zerotk/offload/registered_host.hpp"
#include "zerotk/zero/layout.hpp"
#include "zerotk/zero/params/replicated.hpp"

namespace zerotk::offload {

/// How the fetches of a swapped parameter shard found their blocks.
struct ParamReadStats {
  std::uint64_t staged = 0;    ///< read ahead (the fetch waited at most for the rest of the read)
  std::uint64_t unstaged = 0;  ///< read by the fetch itself
  std::uint64_t in_cpu = 0;    ///< copied from host memory (max_in_cpu), nothing read
  ParamReadStats& operator+=(const ParamReadStats& o) noexcept {
    staged += o.staged;
    unstaged += o.unstaged;
    in_cpu += o.in_cpu;
    return *this;
  }
};

template <class T, class Ops>
class NvmeShard {
 public:
  using Options = ShardFileOptions;

  /// The optimizer's output into the shard (zero::OutputWriter): owned offsets, host values.
  class Writer {
   public:
    using value_type = T;
    explicit Writer(NvmeShard& s) : s_(&s) {}
    void write(std::size_t at, const T* host, std::size_t n) { s_->put(at, host, n); }
    void end_sub_group() { s_->flush(); }

   private:
    NvmeShard* s_;
  };

  NvmeShard(Ops& ops, const zero::BucketLayout& layout, int rank, MemoryLedger* ledger, const ShardFileOptions& o)
      : layout_(&layout),
        ledger_(ledger),
        offsets_(offsets_of(layout)),
        in_cpu_(offload::blocks_in_cpu(layout, o.nvme.max_in_cpu)),
        block_bytes_(checked_block_bytes(layout, in_cpu_, o)),
        file_(checked_dir(o), "zerotk_params.r" + std::to_string(rank) + "." + o.name, 2 * slot_bytes(), o.aio),
        staging_((o.nvme.buffer_count + 1) * block_bytes_, MemoryCategory::other, ledger),
        kept_at_(kept_offsets(layout, in_cpu_)),
        kept_(2 * kept_at_.back(), MemoryCategory::params16, ledger),
        staging_registered_(ops, staging_.data(), staging_.size()),
        kept_registered_(ops, kept_.data(), kept_.size() * sizeof(T)),
        staged_(o.nvme.buffer_count),
        current_(layout.buckets().size(), 0),
        touched_(layout.buckets().size(), 0),
        writer_(*this) {
    for (const zero::Bucket& b : layout.buckets()) {
      if (b.block > 0) by_offset_.push_back(static_cast<std::size_t>(&b - layout.buckets().data()));
    }
    std::sort(by_offset_.begin(), by_offset_.end(), [&](std::size_t a, std::size_t b) {
      return layout.buckets()[a].part_offset < layout.buckets()[b].part_offset;
    });
    if (ledger_ != nullptr) ledger_->add(MemorySpace::disk, MemoryCategory::params16, disk_bytes());
  }
  NvmeShard(const NvmeShard&) = delete;
  NvmeShard& operator=(const NvmeShard&) = delete;
  ~NvmeShard() {
    for (Staged& s : staged_) drop(s);  // no read may land in the buffers once they are gone
    if (ledger_ != nullptr) ledger_->sub(MemorySpace::disk, MemoryCategory::params16, disk_bytes());
  }

  /// This rank's block of bucket k into its slot of the gather buffer: from its read-ahead buffer
  /// if it was staged, else read now.
  /// A read that fails drops every staged block as well: their reads were issued under the same
  /// fault, and a step run again once it is fixed must read them afresh rather than fail on each.
  const T* gather_source(Ops& ops, std::size_t k, T* slot) {
    const std::size_t n = layout_->buckets()[k].block;
    if (k < in_cpu_) {
      ++stats_.in_cpu;
      ops.copy_from_host(kept(k, current_[k]), slot, n);
      return slot;
    }
    try {
      if (const std::size_t i = buffer_of(k); i < staged_.size()) {
        const io::SwapFile::Ticket t = staged_[i].ticket;
        staged_[i] = Staged{};  // free either way: a failed read is read again by the next fetch
        file_.wait(t);
        ++stats_.staged;
        ops.copy_from_host(reinterpret_cast<const T*>(staging(i)), slot, n);
      } else {
        ++stats_.unstaged;
        ops.copy_from_host(load(k, staging(free_buffer())), slot, n);
      }
    } catch (const io_error&) {
      for (Staged& s : staged_) drop(s);
      throw;
    }
    return slot;
  }

  /// Whether a fetch of bucket k reads its block from the file (not kept in host memory).
  bool reads_file(std::size_t k) const noexcept { return k >= in_cpu_; }
  /// How many leading buckets' blocks are kept in host memory (max_in_cpu).
  std::size_t blocks_in_cpu() const noexcept { return in_cpu_; }

  /// How many blocks read-ahead may hold at once (`buffer_count` - 1).
  std::size_t stage_capacity() const noexcept { return staged_.size() - 1; }
  /// `next`: the buckets the fetch schedule expects next, nearest first. Their blocks (the first
  /// stage_capacity() of those the file must be read for) are read ahead; staged blocks no longer
  /// expected are dropped.
  void stage_ahead(std::span<const std::size_t> next) {
    std::size_t n = 0;
    for (std::size_t reads = 0; n < next.size() && reads < stage_capacity(); ++n) reads += reads_file(next[n]);
    next = next.first(n);
    for (Staged& s : staged_) {
      if (s.bucket != kNone && std::find(next.begin(), next.end(), s.bucket) == next.end()) drop(s);
    }
    for (const std::size_t k : next) {
      if (buffer_of(k) < staged_.size() || !reads_file(k)) continue;
      const std::size_t i = free_buffer();
      staged_[i].bucket = k;
      staged_[i].ticket = file_.read(offset(current_[k], k), staging(i), padded(layout_->buckets()[k].block));
    }
  }

  const ParamReadStats& stats() const noexcept { return stats_; }

  /// f(const T* block): block k, read now (read-ahead is for fetches).
  template <class F>
  void read(std::size_t k, F&& f) {
    if (k < in_cpu_) {
      f(static_cast<const T*>(kept(k, current_[k])));
    } else {
      f(load(k, staging(free_buffer())));  // read-ahead always leaves one buffer free
    }
  }
  /// f(T* block) writes all of block k in staging; it then becomes block k atomically (the other
  /// slot, then the switch). usage_error while the writer's transaction is open (from its first
  /// write to commit() or abort(), sub-group boundaries included), with nothing changed.
  template <class F>
  void write(std::size_t k, F&& f) {
    // Between two sub-groups nothing is open, but the blocks already written wait in their other
    // slot for commit(): writing one of them here would flip it under the transaction.
    if (open_ != kNone || std::find(touched_.begin(), touched_.end(), char{1}) != touched_.end()) {
      throw usage_error("a block written while the optimizer's output is open (commit() or abort() it first)",
                        "NvmeShard::write", "bucket " + std::to_string(k));
    }
    const std::size_t n = layout_->buckets()[k].block;
    if (k < in_cpu_) {
      f(kept(k, 1 - current_[k]));
    } else {
      drop_block(k);
      std::byte* s = staging(assembly());
      std::memset(s + n * sizeof(T), 0, padded(n) - n * sizeof(T));  // the page's tail past the block
      f(reinterpret_cast<T*>(s));
      file_.wait(file_.write(offset(1 - current_[k], k), s, padded(n)));
    }
    current_[k] = static_cast<char>(1 - current_[k]);
  }

  Writer& writer() noexcept { return writer_; }
  /// The blocks the writer wrote become current.
  void commit() {
    flush();
    for (std::size_t k = 0; k < touched_.size(); ++k) {
      if (touched_[k]) {
        drop_block(k);
        current_[k] = static_cast<char>(1 - current_[k]);
      }
      touched_[k] = 0;
    }
  }
  /// Drops what the writer wrote: every block stays as it was.
  void abort() noexcept {
    open_ = kNone;
    std::fill(touched_.begin(), touched_.end(), char{0});
  }

  /// Host memory of the blocks kept there (max_in_cpu): both copies; in the ledger as params16.
  std::size_t held_bytes() const noexcept { return kept_.size() * sizeof(T); }
  /// Both slots of every block in the file, padded: the disk this home takes.
  std::uint64_t disk_bytes() const noexcept { return 2 * slot_bytes(); }

 private:
  static constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();
  struct Staged {
    std::size_t bucket = kNone;  ///< the block this read buffer holds or is reading
    io::SwapFile::Ticket ticket = io::IoQueue::kNone;
  };

  static std::size_t padded(std::size_t n) noexcept { return io::direct_round(n * sizeof(T)); }
  /// offsets[k]: bucket k's block within a slot; offsets.back(): the blocks' bytes.
  static std::vector<std::uint64_t> offsets_of(const zero::BucketLayout& l) {
    std::vector<std::uint64_t> o{0};
    for (const zero::Bucket& b : l.buckets()) o.push_back(o.back() + padded(b.block));
    return o;
  }
  /// A slot's bytes in the file: the blocks not kept in memory, at least one page.
  std::uint64_t slot_bytes() const noexcept {
    return std::max<std::uint64_t>(offsets_.back() - offsets_[in_cpu_], io::kDirectAlign);
  }
  /// The largest block in the file, padded (at least one page): the size of every staging buffer.
  /// Refuses a `buffer_size` the largest block does not fit, and a `buffer_count` of 0.
  static std::size_t checked_block_bytes(const zero::BucketLayout& l, std::size_t in_cpu, const ShardFileOptions& o) {
    if (o.nvme.buffer_count == 0) throw config_error("must be >= 1", "zero_optimization.offload_param.buffer_count", "0");
    if (auto e = offload::param_buffer_size_error(l, o.nvme.buffer_size)) throw *e;
    std::size_t m = io::kDirectAlign;
    for (std::size_t k = in_cpu; k < l.buckets().size(); ++k) m = std::max(m, padded(l.buckets()[k].block));
    return m;
  }
  /// kept_at[k]: kept block k's first element within a copy; kept_at.back(): a copy's elements.
  static std::vector<std::size_t> kept_offsets(const zero::BucketLayout& l, std::size_t in_cpu) {
    std::vector<std::size_t> o{0};
    for (std::size_t k = 0; k < in_cpu; ++k) o.push_back(o.back() + l.buckets()[k].block);
    return o;
  }
  static const std::filesystem::path& checked_dir(const ShardFileOptions& o) {
    if (o.nvme.path.empty()) throw config_error("required for OffloadParams<Nvme>", "zero_optimization.offload_param.nvme_path");
    return o.nvme.path;
  }

  /// Block k's slot in the file (k not kept in memory).
  std::uint64_t offset(int slot, std::size_t k) const noexcept {
    return static_cast<std::uint64_t>(slot) * slot_bytes() + offsets_[k] - offsets_[in_cpu_];
  }
  /// Kept block k's copy `slot` (k < in_cpu_).
  T* kept(std::size_t k, int slot) noexcept {
    return kept_.data() + static_cast<std::size_t>(slot) * kept_at_.back() + kept_at_[k];
  }
  std::byte* staging(std::size_t i) noexcept { return staging_.data() + i * block_bytes_; }
  /// The buffer the writer and write() assemble a block in (after the read buffers).
  std::size_t assembly() const noexcept { return staged_.size(); }

  /// A read buffer staging nothing (read-ahead holds at most all but one).
  std::size_t free_buffer() const noexcept {
    std::size_t i = 0;
    while (staged_[i].bucket != kNone) ++i;
    return i;
  }
  /// The read buffer staging block k (each block is staged at most once), or staged_.size().
  std::size_t buffer_of(std::size_t k) const noexcept {
    std::size_t i = 0;
    while (i < staged_.size() && staged_[i].bucket != k) ++i;
    return i;
  }
  /// Forgets a staged block (its read, if still in flight, is waited for and its result dropped).
  void drop(Staged& s) noexcept {
    if (s.bucket == kNone) return;
    file_.wait_quietly(s.ticket);
    s = Staged{};
  }
  void drop_block(std::size_t k) noexcept {
    if (const std::size_t i = buffer_of(k); i < staged_.size()) drop(staged_[i]);
  }

  /// Block k's current slot read into `s`; returns it as T.
  const T* load(std::size_t k, std::byte* s) {
    file_.wait(file_.read(offset(current_[k], k), s, padded(layout_->buckets()[k].block)));
    return reinterpret_cast<const T*>(s);
  }
  /// The writer: shard[at, at + n) := host[0, n), block by block through the assembly staging.
  void put(std::size_t at, const T* host, std::size_t n) {
    while (n > 0) {
      const std::size_t k = bucket_at(at);
      const zero::Bucket& b = layout_->buckets()[k];
      const std::size_t lo = at - b.part_offset, m = std::min(n, b.block - lo);
      if (open_ != k) open(k);
      std::memcpy(target_ + lo, host, m * sizeof(T));
      at += m;
      host += m;
      n -= m;
    }
  }
  /// The bucket whose block holds owned offset `at`.
  std::size_t bucket_at(std::size_t at) const {
    const auto& bs = layout_->buckets();
    auto it = std::upper_bound(by_offset_.begin(), by_offset_.end(), at,
                               [&](std::size_t a, std::size_t k) { return a < bs[k].part_offset; });
    if (it == by_offset_.begin() || at >= bs[*std::prev(it)].part_offset + bs[*std::prev(it)].block) {
      throw usage_error("an owned offset outside every block", "NvmeShard::Writer::write", std::to_string(at));
    }
    return *std::prev(it);
  }
  /// Starts assembling block k in its other slot (a kept block's other copy; else the assembly
  /// staging, for the file): what this transaction already wrote of it, else zeros.
  void open(std::size_t k) {
    flush();
    if (k < in_cpu_) {
      target_ = kept(k, 1 - current_[k]);
      if (!touched_[k]) std::memset(static_cast<void*>(target_), 0, layout_->buckets()[k].block * sizeof(T));
    } else {
      std::byte* s = staging(assembly());
      const std::size_t bytes = padded(layout_->buckets()[k].block);
      if (touched_[k]) {
        file_.wait(file_.read(offset(1 - current_[k], k), s, bytes));
      } else {
        std::memset(s, 0, bytes);
      }
      target_ = reinterpret_cast<T*>(s);
    }
    open_ = k;
  }
  /// Ends the block being assembled: a file block is written to its other slot (a kept block is
  /// already in its other copy).
  void flush() {
    if (open_ == kNone) return;
    const std::size_t k = open_;
    open_ = kNone;  // a failed write leaves nothing open; the caller aborts
    if (k >= in_cpu_) {
      file_.wait(file_.write(offset(1 - current_[k], k), staging(assembly()), padded(layout_->buckets()[k].block)));
    }
    touched_[k] = 1;
  }

  const zero::BucketLayout* layout_;
  MemoryLedger* ledger_;
  std::vector<std::uint64_t> offsets_;  // [bucket + 1] padded byte offsets; the file's from in_cpu_'s
  std::size_t in_cpu_;                  // leading buckets whose blocks are kept in host memory
  std::size_t block_bytes_;             // the largest block in the file, padded
  io::SwapFile file_;                   // [2 slots][bucket >= in_cpu_] blocks
  PinnedTrackedBuffer<std::byte> staging_;  // [buffer_count + 1][block_bytes_]: read buffers | assembly
  std::vector<std::size_t> kept_at_;        // [kept bucket + 1] element offsets within a copy
  PinnedTrackedBuffer<T> kept_;             // [2 slots][kept bucket] blocks kept in host memory
  RegisteredHost<Ops> staging_registered_, kept_registered_;  // with the device, for its copies
  std::vector<Staged> staged_;          // [buffer_count] read buffers
  std::vector<char> current_;           // [bucket] the slot holding the block
  std::vector<char> touched_;           // [bucket] written by the open transaction (other slot)
  std::vector<std::size_t> by_offset_;  // buckets with a block, by part_offset
  std::size_t open_ = kNone;            // the block being assembled
  T* target_ = nullptr;                 // where: its other slot (kept) or the assembly staging
  ParamReadStats stats_;
  Writer writer_;
};

}  // namespace zerotk::offload
