#pragma once
/// \file zerotk/pipeline.hpp
/// Pipeline parallelism: schedules as data (GPipe, 1F1B, interleaved 1F1B, ZB-H1) with a text
/// form, the simulator that proves and measures them, the layer partitioner, the executor that runs
/// a rank's part over the pipeline group, and the hooks onto zerotk::Engine. docs/pipeline.md
#include "zerotk/pipeline/activation.hpp"
#include "zerotk/pipeline/agreement.hpp"
#include "zerotk/pipeline/checks.hpp"
#include "zerotk/pipeline/engine_hooks.hpp"
#include "zerotk/pipeline/executor.hpp"
#include "zerotk/pipeline/generators.hpp"
#include "zerotk/pipeline/partition.hpp"
#include "zerotk/pipeline/schedule.hpp"
#include "zerotk/pipeline/simulator.hpp"
#include "zerotk/pipeline/text.hpp"
