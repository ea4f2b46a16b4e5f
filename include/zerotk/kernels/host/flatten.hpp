#pragma once
/// \file zerotk/kernels/host/flatten.hpp
/// Flatten many tensors into one flat buffer (and back), optionally converting the element type on
/// the way (e.g. fp32 gradients into a 16-bit bucket). One parallel region for the whole list; large
/// tensors are split across threads, small ones cost one copy call each.
///
///   auto layout = kernels::flat_layout(numels, kAlignment / sizeof(float), 2 * world);
///   kernels::host::flatten<float, float>(tensors, flat.data(), layout);   // gaps zero-filled
///   kernels::host::unflatten<float, float>(flat.data(), tensors, layout);

#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/kernels/host/cast.hpp"
#include "zerotk/kernels/host/parallel.hpp"
#include "zerotk/kernels/host/simd.hpp"
#include "zerotk/kernels/tensor_list.hpp"

namespace zerotk::kernels::host {

namespace detail {
inline void check_layout(std::size_t tensors, const FlatLayout& layout, const char* where) {
  if (layout.offsets.size() != tensors) {
    throw usage_error("layout was made for a different number of tensors", where,
                      std::to_string(layout.offsets.size()) + " offsets for " + std::to_string(tensors) + " tensors");
  }
}
template <class T>
void check_fits(std::span<const TensorRef<T>> tensors, const FlatLayout& layout, const char* where) {
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].numel > layout.slot(i)) {
      throw usage_error("tensor does not fit its slot of the layout", where,
                        "tensor " + std::to_string(i) + ": " + std::to_string(tensors[i].numel) + " > " +
                            std::to_string(layout.slot(i)));
    }
  }
}
}  // namespace detail

/// Copies (converting Src -> Dst) each tensor i to dst + layout.offsets[i]; padding after each
/// tensor up to the next offset, and at the end up to layout.numel, is set to zero.
template <FloatingElement Src, FloatingElement Dst>
void flatten(std::span<const TensorRef<const Src>> src, Dst* dst, const FlatLayout& layout) {
  detail::check_layout(src.size(), layout, "kernels::host::flatten");
  detail::check_fits(src, layout, "kernels::host::flatten");
  const simd::Isa isa = simd::active_isa();
  // Item i spans tensor i's slot, padding included; a piece copies what overlaps the tensor and
  // zeroes the rest. The span before the first offset (if any) is zeroed separately.
  if (!layout.offsets.empty() && layout.offsets[0] > 0) std::memset(static_cast<void*>(dst), 0, layout.offsets[0] * sizeof(Dst));
  if (layout.offsets.empty() && layout.numel > 0) std::memset(static_cast<void*>(dst), 0, layout.numel * sizeof(Dst));
  for_each_piece(
      src.size(), [&](std::size_t i) { return layout.slot(i); },
      [&](std::size_t i, std::size_t b, std::size_t e) {
        Dst* out = dst + layout.offsets[i];
        const std::size_t n = src[i].numel;
        if (b < n) detail::convert_range(isa, src[i].data + b, out + b, (e < n ? e : n) - b);
        if (e > n) {
          const std::size_t z = b > n ? b : n;
          std::memset(static_cast<void*>(out + z), 0, (e - z) * sizeof(Dst));
        }
      });
}

/// Packs tensors back to back without gaps (dst holds the sum of their numels).
template <FloatingElement Src, FloatingElement Dst>
void flatten(std::span<const TensorRef<const Src>> src, Dst* dst) {
  const simd::Isa isa = simd::active_isa();
  std::vector<std::size_t> offsets(src.size());
  std::size_t at = 0;
  for (std::size_t i = 0; i < src.size(); ++i) {
    offsets[i] = at;
    at += src[i].numel;
  }
  for_each_piece(
      src.size(), [&](std::size_t i) { return src[i].numel; },
      [&](std::size_t i, std::size_t b, std::size_t e) {
        detail::convert_range(isa, src[i].data + b, dst + offsets[i] + b, e - b);
      });
}

/// Copies (converting Src -> Dst) src + layout.offsets[i] back into each tensor i.
template <FloatingElement Src, FloatingElement Dst>
void unflatten(const Src* src, std::span<const TensorRef<Dst>> dst, const FlatLayout& layout) {
  detail::check_layout(dst.size(), layout, "kernels::host::unflatten");
  detail::check_fits(dst, layout, "kernels::host::unflatten");
  const simd::Isa isa = simd::active_isa();
  for_each_piece(
      dst.size(), [&](std::size_t i) { return dst[i].numel; },
      [&](std::size_t i, std::size_t b, std::size_t e) {
        detail::convert_range(isa, src + layout.offsets[i] + b, dst[i].data + b, e - b);
      });
}

/// Unpacks a gapless buffer (the inverse of the two-argument flatten).
template <FloatingElement Src, FloatingElement Dst>
void unflatten(const Src* src, std::span<const TensorRef<Dst>> dst) {
  const simd::Isa isa = simd::active_isa();
  std::vector<std::size_t> offsets(dst.size());
  std::size_t at = 0;
  for (std::size_t i = 0; i < dst.size(); ++i) {
    offsets[i] = at;
    at += dst[i].numel;
  }
  for_each_piece(
      dst.size(), [&](std::size_t i) { return dst[i].numel; },
      [&](std::size_t i, std::size_t b, std::size_t e) {
        detail::convert_range(isa, src + offsets[i] + b, dst[i].data + b, e - b);
      });
}

}  // namespace zerotk::kernels::host
