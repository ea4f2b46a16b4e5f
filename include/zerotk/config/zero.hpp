#pragma once
/// \file zerotk/config/zero.hpp
/// The `zero_optimization` block (offload, ZeRO++, the module-type lists) and `aio`: Reader::read_zero,
/// read_module_types, read_aio. Declared in config/reader.hpp and defined here (reader.hpp includes this
/// file at its end), so one block's keys live in one file.

#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "zerotk/config/options.hpp"
#include "zerotk/config/reader.hpp"

namespace zerotk::config::detail {

inline void Reader::read_module_types(const Json* m, const std::string& path, std::vector<std::string>& names) {
  if (m == nullptr || m->is_null()) return;
  if (!m->is_array()) {
    error(path, "expected an array of module type names, e.g. [\"LayerNorm\"]", show(*m));
    return;
  }
  for (std::size_t i = 0; i < m->size(); ++i) {
    const Json& e = (*m)[i];
    const std::string at = path + "/" + std::to_string(i);
    if (!e.is_string() || e.get_ref<const std::string&>().empty()) {
      error(at, "expected a module type name (a non-empty string)", show(e));
    } else if (std::find(names.begin(), names.end(), e.get_ref<const std::string&>()) != names.end()) {
      error(at, "listed twice", show(e));
    } else {
      names.push_back(e.get<std::string>());
    }
  }
}

constexpr std::array<std::string_view, 3> kDevices{"none", "cpu", "nvme"};

/// A nullable string key into a path (absent or null: unchanged).
inline void read_path(Block& b, std::string_view key, std::filesystem::path& out) {
  std::string s;
  if (b.get_string(key, s, true) == Got::value) out = s;
}

/// stage3_gather_16bit_weights_on_model_save, under its three names.
inline void Reader::read_gather_16bit(Block& b, ZeroOptions& z) {
  std::string used;
  const Json* g16 = b.find("stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save", &used);
  const Json* gfp16 = b.find("stage3_gather_fp16_weights_on_model_save");
  if (g16 && gfp16) {
    error(b.path_of("stage3_gather_fp16_weights_on_model_save"),
          "given together with its replacement \"stage3_gather_16bit_weights_on_model_save\"; keep that one",
          show(*gfp16));
  } else if (gfp16) {
    used = "stage3_gather_fp16_weights_on_model_save";
    note(Notice::Kind::deprecated, b.path_of(used), "old name of \"stage3_gather_16bit_weights_on_model_save\"");
    g16 = gfp16;
  }
  if (g16 && b.typed(used, g16, g16->is_boolean(), "true or false")) {
    z.stage3_gather_16bit_weights_on_model_save = g16->get<bool>();
  }
}

/// ZeRO++ hpZ (zero_hpz_partition_size).
inline void Reader::read_hpz(Block& b, Config& c) {
  ZeroOptions& z = c.zero_optimization;
  // ZeRO++ hpZ: a secondary shard of the parameters within groups of g consecutive ranks. Only stage 3
  // partitions parameters (DeepSpeed reads the key there alone); g must divide the world size.
  int hpz = 1;
  if (b.get_int("zero_hpz_partition_size", hpz, 1, std::numeric_limits<int>::max()) == Got::value && hpz > 1) {
    const std::string g = std::to_string(hpz);
    if (z.stage != 3) {
      unsupported(b.path_of("zero_hpz_partition_size"),
                  cat("has effect only at ZeRO stage 3 (stage is ", std::to_string(z.stage),
                      "; DeepSpeed ignores it too); ignored"),
                  g);
    } else if (data_size_ % hpz != 0) {
      error(b.path_of("zero_hpz_partition_size"),
            data_size_ == ctx.world_size
                ? cat("must divide the world size (", std::to_string(ctx.world_size),
                      "): hpZ keeps a secondary shard within groups of that many consecutive ranks")
                : cat("must divide the data-parallel size (", std::to_string(data_size_), " = ", data_size_origin(c),
                      "): hpZ keeps a secondary shard within groups of that many consecutive ranks"),
            g);
    } else {
      z.stage3.reshard_after_forward = zero::ReshardAfterForward::group(hpz);
    }
  }
}

/// The bucket and stage-3 sizes, with "auto" resolved from the model's hidden size.
inline void Reader::read_zero_sizes(Block& b, ZeroOptions& z) {
  constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
  zero::Stage3Options& s3 = z.stage3;
  // Sizes HF's integration fills from the model's hidden size H.
  const auto h = ctx.hidden_size;
  const std::string hidden_hint = "write a number of elements, or give the model's hidden size (zerotk-config --hidden H)";
  // Elements, as DeepSpeed counts them, in both groups (and as the engine takes them).
  if (b.get_count("reduce_bucket_size", z.reduce_bucket_size, 1, kMax, true) == Got::automatic) {
    resolve_auto(b.path_of("reduce_bucket_size"), z.reduce_bucket_size,
                 h ? std::optional(static_cast<std::size_t>(*h * *h)) : std::nullopt, "hidden size squared", hidden_hint);
  }
  // stage3_* sizes mean nothing below stage 3: an unresolvable "auto" there keeps the default.
  auto stage3_auto = [&](std::string_view key, std::size_t& out, std::optional<std::size_t> from_h,
                         std::string_view how) {
    if (from_h) {
      resolve_auto(b.path_of(key), out, from_h, how);
    } else if (z.stage < 3) {
      resolve_auto(b.path_of(key), out, std::optional(out), "default; unused below stage 3");
    } else {
      resolve_auto(b.path_of(key), out, std::optional<std::size_t>(), how, hidden_hint);
    }
  };
  if (b.get_count("stage3_prefetch_bucket_size", s3.prefetch_bucket_size, 0, kMax, true, "prefetch_bucket_size") ==
      Got::automatic) {
    std::optional<std::size_t> v;
    if (h) v = static_cast<std::size_t>(0.9 * static_cast<double>(*h) * static_cast<double>(*h));
    stage3_auto("stage3_prefetch_bucket_size", s3.prefetch_bucket_size, v, "0.9 x hidden size squared");
  }
  if (b.get_count("stage3_param_persistence_threshold", s3.param_persistence_threshold, 0, kMax, true,
                  "param_persistence_threshold") == Got::automatic) {
    stage3_auto("stage3_param_persistence_threshold", s3.param_persistence_threshold,
                h ? std::optional(static_cast<std::size_t>(10 * *h)) : std::nullopt, "10 x hidden size");
  }
}

/// offload_optimizer and offload_param (and the deprecated booleans that map onto them).
inline void Reader::read_offload(Block& b, ZeroOptions& z) {
  // Offload blocks. The deprecated booleans map onto them as DeepSpeed does.
  const Json* oo = b.get_object("offload_optimizer");
  const Json* op = b.get_object("offload_param");
  {
    bool cpu_offload = false;
    if (b.get_bool("cpu_offload", cpu_offload) == Got::value) {
      note(Notice::Kind::deprecated, b.path_of("cpu_offload"), "deprecated; use \"offload_optimizer\": {\"device\": \"cpu\"}");
      if (cpu_offload && oo) {
        error(b.path_of("cpu_offload"), "given together with \"offload_optimizer\"; keep offload_optimizer", "true");
      } else if (cpu_offload) {
        z.offload_optimizer.device = OffloadDevice::cpu;
      }
    }
    bool cpu_offload_param = false;
    if (b.get_bool("cpu_offload_param", cpu_offload_param) == Got::value) {
      note(Notice::Kind::deprecated, b.path_of("cpu_offload_param"), "deprecated; use \"offload_param\": {\"device\": \"cpu\"}");
      if (cpu_offload_param && op) {
        error(b.path_of("cpu_offload_param"), "given together with \"offload_param\"; keep offload_param", "true");
      } else if (cpu_offload_param) {
        z.offload_param.device = OffloadDevice::cpu;
      }
    }
  }
  if (oo) {
    Block o(*this, oo, b.path_of("offload_optimizer"));
    auto& x = z.offload_optimizer;
    offload::NvmeOptions& n = z.nvme;  // the swap keys: offload's own options
    std::size_t dev = 0;
    if (o.get_choice("device", dev, kDevices) == Got::value) x.device = static_cast<OffloadDevice>(dev);
    read_path(o, "nvme_path", n.path);
    o.get_count("buffer_count", n.buffer_count, 1);
    o.get_bool("pin_memory", x.pin_memory);
    o.get_bool("pipeline_read", n.pipeline_read);
    o.get_bool("pipeline_write", n.pipeline_write);
    // Partial offload: DeepSpeed asserts stage 3 for any ratio < 1 (zero/config.py), device or not.
    double ratio = 1.0;
    if (o.get_number("ratio", ratio, 0, false, 1) == Got::value && ratio < 1.0) {
      if (z.stage != 3) {
        error(o.path_of("ratio"),
              cat("partial optimizer offload (ratio < 1) needs ZeRO stage 3 (stage is ", std::to_string(z.stage), ")"),
              num_text(ratio));
      } else {
        unsupported(o.path_of("ratio"), "not supported by zerotk yet; ignored", num_text(ratio));
      }
    }
    o.finish({{"fast_init", "false"},
              {"super_offload", "false"},
              {"cpuadam_cores_perc", "0.8"}});
  }
  if (op) {
    Block o(*this, op, b.path_of("offload_param"));
    auto& x = z.offload_param;
    offload::ParamNvmeOptions& n = z.param_nvme;  // the swap keys: offload's own options
    std::size_t dev = 0;
    if (o.get_choice("device", dev, kDevices) == Got::value) x.device = static_cast<OffloadDevice>(dev);
    read_path(o, "nvme_path", n.path);
    o.get_count("buffer_count", n.buffer_count, 1);
    o.get_count("buffer_size", n.buffer_size, 1);
    o.get_count("max_in_cpu", n.max_in_cpu, 0);
    o.get_bool("pin_memory", x.pin_memory);
    o.finish();
  }
}

inline void Reader::read_zero(Block& root, Config& c) {
  constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
  const Json* zj = root.find("zero_optimization");
  if (zj && zj->is_boolean()) {
    // DeepSpeed's oldest form: "zero_optimization": true means stage 1.
    c.zero_optimization.stage = zj->get<bool>() ? 1 : 0;
    note(Notice::Kind::deprecated, root.path_of("zero_optimization"),
         cat("boolean form is deprecated; read as stage ", std::to_string(c.zero_optimization.stage)));
    zj = nullptr;
  } else {
    zj = root.get_object("zero_optimization");
  }
  Block b(*this, zj, root.path_of("zero_optimization"));
  ZeroOptions& z = c.zero_optimization;
  b.get_int("stage", z.stage, 0, 3);
  b.get_bool("contiguous_gradients", z.contiguous_gradients);
  b.get_bool("reduce_scatter", z.reduce_scatter);
  b.get_bool("allgather_partitions", z.allgather_partitions);
  b.get_int("allgather_bucket_size", z.allgather_bucket_size, 1, kMax);
  z.overlap_comm = z.stage == 3;  // DeepSpeed's default depends on the stage
  b.get_bool("overlap_comm", z.overlap_comm);
  b.get_bool("load_from_fp32_weights", z.load_from_fp32_weights);
  b.get_count("sub_group_size", z.sub_group_size, 1);
  zero::Stage3Options& s3 = z.stage3;  // stage 3's own options, filled in place
  b.get_count("stage3_max_live_parameters", s3.max_live_parameters, 0, kMax, false, "max_live_parameters");
  b.get_count("stage3_max_reuse_distance", s3.max_reuse_distance, 0, kMax, false, "max_reuse_distance");
  b.get_count("stage3_model_persistence_threshold", s3.model_persistence_threshold, 0, kMax, false,
              "model_persistence_threshold");
  read_gather_16bit(b, z);
  read_hpz(b, c);
  read_quantized(b, z);  // ZeRO++ qwZ / qgZ, config/communication.hpp
  b.get_bool("ignore_unused_parameters", z.ignore_unused_parameters);
  b.get_bool("round_robin_gradients", z.round_robin_gradients);

  read_zero_sizes(b, z);
  read_offload(b, z);
  b.finish({{"cpu_offload_use_pin_memory", "", "deprecated; use pin_memory in offload_param or offload_optimizer"},
            {"elastic_checkpoint", "false"},
            {"legacy_stage1", "false"},
            {"use_multi_rank_bucket_allreduce", "true"},
            {"zero_quantized_nontrainable_weights", "false"},
            {"zeropp_loco_param"},
            {"mics_shard_size", "-1"},
            {"mics_hierarchical_params_gather", "false"},
            {"memory_efficient_linear", "true", kTorchOnly},
            {"override_module_apply", "true", kTorchOnly},
            {"pipeline_loading_checkpoint", "false"},
            {"log_trace_cache_warnings", "false"},
            {"enable_sanity_checks", "false"},
            {"save_muon_momentum_buffer_in_memory", "false"},
            {"leaf_module", "{}", kTorchOnly},
            {"zenflow"},
            {"stage3_module_granularity_threshold", "0"},
            {"stage3_use_all_reduce_for_fetch_params", "false"},
            {"stage3_allgather_sequential", "false"}});
}

inline void Reader::read_aio(Block& root, Config& c) {
  Block b(*this, root.get_object("aio"), root.path_of("aio"));
  io::AioOptions& a = c.zero_optimization.nvme.aio;  // the I/O layer's own options, shared by both swap files
  b.get_count("block_size", a.block_size, 1, std::int64_t{1} << 30);
  std::int64_t v = a.queue_depth;
  if (b.get_int("queue_depth", v, 1, 4096) == Got::value) a.queue_depth = static_cast<int>(v);
  v = a.intra_op_parallelism;
  if (b.get_int("intra_op_parallelism", v, 1, 64, false, "thread_count") == Got::value) {
    a.intra_op_parallelism = static_cast<int>(v);
    if (b.find("thread_count") && !b.find("intra_op_parallelism")) {
      note(Notice::Kind::deprecated, b.path_of("thread_count"), "old name of \"intra_op_parallelism\"");
    }
  }
  b.get_bool("single_submit", a.single_submit);
  b.get_bool("overlap_events", a.overlap_events);
  b.finish({{"use_gds", "false"}});
}

}  // namespace zerotk::config::detail
