// The GPT example split Megatron-style across a tensor group (gpt::TensorParallel over a process
// grid's tensor communicator), trained by zerotk's Engine with ZeRO over the data group, against the
// same model at tensor size 1 on the same data group:
//  - tensor 2 (with and without sequence parallel) follows tensor 1's losses and parameters to a
//    tolerance asserted here (the row-parallel sums add in another order);
//  - ZeRO stages 0-3 under tensor 2 give bitwise-identical losses and parameters;
//  - the tensor group carries exactly Megatron's collectives per block: 2 all-reduces forward and 2
//    backward of tokens x d floats, or under sequence parallel all-gathers and reduce-scatters of the
//    same bytes (plus the LayerNorms' gradient sums), counted by the communicator;
//  - each rank's model states equal the ZeRO formula on its own shard of the parameters, its data
//    group carries 2 (stage 3: 3) shards' worth of wire bytes per step, and the
//    planner (plan::gpt_model with a tensor size) predicts them and the activation peak exactly.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "data.hpp"
#include "gpt.hpp"
#include "gpt_whole.hpp"
#include "tensor_group.hpp"
#include "zerotk/comm/grid.hpp"
#include "zerotk/activation/meter.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/engines.hpp"  // the compiled engine set, when the suite links zerotk::engines
#include "zerotk/parallel/split.hpp"
#include "zerotk/plan/search.hpp"
#include "zerotk/plan/transformer.hpp"

namespace test_gpt_tensor_parallel {  // the file's own names, apart from its suite's other files in a unity build

namespace {

constexpr int kData = 2, kMicro = 4, kSteps = 6;

gpt::Config small_config() {
  gpt::Config c;
  c.vocab_size = 11;
  c.context = 8;
  c.d_model = 16;
  c.n_heads = 4;
  c.n_layers = 2;
  return c;
}

struct Run {
  std::vector<double> losses;                        // data rank 0's, tensor rank 0
  gpt_test::Whole params;                            // whole parameters, merged from the tensor ranks
  zerotk::comm::CommStats tensor_per_step;           // tensor rank 0's tensor group, one step (gas 1)
  std::uint64_t data_wire_per_step = 0;              // tensor rank 0's data group (ZeRO's traffic), one step
  std::size_t model_states = 0, psi_rank = 0, padded = 0;  // tensor rank 0, data rank 0
  std::array<std::size_t, zerotk::kMemoryCategoryCount> live{};
  std::size_t activation_peak = 0;
};

/// Trains on tensor x kData thread ranks (Megatron's order: tensor ranks adjacent).
template <int Stage>
Run train(int tensor, bool sequence_parallel) {
  const gpt::DigitTask task(gpt::DigitTaskKind::sort, 4, 7);
  const gpt::Config c = small_config();
  Run run;
  std::mutex mu;
  zerotk::comm::run_threads(tensor * kData, [&](zerotk::comm::ThreadsCommunicator& world) {
    zerotk::comm::ProcessGrid grid(world, {.tensor = tensor});
    gpt::Gpt model(c, gpt::tensor_parallel(grid.tensor(), sequence_parallel));
    zerotk::EngineOptions o;
    o.optimizer.lr = 3e-3f;
    o.gradient_clipping = 1.0;
    o.reduce_bucket_size = 1024;  // several buckets
    o.stage3.param_persistence_threshold = 0;
    o.stage3.max_reuse_distance = 0;  // stage 3 gathers again in backward: 3 Psi per step
    zerotk::Engine<zerotk::Partitioner<zerotk::Stage<Stage>>, zerotk::Optimizer<zerotk::AdamW>,
                   zerotk::Precision<zerotk::fp32>>
        engine(grid, model, o);
    {
      auto g = engine.gather(model, 0);
      gpt::init_parameters(model, 11);
    }
    engine.initialize_master();
    zerotk::activation::Meter meter(&engine.memory());
    model.set_meter(&meter);
    engine.memory().reset_peaks();
    gpt::Batch batch;
    std::vector<double> losses;
    zerotk::comm::CommStats before;
    std::uint64_t data_before = 0;
    for (int s = 0; s < kSteps; ++s) {
      if (s == kSteps - 1) {
        before = grid.tensor().stats();
        data_before = engine.comm_stats().total_wire_bytes();
      }
      // Every tensor rank of a data group sees that group's micro-batch.
      task.fill_batch(static_cast<std::uint64_t>(s), grid.data_index(), kData, kMicro, batch);
      const float loss = model.train_step(batch, engine);
      losses.push_back(engine.step(loss).loss);
    }
    const std::uint64_t data_step = engine.comm_stats().total_wire_bytes() - data_before;
    zerotk::comm::CommStats step = grid.tensor().stats();
    for (std::size_t k = 0; k < zerotk::comm::kOpKindCount; ++k) {
      step.by_op[k].calls -= before.by_op[k].calls;
      step.by_op[k].payload_bytes -= before.by_op[k].payload_bytes;
      step.by_op[k].wire_bytes -= before.by_op[k].wire_bytes;
    }
    const std::size_t activation_peak = engine.memory().peak(zerotk::MemoryCategory::activations);
    model.set_meter(nullptr);
    auto g = engine.gather(model);
    std::lock_guard lock(mu);
    if (grid.data_index() != 0) return;
    if (grid.tensor_index() == 0) {
      run.losses = losses;
      run.tensor_per_step = step;
      run.data_wire_per_step = data_step;
      const auto& m = engine.memory();
      run.model_states = m.live(zerotk::MemoryCategory::params16) + m.live(zerotk::MemoryCategory::grads) +
                         m.live(zerotk::MemoryCategory::master32) + m.live(zerotk::MemoryCategory::optimizer_state);
      run.psi_rank = engine.parameter_count();
      run.padded = engine.flat_numel();
      for (std::size_t k = 0; k < zerotk::kMemoryCategoryCount; ++k) run.live[k] = m.live(static_cast<zerotk::MemoryCategory>(k));
      run.activation_peak = activation_peak;
    }
    gpt_test::merge_shards(model, grid.tensor_index(), tensor, run.params);
  });
  return run;
}

double max_difference(const Run& a, const Run& b) {
  double d = 0;
  REQUIRE(a.params.size() == b.params.size());
  for (const auto& [name, v] : a.params) {
    const auto& w = b.params.at(name);
    REQUIRE(v.size() == w.size());
    for (std::size_t i = 0; i < v.size(); ++i) d = std::max(d, static_cast<double>(std::fabs(v[i] - w[i])));
  }
  return d;
}

}  // namespace

TEST_CASE("GPT at tensor 2 x data 2 follows tensor 1 x data 2; stages 0-3 bitwise under tensor 2") {
  const Run one = train<2>(1, false);
  CHECK(one.losses.back() < one.losses.front());  // it learns
  const Run two = train<2>(2, false);
  const Run sp = train<2>(2, true);
  // Stated tolerances: the row-parallel linears add their partial sums in another order than the
  // unsplit product (and sequence parallel the LayerNorms' gradients); over 6 AdamW steps the losses
  // stay within 1e-5 and the parameters within 2e-5 (measured: about 2e-6).
  double loss_gap = 0;
  for (std::size_t s = 0; s < one.losses.size(); ++s) {
    loss_gap = std::max({loss_gap, std::fabs(two.losses[s] - one.losses[s]), std::fabs(sp.losses[s] - one.losses[s])});
  }
  MESSAGE("to tensor 1: largest loss difference " << loss_gap << "; largest parameter difference: tensor 2 "
                                                  << max_difference(one, two) << ", sequence parallel "
                                                  << max_difference(one, sp));
  CHECK(loss_gap < 1e-5);
  CHECK(max_difference(one, two) < 2e-5);
  CHECK(max_difference(one, sp) < 2e-5);
  CHECK(max_difference(one, two) > 0);  // the split really ran (another summation order)

  const Run s0 = train<0>(2, false), s1 = train<1>(2, false), s3 = train<3>(2, false);
  CHECK(s0.losses == two.losses);
  CHECK(s0.params == two.params);
  CHECK(s1.losses == two.losses);
  CHECK(s1.params == two.params);
  CHECK(s3.losses == two.losses);
  CHECK(s3.params == two.params);

  // Megatron's count per block: 2 all-reduces forward, 2 backward, each of tokens x d floats.
  const gpt::Config c = small_config();
  const std::uint64_t tokens = static_cast<std::uint64_t>(kMicro) * 8;  // 4 digits: sequences of 8
  const auto d = static_cast<std::uint64_t>(c.d_model);
  const auto L = static_cast<std::uint64_t>(c.n_layers);
  using zerotk::comm::OpKind;
  const auto& ar = two.tensor_per_step[OpKind::all_reduce];
  CHECK(ar.calls == 4 * L);
  CHECK(ar.payload_bytes == 4 * L * tokens * d * 4);
  CHECK(two.tensor_per_step[OpKind::all_gather].calls == 0);
  CHECK(two.tensor_per_step[OpKind::reduce_scatter].calls == 0);
  // Sequence parallel: the same bytes as all-gathers and reduce-scatters (2 each way per block), one
  // all-gather of the tokens into the replicated head and one of their gradient into the embedding,
  // and the LayerNorms' gain and shift gradients summed (2 LayerNorms x 2 vectors of d per block).
  const auto& ag = sp.tensor_per_step[OpKind::all_gather];
  const auto& rs = sp.tensor_per_step[OpKind::reduce_scatter];
  CHECK(ag.calls == 4 * L + 2);
  CHECK(ag.payload_bytes == (4 * L + 2) * tokens * d * 4);
  CHECK(rs.calls == 4 * L);
  CHECK(rs.payload_bytes == 4 * L * tokens * d * 4);
  CHECK(sp.tensor_per_step[OpKind::all_reduce].calls == 4 * L);
  CHECK(sp.tensor_per_step[OpKind::all_reduce].payload_bytes == 4 * L * d * 4);
  // A ring sends the same bytes for an all-reduce as for an all-gather plus a reduce-scatter of the
  // same payload (2 (T-1)/T against (T-1)/T twice); the two extra all-gathers send tokens x d x 4 B.
  CHECK(ag.wire_bytes + rs.wire_bytes == ar.wire_bytes + tokens * d * 4);
}

TEST_CASE("GPT at tensor 2: each rank's model states are the ZeRO formula on its own shard") {
  // fp32 AdamW: 4 B working copy + 4 B gradient + 4 B master + 8 B moments per element (bytes), on
  // the rank's padded flat buffer: the split matrices hold 1/T of their elements on each rank.
  const gpt::Config c = small_config();
  const std::size_t d = static_cast<std::size_t>(c.d_model), f = static_cast<std::size_t>(c.mlp_width());
  const std::size_t per_block_split = (3 * d * d + 3 * d) + d * d + (f * d + f) + d * f;  // qkv, proj.w, fc, fc_proj.w
  const std::size_t whole = train<0>(1, false).psi_rank;
  const auto check = [&](const Run& r, int stage, bool sequence_parallel) {
    CAPTURE(stage);
    CAPTURE(sequence_parallel);
    CHECK(r.psi_rank == whole - static_cast<std::size_t>(c.n_layers) * per_block_split / 2);
    const double pad = static_cast<double>(r.padded), N = kData;
    const double formula = stage == 0 ? 20 * pad : stage == 1 ? 8 * pad + 12 * pad / N : stage == 2 ? 4 * pad + 16 * pad / N : 20 * pad / N;
    CHECK(static_cast<double>(r.model_states) == formula);
    // ZeRO's traffic over the data group, per step: 2 Psi_r (N-1)/N at stages 0-2, 3 Psi_r (N-1)/N
    // at stage 3 (fp32: 4 B an element), on the rank's own padded shard; stage 3 also agrees on the
    // order of its scopes each micro-step (an all-reduce of 6 doubles, engine/fetch_sharded.hpp).
    const double order_check = stage == 3 ? 2 * (N - 1) / N * 6 * 8 : 0;
    CHECK(static_cast<double>(r.data_wire_per_step) == (stage == 3 ? 3 : 2) * 4 * pad * (N - 1) / N + order_check);
    // The planner: one tensor rank's description, the data group's size.
    zerotk::plan::TransformerShape shape;
    shape.layers = static_cast<std::size_t>(c.n_layers);
    shape.hidden = d;
    shape.heads = static_cast<std::size_t>(c.n_heads);
    shape.sequence = 8;
    shape.micro_batch = kMicro;
    shape.vocab = static_cast<std::size_t>(c.vocab_size);
    shape.tensor = 2;
    shape.sequence_parallel = sequence_parallel;
    zerotk::plan::Choice choice;
    choice.stage = stage;
    choice.precision = zerotk::DType::fp32;
    zerotk::plan::EngineSettings settings;
    settings.reduce_bucket_size = 1024;
    settings.param_persistence_threshold = 0;
    settings.max_reuse_distance = 0;
    settings.compute_space = zerotk::MemorySpace::host;
    zerotk::plan::Budget unlimited;
    unlimited.device_bytes = unlimited.host_bytes = std::size_t{1} << 50;
    const zerotk::plan::Evaluation e = zerotk::plan::evaluate(zerotk::plan::gpt_model(shape), kData, choice, settings, unlimited);
    CHECK(e.memory.psi == r.psi_rank);
    for (zerotk::MemoryCategory k : {zerotk::MemoryCategory::params16, zerotk::MemoryCategory::grads,
                                     zerotk::MemoryCategory::master32, zerotk::MemoryCategory::optimizer_state}) {
      CAPTURE(std::string(zerotk::to_string(k)));
      CHECK(r.live[static_cast<std::size_t>(k)] == e.memory.category_total(k));
    }
    CHECK(r.activation_peak == e.activations.peak());
  };
  check(train<0>(2, false), 0, false);
  check(train<1>(2, false), 1, false);
  check(train<2>(2, false), 2, false);
  check(train<3>(2, false), 3, false);
  check(train<2>(2, true), 2, true);
}

}  // namespace test_gpt_tensor_parallel
