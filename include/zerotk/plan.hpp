#pragma once
/// \file zerotk/plan.hpp
/// The memory planner (docs/plan.md): per-rank peak memory by space and category for every ZeRO
/// stage x offload x precision x activation-checkpointing choice, exact for model states (the
/// engine's own bucket layout), and the cheapest configuration that fits. The DeepSpeed config
/// output needs nlohmann-json (link zerotk::json).
#include "zerotk/core/macros.hpp"
#include "zerotk/plan/activations.hpp"
#include "zerotk/plan/choice.hpp"
#include "zerotk/plan/context.hpp"
#include "zerotk/plan/deepspeed_estimate.hpp"
#include "zerotk/plan/experts.hpp"
#include "zerotk/plan/model.hpp"
#include "zerotk/plan/model_states.hpp"
#include "zerotk/plan/pipeline.hpp"
#include "zerotk/plan/search.hpp"
#include "zerotk/plan/sizes.hpp"
#include "zerotk/plan/transformer.hpp"
#if ZEROTK_HAS_JSON
#include "zerotk/plan/deepspeed_config.hpp"
#else
#include "zerotk/core/missing.hpp"
namespace zerotk::plan {
ZEROTK_MISSING_DEPENDENCY(deepspeed_config,
                          "zerotk::plan::deepspeed_config writes a DeepSpeed config, which needs nlohmann-json: " ZEROTK_HOW_TO_GET_JSON)
ZEROTK_MISSING_DEPENDENCY(deepspeed_config_json,
                          "zerotk::plan::deepspeed_config_json writes a DeepSpeed config, which needs nlohmann-json: " ZEROTK_HOW_TO_GET_JSON)
}  // namespace zerotk::plan
#endif
