#pragma once
/// \file zerotk/checkpoint.hpp
/// The checkpoint layer (needs libxxhash: link zerotk::xxhash): save and load an engine's state
/// collectively, with a crash-safe commit, checksums, and errors that name the file. docs/checkpoint.md.
#include "zerotk/checkpoint/load.hpp"
#include "zerotk/checkpoint/options.hpp"
#include "zerotk/checkpoint/read.hpp"
#include "zerotk/checkpoint/save.hpp"
