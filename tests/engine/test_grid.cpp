// The engine on a process grid (comm/grid.hpp, engine/comms.hpp): ZeRO over the grid's data group,
// the norm, overflow agreement and loss over every rank. With parameters every tensor rank holds
// whole (no tensor-parallel layer declares a split yet), a tensor 2 x data 2 grid on 4 thread ranks
// must train exactly as its data group of 2 alone: the same parameters, losses, norms, scales and
// skipped steps, bit for bit, at stages 0-3, whatever the grid's rank order.
#include <doctest/doctest.h>

#include <algorithm>
#include <iterator>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "engine_fixture.hpp"
#include "zerotk/comm/grid.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/engine.hpp"

namespace test_grid {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using zt_test::Mlp;
using zt_test::RunConfig;
using zt_test::RunResult;

namespace {

void check_same(const RunResult& a, const RunResult& b) {
  CHECK(a.params == b.params);
  CHECK(a.losses == b.losses);
  CHECK(a.norms == b.norms);
  CHECK(a.scales == b.scales);
  CHECK(a.skipped == b.skipped);
}

RunConfig grid_config() {
  RunConfig cfg;
  cfg.world = 2;  // the data group's size: batches and overflows follow the data rank
  cfg.steps = 8;
  cfg.gas = 2;
  cfg.clip = 0.5;           // the norm is used, not only reported
  cfg.poison_steps = {3};   // an overflow on one data rank: every rank of the grid must skip it
  cfg.reduce_every_micro_step = true;
  return cfg;
}

template <int S, class Prec>
void tensor_grid_equals_data_group(std::string_view order) {
  CAPTURE(S);
  CAPTURE(std::string(order));
  RunConfig cfg = grid_config();
  if constexpr (S == 3) cfg.stage3.param_persistence_threshold = 0;  // every layer fetched in its scopes
  std::vector<RunResult> alone(2), grid(4);
  comm::run_threads(2, [&](comm::ThreadsCommunicator& c) { alone[static_cast<std::size_t>(c.rank())] = zt_test::train_on<S, Prec>(c, c.rank(), cfg); });
  std::mutex mu;
  comm::run_threads(4, [&](comm::ThreadsCommunicator& world) {
    comm::ProcessGrid g(world, {.data = 0, .pipeline = 1, .tensor = 2, .order = order});
    RunResult r = zt_test::train_on<S, Prec>(g, g.data_index(), cfg);
    std::lock_guard lock(mu);
    grid[static_cast<std::size_t>(world.rank())] = std::move(r);
  });
  // Megatron's order puts the two tensor ranks of data rank d at world ranks 2d, 2d + 1; the other
  // order at d, d + 2.
  for (int w = 0; w < 4; ++w) {
    CAPTURE(w);
    const int d = order == "tp-dp-pp" ? w / 2 : w % 2;
    check_same(grid[static_cast<std::size_t>(w)], alone[static_cast<std::size_t>(d)]);
    CHECK(grid[static_cast<std::size_t>(w)].groups == ReportGroups{2, 2, 1});
  }
  CHECK(grid[0].skipped[3]);  // the overflow on data rank 1 was agreed by everyone
  CHECK(grid[0].params != grid[0].initial);
}

}  // namespace

TEST_CASE("engine on a tensor 2 x data 2 grid trains as its data group alone, bit for bit (stages 0-3)") {
  tensor_grid_equals_data_group<0, fp32>("tp-dp-pp");
  tensor_grid_equals_data_group<1, fp32>("tp-dp-pp");
  tensor_grid_equals_data_group<2, bf16>("tp-dp-pp");
  tensor_grid_equals_data_group<3, fp32>("tp-dp-pp");
  tensor_grid_equals_data_group<2, bf16>("dp-tp-pp");  // data ranks adjacent instead
}

TEST_CASE("engine on a grid: hpZ groups split the data group, not the world") {
  RunConfig cfg = grid_config();
  cfg.stage3.param_persistence_threshold = 0;
  cfg.stage3.reshard_after_forward = ReshardAfterForward::group(2);  // the whole data group of 2
  std::vector<RunResult> alone(2), grid(4);
  comm::run_threads(2, [&](comm::ThreadsCommunicator& c) { alone[static_cast<std::size_t>(c.rank())] = zt_test::train_on<3, fp32>(c, c.rank(), cfg); });
  std::mutex mu;
  comm::run_threads(4, [&](comm::ThreadsCommunicator& world) {
    comm::ProcessGrid g(world, {.tensor = 2});
    RunResult r = zt_test::train_on<3, fp32>(g, g.data_index(), cfg);
    std::lock_guard lock(mu);
    grid[static_cast<std::size_t>(world.rank())] = std::move(r);
  });
  for (int w = 0; w < 4; ++w) check_same(grid[static_cast<std::size_t>(w)], alone[static_cast<std::size_t>(w / 2)]);
  // g = 4 would divide the world but not the data group: refused, naming the data-parallel size.
  cfg.stage3.reshard_after_forward = ReshardAfterForward::group(4);
  CHECK_THROWS_WITH_AS(comm::run_threads(4,
                                         [&](comm::ThreadsCommunicator& world) {
                                           comm::ProcessGrid g(world, {.tensor = 2});
                                           (void)zt_test::train_on<3, fp32>(g, g.data_index(), cfg);
                                         }),
                       doctest::Contains("must divide the data-parallel size (2)"), config_error);
}

TEST_CASE("engine on a grid: what exchanges compressed state over the data group refuses a wider grid") {
  CHECK_THROWS_WITH_AS(
      comm::run_threads(2,
                        [](comm::ThreadsCommunicator& world) {
                          comm::ProcessGrid g(world, {.tensor = 2});
                          Mlp<float> model;
                          Engine<Partitioner<Stage<0>>, Optimizer<OneBitAdam>> engine(g, model);
                        }),
      doctest::Contains("exchanges over the data group alone"), config_error);
}

TEST_CASE("process grid: Megatron's rank order by default, any order of tp, dp and pp on request") {
  comm::run_threads(8, [](comm::ThreadsCommunicator& world) {
    const int w = world.rank();
    comm::ProcessGrid mega(world, {.pipeline = 2, .tensor = 2});  // data 2
    CHECK(mega.tensor_index() == w % 2);
    CHECK(mega.data_index() == w / 2 % 2);
    CHECK(mega.pipeline_index() == w / 4);
    CHECK(mega.size(comm::GridDim::data) == 2);
    CHECK(mega.data().size() == 2);
    CHECK(mega.model().size() == 4);
    comm::ProcessGrid other(world, {.pipeline = 2, .tensor = 2, .order = "pp-dp-tp"});
    CHECK(other.pipeline_index() == w % 2);
    CHECK(other.data_index() == w / 2 % 2);
    CHECK(other.tensor_index() == w / 4);
    CHECK(comm::ProcessGrid<comm::ThreadsCommunicator>::world_rank_of(other.shape(), other.data_index(),
                                                                      other.pipeline_index(), other.tensor_index()) == w);
    // Ranks of one tensor group differ only in their tensor coordinate.
    std::vector<std::int32_t> mine{other.data_index(), other.pipeline_index()}, all(2 * other.tensor().size());
    other.tensor().all_gather(mine.data(), all.data(), 2, DType::int32).wait();
    for (std::size_t i = 0; i < all.size(); i += 2) {
      CHECK(all[i] == other.data_index());
      CHECK(all[i + 1] == other.pipeline_index());
    }
  });
  CHECK_THROWS_WITH_AS(comm::run_threads(2, [](comm::ThreadsCommunicator& w) { comm::ProcessGrid g(w, {.order = "tp-dp"}); }),
                       doctest::Contains("GridShape::order: must name tp, dp and pp once each"), config_error);
  CHECK_THROWS_WITH_AS(comm::run_threads(2, [](comm::ThreadsCommunicator& w) { comm::ProcessGrid g(w, {.order = "tp-tp-pp"}); }),
                       doctest::Contains("(got tp-tp-pp)"), config_error);
}

TEST_CASE("the run-time checker: each row names its key on the input that breaks it, and none fires on defaults") {
  const engine::GridPlace alone{};
  const engine::GridPlace grid{2, 2, 1, 0, 1, 0};  // data 2 x tensor 2
  const engine::EngineFacts plain{};
  CHECK(engine::option_problems(EngineOptions{}, plain).empty());
  CHECK(engine::place_problems(EngineOptions{}, plain, grid).empty());

  struct Case {
    std::string_view rule, key;
    EngineOptions o;
    engine::EngineFacts f;
    engine::GridPlace place;  // where the row fires
    engine::GridPlace fine;   // a place where the same options and facts pass the place's rows
  };
  std::vector<Case> cases;
  const auto add = [&](std::string_view rule, std::string_view key, auto edit_o, auto edit_f, engine::GridPlace p,
                       engine::GridPlace fine = engine::GridPlace{}) {
    Case c{rule, key, EngineOptions{}, engine::EngineFacts{}, p, fine};
    edit_o(c.o);
    edit_f(c.f);
    cases.push_back(std::move(c));
  };
  const auto none = [](auto&) {};
  add("delayed_update_needs_cpu_offload", "delayed_param_update", [](EngineOptions& o) { o.delayed_param_update = true; },
      none, alone);
  add("delayed_update_not_with_shard_file", "delayed_param_update",
      [](EngineOptions& o) { o.delayed_param_update = true; },
      [](engine::EngineFacts& f) { f.can_delay_update = f.shard_file = true; }, alone);
  add("delayed_update_not_with_sparsity", "delayed_param_update",
      [](EngineOptions& o) { o.delayed_param_update = true; },
      [](engine::EngineFacts& f) { f.can_delay_update = f.sparsity = true; }, alone);
  add("accumulation_dtype", "data_types.grad_accum_dtype", [](EngineOptions& o) { o.grad_accum_dtype = DType::fp16; },
      [](engine::EngineFacts& f) { f.storage = DType::bf16; }, alone);
  add("fp32_accumulation_every_micro_step", "data_types.grad_accum_dtype",
      [](EngineOptions& o) {
        o.grad_accum_dtype = DType::fp32;
        o.gradient_accumulation_steps = 2;
      },
      [](engine::EngineFacts& f) {
        f.storage = DType::bf16;
        f.reduces_at_boundary = true;
      },
      alone);
  add("config_tensor_size", "/tensor_model_parallel_size", [](EngineOptions& o) { o.config_grid = ModelOptions::ConfigGrid{4, 1, 1}; }, none, grid,
      engine::GridPlace{1, 4, 1, 0, 3, 0});  // the config's tensor 4
  add("config_pipeline_size", "/pipeline_parallelism/num_stages",
      [](EngineOptions& o) { o.config_grid = ModelOptions::ConfigGrid{2, 2, 1}; }, none, grid,
      engine::GridPlace{1, 2, 2, 0, 1, 1});  // the config's tensor 2 x pipeline 2
  engine::GridPlace expert2{2, 1, 1, 0, 0, 0};  // data 2 x expert 2: the config's grid
  expert2.expert_size = 2;
  add("config_expert_size", "/expert_parallel/autoep_size",
      [](EngineOptions& o) { o.config_grid = ModelOptions::ConfigGrid{1, 1, 2}; }, none, alone, expert2);
  add("compressed_exchange_data_only", "tensor x pipeline", none,
      [](engine::EngineFacts& f) { f.compressed_exchange = true; }, grid);
  add("zeropp_needs_stage3", "zero_optimization.zero_quantized_gradients",
      [](EngineOptions& o) { o.stage3.quantized_gradients = true; }, [](engine::EngineFacts& f) { f.stage = 2; }, alone);
  add("zeropp_host_only", "zero_optimization.zero_quantized_weights",
      [](EngineOptions& o) { o.stage3.quantized_weights = true; },
      [](engine::EngineFacts& f) {
        f.stage = 3;
        f.on_device = true;
      },
      alone);
  add("rebalance_data_only", "communication.slow_node_action",
      [](EngineOptions& o) {
        o.communication.slow_ranks.enabled = true;
        o.communication.slow_ranks.action = SlowRankAction::rebalance;
        o.communication.slow_ranks.micro_batch_size = 1;
      },
      none, grid);
  // Expert parameters (GridPlace::expert_params) on an expert layout apart from the data group: data 2
  // x expert 2; the same model at expert 1 (the expert-data group is the data group) passes.
  engine::GridPlace experts{2, 1, 1, 0, 0, 0};
  experts.expert_size = 2;
  experts.expert_params = true;
  engine::GridPlace experts_together{2, 1, 1, 0, 0, 0};
  experts_together.expert_data_size = 2;
  experts_together.expert_params = true;
  engine::GridPlace tensor_experts = grid;  // tensor 2, expert_tensor 1
  tensor_experts.expert_params = true;
  engine::GridPlace tensor_experts_fine = tensor_experts;
  tensor_experts_fine.expert_tensor_size = 2;
  add("experts_expert_tensor", "GridShape::expert_tensor", none, none, tensor_experts, tensor_experts_fine);
  add("experts_no_swap_files", "offload_optimizer.device / offload_param.device", none,
      [](engine::EngineFacts& f) { f.swaps = true; }, experts, experts_together);
  add("experts_no_compressed_exchange", "optimizer.type / gradient_compression", none,
      [](engine::EngineFacts& f) { f.compressed_exchange = true; }, experts, experts_together);
  add("experts_no_zeropp", "zero_optimization.zero_quantized_gradients",
      [](EngineOptions& o) { o.stage3.quantized_gradients = true; }, [](engine::EngineFacts& f) { f.stage = 3; },
      experts, experts_together);
  // Every row of the table is exercised once, and fires alone.
  CHECK(cases.size() == std::size(engine::kRunRules));
  for (const Case& c : cases) {
    CAPTURE(c.rule);
    std::vector<config_error> found = engine::option_problems(c.o, c.f);
    for (config_error& e : engine::place_problems(c.o, c.f, c.place)) found.push_back(std::move(e));
    REQUIRE(found.size() == 1);
    CHECK(found.front().where() == c.key);
    const auto row = std::find_if(std::begin(engine::kRunRules), std::end(engine::kRunRules),
                                  [&](const engine::RunRule& r) { return r.name == c.rule; });
    REQUIRE(row != std::end(engine::kRunRules));
    CHECK(row->check(c.o, c.f, c.place).has_value());
    // The same options and facts on a place that fits them pass the rows that read the place (a
    // plain communicator, or the grid the config asks for).
    if (row->on_place) CHECK(engine::place_problems(c.o, c.f, c.fine).empty());
  }
}

// The facts a check without an engine type reads (engine::facts_of over a Combination: what
// config::check_buildable runs the rows on) are the facts an engine type derives from its members.
template <class Pack>
engine::EngineFacts facts_from_combination(std::type_identity<BasicEngine<Pack>>) {
  using R = engine::resolved_pack_t<Pack>;
  return engine::facts_of(R::compat::combination, dtype_of_v<typename R::precision::storage>);
}
template <class... Es>
void check_facts_agree() {
  (
      [] {
        const engine::EngineFacts own = Es::facts();
        CAPTURE(own.offload);
        CAPTURE(own.stage);
        CHECK(facts_from_combination(std::type_identity<Es>{}) == own);
      }(),
      ...);
}

TEST_CASE("engine::facts_of(combination) gives the facts each engine type derives from its members") {
  check_facts_agree<Engine<Partitioner<Stage<0>>, Optimizer<AdamW>>,
                    Engine<Partitioner<Stage<1>, when::every_micro_step>, Optimizer<AdamW>, Precision<fp16>>,
                    Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Precision<bf16>, Offload<Cpu>>,
                    Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, Precision<bf16>, Offload<Nvme>>,
                    Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, Precision<bf16>, OffloadParams<Nvme>>,
                    Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, Precision<bf16>, Offload<Cpu>, OffloadParams<Cpu>>,
                    Engine<Partitioner<Stage<0>>, Optimizer<OneBitAdam>>,
                    Engine<Partitioner<Stage<0>>, Optimizer<AdamW>, GradientCompression<TopK>>,
                    Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Sparsity<NofM<2, 4>>>>();
}

TEST_CASE("the run-time checker at construction: rebalancing slow ranks on a tensor 2 grid is refused naming the key") {
  CHECK_THROWS_WITH_AS(comm::run_threads(2,
                                         [](comm::ThreadsCommunicator& world) {
                                           comm::ProcessGrid g(world, {.tensor = 2});
                                           Mlp<float> model;
                                           EngineOptions o;
                                           o.communication.slow_ranks.enabled = true;
                                           o.communication.slow_ranks.action = SlowRankAction::rebalance;
                                           o.communication.slow_ranks.micro_batch_size = 1;
                                           Engine<Partitioner<Stage<1>>, Optimizer<AdamW>> engine(g, model, o);
                                         }),
                       doctest::Contains("rebalance moves samples between data-parallel ranks"), config_error);
}

}  // namespace test_grid
