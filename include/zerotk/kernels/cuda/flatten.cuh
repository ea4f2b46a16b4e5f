#pragma once
/// \file zerotk/kernels/cuda/flatten.cuh
/// Flatten / unflatten many device tensors in ONE batched launch (a table of copy items), converting
/// the element type on the way when asked (rounding as the host does) and zero-filling layout gaps.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <cuda_runtime.h>

#include "zerotk/core/cuda.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/kernels/cuda/multi_tensor.cuh"
#include "zerotk/kernels/tensor_list.hpp"

namespace zerotk::kernels::cuda {

/// numel elements from src to dst (converted Src -> Dst); src == nullptr writes zeros.
template <class Src, class Dst>
struct CopyItem {
  const Src* src;
  Dst* dst;
  std::size_t numel;
};

template <class Src, class Dst>
__global__ void __launch_bounds__(kBlockThreads)
    batched_copy_kernel(const Chunk* __restrict__ chunks, const CopyItem<Src, Dst>* __restrict__ items) {
  const Chunk c = chunks[blockIdx.x];
  const CopyItem<Src, Dst> it = items[c.item];
  Dst* dst = it.dst + c.begin;
  const std::uint32_t n = c.numel;
  if (it.src == nullptr) {
    for (std::uint32_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = from_float<Dst>(0.0f);
    return;
  }
  const Src* src = it.src + c.begin;
  std::uint32_t done = 0;
  if (detail::vec4_ok(src) && detail::vec4_ok(dst)) {
    const std::uint32_t n4 = n / 4;
    for (std::uint32_t j = threadIdx.x; j < n4; j += blockDim.x) {
      if constexpr (std::is_same_v<Src, Dst>) {
        // 4 elements of 4 or 2 bytes: one 16- or 8-byte move, no conversion.
        if constexpr (sizeof(Src) == 4) {
          reinterpret_cast<uint4*>(dst)[j] = reinterpret_cast<const uint4*>(src)[j];
        } else {
          reinterpret_cast<uint2*>(dst)[j] = reinterpret_cast<const uint2*>(src)[j];
        }
      } else {
        float f[4];
        detail::load4(src + 4 * j, f);
        detail::store4(dst + 4 * j, f);
      }
    }
    done = 4 * n4;
  }
  for (std::uint32_t i = done + threadIdx.x; i < n; i += blockDim.x) {
    if constexpr (std::is_same_v<Src, Dst>) {
      dst[i] = src[i];
    } else {
      dst[i] = from_float<Dst>(to_float(src[i]));
    }
  }
}

/// Runs a list of copy items in one launch.
template <class Src, class Dst>
void batched_copy(std::span<const CopyItem<Src, Dst>> items, Workspace& ws, cudaStream_t stream = nullptr) {
  std::vector<Chunk> chunks;
  append_chunks(items.size(), [&](std::size_t i) { return items[i].numel; }, chunks);
  if (chunks.empty()) return;
  ws.reset();
  const std::size_t oc = ws.stage(chunks), oi = ws.stage(items.data(), items.size());
  ws.upload(stream);
  batched_copy_kernel<Src, Dst><<<detail::grid_for(chunks.size(), "kernels::cuda::batched_copy"), kBlockThreads, 0, stream>>>(
      ws.device<Chunk>(oc), ws.device<CopyItem<Src, Dst>>(oi));
  ZEROTK_CUDA_CHECK_LAUNCH();
}

/// Device tensors into dst + layout.offsets[i]; gaps and the tail up to layout.numel become zero.
template <class Src, class Dst>
void flatten(std::span<const TensorRef<const Src>> src, Dst* dst, const FlatLayout& layout, Workspace& ws,
             cudaStream_t stream = nullptr) {
  if (layout.offsets.size() != src.size()) {
    throw usage_error("layout was made for a different number of tensors", "kernels::cuda::flatten",
                      std::to_string(layout.offsets.size()) + " offsets for " + std::to_string(src.size()) + " tensors");
  }
  std::vector<CopyItem<Src, Dst>> items;
  std::size_t at = 0;
  for (std::size_t i = 0; i < src.size(); ++i) {
    if (src[i].numel > layout.slot(i)) {
      throw usage_error("tensor does not fit its slot of the layout", "kernels::cuda::flatten: tensor " + std::to_string(i),
                        std::to_string(src[i].numel) + " > " + std::to_string(layout.slot(i)));
    }
    if (layout.offsets[i] > at) items.push_back({nullptr, dst + at, layout.offsets[i] - at});
    items.push_back({src[i].data, dst + layout.offsets[i], src[i].numel});
    at = layout.offsets[i] + src[i].numel;
  }
  if (layout.numel > at) items.push_back({nullptr, dst + at, layout.numel - at});
  batched_copy<Src, Dst>(items, ws, stream);
}

/// src + layout.offsets[i] back into each device tensor i.
template <class Src, class Dst>
void unflatten(const Src* src, std::span<const TensorRef<Dst>> dst, const FlatLayout& layout, Workspace& ws,
               cudaStream_t stream = nullptr) {
  if (layout.offsets.size() != dst.size()) {
    throw usage_error("layout was made for a different number of tensors", "kernels::cuda::unflatten",
                      std::to_string(layout.offsets.size()) + " offsets for " + std::to_string(dst.size()) + " tensors");
  }
  std::vector<CopyItem<Src, Dst>> items;
  for (std::size_t i = 0; i < dst.size(); ++i) {
    if (dst[i].numel > layout.slot(i)) {
      throw usage_error("tensor does not fit its slot of the layout", "kernels::cuda::unflatten: tensor " + std::to_string(i),
                        std::to_string(dst[i].numel) + " > " + std::to_string(layout.slot(i)));
    }
    items.push_back({src + layout.offsets[i], dst[i].data, dst[i].numel});
  }
  batched_copy<Src, Dst>(items, ws, stream);
}

}  // namespace zerotk::kernels::cuda
