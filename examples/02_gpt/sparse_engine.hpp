// examples/02_gpt/sparse_engine.hpp: --sparsity 2:4, the blocks' MLP weights (--sparse-params)
// trained 2:4 sparse by zerotk::Sparsity<NofM<2, 4>> after --sparse-from dense steps (docs/sparsity.md).
// Sparse engines are not in the compiled engine set (a DeepSpeed config has no key for them), so the
// example compiles the ones it offers in sparse_engine.cpp, a translation unit of its own: AdamW in
// bf16 at ZeRO stages 2 and 3, no offload. make_sparse_engine builds one from the config as
// make_engine builds the set's (zerotk::make_engine_of).
#pragma once

#include <string>

#include "zerotk/any_engine.hpp"

namespace gpt_demo {

/// The sparse engine `cfg` asks for, in words; a usage_error naming what it asks that none of the
/// example's sparse engines offers.
std::string sparse_engine_for(const zerotk::config::Config& cfg);

/// That engine over `inputs`, with the config's options, then `edit`'s (which sets the sparsity
/// options), and the config's LR scheduler.
zerotk::AnyEngine make_sparse_engine(const zerotk::config::Config& cfg, zerotk::engine::ErasedInputs inputs,
                                     const zerotk::EngineOptionsEdit& edit);

}  // namespace gpt_demo
