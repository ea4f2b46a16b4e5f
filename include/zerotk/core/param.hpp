#pragma once
/// \file zerotk/core/param.hpp
/// `zerotk::Param<T>`: the plain parameter view. A name, a shape (up to 4 dims) and two pointers that
/// the engine binds into its own storage. It owns nothing.
///
///   zerotk::Param<float> w{"fc1.weight", {out, in}};
///   engine binds it; then w.data()[i], w.grad()[i] are valid for i < w.numel().

#include <array>
#include <cstddef>
#include <initializer_list>
#include <span>
#include <string>

#include "zerotk/core/concepts.hpp"
#include "zerotk/core/error.hpp"

namespace zerotk {

template <FloatingElement T>
class Param {
 public:
  using value_type = T;
  static constexpr std::size_t kMaxRank = 4;

  Param() = default;
  Param(std::string name, std::initializer_list<std::size_t> shape) : name_(std::move(name)) {
    if (shape.size() > kMaxRank) {
      throw usage_error("Param supports at most 4 dimensions", name_, std::to_string(shape.size()) + " dims");
    }
    for (std::size_t d : shape) shape_[rank_++] = d;
  }

  const std::string& name() const noexcept { return name_; }
  std::size_t rank() const noexcept { return rank_; }
  std::size_t dim(std::size_t i) const noexcept { return shape_[i]; }
  std::span<const std::size_t> shape() const noexcept { return {shape_.data(), rank_}; }
  std::size_t numel() const noexcept {
    std::size_t n = 1;
    for (std::size_t i = 0; i < rank_; ++i) n *= shape_[i];
    return n;
  }

  /// Called by the engine: storage of numel() elements for the value and for the gradient.
  void bind(T* data, T* grad) noexcept {
    data_ = data;
    grad_ = grad;
  }
  bool is_bound() const noexcept { return data_ != nullptr; }

  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  T* grad() noexcept { return grad_; }
  const T* grad() const noexcept { return grad_; }
  std::span<T> values() noexcept { return {data_, data_ ? numel() : 0}; }
  std::span<T> grads() noexcept { return {grad_, grad_ ? numel() : 0}; }

 private:
  std::string name_;
  std::array<std::size_t, kMaxRank> shape_{};
  std::size_t rank_ = 0;
  T* data_ = nullptr;
  T* grad_ = nullptr;
};

static_assert(Parameter<Param<float>>);
static_assert(Parameter<Param<half>>);
static_assert(Parameter<Param<bfloat16>>);

}  // namespace zerotk
