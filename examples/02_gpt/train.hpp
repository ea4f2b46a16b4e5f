// examples/02_gpt/train.hpp: one rank's training loop and train<Engine>(), included by the train_*.cpp
// files that compile it for the engine types of engines.hpp: data, the engine's layer scopes, activation
// checkpointing, checkpoints (--save, --load), the csv_monitor and progress line, and the summary.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <zerotk/activation.hpp>
#include <zerotk/checkpoint/save_16bit.hpp>
#include <zerotk/comm/grid.hpp>
#include <zerotk/comm/threads.hpp>
#include <zerotk/monitor/progress.hpp>
#include <zerotk/monitor/training_log.hpp>
#if ZEROTK_HAS_XXHASH
#include <zerotk/checkpoint.hpp>
#endif

#include "engines.hpp"
#include "tensor_group.hpp"

namespace gpt_demo {

/// --load: restores the engine from the checkpoint (its `latest` tag) and returns the step to go on
/// from, which the checkpoint's client state holds (the data stream is indexed by step). `tags`: the
/// config's checkpoint.tag_validation.
template <class Engine, class Grid>
int resume([[maybe_unused]] Engine& engine, [[maybe_unused]] Grid& grid, const Options& o,
           [[maybe_unused]] zerotk::config::TagValidation tags) {
  if (o.load_dir.empty()) return 0;
#if ZEROTK_HAS_XXHASH
  auto& comm = grid.world();
  zerotk::checkpoint::LoadOptions lo;
  lo.tag_validation = tags;
  if (!o.load_tag.empty()) lo.tag = o.load_tag;
  const zerotk::checkpoint::LoadResult r = zerotk::checkpoint::load(engine, grid, o.load_dir, lo);
  int step = 0;
  if (r.client_state.size() != sizeof step) {
    throw zerotk::usage_error("the checkpoint was not written by this demo (no step in its client state)", "--load",
                              o.load_dir + "/" + r.tag);
  }
  std::memcpy(&step, r.client_state.data(), sizeof step);
  if (comm.rank() == 0) {
    std::printf("loaded %s/%s: continuing after step %d", o.load_dir.c_str(), r.tag.c_str(), step);
    if (r.resharded) std::printf(" (saved on %d ranks, resharded)", r.saved_world_size);
    if (r.rank_local_restored) std::printf(" with every rank's compression error feedback");
    std::printf("\n");
  }
  return step;
#else
  throw zerotk::usage_error("this binary was built without libxxhash, so without checkpoints", "--load");
#endif
}

/// Finishes the save in flight, if any.
template <class Comm, class Pending>
void commit([[maybe_unused]] Comm& comm, Pending& pending) {  // comm: the grid's world
#if ZEROTK_HAS_XXHASH
  if (!pending) return;
  const auto r = pending->commit();
  pending.reset();
  if (comm.rank() == 0) std::printf("\nsaved %s\n", r.path.string().c_str());
#endif
}

/// --save: a checkpoint after `steps` optimizer steps (tag global_step<N>), the step in its client
/// state. With --save-async the files are written while training goes on: `pending` holds that save
/// until the next one (or the end of training) commits it. `tags`: checkpoint.tag_validation.
template <class Engine, class Grid, class Pending>
void save([[maybe_unused]] Engine& engine, [[maybe_unused]] Grid& grid, const Options& o, [[maybe_unused]] int steps,
          [[maybe_unused]] zerotk::config::TagValidation tags, [[maybe_unused]] Pending& pending) {
#if ZEROTK_HAS_XXHASH
  commit(grid.world(), pending);
  const auto bytes = std::as_bytes(std::span(&steps, 1));
  pending = zerotk::checkpoint::save_async(engine, grid, o.save_dir, {.client_state = bytes, .tag_validation = tags});
  if (!o.save_async) commit(grid.world(), pending);
#else
  throw zerotk::usage_error("this binary was built without libxxhash, so without checkpoints", "--save", o.save_dir);
#endif
}

/// The engine as the model's LayerScope, adding the time spent opening and closing each layer's
/// scope (gathers, waits for buckets or for slower ranks) to `*ms`. The engine's scopes can be
/// neither copied nor moved, so each is built in place inside its Timed.
template <class E>
struct TimedScope {
  using Clock = std::chrono::steady_clock;
  E* engine;
  double* ms;
  struct Stopwatch {
    double* ms;
    Clock::time_point t0;
    ~Stopwatch() { *ms += std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }
  };
  template <class Guard>
  struct Timed {
    Stopwatch close;  // destroyed after `guard`: times its closing
    Guard guard;
    template <class Open>
    Timed(double* ms, Open&& open) : close{ms, Clock::now()}, guard(open()) {
      *ms += std::chrono::duration<double, std::milli>(Clock::now() - close.t0).count();
    }
    Timed(const Timed&) = delete;
    Timed& operator=(const Timed&) = delete;
    ~Timed() { close.t0 = Clock::now(); }
  };
  template <class L>
  auto forward(L& layer) {
    return Timed<decltype(engine->forward(layer))>(ms, [&] { return engine->forward(layer); });
  }
  template <class L>
  auto backward(L& layer) {
    return Timed<decltype(engine->backward(layer))>(ms, [&] { return engine->backward(layer); });
  }
};

/// Activation checkpointing of the model's blocks for one rank: the meter reporting activation bytes
/// to the engine's ledger, the Checkpointing state from the config's activation_checkpointing block,
/// and the blocks --checkpoint-activations picks. Declared after the engine and destroyed before it
/// (and before the model), taking the Recompute layers off the model first.
struct Checkpointed {
  gpt::Gpt& model;
  zerotk::activation::Meter meter;
  zerotk::activation::Checkpointing ckpt;
  Checkpointed(gpt::Gpt& m, zerotk::MemoryLedger& ledger, const zerotk::config::Config& cfg,
               const zerotk::activation::Select& select)
      : model(m), meter(&ledger), ckpt(zerotk::activation::Options::from(cfg), &meter) {
    model.set_meter(&meter);
    model.checkpoint_blocks(ckpt, select);
  }
  Checkpointed(const Checkpointed&) = delete;
  Checkpointed& operator=(const Checkpointed&) = delete;
  ~Checkpointed() { detach(); }
  /// Plain blocks again, nothing reported (what the meter counted is given back to the ledger).
  void detach() {
    model.checkpoint_blocks(ckpt, zerotk::activation::Select::none());
    model.set_meter(nullptr);
    meter.clear();
  }
};


template <class Engine, class Comm>
void train_rank(Comm& comm, const TrainContext& ctx, Summary& summary, std::mutex& mu) {
  const Options& o = ctx.o;
  const int rank = comm.rank(), world = comm.size();
  // The config's grid: tensor ranks adjacent (Megatron's order), ZeRO over the data group. Every
  // tensor rank of a data group trains on that group's micro-batches.
  zerotk::comm::ProcessGrid grid(comm, zerotk::grid_shape(ctx.cfg));
  const int data_rank = grid.data_index(), data_size = grid.size(zerotk::comm::GridDim::data);
  const int tensor = grid.size(zerotk::comm::GridDim::tensor);
  gpt::Gpt model(ctx.model_config, gpt::tensor_parallel(grid.tensor(), o.sequence_parallel));
  zerotk::EngineOptions eo = zerotk::engine_options<Engine>(ctx.cfg);
  if (tensor > 1) eo.tensor_split = gpt::tensor_split;
  // No weight decay for biases, LayerNorm and embeddings (group 1).
  eo.groups = {zerotk::ParamGroup{eo.optimizer}, zerotk::ParamGroup{eo.optimizer}};
  eo.groups[1].options.weight_decay = 0.0f;
  eo.group_of = [](std::string_view name) -> std::uint32_t {
    const bool matrix = name.ends_with(".weight") && name.find("ln") == std::string_view::npos &&
                        !name.starts_with("wte") && !name.starts_with("wpe");
    return matrix ? 0 : 1;
  };
  eo.delayed_param_update = o.delayed_param_update;  // no DeepSpeed key: a flag of its own
  eo.delayed_param_update_start = o.delayed_param_update_start;
  // --slow-rank R:F: the detector clocks CPU time on every rank, and rank R spins (communication.hpp).
  const SlowRankFlag slow = o.slow_rank.empty() ? SlowRankFlag{} : parse_slow_rank(o.slow_rank);
  if (slow.on()) eo.communication.slow_ranks.clock_ms = thread_cpu_ms;
  SlowRankInjector inject_slowdown(slow, rank);
  Engine engine(grid, model, eo);
  {  // data rank 0's initial values become its data group's (at stage 3, written into the shards)
    auto g = engine.gather(model, 0);
    gpt::init_parameters(model, o.seed);
  }
  engine.initialize_master();
  if (auto s = zerotk::lr_scheduler(ctx.cfg)) engine.set_scheduler(*s);
  Checkpointed checkpointed(model, engine.memory(), ctx.cfg,
                            zerotk::activation::Select::parse(o.checkpoint_activations, "--checkpoint-activations"));
  const bool profile_recompute = ctx.cfg.activation_checkpointing.profile && model.checkpointed_blocks() > 0;
  const int start = resume(engine, grid, o, ctx.cfg.checkpoint.tag_validation);
#if ZEROTK_HAS_XXHASH
  std::unique_ptr<zerotk::checkpoint::PendingSave<Comm>> pending;
#else
  std::unique_ptr<int> pending;
#endif

  // After --load, samples/s, it/s, the ETA and tokens/s count only the steps this process runs.
  const std::int64_t start_samples = static_cast<std::int64_t>(start) * ctx.cfg.train_batch_size;
  zerotk::monitor::TrainingLogOptions log_options = zerotk::monitor::TrainingLogOptions::from(ctx.cfg, rank);
  log_options.start_samples = start_samples;
  zerotk::monitor::TrainingLog log(log_options);
  zerotk::monitor::ProgressLine progress(o.steps, std::cout, {.start_step = start});
  const int micro = static_cast<int>(ctx.cfg.train_micro_batch_size_per_gpu);
  const int gas = static_cast<int>(ctx.cfg.gradient_accumulation_steps);
  gpt::Batch batch;
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  double user_ms = 0, scope_ms = 0;  // user_ms includes scope_ms
  std::int64_t samples = start_samples;
  double last_loss = 0;
  std::uint64_t wire_bytes = 0, dense_bytes = 0;
  for (int step = start; step < o.steps; ++step) {
    zerotk::StepReport r;
    for (int m = 0; m < gas; ++m) {
      ctx.fill_batch(static_cast<std::uint64_t>(step * gas + m), data_rank, data_size, micro, batch);
      const auto u0 = Clock::now();
      const float loss = model.train_step(batch, TimedScope<Engine>{&engine, &scope_ms},
                                          static_cast<float>(engine.loss_scale()));
      user_ms += std::chrono::duration<double, std::milli>(Clock::now() - u0).count();
      r = engine.step(loss);
    }
    inject_slowdown.after_step(r);
    samples += ctx.cfg.train_batch_size;
    wire_bytes += r.comm_wire_bytes;
    dense_bytes += r.comm_dense_bytes;
    last_loss = r.loss;
    log.on_boundary_loss(r.loss, samples - ctx.cfg.train_batch_size);
    log.on_step(r, samples);
    if (rank == 0) progress.update(step + 1, r.loss);
    if (profile_recompute && rank == 0 && (step + 1) % ctx.cfg.steps_per_print == 0) {  // activation_checkpointing.profile
      std::printf("[Rank 0] step=%d, %s\n", step + 1, checkpointed.ckpt.profile_report().c_str());
      checkpointed.ckpt.clear_profile();
    }
    if (!o.save_dir.empty() && (step + 1 == o.steps || (o.save_every > 0 && (step + 1) % o.save_every == 0))) {
      save(engine, grid, o, step + 1, ctx.cfg.checkpoint.tag_validation, pending);
    }
  }
  // A run that loaded the step it was asked to reach has nothing to train: with --save it writes the
  // loaded state on this grid (a checkpoint moved to another tensor or data size, stage or world).
  if (!o.save_dir.empty() && start >= o.steps) save(engine, grid, o, start, ctx.cfg.checkpoint.tag_validation, pending);
  engine.settle();  // --delayed-param-update: the last step's update is published too
  commit(comm, pending);
  if (rank == 0) progress.finish();
  // Training's activation peak; evaluation below runs without checkpointing and without the meter.
  const std::size_t activation_peak = engine.memory().peak(zerotk::MemoryCategory::activations);
  const std::size_t checkpointed_blocks = model.checkpointed_blocks();
  checkpointed.detach();
  // DeepSpeed's stage3_gather_16bit_weights_on_model_save: the full 16-bit weights beside the checkpoints.
  if (!o.save_dir.empty() && ctx.cfg.zero_optimization.stage3_gather_16bit_weights_on_model_save) {
    const std::filesystem::path file = std::filesystem::path(o.save_dir) / "model_16bit.safetensors";
    zerotk::checkpoint::save_16bit_model(engine, model, comm, file);
    if (rank == 0) std::printf("wrote %s (stage3_gather_16bit_weights_on_model_save)\n", file.string().c_str());
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  {  // evaluation reads parameters outside the layers' scopes (stage 3: gathered for it); a split
     // model evaluates on every tensor rank of data group 0 together, on every token (no sequence
     // parallel: any batch fits), and rank 0 reports
    auto g = engine.gather(model);
    model.set_sequence_parallel(false);
    if (data_rank == 0) (void)ctx.evaluate(model, summary, rank == 0);
  }

  // Every rank's ledger, gathered (under MPI each process only sees its own).
  using Row = std::array<std::size_t, zerotk::kMemoryCategoryCount>;
  Row mine{};
  for (std::size_t c = 0; c < zerotk::kMemoryCategoryCount; ++c) {
    mine[c] = engine.memory().live(static_cast<zerotk::MemoryCategory>(c));
  }
  std::vector<Row> rows(static_cast<std::size_t>(world));
  comm.all_gather(mine.data(), rows.data(), sizeof(Row), zerotk::DType::uint8).wait();
  std::lock_guard lock(mu);
  summary.memory = rows;
  summary.activation_peak = std::max(summary.activation_peak, activation_peak);
  summary.checkpointed_blocks = checkpointed_blocks;
  if (rank == 0) {
    summary.psi = engine.parameter_count();
    summary.tensor = tensor;
    summary.data = data_size;
    summary.psi_model = 0;  // the whole model: each split parameter tensor x this rank's shard
    model.parameters([&](std::string_view name, gpt::Param& p) {
      summary.psi_model += tensor > 1 && gpt::tensor_split(name).is_split() ? p.numel() * static_cast<std::size_t>(tensor) : p.numel();
    });
    summary.padded = engine.flat_numel();
    summary.seconds = seconds;
    summary.steps_run = std::max(0, o.steps - start);
    const double tokens = static_cast<double>(samples - start_samples) * ctx.model_config.context;
    summary.tokens_per_s = tokens / seconds;
    // Wall time that is not the model's own forward/backward math: step(), and the opening and
    // closing of the layers' scopes (stage 3 gathers there; every stage waits there for slower ranks).
    const double total_ms = seconds * 1e3;
    summary.overhead = std::max(0.0, 1.0 - (user_ms - scope_ms) / total_ms);
    summary.final_loss = last_loss;
    summary.wire_bytes = wire_bytes;
    summary.dense_bytes = dense_bytes;
    summary.links = link_figures(engine);
    summary.params_disk = engine.memory().live(zerotk::MemorySpace::disk, zerotk::MemoryCategory::params16);
    summary.disk = engine.memory().live_total(zerotk::MemorySpace::disk) - summary.params_disk;
    if constexpr (requires { engine.param_bytes_in_cpu(); }) summary.params_in_cpu = engine.param_bytes_in_cpu();
    summary.pinned_other = engine.memory().live(zerotk::MemorySpace::pinned_host, zerotk::MemoryCategory::other);
    for (std::size_t sp = 0; sp < zerotk::kMemorySpaceCount; ++sp) {
      for (std::size_t c = 0; c < zerotk::kMemoryCategoryCount; ++c) {
        summary.spaces[sp][c] = engine.memory().live(static_cast<zerotk::MemorySpace>(sp), static_cast<zerotk::MemoryCategory>(c));
      }
    }
  }
}

template <class Engine>
void train(const TrainContext& ctx, [[maybe_unused]] MpiWorld* mpi_world, Summary& summary) {
  std::mutex mu;  // guards `summary`, which every rank of this process writes at the end
#if ZEROTK_HAS_MPI
  if (ctx.o.mpi) {
    train_rank<Engine>(*mpi_world, ctx, summary, mu);
    return;
  }
#endif
  // --ranks-per-node: the threads back end simulates nodes of that many ranks (docs/comm.md).
  zerotk::comm::run_threads(ctx.o.ranks, [&](zerotk::comm::ThreadsCommunicator& c) { train_rank<Engine>(c, ctx, summary, mu); },
                            {.ranks_per_node = ctx.o.ranks_per_node});
}

}  // namespace gpt_demo
