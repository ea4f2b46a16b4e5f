// src/engines/compression.cpp: the compiled engine set's family compression (include/zerotk/engines/set.hpp lists
// its engine types); one translation unit of the zerotk::engines library.
#include "zerotk/engine.hpp"
#include "zerotk/engines/set.hpp"

ZEROTK_ENGINES_LIST_COMPRESSION(ZEROTK_ENGINE_INSTANTIATE)
