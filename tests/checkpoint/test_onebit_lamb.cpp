// 1-bit LAMB's checkpoints: the fresh variance v_f and the per-tensor scalars (c_f, F, k) travel with
// m and v (sections exp_avg_sq_fresh and lamb_tensor_states), and each rank's errors and flat tail
// with its file (rank_local), so a run saved in the warm-up or in the compression phase resumes bit
// for bit, and a checkpoint saved on 2 ranks loads on 1 and 3 (errors and tail from zero there).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "checkpoint_fixture.hpp"
#include "zerotk/comm/threads.hpp"

namespace test_onebit_lamb {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using namespace zt_test;

namespace {

using LambEngine = Engine<Partitioner<Stage<0>>, Optimizer<OneBitLamb>, Precision<fp32>>;

EngineOptions lamb_options() {
  EngineOptions o;
  o.reduce_bucket_size = 64;  // fp32 elements
  o.optimizer.lr = 2e-3;
  o.optimizer.beta2 = 0.95;
  o.optimizer.eps = 1e-2;
  o.optimizer.weight_decay = 0.01;
  o.onebit.freeze_step = 4;
  return o;
}

}  // namespace

TEST_CASE("OneBitLamb: saved in the warm-up, the resumed run equals the uninterrupted one bit for bit") {
  constexpr int k = 3, n = 8;  // freeze_step 4: the save is before the switch, the run goes past it
  ScratchDir dir("onebit_lamb_warm");
  comm::run_threads(2, [&](auto& comm) {
    std::vector<float> straight;
    EngineState at_save, straight_state;
    {
      Mlp<float> model;
      LambEngine e(comm, model, lamb_options());
      init_model(e, model, 42);
      (void)train_boundaries(e, model, comm.rank(), 0, k);
      at_save = e.state();
      (void)checkpoint::save(e, comm, dir.path());
      (void)train_boundaries(e, model, comm.rank(), k, n - k);
      straight = model.values();
      straight_state = e.state();
    }
    // The save carries the warm-up's scalars: c_f has moved, k is not set yet.
    REQUIRE(at_save.groups[0].optimizer.tensor_scalars.size() >= optim::kLambScalarsPerTensor);
    CHECK(at_save.groups[0].optimizer.tensor_scalars[0] > 0.0);   // tensor 0's c_f
    CHECK(at_save.groups[0].optimizer.tensor_scalars[2] == 0.0);  // tensor 0's k
    Mlp<float> model;
    LambEngine e(comm, model, lamb_options());
    (void)checkpoint::load(e, comm, dir.path());
    CHECK(same_state(e.state(), at_save));
    (void)train_boundaries(e, model, comm.rank(), k, n - k);
    CHECK(same_bits(model.values(), straight));
    CHECK(same_state(e.state(), straight_state));
  });
  const checkpoint::Manifest m = checkpoint::verify(dir.path());
  CHECK(m.optimizer == "OneBitLamb");
  CHECK(m.optimizer_states == std::vector<std::string>{"exp_avg", "exp_avg_sq", "exp_avg_sq_fresh"});
}

TEST_CASE("OneBitLamb: saved in the compression phase, loading restores v_f, c_f, F, k, the errors and the tail "
          "exactly; the run goes on bit for bit") {
  constexpr int k = 6, n = 10;
  ScratchDir dir("onebit_lamb_comp");
  comm::run_threads(2, [&](auto& comm) {
    std::vector<float> straight;
    EngineState at_save;
    {
      Mlp<float> model;
      LambEngine e(comm, model, lamb_options());
      init_model(e, model, 42);
      (void)train_boundaries(e, model, comm.rank(), 0, k);
      at_save = e.state();
      (void)checkpoint::save(e, comm, dir.path());
      (void)train_boundaries(e, model, comm.rank(), k, n - k);
      straight = model.values();
    }
    CHECK(at_save.groups[0].optimizer.tensor_scalars[2] > 0.0);  // tensor 0's k was set at the switch
    CHECK_FALSE(at_save.groups[0].rank_local.empty());         // the errors and the tail
    Mlp<float> model;
    LambEngine e(comm, model, lamb_options());
    CHECK(checkpoint::load(e, comm, dir.path()).rank_local_restored);
    CHECK(same_state(e.state(), at_save));
    (void)train_boundaries(e, model, comm.rank(), k, n - k);
    CHECK(same_bits(model.values(), straight));
  });
}

TEST_CASE("OneBitLamb: saved on 2 ranks, loaded on 1 and 3: every rank holds the saved state") {
  // The flat layout (padding) depends on the world size: compare per parameter, placed by each
  // engine's shard table, and the per-tensor scalars as they are.
  struct PerParam {
    std::vector<std::vector<float>> master, m, v, vf;
    std::vector<double> scalars;
    std::int64_t step = 0;
    /// Everything as floats, in one fixed order (compared bit for bit).
    std::vector<float> flat() const {
      std::vector<float> out;
      for (const auto* x : {&master, &m, &v, &vf}) {
        for (const std::vector<float>& p : *x) out.insert(out.end(), p.begin(), p.end());
      }
      for (double d : scalars) {  // each double as two floats' bits
        float two[2];
        std::memcpy(two, &d, sizeof d);
        out.insert(out.end(), two, two + 2);
      }
      out.push_back(static_cast<float>(step));
      return out;
    }
  };
  auto per_param = [](const EngineState& s, const engine::ShardTable& t, int rank) {
    PerParam out;
    out.step = s.groups[0].optimizer.step;
    out.scalars = s.groups[0].optimizer.tensor_scalars;
    for (auto* x : {&out.master, &out.m, &out.v, &out.vf}) x->resize(t.params.size());
    const auto& o = s.groups[0].optimizer;
    for (const zero::Fragment& f : t.fragments[0][static_cast<std::size_t>(rank)]) {
      const std::vector<float>* from[4] = {&s.groups[0].master, &o.m, &o.v, &o.v_fresh};
      std::vector<std::vector<float>>* to[4] = {&out.master, &out.m, &out.v, &out.vf};
      for (int k = 0; k < 4; ++k) {
        auto& dst = (*to[k])[f.param];
        dst.resize(std::max(dst.size(), f.param_offset + f.numel));
        std::copy_n(from[k]->begin() + static_cast<long>(f.owned_offset), f.numel,
                    dst.begin() + static_cast<long>(f.param_offset));
      }
    }
    return out;
  };
  ScratchDir dir("onebit_lamb_reshard");
  PerParam saved;
  comm::run_threads(2, [&](auto& comm) {
    Mlp<float> model;
    LambEngine e(comm, model, lamb_options());
    init_model(e, model, 42);
    (void)train_boundaries(e, model, comm.rank(), 0, 7);
    const PerParam mine = per_param(e.state(), e.shard_table(), comm.rank());
    (void)checkpoint::save(e, comm, dir.path());
    if (comm.rank() == 0) saved = mine;
  });
  REQUIRE(saved.scalars.size() >= optim::kLambScalarsPerTensor);
  CHECK(saved.scalars[2] > 0.0);  // tensor 0's k
  for (int w : {1, 3}) {
    CAPTURE(w);
    comm::run_threads(w, [&](auto& comm) {
      Mlp<float> model;
      LambEngine e(comm, model, lamb_options());
      (void)checkpoint::load(e, comm, dir.path());
      CHECK(same_bits(per_param(e.state(), e.shard_table(), comm.rank()).flat(), saved.flat()));
      (void)train_boundaries(e, model, comm.rank(), 7, 2);  // and it trains on
      for (float x : model.values()) REQUIRE(std::isfinite(x));
    });
  }
}

TEST_CASE("OneBitLamb: an AdamW engine refuses a 1-bit LAMB checkpoint, naming the optimizer") {
  ScratchDir dir("onebit_lamb_other");
  comm::run_threads(1, [&](auto& comm) {
    Mlp<float> model;
    LambEngine e(comm, model, lamb_options());
    init_model(e, model, 42);
    (void)train_boundaries(e, model, 0, 0, 2);
    (void)checkpoint::save(e, comm, dir.path());
    Mlp<float> model2;
    Engine<Partitioner<Stage<0>>, Optimizer<AdamW>, Precision<fp32>> adam(comm, model2, lamb_options());
    CHECK_THROWS_WITH_AS(checkpoint::load(adam, comm, dir.path()), doctest::Contains("OneBitLamb"), usage_error);
  });
}

}  // namespace test_onebit_lamb
