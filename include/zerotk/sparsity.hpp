#pragma once
/// \file zerotk/sparsity.hpp
/// N:M structured sparsity: the rule, the masks over ZeRO shards and their options (docs/sparsity.md).
/// The engine's policy is Sparsity<NofM<N, M>> (zerotk/policies.hpp, engine/sparsity.hpp).
#include "zerotk/sparsity/nm.hpp"
#include "zerotk/sparsity/options.hpp"
#include "zerotk/sparsity/shard_masks.hpp"
