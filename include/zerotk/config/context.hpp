#pragma once
/// \file zerotk/config/context.hpp
/// What the engine knows when it reads a config: the facts that decide DeepSpeed's "auto" values
/// and the batch triad. The Hugging Face integration fills "auto" from its TrainingArguments and
/// the model config; zerotk fills it from here. A field left empty means "not known": an "auto"
/// that needs it becomes an error naming the key and how to set it.

#include <array>
#include <cstdint>
#include <cstdio>
#include <optional>

#include "zerotk/core/dtype.hpp"

namespace zerotk::config {

struct ResolveContext {
  /// Every rank of the job. Must be >= 1. The batch rules (SEMANTICS.md section 5) use the
  /// data-parallel size W = world_size / tensor size, the tensor size being the config's
  /// `tensor_model_parallel_size` or `tensor_parallel.autotp_size` (1 when absent: W = world_size).
  int world_size = 1;
  /// Model hidden size H: "auto" bucket sizes become reduce_bucket_size = H^2,
  /// stage3_prefetch_bucket_size = floor(0.9 H^2), stage3_param_persistence_threshold = 10 H.
  std::optional<std::int64_t> hidden_size;
  /// The compiled engine's precision, for `fp16.enabled` / `bf16.enabled` = "auto".
  std::optional<DType> precision;
  /// Per-rank micro batch and accumulation steps, for the batch keys = "auto".
  std::optional<std::int64_t> micro_batch_size;
  std::optional<std::int64_t> gradient_accumulation_steps;
  /// Optimizer values for "auto" optimizer params; when empty, the optimizer's default is used.
  std::optional<double> lr;
  std::optional<std::array<double, 2>> betas;
  std::optional<double> eps;
  std::optional<double> weight_decay;
  /// For `gradient_clipping` = "auto" (default 1.0 when empty).
  std::optional<double> max_grad_norm;
  /// Scheduler lengths: total_num_steps = "auto" needs this; warmup_num_steps = "auto" falls back
  /// to the scheduler default (1000) when empty.
  std::optional<std::int64_t> total_num_steps;
  std::optional<std::int64_t> warmup_num_steps;
  /// Turn "not supported yet" notices into errors (a trainer that must not ignore any key).
  bool strict = false;
  /// Where load() and load_file() print the notices (a key ignored, an old name mapped, an "auto"
  /// value resolved), one line each: stderr by default; null prints nothing (then read
  /// ParseResult::notices from parse()). Under MPI give it to one rank only (rank 0). parse() never
  /// prints.
  std::FILE* print_notices_to = stderr;
};

}  // namespace zerotk::config
