// src/engines/config_file_missing.cpp: make_engine_from_file when zerotk::engines was built without
// nlohmann-json: it refuses, saying how to get the reader (make_engine(cfg, ...) still works).
#include "zerotk/any_engine.hpp"

namespace zerotk::detail {

AnyEngine make_any_engine_from_file(const std::filesystem::path& ds_config, engine::ErasedInputs, const EngineOptionsEdit&) {
  throw usage_error("make_engine_from_file reads DeepSpeed JSON, and zerotk::engines was built without nlohmann-json: "
                    "install it (Debian: nlohmann-json3-dev) and configure zerotk again, or read the file with "
                    "config::load_file and call make_engine(cfg, ...)",
                    "make_engine_from_file", ds_config.string());
}

}  // namespace zerotk::detail
