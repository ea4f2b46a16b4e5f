// examples/02_gpt/run.hpp: what one run is (the flags, the config, the model's shape and task), what it
// reports, and train(), which trains it: over zerotk::AnyEngine, so the engine the config asks for is
// picked at run time from the compiled engine set (zerotk::engines) and this example compiles none of
// the engines itself. train() is compiled in train.cpp; main.cpp asks zerotk::compiled_engine_for
// first, so a config no compiled engine fits is refused before any rank starts.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include <optional>

#include <zerotk/context/sparsity.hpp>
#include <zerotk/core/memory.hpp>
#include <zerotk/config/options.hpp>
#if ZEROTK_HAS_MPI
#include <zerotk/comm/mpi.hpp>
#endif

#include "communication.hpp"
#include "evaluate.hpp"
#include "gpt.hpp"
#include "options.hpp"

namespace gpt_demo {

/// What rank 0 reports at the end (filled after training).
struct Summary {
  std::vector<std::array<std::size_t, zerotk::kMemoryCategoryCount>> memory;  // per rank
  /// Rank 0's bytes per memory space (MemorySpace's order) and category: where each row lives.
  std::array<std::array<std::size_t, zerotk::kMemoryCategoryCount>, zerotk::kMemorySpaceCount> spaces{};
  std::size_t psi = 0, padded = 0;  ///< rank 0's parameters (its tensor shard) and its padded flat buffer
  std::size_t psi_model = 0;         ///< the whole model's parameters
  int tensor = 1, data = 1;          ///< the grid: tensor ranks x data ranks
  int pipeline = 1;                  ///< ... x pipeline stages
  double accuracy = 0, digit_accuracy = 0, seconds = 0, tokens_per_s = 0, overhead = 0;
  double final_loss = 0;
  int steps_run = 0;  ///< optimizer steps this process ran (after --load: from the loaded step on)
  std::size_t activation_peak = 0;  ///< the largest rank's peak of activation bytes (this process's ranks)
  std::size_t checkpointed_blocks = 0;
  std::size_t disk = 0;          ///< rank 0's bytes on disk of Offload<Nvme>'s swap files
  std::size_t pinned_other = 0;  ///< rank 0's pinned host bytes of category `other` (Offload<Nvme>'s swap buffers)
  std::size_t params_disk = 0;   ///< rank 0's parameter shard on disk (OffloadParams<Nvme>: two slots, padded)
  std::size_t params_in_cpu = 0; ///< rank 0's blocks of that shard kept in pinned host memory instead (max_in_cpu; two copies)
  std::uint64_t wire_bytes = 0;   ///< rank 0's bytes sent over the run (StepReport::comm_wire_bytes, summed)
  std::uint64_t dense_bytes = 0;  ///< ... and what it would have sent without compression (comm_dense_bytes)
  std::uint64_t context_bytes = 0;  ///< rank 0's bytes sent by its blocks' attention over the context group (--cp)
  LinkFigures links;              ///< rank 0's bytes per link level and through qwZ / qgZ (communication.hpp)
  gpt::ExpertLoad experts;  ///< --experts: the load over the run, every layer and data rank (kept empty without)
};

/// One run: the flags, the config they became (or --config's), the model's shape, and the task (the
/// digit task or a text corpus) behind two calls made once per micro-batch and once per run.
struct TrainContext {
  using FillBatch = std::function<void(std::uint64_t index, int rank, int world, int micro_batch, gpt::Batch& out)>;
  /// Runs on every rank of data group 0 (a split model evaluates on its tensor ranks together);
  /// `report` (world rank 0) prints and fills the summary.
  using Evaluate = std::function<double(const gpt::LogitsOf& logits, Summary& summary, bool report)>;
  const Options& o;
  const zerotk::config::Config& cfg;
  const gpt::Config& model_config;
  FillBatch fill_batch;  ///< micro-batch `index` of the data stream, data rank `rank`'s share of it (of `world` data ranks)
  Evaluate evaluate;     ///< after training: held-out accuracy, printed and stored in the summary by rank 0
  /// The blocks' attention through gpt::ContextAttention (--cp, --sparse-attention or the config's
  /// sparse_attention block), with this layout config (empty: dense).
  bool context_attention = false;
  std::optional<zerotk::context::SparsityConfig> sparse;
};

#if ZEROTK_HAS_MPI
using MpiWorld = zerotk::comm::MpiCommunicator;
#else
struct MpiWorld {  // never constructed: --mpi is refused without MPI
  int size() const { return 1; }
  int rank() const { return 0; }
};
#endif

/// Trains the run on its ranks (threads, or this process's MPI rank when `ctx.o.mpi`) with the
/// compiled engine the config asks for, and fills `summary` (rank 0's view). Compiled in train.cpp.
void train(const TrainContext& ctx, MpiWorld* mpi_world, Summary& summary);

}  // namespace gpt_demo
