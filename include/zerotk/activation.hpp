#pragma once
/// \file zerotk/activation.hpp
/// Activation checkpointing: Recompute<L> around any Recomputable layer, the Checkpointing state its
/// layers share, which layers to pick (Select) and the Meter that reports activation bytes to a
/// ledger. docs/activation.md has the whole story.

#include "zerotk/activation/arena.hpp"
#include "zerotk/activation/checkpointing.hpp"
#include "zerotk/activation/copy_worker.hpp"
#include "zerotk/activation/meter.hpp"
#include "zerotk/activation/options.hpp"
#include "zerotk/activation/recompute.hpp"
#include "zerotk/activation/select.hpp"
#include "zerotk/activation/traits.hpp"
