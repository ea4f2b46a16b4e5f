#pragma once
/// \file zerotk/core/memory.hpp
/// Host memory: 64-byte aligned allocations, pinned (page-locked) allocations for host<->device
/// staging, and the MemoryLedger that records live bytes per category so tests can prove the ZeRO
/// memory formulas (SEMANTICS.md section 6).

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <utility>

#include <sys/mman.h>

#include "zerotk/core/error.hpp"
#include "zerotk/core/macros.hpp"

#if ZEROTK_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

namespace zerotk {

/// Alignment of every buffer zerotk allocates: one cache line, enough for AVX-512 and CUDA vector loads.
inline constexpr std::size_t kAlignment = 64;

// ---------------------------------------------------------------------------------------------------
// Memory ledger

/// What a byte is used for. Matches the terms of the ZeRO paper's memory analysis.
enum class MemoryCategory : std::uint8_t {
  params16,         ///< 16-bit (or working-precision) parameters
  grads,            ///< gradients in working precision or their fp32 partitions
  master32,         ///< fp32 master copy of parameters
  optimizer_state,  ///< Adam m and v, LAMB state, ...
  comm_buffers,     ///< buckets and staging for collectives
  gathered,         ///< ZeRO-3: full parameters gathered from their shards for a layer (a reused pool)
  secondary,        ///< ZeRO-3 hpZ: the secondary shard of the parameters within a rank's group
  activations,      ///< saved activations (the user may record these)
  other,
};
inline constexpr std::size_t kMemoryCategoryCount = 9;

constexpr std::string_view to_string(MemoryCategory c) noexcept {
  switch (c) {
    case MemoryCategory::params16: return "params16";
    case MemoryCategory::grads: return "grads";
    case MemoryCategory::master32: return "master32";
    case MemoryCategory::optimizer_state: return "optimizer_state";
    case MemoryCategory::comm_buffers: return "comm_buffers";
    case MemoryCategory::gathered: return "gathered";
    case MemoryCategory::secondary: return "secondary";
    case MemoryCategory::activations: return "activations";
    case MemoryCategory::other: return "other";
  }
  return "unknown";
}

/// Where a byte lives. Device memory is the accelerator's; pinned host memory is page-locked (for
/// asynchronous copies); disk is what an NVMe offload swaps out.
enum class MemorySpace : std::uint8_t { host, pinned_host, device, disk };
inline constexpr std::size_t kMemorySpaceCount = 4;

constexpr std::string_view to_string(MemorySpace s) noexcept {
  switch (s) {
    case MemorySpace::host: return "host";
    case MemorySpace::pinned_host: return "pinned_host";
    case MemorySpace::device: return "device";
    case MemorySpace::disk: return "disk";
  }
  return "unknown";
}

/// Live and peak bytes per memory space and category for one rank. Thread-safe: ranks of the
/// threads communicator each own a ledger, but a rank's helper threads may allocate concurrently.
/// The one-argument queries sum over spaces (what the model states take wherever they live).
class MemoryLedger {
 public:
  void add(MemorySpace s, MemoryCategory c, std::size_t bytes) noexcept {
    const auto si = static_cast<std::size_t>(s), ci = static_cast<std::size_t>(c);
    raise(peak_[index(s, c)], live_[index(s, c)].fetch_add(bytes, std::memory_order_relaxed) + bytes);
    raise(category_peak_[ci], category_live_[ci].fetch_add(bytes, std::memory_order_relaxed) + bytes);
    raise(space_peak_[si], space_live_[si].fetch_add(bytes, std::memory_order_relaxed) + bytes);
    raise(peak_total_, total_.fetch_add(bytes, std::memory_order_relaxed) + bytes);
  }
  void sub(MemorySpace s, MemoryCategory c, std::size_t bytes) noexcept {
    live_[index(s, c)].fetch_sub(bytes, std::memory_order_relaxed);
    category_live_[static_cast<std::size_t>(c)].fetch_sub(bytes, std::memory_order_relaxed);
    space_live_[static_cast<std::size_t>(s)].fetch_sub(bytes, std::memory_order_relaxed);
    total_.fetch_sub(bytes, std::memory_order_relaxed);
  }
  /// Host memory (the space of plain TrackedBuffers).
  void add(MemoryCategory c, std::size_t bytes) noexcept { add(MemorySpace::host, c, bytes); }
  void sub(MemoryCategory c, std::size_t bytes) noexcept { sub(MemorySpace::host, c, bytes); }

  std::size_t live(MemorySpace s, MemoryCategory c) const noexcept { return load(live_[index(s, c)]); }
  std::size_t peak(MemorySpace s, MemoryCategory c) const noexcept { return load(peak_[index(s, c)]); }
  /// All spaces together.
  std::size_t live(MemoryCategory c) const noexcept { return load(category_live_[static_cast<std::size_t>(c)]); }
  std::size_t peak(MemoryCategory c) const noexcept { return load(category_peak_[static_cast<std::size_t>(c)]); }
  /// All categories of one space.
  std::size_t live_total(MemorySpace s) const noexcept { return load(space_live_[static_cast<std::size_t>(s)]); }
  std::size_t peak_total(MemorySpace s) const noexcept { return load(space_peak_[static_cast<std::size_t>(s)]); }
  std::size_t live_total() const noexcept { return load(total_); }
  std::size_t peak_total() const noexcept { return load(peak_total_); }
  /// Forget peaks (e.g. after set-up, to measure one step).
  void reset_peaks() noexcept {
    for (std::size_t i = 0; i < live_.size(); ++i) peak_[i].store(live_[i].load());
    for (std::size_t i = 0; i < kMemoryCategoryCount; ++i) category_peak_[i].store(category_live_[i].load());
    for (std::size_t i = 0; i < kMemorySpaceCount; ++i) space_peak_[i].store(space_live_[i].load());
    peak_total_.store(total_.load());
  }

 private:
  static constexpr std::size_t index(MemorySpace s, MemoryCategory c) noexcept {
    return static_cast<std::size_t>(s) * kMemoryCategoryCount + static_cast<std::size_t>(c);
  }
  static std::size_t load(const std::atomic<std::size_t>& a) noexcept { return a.load(std::memory_order_relaxed); }
  static void raise(std::atomic<std::size_t>& peak, std::size_t v) noexcept {
    std::size_t p = peak.load(std::memory_order_relaxed);
    while (v > p && !peak.compare_exchange_weak(p, v, std::memory_order_relaxed)) {
    }
  }
  std::array<std::atomic<std::size_t>, kMemorySpaceCount * kMemoryCategoryCount> live_{}, peak_{};
  std::array<std::atomic<std::size_t>, kMemoryCategoryCount> category_live_{}, category_peak_{};
  std::array<std::atomic<std::size_t>, kMemorySpaceCount> space_live_{}, space_peak_{};
  std::atomic<std::size_t> total_{0}, peak_total_{0};
};

// ---------------------------------------------------------------------------------------------------
// Aligned host allocation

/// Allocates `bytes` aligned to kAlignment (rounded up to a whole number of alignments). Throws
/// std::bad_alloc with the size in the message on failure.
inline void* aligned_alloc_bytes(std::size_t bytes) {
  std::size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded == 0) rounded = kAlignment;
  void* p = ::operator new(rounded, std::align_val_t{kAlignment}, std::nothrow);
  if (!p) throw std::bad_alloc();
  return p;
}
inline void aligned_free_bytes(void* p) noexcept {
  if (p) ::operator delete(p, std::align_val_t{kAlignment});
}

/// std-compatible allocator with kAlignment, for std::vector<T, AlignedAllocator<T>>.
template <class T>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() noexcept = default;
  template <class U>
  AlignedAllocator(const AlignedAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(aligned_alloc_bytes(n * sizeof(T))); }
  void deallocate(T* p, std::size_t) noexcept { aligned_free_bytes(p); }
  template <class U>
  bool operator==(const AlignedAllocator<U>&) const noexcept {
    return true;
  }
};

// ---------------------------------------------------------------------------------------------------
// Pinned host allocation

/// How a pinned allocation was obtained; reported so users know whether DMA will be fast.
enum class PinKind : std::uint8_t { cuda_host, mlocked, pageable };

/// Page-locked memory for host<->device staging. With a usable CUDA device it is cudaHostAlloc'ed;
/// otherwise it is aligned memory, mlock'ed when `try_mlock` (and RLIMIT_MEMLOCK allows), else
/// plain pageable memory. `kind()` says which one you got; `fallback_reason()` says why.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t bytes, bool try_mlock = true) : bytes_(bytes) {
#if ZEROTK_HAS_CUDA
    int devices = 0;
    if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) {
      if (cudaHostAlloc(&ptr_, bytes ? bytes : 1, cudaHostAllocPortable) == cudaSuccess) {
        kind_ = PinKind::cuda_host;
        return;
      }
      reason_ = std::string("cudaHostAlloc failed: ") + cudaGetErrorString(cudaGetLastError());
    } else {
      (void)cudaGetLastError();
      reason_ = "no usable CUDA device";
    }
#else
    reason_ = "built without CUDA";
#endif
    ptr_ = aligned_alloc_bytes(bytes);
    kind_ = PinKind::pageable;
    if (try_mlock && bytes > 0) {
      if (::mlock(ptr_, bytes) == 0) {
        kind_ = PinKind::mlocked;
      } else {
        reason_ += "; mlock refused (raise RLIMIT_MEMLOCK), using pageable memory";
      }
    }
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  PinnedBuffer(PinnedBuffer&& o) noexcept { swap(o); }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    PinnedBuffer tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  ~PinnedBuffer() { release(); }

  void* data() const noexcept { return ptr_; }
  std::size_t bytes() const noexcept { return bytes_; }
  PinKind kind() const noexcept { return kind_; }
  /// Empty when the memory is truly pinned by CUDA; otherwise why it is not.
  const std::string& fallback_reason() const noexcept { return reason_; }

 private:
  void swap(PinnedBuffer& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    std::swap(kind_, o.kind_);
    std::swap(reason_, o.reason_);
  }
  void release() noexcept {
    if (!ptr_) return;
#if ZEROTK_HAS_CUDA
    if (kind_ == PinKind::cuda_host) {
      cudaFreeHost(ptr_);
      ptr_ = nullptr;
      return;
    }
#endif
    if (kind_ == PinKind::mlocked) ::munlock(ptr_, bytes_);
    aligned_free_bytes(ptr_);
    ptr_ = nullptr;
  }
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  PinKind kind_ = PinKind::pageable;
  std::string reason_;
};

// ---------------------------------------------------------------------------------------------------
// Ledger-tracked buffers

/// An owned array of `T` in the memory space `Space`, zero-initialised, whose bytes are recorded in a
/// ledger category for its lifetime. Move-only. This is how the engine allocates everything it
/// reports: `TrackedBuffer<T>` in host memory (below), `TrackedDeviceBuffer<T>` in GPU memory
/// (core/cuda_memory.hpp). Element access (`[]`, begin/end) exists only where the host can read.
///
/// A Space provides `static constexpr bool host_accessible`, `memory_space` (the ledger's), `allocate<T>(n, category)` returning
/// zeroed storage (throwing with the size on failure) and `deallocate(T*, n) noexcept`.
template <class T, class Space>
class BasicTrackedBuffer {
 public:
  BasicTrackedBuffer() = default;
  BasicTrackedBuffer(std::size_t n, MemoryCategory cat, MemoryLedger* ledger = nullptr)
      : n_(n), cat_(cat), ledger_(ledger) {
    ptr_ = Space::template allocate<T>(n, cat);
    if (ledger_) ledger_->add(Space::memory_space, cat_, bytes());
  }
  BasicTrackedBuffer(const BasicTrackedBuffer&) = delete;
  BasicTrackedBuffer& operator=(const BasicTrackedBuffer&) = delete;
  BasicTrackedBuffer(BasicTrackedBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), n_(std::exchange(o.n_, 0)), cat_(o.cat_), ledger_(o.ledger_) {}
  BasicTrackedBuffer& operator=(BasicTrackedBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      n_ = std::exchange(o.n_, 0);
      cat_ = o.cat_;
      ledger_ = o.ledger_;
    }
    return *this;
  }
  ~BasicTrackedBuffer() { reset(); }

  void reset() noexcept {
    if (ptr_) {
      if (ledger_) ledger_->sub(Space::memory_space, cat_, bytes());
      Space::deallocate(ptr_, n_);
    }
    ptr_ = nullptr;
    n_ = 0;
  }

  T* data() noexcept { return ptr_; }
  const T* data() const noexcept { return ptr_; }
  std::size_t size() const noexcept { return n_; }
  std::size_t bytes() const noexcept { return n_ * sizeof(T); }
  bool empty() const noexcept { return n_ == 0; }
  MemoryCategory category() const noexcept { return cat_; }

  T& operator[](std::size_t i) noexcept
    requires Space::host_accessible
  { return ptr_[i]; }
  const T& operator[](std::size_t i) const noexcept
    requires Space::host_accessible
  { return ptr_[i]; }
  T* begin() noexcept
    requires Space::host_accessible
  { return ptr_; }
  T* end() noexcept
    requires Space::host_accessible
  { return ptr_ + n_; }
  const T* begin() const noexcept
    requires Space::host_accessible
  { return ptr_; }
  const T* end() const noexcept
    requires Space::host_accessible
  { return ptr_ + n_; }

 private:
  T* ptr_ = nullptr;
  std::size_t n_ = 0;
  MemoryCategory cat_ = MemoryCategory::other;
  MemoryLedger* ledger_ = nullptr;
};

/// Host memory aligned to kAlignment.
struct HostSpace {
  static constexpr bool host_accessible = true;
  static constexpr MemorySpace memory_space = MemorySpace::host;
  template <class T>
  static T* allocate(std::size_t n, MemoryCategory) {
    T* p = static_cast<T*>(aligned_alloc_bytes(n * sizeof(T)));
    for (std::size_t i = 0; i < n; ++i) new (p + i) T();
    return p;
  }
  template <class T>
  static void deallocate(T* p, std::size_t) noexcept {
    aligned_free_bytes(p);
  }
};

template <class T>
using TrackedBuffer = BasicTrackedBuffer<T, HostSpace>;

}  // namespace zerotk
