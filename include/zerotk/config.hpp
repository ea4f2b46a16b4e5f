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
#else
// Without nlohmann-json: every JSON entry point fails where it is called, saying what to do.
#include "zerotk/core/missing.hpp"
namespace zerotk::config {
#define ZEROTK_CONFIG_NEEDS_JSON_(fn) \
  ZEROTK_MISSING_DEPENDENCY(fn, "zerotk::config::" #fn " reads or writes JSON, which needs nlohmann-json: " ZEROTK_HOW_TO_GET_JSON)
ZEROTK_CONFIG_NEEDS_JSON_(parse)
ZEROTK_CONFIG_NEEDS_JSON_(validate)
ZEROTK_CONFIG_NEEDS_JSON_(validate_context)
ZEROTK_CONFIG_NEEDS_JSON_(load)
ZEROTK_CONFIG_NEEDS_JSON_(load_file)
ZEROTK_CONFIG_NEEDS_JSON_(read_text)
ZEROTK_CONFIG_NEEDS_JSON_(read_text_file)
ZEROTK_CONFIG_NEEDS_JSON_(from_json)
ZEROTK_CONFIG_NEEDS_JSON_(to_json)
#undef ZEROTK_CONFIG_NEEDS_JSON_
}  // namespace zerotk::config
#endif
