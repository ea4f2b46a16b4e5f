#pragma once
/// \file zerotk/kernels/tensor_list.hpp
/// How multi-tensor kernels (host and CUDA) name their operands: a list of `TensorRef`s (separate
/// allocations), or `Segment`s of one flat buffer (a ZeRO partition), and the `FlatLayout` of many
/// tensors packed into one aligned buffer.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "zerotk/core/error.hpp"

namespace zerotk::kernels {

/// A contiguous tensor: `numel` elements at `data`. Converts to TensorRef<const T>.
template <class T>
struct TensorRef {
  T* data = nullptr;
  std::size_t numel = 0;

  TensorRef() = default;
  TensorRef(T* d, std::size_t n) noexcept : data(d), numel(n) {}
  template <class U>
    requires(std::is_const_v<T> && std::is_same_v<std::remove_const_t<T>, U>)
  TensorRef(const TensorRef<U>& o) noexcept : data(o.data), numel(o.numel) {}
};

/// One contiguous piece of a flat fp32 partition that belongs to one parameter tensor.
/// offset/numel: elements within the partition (master, m, v); group: index of its hyper-parameter
/// group (the constants array a kernel receives); tensor: id of the whole tensor (for per-tensor
/// norms; the same id on every rank that holds a piece of it). Its gradients and its working copy
/// start at `offset` in their own arrays too, unless grad_offset / out_offset say otherwise (ZeRO-1
/// reads the reduced gradients and writes the 16-bit values in place in the flat buffers).
struct Segment {
  static constexpr std::size_t same = static_cast<std::size_t>(-1);
  std::size_t offset = 0;
  std::size_t numel = 0;
  std::uint32_t group = 0;
  std::uint32_t tensor = 0;
  std::size_t grad_offset = same;
  std::size_t out_offset = same;

  std::size_t grad_at() const noexcept { return grad_offset == same ? offset : grad_offset; }
  std::size_t out_at() const noexcept { return out_offset == same ? offset : out_offset; }
};

/// One past the last partition element any of `segments` covers (0 for none): how long a buffer
/// indexed like the partition must be to hold them all.
inline std::size_t segments_extent(std::span<const Segment> segments) noexcept {
  std::size_t n = 0;
  for (const Segment& s : segments) n = s.offset + s.numel > n ? s.offset + s.numel : n;
  return n;
}

/// Where each tensor of a list starts in one flat buffer. Each offset is a multiple of the
/// alignment (elements); `numel` is the buffer length, rounded up to `pad_to`. Gaps are padding.
struct FlatLayout {
  std::vector<std::size_t> offsets;
  std::size_t numel = 0;
  /// Elements the tensor i slot spans in the buffer, padding after it included.
  std::size_t slot(std::size_t i) const noexcept {
    return (i + 1 < offsets.size() ? offsets[i + 1] : numel) - offsets[i];
  }
};

/// Lays out tensors of the given sizes back to back, each starting at a multiple of
/// `align_elements` (1 = packed), total rounded up to a multiple of `pad_to` (e.g. 2 * world size).
inline FlatLayout flat_layout(std::span<const std::size_t> numels, std::size_t align_elements = 1,
                              std::size_t pad_to = 1) {
  if (align_elements == 0) throw usage_error("alignment must be >= 1 element", "kernels::flat_layout", "0");
  if (pad_to == 0) throw usage_error("pad_to must be >= 1 element", "kernels::flat_layout", "0");
  FlatLayout l;
  l.offsets.reserve(numels.size());
  std::size_t at = 0;
  for (std::size_t n : numels) {
    at = (at + align_elements - 1) / align_elements * align_elements;
    l.offsets.push_back(at);
    at += n;
  }
  l.numel = (at + pad_to - 1) / pad_to * pad_to;
  return l;
}

}  // namespace zerotk::kernels
