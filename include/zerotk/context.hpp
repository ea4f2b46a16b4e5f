#pragma once
/// \file zerotk/context.hpp
/// Context parallelism's building blocks over the user's buffers: Ulysses' re-layout, ring
/// attention's schedule and the two combined, a2a+p2p (docs/context.md).
#include "zerotk/context/hybrid.hpp"
#include "zerotk/context/ring.hpp"
#include "zerotk/context/ulysses.hpp"
