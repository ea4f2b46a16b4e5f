#pragma once
/// \file zerotk/core/pinned_host_space.hpp
/// PinnedHostSpace: page-locked host memory as a Space for BasicTrackedBuffer (core/memory.hpp),
/// recorded in the ledger under MemorySpace::pinned_host. Offload<Cpu> keeps the fp32 master, the
/// optimizer state and its staging buffers here (offload/host_pinned.hpp).
///
/// Each allocation is its own anonymous mapping (mmap), locked with mlock: whole pages, so no two
/// buffers share a page (mlock does not stack: munlock of one buffer would unlock a page another
/// still needs), zero-filled by the kernel, unlocked and returned by munmap. The ledger records the
/// bytes asked for (n * sizeof(T)), not the page rounding.
///
/// When the lock is refused (RLIMIT_MEMLOCK too small, without CAP_IPC_LOCK) the allocation fails
/// with a usage_error naming the bytes asked, the soft limit and how to raise it. There is no silent
/// fall-back to pageable memory: Offload<Cpu> promises page-locked state, and a run that quietly
/// lost it would be slower and would not say why.
///
/// This space knows nothing of devices. The buffers a device copies to and from (the offload
/// stagings) are registered with it by their owner through Ops::register_host (device/cuda_ops.cuh:
/// cudaHostRegister, so the copies are direct DMA; device/host_ops.hpp: nothing), so that the engine's
/// Device decides, not how a translation unit was compiled.

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <new>
#include <string>

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "zerotk/core/error.hpp"
#include "zerotk/core/memory.hpp"

namespace zerotk {

namespace detail {
inline std::size_t page_bytes() noexcept {
  const long p = ::sysconf(_SC_PAGESIZE);
  return p > 0 ? static_cast<std::size_t>(p) : 4096;
}
inline std::size_t round_to_pages(std::size_t bytes) noexcept {
  const std::size_t p = page_bytes();
  return (bytes + p - 1) / p * p;
}
/// The soft RLIMIT_MEMLOCK as text ("unlimited" or bytes).
inline std::string memlock_limit_text() {
  rlimit r{};
  if (::getrlimit(RLIMIT_MEMLOCK, &r) != 0) return "unknown";
  if (r.rlim_cur == RLIM_INFINITY) return "unlimited";
  return std::to_string(static_cast<unsigned long long>(r.rlim_cur)) + " bytes";
}
/// The only object a zero-element buffer points at (never written, never locked).
alignas(kAlignment) inline std::byte pinned_empty[kAlignment];
}  // namespace detail

/// Page-locked host memory (mmap + mlock). Throws usage_error when the lock is refused,
/// std::bad_alloc when the mapping fails.
struct PinnedHostSpace {
  static constexpr bool host_accessible = true;
  static constexpr MemorySpace memory_space = MemorySpace::pinned_host;

  template <class T>
  static T* allocate(std::size_t n, MemoryCategory category) {
    if (n == 0) return reinterpret_cast<T*>(detail::pinned_empty);
    const std::size_t bytes = n * sizeof(T), mapped = detail::round_to_pages(bytes);
    void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    if (::mlock(p, mapped) != 0) {
      const int err = errno;
      ::munmap(p, mapped);
      throw usage_error("page-locked host memory for Offload<Cpu> (" + std::string(to_string(category)) +
                            "): mlock of " + std::to_string(mapped) + " bytes refused (" + std::strerror(err) +
                            "); the locked-memory limit RLIMIT_MEMLOCK is " + detail::memlock_limit_text() +
                            ". Raise it (`ulimit -l unlimited`, or memlock in /etc/security/limits.conf or the "
                            "container's --ulimit memlock=-1) or use Offload<None>",
                        "PinnedHostSpace::allocate", std::to_string(bytes) + " bytes asked");
    }
    return static_cast<T*>(p);  // zero-filled by the kernel; T is trivial (float, half, bfloat16, bytes)
  }
  template <class T>
  static void deallocate(T* p, std::size_t n) noexcept {
    if (n == 0 || p == nullptr) return;
    ::munmap(static_cast<void*>(p), detail::round_to_pages(n * sizeof(T)));  // also unlocks
  }
};

template <class T>
using PinnedTrackedBuffer = BasicTrackedBuffer<T, PinnedHostSpace>;

}  // namespace zerotk
