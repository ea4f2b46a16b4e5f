#pragma once
/// \file zerotk/engine/compat.hpp
/// Which policy combinations an engine can be built from: ONE table of rules, written once below
/// (ZEROTK_COMPAT_RULES), read by the compile-time checks of Engine<...> (each rule a static_assert
/// whose message is the rule in words, so the first error line says what to change) and by the
/// config validator (config/structure.hpp: check_buildable, which names the JSON key and value a
/// config asks for). A rule that a feature lifts is deleted here when the feature lands; nothing
/// else in the engine or the config layer checks policies against each other.
///
/// The rules are written over a Combination: the policies as plain values (the stage, the
/// optimizer's traits from its tag, where the state and the shards live, compression, device).

#include <cstdint>
#include <string_view>
#include <type_traits>

#include "zerotk/policies.hpp"

namespace zerotk::engine {

/// Where an Offload / OffloadParams tag puts things.
enum class Place : std::uint8_t { none, cpu, nvme };

template <class Tag>
constexpr Place place_of() {
  if constexpr (std::is_same_v<Tag, Cpu>) return Place::cpu;
  else if constexpr (std::is_same_v<Tag, Nvme>) return Place::nvme;
  else return Place::none;
}

/// Whether a Device policy's buffers are a device's (Device<Cuda>, Device<HostAsync>): its
/// `on_device`, or, for a Device specialisation of the user's that predates it, its `is_cuda`.
template <class Device>
constexpr bool on_device_v() {
  if constexpr (requires { Device::on_device; }) {
    return Device::on_device;
  } else {
    return Device::is_cuda;
  }
}

/// A combination of policies as values.
struct Combination {
  int stage = 0;
  bool reduce_at_boundary = true;      ///< when::at_boundary (else every_micro_step)
  bool one_bit = false;                ///< a 1-bit optimizer: compressed exchanges of its own
  bool whole_partition = false;        ///< the step needs the whole partition at once (LAMB's per-tensor norms)
  Place offload = Place::none;         ///< Offload<...>: the optimizer state
  Place param_offload = Place::none;   ///< OffloadParams<...>: stage 3's parameter shards
  bool compression = false;            ///< GradientCompression<TopK|TwoBit|Sign>
  bool on_device = false;              ///< Device<Cuda> or Device<HostAsync>: a device's memory
  bool sparsity = false;               ///< Sparsity<NofM<N, M>>
  friend constexpr bool operator==(const Combination&, const Combination&) = default;
};

/// What a config validator blames when a rule fails: the key whose value it names.
enum class Blame : std::uint8_t { engine_only, optimizer_type, stage };

// The table. RULE(name, blame, holds, engine words, config words): `holds` is an expression over
// `c` (a Combination) that is true when the combination is fine; the engine words are the
// static_assert's message (policies); the config words say the same in DeepSpeed's terms, after
// "zerotk cannot build this yet: " (empty with Blame::engine_only: a config cannot ask for it, or
// the reader already refuses it as DeepSpeed does).
#define ZEROTK_COMPAT_RULES(RULE)                                                                                     \
  RULE(cpu_offload_needs_partitions, Blame::engine_only, c.offload != Place::cpu || c.stage >= 1,                    \
       "Engine: Offload<Cpu> (offload_optimizer) needs a partitioned optimizer state: use Partitioner<Stage<1>>, "   \
       "<2> or <3> (DeepSpeed: ZeRO stage >= 1)",                                                                    \
       "")                                                                                                           \
  RULE(nvme_offload_needs_partitions, Blame::engine_only, c.offload != Place::nvme || c.stage >= 1,                  \
       "Engine: Offload<Nvme> (offload_optimizer) needs a partitioned optimizer state: use Partitioner<Stage<1>>, "  \
       "<2> or <3> (DeepSpeed: ZeRO stage >= 1)",                                                                    \
       "")                                                                                                           \
  RULE(sub_group_steps_need_elementwise, Blame::optimizer_type,                                                      \
       (c.offload == Place::none && c.param_offload != Place::nvme) || !c.whole_partition,                           \
       "Engine: Offload<Cpu>, Offload<Nvme> and OffloadParams<Nvme> step the optimizer sub-group by sub-group and "  \
       "support optimizers that step each element alone (Optimizer<Adam>, <AdamW>, ...); Optimizer<Lamb> needs the " \
       "whole partition's per-tensor norms at once (use Offload<None> with OffloadParams<None> or OffloadParams<Cpu>)", \
       "Lamb with optimizer offload or NVMe parameter offload; Offload<Cpu>, Offload<Nvme> and OffloadParams<Nvme> " \
       "step the optimizer sub-group by sub-group and run optimizers that step each element alone (Adam, AdamW, "    \
       "...); LAMB needs the whole partition's per-tensor norms at once")                                            \
  RULE(param_offload_needs_stage3, Blame::engine_only, c.param_offload == Place::none || c.stage == 3,               \
       "Engine: OffloadParams<Cpu> and OffloadParams<Nvme> (offload_param) offload the parameter shards of "         \
       "Partitioner<Stage<3>>; stages 0-2 keep every parameter in the compute space (DeepSpeed ignores "             \
       "offload_param there too)",                                                                                   \
       "")                                                                                                           \
  RULE(param_offload_device_steps_on_host, Blame::engine_only,                                                        \
       c.param_offload == Place::none || !c.on_device || c.offload != Place::none,                                   \
       "Engine: OffloadParams<Cpu> and OffloadParams<Nvme> with Device<Cuda> or Device<HostAsync> need Offload<Cpu> " \
       "or Offload<Nvme>: the parameter shard lives on the host, so the optimizer step that writes it runs there "   \
       "too (Offload<None> steps on the device)",                                                                    \
       "")                                                                                                           \
  RULE(one_bit_needs_stage0, Blame::stage, !c.one_bit || c.stage == 0,                                               \
       "Engine: Optimizer<OneBitAdam>, Optimizer<ZeroOneAdam> and Optimizer<OneBitLamb> compress what every rank "   \
       "holds in full (momentum, gradient, accumulated update) in place of stage 0's gradient all-reduce; use "      \
       "Partitioner<Stage<0>> (DeepSpeed asserts ZeRO stage 0 for all three too)",                                   \
       "OneBitAdam, ZeroOneAdam or OneBitLamb with ZeRO stage 1, 2 or 3; the 1-bit optimizers all-reduce (1-bit) "   \
       "what every rank holds in full (momentum, gradients, accumulated updates) in place of stage 0's gradient "    \
       "all-reduce (DeepSpeed asserts stage 0 too)")                                                                 \
  RULE(one_bit_host_only, Blame::engine_only, !c.one_bit || !c.on_device,                                            \
       "Engine: Optimizer<OneBitAdam>, Optimizer<ZeroOneAdam> and Optimizer<OneBitLamb> with Device<Cuda> or "       \
       "Device<HostAsync> are not available yet (their compressed exchange runs on host memory); use Device<Host>",  \
       "")                                                                                                           \
  RULE(compression_needs_stage0, Blame::stage, !c.compression || c.stage == 0,                                       \
       "Engine: GradientCompression<TopK|TwoBit|Sign> replaces stage 0's gradient all-reduce; use "                  \
       "Partitioner<Stage<0>> (stages 1-3 reduce-scatter into partitions, which no codec does yet)",                 \
       "gradient_compression with ZeRO stage 1, 2 or 3; GradientCompression<TopK|TwoBit|Sign> replaces stage 0's "   \
       "gradient all-reduce, and stages 1-3 reduce-scatter into partitions, which no codec does yet (use stage 0)")  \
  RULE(compression_at_boundary, Blame::engine_only, !c.compression || c.reduce_at_boundary,                          \
       "Engine: GradientCompression compresses the accumulated gradient once per optimizer step; use "               \
       "Partitioner<Stage<0>> with when::at_boundary (its default)",                                                 \
       "")                                                                                                           \
  RULE(compression_not_with_one_bit, Blame::optimizer_type, !c.compression || !c.one_bit,                            \
       "Engine: Optimizer<OneBitAdam>, Optimizer<ZeroOneAdam> and Optimizer<OneBitLamb> already compress their own " \
       "exchanges; use GradientCompression<None> with them",                                                         \
       "gradient_compression with OneBitAdam, ZeroOneAdam or OneBitLamb; they already compress their own exchanges " \
       "in place of the gradient all-reduce (remove the gradient_compression block or its algorithm)")               \
  RULE(compression_host_only, Blame::engine_only, !c.compression || !c.on_device,                                    \
       "Engine: GradientCompression with Device<Cuda> or Device<HostAsync> is not available yet (its codecs run on " \
       "host memory); use Device<Host>",                                                                             \
       "")                                                                                                           \
  RULE(sparsity_host_state, Blame::engine_only,                                                                      \
       !c.sparsity || (c.offload != Place::nvme && c.param_offload != Place::nvme && !c.on_device),                  \
       "Engine: Sparsity<NofM<N, M>> prunes the fp32 master and the optimizer's output where the host holds them; "  \
       "Offload<Nvme>, OffloadParams<Nvme>, Device<Cuda> and Device<HostAsync> are not available with it yet "       \
       "(use Offload<None> or <Cpu>, OffloadParams<None> or <Cpu>, Device<Host>)",                                   \
       "")                                                                                                           \
  RULE(sparsity_plain_exchange, Blame::engine_only, !c.sparsity || (!c.one_bit && !c.compression),                   \
       "Engine: Sparsity<NofM<N, M>> prunes the reduced gradients before the norm; the 1-bit optimizers and "        \
       "GradientCompression exchange compressed state of their own, which it does not mask (use Optimizer<Adam>, "   \
       "<AdamW>, <Lamb> or <Lion> and GradientCompression<None>)",                                                   \
       "")

/// One rule of the table, as data (the config validator's view).
struct CompatRule {
  std::string_view name;
  Blame blame;
  bool (*holds)(const Combination&);
  std::string_view engine_words;
  std::string_view config_words;
};

#define ZEROTK_COMPAT_ENTRY(name, blame, holds, engine_words, config_words) \
  CompatRule{#name, blame, [](const Combination& c) { return static_cast<bool>(holds); }, engine_words, config_words},
inline constexpr CompatRule kCompatRules[] = {ZEROTK_COMPAT_RULES(ZEROTK_COMPAT_ENTRY)};
#undef ZEROTK_COMPAT_ENTRY

/// Whether every rule holds for `c` (no diagnostics).
constexpr bool combines(const Combination& c) {
  for (const CompatRule& r : kCompatRules) {
    if (!r.holds(c)) return false;
  }
  return true;
}

/// The compile-time check: one static_assert per rule, in table order, so the first failing rule's
/// words are the first error line. Each asserts a named constant, not the lambda call: clang prints
/// the asserted expression before the words, and a lambda's body would push them off that line.
template <Combination C>
struct CompatCheck {
#define ZEROTK_COMPAT_ASSERT(name, blame, holds, engine_words, config_words)                              \
  static constexpr bool name##_holds = [](const Combination& c) { return static_cast<bool>(holds); }(C); \
  static_assert(name##_holds, engine_words);
  ZEROTK_COMPAT_RULES(ZEROTK_COMPAT_ASSERT)
#undef ZEROTK_COMPAT_ASSERT
  static constexpr bool value = true;
};

/// The Combination of a policy pack's resolved policies.
template <class Partitioner, class Optimizer, class Offload, class Device, class OffloadParams, class GradientCompression,
          class Sparsity = ::zerotk::Sparsity<None>>
constexpr Combination combination_of() {
  using OptTag = policy_tag_t<Optimizer>;
  Combination c;
  c.stage = Partitioner::stage;
  c.reduce_at_boundary = std::is_same_v<typename Partitioner::when, when::at_boundary>;
  c.one_bit = OptTag::one_bit;
  c.whole_partition = OptTag::whole_partition;
  c.offload = place_of<typename Offload::tag>();
  c.param_offload = place_of<typename OffloadParams::tag>();
  c.compression = !std::is_same_v<typename GradientCompression::tag, None>;
  c.on_device = on_device_v<Device>();
  c.sparsity = !std::is_same_v<typename Sparsity::tag, None>;
  return c;
}

/// The check of a policy pack (engine/resolve.hpp instantiates it; the same arguments as before the
/// table existed).
template <class Partitioner, class Optimizer, class Precision, class Offload, class Device,
          class OffloadParams = ::zerotk::OffloadParams<None>,
          class GradientCompression = ::zerotk::GradientCompression<None>, class Sparsity = ::zerotk::Sparsity<None>>
struct Compat {
  static constexpr Combination combination =
      combination_of<Partitioner, Optimizer, Offload, Device, OffloadParams, GradientCompression, Sparsity>();
  static constexpr bool value = CompatCheck<combination>::value;
  /// Whether the pack combines (false exactly when a static_assert above fired).
  static constexpr bool ok = combines(combination);
};

}  // namespace zerotk::engine
