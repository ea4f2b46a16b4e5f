// src/engines/make_engine.cpp: make_engine's compiled half (zerotk/any_engine.hpp). Picks the engine
// of the compiled set whose structure fits the config, builds it behind AnyEngine, or says which
// compiled engines come nearest. The set's engine types are declared extern here
// (zerotk/engines.hpp): this file compiles their erasure, not the engines.
#include <algorithm>
#include <array>
#include <cstddef>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "zerotk/erased_engine.hpp"
#include "zerotk/engine_config.hpp"
#include "zerotk/engines.hpp"

namespace zerotk::detail {
namespace {

template <class... Es>
struct EngineList {};

template <class... A, class... B>
EngineList<A..., B...> operator+(EngineList<A...>, EngineList<B...>) {
  return {};
}

template <class L>
struct DropFirst;
template <class First, class... Es>
struct DropFirst<EngineList<First, Es...>> {
  using type = EngineList<Es...>;
};

// One family's engine types: the X-macro list after a placeholder that DropFirst removes (each
// entry expands with a leading comma), or none when the library was built without the family
// (ZEROTK_ENGINES_<FAMILY> is 0 or 1: zerotk/engines.hpp defines the ones not set).
#define ZEROTK_ENGINE_TYPE_(...) , ::zerotk::Engine<__VA_ARGS__>
#define ZEROTK_FAMILY_0_(LIST) EngineList<>
#define ZEROTK_FAMILY_1_(LIST) typename DropFirst<EngineList<void LIST(ZEROTK_ENGINE_TYPE_)>>::type
#define ZEROTK_FAMILY_CAT_(built) ZEROTK_FAMILY_##built##_
#define ZEROTK_FAMILY_(built, LIST) ZEROTK_FAMILY_CAT_(built)(LIST)

using CompiledSet = decltype(ZEROTK_FAMILY_(ZEROTK_ENGINES_ADAMW_FP32, ZEROTK_ENGINES_LIST_ADAMW_FP32){} +
                             ZEROTK_FAMILY_(ZEROTK_ENGINES_ADAMW_BF16, ZEROTK_ENGINES_LIST_ADAMW_BF16){} +
                             ZEROTK_FAMILY_(ZEROTK_ENGINES_ADAMW_FP16, ZEROTK_ENGINES_LIST_ADAMW_FP16){} +
                             ZEROTK_FAMILY_(ZEROTK_ENGINES_OFFLOAD_CPU, ZEROTK_ENGINES_LIST_OFFLOAD_CPU){} +
                             ZEROTK_FAMILY_(ZEROTK_ENGINES_OFFLOAD_NVME, ZEROTK_ENGINES_LIST_OFFLOAD_NVME){} +
                             ZEROTK_FAMILY_(ZEROTK_ENGINES_LION, ZEROTK_ENGINES_LIST_LION){} +
                             ZEROTK_FAMILY_(ZEROTK_ENGINES_ONEBIT, ZEROTK_ENGINES_LIST_ONEBIT){} +
                             ZEROTK_FAMILY_(ZEROTK_ENGINES_COMPRESSION, ZEROTK_ENGINES_LIST_COMPRESSION){});
#undef ZEROTK_FAMILY_
#undef ZEROTK_FAMILY_CAT_
#undef ZEROTK_FAMILY_1_
#undef ZEROTK_FAMILY_0_
#undef ZEROTK_ENGINE_TYPE_

/// How many of the nearest compiled engines a refusal names.
constexpr std::size_t kNearest = 3;

template <class E>
AnyEngine make_one(const config::Config& cfg, engine::ErasedInputs& in, const EngineOptionsEdit& edit) {
  return make_engine_of<E>(cfg, std::move(in), edit);
}

/// The index in the set of the first compiled engine whose structure fits `cfg`; throws the
/// config_error that names the config's combination and the nearest compiled engines when none does.
template <class... Es>
std::size_t fitting(const config::Config& cfg, EngineList<Es...>) {
  constexpr std::size_t n = sizeof...(Es);
  if constexpr (n == 0) {
    throw config_error("the compiled engine set is empty: zerotk::engines was built with ZEROTK_ENGINES empty",
                       "ZEROTK_ENGINES");
  } else {
    const std::array<std::vector<config_error>, n> misfits{config::check_structure<Es>(cfg)...};
    for (std::size_t i = 0; i < n; ++i) {
      if (misfits[i].empty()) return i;
    }
    // None fits: the nearest are those that differ in the fewest choices (ties: the set's order).
    const std::array<std::string, n> names{config::describe<Es>()...};
    std::array<std::size_t, n> order;
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return misfits[a].size() != misfits[b].size() ? misfits[a].size() < misfits[b].size() : a < b;
    });
    std::string msg = "no engine of the compiled set fits this config (" + config::describe(cfg.structure()) +
                      "); the nearest of the " + std::to_string(n) + " compiled:";
    for (std::size_t k = 0; k < std::min(kNearest, n); ++k) {
      const std::size_t i = order[k];
      msg += "\n  " + names[i];
      for (const config_error& e : misfits[i]) msg += "\n    " + e.where() + ": " + e.message();
    }
    msg += "\n(include/zerotk/engines/set.hpp lists the families; build zerotk::engines with the one you need in "
           "ZEROTK_ENGINES, or instantiate a typed zerotk::Engine<...> for another combination)";
    throw config_error(std::move(msg));
  }
}

template <class... Es>
AnyEngine pick(const config::Config& cfg, engine::ErasedInputs& in, const EngineOptionsEdit& edit, EngineList<Es...> set) {
  using Maker = AnyEngine (*)(const config::Config&, engine::ErasedInputs&, const EngineOptionsEdit&);
  constexpr std::array<Maker, sizeof...(Es)> makers{&make_one<Es>...};
  return makers[fitting(cfg, set)](cfg, in, edit);
}

template <class... Es>
std::string describe_fitting(const config::Config& cfg, EngineList<Es...> set) {
  const std::array<std::string, sizeof...(Es)> names{config::describe<Es>()...};
  return names[fitting(cfg, set)];
}

}  // namespace

AnyEngine make_any_engine(const config::Config& cfg, engine::ErasedInputs inputs, const EngineOptionsEdit& edit) {
  return pick(cfg, inputs, edit, CompiledSet{});
}

}  // namespace zerotk::detail

namespace zerotk {
std::string compiled_engine_for(const config::Config& cfg) { return detail::describe_fitting(cfg, detail::CompiledSet{}); }
}  // namespace zerotk
