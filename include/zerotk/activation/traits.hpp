#pragma once
/// \file zerotk/activation/traits.hpp
/// ActivationTraits<T>: what Recompute<L> needs of a layer's input and output type when it moves a
/// saved input out of the object that holds it (into the contiguous arena or pinned host memory):
///
///   shape(x)              up to four extents, compared after a recompute and named in errors
///   bytes(x)              the bytes save() writes
///   save(x, dst)          copies x's elements into host memory at dst (bytes(x) bytes)
///   restore(x, shape, src)  gives x that shape and copies the elements back from src
///
/// Two families are covered out of the box: dense matrices with rows(), cols(), data() and
/// resize(rows, cols) over a trivially copyable Scalar (Eigen's Matrix, row- or column-major), and
/// contiguous vectors with data(), size() and resize(n) over a trivially copyable value_type
/// (std::vector). Specialise ActivationTraits for anything else, e.g. a device tensor whose save()
/// and restore() copy between device memory and the host pointer they are given.

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

namespace zerotk::activation {

/// Up to four extents; rank 0 is a scalar or an empty object.
struct Shape {
  std::array<std::int64_t, 4> dims{};
  int rank = 0;
  friend bool operator==(const Shape&, const Shape&) = default;
};

/// "[4096, 64]".
inline std::string to_string(const Shape& s) {
  std::string out = "[";
  for (int i = 0; i < s.rank; ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(s.dims[static_cast<std::size_t>(i)]);
  }
  return out + "]";
}

namespace detail {

template <class T>
concept DenseMatrix = requires(const T& c, T& m) {
  typename T::Scalar;
  requires std::is_trivially_copyable_v<typename T::Scalar>;
  { c.rows() } -> std::convertible_to<std::int64_t>;
  { c.cols() } -> std::convertible_to<std::int64_t>;
  { c.data() } -> std::convertible_to<const typename T::Scalar*>;
  { m.data() } -> std::convertible_to<typename T::Scalar*>;
  m.resize(c.rows(), c.cols());
};

template <class T>
concept ContiguousVector = !DenseMatrix<T> && requires(const T& c, T& m) {
  typename T::value_type;
  requires std::is_trivially_copyable_v<typename T::value_type>;
  { c.size() } -> std::convertible_to<std::size_t>;
  { c.data() } -> std::convertible_to<const typename T::value_type*>;
  { m.data() } -> std::convertible_to<typename T::value_type*>;
  m.resize(c.size());
};

}  // namespace detail

/// Unspecialised: T is not savable until the user specialises it (see the file comment).
template <class T>
struct ActivationTraits {};

template <detail::DenseMatrix T>
struct ActivationTraits<T> {
  using Scalar = typename T::Scalar;
  static Shape shape(const T& x) {
    Shape s;
    s.rank = 2;
    s.dims = {static_cast<std::int64_t>(x.rows()), static_cast<std::int64_t>(x.cols()), 0, 0};
    return s;
  }
  static std::size_t bytes(const T& x) {
    return static_cast<std::size_t>(x.rows()) * static_cast<std::size_t>(x.cols()) * sizeof(Scalar);
  }
  static void save(const T& x, std::byte* dst) {
    if (const std::size_t n = bytes(x)) std::memcpy(dst, x.data(), n);
  }
  static void restore(T& x, const Shape& s, const std::byte* src) {
    x.resize(s.dims[0], s.dims[1]);
    if (const std::size_t n = bytes(x)) std::memcpy(x.data(), src, n);
  }
};

template <detail::ContiguousVector T>
struct ActivationTraits<T> {
  using value_type = typename T::value_type;
  static Shape shape(const T& x) {
    Shape s;
    s.rank = 1;
    s.dims = {static_cast<std::int64_t>(x.size()), 0, 0, 0};
    return s;
  }
  static std::size_t bytes(const T& x) { return x.size() * sizeof(value_type); }
  static void save(const T& x, std::byte* dst) {
    if (const std::size_t n = bytes(x)) std::memcpy(dst, x.data(), n);
  }
  static void restore(T& x, const Shape& s, const std::byte* src) {
    x.resize(static_cast<std::size_t>(s.dims[0]));
    if (const std::size_t n = bytes(x)) std::memcpy(x.data(), src, n);
  }
};

/// T has working ActivationTraits.
template <class T>
concept Savable = requires(const T& c, T& m, const Shape& s, std::byte* dst, const std::byte* src) {
  { ActivationTraits<T>::shape(c) } -> std::same_as<Shape>;
  { ActivationTraits<T>::bytes(c) } -> std::convertible_to<std::size_t>;
  ActivationTraits<T>::save(c, dst);
  ActivationTraits<T>::restore(m, s, src);
};

}  // namespace zerotk::activation
