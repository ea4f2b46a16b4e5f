// ZeRO stage 3 with the threads communicator:
//  - every fetch setting (prefetch, reuse, persistence, reshard_after_forward, a tight live bound)
//    gives stage 2's bits;
//  - per-rank model states are 16 Psi / N; the gathered pool stays within its bound and does not grow;
//  - bytes per step: 3 Psi (W-1)/W through all-gather + reduce-scatter (2 Psi without resharding);
//  - ranks running their layers in different orders get an error naming both orders, not a hang;
//  - Engine::gather: reading and writing parameters outside the layers' scopes;
//  - emulated 16-bit (float Params over bf16/fp16 storage): stage 2's bits, and float compute copies
//    only of what is gathered, within their bound;
//  - zero_allowed_param_types / zero_force_param_types: which module types are partitioned.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "blob_model.hpp"
#include "engine_fixture.hpp"
#include "threads_train.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/engine.hpp"

namespace test_stage3 {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using namespace zt_test;

TEST_CASE("stage 3 fetch settings all give stage 2's bits (fp16, overflow steps, GAS 2, clipping, W = 3)") {
  RunConfig cfg;
  cfg.world = 3;
  cfg.steps = 14;
  cfg.gas = 2;
  cfg.clip = 0.05;
  cfg.poison_steps = {3, 8};
  const RunResult ref = train<2, fp16>(cfg);
  CHECK(ref.params != ref.initial);

  struct Variant {
    const char* name;
    Stage3Options o;
  };
  std::vector<Variant> variants;
  variants.push_back({"defaults (every parameter persistent)", {}});
  Stage3Options fetched;
  fetched.param_persistence_threshold = 0;
  variants.push_back({"all fetched, prefetch and reuse", fetched});
  Stage3Options bare = fetched;
  bare.prefetch_bucket_size = 0;
  bare.max_reuse_distance = 0;
  variants.push_back({"no prefetch, no reuse", bare});
  Stage3Options kept = fetched;
  kept.reshard_after_forward = false;
  variants.push_back({"reshard_after_forward false", kept});
  Stage3Options tight = fetched;
  tight.max_live_parameters = 100;
  variants.push_back({"max_live_parameters 100", tight});
  Stage3Options some = fetched;
  some.param_persistence_threshold = 20;   // the biases
  some.model_persistence_threshold = 20;   // ... but only the first
  variants.push_back({"some persistent", some});
  for (const Variant& v : variants) {
    CAPTURE(v.name);
    RunConfig c = cfg;
    c.stage3 = v.o;
    const RunResult r = train<3, fp16>(c);
    CHECK(r.ranks_agree);
    CHECK(r.params == ref.params);
    CHECK(r.losses == ref.losses);
    CHECK(r.skipped == ref.skipped);
    CHECK(r.norms == ref.norms);
  }
}

namespace {

std::uint64_t gather_and_scatter_bytes(const comm::CommStats& s) {
  return s[comm::OpKind::all_gather].wire_bytes + s[comm::OpKind::reduce_scatter].wire_bytes;
}

void memory_and_volume(int world, bool reshard, bool prefetch) {
  using E = Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, Precision<fp16>, Bucketer<Bytes<(1 << 20)>>>;
  comm::run_threads(world, [&](auto& comm) {
    Blob model(kBlob);
    EngineOptions o;
    o.stage3.param_persistence_threshold = 0;
    o.stage3.reshard_after_forward = reshard;
    o.stage3.max_reuse_distance = 0;  // release after every scope (the default keeps what comes back soon)
    const std::size_t largest = *std::max_element(kBlob.begin(), kBlob.end());
    o.stage3.prefetch_bucket_size = prefetch ? largest : 0;
    E engine(comm, model, o);
    engine.initialize_master();
    blob_step(engine, model);  // records the order
    const std::uint64_t before = gather_and_scatter_bytes(engine.comm_stats());
    blob_step(engine, model);  // follows it: prefetches, reuses
    const std::uint64_t per_step = gather_and_scatter_bytes(engine.comm_stats()) - before;
    const std::size_t peak2 = engine.memory().peak(MemoryCategory::gathered);
    for (int s = 0; s < 100; ++s) blob_step(engine, model);
    const std::size_t peak100 = engine.memory().peak(MemoryCategory::gathered);
    // Outside scopes nothing is gathered, and a Param has no values.
    CHECK(engine.memory().live(MemoryCategory::gathered) > 0);  // the pool stays allocated...
    CHECK(model.ps[0].data() == nullptr);                       // ...but holds no bucket
    if (comm.rank() != 0) return;

    const double pad = static_cast<double>(engine.flat_numel()), N = world;
    const auto& m = engine.memory();
    const double model_state = static_cast<double>(m.live(MemoryCategory::params16) + m.live(MemoryCategory::grads) +
                                                   m.live(MemoryCategory::master32) +
                                                   m.live(MemoryCategory::optimizer_state));
    std::printf("stage 3 W=%d reshard=%d prefetch=%d  model states %.0f B = 16 Psi/N %.0f; gathered pool peak %zu B "
                "(largest bucket %zu B); all-gather + reduce-scatter %llu B/step\n",
                world, reshard, prefetch, model_state, 16 * pad / N, peak100, 2 * largest,
                static_cast<unsigned long long>(per_step));
    CHECK(model_state == 16 * pad / N);
    // Pool buffers hold one bucket each, sized for the largest: one for the open scope, plus those
    // prefetched (at most as many buckets as fit in the budget, smallest first).
    std::vector<std::size_t> sizes = kBlob;
    std::sort(sizes.begin(), sizes.end());
    std::size_t ahead = 0, budget = o.stage3.prefetch_bucket_size;
    for (std::size_t n : sizes) {
      if (n > budget) break;
      budget -= n;
      ++ahead;
    }
    const std::size_t align = 2 * static_cast<std::size_t>(world);
    const std::size_t slot = sizeof(half) * ((largest + align - 1) / align * align);
    if (reshard) {
      CHECK(peak100 <= (1 + ahead) * slot);
      if (!prefetch) CHECK(peak100 == slot);
    }
    CHECK(peak100 == peak2);  // no growth in steady state
    const double passes = reshard ? 3 : 2;
    CHECK(static_cast<double>(per_step) == passes * pad * 2.0 * (N - 1) / N);
  });
}
}  // namespace

TEST_CASE("stage 3 memory is 16 Psi/N plus a bounded pool; 3 Psi (W-1)/W bytes per step, 2 Psi kept gathered") {
  for (int world : {2, 4}) {
    memory_and_volume(world, true, false);
    memory_and_volume(world, true, true);
    memory_and_volume(world, false, true);
  }
}

TEST_CASE("stage 3: ranks running layers in different orders get an error naming both, never a hang") {
  using E = Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, Precision<fp16>>;
  SUBCASE("same collectives: the order check at step() names both sequences") {
    std::string what;
    try {
      comm::run_threads(2, [&](auto& comm) {
        Blob model({64, 64, 64});
        EngineOptions o;
        o.stage3.param_persistence_threshold = 0;
        o.stage3.prefetch_bucket_size = 0;  // prefetching by the recorded order would differ first
        o.stage3.max_reuse_distance = 0;
        E engine(comm, model, o);
        blob_step(engine, model);
        blob_step(engine, model, comm.rank() == 0 ? std::vector<int>{0, 1, 2} : std::vector<int>{1, 0, 2});
      });
    } catch (const usage_error& e) {
      what = e.what();
    }
    INFO(what);
    CHECK(what.find("different orders") != std::string::npos);
    CHECK(what.find("micro-step 2") != std::string::npos);
    CHECK(what.find("rank 0: [forward p0, forward p1") != std::string::npos);
    CHECK(what.find("rank 1: [forward p1, forward p0") != std::string::npos);
  }
  for (bool prefetch : {false, true}) {
    CAPTURE(prefetch);
    // Different sizes (or a prefetch by the recorded order that one rank left): the collectives
    // mismatch, and the error carries the rank's order of scopes.
    std::string what;
    try {
      comm::run_threads(2, [&](auto& comm) {
        Blob model({64, 96, 128});
        EngineOptions o;
        o.stage3.param_persistence_threshold = 0;
        if (!prefetch) o.stage3.prefetch_bucket_size = 0;
        E engine(comm, model, o);
        blob_step(engine, model);
        blob_step(engine, model, comm.rank() == 0 ? std::vector<int>{0, 1, 2} : std::vector<int>{2, 1, 0});
      });
    } catch (const comm_error& e) {
      what = e.what();
    }
    INFO(what);
    CHECK(what.find("ran [forward p") != std::string::npos);
    // Whichever rank's error comes first: rank 1 changed its order and is told so, naming both;
    // rank 0 kept its order, and its error does not blame one (issue 57 item 3).
    if (what.find("different orders") != std::string::npos) {
      CHECK(what.find("the previous one ran [forward p0, forward p1, forward p2") != std::string::npos);
      CHECK(what.find("rank 1 ran [forward p2") != std::string::npos);
    } else {
      CHECK(what.find("rank 0 ran [forward p0") != std::string::npos);
      CHECK(what.find("in the same order as the previous one") != std::string::npos);
    }
  }
}

TEST_CASE("stage 3 gather scope: read and write parameters outside the layers' scopes") {
  using E = Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, Precision<fp32>>;
  comm::run_threads(3, [&](auto& comm) {
    Mlp<float> model;
    EngineOptions o;
    o.stage3.param_persistence_threshold = 0;
    E engine(comm, model, o);
    CHECK(model.layers[0].w.data() == nullptr);
    CHECK_THROWS_AS(engine.broadcast_parameters(), usage_error);
    {
      auto g = engine.gather(model, 1);  // rank 1's writes are kept
      for (auto& l : model.layers) {
        for (std::size_t i = 0; i < l.w.numel(); ++i) l.w.data()[i] = static_cast<float>(comm.rank() * 1000 + i);
      }
    }
    CHECK(model.layers[0].w.data() == nullptr);
    engine.initialize_master();
    {
      auto g = engine.gather(model.layers[2]);
      for (std::size_t i = 0; i < model.layers[2].w.numel(); ++i) CHECK(model.layers[2].w.data()[i] == static_cast<float>(1000 + i));
    }
    CHECK_THROWS_AS((void)engine.gather(model, 3), usage_error);
  });
}

namespace {

template <class Prec>
void emulated_matches_stage2(RunConfig cfg) {
  const RunResult ref = train<2, Prec, Mlp<float>>(cfg);
  CHECK(ref.params != ref.initial);
  Stage3Options fetched;
  fetched.param_persistence_threshold = 0;
  Stage3Options bare = fetched;
  bare.prefetch_bucket_size = 0;
  bare.max_reuse_distance = 0;
  Stage3Options kept = fetched;
  kept.reshard_after_forward = false;
  for (const Stage3Options& o : {Stage3Options{}, fetched, bare, kept}) {
    CAPTURE(o.param_persistence_threshold);
    CAPTURE(o.max_reuse_distance);
    CAPTURE(o.reshard_after_forward);
    cfg.stage3 = o;
    const RunResult r = train<3, Prec, Mlp<float>>(cfg);
    CHECK(r.ranks_agree);
    CHECK(r.initial == ref.initial);  // gather(model, 0) kept rank 0's writes, rounded to 16 bits
    CHECK(r.params == ref.params);
    CHECK(r.losses == ref.losses);
    CHECK(r.skipped == ref.skipped);
    CHECK(r.norms == ref.norms);
  }
}

}  // namespace

TEST_CASE("emulated 16-bit at stage 3 (float Params over bf16 / fp16) gives emulated stage 2's bits") {
  RunConfig cfg;
  cfg.steps = 8;
  cfg.gas = 2;
  cfg.clip = 0.05;
  for (int world : {1, 2, 3}) {
    CAPTURE(world);
    cfg.world = world;
    cfg.poison_steps = {};
    emulated_matches_stage2<bf16>(cfg);
    cfg.poison_steps = {2, 5};  // overflow steps: skipped, the scale backs off
    emulated_matches_stage2<fp16>(cfg);
  }
}

namespace {

/// Emulated bf16 over BasicBlob<float>: the float compute buffers (ledger: other, less the scratch
/// of the largest parameter) stay within 2 x (gathered pool buffers) x largest bucket, and do not grow.
void float_pool_bound(int world, bool prefetch) {
  using E = Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, Precision<bf16>, Bucketer<Bytes<(1 << 20)>>>;
  comm::run_threads(world, [&](auto& comm) {
    BasicBlob<float> model(kBlob);
    EngineOptions o;
    o.stage3.param_persistence_threshold = 0;
    o.stage3.max_reuse_distance = 0;
    const std::size_t largest = *std::max_element(kBlob.begin(), kBlob.end());
    o.stage3.prefetch_bucket_size = prefetch ? largest : 0;
    E engine(comm, model, o);
    engine.initialize_master();
    const std::size_t scratch = sizeof(float) * largest;
    blob_step(engine, model);
    blob_step(engine, model);
    const std::size_t peak2 = engine.memory().peak(MemoryCategory::other);
    for (int s = 0; s < 100; ++s) blob_step(engine, model);
    const auto& m = engine.memory();
    const std::size_t peak100 = m.peak(MemoryCategory::other);
    CHECK(model.ps[1].data() == nullptr);
    const std::size_t align = 2 * static_cast<std::size_t>(world);
    const std::size_t slot = (largest + align - 1) / align * align;  // elements of the largest bucket
    const std::size_t gathered_buffers = m.peak(MemoryCategory::gathered) / (sizeof(bfloat16) * slot);
    const std::size_t float_bytes = peak100 - scratch;
    if (comm.rank() == 0) {
      std::printf("emulated stage 3 W=%d prefetch=%d: float compute buffers %zu B (%zu x %zu floats), gathered pool "
                  "%zu buffers; stage 2's float copies of all values and gradients: %zu B\n",
                  world, prefetch, float_bytes, float_bytes / (sizeof(float) * slot), slot, gathered_buffers,
                  2 * sizeof(float) * engine.flat_numel());
    }
    CHECK(float_bytes % (sizeof(float) * slot) == 0);
    CHECK(float_bytes <= 2 * gathered_buffers * sizeof(float) * slot);
    if (!prefetch) CHECK(float_bytes == 2 * sizeof(float) * slot);  // the open bucket's values and gradients
    CHECK(float_bytes < 2 * sizeof(float) * engine.flat_numel());    // less than FloatView's two full copies
    CHECK(peak100 == peak2);                                          // no growth in steady state
    CHECK(m.live(MemoryCategory::other) == peak100);                  // kept for reuse, not freed and re-made
  });
}

}  // namespace

TEST_CASE("emulated stage 3: float compute copies only of gathered buckets, bounded, no growth") {
  for (int world : {2, 3}) {
    float_pool_bound(world, false);
    float_pool_bound(world, true);
  }
}

namespace {

/// The fixture's MLP with typed sub-modules: the hidden layers are "Hidden", the last "Head".
template <class T>
struct TypedMlp : Mlp<T> {
  template <const char* Type>
  struct Typed {
    static constexpr std::string_view module_type = Type;
    Dense<T>* layer;
    template <class V>
    void parameters(V&& visit) {
      layer->parameters(visit);
    }
  };
  static constexpr char kHidden[] = "Hidden";
  static constexpr char kHead[] = "Head";
  template <class V>
  void modules(V&& visit) {
    for (std::size_t l = 0; l < this->layers.size(); ++l) {
      if (l + 1 < this->layers.size()) {
        Typed<kHidden> m{&this->layers[l]};
        visit(m);
      } else {
        Typed<kHead> m{&this->layers[l]};
        visit(m);
      }
    }
  }
};

}  // namespace

TEST_CASE("stage 3 partitions only the allowed module types and never the forced ones, with stage 2's bits") {
  RunConfig cfg;
  cfg.world = 3;
  cfg.steps = 8;
  cfg.gas = 2;
  cfg.poison_steps = {3};
  const RunResult ref = train<2, fp16>(cfg);
  cfg.stage3.param_persistence_threshold = 0;  // only the type lists keep parameters unpartitioned
  cfg.stage3.model_persistence_threshold = 0;

  struct Variant {
    const char* name;
    std::vector<std::string> allowed, forced;
  };
  const Variant variants[] = {{"zero_force_param_types [Head]", {}, {"Head"}},
                              {"zero_allowed_param_types [Hidden]", {"Hidden"}, {}},
                              {"both lists", {"Hidden"}, {"Head"}}};
  using E = Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, Precision<fp16>>;
  for (const Variant& v : variants) {
    CAPTURE(v.name);
    RunConfig c = cfg;
    c.stage3.partitioned_module_types = v.allowed;
    c.stage3.replicated_module_types = v.forced;
    const RunResult r = train<3, fp16, TypedMlp<half>>(c);
    CHECK(r.params == ref.params);
    CHECK(r.losses == ref.losses);
    CHECK(r.skipped == ref.skipped);

    // Outside every scope, after a step: the head stays gathered on every rank, the rest is sharded.
    comm::run_threads(2, [&](auto& comm) {
      TypedMlp<half> model;
      E engine(comm, model, engine_options(c));
      {
        auto g = engine.gather(model, 0);
        model.init(1);
      }
      engine.initialize_master();
      train_steps(engine, model, comm.rank(), c, 0, 1, nullptr);
      CHECK(model.layers.back().w.data() != nullptr);
      CHECK(model.layers.back().b.data() != nullptr);
      CHECK(model.layers.front().w.data() == nullptr);
    });
  }
}

TEST_CASE("stage 3: a module type no module declares is an error naming it and the declared types") {
  using E = Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, Precision<fp16>>;
  {
    for (bool forced : {false, true}) {
      std::string what, where;
      try {
        comm::run_threads(1, [&](auto& comm) {
          TypedMlp<half> model;
          EngineOptions o;
          (forced ? o.stage3.replicated_module_types : o.stage3.partitioned_module_types) = {"Heda"};
          E engine(comm, model, o);
        });
      } catch (const config_error& e) {
        what = e.what();
        where = e.where();
      }
      INFO(what);
      CHECK(what.find("(got Heda)") != std::string::npos);
      CHECK(what.find("types declared: Hidden, Head") != std::string::npos);
      CHECK(where.find(forced ? "zero_force_param_types" : "zero_allowed_param_types") != std::string::npos);
    }
  }
}

// ---- hpZ (zero_hpz_partition_size g > 1): a secondary shard within groups of g ranks ----------

TEST_CASE("stage 3 hpZ (g = 2 and g = W at W = 4) gives the bits of hpZ off (fp16, overflow steps, GAS 2, clipping)") {
  RunConfig cfg;
  cfg.world = 4;
  cfg.steps = 12;
  cfg.gas = 2;
  cfg.clip = 0.05;
  cfg.poison_steps = {3, 8};
  struct Variant {
    const char* name;
    Stage3Options o;
  };
  Stage3Options fetched;
  fetched.param_persistence_threshold = 0;
  Stage3Options bare = fetched;  // every backward gathers (from the secondary shard with hpZ)
  bare.prefetch_bucket_size = 0;
  bare.max_reuse_distance = 0;
  Stage3Options some = bare;
  some.param_persistence_threshold = 20;  // the biases stay gathered: no secondary slice for them
  for (const Variant& base : {Variant{"all fetched, prefetch and reuse", fetched}, Variant{"no prefetch, no reuse", bare},
                              Variant{"no reuse, some persistent", some}}) {
    CAPTURE(base.name);
    RunConfig off = cfg;
    off.stage3 = base.o;
    const RunResult ref = train<3, fp16>(off);
    CHECK(ref.params != ref.initial);
    CHECK(std::count(ref.skipped.begin(), ref.skipped.end(), 1) >= 2);  // the overflow steps were skipped
    for (int g : {2, 4}) {
      CAPTURE(g);
      RunConfig c = off;
      c.stage3.reshard_after_forward = ReshardAfterForward::group(g);
      const RunResult r = train<3, fp16>(c);
      CHECK(r.ranks_agree);
      CHECK(r.params == ref.params);
      CHECK(r.losses == ref.losses);
      CHECK(r.scales == ref.scales);
      CHECK(r.skipped == ref.skipped);
      CHECK(r.norms == ref.norms);
    }
  }
}

namespace {

struct HpzVolume {
  comm::CommStats world, group;  // one step's counters (the second step)
  std::size_t secondary_live = 0, secondary_peak = 0, secondary_live_step2 = 0;
  std::size_t flat_numel = 0, persistent_numel = 0;
  std::size_t model_states = 0, gathered_peak = 0;
};

comm::CommStats minus(const comm::CommStats& a, const comm::CommStats& b) {
  comm::CommStats d;
  for (std::size_t i = 0; i < comm::kOpKindCount; ++i) {
    d.by_op[i].calls = a.by_op[i].calls - b.by_op[i].calls;
    d.by_op[i].payload_bytes = a.by_op[i].payload_bytes - b.by_op[i].payload_bytes;
    d.by_op[i].wire_bytes = a.by_op[i].wire_bytes - b.by_op[i].wire_bytes;
  }
  return d;
}

/// Rank 0's counters of step 2 on both communicators, and the ledger after 102 steps; reuse off, so
/// every backward gathers again.
HpzVolume hpz_volume(int world, int g, std::size_t persistence_threshold, bool prefetch) {
  using E = Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, Precision<fp16>, Bucketer<Bytes<(1 << 20)>>>;
  HpzVolume v;
  comm::run_threads(world, [&](auto& comm) {
    Blob model(kBlob);
    EngineOptions o;
    o.stage3.param_persistence_threshold = persistence_threshold;
    o.stage3.max_reuse_distance = 0;
    o.stage3.prefetch_bucket_size = prefetch ? 150'000 : 0;
    o.stage3.reshard_after_forward = ReshardAfterForward::group(g);
    E engine(comm, model, o);
    engine.initialize_master();
    CHECK((engine.group_comm_stats() != nullptr) == (g > 1));
    const comm::CommStats none{};
    auto group = [&] { return engine.group_comm_stats() ? *engine.group_comm_stats() : none; };
    blob_step(engine, model);
    const comm::CommStats w0 = engine.comm_stats(), g0 = group();
    blob_step(engine, model);
    const comm::CommStats w1 = engine.comm_stats(), g1 = group();
    const std::size_t live2 = engine.memory().live(MemoryCategory::secondary);
    for (int s = 0; s < 100; ++s) blob_step(engine, model);
    if (comm.rank() != 0) return;
    v.world = minus(w1, w0);
    v.group = minus(g1, g0);
    v.secondary_live_step2 = live2;
    v.secondary_live = engine.memory().live(MemoryCategory::secondary);
    v.secondary_peak = engine.memory().peak(MemoryCategory::secondary);
    v.flat_numel = engine.flat_numel();
    const auto& m = engine.memory();
    v.model_states = m.live(MemoryCategory::params16) + m.live(MemoryCategory::grads) +
                     m.live(MemoryCategory::master32) + m.live(MemoryCategory::optimizer_state);
    v.gathered_peak = m.peak(MemoryCategory::gathered);
  });
  return v;
}

/// Blob's buckets are one parameter each (1 MiB buckets, one unit per parameter): padded to 2W.
std::size_t padded(std::size_t n, int world) {
  const std::size_t a = 2 * static_cast<std::size_t>(world);
  return (n + a - 1) / a * a;
}

}  // namespace

TEST_CASE("stage 3 hpZ bytes: forward gathers over the world, backward gathers only inside the group") {
  for (int g : {2, 4}) {
    for (bool prefetch : {false, true}) {
      CAPTURE(g);
      CAPTURE(prefetch);
      const int world = 4;
      const HpzVolume off = hpz_volume(world, 1, 0, prefetch);
      const HpzVolume v = hpz_volume(world, g, 0, prefetch);
      const std::uint64_t pad = v.flat_numel, W = world, G = static_cast<std::uint64_t>(g), elem = sizeof(half);
      std::uint64_t check_pad = 0;
      for (std::size_t n : kBlob) check_pad += padded(n, world);
      REQUIRE(pad == check_pad);
      const std::uint64_t world_gather = pad * (W - 1) / W * elem, group_gather = pad * (G - 1) / G * elem;
      std::printf("hpZ W=%d g=%d prefetch=%d: world all-gather %llu B/step (forward), group all-gather %llu B/step "
                  "(backward), reduce-scatter %llu B/step; hpZ off: all-gather %llu B/step\n",
                  world, g, prefetch, static_cast<unsigned long long>(v.world[comm::OpKind::all_gather].wire_bytes),
                  static_cast<unsigned long long>(v.group[comm::OpKind::all_gather].wire_bytes),
                  static_cast<unsigned long long>(v.world[comm::OpKind::reduce_scatter].wire_bytes),
                  static_cast<unsigned long long>(off.world[comm::OpKind::all_gather].wire_bytes));
      // hpZ off: forward and backward both gather over the world.
      CHECK(off.world[comm::OpKind::all_gather].wire_bytes == 2 * world_gather);
      // hpZ: the world carries the forward's gathers only; the backward's stay in the group.
      CHECK(v.world[comm::OpKind::all_gather].wire_bytes == world_gather);
      CHECK(v.group[comm::OpKind::all_gather].wire_bytes == group_gather);
      CHECK(v.group[comm::OpKind::all_gather].calls == kBlob.size());  // one per bucket's backward
      CHECK(v.group.total_wire_bytes() == v.group[comm::OpKind::all_gather].wire_bytes);  // nothing else there
      // The gradients' reduce-scatter is unchanged.
      CHECK(v.world[comm::OpKind::reduce_scatter].wire_bytes == pad * (W - 1) / W * elem);
      CHECK(v.world[comm::OpKind::reduce_scatter].wire_bytes == off.world[comm::OpKind::reduce_scatter].wire_bytes);
      CHECK(v.world.total_wire_bytes() + v.group.total_wire_bytes() ==
            off.world.total_wire_bytes() - world_gather + group_gather);
    }
  }
}

TEST_CASE("stage 3 hpZ memory: the secondary shard is S Psi_pad / g (persistent buckets excluded), no growth") {
  const int world = 4;
  for (int g : {1, 2, 4}) {
    for (std::size_t threshold : {std::size_t{0}, std::size_t{10}}) {
      CAPTURE(g);
      CAPTURE(threshold);
      const HpzVolume v = hpz_volume(world, g, threshold, true);
      // threshold 10: the 9-element parameter is persistent; its bucket has no secondary slice.
      std::size_t fetched = 0;
      for (std::size_t n : kBlob) {
        if (n > threshold) fetched += padded(n, world);
      }
      const std::size_t expect = g > 1 ? sizeof(half) * fetched / static_cast<std::size_t>(g) : 0;
      std::printf("hpZ W=%d g=%d persistence %zu: secondary shard %zu B (S Psi_pad/g = %zu B); model states %zu B\n", world,
                  g, threshold, v.secondary_live, expect, v.model_states);
      CHECK(v.secondary_live == expect);
      CHECK(v.secondary_live_step2 == expect);
      CHECK(v.secondary_peak == expect);  // allocated once, never grows
      CHECK(v.model_states * static_cast<std::size_t>(world) == 16 * v.flat_numel);  // unchanged: 16 Psi_pad / N
    }
  }
}

TEST_CASE("stage 3 hpZ: the group size must divide the world size; below stage 3 it is ignored") {
  using E3 = Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, Precision<fp16>>;
  using E2 = Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Precision<fp16>>;
  for (int g : {3, 8, -1}) {
    CAPTURE(g);
    std::vector<std::string> what(4);
    comm::run_threads(4, [&](auto& comm) {
      Blob model({64, 64});
      EngineOptions o;
      o.stage3.reshard_after_forward = ReshardAfterForward::group(g);
      try {
        E3 engine(comm, model, o);
      } catch (const config_error& e) {
        what[static_cast<std::size_t>(comm.rank())] = e.what();
      }
    });
    for (const std::string& w : what) {
      INFO(w);
      CHECK(w.find("zero_hpz_partition_size") != std::string::npos);
      CHECK(w.find(std::to_string(g)) != std::string::npos);
      CHECK(w.find(g > 0 ? "must divide the world size (4)" : "must be >= 1") != std::string::npos);
    }
  }
  comm::run_threads(4, [&](auto& comm) {
    Blob model2({64, 64}), model3({64, 64});
    EngineOptions o;
    o.stage3.reshard_after_forward = ReshardAfterForward::group(2);
    o.stage3.param_persistence_threshold = 0;  // persistent buckets have no secondary slice
    E2 stage2(comm, model2, o);  // Stage3Options mean nothing below stage 3
    CHECK(stage2.memory().live(MemoryCategory::secondary) == 0);
    E3 stage3(comm, model3, o);
    CHECK(stage3.group_comm_stats() != nullptr);
    CHECK(stage3.memory().live(MemoryCategory::secondary) == sizeof(half) * 2 * 64 / 2);  // S Psi_pad / g
  });
  // A bool still converts: false keeps a layer gathered to its backward, true is hpZ off.
  Stage3Options s;
  CHECK(s.reshard_after_forward.group_size() == 1);
  s.reshard_after_forward = false;
  CHECK(!s.reshard_after_forward);
  CHECK(s.reshard_after_forward.group_size() == 0);
  s.reshard_after_forward = ReshardAfterForward::group(2);
  CHECK(static_cast<bool>(s.reshard_after_forward));
  CHECK(s.reshard_after_forward.hierarchical());
}

}  // namespace test_stage3
