#pragma once
/// \file zerotk/context.hpp
/// Context parallelism's building blocks over the user's buffers: Ulysses' re-layout and ring
/// attention's schedule (docs/context.md).
#include "zerotk/context/ring.hpp"
#include "zerotk/context/ulysses.hpp"
