#pragma once
/// \file zerotk/engines.hpp
/// The compiled engine set: engine types whose weight is compiled once, in the `zerotk::engines`
/// library, instead of in every translation unit that uses them (fmt's compiled mode, CUTLASS's
/// instance library, Kokkos' explicit instantiation).
///
///   # CMake: link the component (ZEROTK_ENGINES picks its families; default: all of them)
///   target_link_libraries(my_trainer PRIVATE zerotk::engines)
///
///   // C++: include this instead of (or before using) zerotk/engine.hpp
///   #include <zerotk/engines.hpp>
///   using E = zerotk::Engine<zerotk::Partitioner<zerotk::Stage<2>>, zerotk::Optimizer<zerotk::AdamW>,
///                            zerotk::Precision<zerotk::bf16>>;   // a compiled type, its policies in any order
///   E engine(comm, model, options);   // the trainer's TU instantiates only the thin forwards
///
/// For every family the library was built with (ZEROTK_ENGINES_<FAMILY> = 1, set by linking it),
/// this declares its engine types `extern template`: the trainer's translation unit then compiles
/// the forwards from its own types (engine/model_view.hpp) and links the members. An engine type
/// outside the set is instantiated in the trainer's TU as before (header-only use is unchanged). engines/set.hpp lists the families.

#include "zerotk/engine.hpp"
#include "zerotk/engines/set.hpp"

#ifndef ZEROTK_ENGINES_ADAMW_FP32
#define ZEROTK_ENGINES_ADAMW_FP32 0
#endif
#ifndef ZEROTK_ENGINES_ADAMW_BF16
#define ZEROTK_ENGINES_ADAMW_BF16 0
#endif
#ifndef ZEROTK_ENGINES_ADAMW_FP16
#define ZEROTK_ENGINES_ADAMW_FP16 0
#endif
#ifndef ZEROTK_ENGINES_OFFLOAD_CPU
#define ZEROTK_ENGINES_OFFLOAD_CPU 0
#endif
#ifndef ZEROTK_ENGINES_OFFLOAD_NVME
#define ZEROTK_ENGINES_OFFLOAD_NVME 0
#endif
#ifndef ZEROTK_ENGINES_LION
#define ZEROTK_ENGINES_LION 0
#endif
#ifndef ZEROTK_ENGINES_ONEBIT
#define ZEROTK_ENGINES_ONEBIT 0
#endif
#ifndef ZEROTK_ENGINES_COMPRESSION
#define ZEROTK_ENGINES_COMPRESSION 0
#endif

// nvcc compiles Device<Host> engines too, but a .cu file must not rely on objects compiled by the
// host compiler with other flags: CUDA translation units instantiate for themselves.
#if !defined(__CUDACC__)
#if ZEROTK_ENGINES_ADAMW_FP32
ZEROTK_ENGINES_LIST_ADAMW_FP32(ZEROTK_ENGINE_EXTERN)
#endif
#if ZEROTK_ENGINES_ADAMW_BF16
ZEROTK_ENGINES_LIST_ADAMW_BF16(ZEROTK_ENGINE_EXTERN)
#endif
#if ZEROTK_ENGINES_ADAMW_FP16
ZEROTK_ENGINES_LIST_ADAMW_FP16(ZEROTK_ENGINE_EXTERN)
#endif
#if ZEROTK_ENGINES_OFFLOAD_CPU
ZEROTK_ENGINES_LIST_OFFLOAD_CPU(ZEROTK_ENGINE_EXTERN)
#endif
#if ZEROTK_ENGINES_OFFLOAD_NVME
ZEROTK_ENGINES_LIST_OFFLOAD_NVME(ZEROTK_ENGINE_EXTERN)
#endif
#if ZEROTK_ENGINES_LION
ZEROTK_ENGINES_LIST_LION(ZEROTK_ENGINE_EXTERN)
#endif
#if ZEROTK_ENGINES_ONEBIT
ZEROTK_ENGINES_LIST_ONEBIT(ZEROTK_ENGINE_EXTERN)
#endif
#if ZEROTK_ENGINES_COMPRESSION
ZEROTK_ENGINES_LIST_COMPRESSION(ZEROTK_ENGINE_EXTERN)
#endif
#endif
