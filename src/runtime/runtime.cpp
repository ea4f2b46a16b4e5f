// zerotk::runtime: the heavy non-template functions of the headers below, compiled once. A target
// that links zerotk::runtime gets ZEROTK_COMPILED_RUNTIME=1, so its headers only declare these
// functions and its objects link them from here (zerotk/core/runtime.hpp, docs/comm.md).
#include "zerotk/core/runtime.hpp"

#if !ZEROTK_COMPILED_RUNTIME
#error "src/runtime/runtime.cpp is built with ZEROTK_COMPILED_RUNTIME=1 (the zerotk::runtime target sets it)"
#endif

#include "zerotk/comm/detail/reduce.hpp"
#include "zerotk/comm/detail/stream_store.hpp"
#include "zerotk/comm/detail/threads_engine.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/comm/topology.hpp"

#include "zerotk/comm/detail/reduce_impl.hpp"
#include "zerotk/comm/detail/stream_store_impl.hpp"
#include "zerotk/comm/detail/threads_engine_impl.hpp"
#include "zerotk/comm/threads_impl.hpp"
#include "zerotk/comm/topology_impl.hpp"
