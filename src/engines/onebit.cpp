// src/engines/onebit.cpp: the compiled engine set's family onebit (include/zerotk/engines/set.hpp lists
// its engine types); one translation unit of the zerotk::engines library.
#include "zerotk/engine.hpp"
#include "zerotk/engines/set.hpp"

ZEROTK_ENGINES_LIST_ONEBIT(ZEROTK_ENGINE_INSTANTIATE)
