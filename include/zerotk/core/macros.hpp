#pragma once
/// \file zerotk/core/macros.hpp
/// Feature macros (always 0 or 1, test them with `#if`, never `#ifdef`) and portability helpers.
/// The CMake targets zerotk::mpi, zerotk::cuda, ... define the macro to 1; a user who copies
/// include/zerotk into a framework defines them on the command line.

#ifndef ZEROTK_HAS_MPI
#define ZEROTK_HAS_MPI 0
#endif
#ifndef ZEROTK_HAS_CUDA
#define ZEROTK_HAS_CUDA 0
#endif
#ifndef ZEROTK_HAS_NCCL
#define ZEROTK_HAS_NCCL 0
#endif
#ifndef ZEROTK_HAS_OPENMP
#if defined(_OPENMP)
#define ZEROTK_HAS_OPENMP 1
#else
#define ZEROTK_HAS_OPENMP 0
#endif
#endif
#ifndef ZEROTK_HAS_EIGEN
#define ZEROTK_HAS_EIGEN 0
#endif
#ifndef ZEROTK_HAS_JSON
#define ZEROTK_HAS_JSON 0
#endif
#ifndef ZEROTK_HAS_URING
#define ZEROTK_HAS_URING 0
#endif
#ifndef ZEROTK_HAS_XXHASH
#define ZEROTK_HAS_XXHASH 0
#endif
#ifndef ZEROTK_HAS_TORCH
#define ZEROTK_HAS_TORCH 0
#endif

// A feature that is on must really be usable: catch -DZEROTK_HAS_CUDA=1 in a host-only TU early.
#if ZEROTK_HAS_NCCL && !ZEROTK_HAS_CUDA
#error "ZEROTK_HAS_NCCL=1 requires ZEROTK_HAS_CUDA=1"
#endif

/// ZEROTK_HD marks per-element math shared by host drivers and CUDA kernels.
#if defined(__CUDACC__)
#define ZEROTK_HD __host__ __device__
#define ZEROTK_DEVICE_CODE 1
#else
#define ZEROTK_HD
#define ZEROTK_DEVICE_CODE 0
#endif

#if defined(__GNUC__) || defined(__clang__)
#define ZEROTK_RESTRICT __restrict__
#define ZEROTK_FORCEINLINE inline __attribute__((always_inline))
#else
#define ZEROTK_RESTRICT
#define ZEROTK_FORCEINLINE inline
#endif

namespace zerotk {
/// For `static_assert(dependent_false<T>, "...")` in primary templates that must never be instantiated.
template <class...>
inline constexpr bool dependent_false = false;
}  // namespace zerotk
