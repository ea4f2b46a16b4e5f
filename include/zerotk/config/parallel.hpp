#pragma once
/// \file zerotk/config/parallel.hpp
/// The model-parallel sizes of a config and the data-parallel size they leave:
///
///   "tensor_model_parallel_size": 4,                      zerotk's (the seeds') key, or DeepSpeed's
///   "tensor_parallel": {"autotp_size": 4},                AutoTP block (0: off)
///   "pipeline_parallelism": {"num_stages": 8,             zerotk's (the seeds') block, or DeepSpeed's
///                            "schedule": "1f1b"},         "pipeline": {"stages": 8}; the schedule is zerotk's
///   "pipeline": {"partition": "parameters", "activation_checkpoint_interval": 0}
///   "expert_parallel": {"enabled": true, "autoep_size": 4}   DeepSpeed's AutoEP block: the grid's
///                                                         expert size (it must divide data)
///   "sequence_parallel_size": 4                           DeepSpeed's key: the grid's context size
///                                                         (it must divide data)
///
/// data = world / (tensor x pipeline), which ZeRO and hpZ partition over; the batch triad (SEMANTICS.md
/// section 5) counts the replicas, data / sequence_parallel_size.
/// Reader::read_parallel is declared in config/reader.hpp and defined here (reader.hpp includes
/// this file at its end), so the keys live in one file.

#include <array>
#include <limits>
#include <string>
#include <string_view>

#include "zerotk/config/options.hpp"
#include "zerotk/config/reader.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/pipeline/generators.hpp"

namespace zerotk::config::detail {

inline std::string Reader::data_size_origin(const Config& c) const {
  const std::string w = "world " + std::to_string(ctx.world_size);
  if (c.pipeline.stages == 1) return w + " / tensor " + std::to_string(c.tensor_parallel_size);
  if (c.tensor_parallel_size == 1) return w + " / pipeline " + std::to_string(c.pipeline.stages);
  return w + " / (tensor " + std::to_string(c.tensor_parallel_size) + " x pipeline " + std::to_string(c.pipeline.stages) + ")";
}

/// The tensor size: tensor_model_parallel_size or the AutoTP block's autotp_size (the key it came from
/// into `from`; empty when neither is given).
inline int Reader::read_tensor_size(Block& root, std::string& from) {
  constexpr int kMaxInt = std::numeric_limits<int>::max();
  int tp = 1;
  if (root.get_int("tensor_model_parallel_size", tp, 1, kMaxInt) == Got::value) from = root.path_of("tensor_model_parallel_size");
  {
    // DeepSpeed's AutoTP training block. autotp_size 0 (its default) means off. zerotk splits nothing
    // by itself: the model is written with zerotk::parallel's layers and declares its splits, so the
    // keys that steer DeepSpeed's automatic module replacement have no effect here.
    Block t(*this, root.get_object("tensor_parallel"), root.path_of("tensor_parallel"));
    int autotp = 0;
    if (t.get_int("autotp_size", autotp, 0, kMaxInt) == Got::value && autotp > 0) {
      if (!from.empty() && autotp != tp) {
        error(t.path_of("autotp_size"),
              cat("differs from ", from, " (", std::to_string(tp), "): both set the tensor size; give one"),
              std::to_string(autotp));
      } else {
        tp = autotp;
        from = t.path_of("autotp_size");
      }
    }
    constexpr std::string_view kAuto =
        "has no effect in zerotk: it steers DeepSpeed's automatic module replacement, and zerotk's model declares "
        "its own splits (EngineOptions::tensor_split); ignored";
    t.finish({{"tp_overlap_comm", "false",
               "has no effect in zerotk: the tensor-parallel collectives run inside the model's own layers; ignored"},
              {"tp", "", kAuto},
              {"tensor_parallel", "", kAuto},
              {"dtype", "", kAuto},
              {"partition_config", "", kAuto},
              {"preset_model", "", kAuto},
              {"injection_policy_tuple", "", kAuto},
              {"keep_module_on_host", "false", kAuto},
              {"replace_with_kernel_inject", "false", kAuto},
              {"kernel_inject", "false", kAuto},
              {"vocab_parallel_lm_head", "false", kAuto},
              {"vocab_parallel_ce_backend", "", kAuto}});
  }
  return tp;
}

/// The stage count (the seeds' pipeline_parallelism block or DeepSpeed's pipeline block; the key it
/// came from into `pp_from`) and the pipeline's schedule, partition and checkpoint interval.
inline int Reader::read_pipeline_stages(Block& root, Config& c, std::string& pp_from) {
  constexpr int kMaxInt = std::numeric_limits<int>::max();
  // Pipeline: the seeds' block, and DeepSpeed's PipelineEngine block where its keys mean something.
  int pp = 1;
  {
    Block b(*this, root.get_object("pipeline_parallelism"), root.path_of("pipeline_parallelism"));
    if (b.get_int("num_stages", pp, 1, kMaxInt) == Got::value) pp_from = b.path_of("num_stages");
    std::string schedule = c.pipeline.schedule;
    if (b.get_string("schedule", schedule) == Got::value) {
      try {
        c.pipeline.schedule = pipeline::ScheduleSpec::parse(schedule).name();
      } catch (const config_error& e) {
        error(b.path_of("schedule"), e.message(), e.value());
      }
    }
    b.finish();
  }
  {
    Block b(*this, root.get_object("pipeline"), root.path_of("pipeline"));
    std::int64_t stages = 0;
    const Got g = b.get_int("stages", stages, 1, kMaxInt, /*auto_ok=*/true);
    if (g == Got::value) {
      if (!pp_from.empty() && stages != pp) {
        error(b.path_of("stages"), cat("differs from ", pp_from, " (", std::to_string(pp), "): both set the stage count; give one"),
              std::to_string(stages));
      } else {
        pp = static_cast<int>(stages);
        pp_from = b.path_of("stages");
      }
    }  // "auto" (DeepSpeed's default): the seeds' num_stages, or 1
    constexpr std::array<std::string_view, 3> kPartitions{"parameters", "uniform", "best"};
    std::size_t part = 0;
    if (b.get_choice("partition", part, kPartitions) == Got::value) {
      c.pipeline.partition = part == 1 ? PipelinePartition::uniform : PipelinePartition::parameters;
    }
    b.get_int("activation_checkpoint_interval", c.pipeline.activation_checkpoint_interval, 0,
              std::numeric_limits<std::int64_t>::max());
    b.finish({{"seed_layers", "false", "has no effect in zerotk: a stage's layers are initialised by the trainer; ignored"},
              {"pipe_partitioned", "true",
               "has no effect in zerotk: stages exchange whole activations (each tensor rank its own, under sequence "
               "parallel its tokens); ignored"},
              {"grad_partitioned", "true", "has no effect in zerotk: stages exchange whole gradients; ignored"}});
  }
  return pp;
}

inline void Reader::read_parallel(Block& root, Config& c) {
  constexpr int kMaxInt = std::numeric_limits<int>::max();
  std::string from, pp_from;  // the keys the tensor size and the stage count came from
  const int tp = read_tensor_size(root, from);
  c.tensor_parallel_size = tp;
  const int pp = read_pipeline_stages(root, c, pp_from);
  c.pipeline.stages = pp;
  int sp = 1;
  const bool sp_given = root.get_int("sequence_parallel_size", sp, 1, kMaxInt) == Got::value;

  const long long model = static_cast<long long>(tp) * pp;
  if (model > ctx.world_size || ctx.world_size % model != 0) {
    const std::string& key = pp > 1 && !pp_from.empty() ? pp_from : from;
    const std::string what = pp == 1 ? "" : tp == 1 ? "the pipeline stages " : cat("tensor x pipeline (", std::to_string(tp), " x ", std::to_string(pp), ") ");
    error(key,
          cat(what, "must divide the world size (", std::to_string(ctx.world_size),
              "): every data-parallel replica holds that many ranks"),
          std::to_string(pp > 1 && key == pp_from ? pp : tp));
    data_size_ = 1;  // the batch rules below then report in terms of what is left
    return;
  }
  data_size_ = static_cast<int>(ctx.world_size / model);
  c.data_parallel_size = data_size_;
  read_expert_size(root, c);
  // Context parallelism folds inside the data ranks (comm::GridShape::context): it must divide them.
  if (sp_given) {
    if (data_size_ % sp != 0) {
      error(root.path_of("sequence_parallel_size"),
            cat("must divide the data-parallel size (", std::to_string(data_size_), " = ", data_size_origin(c),
                "): each replica's sequences split over that many of its data ranks"),
            std::to_string(sp));
    } else {
      c.sequence_parallel_size = sp;
    }
  }
}

/// DeepSpeed's AutoEP block: `autoep_size` when `enabled` is the expert size of the grid (the experts
/// fold over each stage's data ranks with expert_tensor = tensor, so it must divide the data size).
/// Its module replacement (`preset_model`, `layer_specs`) has no C++ counterpart: the model declares
/// its experts.
inline void Reader::read_expert_size(Block& root, Config& c) {
  constexpr int kMaxInt = std::numeric_limits<int>::max();
  Block e(*this, root.get_object("expert_parallel"), root.path_of("expert_parallel"));
  bool enabled = false;
  int size = 1;
  e.get_bool("enabled", enabled);
  const Got got = e.get_int("autoep_size", size, 1, kMaxInt);
  if (enabled && got == Got::value) {
    if (data_size_ % size != 0) {
      error(e.path_of("autoep_size"),
            cat("must divide the data-parallel size (", std::to_string(data_size_), " = ", data_size_origin(c),
                "): expert parallelism folds over each stage's data ranks (expert_tensor = tensor)"),
            std::to_string(size));
    } else {
      c.expert_parallel_size = size;
    }
  }
  constexpr std::string_view kModel =
      "has no effect in zerotk: it steers DeepSpeed's automatic MoE module replacement, and zerotk's model declares "
      "its experts (Param::expert() or EngineOptions::expert; docs/moe.md); ignored";
  e.finish({{"preset_model", "", kModel}, {"layer_specs", "[]", kModel}});
}

inline void Reader::check_pipeline_schedule(Config& c) {
  if ((c.pipeline.stages == 1 && c.pipeline.schedule == "1f1b") || !diag.ok()) return;  // the batch is known good
  try {
    pipeline::check_runnable(pipeline::ScheduleSpec::parse(c.pipeline.schedule), c.pipeline.stages,
                             c.gradient_accumulation_steps);
  } catch (const config_error& e) {
    // The micro-batches a step runs are the accumulation steps.
    error("/pipeline_parallelism/schedule",
          cat(e.message(), "; the micro-batches per step are gradient_accumulation_steps (", std::to_string(c.gradient_accumulation_steps),
              ")"),
          e.value());
  }
}

}  // namespace zerotk::config::detail
