#pragma once
/// \file zerotk/context.hpp
/// Context parallelism's building blocks over the user's buffers: Ulysses' re-layout, ring
/// attention's schedule, the two combined (a2a+p2p), DeepSpeed's block-sparse layouts and the
/// block-sparse operator (docs/context.md).
#include "zerotk/context/block_sparse.hpp"
#include "zerotk/context/hybrid.hpp"
#include "zerotk/context/masked_ring.hpp"
#include "zerotk/context/ring.hpp"
#include "zerotk/context/sparsity.hpp"
#include "zerotk/context/ulysses.hpp"
