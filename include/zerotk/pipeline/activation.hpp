#pragma once
/// \file zerotk/pipeline/activation.hpp
/// The tensors that travel between pipeline stages: a Shape (dimensions + element type) and an
/// Activation (a Shape and the host bytes behind it), plus the fixed-size header in which a stage
/// announces its output's shape to the next one (pipeline/executor.hpp negotiates shapes once).

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"

namespace zerotk::pipeline {

inline constexpr std::size_t kMaxDims = 7;

struct Shape {
  std::vector<std::int64_t> dims;  ///< at most kMaxDims, each >= 0
  DType dtype = DType::fp32;

  std::size_t numel() const noexcept {
    std::size_t n = 1;
    for (std::int64_t d : dims) n *= static_cast<std::size_t>(d);
    return n;
  }
  std::size_t bytes() const noexcept { return numel() * size_of(dtype); }
  /// "[4, 17] fp32"
  std::string to_string() const {
    std::string s = "[";
    for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
    return s + "] " + std::string(zerotk::to_string(dtype));
  }
  bool operator==(const Shape&) const = default;
};

/// A tensor in host memory. `reset` sets the shape and sizes the bytes (reusing the allocation);
/// `as<T>()` views them as T, which must be the shape's element type.
class Activation {
 public:
  Activation() = default;
  explicit Activation(Shape s) { reset(std::move(s)); }

  const Shape& shape() const noexcept { return shape_; }
  void reset(Shape s) {
    if (s.dims.size() > kMaxDims) {
      throw usage_error("an activation has at most " + std::to_string(kMaxDims) + " dimensions", "pipeline::Activation",
                        s.to_string());
    }
    for (std::int64_t d : s.dims) {
      if (d < 0) throw usage_error("dimensions must be >= 0", "pipeline::Activation", s.to_string());
    }
    shape_ = std::move(s);
    bytes_.resize(shape_.bytes());
  }
  std::span<std::byte> bytes() noexcept { return bytes_; }
  std::span<const std::byte> bytes() const noexcept { return bytes_; }

  template <class T>
  std::span<T> as() {
    check_type(dtype_of_v<T>);
    return {reinterpret_cast<T*>(bytes_.data()), shape_.numel()};
  }
  template <class T>
  std::span<const T> as() const {
    check_type(dtype_of_v<T>);
    return {reinterpret_cast<const T*>(bytes_.data()), shape_.numel()};
  }

 private:
  void check_type(DType want) const {
    if (want != shape_.dtype) {
      throw usage_error("viewed as another element type than its shape's", "pipeline::Activation::as",
                        std::string(zerotk::to_string(want)) + " for " + shape_.to_string());
    }
  }

  Shape shape_;
  std::vector<std::byte> bytes_;
};

/// The shape announcement, as it goes over the wire: [magic, dtype, ndims, dims...], int64 each.
using ShapeHeader = std::array<std::int64_t, 3 + kMaxDims>;
inline constexpr std::int64_t kShapeMagic = 0x7a70697065736831;  // "zpipesh1"

inline ShapeHeader encode(const Shape& s) {
  ShapeHeader h{};
  h[0] = kShapeMagic;
  h[1] = static_cast<std::int64_t>(s.dtype);
  h[2] = static_cast<std::int64_t>(s.dims.size());
  for (std::size_t i = 0; i < s.dims.size(); ++i) h[3 + i] = s.dims[i];
  return h;
}

/// The shape a header announces; a usage_error naming `where` when it is not a header.
inline Shape decode(const ShapeHeader& h, const std::string& where) {
  if (h[0] != kShapeMagic || h[1] < 0 || h[1] > static_cast<std::int64_t>(DType::fp64) || h[2] < 0 ||
      h[2] > static_cast<std::int64_t>(kMaxDims)) {
    throw usage_error("received something that is not a shape announcement (do both ranks run the same schedule and "
                      "reset their shapes together?)",
                      where);
  }
  Shape s;
  s.dtype = static_cast<DType>(h[1]);
  s.dims.assign(h.begin() + 3, h.begin() + 3 + h[2]);
  return s;
}

}  // namespace zerotk::pipeline
