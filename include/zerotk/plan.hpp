#pragma once
/// \file zerotk/plan.hpp
/// The memory planner (docs/plan.md): per-rank peak memory by space and category for every ZeRO
/// stage x offload x precision x activation-checkpointing choice, exact for model states (the
/// engine's own bucket layout), and the cheapest configuration that fits. The DeepSpeed config
/// output needs nlohmann-json (link zerotk::json).
#include "zerotk/core/macros.hpp"
#include "zerotk/plan/activations.hpp"
#include "zerotk/plan/choice.hpp"
#include "zerotk/plan/deepspeed_estimate.hpp"
#include "zerotk/plan/model.hpp"
#include "zerotk/plan/model_states.hpp"
#include "zerotk/plan/search.hpp"
#include "zerotk/plan/sizes.hpp"
#include "zerotk/plan/transformer.hpp"
#if ZEROTK_HAS_JSON
#include "zerotk/plan/deepspeed_config.hpp"
#endif
