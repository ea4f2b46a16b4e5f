// src/engines/config_file.cpp: make_engine_from_file's compiled half (zerotk/any_engine.hpp): the
// DeepSpeed JSON is read here, once, so a trainer over AnyEngine compiles no JSON reader.
#include <cstdio>

#include "zerotk/any_engine.hpp"
#include "zerotk/config/reader.hpp"

namespace zerotk::detail {

AnyEngine make_any_engine_from_file(const std::filesystem::path& ds_config, engine::ErasedInputs inputs,
                                    const EngineOptionsEdit& edit) {
  config::ResolveContext ctx;
  ctx.world_size = inputs.world_size;
  ctx.print_notices_to = inputs.world_rank == 0 ? stderr : nullptr;  // the config's notices once, on rank 0
  const config::Config cfg = config::load_file(ds_config, ctx);
  return make_any_engine(cfg, std::move(inputs), edit);
}

}  // namespace zerotk::detail
