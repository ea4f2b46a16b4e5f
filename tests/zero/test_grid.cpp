// The engine on a process grid (comm/grid.hpp, engine/comms.hpp): ZeRO over the grid's data group,
// the norm, overflow agreement and loss over every rank. With parameters every tensor rank holds
// whole (no tensor-parallel layer declares a split yet), a tensor 2 x data 2 grid on 4 thread ranks
// must train exactly as its data group of 2 alone: the same parameters, losses, norms, scales and
// skipped steps, bit for bit, at stages 0-3, whatever the grid's rank order.
#include <doctest/doctest.h>

#include <mutex>
#include <string>
#include <vector>

#include "engine_fixture.hpp"
#include "zerotk/comm/grid.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/engine.hpp"

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
