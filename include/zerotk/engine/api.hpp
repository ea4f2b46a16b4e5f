#pragma once
/// \file zerotk/engine/api.hpp
/// The engine's face: what its clients (a trainer, checkpoint/, pipeline/, interop/, monitor/) use
/// of an engine, as the concept TrainingEngine. Two types model it: Engine<Policies...> (typed,
/// zerotk/engine.hpp) and AnyEngine (type-erased, zerotk/any_engine.hpp). Code written against the
/// concept works with both, and a client that takes a TrainingEngine compiles without the engine's
/// parts: this header includes only the value types the face hands out.
///
///   template <zerotk::TrainingEngine E>
///   void train_one(E& engine, Model& model) {
///     for (auto& l : model.layers) { auto s = engine.forward(l);  ... }
///     for (auto& l : reversed)     { auto s = engine.backward(l); ... }
///     zerotk::StepReport r = engine.step(loss);
///   }
///
/// check_training_engine_v<E> asserts the members one by one, so a type that lacks one fails with a
/// first error line naming it ("TrainingEngine: missing step(double loss) ...",
/// tests/compile_fail/concept_training_engine.cpp).

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "zerotk/core/dtype.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/engine/model_view.hpp"
#include "zerotk/engine/options.hpp"
#include "zerotk/engine/placement.hpp"
#include "zerotk/engine/report.hpp"
#include "zerotk/engine/shards.hpp"
#include "zerotk/engine/state.hpp"

namespace zerotk {

namespace engine {
/// AnyEngine's model of a typed engine (zerotk/any_engine.hpp); an Engine befriends it.
template <class E>
class ErasedEngineOf;
}  // namespace engine

/// What a trainer and the engine's other clients call. Scopes: forward/backward/gather of a layer
/// (a LayerRef here; both models also take the user's layer by reference). Training: loss_scale,
/// step, synchronize, settle, at_boundary. What it is: stage, storage_dtype, optimizer_name, the
/// grid place, rank and size of the data group, options. State: state, scalar_state, load_state,
/// the shard table and the parameter bookkeeping checkpoints compare.
template <class E>
concept TrainingEngine = requires(E& e, const E& ce, const engine::LayerRef& layer, const EngineState& s) {
  e.forward(layer);
  e.backward(layer);
  e.gather(layer);
  { ce.loss_scale() } -> std::convertible_to<double>;
  { e.step(0.0) } -> std::same_as<StepReport>;
  e.synchronize();
  e.settle();
  { ce.at_boundary() } -> std::convertible_to<bool>;
  { ce.stage() } -> std::convertible_to<int>;
  { ce.storage_dtype() } -> std::same_as<DType>;
  { ce.optimizer_name() } -> std::convertible_to<std::string_view>;
  { ce.rank() } -> std::convertible_to<int>;
  { ce.world_size() } -> std::convertible_to<int>;
  { ce.grid_place() } -> std::convertible_to<const engine::GridPlace&>;
  { ce.options() } -> std::convertible_to<const EngineOptions&>;
  { ce.memory() } -> std::convertible_to<const MemoryLedger&>;
  { ce.state() } -> std::same_as<EngineState>;
  { ce.scalar_state() } -> std::same_as<EngineState>;
  e.load_state(s);
  { ce.shard_table() } -> std::same_as<engine::ShardTable>;
  { ce.parameter_count() } -> std::convertible_to<std::size_t>;
  { ce.flat_numel() } -> std::convertible_to<std::size_t>;
  { ce.stored_dtypes() } -> std::same_as<std::vector<DType>>;
  { ce.global_steps() } -> std::convertible_to<std::int64_t>;
};

/// TrainingEngine, member by member, each failure in words.
template <class E>
consteval bool check_training_engine() {
  static_assert(requires(E& e, const engine::LayerRef& l) { e.forward(l); e.backward(l); e.gather(l); },
                "TrainingEngine: missing forward / backward / gather(const engine::LayerRef&) (the layer scopes)");
  static_assert(requires(const E& e) { e.loss_scale(); }, "TrainingEngine: missing loss_scale() const");
  static_assert(requires(E& e) { e.step(0.0); }, "TrainingEngine: missing step(double loss) returning a StepReport");
  static_assert(requires(E& e) { e.synchronize(); e.settle(); }, "TrainingEngine: missing synchronize() or settle()");
  static_assert(requires(const E& e) { e.at_boundary(); }, "TrainingEngine: missing at_boundary() const");
  static_assert(requires(const E& e) { e.stage(); e.storage_dtype(); e.optimizer_name(); },
                "TrainingEngine: missing stage(), storage_dtype() or optimizer_name() const (what it is, at run time)");
  static_assert(requires(const E& e) { e.rank(); e.world_size(); e.grid_place(); },
                "TrainingEngine: missing rank(), world_size() or grid_place() const (where it runs)");
  static_assert(requires(const E& e) { e.options(); e.memory(); }, "TrainingEngine: missing options() or memory() const");
  static_assert(requires(E& e, const E& c, const EngineState& s) { c.state(); c.scalar_state(); e.load_state(s); },
                "TrainingEngine: missing state(), scalar_state() const or load_state(const EngineState&)");
  static_assert(requires(const E& e) { e.shard_table(); e.parameter_count(); e.flat_numel(); e.stored_dtypes(); e.global_steps(); },
                "TrainingEngine: missing shard_table(), parameter_count(), flat_numel(), stored_dtypes() or global_steps() const");
  static_assert(TrainingEngine<E>, "TrainingEngine: a member has the wrong signature (see engine/api.hpp)");
  return true;
}
template <class E>
inline constexpr bool check_training_engine_v = check_training_engine<E>();

}  // namespace zerotk
