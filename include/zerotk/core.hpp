#pragma once
/// \file zerotk/core.hpp
/// The core layer: errors, dtypes, concepts, parameter views and memory.
#include "zerotk/core/concepts.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/core/macros.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/core/param.hpp"
#include "zerotk/core/validation.hpp"
#include "zerotk/version.hpp"
