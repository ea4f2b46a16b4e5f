#pragma once
/// \file zerotk/kernels/cuda/multi_tensor.cuh
/// The multi-tensor launch machinery shared by the CUDA kernels: a chunk table (one thread block per
/// chunk of kChunkElements elements of one item), a device Workspace that receives the table, the
/// per-item arguments and constants in one host-to-device copy, and 4-wide vector loads/stores.
///
/// One launch covers a list of thousands of tensors: the table lives in device memory, so neither the
/// kernel parameter limit nor the tensor count splits the work into several launches.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <cuda_runtime.h>

#include "zerotk/core/cuda.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"

namespace zerotk::kernels::cuda {

/// Threads per block of every multi-tensor kernel.
inline constexpr int kBlockThreads = 512;
/// Elements one block processes (a multiple of 4 * kBlockThreads: whole float4 rounds).
inline constexpr std::uint32_t kChunkElements = 16384;

/// Elements [begin, begin + numel) of item `item` of a launch's list.
struct Chunk {
  std::uint64_t begin;
  std::uint32_t numel;
  std::uint32_t item;
};

/// Appends the chunks of `items` items of sizes numel_of(i) to `out`; first[i] receives the index of
/// item i's first chunk (first[items] = total), when given.
template <class NumelOf>
void append_chunks(std::size_t items, NumelOf&& numel_of, std::vector<Chunk>& out,
                   std::vector<std::uint32_t>* first = nullptr) {
  if (first) first->assign(items + 1, 0);
  for (std::size_t i = 0; i < items; ++i) {
    if (first) (*first)[i] = static_cast<std::uint32_t>(out.size());
    const std::size_t n = numel_of(i);
    for (std::size_t b = 0; b < n; b += kChunkElements) {
      const std::size_t len = n - b < kChunkElements ? n - b : kChunkElements;
      out.push_back({b, static_cast<std::uint32_t>(len), static_cast<std::uint32_t>(i)});
    }
  }
  if (first) (*first)[items] = static_cast<std::uint32_t>(out.size());
}

/// Device memory for launch tables and scratch (partial sums). Each launcher stages its tables on the
/// host, reserves scratch, and uploads everything with one cudaMemcpyAsync. The buffer only grows.
/// Use one Workspace per stream: a launch reuses the memory the previous launch on it read.
class Workspace {
 public:
  Workspace() = default;
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace() {
    if (dev_) cudaFree(dev_);
  }

  /// Starts a new launch: forgets what was staged.
  void reset() noexcept {
    host_.clear();
    scratch_ = 0;
  }
  /// Copies `count` elements to the staging area; returns their offset (16-byte aligned).
  template <class T>
  std::size_t stage(const T* data, std::size_t count) {
    static_assert(std::is_trivially_copyable_v<T>, "Workspace::stage: tables must be trivially copyable");
    if (scratch_ != 0) throw usage_error("stage() after scratch() in one launch", "kernels::cuda::Workspace");
    const std::size_t off = align(host_.size());
    host_.resize(off + count * sizeof(T));
    if (count) std::memcpy(host_.data() + off, static_cast<const void*>(data), count * sizeof(T));
    return off;
  }
  template <class T>
  std::size_t stage(const std::vector<T>& v) {
    return stage(v.data(), v.size());
  }
  /// Reserves uninitialised device scratch after the staged tables; returns its offset. Call it
  /// after the last stage() of a launch.
  std::size_t scratch(std::size_t bytes) {
    const std::size_t off = align(host_.size()) + scratch_;
    scratch_ += align(bytes);
    return off;
  }
  /// Makes room on the device and copies the staged tables (asynchronously on `stream`).
  void upload(cudaStream_t stream) {
    const std::size_t need = align(host_.size()) + scratch_;
    if (need > capacity_) {
      // Kernels queued earlier on this stream may still read the old buffer.
      ZEROTK_CUDA_CHECK(cudaStreamSynchronize(stream));
      if (dev_) ZEROTK_CUDA_CHECK(cudaFree(dev_));
      dev_ = nullptr;
      capacity_ = 0;
      const std::size_t want = need + need / 2 + 4096;
      ZEROTK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&dev_), want));
      capacity_ = want;
    }
    if (!host_.empty()) {
      // From pageable memory: the call returns once the bytes are staged, so host_ may be reused.
      ZEROTK_CUDA_CHECK(cudaMemcpyAsync(dev_, host_.data(), host_.size(), cudaMemcpyHostToDevice, stream));
    }
  }
  /// Device address of a staged table or scratch region.
  template <class T>
  T* device(std::size_t offset) const noexcept {
    return reinterpret_cast<T*>(dev_ + offset);
  }
  std::size_t capacity() const noexcept { return capacity_; }

 private:
  static std::size_t align(std::size_t x) noexcept { return (x + 15) / 16 * 16; }
  std::vector<unsigned char> host_;
  std::size_t scratch_ = 0;
  char* dev_ = nullptr;
  std::size_t capacity_ = 0;
};

namespace detail {

/// Blocks for a launch of `chunks` chunks (one per chunk); validated before launching.
inline unsigned grid_for(std::size_t chunks, const char* where) {
  if (chunks > 0x7fffffffu) throw usage_error("too many chunks for one launch", where, std::to_string(chunks));
  return static_cast<unsigned>(chunks);
}

template <std::size_t Bytes, class T>
__device__ __forceinline__ bool aligned(const T* p) {
  return (reinterpret_cast<std::uintptr_t>(p) % Bytes) == 0;
}

/// Four consecutive elements as floats: one 16-byte (fp32) or 8-byte (16-bit) load.
template <class T>
__device__ __forceinline__ void load4(const T* p, float (&x)[4]) {
  if constexpr (std::is_same_v<T, float>) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    x[0] = v.x;
    x[1] = v.y;
    x[2] = v.z;
    x[3] = v.w;
  } else {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    const std::uint16_t b[4] = {static_cast<std::uint16_t>(u.x & 0xffffu), static_cast<std::uint16_t>(u.x >> 16),
                                static_cast<std::uint16_t>(u.y & 0xffffu), static_cast<std::uint16_t>(u.y >> 16)};
#pragma unroll
    for (int q = 0; q < 4; ++q) x[q] = to_float(T::from_bits(b[q]));
  }
}

/// Stores four floats as T (rounded to nearest even for 16-bit types).
template <class T>
__device__ __forceinline__ void store4(T* p, const float (&x)[4]) {
  if constexpr (std::is_same_v<T, float>) {
    *reinterpret_cast<float4*>(p) = make_float4(x[0], x[1], x[2], x[3]);
  } else {
    std::uint32_t b[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) b[q] = from_float<T>(x[q]).bits;
    *reinterpret_cast<uint2*>(p) = make_uint2(b[0] | (b[1] << 16), b[2] | (b[3] << 16));
  }
}

/// True when 4-element vector accesses to p are aligned (16 bytes for fp32, 8 for 16-bit).
template <class T>
__device__ __forceinline__ bool vec4_ok(const T* p) {
  if constexpr (std::is_void_v<T>) {
    return true;
  } else {
    return p == nullptr || aligned<4 * sizeof(T)>(p);
  }
}

}  // namespace detail
}  // namespace zerotk::kernels::cuda
