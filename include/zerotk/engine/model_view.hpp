#pragma once
/// \file zerotk/engine/model_view.hpp
/// The user's model and layers as the engine sees them once their types are forgotten: a ModelView
/// (every parameter's name, size, element type and how to bind it; the fetch units; the modules that
/// name a type) and a LayerRef (a layer's address and a way to visit its parameters' addresses).
///
/// They are the one place where the user's Module and Parameter types meet the engine. Everything
/// past them (ParamRegistry, the groups, the boundary) is independent of those types, so an engine
/// compiled once (zerotk/engines.hpp, AnyEngine) serves any model: view_model() and layer_ref() are
/// the only templates a trainer's translation unit instantiates for its model.

#include <concepts>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "zerotk/core/concepts.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/parallel/split.hpp"

namespace zerotk::engine {

/// One parameter of the model, in the order the model visits it.
struct ParamView {
  std::string name;
  const void* address = nullptr;    ///< the Param object: what layers' visits are recognised by
  std::size_t numel = 0;
  std::vector<std::size_t> shape;   ///< the Param's shape() if it has one, else {numel}
  DType value_dtype = DType::fp32;  ///< the Param's element type
  /// How the Param says it is split across the tensor group (its `tensor_split()`,
  /// parallel/split_param.hpp); empty when it says nothing.
  std::optional<parallel::TensorSplit> tensor_split;
  /// The Param says it belongs to an expert (its `expert()` answers true): ZeRO reduces and shards it
  /// over the grid's expert-data group (moe/).
  bool expert = false;
  /// Points the Param at (data, grad), both of its element type.
  std::function<void(void* data, void* grad)> bind;
  /// Copies the values the Param holds into `dst` (numel elements of its type); false, copying
  /// nothing, if its data() is null.
  std::function<bool(void* dst)> read_initial;
};

/// A module of the model (the model itself included) that names its kind (`module_type`), with the
/// addresses of the parameters its parameters() visits.
struct TypedModuleView {
  std::string_view type;
  std::vector<const void*> params;
};

struct ModelView {
  std::vector<ParamView> params;
  /// Stage 3's fetch units: the parameters of each direct sub-module (`modules(visit)`) that has any.
  std::vector<std::vector<const void*>> units;
  /// Every module that names its type, in pre-order (the model, then its sub-modules recursively).
  std::vector<TypedModuleView> typed;
};

template <class M>
concept HasExternalParameters = requires(M& m) { m.external_parameters(zerotk::detail::ParameterVisitorArchetype{}); };

namespace detail {

template <class P>
ParamView view_param(std::string_view name, P& p) {
  using V = typename std::remove_cvref_t<P>::value_type;
  ParamView v;
  v.name = std::string(name);
  v.address = &p;
  v.numel = static_cast<std::size_t>(p.numel());
  if constexpr (requires { p.shape(); }) {
    for (auto d : p.shape()) v.shape.push_back(static_cast<std::size_t>(d));
  } else {
    v.shape = {v.numel};
  }
  v.value_dtype = dtype_of_v<V>;
  if constexpr (requires(const P& cp) { { cp.tensor_split() } -> std::convertible_to<parallel::TensorSplit>; }) {
    v.tensor_split = static_cast<parallel::TensorSplit>(p.tensor_split());
  }
  if constexpr (requires(const P& cp) { { cp.expert() } -> std::convertible_to<bool>; }) {
    v.expert = static_cast<bool>(p.expert());
  }
  v.bind = [&p](void* d, void* g) { p.bind(static_cast<V*>(d), static_cast<V*>(g)); };
  v.read_initial = [&p, n = v.numel](void* dst) {
    const V* values = p.data();
    if (values == nullptr || n == 0) return false;
    const V* end = values + n;
    V* out = static_cast<V*>(dst);
    for (; values != end; ++values, ++out) *out = *values;
    return true;
  };
  return v;
}

template <class M>
void view_typed(M& m, std::vector<TypedModuleView>& out) {
  if constexpr (HasModuleType<M>) {
    TypedModuleView t{std::string_view(M::module_type), {}};
    if constexpr (Module<M>) m.parameters([&](std::string_view, auto& p) { t.params.push_back(&p); });
    out.push_back(std::move(t));
  }
  if constexpr (HasSubmodules<M>) {
    m.modules([&](auto& child) { view_typed(child, out); });
  }
}

}  // namespace detail

/// Visits `model` and records what the engine needs of it. The Params must outlive every use of
/// the view's bind and read_initial (the engine's lifetime).
template <Module M>
ModelView view_model(M& model) {
  ModelView v;
  detail::view_typed(model, v.typed);
  if constexpr (HasSubmodules<M>) {
    model.modules([&](auto& child) {
      if constexpr (Module<std::remove_cvref_t<decltype(child)>>) {
        std::vector<const void*> unit;
        child.parameters([&](std::string_view, auto& p) { unit.push_back(&p); });
        if (!unit.empty()) v.units.push_back(std::move(unit));
      }
    });
  }
  model.parameters([&](std::string_view name, auto& p) { v.params.push_back(detail::view_param(name, p)); });
  return v;
}

/// Receives a layer's parameters from LayerRef::visit: its own first, then its external ones.
class LayerParamSink {
 public:
  virtual void own(const void* param, std::string_view name) = 0;
  virtual void external(const void* param, std::string_view name) = 0;

 protected:
  ~LayerParamSink() = default;
};

/// A layer whose type is forgotten: its address (the key a scope finds it by) and a function that
/// visits its parameters' addresses (parameters(), then external_parameters() if it has them).
struct LayerRef {
  void* layer = nullptr;
  void (*visit)(void* layer, LayerParamSink& sink) = nullptr;
};

template <Module L>
LayerRef layer_ref(L& layer) {
  return LayerRef{&layer, [](void* l, LayerParamSink& sink) {
                    L& typed = *static_cast<L*>(l);
                    typed.parameters([&](std::string_view name, auto& p) { sink.own(&p, name); });
                    if constexpr (HasExternalParameters<L>) {
                      typed.external_parameters([&](std::string_view name, auto& p) { sink.external(&p, name); });
                    }
                  }};
}

}  // namespace zerotk::engine
