#pragma once
/// \file zerotk/sparsity/options.hpp
/// SparsityOptions: which parameters Sparsity<NofM<N, M>> makes sparse and when it chooses their
/// masks (EngineOptions::sparsity; ignored by an engine without the policy).

#include <cstdint>
#include <string>
#include <vector>

#include "zerotk/core/error.hpp"

namespace zerotk::sparsity {

struct SparsityOptions {
  /// The sparse parameters, by name: those matching any of these patterns (`*` matches any run of
  /// characters, e.g. "blocks.*.mlp.fc.weight"). Each must have two or more dimensions and a last
  /// dimension (the input dimension of a row-major [out, in] weight) that M divides; the engine
  /// refuses one that has not, naming it. Empty: every parameter that has.
  std::vector<std::string> parameters;
  /// Optimizer steps before the masks are chosen (DeepSpeed's `schedule_offset`; steps skipped for
  /// an fp16 overflow count, as the engine's global step does): the masks are chosen at the boundary
  /// of step start_step + 1, from the fp32 master before its update, and fixed from then on. 0: at
  /// the first boundary.
  std::int64_t start_step = 0;

  void check(std::vector<config_error>& out) const {
    if (start_step < 0) out.emplace_back("must be >= 0", "sparsity.start_step", std::to_string(start_step));
    for (const std::string& p : parameters) {
      if (p.empty()) out.emplace_back("a parameter pattern must not be empty", "sparsity.parameters", "\"\"");
    }
  }
};

}  // namespace zerotk::sparsity
