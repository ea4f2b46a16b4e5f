#pragma once
/// \file zerotk/context.hpp
/// Context parallelism's building blocks over the user's buffers: Ulysses' re-layout
/// (docs/context.md).
#include "zerotk/context/ulysses.hpp"
