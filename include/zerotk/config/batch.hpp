#pragma once
/// \file zerotk/config/batch.hpp
/// The batch triad (SEMANTICS.md section 5), gradient clipping and the other top-level scalars
/// (`communication_data_type`, `data_types`, `steps_per_print`, ...): Reader::read_batch, read_scalars.
/// Declared in config/reader.hpp and defined here (reader.hpp includes this file at its end), so one
/// block's keys live in one file.

#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zerotk/config/options.hpp"
#include "zerotk/config/reader.hpp"

namespace zerotk::config::detail {

// EngineOptions counts micro-steps in an int: a larger value must not wrap (4294967297 -> 1).
inline constexpr std::int64_t kMaxGas = std::numeric_limits<int>::max();

/// The batch triad as read (SEMANTICS.md section 5): each value given, resolved from "auto", or absent.
struct BatchTriad {
  std::optional<std::int64_t> tbs, mbs, gas;
  bool tbs_auto = false, mbs_auto = false;
  std::string p_tbs, p_mbs, p_gas;  // their JSON paths
};

/// Reads the three keys; false when one of them is invalid (reported).
inline bool Reader::read_batch_keys(Block& root, BatchTriad& t) {
  constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
  std::int64_t v = 0;
  t.p_tbs = root.path_of("train_batch_size");
  t.p_mbs = root.path_of("train_micro_batch_size_per_gpu");
  t.p_gas = root.path_of("gradient_accumulation_steps");
  bool bad = false;
  switch (root.get_int("train_batch_size", v, 1, kMax, true)) {
    case Got::value: t.tbs = v; break;
    case Got::automatic: t.tbs_auto = true; break;  // derived from the other two below
    case Got::invalid: bad = true; break;
    case Got::absent: break;
  }
  switch (root.get_int("train_micro_batch_size_per_gpu", v, 1, kMax, true)) {
    case Got::value: t.mbs = v; break;
    case Got::automatic:
      t.mbs_auto = true;
      if (ctx.micro_batch_size) {
        t.mbs = *ctx.micro_batch_size;
        note(Notice::Kind::auto_resolved, t.p_mbs, cat("\"auto\" resolved to ", std::to_string(*t.mbs), " (engine)"));
      }
      break;
    case Got::invalid: bad = true; break;
    case Got::absent: break;
  }
  switch (root.get_int("gradient_accumulation_steps", v, 1, kMaxGas, true)) {
    case Got::value: t.gas = v; break;
    case Got::automatic:
      if (ctx.gradient_accumulation_steps) {
        t.gas = *ctx.gradient_accumulation_steps;
        note(Notice::Kind::auto_resolved, t.p_gas, cat("\"auto\" resolved to ", std::to_string(*t.gas), " (engine)"));
      }
      break;
    case Got::invalid: bad = true; break;
    case Got::absent: break;
  }
  return !bad;
}

/// SEMANTICS.md section 5: the values not given, derived with DeepSpeed's integer division over w
/// data-parallel ranks (at least one of tbs and mbs is set). Returns how a value that was not given
/// was computed, for the error that follows when the triad does not hold.
inline std::string derive_batch(BatchTriad& t, std::int64_t w) {
  std::string derived;
  const auto division = [&](const char* key, std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t r) {
    derived = cat("; ", key, " was not given: derived as ", std::to_string(a), " / ", std::to_string(b), " / ",
                  std::to_string(c), " = ", std::to_string(r), " with integer division, as DeepSpeed does");
  };
  std::optional<std::int64_t> &tbs = t.tbs, &mbs = t.mbs, &gas = t.gas;
  if (tbs && mbs && gas) {
  } else if (tbs && mbs) {
    gas = *tbs / *mbs / w;
    division("gradient_accumulation_steps", *tbs, *mbs, w, *gas);
  } else if (tbs && gas) {
    mbs = *tbs / w / *gas;
    division("train_micro_batch_size_per_gpu", *tbs, w, *gas, *mbs);
  } else if (mbs && gas) {
    tbs = 0;
    if (__builtin_mul_overflow(*mbs, *gas, &*tbs) || __builtin_mul_overflow(*tbs, w, &*tbs)) tbs = -1;
  } else if (tbs) {
    gas = 1;
    mbs = *tbs / w;
    division("train_micro_batch_size_per_gpu", *tbs, w, 1, *mbs);
  } else {
    gas = 1;
    tbs = 0;
    if (__builtin_mul_overflow(*mbs, w, &*tbs)) tbs = -1;
  }
  return derived;
}

inline void Reader::read_batch(Block& root, Config& c) {
  // SEMANTICS.md section 5's W: the data-parallel replicas (the context ranks of one read the same samples)
  const std::int64_t w = data_size_ / c.sequence_parallel_size;
  BatchTriad t;
  if (!read_batch_keys(root, t) || w < 1) return;
  const std::string &p_tbs = t.p_tbs, &p_gas = t.p_gas;
  if (!t.tbs && !t.mbs) {
    if (t.mbs_auto || t.tbs_auto) {
      error(t.mbs_auto ? t.p_mbs : p_tbs,
            "\"auto\" cannot be resolved here: write train_micro_batch_size_per_gpu, or give the per-rank micro "
            "batch (zerotk-config --micro-batch N)",
            "\"auto\"");
    } else {
      error(p_tbs, "train_batch_size or train_micro_batch_size_per_gpu must be given");
    }
    return;
  }
  const std::string derived = derive_batch(t, w);
  const std::int64_t tbs = *t.tbs, mbs = *t.mbs, gas = *t.gas;
  if (t.tbs_auto) {
    note(Notice::Kind::auto_resolved, p_tbs,
         cat("\"auto\" resolved to ", std::to_string(tbs), " (micro batch x accumulation steps x ",
             w == ctx.world_size ? "world size)" : c.sequence_parallel_size > 1 ? "data-parallel replicas)" : "data-parallel size)"));
  }
  std::int64_t product = 0;
  if (__builtin_mul_overflow(mbs, gas, &product) || __builtin_mul_overflow(product, w, &product)) {
    error(p_tbs, "train_micro_batch_size_per_gpu * gradient_accumulation_steps * world_size overflows",
          std::to_string(mbs) + " * " + std::to_string(gas) + " * " + std::to_string(w));
    return;
  }
  if (tbs != product || mbs < 1 || gas < 1) {
    // With a tensor size the product's last factor is the data-parallel size: say where it came from.
    const std::string w_is =
        w == ctx.world_size ? std::string()
        : c.sequence_parallel_size > 1
            ? cat(" (the data-parallel replicas: (", data_size_origin(c), ") / sequence_parallel_size ",
                  std::to_string(c.sequence_parallel_size), ")")
            : cat(" (the data-parallel size: ", data_size_origin(c), ")");
    error(p_tbs,
          cat("train_batch_size must equal train_micro_batch_size_per_gpu * gradient_accumulation_steps * ",
              w == ctx.world_size ? "world_size" : "data_parallel_size", ": ", std::to_string(tbs), " != ",
              std::to_string(mbs), " * ", std::to_string(gas), " * ", std::to_string(w), w_is, " (= ",
              std::to_string(product), ")", derived),
          std::to_string(tbs));
    return;
  }
  if (gas > kMaxGas) {  // derived from the batch sizes, or an engine hint
    error(p_gas, cat("resolves to ", std::to_string(gas), ", above ", std::to_string(kMaxGas),
                     " (micro-steps are counted in an int)"),
          std::to_string(gas));
    return;
  }
  c.train_batch_size = tbs;
  c.train_micro_batch_size_per_gpu = mbs;
  c.gradient_accumulation_steps = static_cast<int>(gas);  // <= kMaxGas, an int
}

inline void Reader::read_scalars(Block& root, Config& c) {
  if (root.get_number("gradient_clipping", c.gradient_clipping, 0, false, std::numeric_limits<double>::infinity(),
                      true) == Got::automatic) {
    resolve_auto(root.path_of("gradient_clipping"), c.gradient_clipping, std::optional(ctx.max_grad_norm.value_or(1.0)),
                 ctx.max_grad_norm ? "engine" : "default");
  }
  root.get_int("steps_per_print", c.steps_per_print, 1, std::numeric_limits<std::int64_t>::max());
  root.get_bool("wall_clock_breakdown", c.wall_clock_breakdown);
  root.get_bool("prescale_gradients", c.prescale_gradients);
  root.get_number("gradient_predivide_factor", c.gradient_predivide_factor, 0, /*lo_open=*/true);
  constexpr std::array<std::string_view, 3> kTypes{"fp32", "fp16", "bf16"};
  std::size_t t = 0;
  if (root.get_choice("communication_data_type", t, kTypes, /*nullable=*/true) == Got::value) {
    constexpr std::array<DType, 3> kDTypes{DType::fp32, DType::fp16, DType::bf16};
    c.communication_data_type = kDTypes[t];
  }
  {
    Block d(*this, root.get_object("data_types"), root.path_of("data_types"));
    // The spellings DeepSpeed's DtypeEnum accepts for the three dtypes (its int8 fails later, in its engine).
    constexpr std::array<std::string_view, 11> kNames{"fp32",    "fp16",          "bf16",     "float32",
                                                      "float",   "torch.float32", "float16",  "half",
                                                      "torch.float16", "bfloat16", "torch.bfloat16"};
    constexpr std::array<DType, 11> kAccum{DType::fp32, DType::fp16, DType::bf16, DType::fp32, DType::fp32, DType::fp32,
                                           DType::fp16, DType::fp16, DType::fp16, DType::bf16, DType::bf16};
    std::size_t i = 0;
    if (d.get_choice("grad_accum_dtype", i, kNames, /*nullable=*/true) == Got::value) {
      c.grad_accum_dtype = kAccum[i];
    }
    d.finish({{"param_dtype"}, {"buffer_dtype"}});
  }
}

}  // namespace zerotk::config::detail
