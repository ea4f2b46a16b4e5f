// src/engines/adamw_bf16.cpp: the compiled engine set's family adamw_bf16 (include/zerotk/engines/set.hpp lists
// its engine types); one translation unit of the zerotk::engines library.
#include "zerotk/engine.hpp"
#include "zerotk/engines/set.hpp"

ZEROTK_ENGINES_LIST_ADAMW_BF16(ZEROTK_ENGINE_INSTANTIATE)
