// src/engines/adamw_fp32.cpp: the compiled engine set's family adamw_fp32 (include/zerotk/engines/set.hpp lists
// its engine types); one translation unit of the zerotk::engines library.
#include "zerotk/engine.hpp"
#include "zerotk/engines/set.hpp"

ZEROTK_ENGINES_LIST_ADAMW_FP32(ZEROTK_ENGINE_INSTANTIATE)
