// src/engines/adamw_fp16.cpp: the compiled engine set's family adamw_fp16 (include/zerotk/engines/set.hpp lists
// its engine types); one translation unit of the zerotk::engines library.
#include "zerotk/engine.hpp"
#include "zerotk/engines/set.hpp"

ZEROTK_ENGINES_LIST_ADAMW_FP16(ZEROTK_ENGINE_INSTANTIATE)
