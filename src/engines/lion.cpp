// src/engines/lion.cpp: the compiled engine set's family lion (include/zerotk/engines/set.hpp lists
// its engine types); one translation unit of the zerotk::engines library.
#include "zerotk/engine.hpp"
#include "zerotk/engines/set.hpp"

ZEROTK_ENGINES_LIST_LION(ZEROTK_ENGINE_INSTANTIATE)
