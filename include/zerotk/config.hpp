#pragma once
/// \file zerotk/config.hpp
/// The config layer: DeepSpeed JSON -> typed options, "auto" resolution, validation with JSON
/// paths, and matching a config against compiled engines. The JSON reader needs nlohmann-json
/// (link zerotk::json); the options and the structure match do not.
#include "zerotk/config/context.hpp"
#include "zerotk/config/diagnostics.hpp"
#include "zerotk/config/options.hpp"
#include "zerotk/config/structure.hpp"
#if ZEROTK_HAS_JSON
#include "zerotk/config/json_dom.hpp"
#include "zerotk/config/reader.hpp"
#include "zerotk/config/writer.hpp"
#endif
