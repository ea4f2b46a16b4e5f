#pragma once
/// \file zerotk/config/structure.hpp
/// Matching a config against compiled engines. An Engine's structure (stage, precision, loss
/// scaler, optimizer, offload, device) is fixed at compile time by its policies; a DeepSpeed JSON
/// that asks for another structure cannot be served by it. check_structure<E>() says exactly what
/// differs, naming both sides; dispatch<E1, E2, ...>() lets one trainer binary serve several
/// configs by picking the first compiled engine that fits.
///
///   using Small = zerotk::Engine<..., zerotk::Partitioner<zerotk::Stage<2>>, ...>;
///   using Big   = zerotk::Engine<..., zerotk::Partitioner<zerotk::Stage<3>>, ...>;
///   zerotk::config::dispatch<Small, Big>(cfg, [&]<class E>(std::type_identity<E>) { train<E>(cfg); });

#include <array>
#include <concepts>
#include <cstddef>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "zerotk/config/context.hpp"
#include "zerotk/config/diagnostics.hpp"
#include "zerotk/config/options.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/core/macros.hpp"
#include "zerotk/policies.hpp"

namespace zerotk::config {

/// What a type must expose to be matched against a config: the compile-time choices of an
/// Engine. zerotk::Engine provides these; a test or a custom engine can provide them too.
template <class E>
concept EngineStructure = requires {
  { E::kStage } -> std::convertible_to<int>;
  typename E::precision_tag;    // zerotk::fp32 | fp16 | bf16
  typename E::loss_scaler_tag;  // zerotk::Dynamic | Static | None
  typename E::optimizer_tag;    // zerotk::Adam | AdamW | Lamb | OneBitAdam | OneBitLamb
  typename E::offload_tag;      // zerotk::None | Cpu | Nvme
  typename E::device_tag;       // zerotk::Host | Cuda
};

// ---- tags -> option enums ---------------------------------------------------------------------------

template <class T>
constexpr DType precision_of() {
  if constexpr (std::is_same_v<T, fp32>) return DType::fp32;
  else if constexpr (std::is_same_v<T, fp16>) return DType::fp16;
  else if constexpr (std::is_same_v<T, bf16>) return DType::bf16;
  else static_assert(dependent_false<T>, "precision_tag must be zerotk::fp32, zerotk::fp16 or zerotk::bf16");
}

template <class T>
constexpr ScalerKind scaler_of() {
  if constexpr (std::is_same_v<T, Dynamic>) return ScalerKind::dynamic;
  else if constexpr (std::is_same_v<T, Static>) return ScalerKind::static_scale;
  else if constexpr (std::is_same_v<T, None>) return ScalerKind::none;
  else static_assert(dependent_false<T>, "loss_scaler_tag must be zerotk::Dynamic, zerotk::Static or zerotk::None");
}

template <class T>
constexpr OptimizerKind optimizer_of() {
  if constexpr (std::is_same_v<T, Adam>) return OptimizerKind::adam;
  else if constexpr (std::is_same_v<T, AdamW>) return OptimizerKind::adamw;
  else if constexpr (std::is_same_v<T, Lamb>) return OptimizerKind::lamb;
  else if constexpr (std::is_same_v<T, OneBitAdam>) return OptimizerKind::onebit_adam;
  else if constexpr (std::is_same_v<T, OneBitLamb>) return OptimizerKind::onebit_lamb;
  else static_assert(dependent_false<T>, "optimizer_tag must be zerotk::Adam, AdamW, Lamb, OneBitAdam or OneBitLamb");
}

template <class T>
constexpr OffloadDevice offload_of() {
  if constexpr (std::is_same_v<T, None>) return OffloadDevice::none;
  else if constexpr (std::is_same_v<T, Cpu>) return OffloadDevice::cpu;
  else if constexpr (std::is_same_v<T, Nvme>) return OffloadDevice::nvme;
  else static_assert(dependent_false<T>, "offload_tag must be zerotk::None, zerotk::Cpu or zerotk::Nvme");
}

template <class T>
constexpr std::string_view device_name() {
  if constexpr (std::is_same_v<T, Host>) return "Host";
  else if constexpr (std::is_same_v<T, Cuda>) return "Cuda";
  else static_assert(dependent_false<T>, "device_tag must be zerotk::Host or zerotk::Cuda");
}

namespace detail {
constexpr std::string_view precision_policy(DType d) {
  return d == DType::fp16 ? "Precision<fp16>" : d == DType::bf16 ? "Precision<bf16>" : "Precision<fp32>";
}
constexpr std::string_view scaler_policy(ScalerKind k) {
  return k == ScalerKind::dynamic ? "LossScaler<Dynamic>"
         : k == ScalerKind::static_scale ? "LossScaler<Static>" : "LossScaler<None>";
}
constexpr std::string_view offload_policy(OffloadDevice d) {
  return d == OffloadDevice::cpu ? "Offload<Cpu>" : d == OffloadDevice::nvme ? "Offload<Nvme>" : "Offload<None>";
}
inline std::string optimizer_policy(OptimizerKind k) { return cat("Optimizer<", to_string(k), ">"); }
}  // namespace detail

/// The engine's policies in words: "Stage<2>, Precision<fp16>, LossScaler<Dynamic>,
/// Optimizer<AdamW>, Offload<None>, Device<Host>".
template <EngineStructure E>
std::string describe() {
  return detail::cat("Stage<", std::to_string(static_cast<int>(E::kStage)), ">, ",
                     detail::precision_policy(precision_of<typename E::precision_tag>()), ", ",
                     detail::scaler_policy(scaler_of<typename E::loss_scaler_tag>()), ", ",
                     detail::optimizer_policy(optimizer_of<typename E::optimizer_tag>()), ", ",
                     detail::offload_policy(offload_of<typename E::offload_tag>()), ", Device<",
                     device_name<typename E::device_tag>(), ">");
}

/// A config's structure in the same words (no device: a DeepSpeed JSON does not choose one).
inline std::string describe(const Structure& s) {
  std::string r = detail::cat("Stage<", std::to_string(s.stage), ">, ", detail::precision_policy(s.precision), ", ",
                              detail::scaler_policy(s.scaler));
  if (s.optimizer) r += detail::cat(", ", detail::optimizer_policy(*s.optimizer));
  r += ", ";
  // One Offload<> policy serves both blocks; show the device that needs the most.
  r += detail::offload_policy(s.offload_optimizer != OffloadDevice::none ? s.offload_optimizer : s.offload_param);
  return r;
}

/// Every way `cfg` asks for something engine `E` was not compiled with; empty when E fits.
/// Offload: E's Offload<X> serves offload_optimizer.device X, and offload_param.device none or X.
template <EngineStructure E>
std::vector<config_error> check_structure(const Config& cfg) {
  std::vector<config_error> out;
  const Structure s = cfg.structure();
  constexpr int stage = E::kStage;
  constexpr DType precision = precision_of<typename E::precision_tag>();
  constexpr ScalerKind scaler = scaler_of<typename E::loss_scaler_tag>();
  constexpr OptimizerKind optimizer = optimizer_of<typename E::optimizer_tag>();
  constexpr OffloadDevice offload = offload_of<typename E::offload_tag>();

  if (s.stage != stage) {
    out.emplace_back(detail::cat("config asks for ZeRO stage ", std::to_string(s.stage),
                                 ", the engine was compiled with Partitioner<Stage<", std::to_string(stage), ">>"),
                     "/zero_optimization/stage", std::to_string(s.stage));
  }
  if (s.precision != precision) {
    out.emplace_back(detail::cat("config asks for ", to_string(s.precision), " training, the engine was compiled with ",
                                 detail::precision_policy(precision)),
                     s.precision == DType::fp32 ? (precision == DType::fp16 ? "/fp16/enabled" : "/bf16/enabled")
                                                : (s.precision == DType::fp16 ? "/fp16/enabled" : "/bf16/enabled"),
                     s.precision == DType::fp32 ? "false" : "true");
  }
  // The scaler is implied by the precision; report it separately only when the precision agrees.
  if (s.precision == precision && s.scaler != scaler) {
    const bool is_fp16 = s.precision == DType::fp16;
    out.emplace_back(detail::cat("config asks for ", detail::scaler_policy(s.scaler),
                                 is_fp16 ? " (fp16.loss_scale 0 is dynamic, > 0 static)" : "",
                                 ", the engine was compiled with ", detail::scaler_policy(scaler)),
                     is_fp16 ? "/fp16/loss_scale" : "/fp16/enabled",
                     is_fp16 ? detail::num_text(cfg.fp16.static_scale) : std::string("false"));
  }
  if (s.optimizer && *s.optimizer != optimizer) {
    std::string rule = detail::cat("config asks for ", detail::optimizer_policy(*s.optimizer));
    if (*s.optimizer == OptimizerKind::adamw && optimizer == OptimizerKind::adam) {
      rule += " (\"Adam\" means AdamW unless \"adam_w_mode\": false)";
    }
    rule += detail::cat(", the engine was compiled with ", detail::optimizer_policy(optimizer));
    out.emplace_back(std::move(rule), "/optimizer/type", detail::cat("\"", to_string(*s.optimizer), "\""));
  }
  if (s.offload_optimizer != offload) {
    out.emplace_back(detail::cat("config asks for optimizer offload to ", to_string(s.offload_optimizer),
                                 ", the engine was compiled with ", detail::offload_policy(offload)),
                     "/zero_optimization/offload_optimizer/device", detail::cat("\"", to_string(s.offload_optimizer), "\""));
  }
  if (s.offload_param != OffloadDevice::none && s.offload_param != offload) {
    out.emplace_back(detail::cat("config asks for parameter offload to ", to_string(s.offload_param),
                                 ", the engine was compiled with ", detail::offload_policy(offload)),
                     "/zero_optimization/offload_param/device", detail::cat("\"", to_string(s.offload_param), "\""));
  }
  return out;
}

/// `ctx` with the engine's precision filled in, so `fp16.enabled: "auto"` follows the engine.
template <EngineStructure E>
ResolveContext with_engine(ResolveContext ctx) {
  ctx.precision = precision_of<typename E::precision_tag>();
  return ctx;
}

namespace detail {
template <class R, class F, class E0, class... Es>
R call_at(std::size_t index, F& f) {
  if constexpr (sizeof...(Es) == 0) {
    return f(std::type_identity<E0>{});
  } else {
    if (index == 0) return f(std::type_identity<E0>{});
    return call_at<R, F, Es...>(index - 1, f);
  }
}
}  // namespace detail

/// Calls `f(std::type_identity<E>{})` for the first of `Engines` whose structure fits `cfg` and
/// returns its result; `f` must return the same type for every engine. Throws one config_error
/// listing every candidate and why it did not fit when none does.
template <EngineStructure... Engines, class F>
decltype(auto) dispatch(const Config& cfg, F&& f) {
  static_assert(sizeof...(Engines) > 0, "dispatch: give at least one engine type, dispatch<E1, E2, ...>(cfg, f)");
  using R = std::invoke_result_t<F&, std::type_identity<std::tuple_element_t<0, std::tuple<Engines...>>>>;
  static_assert((std::is_same_v<R, std::invoke_result_t<F&, std::type_identity<Engines>>> && ...),
                "dispatch: f must return the same type for every engine");
  const std::array<std::vector<config_error>, sizeof...(Engines)> misfits{check_structure<Engines>(cfg)...};
  for (std::size_t i = 0; i < misfits.size(); ++i) {
    if (misfits[i].empty()) return detail::call_at<R, F&, Engines...>(i, f);
  }
  const std::array<std::string, sizeof...(Engines)> names{describe<Engines>()...};
  std::string msg = detail::cat("no compiled engine fits this config (", describe(cfg.structure()), "):");
  for (std::size_t i = 0; i < misfits.size(); ++i) {
    msg += detail::cat("\n  candidate ", std::to_string(i + 1), ": ", names[i]);
    for (const auto& e : misfits[i]) msg += detail::cat("\n    ", e.where(), ": ", e.message());
  }
  throw config_error(std::move(msg));
}

}  // namespace zerotk::config
