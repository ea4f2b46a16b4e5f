#pragma once
/// \file zerotk/engine/slow_ranks.hpp
/// Deprecated (0.2.0): the slow-rank detector moved to zerotk/monitor/slow_ranks.hpp (same names,
/// namespace zerotk). This header forwards there for one minor version.

#include "zerotk/monitor/slow_ranks.hpp"
