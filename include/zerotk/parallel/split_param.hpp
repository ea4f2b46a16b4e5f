#pragma once
/// \file zerotk/parallel/split_param.hpp
/// A parameter that says how it is split across the tensor group. The engine reads a parameter's
/// optional `tensor_split()` (engine/model_view.hpp), so the layer that makes the shard declares its
/// layout once, where the shard is made; `EngineOptions::tensor_split` (by name) is then only an
/// override.
///
///   zerotk::parallel::ColumnParallelLinear fc1({.name = "fc1", .in = d, .out = h, .tensor_size = tp});
///   zerotk::parallel::SplitParam<float> w1 = fc1.weight_param();   // "fc1.weight", [h / tp, d], rows()
///   zerotk::parallel::SplitParam<float> b1 = fc1.bias_param();     // "fc1.bias", [h / tp], rows()
///
/// Any Parameter type may declare its split the same way: a member `tensor_split()` returning a
/// TensorSplit (DeclaresTensorSplit).

#include <concepts>
#include <cstddef>
#include <initializer_list>
#include <string>
#include <utility>

#include "zerotk/core/param.hpp"
#include "zerotk/parallel/split.hpp"

namespace zerotk::parallel {

/// A Parameter that declares its own tensor split.
template <class P>
concept DeclaresTensorSplit = requires(const P& p) {
  { p.tensor_split() } -> std::convertible_to<TensorSplit>;
};

/// zerotk::Param<T> (this rank's shard: the shape is the shard's) with the split it was cut by.
template <FloatingElement T>
class SplitParam : public Param<T> {
 public:
  SplitParam() = default;
  SplitParam(std::string name, std::initializer_list<std::size_t> shard_shape, TensorSplit split)
      : Param<T>(std::move(name), shard_shape), split_(split) {}

  TensorSplit tensor_split() const noexcept { return split_; }

 private:
  TensorSplit split_{};
};

static_assert(Parameter<SplitParam<float>>);
static_assert(DeclaresTensorSplit<SplitParam<float>>);
static_assert(!DeclaresTensorSplit<Param<float>>);

}  // namespace zerotk::parallel
