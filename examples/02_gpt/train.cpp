// examples/02_gpt/train.cpp: one rank's training loop and train() (run.hpp): data, the engine's layer
// scopes, activation checkpointing, checkpoints (--save, --load), the csv_monitor and progress line,
// and the summary. The engine is a zerotk::AnyEngine (replica.hpp), so this file is compiled once,
// for the threads and the MPI communicator, whichever engine a run asks for.

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
#include <zerotk/any_engine.hpp>
#include <zerotk/checkpoint/save_16bit.hpp>
#include <zerotk/comm/grid.hpp>
#include <zerotk/comm/threads.hpp>
#include <zerotk/compress/quantized_collectives.hpp>
#include <zerotk/core/glob.hpp>
#include <zerotk/engine/options.hpp>
#include <zerotk/engine_config.hpp>  // grid_shape
#include <zerotk/monitor/progress.hpp>
#include <zerotk/monitor/training_log.hpp>
#if ZEROTK_HAS_XXHASH
#include <zerotk/checkpoint.hpp>
#include <zerotk/checkpoint/export.hpp>
#endif

#include "replica.hpp"
#include "run.hpp"
#include "tensor_group.hpp"

namespace gpt_demo {
namespace {

#if ZEROTK_HAS_XXHASH
/// The model's structure beyond its parameters' shapes, recorded in every checkpoint and compared on
/// --load: another head count has the same shapes (issue 57 item 12).
zerotk::checkpoint::ModelStructure model_structure(const gpt::Config& c) {
  zerotk::checkpoint::ModelStructure s{{"heads", std::to_string(c.n_heads)},
                                       {"tied_head", c.tied_head ? "yes" : "no"},
                                       {"model", "examples/02_gpt"}};
  if (c.experts > 0) {  // recorded only for a model with experts, so dense checkpoints stay as they were
    s.emplace("experts", std::to_string(c.experts));
    s.emplace("top_k", std::to_string(c.top_k));
  }
  return s;
}
#endif

/// --load: restores the engine from the checkpoint (its `latest` tag) and returns the step to go on
/// from, which the checkpoint's client state holds (the data stream is indexed by step). `tags`: the
/// config's checkpoint.tag_validation.
template <class Engine, class Grid>
int resume([[maybe_unused]] Engine& engine, [[maybe_unused]] Grid& grid, const Options& o,
           [[maybe_unused]] zerotk::config::TagValidation tags, [[maybe_unused]] const gpt::Config& model_config) {
  if (o.load_dir.empty()) return 0;
#if ZEROTK_HAS_XXHASH
  auto& comm = grid.world();
  zerotk::checkpoint::LoadOptions lo;
  lo.tag_validation = tags;
  lo.model_structure = model_structure(model_config);
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
          [[maybe_unused]] zerotk::config::TagValidation tags, [[maybe_unused]] Pending& pending,
          [[maybe_unused]] const gpt::Config& model_config) {
#if ZEROTK_HAS_XXHASH
  commit(grid.world(), pending);
  const auto bytes = std::as_bytes(std::span(&steps, 1));
  pending = zerotk::checkpoint::save_async(engine, grid, o.save_dir,
                                          {.client_state = bytes, .tag_validation = tags, .model_structure = model_structure(model_config)});
  if (!o.save_async) commit(grid.world(), pending);
#else
  throw zerotk::usage_error("this binary was built without libxxhash, so without checkpoints", "--save", o.save_dir);
#endif
}

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

/// What this example's model adds to the engine options the config gives: no weight decay for
/// biases, LayerNorms and embeddings (group 1), the flags that are no config key, and which
/// parameters are experts' (by name: moe_mlp.hpp names them blocks.<i>.mlp.experts.<e>.*). (The
/// tensor split is the parameters' own: gpt::Linear's SplitParams declare it.)
zerotk::EngineOptionsEdit gpt_engine_edit(const Options& o) {
  return [&o](zerotk::EngineOptions& eo) {
    if (o.experts > 0) eo.expert = gpt::is_expert_param;
    eo.groups = {zerotk::ParamGroup{eo.optimizer}, zerotk::ParamGroup{eo.optimizer}};
    eo.groups[1].options.weight_decay = 0.0f;
    eo.group_of = [](std::string_view name) -> std::uint32_t {
      const bool matrix = name.ends_with(".weight") && name.find("ln") == std::string_view::npos &&
                          !name.starts_with("wte") && !name.starts_with("wpe");
      return matrix ? 0 : 1;
    };
    if (o.sparsity != "none") {  // --sparsity 2:4 (sparse_engine.hpp): no DeepSpeed key either
      eo.sparsity.start_step = o.sparse_from;
      eo.sparsity.parameters.clear();
      for (std::size_t at = 0; at <= o.sparse_params.size();) {
        const std::size_t comma = std::min(o.sparse_params.find(',', at), o.sparse_params.size());
        eo.sparsity.parameters.push_back(o.sparse_params.substr(at, comma - at));
        at = comma + 1;
      }
    }
    eo.delayed_param_update = o.delayed_param_update;  // no DeepSpeed key: a flag of its own
    eo.delayed_param_update_start = o.delayed_param_update_start;
    // --slow-rank R:F (main.cpp has checked it): the detector clocks CPU time on every rank (communication.hpp).
    if (!o.slow_rank.empty()) eo.communication.slow_ranks.clock_ms = thread_cpu_ms;
  };
}

/// --sparsity 2:4: rank 0's sparse weights (its tensor shards), counted in groups of 4 along their
/// last dimension: how many hold exactly 2 non-zero values (all of them, once the masks are chosen).
void print_sparsity_check(gpt::Gpt& model, const Options& o) {
  std::vector<std::string> patterns;
  for (std::size_t at = 0; at <= o.sparse_params.size();) {
    const std::size_t comma = std::min(o.sparse_params.find(',', at), o.sparse_params.size());
    patterns.push_back(o.sparse_params.substr(at, comma - at));
    at = comma + 1;
  }
  std::size_t groups = 0, two = 0, weights = 0;
  model.parameters([&](std::string_view name, auto& p) {
    if (std::none_of(patterns.begin(), patterns.end(), [&](const std::string& q) { return zerotk::glob_match(q, name); })) return;
    ++weights;
    for (std::size_t g = 0; g + 4 <= p.numel(); g += 4) {
      int nonzero = 0;
      for (std::size_t j = 0; j < 4; ++j) nonzero += zerotk::to_float(p.data()[g + j]) != 0.0f ? 1 : 0;
      ++groups;
      two += nonzero == 2 ? 1 : 0;
    }
  });
  std::printf("2:4 check (rank 0): %zu of %zu groups of 4 in %zu sparse weights hold exactly 2 non-zero values\n", two,
              groups, weights);
}

/// Rank 0's figures after training, from every rank's ledger rows and this rank's engines (a
/// pipelined rank holds one per chunk: their ledgers add up).
template <class Replica>
void fill_summary(Summary& summary, Replica& replica, gpt::Gpt& model, int tensor, int data, int steps_run,
                  std::int64_t samples_run, double seconds, double user_ms, double scope_ms, const TrainContext& ctx) {
  auto live = [&](zerotk::MemorySpace sp, zerotk::MemoryCategory c) {
    std::size_t n = 0;
    for (int k = 0; k < replica.chunks(); ++k) n += replica.engine(k).memory().live(sp, c);
    return n;
  };
  summary.psi = summary.padded = 0;
  for (int k = 0; k < replica.chunks(); ++k) {
    summary.psi += replica.engine(k).parameter_count();
    summary.padded += replica.engine(k).flat_numel();
  }
  summary.tensor = tensor;
  summary.data = data;
  summary.pipeline = replica.pipelined() ? replica.schedule().stages : 1;
  summary.psi_model = 0;  // the whole model: each split parameter tensor x this rank's shard, each expert x E_p
  const auto expert_parallel = static_cast<std::size_t>(model.experts.size());
  model.parameters([&](std::string_view name, auto& p) {
    std::size_t n = gpt::tensor_split_of(p).is_split() ? p.numel() * static_cast<std::size_t>(tensor) : p.numel();
    if (gpt::is_expert_param(name)) n *= expert_parallel;
    summary.psi_model += n;
  });
  summary.seconds = seconds;
  summary.steps_run = steps_run;
  summary.tokens_per_s = static_cast<double>(samples_run) * ctx.model_config.context / seconds;
  // Wall time that is not the model's own forward/backward math: step(), and the opening and
  // closing of the layers' scopes (stage 3 gathers there; every stage waits there for slower ranks).
  summary.overhead = std::max(0.0, 1.0 - (user_ms - scope_ms) / (seconds * 1e3));
  using S = zerotk::MemorySpace;
  using C = zerotk::MemoryCategory;
  summary.params_disk = live(S::disk, C::params16);
  std::size_t disk = 0;
  for (std::size_t c = 0; c < zerotk::kMemoryCategoryCount; ++c) disk += live(S::disk, static_cast<C>(c));
  summary.disk = disk - summary.params_disk;
  summary.params_in_cpu = replica.engine().param_bytes_in_cpu();
  summary.pinned_other = live(S::pinned_host, C::other);
  for (std::size_t sp = 0; sp < zerotk::kMemorySpaceCount; ++sp) {
    for (std::size_t c = 0; c < zerotk::kMemoryCategoryCount; ++c) summary.spaces[sp][c] = live(static_cast<S>(sp), static_cast<C>(c));
  }
}

template <class Comm>
void train_rank(Comm& comm, const TrainContext& ctx, Summary& summary, std::mutex& mu) {
  const Options& o = ctx.o;
  const int rank = comm.rank(), world = comm.size();
  // The config's grid: tensor ranks adjacent (Megatron's order), then data, then pipeline stages;
  // ZeRO over the data group. Every tensor rank of a data group trains on that group's micro-batches.
  zerotk::comm::ProcessGrid grid(comm, zerotk::grid_shape(ctx.cfg));
  const int data_rank = grid.data_index(), data_size = grid.size(zerotk::comm::GridDim::data);
  const int tensor = grid.size(zerotk::comm::GridDim::tensor);
  gpt::ExpertParallel experts;  // --experts: the blocks' experts dispatch over the grid's expert group
  if (ctx.model_config.experts > 0) {
    experts.group = std::make_shared<zerotk::comm::AnyCommunicator>(grid.expert());
    experts.capacity = o.capacity;
    experts.balance_coef = o.balance_coef;
  }
  // --cp / --sparse-attention: the blocks' attention over the grid's context group (collective: every rank builds it).
  gpt::ContextParallel context;
  if (ctx.context_attention) context = gpt::context_parallel(grid.context(), o.cp_mode, o.a2a, ctx.sparse);
  // Ulysses gives each of its A ranks whole (sequence, head) pairs; A is known once the groups are
  // (from the nodes under a2a+p2p without --a2a). The same on every rank: all refuse before training.
  if (const long long pairs = ctx.cfg.train_micro_batch_size_per_gpu * (ctx.model_config.n_heads / ctx.cfg.tensor_parallel_size);
      context.split() && context.a2a_size() > pairs) {
    throw zerotk::usage_error("Ulysses gives each of its " + std::to_string(context.a2a_size()) + " ranks whole (sequence, head) "
                                  "pairs, and the micro batch x heads a tensor rank (" + std::to_string(pairs) + ") are fewer",
                              "--cp-mode " + o.cp_mode, "--cp " + std::to_string(context.size));
  }
  if (rank == 0 && context.split() && o.cp_mode == "a2a+p2p" && o.a2a == 0) {
    std::printf("a2a+p2p over the nodes: Ulysses %d (the context ranks a node holds) x ring %d\n", context.a2a_size(),
                context.ring_size());
  }
  gpt::Gpt model(ctx.model_config, gpt::tensor_parallel(grid.tensor(), o.sequence_parallel), std::move(experts),
                 std::move(context));
  Replica<Comm> replica(grid, model, ctx, gpt_engine_edit(o));
  replica.initialize([&] { gpt::init_parameters(model, o.seed); });
  zerotk::AnyEngine& engine = replica.engine();
  // --slow-rank R:F: rank R spins after each step to F x its own compute (communication.hpp).
  SlowRankInjector inject_slowdown(o.slow_rank.empty() ? SlowRankFlag{} : parse_slow_rank(o.slow_rank), rank);
  Checkpointed checkpointed(model, engine.memory(), ctx.cfg,
                            zerotk::activation::Select::parse(o.checkpoint_activations, "--checkpoint-activations"));
  const bool profile_recompute = ctx.cfg.activation_checkpointing.profile && model.checkpointed_blocks() > 0;
  const bool checkpoints = !o.save_dir.empty() || !o.load_dir.empty();
  if (checkpoints && replica.chunks() > 1) {
    throw zerotk::usage_error("checkpoints of an interleaved pipeline (several engines on a rank) are not written yet; "
                              "use a one-chunk schedule (1f1b, gpipe) to save and load",
                              o.save_dir.empty() ? "--load" : "--save", ctx.cfg.pipeline.schedule);
  }
  const int start = resume(engine, grid, o, ctx.cfg.checkpoint.tag_validation, ctx.model_config);
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
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  double user_ms = 0, scope_ms = 0;  // user_ms includes scope_ms
  std::int64_t samples = start_samples;
  double last_loss = 0;
  std::uint64_t wire_bytes = 0, dense_bytes = 0;
  for (int step = start; step < o.steps; ++step) {
    const zerotk::StepReport r = replica.step(step, user_ms, scope_ms);
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
      save(engine, grid, o, step + 1, ctx.cfg.checkpoint.tag_validation, pending, ctx.model_config);
    }
  }
  // A run that loaded the step it was asked to reach has nothing to train: with --save it writes the
  // loaded state on this grid (a checkpoint moved to another tensor, pipeline or data size, stage or world).
  if (!o.save_dir.empty() && start >= o.steps) save(engine, grid, o, start, ctx.cfg.checkpoint.tag_validation, pending, ctx.model_config);
  for (int c = 0; c < replica.chunks(); ++c) replica.engine(c).settle();  // --delayed-param-update: the last update too
  commit(comm, pending);
  if (rank == 0) progress.finish();
  replica.report_bubble(rank == 0);
  // Training's activation peak; evaluation below runs without checkpointing and without the meter.
  const std::size_t activation_peak = engine.memory().peak(zerotk::MemoryCategory::activations);
  const std::size_t checkpointed_blocks = model.checkpointed_blocks();
  checkpointed.detach();
  // DeepSpeed's stage3_gather_16bit_weights_on_model_save: the full 16-bit weights beside the checkpoints.
  if (!o.save_dir.empty() && ctx.cfg.zero_optimization.stage3_gather_16bit_weights_on_model_save) {
    const std::filesystem::path file = std::filesystem::path(o.save_dir) / "model_16bit.safetensors";
    if (tensor > 1 || replica.pipelined()) {
      // Each rank holds part of the model (its tensor shards, its stage's layers): rank 0 puts the whole
      // tensors together from the checkpoint just committed, as zerotk-ckpt export does, in the
      // engine's 16-bit dtype (issue 57 item 10: save_16bit_model refuses a grid, after the whole run).
#if ZEROTK_HAS_XXHASH
      if (rank == 0) zerotk::checkpoint::export_safetensors(o.save_dir, file, {.dtype = engine.storage_dtype()});
#endif
    } else {
      zerotk::checkpoint::save_16bit_model(engine, model, comm, file);
    }
    if (rank == 0) std::printf("wrote %s (stage3_gather_16bit_weights_on_model_save)\n", file.string().c_str());
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  {  // evaluation reads parameters outside the layers' scopes (stage 3: gathered for it); a split or
     // pipelined model evaluates on every rank of data group 0 together, on every token (no sequence
     // parallel: any batch fits), and rank 0 reports
    typename Replica<Comm>::Gathered g(replica);
    model.set_sequence_parallel(false);
    model.set_context_split(false);  // each sequence whole on the evaluating ranks (no context group)
    // Experts spread over data ranks (the expert group) answer only when every rank of it forwards
    // too: then every data group evaluates, on the same sequences, and rank 0 reports.
    const bool experts_apart = ctx.model_config.experts > 0 && grid.expert_size() > 1;
    if (data_rank == 0 || experts_apart) (void)ctx.evaluate(replica.logits(), summary, rank == 0);
    if (rank == 0 && o.sparsity != "none") print_sparsity_check(model, o);
  }
  // The experts' load over the run: each rank's blocks' counts, summed over the world (each block's
  // tokens are counted once per tensor rank, so the sum is divided by the tensor size).
  gpt::ExpertLoad load;
  if (ctx.model_config.experts > 0) {
    load.kept.assign(static_cast<std::size_t>(ctx.model_config.experts), 0.0);  // ranks without blocks add zeros
    load.add(model.expert_load());
    std::vector<double> v = load.packed();
    comm.all_reduce(v.data(), v.data(), v.size(), zerotk::DType::fp64, zerotk::comm::ReduceOp::sum).wait();
    for (double& x : v) x /= tensor;
    load = gpt::ExpertLoad::unpacked(v);
  }

  // Every rank's ledger (its engines' together), gathered (under MPI each process only sees its own).
  using Row = std::array<std::size_t, zerotk::kMemoryCategoryCount>;
  Row mine{};
  for (int k = 0; k < replica.chunks(); ++k) {
    for (std::size_t c = 0; c < zerotk::kMemoryCategoryCount; ++c) {
      mine[c] += replica.engine(k).memory().live(static_cast<zerotk::MemoryCategory>(c));
    }
  }
  std::vector<Row> rows(static_cast<std::size_t>(world));
  comm.all_gather(mine.data(), rows.data(), sizeof(Row), zerotk::DType::uint8).wait();
  std::lock_guard lock(mu);
  summary.memory = rows;
  summary.activation_peak = std::max(summary.activation_peak, activation_peak);
  summary.checkpointed_blocks = checkpointed_blocks;
  if (rank == 0) {
    fill_summary(summary, replica, model, tensor, data_size, std::max(0, o.steps - start), samples - start_samples, seconds,
                 user_ms, scope_ms, ctx);
    summary.final_loss = last_loss;
    summary.wire_bytes = wire_bytes;
    summary.dense_bytes = dense_bytes;
    summary.context_bytes = model.context.bytes_sent();
    summary.links = link_figures(engine);
    summary.experts = load;
  }
}

}  // namespace

void train(const TrainContext& ctx, [[maybe_unused]] MpiWorld* mpi_world, Summary& summary) {
  std::mutex mu;  // guards `summary`, which every rank of this process writes at the end
#if ZEROTK_HAS_MPI
  if (ctx.o.mpi) {
    train_rank(*mpi_world, ctx, summary, mu);
    return;
  }
#endif
  // --ranks-per-node: the threads back end simulates nodes of that many ranks (docs/comm.md).
  zerotk::comm::run_threads(ctx.o.ranks, [&](zerotk::comm::ThreadsCommunicator& c) { train_rank(c, ctx, summary, mu); },
                            {.ranks_per_node = ctx.o.ranks_per_node});
}

}  // namespace gpt_demo
