// src/engines/offload_cpu.cpp: the compiled engine set's family offload_cpu (include/zerotk/engines/set.hpp lists
// its engine types); one translation unit of the zerotk::engines library.
#include "zerotk/engine.hpp"
#include "zerotk/engines/set.hpp"

ZEROTK_ENGINES_LIST_OFFLOAD_CPU(ZEROTK_ENGINE_INSTANTIATE)
