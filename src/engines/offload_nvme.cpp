// src/engines/offload_nvme.cpp: the compiled engine set's family offload_nvme (include/zerotk/engines/set.hpp lists
// its engine types); one translation unit of the zerotk::engines library.
#include "zerotk/engine.hpp"
#include "zerotk/engines/set.hpp"

ZEROTK_ENGINES_LIST_OFFLOAD_NVME(ZEROTK_ENGINE_INSTANTIATE)
