#pragma once
/// \file zerotk/zerotk.hpp
/// Umbrella header: every layer, the Engine included, but not the two parts that would bring a large
/// third-party header into every file that includes it: the Eigen interop (zerotk/core/eigen.hpp)
/// and the config layer's JSON reader and writer (config::load, load_file, parse, to_json, ...:
/// zerotk/config.hpp). Include those where you use them. The config's options, its structure match
/// and engine_options/grid_shape (zerotk/engine_config.hpp) are here. Layers that need an optional
/// package (MPI, NCCL, libxxhash, ...) are included only when its feature macro is 1; the CUDA
/// device backend only when nvcc compiles the including file.
#include "zerotk/activation.hpp"
#include "zerotk/comm.hpp"
#include "zerotk/compress.hpp"
#include "zerotk/core.hpp"
#include "zerotk/config/context.hpp"
#include "zerotk/config/diagnostics.hpp"
#include "zerotk/config/options.hpp"
#include "zerotk/config/structure.hpp"
#include "zerotk/context.hpp"
#include "zerotk/engine.hpp"
#if ZEROTK_HAS_XXHASH
#include "zerotk/checkpoint.hpp"
#else
// Without libxxhash: the checkpoint entry points fail where they are called, saying what to do.
#include "zerotk/core/missing.hpp"
namespace zerotk::checkpoint {
#define ZEROTK_CHECKPOINT_NEEDS_XXHASH_(fn) \
  ZEROTK_MISSING_DEPENDENCY(fn, "zerotk::checkpoint::" #fn " checksums its files, which needs libxxhash: " ZEROTK_HOW_TO_GET_XXHASH)
ZEROTK_CHECKPOINT_NEEDS_XXHASH_(save)
ZEROTK_CHECKPOINT_NEEDS_XXHASH_(save_async)
ZEROTK_CHECKPOINT_NEEDS_XXHASH_(load)
ZEROTK_CHECKPOINT_NEEDS_XXHASH_(save_16bit_model)
ZEROTK_CHECKPOINT_NEEDS_XXHASH_(verify)
ZEROTK_CHECKPOINT_NEEDS_XXHASH_(read_manifest)
ZEROTK_CHECKPOINT_NEEDS_XXHASH_(read_latest)
ZEROTK_CHECKPOINT_NEEDS_XXHASH_(export_safetensors)
#undef ZEROTK_CHECKPOINT_NEEDS_XXHASH_
}  // namespace zerotk::checkpoint
#endif
#include "zerotk/moe.hpp"
#include "zerotk/monitor.hpp"
#include "zerotk/optim/clip.hpp"
#include "zerotk/optim/optimizer.hpp"
#include "zerotk/optim/schedulers.hpp"
#include "zerotk/parallel.hpp"
#include "zerotk/pipeline.hpp"
#include "zerotk/policies.hpp"
#include "zerotk/precision.hpp"
#include "zerotk/sparsity.hpp"
#include "zerotk/version.hpp"
#include "zerotk/zero/layout.hpp"
#include "zerotk/zero/partitioner.hpp"
#include "zerotk/engine_config.hpp"
