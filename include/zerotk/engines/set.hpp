#pragma once
/// \file zerotk/engines/set.hpp
/// The engine types of the compiled engine set, by family: the one list that both the declarations
/// (zerotk/engines.hpp: `extern template`) and the compiled component (src/engines/<family>.cpp:
/// `template class`) expand, so the two cannot drift apart. A family is one translation unit of the
/// `zerotk::engines` library; CMake's cache variable ZEROTK_ENGINES picks the families it compiles
/// (in the spirit of CUTLASS_LIBRARY_KERNELS) and defines ZEROTK_ENGINES_<FAMILY> to 1 for them.
///
/// Each entry is X(policies...). An engine type is the compiled one whatever the order its policies
/// are spelled in, and whether its defaults are spelled or left out: Engine<Ps...> names BasicEngine
/// over the canonical pack (engine/resolve.hpp).
///
///   family        engine types (all Device<Host>, Bucketer and LossScaler defaulted)
///   adamw_fp32    Partitioner<Stage<0..3>>, Optimizer<AdamW>, Precision<fp32>
///   adamw_bf16    Partitioner<Stage<0..3>>, Optimizer<AdamW>, Precision<bf16>
///   adamw_fp16    Partitioner<Stage<0..3>>, Optimizer<AdamW>, Precision<fp16>
///   offload_cpu   AdamW, bf16: Offload<Cpu> at stages 1-3; stage 3 with OffloadParams<Cpu>, alone or
///                 with Offload<Cpu> (and that pair in fp32)
///   offload_nvme  AdamW, bf16, stage 3: Offload<Nvme> alone, with OffloadParams<Cpu> or <Nvme>;
///                 OffloadParams<Nvme> alone or with Offload<Cpu>
///   lion          Optimizer<Lion>, bf16: stages 1-3, and stage 3 with Offload<Cpu>
///   onebit        stage 0: OneBitAdam in fp32 and bf16, ZeroOneAdam and OneBitLamb in fp32
///   compression   stage 0, AdamW, fp32: GradientCompression<TopK | TwoBit | Sign>

#include "zerotk/policies.hpp"

#define ZEROTK_ENGINES_ADAMW_(X, P)                                                                   \
  X(::zerotk::Partitioner<::zerotk::Stage<0>>, ::zerotk::Optimizer<::zerotk::AdamW>, ::zerotk::Precision<P>) \
  X(::zerotk::Partitioner<::zerotk::Stage<1>>, ::zerotk::Optimizer<::zerotk::AdamW>, ::zerotk::Precision<P>) \
  X(::zerotk::Partitioner<::zerotk::Stage<2>>, ::zerotk::Optimizer<::zerotk::AdamW>, ::zerotk::Precision<P>) \
  X(::zerotk::Partitioner<::zerotk::Stage<3>>, ::zerotk::Optimizer<::zerotk::AdamW>, ::zerotk::Precision<P>)

#define ZEROTK_ENGINES_LIST_ADAMW_FP32(X) ZEROTK_ENGINES_ADAMW_(X, ::zerotk::fp32)
#define ZEROTK_ENGINES_LIST_ADAMW_BF16(X) ZEROTK_ENGINES_ADAMW_(X, ::zerotk::bf16)
#define ZEROTK_ENGINES_LIST_ADAMW_FP16(X) ZEROTK_ENGINES_ADAMW_(X, ::zerotk::fp16)

#define ZEROTK_ENGINES_S_(n) ::zerotk::Partitioner<::zerotk::Stage<n>>
#define ZEROTK_ENGINES_ADAMW_BF16_ ::zerotk::Optimizer<::zerotk::AdamW>, ::zerotk::Precision<::zerotk::bf16>

#define ZEROTK_ENGINES_LIST_OFFLOAD_CPU(X)                                                                     \
  X(ZEROTK_ENGINES_S_(1), ZEROTK_ENGINES_ADAMW_BF16_, ::zerotk::Offload<::zerotk::Cpu>)                        \
  X(ZEROTK_ENGINES_S_(2), ZEROTK_ENGINES_ADAMW_BF16_, ::zerotk::Offload<::zerotk::Cpu>)                        \
  X(ZEROTK_ENGINES_S_(3), ZEROTK_ENGINES_ADAMW_BF16_, ::zerotk::Offload<::zerotk::Cpu>)                        \
  X(ZEROTK_ENGINES_S_(3), ZEROTK_ENGINES_ADAMW_BF16_, ::zerotk::OffloadParams<::zerotk::Cpu>)                  \
  X(ZEROTK_ENGINES_S_(3), ZEROTK_ENGINES_ADAMW_BF16_, ::zerotk::Offload<::zerotk::Cpu>,                        \
    ::zerotk::OffloadParams<::zerotk::Cpu>)                                                                    \
  X(ZEROTK_ENGINES_S_(3), ::zerotk::Optimizer<::zerotk::AdamW>, ::zerotk::Precision<::zerotk::fp32>,           \
    ::zerotk::Offload<::zerotk::Cpu>, ::zerotk::OffloadParams<::zerotk::Cpu>)

#define ZEROTK_ENGINES_LIST_OFFLOAD_NVME(X)                                                                    \
  X(ZEROTK_ENGINES_S_(3), ZEROTK_ENGINES_ADAMW_BF16_, ::zerotk::Offload<::zerotk::Nvme>)                       \
  X(ZEROTK_ENGINES_S_(3), ZEROTK_ENGINES_ADAMW_BF16_, ::zerotk::Offload<::zerotk::Nvme>,                       \
    ::zerotk::OffloadParams<::zerotk::Cpu>)                                                                    \
  X(ZEROTK_ENGINES_S_(3), ZEROTK_ENGINES_ADAMW_BF16_, ::zerotk::Offload<::zerotk::Nvme>,                       \
    ::zerotk::OffloadParams<::zerotk::Nvme>)                                                                   \
  X(ZEROTK_ENGINES_S_(3), ZEROTK_ENGINES_ADAMW_BF16_, ::zerotk::Offload<::zerotk::Cpu>,                        \
    ::zerotk::OffloadParams<::zerotk::Nvme>)                                                                   \
  X(ZEROTK_ENGINES_S_(3), ZEROTK_ENGINES_ADAMW_BF16_, ::zerotk::OffloadParams<::zerotk::Nvme>)

#define ZEROTK_ENGINES_LION_ ::zerotk::Optimizer<::zerotk::Lion>, ::zerotk::Precision<::zerotk::bf16>
#define ZEROTK_ENGINES_LIST_LION(X)                                                                            \
  X(ZEROTK_ENGINES_S_(1), ZEROTK_ENGINES_LION_)                                                                \
  X(ZEROTK_ENGINES_S_(2), ZEROTK_ENGINES_LION_)                                                                \
  X(ZEROTK_ENGINES_S_(3), ZEROTK_ENGINES_LION_)                                                                \
  X(ZEROTK_ENGINES_S_(3), ZEROTK_ENGINES_LION_, ::zerotk::Offload<::zerotk::Cpu>)

#define ZEROTK_ENGINES_LIST_ONEBIT(X)                                                                          \
  X(ZEROTK_ENGINES_S_(0), ::zerotk::Optimizer<::zerotk::OneBitAdam>, ::zerotk::Precision<::zerotk::fp32>)      \
  X(ZEROTK_ENGINES_S_(0), ::zerotk::Optimizer<::zerotk::OneBitAdam>, ::zerotk::Precision<::zerotk::bf16>)      \
  X(ZEROTK_ENGINES_S_(0), ::zerotk::Optimizer<::zerotk::ZeroOneAdam>, ::zerotk::Precision<::zerotk::fp32>)     \
  X(ZEROTK_ENGINES_S_(0), ::zerotk::Optimizer<::zerotk::OneBitLamb>, ::zerotk::Precision<::zerotk::fp32>)

#define ZEROTK_ENGINES_FP32_ADAMW_ ::zerotk::Optimizer<::zerotk::AdamW>, ::zerotk::Precision<::zerotk::fp32>
#define ZEROTK_ENGINES_LIST_COMPRESSION(X)                                                                     \
  X(ZEROTK_ENGINES_S_(0), ZEROTK_ENGINES_FP32_ADAMW_, ::zerotk::GradientCompression<::zerotk::TopK>)           \
  X(ZEROTK_ENGINES_S_(0), ZEROTK_ENGINES_FP32_ADAMW_, ::zerotk::GradientCompression<::zerotk::TwoBit>)         \
  X(ZEROTK_ENGINES_S_(0), ZEROTK_ENGINES_FP32_ADAMW_, ::zerotk::GradientCompression<::zerotk::Sign>)

/// The three class templates an engine type's weight lives in (zerotk/engine.hpp and its CRTP
/// bases), declared or defined for one engine type. `kind` is `extern template` or `template`.
/// The class is named through the canonical pack (an alias template cannot be named after `class`),
/// so the declaration covers every spelling of the same policies.
#define ZEROTK_ENGINE_INSTANCE_(kind, ...)                                                          \
  kind class ::zerotk::BasicEngine<::zerotk::engine::policies_t<__VA_ARGS__>>;                       \
  kind class ::zerotk::engine::Introspection<::zerotk::BasicEngine<::zerotk::engine::policies_t<__VA_ARGS__>>>; \
  kind class ::zerotk::engine::StateAccess<::zerotk::BasicEngine<::zerotk::engine::policies_t<__VA_ARGS__>>>;
#define ZEROTK_ENGINE_EXTERN(...) ZEROTK_ENGINE_INSTANCE_(extern template, __VA_ARGS__)
#define ZEROTK_ENGINE_INSTANTIATE(...) ZEROTK_ENGINE_INSTANCE_(template, __VA_ARGS__)
