#pragma once
/// \file zerotk/config/checkpointing.hpp
/// `csv_monitor`, `activation_checkpointing`, `checkpoint` and `gradient_compression`:
/// Reader::read_monitor_and_checkpointing, read_checkpoint, read_gradient_compression. Declared in
/// config/reader.hpp and defined here (reader.hpp includes this file at its end), so one block's keys live
/// in one file.

#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "zerotk/config/options.hpp"
#include "zerotk/config/reader.hpp"

namespace zerotk::config::detail {

inline void Reader::read_monitor_and_checkpointing(Block& root, Config& c) {
  {
    Block b(*this, root.get_object("csv_monitor"), root.path_of("csv_monitor"));
    b.get_bool("enabled", c.csv_monitor.enabled);
    b.get_string("output_path", c.csv_monitor.output_path);
    if (b.get_string("job_name", c.csv_monitor.job_name) == Got::value && c.csv_monitor.job_name.empty()) {
      error(b.path_of("job_name"), "must not be empty (it names the output directory)", "\"\"");
    }
    b.finish();
  }
  {
    Block b(*this, root.get_object("activation_checkpointing"), root.path_of("activation_checkpointing"));
    auto& a = c.activation_checkpointing;
    b.get_bool("partition_activations", a.partition_activations);
    b.get_bool("contiguous_memory_optimization", a.contiguous_memory_optimization);
    b.get_bool("cpu_checkpointing", a.cpu_checkpointing);
    std::int64_t n = 0;
    const Json* nj = b.find("number_checkpoints");
    if (nj && !nj->is_null() && b.get_int("number_checkpoints", n, 1, std::numeric_limits<std::int64_t>::max()) == Got::value) {
      a.number_checkpoints = n;
    }
    b.get_bool("synchronize_checkpoint_boundary", a.synchronize_checkpoint_boundary);
    b.get_bool("profile", a.profile);
    b.finish();
    if (a.partition_activations) {
      unsupported(b.path_of("partition_activations"),
                  "has no effect in zerotk: it would split the saved block inputs across the tensor-parallel group, "
                  "and zerotk's Recompute keeps each rank's whole (under sequence parallel they are split already); "
                  "ignored",
                  "true");
    }
    // DeepSpeed's checkpointing.configure() asserts these two (cpu_checkpointing alone is allowed).
    if (a.contiguous_memory_optimization && !a.partition_activations) {
      error(b.path_of("contiguous_memory_optimization"), "needs \"partition_activations\": true", "true");
    }
    if (a.contiguous_memory_optimization && !a.number_checkpoints) {
      error(b.path_of("number_checkpoints"), "required by contiguous_memory_optimization (the number of checkpointed layers)");
    }
  }
  read_checkpoint(root, c);
}

inline void Reader::read_checkpoint(Block& root, Config& c) {
  // DeepSpeed upper-cases tag_validation before checking it; get_choice is case-insensitive too.
  Block b(*this, root.get_object("checkpoint"), root.path_of("checkpoint"));
  auto& k = c.checkpoint;
  constexpr std::array<std::string_view, 3> kModes{"Ignore", "Warn", "Fail"};  // TagValidation's order
  std::size_t mode = 0;
  if (b.get_choice("tag_validation", mode, kModes) == Got::value) k.tag_validation = static_cast<TagValidation>(mode);
  b.get_bool("load_universal", k.load_universal);
  b.get_bool("use_node_local_storage", k.use_node_local_storage);
  {
    Block p(*this, b.get_object("parallel_write"), b.path_of("parallel_write"));
    p.get_bool("pipeline_stage", k.parallel_write_pipeline_stage);
    p.finish();
  }
  b.finish({{"checkpoint_serialization",
             {},
             "has no effect in zerotk: it chooses torch.save's serialization, and zerotk writes its own "
             "format (docs/checkpoint.md); ignored"},
            {"writer",
             {},
             "has no effect in zerotk: checkpoints are written by zerotk's own writer (fsync, then atomic "
             "rename); to write beside training use checkpoint::save_async (docs/checkpoint.md); ignored"}});
  if (k.load_universal) {
    unsupported(b.path_of("load_universal"),
                "has no effect in zerotk: every zerotk checkpoint loads on any data-parallel size and ZeRO stage, "
                "resharded online (docs/checkpoint.md), so there is no universal format to ask for; ignored",
                "true");
  }
  if (k.use_node_local_storage) {
    unsupported(b.path_of("use_node_local_storage"),
                "not supported by zerotk: every rank reads the manifest rank 0 writes, so all ranks must see one "
                "shared checkpoint directory; ignored",
                "true");
  }
  if (k.parallel_write_pipeline_stage) {
    unsupported(join_path(b.path_of("parallel_write"), "pipeline_stage"),
                "has no effect in zerotk: every rank (of every pipeline stage) already writes its own file at once; "
                "ignored",
                "true");
  }
}

inline void Reader::read_gradient_compression(Block& root, Config& c) {
  // SEMANTICS.md section 9b. topk_ratio and huffman_coding are accepted without an algorithm (published
  // configs carry them): no algorithm means no compression, and they do nothing.
  Block b(*this, root.get_object("gradient_compression"), root.path_of("gradient_compression"));
  auto& g = c.gradient_compression;
  constexpr std::array<std::string_view, 3> kAlgorithms{"topk", "2bit", "1bit"};  // CompressionAlgorithm's order
  std::size_t a = 0;
  if (b.get_choice("algorithm", a, kAlgorithms, /*nullable=*/true) == Got::value) {
    g.algorithm = static_cast<CompressionAlgorithm>(a);
  }
  b.get_number("topk_ratio", g.topk_ratio, 0.0, /*lo_open=*/true, 1.0);
  b.get_bool("huffman_coding", g.huffman_coding);
  b.finish();
}

}  // namespace zerotk::config::detail
