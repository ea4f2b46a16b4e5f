// Checkpoints of compressed training carry each rank's error feedback (and 0/1 Adam's accumulator
// and lr sums, 1-bit LAMB's flat tail: EngineGroupState::rank_local) in that rank's file, so a run
// saved in the compressed phase resumes bit for bit, which DeepSpeed's (errors reset on every load)
// does not. A load that cannot use it (resharded, into an engine without compression, an older
// checkpoint) starts it from zero and says so in LoadResult::rank_local_restored.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "checkpoint_fixture.hpp"
#include "zerotk/comm/threads.hpp"

namespace test_rank_local {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using namespace zt_test;

namespace {

using OneBitEngine = Engine<Partitioner<Stage<0>>, Optimizer<OneBitAdam>, Precision<fp32>>;
using ZeroOneEngine = Engine<Partitioner<Stage<0>>, Optimizer<ZeroOneAdam>, Precision<fp32>>;
using TopKEngine = Engine<Partitioner<Stage<0>>, Optimizer<AdamW>, Precision<fp32>, GradientCompression<TopK>>;
using PlainEngine = Engine<Partitioner<Stage<0>>, Optimizer<AdamW>, Precision<fp32>>;

EngineOptions onebit_options() {
  EngineOptions o;
  o.reduce_bucket_size = 64;  // fp32 elements
  o.optimizer.lr = 1e-3;
  o.optimizer.beta2 = 0.95;
  o.optimizer.eps = 1e-2;
  o.optimizer.weight_decay = 0.01;
  o.onebit.freeze_step = 2;
  return o;
}

EngineOptions zero_one_options() {
  EngineOptions o = onebit_options();
  o.onebit.zero_one = optim::ZeroOneOptions{.var_freeze_step = 4, .var_update_scaler = 2, .local_step_scaler = 3,
                                            .local_step_clipper = 4};
  return o;
}

EngineOptions topk_options() {
  EngineOptions o;
  o.reduce_bucket_size = 64;  // fp32 elements
  o.optimizer.lr = 1e-2;
  o.compression.topk_ratio = 0.05;
  return o;
}

/// Trains k steps, saves (async when asked), trains n - k more: the parameters and state at the end.
/// Then a fresh engine loads the checkpoint and trains the same n - k steps: it must end with the
/// same bits. Returns the loads' results (every rank's).
template <class E>
std::vector<checkpoint::LoadResult> check_resume(const std::string& name, const EngineOptions& o, int k, int n, bool async) {
  ScratchDir dir(name);
  std::vector<checkpoint::LoadResult> results(2);
  comm::run_threads(2, [&](auto& comm) {
    std::vector<float> straight;
    EngineState at_save, straight_state;
    {
      Mlp<float> model;
      E e(comm, model, o);
      init_model(e, model, 42);
      (void)train_boundaries(e, model, comm.rank(), 0, k);
      at_save = e.state();
      if (async) {
        auto pending = checkpoint::save_async(e, comm, dir.path());
        (void)train_boundaries(e, model, comm.rank(), k, n - k);
        (void)pending->commit();
      } else {
        (void)checkpoint::save(e, comm, dir.path());
        (void)train_boundaries(e, model, comm.rank(), k, n - k);
      }
      straight = model.values();
      straight_state = e.state();
    }
    REQUIRE_FALSE(at_save.groups[0].rank_local.empty());
    Mlp<float> model;
    E e(comm, model, o);
    init_model(e, model, 7);
    const checkpoint::LoadResult r = checkpoint::load(e, comm, dir.path());
    CHECK(same_state(e.state(), at_save));
    (void)train_boundaries(e, model, comm.rank(), k, n - k);
    CHECK(same_bits(model.values(), straight));
    CHECK(same_state(e.state(), straight_state));
    results[static_cast<std::size_t>(comm.rank())] = r;
  });
  const checkpoint::Manifest m = checkpoint::verify(dir.path());
  CHECK(m.rank_local);
  return results;
}

}  // namespace

TEST_CASE("Rank-local state: 1-bit Adam saved in the compressed phase resumes bit for bit (sync and async save)") {
  for (bool async : {false, true}) {
    CAPTURE(async);
    for (const checkpoint::LoadResult& r : check_resume<OneBitEngine>("rank_local_onebit", onebit_options(), 5, 9, async)) {
      CHECK(r.rank_local_restored);
      CHECK_FALSE(r.resharded);
    }
  }
}

TEST_CASE("Rank-local state: 0/1 Adam saved inside a local interval resumes bit for bit (u, L and the errors)") {
  // var_freeze_step 4: frozen from t = 6; I_l = 1 for three steps, then 2: t = 9 is a local step.
  const optim::ZeroOneSchedule s(zero_one_options().onebit.zero_one);
  REQUIRE(s.kind(9) == optim::ZeroOneSchedule::Kind::local);
  REQUIRE(s.kind(10) == optim::ZeroOneSchedule::Kind::sync);
  for (const checkpoint::LoadResult& r : check_resume<ZeroOneEngine>("rank_local_zero_one", zero_one_options(), 9, 14, false)) {
    CHECK(r.rank_local_restored);
  }
}

TEST_CASE("Rank-local state: top-k gradient compression resumes bit for bit with its error feedback") {
  for (const checkpoint::LoadResult& r : check_resume<TopKEngine>("rank_local_topk", topk_options(), 3, 6, true)) {
    CHECK(r.rank_local_restored);
  }
}

TEST_CASE("Rank-local state: a resharded load, or one into an engine without compression, starts it from zero; "
          "another codec keeps it") {
  ScratchDir dir("rank_local_reshard");
  std::vector<float> saved_master;
  comm::run_threads(2, [&](auto& comm) {
    Mlp<float> model;
    TopKEngine e(comm, model, topk_options());
    init_model(e, model, 42);
    (void)train_boundaries(e, model, comm.rank(), 0, 3);
    (void)checkpoint::save(e, comm, dir.path());
    if (comm.rank() == 0) saved_master = e.state().groups[0].master;
  });
  // 3 ranks: the state is resharded, the error feedback (per rank, per layout) starts from zero;
  // every rank ends with the same parameters.
  std::vector<std::vector<float>> finals(3);
  comm::run_threads(3, [&](auto& comm) {
    Mlp<float> model;
    TopKEngine e(comm, model, topk_options());
    const checkpoint::LoadResult r = checkpoint::load(e, comm, dir.path());
    CHECK(r.resharded);
    CHECK_FALSE(r.rank_local_restored);
    const EngineState loaded = e.state();
    REQUIRE_FALSE(loaded.groups[0].rank_local.empty());
    for (float x : loaded.groups[0].rank_local.values) REQUIRE(x == 0.0f);
    (void)train_boundaries(e, model, comm.rank(), 3, 2);
    finals[static_cast<std::size_t>(comm.rank())] = model.values();
  });
  CHECK(same_bits(finals[0], finals[1]));
  CHECK(same_bits(finals[0], finals[2]));
  // Same world size, an engine without compression: the file's error feedback has no place; the
  // rest loads.
  comm::run_threads(2, [&](auto& comm) {
    Mlp<float> model;
    PlainEngine e(comm, model, topk_options());
    const checkpoint::LoadResult r = checkpoint::load(e, comm, dir.path());
    CHECK_FALSE(r.resharded);
    CHECK_FALSE(r.rank_local_restored);
    CHECK(e.state().groups[0].rank_local.empty());
    if (comm.rank() == 0) CHECK(same_bits(e.state().groups[0].master, saved_master));
  });
  // Same world size, another codec: the residual (what was not sent yet) is the codec's input either way.
  comm::run_threads(2, [&](auto& comm) {
    Mlp<float> model;
    Engine<Partitioner<Stage<0>>, Optimizer<AdamW>, Precision<fp32>, GradientCompression<Sign>> e(comm, model, topk_options());
    CHECK(checkpoint::load(e, comm, dir.path()).rank_local_restored);
  });
}

TEST_CASE("Rank-local state: an engine without it writes no such sections; a state of another size is refused") {
  ScratchDir dir("rank_local_none");
  comm::run_threads(2, [&](auto& comm) {
    Mlp<float> model;
    PlainEngine e(comm, model, topk_options());
    init_model(e, model, 42);
    (void)train_boundaries(e, model, comm.rank(), 0, 2);
    CHECK(e.state().groups[0].rank_local.empty());
    (void)checkpoint::save(e, comm, dir.path());
    // A compressing engine loads it; its error feedback starts from zero.
    Mlp<float> model2;
    TopKEngine t(comm, model2, topk_options());
    const checkpoint::LoadResult r = checkpoint::load(t, comm, dir.path());
    CHECK_FALSE(r.rank_local_restored);
    // load_state refuses a rank-local part of another size before changing anything.
    EngineState bad = t.state();
    const EngineState before = t.state();
    bad.groups[0].rank_local.values.pop_back();
    bad.groups[0].master[0] += 1.0f;
    CHECK_THROWS_WITH_AS(t.load_state(bad), doctest::Contains("rank-local part (error feedback) is of another size"),
                         usage_error);
    CHECK(same_state(t.state(), before));
  });
  CHECK_FALSE(checkpoint::verify(dir.path()).rank_local);
}

}  // namespace test_rank_local
