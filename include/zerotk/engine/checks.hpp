#pragma once
/// \file zerotk/engine/checks.hpp
/// The run-time options against what an engine type is (CUTLASS's can_implement: checked once, at
/// construction, before anything is allocated): every part's own rules (EngineOptions::problems,
/// each naming the DeepSpeed key and the value) and the rules that tie an option to the policies
/// (EngineFacts). The first problem is thrown as a config_error.

#include <string>
#include <string_view>
#include <vector>

#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/engine/options.hpp"

namespace zerotk::engine {

/// What the options are checked against: the compile-time facts of an Engine type.
struct EngineFacts {
  DType storage = DType::fp32;       ///< the training precision's element type
  int stage = 0;
  bool reduces_at_boundary = false;  ///< when::at_boundary
  bool can_delay_update = false;     ///< the state store steps off the training thread (Offload<Cpu>)
  bool device_cuda = false;
  bool shard_file = false;           ///< stage 3's parameter shards live in a file (OffloadParams<Nvme>)
  bool swaps = false;                ///< a swap file is read or written (Offload<Nvme>, OffloadParams<Nvme>)
  std::string offload;               ///< the Offload policy, for messages ("Offload<None>")
};

/// "Offload<None>": the policy in words, from its tag's name.
template <class Tag>
std::string offload_policy_name() {
  return "Offload<" + std::string(Tag::name) + ">";
}

/// Every way `o` breaks a rule of `f`'s engine (empty: none).
inline std::vector<config_error> option_problems(const EngineOptions& o, const EngineFacts& f) {
  std::vector<config_error> out = o.problems(f.swaps);
  if (o.delayed_param_update) {
    if (!f.can_delay_update) {
      out.emplace_back(std::string("needs Offload<Cpu> (offload_optimizer.device cpu): the delayed update runs the host "
                                   "optimizer step beside the next forward and backward; this engine has ") +
                           std::string(f.offload),
                       "delayed_param_update", "true");
    } else if (f.device_cuda) {
      out.emplace_back("with Device<Cuda> is not available yet (not yet run on a GPU); use Device<Host>",
                       "delayed_param_update", "true");
    } else if (f.shard_file) {
      out.emplace_back("with OffloadParams<Nvme> is not available: the delayed update writes a step's values into the "
                       "shard file after its state has stepped, so a failed write could not be undone; use "
                       "OffloadParams<Cpu> or OffloadParams<None>",
                       "delayed_param_update", "true");
    }
  }
  if (o.grad_accum_dtype) {
    const DType a = *o.grad_accum_dtype;
    if (a != DType::fp32 && a != f.storage) {
      out.emplace_back("must be fp32 or the training precision (" + std::string(to_string(f.storage)) + ")",
                       "data_types.grad_accum_dtype", std::string(to_string(a)));
    } else if (a == DType::fp32 && f.storage != DType::fp32 && f.reduces_at_boundary && o.gradient_accumulation_steps > 1) {
      out.emplace_back("fp32 accumulation of 16-bit gradients needs them reduced every micro-step: use "
                       "Partitioner<Stage<" + std::to_string(f.stage) + ">, when::every_micro_step> (or stage 2)",
                       "data_types.grad_accum_dtype", "fp32");
    }
  }
  return out;
}

/// `o` with its defaults filled in (one parameter group from `optimizer` when none is given), or
/// the first problem thrown.
inline EngineOptions checked_options(EngineOptions o, const EngineFacts& f) {
  std::vector<config_error> p = option_problems(o, f);
  if (!p.empty()) throw p.front();
  if (o.groups.empty()) o.groups.push_back(ParamGroup{o.optimizer});
  return o;
}

}  // namespace zerotk::engine
