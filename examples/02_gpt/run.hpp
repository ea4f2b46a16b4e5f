// examples/02_gpt/engines.hpp: the engine types this binary is built with, what a run reports, and the
// declaration of train<Engine>(), one engine type's training. Every engine type here is one of the
// compiled engine set's (zerotk/engines/set.hpp): linked from zerotk::engines when it is built, so the
// training loops compile without the engines' weight. train<E> is compiled in files of its own (train_stages.cpp, train_offload.cpp,
// train_compressed.cpp, train_lion.cpp) that build side by side; main.cpp's dispatch only names the types, and a type
// it names that none of them compiles fails to link.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include <zerotk/engine_config.hpp>
#include <zerotk/engines.hpp>  // the compiled engine set (zerotk::engines), when linked
#if ZEROTK_HAS_MPI
#include <zerotk/comm/mpi.hpp>
#endif

#include "communication.hpp"
#include "evaluate.hpp"
#include "gpt.hpp"
#include "options.hpp"

namespace gpt_demo {

// The engine types this binary is compiled with; dispatch picks the one the config asks for. Each
// engine type is compiled in full, so only what the flags reach is listed: every stage and precision
// without offload; --offload-optimizer cpu at stages 1-3 in bf16; --offload-param cpu at stage 3 in
// bf16 (alone or with the optimizer offloaded) and fp32 (with both); --offload-optimizer nvme at stage 3
// in bf16 (alone, with --offload-param cpu or with --offload-param nvme); --offload-param nvme with the
// optimizer state offloaded to cpu or not offloaded, in bf16. A config asking for another
// combination gets dispatch's error naming every candidate. train_stages.cpp, train_offload.cpp,
// train_compressed.cpp and train_lion.cpp compile train<E> for them.
template <int S, class P, class... Offloads>
using E = zerotk::Engine<zerotk::Partitioner<zerotk::Stage<S>>, zerotk::Optimizer<zerotk::AdamW>, zerotk::Precision<P>,
                         Offloads...>;
/// --optimizer onebitadam: 1-bit Adam runs at stage 0 (DeepSpeed's rule too).
template <class P>
using OneBit = zerotk::Engine<zerotk::Partitioner<zerotk::Stage<0>>, zerotk::Optimizer<zerotk::OneBitAdam>,
                              zerotk::Precision<P>>;
/// --optimizer zerooneadam: 0/1 Adam at stage 0, in fp32 in this binary.
using ZeroOne = zerotk::Engine<zerotk::Partitioner<zerotk::Stage<0>>, zerotk::Optimizer<zerotk::ZeroOneAdam>,
                               zerotk::Precision<zerotk::fp32>>;
/// --optimizer onebitlamb: 1-bit LAMB at stage 0, in fp32 in this binary.
using OneBitLambE = zerotk::Engine<zerotk::Partitioner<zerotk::Stage<0>>, zerotk::Optimizer<zerotk::OneBitLamb>,
                                   zerotk::Precision<zerotk::fp32>>;
/// --optimizer lion: DeepSpeed's Lion (one moment, a sign update) at stages 1-3 in bf16, and at stage 3
/// with the optimizer state offloaded to cpu; the same ZeRO machinery as AdamW, half its state.
template <int S, class... Offloads>
using LionE = zerotk::Engine<zerotk::Partitioner<zerotk::Stage<S>>, zerotk::Optimizer<zerotk::Lion>,
                             zerotk::Precision<zerotk::bf16>, Offloads...>;
/// --compress: gradient compression at stage 0, in fp32 in this binary.
template <class Codec>
using Compressed = zerotk::Engine<zerotk::Partitioner<zerotk::Stage<0>>, zerotk::Optimizer<zerotk::AdamW>,
                                  zerotk::Precision<zerotk::fp32>, zerotk::GradientCompression<Codec>>;
using OptCpu = zerotk::Offload<zerotk::Cpu>;
using OptNvme = zerotk::Offload<zerotk::Nvme>;
using ParamCpu = zerotk::OffloadParams<zerotk::Cpu>;
using ParamNvme = zerotk::OffloadParams<zerotk::Nvme>;

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
  LinkFigures links;              ///< rank 0's bytes per link level and through qwZ / qgZ (communication.hpp)
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
};

#if ZEROTK_HAS_MPI
using MpiWorld = zerotk::comm::MpiCommunicator;
#else
struct MpiWorld {  // never constructed: --mpi is refused without MPI
  int size() const { return 1; }
  int rank() const { return 0; }
};
#endif

/// Trains `Engine` on the run's ranks (threads, or this process's MPI rank when `ctx.o.mpi`) and fills
/// `summary` (rank 0's view). Compiled in train_*.cpp for every engine type above.
template <class Engine>
void train(const TrainContext& ctx, MpiWorld* mpi_world, Summary& summary);

}  // namespace gpt_demo
