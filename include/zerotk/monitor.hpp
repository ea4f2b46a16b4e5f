#pragma once
/// \file zerotk/monitor.hpp
/// The monitor layer: DeepSpeed-compatible csv_monitor files, wall-clock timers, the
/// steps_per_print line and a progress line for long runs.
#include "zerotk/monitor/csv_monitor.hpp"
#include "zerotk/monitor/format.hpp"
#include "zerotk/monitor/progress.hpp"
#include "zerotk/monitor/timers.hpp"
#include "zerotk/monitor/training_log.hpp"
