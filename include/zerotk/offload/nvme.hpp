#pragma once
/// \file zerotk/offload/nvme.hpp
/// Offload<Nvme>'s state store: the fp32 master copy of this rank's owned elements and the Adam
/// moments live in a swap file (io/swap_file.hpp, ledger space disk), and the optimizer runs on the
/// host one sub-group at a time through the loop HostPinned uses (offload/sub_group_steps.hpp):
///
///   for sub-group i:  read its master, m, v from the file into a pinned buffer
///                     step (the same Run<Opt, HostSpace> kernel and step constants as Offload<None>)
///                     write them back
///
/// pipeline_read issues the read of sub-group i + 1 before i steps; pipeline_write leaves i's write
/// in flight while i + 1 steps. The I/O runs on io_uring (or the pread/pwrite pool) while the
/// caller's threads compute; buffer_count pinned buffers of one sub-group each take turns
/// (sub-group i uses buffer i mod B; a buffer is read into only after its previous write is done).
///
/// No half-applied step. The file holds two slots of the whole state; a step reads the current
/// slot and writes the other, and the current slot changes only when every sub-group's write has
/// completed and the caller commits (commit_step(); abort_step() keeps the old one, for a step
/// that failed in another group). If any read or write fails (disk full, an injected fault, a file
/// truncated under the run), the step is abandoned: in-flight I/O is drained, the step count is
/// rewound, and the working-precision values already written to memory for earlier sub-groups are
/// put back from the current slot's master (they equal P(master) at every boundary; values given
/// to a writer are dropped with its transaction). The error propagates as an io_error naming the
/// file, offset and errno text; the state is the one before the step, and training can go on once
/// the cause is fixed. The price is twice the state's size on disk (24 Psi / N bytes with two moments, 16 with one).
/// If putting the values back fails as well, the error says so (the parameters then hold the new
/// values of some sub-groups; load a checkpoint).
///
/// State outside the step (init, state(), load_state(), checkpoints) is read and written
/// synchronously through the first buffer, in place in the current slot. There are no in-place
/// views of the state (kStateInHostMemory is false): checkpoint::save takes a copy through state().

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "zerotk/core/error.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/core/pinned_host_space.hpp"
#include "zerotk/io/swap_file.hpp"
#include "zerotk/kernels/host/cast.hpp"
#include "zerotk/kernels/tensor_list.hpp"
#include "zerotk/offload/nvme_layout.hpp"
#include "zerotk/offload/options.hpp"
#include "zerotk/offload/sub_group_steps.hpp"
#include "zerotk/optim/optimizer.hpp"
#include "zerotk/zero/params/optimizer_out.hpp"

namespace zerotk::offload {

template <class Opt, class Ops>
class NvmeSwapped {
 public:
  using optimizer_type = Opt;
  using space = PinnedHostSpace;  ///< where the optimizer runs (on the swapped-in buffers)
  static constexpr bool kStateInHostMemory = false;
  /// Its swap file's slots are the step's transaction: no step off the training thread.
  static constexpr bool kCanDelayUpdate = false;
  /// The moments the file keeps beside the master: m, and v for a two-moment optimizer.
  static constexpr std::size_t kMoments = optim::moments_v<Opt>;
  static constexpr bool kTwoMoments = kMoments >= 2;

  NvmeSwapped(Ops& ops, MemoryLedger* ledger, std::size_t owned_numel, const std::vector<ParamGroup>& groups,
              std::size_t tensor_count, const StoreOptions& options)
      : steps_(ops, ledger, owned_numel, options.sub_group_size),
        ops_(&ops),
        ledger_(ledger),
        part_bytes_(io::direct_round(std::max<std::size_t>(1, steps_.numel(0)) * sizeof(float))),
        file_(checked_path(options.nvme), "zerotk_optim.r" + std::to_string(options.rank) + "." + options.name,
              std::uint64_t{2} * steps_.count() * region_bytes(), options.nvme.aio),
        pipeline_read_(options.nvme.pipeline_read),
        pipeline_write_(options.nvme.pipeline_write),
        buffer_count_(buffers_for(options.nvme, steps_.count())),
        buffers_(buffer_count_ * region_bytes(), MemoryCategory::other, ledger),
        reads_(buffer_count_, io::IoQueue::kNone),
        writes_(buffer_count_, io::IoQueue::kNone),
        opt_(std::make_unique<Opt>(groups)) {
    opt_->set_tensor_count(tensor_count);
    if (ledger_ != nullptr) {  // both slots, the bytes asked (each part is padded to 4096 bytes in the file)
      ledger_->add(MemorySpace::disk, MemoryCategory::master32, 2 * owned_numel * sizeof(float));
      ledger_->add(MemorySpace::disk, MemoryCategory::optimizer_state, 2 * kMoments * owned_numel * sizeof(float));
    }
  }
  NvmeSwapped(const NvmeSwapped&) = delete;
  NvmeSwapped& operator=(const NvmeSwapped&) = delete;
  ~NvmeSwapped() {
    drain();
    if (ledger_ != nullptr) {
      ledger_->sub(MemorySpace::disk, MemoryCategory::master32, 2 * owned_numel() * sizeof(float));
      ledger_->sub(MemorySpace::disk, MemoryCategory::optimizer_state, 2 * kMoments * owned_numel() * sizeof(float));
    }
  }

  std::size_t owned_numel() const noexcept { return steps_.owned_numel(); }
  std::size_t sub_group_numel() const noexcept { return steps_.sub_group_numel(); }
  std::size_t sub_groups() const noexcept { return steps_.count(); }
  Opt& optimizer() noexcept { return *opt_; }
  const Opt& optimizer() const noexcept { return *opt_; }
  /// The swap file (its path, whether O_DIRECT is on, which I/O back end runs).
  const io::SwapFile& swap_file() const noexcept { return file_; }
  std::size_t buffer_count() const noexcept { return buffer_count_; }

  /// One fused step over sub-group i: swap in, step, swap out (pipelined as configured). Segments
  /// as for Resident::step. Call with i = 0 .. n-1; the new state becomes current after n-1.
  template <class G, class P, class Reduce>
  void step(std::size_t i, std::span<const kernels::Segment> segments, const G* grads, P* out, float grad_scale,
            Reduce&& reduce) {
    const std::size_t n = sub_groups();
    try {
      if (i == 0) {
        step_before_ = opt_->step_count();
        file_.check_present();
        next_read_ = 0;
        stepped_ = 0;
      }
      if (next_read_ <= i) issue_read(i);
      if (pipeline_read_ && i + 1 < n && next_read_ == i + 1) issue_read(i + 1);
      const std::size_t b = i % buffer_count_;
      file_.wait(std::exchange(reads_[b], io::IoQueue::kNone));
      std::byte* base = buffer(b);
      stepped_ = i + 1;  // from here on, out holds sub-group i's new values
      steps_.step(*opt_, i, segments, grads, out, grad_scale, std::forward<Reduce>(reduce), as_floats(base),
                  as_floats(base + part_bytes_), as_floats(base + (kTwoMoments ? 2 : 1) * part_bytes_));
      writes_[b] = file_.write(region(1 - current_, i), base, region_bytes());
      if (!pipeline_write_) file_.wait(std::exchange(writes_[b], io::IoQueue::kNone));
      if (i + 1 == n) {
        for (auto& w : writes_) file_.wait(std::exchange(w, io::IoQueue::kNone));
        stepped_ = 0;
        prepared_ = true;  // the new state is whole in the other slot; commit_step() makes it current
      }
    } catch (const std::exception& e) {
      abandon(segments, out, e);
    }
  }

  /// After step(n - 1): the new state becomes the current one (no I/O). The arguments are the
  /// step's, as every store's commit_step takes them (HostPinned's steps again); a swap needs none.
  template <class G, class P, class Reduce>
  void commit_step(std::span<const kernels::Segment>, const G*, P*, float, Reduce&) noexcept {
    if (std::exchange(prepared_, false)) current_ = 1 - current_;
  }
  /// After step(n - 1), instead of commit_step() (another group's step failed): the current slot
  /// stays, the step count goes back, and the working-precision values written to memory are put
  /// back from its master (a writer's values are dropped by its owner). An io_error if they cannot
  /// be read.
  template <class P>
  void abort_step(std::span<const kernels::Segment> segments, P* out) {
    if (!std::exchange(prepared_, false)) return;
    opt_->set_step_count(step_before_);
    put_back(segments, out, sub_groups(), "another group's optimizer step failed");
  }

  /// master[at, at + n) := float(src[0, n)), src in the compute space.
  template <class T>
  void master_from(const T* src, std::size_t at, std::size_t n) {
    std::vector<T> host(n);
    ops_->copy_to_host(src, host.data(), n);
    for_parts(at, n, [&](std::size_t j, std::size_t lo, std::size_t hi) {
      float* m = read_part(j, 0);
      kernels::host::cast(host.data() + (lo - at), m + (lo - steps_.begin(j)), hi - lo);
      write_part(j, 0);
    });
  }
  /// dst[0, n) := T(master[at, at + n)), dst in the compute space.
  template <class T>
  void master_into(std::size_t at, T* dst, std::size_t n) {
    std::vector<T> host(n);
    master_into_host(at, host.data(), n);
    ops_->copy_from_host(host.data(), dst, n);
  }
  /// host[0, n) := T(master[at, at + n)), in host memory (a restored state's values for a writer).
  template <class T>
  void master_into_host(std::size_t at, T* host, std::size_t n) {
    for_parts(at, n, [&](std::size_t j, std::size_t lo, std::size_t hi) {
      const float* m = read_part(j, 0);
      kernels::host::cast(m + (lo - steps_.begin(j)), host + (lo - at), hi - lo);
    });
  }
  void master_to_host(float* dst) const {
    for (std::size_t j = 0; j < sub_groups(); ++j) std::memcpy(dst + steps_.begin(j), read_part(j, 0), steps_.numel(j) * sizeof(float));
  }
  void master_from_host(const float* src) {
    file_.ensure_size();  // after a truncation, the state is rewritten whole
    for (std::size_t j = 0; j < sub_groups(); ++j) {
      std::memcpy(buffer(0), src + steps_.begin(j), steps_.numel(j) * sizeof(float));
      write_part(j, 0);
    }
  }

  OptimizerState optimizer_state() const {
    OptimizerState s{opt_->step_count(), std::vector<float>(owned_numel()),
                     std::vector<float>(kTwoMoments ? owned_numel() : 0), {}, {}};
    for (std::size_t j = 0; j < sub_groups(); ++j) {
      std::memcpy(s.m.data() + steps_.begin(j), read_part(j, 1), steps_.numel(j) * sizeof(float));
      if (kTwoMoments) std::memcpy(s.v.data() + steps_.begin(j), read_part(j, 2), steps_.numel(j) * sizeof(float));
    }
    return s;
  }
  void load_optimizer_state(const OptimizerState& s) {
    optim::check_state(s, owned_numel(), "Engine::load_state", optim::moments_v<Opt>);
    optim::check_extra(*opt_, s, "Engine::load_state");
    file_.ensure_size();
    for (std::size_t j = 0; j < sub_groups(); ++j) {
      std::memcpy(buffer(0), s.m.data() + steps_.begin(j), steps_.numel(j) * sizeof(float));
      write_part(j, 1);
      if (kTwoMoments) {
        std::memcpy(buffer(0), s.v.data() + steps_.begin(j), steps_.numel(j) * sizeof(float));
        write_part(j, 2);
      }
    }
    opt_->set_step_count(s.step);
  }

 private:
  static const std::filesystem::path& checked_path(const NvmeOptions& o) {
    if (o.path.empty()) throw config_error("required for Offload<Nvme>", "zero_optimization.offload_optimizer.nvme_path");
    return o.path;
  }
  static std::size_t buffers_for(const NvmeOptions& o, std::size_t sub_groups) {
    if (o.buffer_count == 0) {
      throw config_error("must be >= 1", "zero_optimization.offload_optimizer.buffer_count", "0");
    }
    return swap_buffer_count(o.buffer_count, o.pipeline_read, o.pipeline_write, sub_groups);
  }
  static float* as_floats(std::byte* p) noexcept { return reinterpret_cast<float*>(p); }

  /// One sub-group's master, m and v, each padded to 4096 bytes (in the file and in a buffer).
  std::size_t region_bytes() const noexcept { return (1 + kMoments) * part_bytes_; }
  std::uint64_t region(int slot, std::size_t i) const noexcept {
    return (static_cast<std::uint64_t>(slot) * sub_groups() + i) * region_bytes();
  }
  std::byte* buffer(std::size_t b) const noexcept { return buffers_.data() + b * region_bytes(); }

  /// Starts reading sub-group j (current slot) into its buffer, once that buffer's write is done.
  void issue_read(std::size_t j) {
    const std::size_t b = j % buffer_count_;
    file_.wait(std::exchange(writes_[b], io::IoQueue::kNone));
    reads_[b] = file_.read(region(current_, j), buffer(b), region_bytes());
    next_read_ = j + 1;
  }

  /// Part k (0 master, 1 m, 2 v) of sub-group j of the current slot, read into the first buffer.
  const float* read_part(std::size_t j, int k) const {
    file_.wait(file_.read(region(current_, j) + static_cast<std::uint64_t>(k) * part_bytes_, buffer(0), part_bytes_));
    return as_floats(buffer(0));
  }
  float* read_part(std::size_t j, int k) {
    return const_cast<float*>(static_cast<const NvmeSwapped&>(*this).read_part(j, k));
  }
  /// The first buffer's first part_bytes_ become part k of sub-group j of the current slot.
  void write_part(std::size_t j, int k) {
    file_.wait(file_.write(region(current_, j) + static_cast<std::uint64_t>(k) * part_bytes_, buffer(0), part_bytes_));
  }

  /// f(j, lo, hi) for each sub-group j meeting [at, at + n), with [lo, hi) the overlap (owned offsets).
  template <class F>
  void for_parts(std::size_t at, std::size_t n, F&& f) {
    if (n == 0) return;
    for (std::size_t j = at / steps_.sub_group_numel(); j < sub_groups() && steps_.begin(j) < at + n; ++j) {
      f(j, std::max(at, steps_.begin(j)), std::min(at + n, steps_.end(j)));
    }
  }

  /// Waits for everything in flight, dropping errors.
  void drain() noexcept {
    for (auto& r : reads_) file_.wait_quietly(std::exchange(r, io::IoQueue::kNone));
    for (auto& w : writes_) file_.wait_quietly(std::exchange(w, io::IoQueue::kNone));
  }

  /// A failed step: nothing of it stays (see the file comment); rethrows `cause`, or an io_error
  /// saying the values could not be put back.
  template <class P>
  [[noreturn]] void abandon(std::span<const kernels::Segment> segments, P* out, const std::exception& cause) {
    drain();
    next_read_ = 0;
    opt_->set_step_count(step_before_);
    put_back(segments, out, std::exchange(stepped_, 0),
             std::string("the optimizer step was abandoned (") + cause.what() + ")");
    throw;  // the original error, state as before the step
  }

  /// out := P(master) of the current slot for sub-groups [0, count): the values a step wrote to
  /// memory or a writer into memory before it was abandoned (a shard file's writer is dropped by
  /// its owner, so nothing is written to one). An io_error saying `why` and that the values are lost
  /// if the master cannot be read.
  template <class P>
  void put_back(std::span<const kernels::Segment> segments, P* out, std::size_t count, const std::string& why) {
    if constexpr (!zero::FileWriter<P>) {  // memory, or a writer into memory
      if (out == nullptr) return;
      try {
        for (std::size_t j = 0; j < count; ++j) steps_.write_out(segments, j, read_part(j, 0), out);
      } catch (const std::exception& e) {
        throw io_error(why + ", and putting back the parameters' previous values failed too: some sub-groups hold "
                           "this step's values; load a checkpoint or a state",
                       file_.path().string(), e.what());
      }
    }
  }

  SubGroupSteps<Ops> steps_;
  Ops* ops_;
  MemoryLedger* ledger_;
  std::size_t part_bytes_;  // bytes of one sub-group's master (and of its m, of its v), padded to 4096
  mutable io::SwapFile file_;  // [2 slots][sub-groups][master | m | v (two moments)] fp32, each part part_bytes_
  bool pipeline_read_, pipeline_write_;
  std::size_t buffer_count_;
  mutable PinnedTrackedBuffer<std::byte> buffers_;  // [buffer_count][master | m | v (two moments)] of one sub-group
  std::vector<io::IoQueue::Ticket> reads_, writes_;  // per buffer, in flight
  std::unique_ptr<Opt> opt_;
  int current_ = 0;            // the slot holding the state
  bool prepared_ = false;      // a complete step waits in the other slot for commit_step()
  std::size_t next_read_ = 0;  // the next sub-group whose read is not issued yet (this step)
  std::size_t stepped_ = 0;    // sub-groups whose values were written to `out` (this step)
  std::int64_t step_before_ = 0;  // the optimizer's step count before this step
};

}  // namespace zerotk::offload
