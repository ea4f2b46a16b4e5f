// Expert parameters in the engine (issue 58): a mixture-of-experts layer (a dense router, E experts
// y = tanh(W_e x), the dispatcher in between) trained by the engine on 4 thread ranks, its experts
// declared by their Params (`expert()`) or by name (ModelOptions::expert). ZeRO reduces and shards
// the router over the data group and the experts over the expert-data group, averaging both over
// the data size.
//  - expert parallel 4 (each rank one expert, expert-data groups of 1) against expert parallel 1
//    (every rank every expert, expert-data group = data group): the same losses, norms and
//    parameters bit for bit at ZeRO stages 0-3 (and stage 3 with optimizer and parameter offload),
//    since each expert sums its weight gradient per source rank in source order, which is the
//    rank-order all-reduce of expert parallel 1 (6 steps, gas 1 and 2, clipping on);
//  - expert parallel 2 x expert-data 2 adds the sources in another order: equal to rounding;
//  - in emulated bf16 (float Params over bf16 storage) stages 0-3 agree bit for bit at expert
//    parallel 4, the Params seeing bf16 values near the fp32 run's;
//  - tensor 2 x data 2 at expert parallel 2 (expert_tensor 2, experts whole) equals tensor 1 bit for bit;
//  - a checkpoint saved at expert parallel 4 loads at 1 and 2 (resharded by name through the whole
//    parameters) and at 4: exactly what was saved, and training goes on as the uninterrupted run
//    (bit for bit at 1 and 4, to rounding at 2); the safetensors export writes every expert whole;
//  - DeepSpeed's expert_parallel block sizes the grid (grid_shape) and the checker holds the engine to it;
//  - gather(model, 0) keeps data rank 0's dense writes and each expert group's first rank's expert
//    writes, at stages 1 and 3;
//  - what has no expert meaning yet is refused in words (broadcast_parameters, save_16bit_model, a
//    checkpoint through the data group instead of the grid, or through a grid whose expert layout is
//    not the engine's).
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "moe_fixture.hpp"
#include "zerotk/comm/grid.hpp"
#include "zerotk/checkpoint/export.hpp"
#include "zerotk/checkpoint/grid.hpp"
#include "zerotk/checkpoint/save_16bit.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/config/reader.hpp"
#include "zerotk/engine_config.hpp"
#include "zerotk/engine.hpp"
#include "zerotk/moe/dispatcher.hpp"
#include "zerotk/moe/router.hpp"
#include "zerotk/plan/experts.hpp"

namespace test_moe_engine {

using namespace zerotk;

namespace {

constexpr int kE = 4, kH = 6, kT = 8, kK = 2;
constexpr std::size_t kHH = static_cast<std::size_t>(kH) * kH;

std::vector<float> values(std::size_t n, std::uint32_t seed, float scale) { return test::lcg_values(n, seed, scale, 77u); }

/// A Param that says it belongs to an expert.
struct ExpertParam : Param<float> {
  using Param<float>::Param;
  bool expert() const noexcept { return true; }
};

/// The router (dense) and this rank's experts (`Declared`: ExpertParam; otherwise plain Params the
/// engine recognises by name).
template <bool Declared>
struct MoeModel {
  using EP = std::conditional_t<Declared, ExpertParam, Param<float>>;
  comm::ThreadsCommunicator* ep;  // the expert group
  int first, local;
  Param<float> router{"router.weight", {kE, kH}};
  std::vector<EP> experts;
  std::vector<float> init_router;
  std::vector<std::vector<float>> init_experts;
  // between the forward and the backward
  std::optional<moe::Routing> routing;
  std::optional<moe::Dispatcher<comm::ThreadsCommunicator, moe::Dropless>> dispatcher;
  std::vector<float> x;

  explicit MoeModel(comm::ThreadsCommunicator& group)
      : ep(&group), first(group.rank() * (kE / group.size())), local(kE / group.size()) {
    init_router = values(static_cast<std::size_t>(kE) * kH, 1, 0.5f);
    router.bind(init_router.data(), nullptr);
    experts.reserve(static_cast<std::size_t>(local));
    init_experts.reserve(static_cast<std::size_t>(local));
    for (int e = 0; e < local; ++e) {
      const int g = first + e;
      experts.emplace_back("experts." + std::to_string(g) + ".weight", std::initializer_list<std::size_t>{kHH});
      init_experts.push_back(values(kHH, 100 + static_cast<std::uint32_t>(g), 0.4f));
      experts.back().bind(init_experts.back().data(), nullptr);
    }
  }
  template <class V>
  void parameters(V&& visit) {
    visit(router.name(), router);
    for (auto& p : experts) visit(p.name(), p);
  }
  static bool by_name(std::string_view name) { return name.starts_with("experts."); }

  /// One micro-step on batch `b` of data rank `d`; returns the loss.
  template <class E>
  double step(E& engine, int b, int d) {
    const std::uint32_t seed = 1000 + 7 * static_cast<std::uint32_t>(b) + 31 * static_cast<std::uint32_t>(d);
    x = values(static_cast<std::size_t>(kT) * kH, seed, 1.0f);
    const std::vector<float> target = values(x.size(), seed + 500, 0.8f);
    std::vector<float> y(x.size());
    {
      auto scope = engine.forward(*this);
      const std::vector<float> logits = test::router_logits(router.values(), x, kE, kH);
      routing = moe::route(logits, kT, kE, {.top_k = kK, .renormalize = true});
      dispatcher.emplace(*ep, kE, kH, moe::Dropless{});
      dispatcher->dispatch(x, *routing);
      for (int e = 0; e < local; ++e) {
        test::expert_forward(experts[static_cast<std::size_t>(e)].values(), dispatcher->input(e), dispatcher->output(e), kH);
      }
      dispatcher->combine(y);
    }
    std::vector<float> dy(y.size());
    const double loss = test::mse(y, target, dy);
    {
      auto scope = engine.backward(*this);
      std::vector<float> d_gate(routing->gate.size());
      dispatcher->combine_backward(dy, d_gate);
      for (int e = 0; e < local; ++e) {
        auto& p = experts[static_cast<std::size_t>(e)];
        test::add_expert_grads(*dispatcher, e, ep->size(), p.values(), p.grads(), kH);
      }
      std::vector<float> dx(x.size(), 0.0f), d_logits(static_cast<std::size_t>(kT) * kE);
      dispatcher->dispatch_backward(dx);
      moe::route_backward(*routing, d_gate, d_logits);
      test::add_router_grads(router.grads(), d_logits, x, kE, kH);
    }
    return loss;
  }
};

struct Run {
  std::vector<double> norms, losses;
  std::vector<float> router;
  std::vector<std::vector<float>> experts;  // by global expert; empty where this rank holds none
  std::array<std::array<std::size_t, kMemoryCategoryCount>, kMemorySpaceCount> ledger{};  // live bytes after training
};

struct Setup {
  int ep = 1;
  int steps = 6;
  int gas = 1;
  int tensor = 1;  // with expert_tensor = tensor: the experts whole on every tensor rank
  int world = 4;
};

EngineOptions test_options() {
  EngineOptions o;
  o.optimizer.lr = 2e-2f;
  o.gradient_clipping = 0.05;  // the update depends on the global norm: a norm off by a bit shows
  o.reduce_bucket_size = 20;  // several buckets, parameters cut across partitions
  o.stage3.param_persistence_threshold = 0;
  return o;
}

// The router and this rank's experts, by global expert index, as the engine holds them now.
template <class E, class M>
void take_values(E& engine, M& model, Run& r) {
  auto g = engine.gather(model);
  r.router.assign(model.router.values().begin(), model.router.values().end());
  r.experts.resize(kE);
  for (int e = 0; e < model.local; ++e) {
    const auto v = model.experts[static_cast<std::size_t>(e)].values();
    r.experts[static_cast<std::size_t>(model.first + e)].assign(v.begin(), v.end());
  }
}

template <bool Declared, class... Policies>
Run train(comm::ThreadsCommunicator& world, const Setup& s) {
  comm::ProcessGrid grid(world, {.data = 0, .tensor = s.tensor, .expert = s.ep, .expert_tensor = s.tensor});
  MoeModel<Declared> model(grid.expert());
  EngineOptions o = test_options();
  o.gradient_accumulation_steps = s.gas;
  if (!Declared) o.expert = &MoeModel<Declared>::by_name;
  Engine<Policies...> engine(grid, model, o);
  Run r;
  for (int step = 0; step < s.steps * s.gas; ++step) {
    const StepReport rep = engine.step(model.step(engine, step, grid.data_index()));
    if (rep.global_steps > static_cast<std::int64_t>(r.norms.size())) {
      r.norms.push_back(rep.grad_norm);
      r.losses.push_back(rep.loss);
    }
  }
  for (std::size_t sp = 0; sp < kMemorySpaceCount; ++sp) {
    for (std::size_t ca = 0; ca < kMemoryCategoryCount; ++ca) {
      r.ledger[sp][ca] = engine.memory().live(static_cast<MemorySpace>(sp), static_cast<MemoryCategory>(ca));
    }
  }
  take_values(engine, model, r);
  return r;
}

template <bool Declared, class... Policies>
std::vector<Run> train_all(const Setup& s) {
  return comm::run_threads(s.world, [&](comm::ThreadsCommunicator& w) { return train<Declared, Policies...>(w, s); });
}

// Expert parallel `s.ep` against expert parallel 1 with the experts given by name: bit for bit.
template <class... Policies>
void check_same_bits(Setup s) {
  const std::vector<Run> ep = train_all<true, Policies...>(s);
  Setup one = s;
  one.ep = 1;
  const std::vector<Run> ref = train_all<false, Policies...>(one);
  for (int w = 0; w < 4; ++w) {
    CAPTURE(w);
    const Run& got = ep[static_cast<std::size_t>(w)];
    const Run& want = ref[static_cast<std::size_t>(w)];
    REQUIRE(got.norms.size() == static_cast<std::size_t>(s.steps));
    REQUIRE(want.norms.size() == got.norms.size());
    for (std::size_t i = 0; i < got.norms.size(); ++i) {
      CAPTURE(i);
      CHECK(got.norms[i] == want.norms[i]);
      CHECK(got.losses[i] == want.losses[i]);
      CHECK(got.norms[i] > 0.05);  // clipped: the norm entered the update
    }
    CHECK(test::compare_bits("router", got.router.data(), want.router.data(), got.router.size()) == "");
    for (int e = 0; e < kE; ++e) {
      const auto& mine = got.experts[static_cast<std::size_t>(e)];
      if (mine.empty()) continue;
      CHECK(e == w);  // expert parallel 4: rank w holds expert w
      CHECK(test::compare_bits("expert " + std::to_string(e), mine.data(), want.experts[static_cast<std::size_t>(e)].data(),
                               mine.size()) == "");
    }
  }
  // Not trivially equal: the experts moved from their initial values.
  const std::vector<float> init0 = values(kHH, 100, 0.4f);
  CHECK(test::compare_bits("expert 0 against its start", ref[0].experts[0].data(), init0.data(), kHH) != "");
}

using Fp32 = Optimizer<AdamW>;

}  // namespace

TEST_CASE("experts: expert parallel 4 equals expert parallel 1 bit for bit at ZeRO stages 0-3 (6 steps, clipping on)") {
  SUBCASE("stage 0") { check_same_bits<Partitioner<Stage<0>>, Fp32>({.ep = 4}); }
  SUBCASE("stage 1") { check_same_bits<Partitioner<Stage<1>>, Fp32>({.ep = 4}); }
  SUBCASE("stage 2") { check_same_bits<Partitioner<Stage<2>>, Fp32>({.ep = 4}); }
  SUBCASE("stage 3") { check_same_bits<Partitioner<Stage<3>>, Fp32>({.ep = 4}); }
  SUBCASE("stage 2, gas 2") { check_same_bits<Partitioner<Stage<2>>, Fp32>({.ep = 4, .steps = 4, .gas = 2}); }
  SUBCASE("stage 3 with Offload<Cpu> and OffloadParams<Cpu>") {
    check_same_bits<Partitioner<Stage<3>>, Fp32, Precision<fp32>, Offload<Cpu>, OffloadParams<Cpu>>({.ep = 4});
  }
}

namespace {

bool is_bf16(float v) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  return (bits & 0xffffu) == 0;
}

// Every value of `got` equals `want`'s bit for bit (the norms and losses too).
void check_equal_runs(const std::vector<Run>& got, const std::vector<Run>& want, const char* what) {
  CAPTURE(what);
  for (std::size_t w = 0; w < got.size(); ++w) {
    CAPTURE(w);
    CHECK(got[w].norms == want[w].norms);
    CHECK(got[w].losses == want[w].losses);
    CHECK(test::compare_bits("router", got[w].router.data(), want[w].router.data(), got[w].router.size()) == "");
    for (int e = 0; e < kE; ++e) {
      const auto& mine = got[w].experts[static_cast<std::size_t>(e)];
      REQUIRE(mine.size() == want[w].experts[static_cast<std::size_t>(e)].size());
      if (mine.empty()) continue;
      CHECK(test::compare_bits("expert " + std::to_string(e), mine.data(), want[w].experts[static_cast<std::size_t>(e)].data(),
                               mine.size()) == "");
    }
  }
}

}  // namespace

TEST_CASE("experts in emulated bf16 (float Params over bf16 storage): stages 0-3 give the same bits, in 16-bit values") {
  // The dense group and the expert group each have their own float view of their 16-bit values
  // (engine/values_resident.hpp at stages 0-2, values_fetched.hpp at stage 3): the model computes
  // with what a bf16 model holds, and the stages agree bit for bit at expert parallel 4.
  using B = Precision<bf16>;
  const std::vector<Run> s0 = train_all<true, Partitioner<Stage<0>>, Fp32, B>({.ep = 4});
  check_equal_runs(train_all<true, Partitioner<Stage<1>>, Fp32, B>({.ep = 4}), s0, "stage 1");
  check_equal_runs(train_all<true, Partitioner<Stage<2>>, Fp32, B>({.ep = 4}), s0, "stage 2");
  check_equal_runs(train_all<true, Partitioner<Stage<3>>, Fp32, B>({.ep = 4}), s0, "stage 3");
  check_equal_runs(train_all<false, Partitioner<Stage<3>>, Fp32, B, Offload<Cpu>, OffloadParams<Cpu>>({.ep = 4}), s0,
                   "stage 3, experts by name, both offloads");
  // What the Params see are bf16 values, the experts' moved from their start, and the run stays
  // near the fp32 one (8 bits of mantissa over 6 steps).
  const std::vector<Run> fp32 = train_all<true, Partitioner<Stage<0>>, Fp32>({.ep = 4});
  for (std::size_t w = 0; w < s0.size(); ++w) {
    CAPTURE(w);
    for (float v : s0[w].router) CHECK(is_bf16(v));
    const auto& mine = s0[w].experts[w];
    REQUIRE(mine.size() == kHH);
    const std::vector<float> init = values(kHH, 100 + static_cast<std::uint32_t>(w), 0.4f);
    std::size_t moved = 0;
    for (std::size_t i = 0; i < kHH; ++i) {
      CHECK(is_bf16(mine[i]));
      moved += std::abs(mine[i] - init[i]) > 1e-3f ? 1 : 0;
      CHECK(mine[i] == doctest::Approx(fp32[w].experts[w][i]).epsilon(2e-2).scale(0.1));
    }
    CHECK(moved > kHH / 2);
    for (std::size_t i = 0; i < s0[w].losses.size(); ++i) CHECK(s0[w].losses[i] == doctest::Approx(fp32[w].losses[i]).epsilon(2e-2));
  }
  // Expert parallel 1 rounds each rank's expert gradients to bf16 before the sum: near, not equal.
  const std::vector<Run> one = train_all<false, Partitioner<Stage<2>>, Fp32, B>({.ep = 1});
  for (std::size_t i = 0; i < one[0].losses.size(); ++i) CHECK(one[0].losses[i] == doctest::Approx(s0[0].losses[i]).epsilon(2e-2));
}

TEST_CASE("experts: tensor 2 x data 2 with expert parallel 2 (expert_tensor 2) equals tensor 1 x data 2 bit for bit") {
  // Both tensor ranks of a data rank hold the same tokens and the same (whole) experts: the norm and
  // the loss count them on tensor rank 0 only, and each tensor rank dispatches within its own expert
  // group, so the grid gives the tensor-1 run's bits.
  const std::vector<Run> two = train_all<true, Partitioner<Stage<3>>, Fp32>({.ep = 2, .tensor = 2, .world = 4});
  const std::vector<Run> one = train_all<true, Partitioner<Stage<3>>, Fp32>({.ep = 2, .tensor = 1, .world = 2});
  for (int w = 0; w < 4; ++w) {
    CAPTURE(w);
    const Run& got = two[static_cast<std::size_t>(w)];
    const Run& want = one[static_cast<std::size_t>(w / 2)];  // Megatron order: world rank = 2 d + t
    CHECK(got.norms == want.norms);
    CHECK(got.losses == want.losses);
    CHECK(test::compare_bits("router", got.router.data(), want.router.data(), got.router.size()) == "");
    for (int e = 0; e < kE; ++e) {
      CHECK(got.experts[static_cast<std::size_t>(e)].size() == want.experts[static_cast<std::size_t>(e)].size());
      if (got.experts[static_cast<std::size_t>(e)].empty()) continue;
      CHECK(test::compare_bits("expert " + std::to_string(e), got.experts[static_cast<std::size_t>(e)].data(),
                               want.experts[static_cast<std::size_t>(e)].data(), kHH) == "");
    }
  }
}

TEST_CASE("experts: expert parallel 2 x expert-data 2 adds the sources in another order: equal to fp32 rounding") {
  const std::vector<Run> two = train_all<true, Partitioner<Stage<2>>, Fp32>({.ep = 2});
  const std::vector<Run> one = train_all<true, Partitioner<Stage<2>>, Fp32>({.ep = 1});
  for (int w = 0; w < 4; ++w) {
    CAPTURE(w);
    const Run& got = two[static_cast<std::size_t>(w)];
    const Run& want = one[static_cast<std::size_t>(w)];
    for (std::size_t i = 0; i < got.norms.size(); ++i) {
      CHECK(got.norms[i] == doctest::Approx(want.norms[i]).epsilon(1e-5));
      CHECK(got.losses[i] == doctest::Approx(want.losses[i]).epsilon(1e-5));
    }
    for (std::size_t i = 0; i < got.router.size(); ++i) CHECK(got.router[i] == doctest::Approx(want.router[i]).epsilon(1e-4));
    int held = 0;
    for (int e = 0; e < kE; ++e) {
      const auto& mine = got.experts[static_cast<std::size_t>(e)];
      if (mine.empty()) continue;
      ++held;
      CHECK(e / 2 == w % 2);  // expert index = world rank % 2 (Megatron's folding at tensor 1)
      for (std::size_t i = 0; i < mine.size(); ++i) {
        CHECK(mine[i] == doctest::Approx(want.experts[static_cast<std::size_t>(e)][i]).epsilon(1e-4));
      }
    }
    CHECK(held == 2);
  }
}

// Trains `before` steps at expert parallel `ep_save` (engine Saved), saves a checkpoint, builds a
// fresh model and engine (Loaded) at expert parallel `ep_load` on the same ranks, loads it and trains
// `after` more steps. `loaded` holds the parameters right after the load.
struct Resumed {
  Run run;   // the `after` steps
  Run loaded;
};
template <class Saved, class Loaded>
Resumed save_and_resume(comm::ThreadsCommunicator& world, int ep_save, int ep_load, int before, int after,
                        const std::filesystem::path& dir) {
  const EngineOptions o = test_options();
  {
    comm::ProcessGrid grid(world, {.data = 0, .expert = ep_save});
    MoeModel<true> model(grid.expert());
    typename Saved::template engine<MoeModel<true>> engine(grid, model, o);
    for (int step = 0; step < before; ++step) (void)engine.step(model.step(engine, step, grid.data_index()));
    checkpoint::save(engine, grid, dir);
  }
  Resumed out;
  comm::ProcessGrid grid(world, {.data = 0, .expert = ep_load});
  MoeModel<true> model(grid.expert());
  typename Loaded::template engine<MoeModel<true>> engine(grid, model, o);
  const checkpoint::LoadResult l = checkpoint::load(engine, grid, dir);
  CHECK(l.resharded == (ep_save != ep_load));
  take_values(engine, model, out.loaded);
  for (int step = before; step < before + after; ++step) {
    const StepReport rep = engine.step(model.step(engine, step, grid.data_index()));
    out.run.norms.push_back(rep.grad_norm);
    out.run.losses.push_back(rep.loss);
  }
  take_values(engine, model, out.run);
  return out;
}
template <int S>
struct StageEngine {
  template <class M>
  using engine = Engine<Partitioner<Stage<S>>, Optimizer<AdamW>>;
};

std::filesystem::path scratch_dir(const char* name) {
  const auto d = std::filesystem::temp_directory_path() / ("zerotk_moe_engine_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::remove_all(d);
  return d;
}

// The planner's expert model states (plan/experts.hpp) against the engine's ledger at expert
// parallel 2 x expert-data 2: every space and category on every rank, the expert group's master and
// moments (12 Psi_e / (ep edp) bytes up to padding) included.
// The test's model as the planner sees it: the router, and one rank's E / ep experts (each parameter
// a fetch unit of its own: the model lists no modules).
std::pair<plan::ModelDescription, plan::ModelDescription> descriptions(int ep) {
  plan::ModelDescription dense, experts;
  dense.layers.push_back(plan::LayerDesc{"router", {static_cast<std::size_t>(kE) * kH}, {}, false});
  for (int e = 0; e < kE / ep; ++e) experts.layers.push_back(plan::LayerDesc{"expert", {kHH}, {}, false});
  return {dense, experts};
}

template <int S, class... Extra>
void check_plan(plan::OffloadTarget optimizer = plan::OffloadTarget::none, plan::OffloadTarget param = plan::OffloadTarget::none,
                DType precision = DType::fp32) {
  CAPTURE(S);
  CAPTURE(to_string(precision));
  const std::vector<Run> runs = train_all<true, Partitioner<Stage<S>>, Fp32, Extra...>({.ep = 2, .steps = 2});
  const auto [dense, experts] = descriptions(2);
  plan::Choice c;
  c.stage = S;
  c.precision = precision;
  c.optimizer = optimizer;
  c.param = param;
  plan::EngineSettings s;
  s.reduce_bucket_size = 20;
  s.compute_space = MemorySpace::host;
  s.param_persistence_threshold = 0;
  s.emulated = precision != DType::fp32;  // the model's Params hold float: a float view per group
  const plan::MemoryPlan p = plan::expert_model_state_plan(dense, experts, 4, 2, c, s);
  CHECK(p.refused.empty());
  // Stage 3's emulated float copies come from a pool whose size the plan bounds (docs/stage3.md):
  // one bound per group, every other figure exact.
  const bool bound = S == 3 && s.emulated;
  CHECK(p.approximate.size() == (bound ? 2u : 0u));
  for (const std::string& a : p.approximate) CHECK(a.find("stage-3 emulated float copies") != std::string::npos);
  for (int r = 0; r < 4; ++r) {
    for (std::size_t sp = 0; sp < kMemorySpaceCount; ++sp) {
      for (std::size_t ca = 0; ca < kMemoryCategoryCount; ++ca) {
        CAPTURE(r);
        CAPTURE(to_string(static_cast<MemorySpace>(sp)));
        CAPTURE(to_string(static_cast<MemoryCategory>(ca)));
        const std::size_t got = runs[static_cast<std::size_t>(r)].ledger[sp][ca];
        if (bound && static_cast<MemoryCategory>(ca) == MemoryCategory::other) {
          CHECK(got <= p.bytes[sp][ca]);
          CHECK((got > 0) == (p.bytes[sp][ca] > 0));
        } else {
          CHECK(got == p.bytes[sp][ca]);
        }
      }
    }
  }
  // The expert group's master and moments: 12 Psi_e / (ep edp) bytes, Psi_e = 4 experts of 36,
  // up to the layout's padding (each 20-element bucket split over 2 ranks: no padding here).
  if (S >= 1) {
    const plan::MemoryPlan d = plan::model_state_plan(dense, 4, c, s);
    const std::size_t expert_state = p.category_total(MemoryCategory::master32) + p.category_total(MemoryCategory::optimizer_state) -
                                     d.category_total(MemoryCategory::master32) - d.category_total(MemoryCategory::optimizer_state);
    CHECK(expert_state == 12 * static_cast<std::size_t>(kE) * kHH / (2 * 2));
  }
}

TEST_CASE("experts: the planner's model states equal the engine's ledger at expert parallel 2 x expert-data 2") {
  check_plan<0>();
  check_plan<1>();
  check_plan<2>();
  check_plan<3>();
  check_plan<3, Precision<fp32>, Offload<Cpu>, OffloadParams<Cpu>>(plan::OffloadTarget::cpu, plan::OffloadTarget::cpu);
  // Emulated bf16: the dense group's float view and the experts' own.
  check_plan<2, Precision<bf16>>(plan::OffloadTarget::none, plan::OffloadTarget::none, DType::bf16);
  check_plan<3, Precision<bf16>>(plan::OffloadTarget::none, plan::OffloadTarget::none, DType::bf16);
  // The all-to-all bytes per MoE layer: 4 T k h b (ep - 1) / ep.
  CHECK(plan::all_to_all_bytes_per_layer(1024, 2, 4096, 2, 8) == 4ull * 1024 * 2 * 4096 * 2 * 7 / 8);
  CHECK(plan::all_to_all_bytes_per_layer(1024, 2, 4096, 2, 1) == 0);
  // What the engine refuses with experts apart (its experts_* rows), the plan says; at expert
  // parallel 1 the experts share the data group and swap files are fine.
  plan::Choice nvme;
  nvme.stage = 3;
  nvme.precision = DType::fp32;
  nvme.optimizer = plan::OffloadTarget::nvme;
  plan::EngineSettings s;
  s.compute_space = MemorySpace::host;
  const auto [dense2, experts2] = descriptions(2);
  CHECK(plan::expert_model_state_plan(dense2, experts2, 4, 2, nvme, s).refused.find("swap files") != std::string::npos);
  const auto [dense1, experts1] = descriptions(1);
  CHECK(plan::expert_model_state_plan(dense1, experts1, 4, 4, nvme, s).refused.empty());
}

TEST_CASE("experts: a checkpoint saved at expert parallel 4 loads at expert parallel 1 and 2 (resharded) and training goes on") {
  constexpr int kBefore = 3, kAfter = 3;
  // The uninterrupted run at expert parallel 4, stage 2.
  const std::vector<Run> whole = train_all<true, Partitioner<Stage<2>>, Fp32>({.ep = 4, .steps = kBefore + kAfter});
  const std::vector<Run> first = train_all<true, Partitioner<Stage<2>>, Fp32>({.ep = 4, .steps = kBefore});
  for (const int ep_load : {1, 2, 4}) {
    CAPTURE(ep_load);
    const auto dir = scratch_dir("ckpt");
    const auto resumed = comm::run_threads(4, [&](comm::ThreadsCommunicator& w) {
      return save_and_resume<StageEngine<2>, StageEngine<3>>(w, 4, ep_load, kBefore, kAfter, dir);
    });
    for (int w = 0; w < 4; ++w) {
      CAPTURE(w);
      const Resumed& got = resumed[static_cast<std::size_t>(w)];
      const Run& want = whole[static_cast<std::size_t>(w)];
      // What was loaded is what was saved, bit for bit, wherever the experts went.
      CHECK(test::compare_bits("router", got.loaded.router.data(), first[static_cast<std::size_t>(w)].router.data(), got.loaded.router.size()) == "");
      for (int e = 0; e < kE; ++e) {
        const auto& mine = got.loaded.experts[static_cast<std::size_t>(e)];
        if (mine.empty()) continue;
        CHECK(e * ep_load / kE == w % ep_load);  // the expert index's experts
        CHECK(test::compare_bits("expert " + std::to_string(e), mine.data(), first[static_cast<std::size_t>(e)].experts[static_cast<std::size_t>(e)].data(), kHH) == "");
      }
      // Going on at expert parallel 1 (stage 3) gives the uninterrupted expert parallel 4 run's bits
      // (the two equal bit for bit); at 2 it adds the sources in another order: to rounding.
      for (std::size_t i = 0; i < got.run.norms.size(); ++i) {
        CAPTURE(i);
        const double norm = want.norms[kBefore + i], loss = want.losses[kBefore + i];
        if (ep_load != 2) {
          CHECK(got.run.norms[i] == norm);
          CHECK(got.run.losses[i] == loss);
        } else {
          CHECK(got.run.norms[i] == doctest::Approx(norm).epsilon(1e-5));
          CHECK(got.run.losses[i] == doctest::Approx(loss).epsilon(1e-5));
        }
      }
      if (ep_load != 2) {
        CHECK(test::compare_bits("router", got.run.router.data(), want.router.data(), want.router.size()) == "");
      }
    }
    if (ep_load == 4) {
      // The export writes every expert whole under its name, from the ranks that held it.
      const auto out = dir / "experts.safetensors";
      const checkpoint::ExportResult r = checkpoint::export_safetensors(dir, out);
      CHECK(r.tensors == 1 + kE);
      std::ifstream f(out, std::ios::binary);
      std::uint64_t header = 0;
      f.read(reinterpret_cast<char*>(&header), 8);
      std::string json(header, '\0');
      f.read(json.data(), static_cast<std::streamsize>(header));
      for (int e = 0; e < kE; ++e) {
        const std::string key = "\"experts." + std::to_string(e) + ".weight\":";
        const auto at = json.find(key);
        REQUIRE(at != std::string::npos);
        unsigned long long a = 0, b = 0;
        REQUIRE(std::sscanf(json.c_str() + json.find("data_offsets", at), "data_offsets\":[%llu,%llu]", &a, &b) == 2);
        REQUIRE(b - a == kHH * sizeof(float));
        std::vector<float> v(kHH);
        f.seekg(static_cast<std::streamoff>(8 + header + a));
        f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(b - a));
        CHECK(test::compare_bits("exported expert " + std::to_string(e), v.data(), whole[static_cast<std::size_t>(e)].experts[static_cast<std::size_t>(e)].data(), kHH) != "");
        CHECK(test::compare_bits("exported expert " + std::to_string(e), v.data(), first[static_cast<std::size_t>(e)].experts[static_cast<std::size_t>(e)].data(), kHH) == "");
      }
    }
    std::filesystem::remove_all(dir);
  }
}

TEST_CASE("experts: DeepSpeed's expert_parallel block sizes the grid, and an engine on another expert size is refused naming it") {
  config::ResolveContext ctx;
  ctx.world_size = 4;
  const config::Config cfg = config::load(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1},
                                               "expert_parallel": {"enabled": true, "autoep_size": 4}})",
                                          ctx);
  using E = Engine<Partitioner<Stage<1>>, Fp32>;
  const comm::GridShape shape = grid_shape(cfg);
  CHECK(shape.expert == 4);
  CHECK(shape.expert_tensor == 1);  // = tensor
  comm::run_threads(4, [&](comm::ThreadsCommunicator& world) {
    comm::ProcessGrid grid(world, grid_shape(cfg));
    CHECK(grid.expert_size() == 4);
    MoeModel<true> model(grid.expert());
    E engine(grid, model, engine_options<E>(cfg));
    CHECK(engine.grid_place().expert_size == 4);
    comm::ProcessGrid flat(world, {.data = 0});
    MoeModel<true> other(flat.expert());
    CHECK_THROWS_WITH_AS(E(flat, other, engine_options<E>(cfg)),
                         doctest::Contains("asks for 4 expert-parallel ranks"), config_error);
    return 0;
  });
}

// Experts apart (expert parallel 2 x expert data 2 on 4 ranks): inside gather(model, 0) every rank
// writes values of its own; afterwards every rank holds data rank 0's router and its expert group's
// first expert-data rank's experts (the writes of expert-data index 0), at a resident and a sharded
// stage. Another modifier rank is refused.
template <class E>
void check_kept_writes() {
  comm::run_threads(4, [](comm::ThreadsCommunicator& world) {
    comm::ProcessGrid grid(world, {.data = 0, .expert = 2});
    MoeModel<true> model(grid.expert());
    E engine(grid, model, EngineOptions{});
    {
      auto g = engine.gather(model, 0);
      for (float& v : model.router.values()) v = 1.0f + static_cast<float>(grid.data_index());
      for (auto& p : model.experts) {
        for (float& v : p.values()) v = 10.0f + static_cast<float>(grid.expert_data_index());
      }
    }
    engine.initialize_master();
    CHECK_THROWS_WITH_AS((void)engine.gather(model, 1), doctest::Contains("expert-data group"), usage_error);
    auto g = engine.gather(model);
    int wrong = 0;
    for (float v : model.router.values()) wrong += v != 1.0f;
    for (auto& p : model.experts) {
      for (float v : p.values()) wrong += v != 10.0f;
    }
    CHECK(wrong == 0);
    return 0;
  });
}

TEST_CASE("experts apart: gather(model, 0) keeps data rank 0's dense writes and each expert group's first rank's expert writes") {
  check_kept_writes<Engine<Partitioner<Stage<1>>, Fp32>>();
  check_kept_writes<Engine<Partitioner<Stage<3>>, Fp32>>();
}

TEST_CASE("experts: what has no expert meaning yet is refused in words, on every rank") {
  comm::run_threads(4, [](comm::ThreadsCommunicator& world) {
    comm::ProcessGrid grid(world, {.data = 0, .expert = 4});
    MoeModel<true> model(grid.expert());
    Engine<Partitioner<Stage<1>>, Fp32> engine(grid, model, EngineOptions{});
    CHECK_THROWS_WITH_AS(engine.broadcast_parameters(0), doctest::Contains("expert-data group"), usage_error);
    CHECK_THROWS_WITH_AS(checkpoint::save_16bit_model(engine, model, world, "never-written.safetensors"),
                         doctest::Contains("each rank holds some of the experts"), usage_error);
    // Its data group is the world here; a checkpoint still goes through the grid.
    CHECK_THROWS_WITH_AS(checkpoint::save(engine, world, "never-written"), doctest::Contains("through its grid"), usage_error);
    // A grid of the same data size with another expert layout is not the engine's.
    comm::ProcessGrid other(world, {.data = 0, .expert = 2});
    CHECK_THROWS_WITH_AS(checkpoint::save(engine, other, "never-written"),
                         doctest::Contains("expert data 0/1; grid at data "),  // both layouts named
                         usage_error);
    // The same model at expert parallel 1 (the expert-data group is the data group) broadcasts.
    comm::ProcessGrid flat(world, {.data = 0});
    MoeModel<true> whole(flat.expert());
    Engine<Partitioner<Stage<1>>, Fp32> one(flat, whole, EngineOptions{});
    one.broadcast_parameters(0);
    return 0;
  });
}

}  // namespace test_moe_engine
