#pragma once
/// \file zerotk/core/eigen.hpp
/// Eigen adapter: a parameter that the user's Eigen code reads as an `Eigen::Map` matrix.
/// Requires Eigen 3.4 (target zerotk::eigen).
///
///   zerotk::EigenParam<float> w{"fc.weight", rows, cols};
///   auto W = w.matrix();  // Eigen::Map<Matrix<float, Dynamic, Dynamic, RowMajor>> over engine storage

#include "zerotk/core/macros.hpp"

#if !ZEROTK_HAS_EIGEN
#error "zerotk/core/eigen.hpp needs Eigen 3.4: link the CMake target zerotk::eigen (it defines ZEROTK_HAS_EIGEN=1), or, in a vendored copy, define ZEROTK_HAS_EIGEN=1 and put Eigen (Debian: libeigen3-dev) on the include path"
#endif

#include <Eigen/Core>
#include <string>

#include "zerotk/core/concepts.hpp"
#include "zerotk/core/error.hpp"

namespace zerotk {

template <class T = float>
class EigenParam {
 public:
  using value_type = T;
  using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Map = Eigen::Map<Matrix, Eigen::Unaligned>;
  using ConstMap = Eigen::Map<const Matrix, Eigen::Unaligned>;

  EigenParam(std::string name, Eigen::Index rows, Eigen::Index cols = 1)
      : name_(std::move(name)), rows_(rows), cols_(cols) {
    if (rows < 0 || cols < 0) throw usage_error("EigenParam shape must be non-negative", name_);
  }

  const std::string& name() const noexcept { return name_; }
  std::size_t numel() const noexcept { return static_cast<std::size_t>(rows_ * cols_); }
  Eigen::Index rows() const noexcept { return rows_; }
  Eigen::Index cols() const noexcept { return cols_; }
  void bind(T* data, T* grad) noexcept {
    data_ = data;
    grad_ = grad;
  }
  T* data() noexcept { return data_; }
  T* grad() noexcept { return grad_; }

  /// The value as a matrix; valid once the engine has bound storage.
  Map matrix() {
    require_bound();
    return Map(data_, rows_, cols_);
  }
  ConstMap matrix() const {
    require_bound();
    return ConstMap(data_, rows_, cols_);
  }
  Map grad_matrix() {
    require_bound();
    return Map(grad_, rows_, cols_);
  }

 private:
  void require_bound() const {
    if (!data_) throw usage_error("EigenParam used before the engine bound its storage", name_);
  }
  std::string name_;
  Eigen::Index rows_, cols_;
  T* data_ = nullptr;
  T* grad_ = nullptr;
};

static_assert(Parameter<EigenParam<float>>);

}  // namespace zerotk
