#pragma once
/// \file zerotk/checkpoint.hpp
/// The checkpoint layer (needs libxxhash: link zerotk::xxhash): save and load an engine's state
/// collectively (any world size on load), with a crash-safe commit, checksums, and errors that name
/// the file; export to safetensors. docs/checkpoint.md.
#include "zerotk/checkpoint/export.hpp"
#include "zerotk/checkpoint/grid.hpp"
#include "zerotk/checkpoint/load.hpp"
#include "zerotk/checkpoint/options.hpp"
#include "zerotk/checkpoint/read.hpp"
#include "zerotk/checkpoint/save.hpp"
#include "zerotk/checkpoint/save_16bit.hpp"
