#pragma once
/// \file zerotk/config/structure.hpp
/// Matching a config against compiled engines. An Engine's structure (stage, precision, loss
/// scaler, optimizer, offload, gradient compression, device) is fixed at compile time by its policies; a DeepSpeed JSON
/// that asks for another structure cannot be served by it. check_structure<E>() says exactly what
/// differs, naming both sides; dispatch<E1, E2, ...>() lets one trainer binary serve several
/// configs by picking the first compiled engine that fits.
///
///   using Small = zerotk::Engine<..., zerotk::Partitioner<zerotk::Stage<2>>, ...>;
///   using Big   = zerotk::Engine<..., zerotk::Partitioner<zerotk::Stage<3>>, ...>;
///   zerotk::config::dispatch<Small, Big>(cfg, [&]<class E>(std::type_identity<E>) { train<E>(cfg); });

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "zerotk/config/context.hpp"
#include "zerotk/config/diagnostics.hpp"
#include "zerotk/config/engine_options.hpp"
#include "zerotk/config/options.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/core/macros.hpp"
#include "zerotk/engine/checks.hpp"
#include "zerotk/engine/compat.hpp"
#include "zerotk/policies.hpp"

namespace zerotk::config {

/// What a type must expose to be matched against a config: the compile-time choices of an
/// Engine. zerotk::Engine provides these; a test or a custom engine can provide them too.
template <class E>
concept EngineStructure = requires {
  { E::kStage } -> std::convertible_to<int>;
  typename E::precision_tag;    // zerotk::fp32 | fp16 | bf16
  typename E::loss_scaler_tag;  // zerotk::Dynamic | Static | None
  typename E::optimizer_tag;    // zerotk::Adam | AdamW | Lamb | OneBitAdam | OneBitLamb | ZeroOneAdam
  typename E::offload_tag;      // zerotk::None | Cpu | Nvme (offload_optimizer)
  typename E::device_tag;       // zerotk::Host | Cuda
  // optional: typename E::param_offload_tag (offload_param; None when absent)
  // optional: typename E::compression_tag (gradient_compression.algorithm; None when absent)
};

namespace detail {
template <class E>
struct param_offload_tag_of {
  using type = None;
};
template <class E>
  requires requires { typename E::param_offload_tag; }
struct param_offload_tag_of<E> {
  using type = typename E::param_offload_tag;
};
template <class E>
struct compression_tag_of {
  using type = None;
};
template <class E>
  requires requires { typename E::compression_tag; }
struct compression_tag_of<E> {
  using type = typename E::compression_tag;
};
}  // namespace detail
/// The engine's OffloadParams tag (offload_param.device), None for a structure that has none.
template <class E>
using param_offload_tag_t = typename detail::param_offload_tag_of<E>::type;
/// The engine's GradientCompression tag (gradient_compression.algorithm), None for a structure that has none.
template <class E>
using compression_tag_t = typename detail::compression_tag_of<E>::type;

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

/// The kind of an optimizer tag (its index in zerotk::optimizer_tags).
template <class T>
constexpr OptimizerKind optimizer_of() {
  return OptimizerKind::of<T>();
}

template <class T>
constexpr OffloadDevice offload_of() {
  if constexpr (std::is_same_v<T, None>) return OffloadDevice::none;
  else if constexpr (std::is_same_v<T, Cpu>) return OffloadDevice::cpu;
  else if constexpr (std::is_same_v<T, Nvme>) return OffloadDevice::nvme;
  else static_assert(dependent_false<T>, "offload_tag must be zerotk::None, zerotk::Cpu or zerotk::Nvme");
}

/// GradientCompression<None|TopK|TwoBit|Sign> as the config's algorithm (empty: None).
template <class T>
constexpr std::optional<CompressionAlgorithm> compression_of() {
  if constexpr (std::is_same_v<T, None>) return std::nullopt;
  else if constexpr (std::is_same_v<T, TopK>) return CompressionAlgorithm::topk;
  else if constexpr (std::is_same_v<T, TwoBit>) return CompressionAlgorithm::two_bit;
  else if constexpr (std::is_same_v<T, Sign>) return CompressionAlgorithm::one_bit;
  else static_assert(dependent_false<T>, "compression_tag must be zerotk::None, TopK, TwoBit or Sign");
}

template <class T>
constexpr std::string_view device_name() {
  if constexpr (std::is_same_v<T, Host>) return "Host";
  else if constexpr (std::is_same_v<T, Cuda>) return "Cuda";
  else if constexpr (std::is_same_v<T, HostAsync>) return "HostAsync";
  else static_assert(dependent_false<T>, "device_tag must be zerotk::Host, zerotk::Cuda or zerotk::HostAsync");
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
constexpr std::string_view param_offload_policy(OffloadDevice d) {
  return d == OffloadDevice::cpu ? "OffloadParams<Cpu>" : d == OffloadDevice::nvme ? "OffloadParams<Nvme>" : "OffloadParams<None>";
}
inline std::string optimizer_policy(OptimizerKind k) { return cat("Optimizer<", to_string(k), ">"); }
constexpr std::string_view compression_policy(std::optional<CompressionAlgorithm> a) {
  if (!a) return "GradientCompression<None>";
  switch (*a) {
    case CompressionAlgorithm::topk: return "GradientCompression<TopK>";
    case CompressionAlgorithm::two_bit: return "GradientCompression<TwoBit>";
    case CompressionAlgorithm::one_bit: return "GradientCompression<Sign>";
  }
  return "GradientCompression<?>";
}
/// ", Sparsity<NofM<N,M>>" for an engine with N:M sparsity; empty otherwise (and for a structure
/// that names no sparsity tag).
template <class E>
std::string sparsity_policy() {
  if constexpr (requires { typename E::sparsity_tag; }) {
    if constexpr (!std::is_same_v<typename E::sparsity_tag, None>) return cat(", Sparsity<", E::sparsity_tag::name, ">");
  }
  return {};
}
}  // namespace detail

/// The engine's policies in words: "Stage<2>, Precision<fp16>, LossScaler<Dynamic>,
/// Optimizer<AdamW>, Offload<None>, Device<Host>" (", OffloadParams<Cpu>" after Offload<> when
/// the parameters are offloaded, ", GradientCompression<TopK>" before Device<> when gradients are
/// compressed, ", Sparsity<NofM<2,4>>" before Device<> with N:M sparsity).
template <EngineStructure E>
std::string describe() {
  constexpr OffloadDevice params = offload_of<param_offload_tag_t<E>>();
  constexpr std::optional<CompressionAlgorithm> compression = compression_of<compression_tag_t<E>>();
  return detail::cat("Stage<", std::to_string(static_cast<int>(E::kStage)), ">, ",
                     detail::precision_policy(precision_of<typename E::precision_tag>()), ", ",
                     detail::scaler_policy(scaler_of<typename E::loss_scaler_tag>()), ", ",
                     detail::optimizer_policy(optimizer_of<typename E::optimizer_tag>()), ", ",
                     detail::offload_policy(offload_of<typename E::offload_tag>()),
                     params != OffloadDevice::none ? detail::cat(", ", detail::param_offload_policy(params)) : std::string(),
                     compression ? detail::cat(", ", detail::compression_policy(compression)) : std::string(),
                     detail::sparsity_policy<E>(), ", Device<", device_name<typename E::device_tag>(), ">");
}

/// A config's structure in the same words (no device: a DeepSpeed JSON does not choose one).
inline std::string describe(const Structure& s) {
  std::string r = detail::cat("Stage<", std::to_string(s.stage), ">, ", detail::precision_policy(s.precision), ", ",
                              detail::scaler_policy(s.scaler));
  if (s.optimizer) r += detail::cat(", ", detail::optimizer_policy(*s.optimizer));
  r += detail::cat(", ", detail::offload_policy(s.offload_optimizer));
  if (s.offload_param != OffloadDevice::none) r += detail::cat(", ", detail::param_offload_policy(s.offload_param));
  if (s.compression) r += detail::cat(", ", detail::compression_policy(s.compression));
  return r;
}

/// Every way `cfg` asks for something engine `E` was not compiled with; empty when E fits.
/// Offload: E's Offload<X> serves offload_optimizer.device X, its OffloadParams<Y> (None when E
/// has none) offload_param.device Y (the reader drops offload_param below stage 3, as DeepSpeed
/// ignores it there). Compression: E's GradientCompression<T> (None when E has none) serves
/// gradient_compression.algorithm "topk" (TopK), "2bit" (TwoBit), "1bit" (Sign) or no algorithm (None).
template <EngineStructure E>
std::vector<config_error> check_structure(const Config& cfg) {
  std::vector<config_error> out;
  const Structure s = cfg.structure();
  constexpr int stage = E::kStage;
  constexpr DType precision = precision_of<typename E::precision_tag>();
  constexpr ScalerKind scaler = scaler_of<typename E::loss_scaler_tag>();
  constexpr OptimizerKind optimizer = optimizer_of<typename E::optimizer_tag>();
  constexpr OffloadDevice offload = offload_of<typename E::offload_tag>();
  constexpr OffloadDevice param_offload = offload_of<param_offload_tag_t<E>>();
  constexpr std::optional<CompressionAlgorithm> compression = compression_of<compression_tag_t<E>>();

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
  if (s.offload_param != param_offload) {
    out.emplace_back(detail::cat("config asks for parameter offload to ", to_string(s.offload_param),
                                 ", the engine was compiled with ", detail::param_offload_policy(param_offload)),
                     "/zero_optimization/offload_param/device", detail::cat("\"", to_string(s.offload_param), "\""));
  }
  if (s.compression != compression) {
    if (s.compression) {
      out.emplace_back(detail::cat("gradient_compression.algorithm \"", to_string(*s.compression), "\" needs ",
                                   detail::compression_policy(s.compression), ", the engine was compiled with ",
                                   detail::compression_policy(compression)),
                       "/gradient_compression/algorithm", detail::cat("\"", to_string(*s.compression), "\""));
    } else {
      out.emplace_back(detail::cat("config asks for no gradient compression (no gradient_compression.algorithm), the "
                                   "engine was compiled with ",
                                   detail::compression_policy(compression), " (\"algorithm\": \"",
                                   to_string(*compression), "\")"),
                       "/gradient_compression/algorithm");
    }
  }
  return out;
}

// ---- what this version of zerotk can build and act on ------------------------------------------------
//
// Updated as features land (DESIGN.md): what no engine of this version can be built with (an error
// naming what is missing: engine/compat.hpp's table of policy combinations, then kUnbuildable), and
// settings the reader accepts that the engine does not act on (a note saying why;
// ResolveContext::strict makes it an error). Every other key is honoured.

namespace detail {
using Ask = std::optional<std::pair<std::string, std::string>>;
inline Ask ask(std::string path, std::string value) { return std::pair{std::move(path), std::move(value)}; }
inline std::string quoted(std::string_view s) { return cat("\"", s, "\""); }
}  // namespace detail

/// The policies a config asks for, as the compatibility table's Combination (engine/compat.hpp):
/// the stage, the optimizer's traits (its tag's), where the offload blocks put things, compression.
/// A config chooses no device: the host's rules apply.
inline engine::Combination combination_of(const Config& c) {
  const Structure s = c.structure();
  auto place = [](OffloadDevice d) {
    return d == OffloadDevice::cpu ? engine::Place::cpu : d == OffloadDevice::nvme ? engine::Place::nvme : engine::Place::none;
  };
  engine::Combination k;
  k.stage = s.stage;
  k.reduce_at_boundary = s.stage < 2;
  k.one_bit = s.optimizer && s.optimizer->one_bit();
  k.whole_partition = s.optimizer && s.optimizer->whole_partition();
  k.offload = place(s.offload_optimizer);
  k.param_offload = place(s.offload_param);
  k.compression = s.compression.has_value();
  return k;
}

/// Something a config asks for that no engine of this version can act on, besides the policy
/// combinations of engine/compat.hpp's table.
struct Unbuildable {
  /// The JSON path that asks for it and its value, when `cfg` asks; nullopt otherwise.
  std::optional<std::pair<std::string, std::string>> (*asks)(const Config& cfg);
  /// What is missing, in words and policies.
  std::string_view missing;
};

/// Settings no engine of this zerotk version acts on (the combinations of policies no engine can be
/// built from are engine/compat.hpp's table, which check_buildable reads too).
inline constexpr Unbuildable kUnbuildable[] = {
    {[](const Config& c) -> detail::Ask {
       if (!c.prescale_gradients) return std::nullopt;
       return detail::ask("/prescale_gradients", "true");
     },
     "scaling gradients before the reduction; the engine averages them in the reduction"},
    {[](const Config& c) -> detail::Ask {
       if (c.gradient_predivide_factor == 1.0) return std::nullopt;
       return detail::ask("/gradient_predivide_factor", detail::num_text(c.gradient_predivide_factor));
     },
     "dividing gradients before the reduction; the engine averages them in the reduction"},
    {[](const Config& c) -> detail::Ask {
       if (!c.communication_data_type || *c.communication_data_type == c.precision()) return std::nullopt;
       return detail::ask("/communication_data_type", detail::quoted(to_string(*c.communication_data_type)));
     },
     "reducing gradients in another precision; the engine reduces them in the training precision"},
};

/// `e` with an engine-style key (`data_types.grad_accum_dtype`) as the config's JSON pointer
/// (`/data_types/grad_accum_dtype`); a path already a pointer, or not a key, stays as it is.
inline config_error at_json_pointer(const config_error& e) {
  std::string where = e.where();
  if (!where.empty() && where.front() != '/' && where.find(' ') == std::string::npos) {
    std::replace(where.begin(), where.end(), '.', '/');
    where.insert(0, "/");
  }
  return config_error(e.message(), std::move(where), e.value());
}

namespace detail {
/// The engine checker's rows (engine/checks.hpp: kRunRules) over the engine `cfg` asks for, on the
/// grid it asks for. What a config cannot choose is given every value an engine could have: below
/// stage 2 a Partitioner may reduce at the boundary or every micro-step, so a row counts only when
/// it fails with both. A config chooses no device: the host's facts.
inline void add_run_rule_problems(const Config& cfg, const engine::Combination& k, std::vector<config_error>& out) {
  const EngineOptions o = engine_options_of(cfg);
  std::vector<engine::EngineFacts> facts{engine::facts_of(k, cfg.precision())};
  if (k.stage < 2) {
    engine::Combination other = k;
    other.reduce_at_boundary = !k.reduce_at_boundary;
    facts.push_back(engine::facts_of(other, cfg.precision()));
  }
  engine::GridPlace place;
  place.tensor_size = cfg.tensor_parallel_size;
  place.pipeline_size = cfg.pipeline.stages;
  place.expert_size = cfg.expert_parallel_size;
  for (const engine::RunRule& r : engine::kRunRules) {
    std::optional<config_error> first;
    bool every = true;
    for (const engine::EngineFacts& f : facts) {
      auto p = r.check(o, f, place);
      if (!p) every = false;
      else if (!first) first = std::move(p);
    }
    if (every && first) out.push_back(at_json_pointer(*first));
  }
}
}  // namespace detail

/// Every way `cfg` asks for something no engine of this zerotk version can be built with: each rule
/// of engine/compat.hpp's table that the config's policies break (at the key the rule blames), each
/// row of the engine's run-time checker (engine/checks.hpp: kRunRules) that every engine `cfg` could
/// name breaks, then kUnbuildable; each names what is missing or the value that cannot be. Empty when
/// some engine can run `cfg`.
inline std::vector<config_error> check_buildable(const Config& cfg) {
  std::vector<config_error> out;
  const engine::Combination k = combination_of(cfg);
  for (const engine::CompatRule& r : engine::kCompatRules) {
    if (r.blame == engine::Blame::engine_only || r.holds(k)) continue;
    const bool on_type = r.blame == engine::Blame::optimizer_type && cfg.optimizer;
    out.emplace_back(detail::cat("zerotk cannot build this yet: ", r.config_words),
                     on_type ? "/optimizer/type" : "/zero_optimization/stage",
                     on_type ? detail::quoted(to_string(cfg.optimizer->kind)) : std::to_string(cfg.zero_optimization.stage));
  }
  detail::add_run_rule_problems(cfg, k, out);
  for (const Unbuildable& u : kUnbuildable) {
    if (auto a = u.asks(cfg)) out.emplace_back(detail::cat("zerotk cannot build this yet: ", u.missing), a->first, a->second);
  }
  return out;
}

/// A setting the reader accepts that the engine does not act on.
struct IgnoredSetting {
  std::string_view path;
  /// The value as text when `cfg` sets it so that DeepSpeed would act differently from zerotk;
  /// nullopt otherwise (a default value, or a stage where DeepSpeed ignores it too).
  std::optional<std::string> (*set)(const Config& cfg);
  std::string_view why;
};

inline constexpr IgnoredSetting kIgnoredSettings[] = {
    {"/zero_optimization/offload_param/pin_memory",
     [](const Config& c) -> std::optional<std::string> {
       const auto& p = c.zero_optimization.offload_param;
       if (p.device != OffloadDevice::cpu || p.pin_memory) return std::nullopt;
       return "false";
     },
     "has no effect in zerotk: offloaded parameter shards are always page-locked (OffloadParams<Cpu>); pageable "
     "host memory on Device<Host> would be the compute space itself; ignored"},
    {"/zero_optimization/contiguous_gradients",
     [](const Config& c) -> std::optional<std::string> {
       if (c.zero_optimization.contiguous_gradients || c.zero_optimization.stage == 0) return std::nullopt;
       return "false";
     },
     "has no effect in zerotk: gradients are always copied into contiguous buckets; ignored"},
    {"/zero_optimization/reduce_scatter",
     [](const Config& c) -> std::optional<std::string> {
       if (c.zero_optimization.reduce_scatter || c.zero_optimization.stage == 0) return std::nullopt;
       return "false";
     },
     "has no effect in zerotk: stages 1 and 2 always reduce-scatter gradients; ignored"},
    {"/zero_optimization/allgather_partitions",
     [](const Config& c) -> std::optional<std::string> {
       if (c.zero_optimization.allgather_partitions || c.zero_optimization.stage == 0) return std::nullopt;
       return "false";
     },
     "has no effect in zerotk: stages 1 and 2 always all-gather the updated partitions; ignored"},
    {"/zero_optimization/allgather_bucket_size",
     [](const Config& c) -> std::optional<std::string> {
       if (c.zero_optimization.allgather_bucket_size == ZeroOptions{}.allgather_bucket_size ||
           c.zero_optimization.stage == 0) {
         return std::nullopt;
       }
       return std::to_string(c.zero_optimization.allgather_bucket_size);
     },
     "has no effect in zerotk: updated parameters are all-gathered in the buckets of reduce_bucket_size; ignored"},
    {"/zero_optimization/round_robin_gradients",
     [](const Config& c) -> std::optional<std::string> {
       if (!c.zero_optimization.round_robin_gradients) return std::nullopt;
       return "true";
     },
     "has no effect in zerotk: it spreads gradient copies to CPU offload, which zerotk has not built yet; ignored"},
    {"/zero_optimization/load_from_fp32_weights",
     [](const Config& c) -> std::optional<std::string> {
       if (c.zero_optimization.load_from_fp32_weights || c.zero_optimization.stage == 0) return std::nullopt;
       return "false";
     },
     "has no effect in zerotk: it applies to loading checkpoints, which zerotk has not built yet; ignored"},
    {"/scheduler/params/last_batch_iteration",
     [](const Config& c) -> std::optional<std::string> {
       if (!c.scheduler) return std::nullopt;
       const std::int64_t it = c.scheduler->last_batch_iteration;
       if (it == -1) return std::nullopt;
       return std::to_string(it);
     },
     "has no effect in zerotk: schedules start at iteration -1 (resuming needs checkpoints, which zerotk has not "
     "built yet); ignored"},
};

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
