#pragma once
/// \file zerotk/core/runtime.hpp
/// Header-only or compiled runtime (fmt's FMT_HEADER_ONLY, the other way round).
///
/// ZEROTK_COMPILED_RUNTIME (0 or 1, test it with `#if`): 0, the default, keeps zerotk header-only:
/// every header includes the definitions of its heavy non-template functions (its `*_impl.hpp`),
/// marked `inline`, so each translation unit compiles them. 1, set by linking the CMake target
/// zerotk::runtime, leaves only their declarations in the headers: the threads back end, the host
/// reductions and comm::Topology are compiled once in that static library (src/runtime/runtime.cpp)
/// and a trainer's translation units link them instead of compiling them (docs/comm.md).
///
/// Every translation unit of a program must see the same value: mixing the two modes in one binary
/// declares the same functions inline in some units and not in others.

#ifndef ZEROTK_COMPILED_RUNTIME
#define ZEROTK_COMPILED_RUNTIME 0
#endif

/// Marks the declarations and definitions of the functions that zerotk::runtime compiles.
#if ZEROTK_COMPILED_RUNTIME
#define ZEROTK_RUNTIME_INLINE
#else
#define ZEROTK_RUNTIME_INLINE inline
#endif
