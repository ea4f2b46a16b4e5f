#pragma once
/// \file zerotk/core/cuda_memory.hpp
/// TrackedDeviceBuffer<T>: device memory whose bytes are recorded in a MemoryLedger category for its
/// lifetime, the device twin of TrackedBuffer (core/memory.hpp). Zero-filled on allocation. Host
/// code only (CUDA runtime API); the Engine's CUDA backend allocates everything through it, so the
/// ledger reports per-GPU model-state bytes exactly as it reports host bytes.

#include <cstddef>
#include <string>
#include <utility>

#include <cuda_runtime_api.h>

#include "zerotk/core/cuda.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/core/memory.hpp"

namespace zerotk {

template <class T>
class TrackedDeviceBuffer {
 public:
  TrackedDeviceBuffer() = default;
  TrackedDeviceBuffer(std::size_t n, MemoryCategory cat, MemoryLedger* ledger = nullptr)
      : n_(n), cat_(cat), ledger_(ledger) {
    if (n == 0) return;
    const cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&ptr_), bytes());
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      ptr_ = nullptr;
      throw usage_error(std::string("cudaMalloc failed: ") + cudaGetErrorString(e),
                        std::string("TrackedDeviceBuffer (") + std::string(to_string(cat)) + ")",
                        std::to_string(bytes()) + " bytes");
    }
    ZEROTK_CUDA_CHECK(cudaMemset(ptr_, 0, bytes()));
    if (ledger_) ledger_->add(cat_, bytes());
  }
  TrackedDeviceBuffer(const TrackedDeviceBuffer&) = delete;
  TrackedDeviceBuffer& operator=(const TrackedDeviceBuffer&) = delete;
  TrackedDeviceBuffer(TrackedDeviceBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), n_(std::exchange(o.n_, 0)), cat_(o.cat_), ledger_(o.ledger_) {}
  TrackedDeviceBuffer& operator=(TrackedDeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      n_ = std::exchange(o.n_, 0);
      cat_ = o.cat_;
      ledger_ = o.ledger_;
    }
    return *this;
  }
  ~TrackedDeviceBuffer() { reset(); }

  /// Frees the memory (cudaFree synchronizes the device: no kernel may still use it).
  void reset() noexcept {
    if (ptr_ == nullptr) {
      n_ = 0;
      return;
    }
    if (ledger_) ledger_->sub(cat_, bytes());
    cudaFree(ptr_);
    ptr_ = nullptr;
    n_ = 0;
  }

  /// Device pointers.
  T* data() noexcept { return ptr_; }
  const T* data() const noexcept { return ptr_; }
  std::size_t size() const noexcept { return n_; }
  std::size_t bytes() const noexcept { return n_ * sizeof(T); }
  bool empty() const noexcept { return n_ == 0; }
  MemoryCategory category() const noexcept { return cat_; }

 private:
  T* ptr_ = nullptr;
  std::size_t n_ = 0;
  MemoryCategory cat_ = MemoryCategory::other;
  MemoryLedger* ledger_ = nullptr;
};

}  // namespace zerotk
