#pragma once
/// \file zerotk/core/concepts.hpp
/// The contracts between zerotk and the user's own types. The user's tensors and modules stay the
/// user's: zerotk only asks for the handful of operations below.
///
/// - Parameter: knows its element count and lets the engine bind its storage and its gradient, so the
///   engine can place it inside a flat buffer (ZeRO stages 1/2) or free and re-gather it (stage 3).
/// - Module: visits its parameters with names.
/// - Layer: a Module with forward/backward; Recomputable adds release_activations(), so activation
///   checkpointing (Recompute<L>) can drop what the forward saved and run the forward again.
/// - Communicator: rank and size here; zerotk/comm/communicator.hpp refines it with the collectives.

#include <concepts>
#include <cstddef>
#include <string_view>
#include <type_traits>

#include "zerotk/core/dtype.hpp"

namespace zerotk {

/// A trainable tensor whose storage the engine owns.
/// Rule: `p.numel()` gives the element count; `p.bind(data, grad)` points the parameter at
/// engine-owned storage of `numel()` elements each; `p.data()` and `p.grad()` return the bound pointers.
template <class P>
concept Parameter = requires(P& p, const P& cp, typename std::remove_cvref_t<P>::value_type* ptr) {
  typename std::remove_cvref_t<P>::value_type;
  requires FloatingElement<typename std::remove_cvref_t<P>::value_type>;
  { cp.numel() } -> std::convertible_to<std::size_t>;
  p.bind(ptr, ptr);
  { p.data() } -> std::convertible_to<typename std::remove_cvref_t<P>::value_type*>;
  { p.grad() } -> std::convertible_to<typename std::remove_cvref_t<P>::value_type*>;
};

namespace detail {
/// Stands in for the engine's visitor when checking Module: accepts (name, any Parameter&).
struct ParameterVisitorArchetype {
  template <Parameter P>
  void operator()(std::string_view, P&) const {}
};
}  // namespace detail

/// Something that owns parameters. Rule: `m.parameters(visit)` calls `visit(name, param)` once for
/// every parameter, in the same order every time, where `param` models Parameter.
template <class M>
concept Module = requires(M& m, detail::ParameterVisitorArchetype visit) { m.parameters(visit); };

namespace detail {
/// Stands in for the engine's visitor when checking HasSubmodules: accepts any module.
struct ModuleVisitorArchetype {
  template <class C>
  void operator()(C&) const {}
};
}  // namespace detail

/// Optional on a Module: `static constexpr std::string_view module_type = "LayerNorm";` names its
/// kind, so options can select modules by type (EngineOptions::fp32_module_types).
template <class M>
concept HasModuleType = requires {
  { M::module_type } -> std::convertible_to<std::string_view>;
};

/// Optional on a Module: `m.modules(visit)` calls `visit(child)` for each direct sub-module, so the
/// engine can find sub-modules by type.
template <class M>
concept HasSubmodules = requires(M& m, detail::ModuleVisitorArchetype visit) { m.modules(visit); };

/// A Module with a forward and a backward pass.
/// Rule: `using input_type = ...; using output_type = ...;`, `l.forward(x)` returns the output for an
/// input, and `l.backward(dy)` takes the output's gradient, accumulates parameter gradients into the
/// bound gradient storage and returns the input's gradient.
template <class L>
concept Layer = Module<L> && requires(L& l, const typename L::input_type& x, const typename L::output_type& dy) {
  { l.forward(x) } -> std::convertible_to<typename L::output_type>;
  { l.backward(dy) } -> std::convertible_to<typename L::input_type>;
};

/// A Layer that can drop what its forward saved, so Recompute<L> can run its forward again inside
/// the backward instead of keeping it. Rule: after `l.release_activations()` the layer holds no
/// activation memory; a later forward(x) followed by backward(dy) gives exactly what the first
/// forward(x) and backward(dy) would have given.
template <class L>
concept Recomputable = Layer<L> && requires(L& l) { l.release_activations(); };

/// Optional on a Layer: the bytes of activation memory it holds now, so they can be reported to a
/// ledger (activation/meter.hpp).
template <class L>
concept HasActivationBytes = requires(const L& l) {
  { l.activation_bytes() } -> std::convertible_to<std::size_t>;
};

/// Optional on a stochastic Layer (dropout, ...): its random state, so a recompute draws the same
/// numbers as the forward it repeats. Rule: `l.set_rng_state(s)` with an `s` from `l.rng_state()`
/// makes the following draws those that followed when `s` was taken.
template <class L>
concept HasRngState = requires(L& l) { l.set_rng_state(l.rng_state()); };

/// The part of a communicator that every layer of zerotk may rely on. See
/// zerotk/comm/communicator.hpp for the full concept with the collective operations.
template <class C>
concept RankedGroup = requires(const C& c) {
  { c.rank() } -> std::convertible_to<int>;
  { c.size() } -> std::convertible_to<int>;
};

/// Visits every parameter of `m` in order; a tiny helper that gives readable errors at the call site.
template <Module M, class F>
void for_each_parameter(M& m, F&& f) {
  m.parameters(f);
}

}  // namespace zerotk
