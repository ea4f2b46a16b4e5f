// Loading on another world size, stage or bucket size: a checkpoint saved on 4 ranks loads on 1, 2,
// 3 and 8 ranks and on stages 0-3; the fp32 masters and both Adam moments, gathered per parameter
// from the files (a consolidation written here, independent of checkpoint/reshard.hpp), are bitwise
// the saved ones, and so are the parameters; training continues.
#include <doctest/doctest.h>

#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "checkpoint_fixture.hpp"
#include "zerotk/comm/threads.hpp"

namespace test_reshard {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using namespace zt_test;
namespace fs = std::filesystem;

namespace {

/// Per parameter, the whole fp32 master and moments of checkpoint `dir/tag`, read from every rank's
/// file and placed by the manifest's fragments; an element held by two ranks must agree.
struct Consolidated {
  std::vector<std::vector<float>> master, m, v;  // [param]
  std::vector<std::int64_t> steps;
  std::int64_t global_steps = 0;
};

Consolidated consolidate(const fs::path& dir, const std::string& tag) {
  const checkpoint::Manifest man = checkpoint::verify(dir, tag);
  Consolidated c;
  c.global_steps = man.global_steps;
  c.steps = man.optimizer_steps;
  const std::size_t P = man.shards.params.size();
  c.master.resize(P);
  c.m.resize(P);
  c.v.resize(P);
  std::vector<std::vector<char>> seen(P);
  for (std::size_t i = 0; i < P; ++i) {
    const std::size_t n = man.shards.params[i].numel;
    c.master[i].assign(n, NAN);
    c.m[i].assign(n, NAN);
    c.v[i].assign(n, NAN);
    seen[i].assign(n, 0);
  }
  for (int r = 0; r < man.world_size; ++r) {
    const auto groups = checkpoint::read_rank_file(checkpoint::open_rank_file(dir / tag, man, r), man, r);
    for (std::size_t g = 0; g < groups.size(); ++g) {
      for (const zero::Fragment& f : man.shards.fragments[g][static_cast<std::size_t>(r)]) {
        for (std::size_t e = 0; e < f.numel; ++e) {
          const std::size_t at = f.param_offset + e, from = f.owned_offset + e;
          const float x[3] = {groups[g].master[from], groups[g].optimizer.m[from], groups[g].optimizer.v[from]};
          std::vector<float>* to[3] = {&c.master[f.param], &c.m[f.param], &c.v[f.param]};
          for (int k = 0; k < 3; ++k) {
            if (seen[f.param][at]) {
              REQUIRE(std::memcmp(&(*to[k])[at], &x[k], 4) == 0);  // stage 0: every copy the same
            } else {
              (*to[k])[at] = x[k];
            }
          }
          seen[f.param][at] = 1;
        }
      }
    }
  }
  for (const auto& s : seen) {
    for (char x : s) REQUIRE(x == 1);
  }
  return c;
}

bool same(const Consolidated& a, const Consolidated& b) {
  if (a.steps != b.steps || a.global_steps != b.global_steps || a.master.size() != b.master.size()) return false;
  for (std::size_t i = 0; i < a.master.size(); ++i) {
    if (!same_bits(a.master[i], b.master[i]) || !same_bits(a.m[i], b.m[i]) || !same_bits(a.v[i], b.v[i])) return false;
  }
  return true;
}

RunConfig config(int world) {
  RunConfig cfg;
  cfg.world = world;
  cfg.gas = 2;
  cfg.poison_steps = {1};  // a skipped step: the scaler is mid-hysteresis
  cfg.stage3.param_persistence_threshold = 0;  // stage 3 fetches every parameter
  return cfg;
}

/// Trains Mlp<half> on 4 ranks for 3 steps with engine E and saves as tag "src"; returns rank 0's
/// parameter values at the save.
template <class E>
std::vector<float> save_on_four(const fs::path& dir) {
  std::vector<float> params;
  const RunConfig cfg = config(4);
  comm::run_threads(4, [&](auto& comm) {
    Mlp<half> model;
    E engine(comm, model, engine_options(cfg));
    {
      auto g = engine.gather(model, 0);  // stage 3 has values only in scopes
      model.init(42);
    }
    engine.initialize_master();
    engine.set_scheduler(warmup_schedule());
    train_steps(engine, model, comm.rank(), cfg, 0, 3, nullptr);
    checkpoint::save(engine, comm, dir, {.tag = "src", .client_state = bytes_of("from four")});
    auto g = engine.gather(model);
    if (comm.rank() == 0) params = model.values();
  });
  return params;
}

/// Loads "src" into engine E on `world` ranks, checks what it can, saves it again as "again", and
/// trains two more steps.
template <class E>
void load_on(const fs::path& dir, int world, std::size_t bucket_bytes, const std::vector<float>& saved_params) {
  RunConfig cfg = config(world);
  cfg.bucket_bytes = bucket_bytes;
  cfg.poison_steps.clear();
  std::mutex mu;
  int resharded = 0;
  comm::run_threads(world, [&](auto& comm) {
    Mlp<half> model;
    E engine(comm, model, engine_options(cfg));
    {
      auto g = engine.gather(model, 0);
      model.init(7);  // other values: all must come from the checkpoint
    }
    engine.initialize_master();
    engine.set_scheduler(warmup_schedule());
    const checkpoint::LoadResult r = checkpoint::load(engine, comm, dir, {.tag = "src"});
    CHECK(r.saved_world_size == 4);
    CHECK(text_of(r.client_state) == "from four");
    CHECK(r.global_steps == 3);
    {
      auto g = engine.gather(model);
      CHECK(same_bits(model.values(), saved_params));  // the 16-bit parameters: the master rounded
    }
    const EngineState s = engine.state();
    CHECK(s.skipped_steps == 1);
    CHECK(s.scaler.hyst == 1);
    {
      std::lock_guard lock(mu);
      resharded += r.resharded ? 1 : 0;
    }
    checkpoint::save(engine, comm, dir, {.tag = "again"});
    RunResult res;
    train_steps(engine, model, comm.rank(), cfg, 3, 5, &res);
    for (double l : res.losses) CHECK(std::isfinite(l));
    CHECK(engine.global_steps() == 5);
  });
  CHECK(resharded == world);
  CHECK(same(consolidate(dir, "again"), consolidate(dir, "src")));
}

using S2 = Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Precision<fp16>>;
using S1 = Engine<Partitioner<Stage<1>>, Optimizer<AdamW>, Precision<fp16>>;
using S0 = Engine<Partitioner<Stage<0>>, Optimizer<AdamW>, Precision<fp16>>;
using S3 = Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, Precision<fp16>>;

}  // namespace

TEST_CASE("saved on 4 ranks at stage 2, loaded on 1, 2, 3 and 8 ranks and stages 0-2: masters and moments bitwise") {
  ScratchDir d("reshard");
  const std::vector<float> params = save_on_four<S2>(d.path());
  const Consolidated src = consolidate(d.path(), "src");
  CHECK(src.global_steps == 3);
  SUBCASE("1 rank, stage 0") { load_on<S0>(d.path(), 1, 256, params); }
  SUBCASE("2 ranks, stage 1") { load_on<S1>(d.path(), 2, 256, params); }
  SUBCASE("3 ranks, stage 2") { load_on<S2>(d.path(), 3, 256, params); }
  SUBCASE("8 ranks, stage 2 (some ranks own padding only in some buckets)") { load_on<S2>(d.path(), 8, 256, params); }
  SUBCASE("4 ranks, stage 2, another bucket size") { load_on<S2>(d.path(), 4, 1000, params); }
}

TEST_CASE("stage 3 checkpoints: saved on 4 ranks, loaded at stages 2 and 3 on other world sizes, and back") {
  ScratchDir d("reshard3");
  const std::vector<float> params = save_on_four<S3>(d.path());
  SUBCASE("3 ranks, stage 2") { load_on<S2>(d.path(), 3, 256, params); }
  SUBCASE("2 ranks, stage 3") { load_on<S3>(d.path(), 2, 256, params); }
  SUBCASE("1 rank, stage 3, another bucket size") { load_on<S3>(d.path(), 1, 1000, params); }
  SUBCASE("a stage 2 checkpoint on 3 ranks at stage 3") {
    ScratchDir d2("reshard23");
    const std::vector<float> p2 = save_on_four<S2>(d2.path());
    load_on<S3>(d2.path(), 3, 256, p2);
  }
}

TEST_CASE("saved at stage 0 (every rank holds everything): each rank reads the fewest files") {
  ScratchDir d("reshard0");
  const std::vector<float> params = save_on_four<S0>(d.path());
  load_on<S2>(d.path(), 2, 256, params);
  // The plan reads only rank 0's file for a rank that did not exist, and its own file otherwise.
  const checkpoint::Manifest m = checkpoint::verify(d.path(), "src");
  checkpoint::EngineSignature sig;
  sig.rank = 5;
  sig.shards = m.shards;
  const auto want = m.shards.fragments;
  std::vector<std::vector<zero::Fragment>> mine;
  for (const auto& g : want) mine.push_back(g[2]);
  CHECK(checkpoint::plan_reshard(m, m.shards, mine, 5, "m").size() == 1);
  CHECK(checkpoint::plan_reshard(m, m.shards, mine, 5, "m").begin()->first == 0);
  CHECK(checkpoint::plan_reshard(m, m.shards, mine, 2, "m").begin()->first == 2);
}

TEST_CASE("the same layout loads from the rank's own file without resharding") {
  ScratchDir d("noreshard");
  save_on_four<S2>(d.path());
  const RunConfig cfg = config(4);
  comm::run_threads(4, [&](auto& comm) {
    Mlp<half> model;
    S1 engine(comm, model, engine_options(cfg));  // stage 1 partitions exactly like stage 2
    engine.set_scheduler(warmup_schedule());
    CHECK(!checkpoint::load(engine, comm, d.path(), {.tag = "src"}).resharded);
  });
}

}  // namespace test_reshard
