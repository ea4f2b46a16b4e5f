#pragma once
/// \file zerotk/config/precision.hpp
/// The `fp16` and `bf16` (or `bfloat16`) blocks: Reader::read_precision. Declared in config/reader.hpp and
/// defined here (reader.hpp includes this file at its end), so one block's keys live in one file.

#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "zerotk/config/options.hpp"
#include "zerotk/config/reader.hpp"

namespace zerotk::config::detail {

inline void Reader::read_precision(Block& root, Config& c) {
  // fp16
  {
    Block b(*this, root.get_object("fp16"), root.path_of("fp16"));
    if (b.get_bool("enabled", c.fp16.enabled, true) == Got::automatic) {
      std::optional<bool> v;
      if (ctx.precision) v = *ctx.precision == DType::fp16;
      resolve_auto(b.path_of("enabled"), c.fp16.enabled, v, "the engine's precision",
                   "write true or false, or give the engine's precision (zerotk-config --precision fp16|bf16|fp32)");
    }
    b.get_number("loss_scale", c.fp16.static_scale, 0);
    int power = 0;
    if (b.get_int("initial_scale_power", power, 0, 127) == Got::value) c.fp16.initial_scale_power = power;
    b.get_int("loss_scale_window", c.fp16.loss_scale_window, 1, std::numeric_limits<std::int64_t>::max());
    b.get_int("hysteresis", c.fp16.hysteresis, 1, std::numeric_limits<int>::max());
    b.get_bool("consecutive_hysteresis", c.fp16.consecutive_hysteresis);
    b.get_number("min_loss_scale", c.fp16.min_loss_scale, 0, /*lo_open=*/true);
    b.finish({{"auto_cast", "false"}, {"fp16_master_weights_and_grads", "false"}});
  }
  // bf16, or its old name bfloat16
  {
    const Json* bf = root.get_object("bf16");
    const Json* old = root.get_object("bfloat16");
    std::string path = root.path_of("bf16");
    if (bf && old) {
      error(root.path_of("bfloat16"), "given twice, as \"bf16\" and as its old name \"bfloat16\"; keep \"bf16\"",
            show(*old));
    } else if (old) {
      bf = old;
      path = root.path_of("bfloat16");
      note(Notice::Kind::deprecated, path, "old name of \"bf16\"");
    }
    Block b(*this, bf, path);
    if (b.get_bool("enabled", c.bf16.enabled, true) == Got::automatic) {
      std::optional<bool> v;
      if (ctx.precision) v = *ctx.precision == DType::bf16;
      resolve_auto(b.path_of("enabled"), c.bf16.enabled, v, "the engine's precision",
                   "write true or false, or give the engine's precision (zerotk-config --precision fp16|bf16|fp32)");
    }
    b.finish({{"immediate_grad_update", "false"},
              {"check_grad_overflow", "true", "zerotk always checks bf16 gradients for inf/NaN and skips such steps"},
              {"bf16_master_weights_and_grads", "false"},
              {"bf16_optimizer_states", "false"}});
  }
  // zerotk's own key (DeepSpeed 0.19 has none like it): module types whose parameters stay fp32.
  read_module_types(root.find("fp16_override_modules"), root.path_of("fp16_override_modules"),
                    c.fp16_override_modules);
  // zerotk's own keys (no DeepSpeed release reads them): which modules' parameters stage 3 partitions.
  // Top level, not in zero_optimization: DeepSpeed ignores unknown top-level keys but refuses unknown
  // zero_optimization ones, so a config with them still loads there.
  // They fill stage 3's own options (Stage3Options::partitioned_module_types, replicated_module_types).
  zero::Stage3Options& s3 = c.zero_optimization.stage3;
  read_module_types(root.find("zero_allowed_param_types"), root.path_of("zero_allowed_param_types"),
                    s3.partitioned_module_types);
  read_module_types(root.find("zero_force_param_types"), root.path_of("zero_force_param_types"),
                    s3.replicated_module_types);
  for (const std::string& t : s3.replicated_module_types) {
    if (std::find(s3.partitioned_module_types.begin(), s3.partitioned_module_types.end(), t) !=
        s3.partitioned_module_types.end()) {
      error(root.path_of("zero_force_param_types"),
            cat("module type \"", t, "\" is also in zero_allowed_param_types; a type is either partitioned or not"),
            cat("\"", t, "\""));
    }
  }
}

}  // namespace zerotk::config::detail
