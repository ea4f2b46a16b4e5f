// What a new user tripped over (engine-composition issue, items 1, 2, 8) and the two gradient
// accumulation orders, each against a reference computed here.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "engine_fixture.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/engine.hpp"

namespace test_engine_usage {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using namespace zt_test;

namespace {

/// A user's own parameter type that owns its values until the engine binds it (as a tensor library's
/// parameters do): initialising, then wrapping, must keep the values.
template <class T>
struct OwnedParam {
  using value_type = T;
  std::string name;
  std::vector<T> own;
  T* data_ = nullptr;
  T* grad_ = nullptr;
  OwnedParam(std::string n, std::size_t numel) : name(std::move(n)), own(numel), data_(own.data()) {}
  std::size_t numel() const { return own.size(); }
  void bind(T* d, T* g) {
    data_ = d;
    grad_ = g;
  }
  T* data() { return data_; }
  T* grad() { return grad_; }
};

/// y = w * x elementwise over a vector of n; backward adds dy * x into the weight's gradient.
template <class T>
struct Scale {
  using input_type = std::vector<float>;
  using output_type = std::vector<float>;
  OwnedParam<T> w;
  std::vector<float> x_;
  explicit Scale(std::string name, std::size_t n) : w(std::move(name), n) {}
  template <class V>
  void parameters(V&& visit) {
    visit(w.name, w);
  }
  output_type forward(const input_type& x) {
    x_ = x;
    std::vector<float> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = to_float(w.data()[i]) * x[i];
    return y;
  }
  input_type backward(const output_type& dy) {
    for (std::size_t i = 0; i < dy.size(); ++i) w.grad()[i] = from_float<T>(to_float(w.grad()[i]) + dy[i] * x_[i]);
    return dy;
  }
};

}  // namespace

TEST_CASE("item 1: values initialised before the engine is built are adopted, not zeroed") {
  comm::run_threads(2, [](auto& comm) {
    Scale<float> layer("w", 37);
    for (std::size_t i = 0; i < 37; ++i) layer.w.own[i] = 0.25f + 0.01f * static_cast<float>(i);
    const std::vector<float> initial = layer.w.own;
    Engine<Partitioner<Stage<2>>, Optimizer<AdamW>> engine(comm, layer);
    CHECK(layer.w.data() != layer.w.own.data());  // bound into engine storage
    CHECK(std::vector<float>(layer.w.data(), layer.w.data() + 37) == initial);
    // The master starts from them too: a zero-gradient step keeps them (Adam: m = v = 0 -> no move).
    { auto s = engine.backward(layer); }
    (void)engine.step(0.0);
    CHECK(std::vector<float>(layer.w.data(), layer.w.data() + 37) == initial);
  });
  SUBCASE("opting out starts from zero, as documented") {
    comm::run_threads(1, [](auto& comm) {
      Scale<float> layer("w", 5);
      layer.w.own.assign(5, 3.0f);
      EngineOptions o;
      o.adopt_initial_values = false;
      Engine<Partitioner<Stage<0>>, Optimizer<AdamW>> engine(comm, layer, o);
      CHECK(std::vector<float>(layer.w.data(), layer.w.data() + 5) == std::vector<float>(5, 0.0f));
    });
  }
  SUBCASE("emulated bf16 over float Params: adopted values are rounded to bf16") {
    comm::run_threads(1, [](auto& comm) {
      Scale<float> layer("w", 3);
      layer.w.own = {1.0f + 1.0f / 1024, 2.0f, -3.0f};  // 1 + 2^-10 is not a bf16 value
      Engine<Partitioner<Stage<1>>, Optimizer<AdamW>, Precision<bf16>> engine(comm, layer);
      CHECK(layer.w.data()[0] == 1.0f);
      CHECK(layer.w.data()[1] == 2.0f);
      CHECK(layer.w.data()[2] == -3.0f);
    });
  }
  SUBCASE("emulated bf16 at stage 3: adopted values are rounded into the shards; outside scopes data() is null") {
    comm::run_threads(2, [](auto& comm) {
      Scale<float> layer("w", 3);
      layer.w.own = {1.0f + 1.0f / 1024, 2.0f, -3.0f};
      EngineOptions o;
      o.stage3.param_persistence_threshold = 0;
      Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, Precision<bf16>> engine(comm, layer, o);
      CHECK(layer.w.data() == nullptr);
      {
        auto g = engine.gather(layer);
        REQUIRE(layer.w.data() != nullptr);
        CHECK(layer.w.data()[0] == 1.0f);
        CHECK(layer.w.data()[1] == 2.0f);
        CHECK(layer.w.data()[2] == -3.0f);
      }
      CHECK(layer.w.data() == nullptr);
    });
  }
}

namespace {
/// Two layers; `a` writes b's gradient too but only lists its own parameter (the user's bug).
template <class T>
struct Leaky {
  Scale<T> a{"a.w", 150}, b{"b.w", 150};
  template <class V>
  void parameters(V&& visit) {
    a.parameters(visit);
    b.parameters(visit);
  }
};

template <class Prec>
void run_leaky() {
  using T = typename Prec::storage;
  comm::run_threads(2, [](auto& comm) {
    Leaky<T> m;
    EngineOptions o;
    o.reduce_bucket_size = 100;  // 100-element buckets: b.w is alone in its own
    Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Precision<Prec>> engine(comm, m, o);
    {
      auto s = engine.backward(m.a);
      for (std::size_t i = 0; i < 150; ++i) m.a.w.grad()[i] = from_float<T>(1.0f);
      for (std::size_t i = 0; i < 150; ++i) m.b.w.grad()[i] = from_float<T>(1.0f);  // outside b's scope
    }
    CHECK_THROWS_WITH_AS((void)engine.step(0.0),
                         doctest::Contains("got no backward scope in this micro-step"), usage_error);
    CHECK_THROWS_WITH_AS((void)engine.step(0.0), doctest::Contains("(got b.w)"),
                         usage_error);
  });
}
}  // namespace

TEST_CASE("item 2: a gradient written outside its scope is a usage_error naming the parameter, never a crash") {
  run_leaky<fp32>();
  run_leaky<bf16>();
}

TEST_CASE("item 2: step() with no backward since the last step() is an error") {
  comm::run_threads(2, [](auto& comm) {
    Scale<float> layer("w", 8);
    Engine<Partitioner<Stage<1>>, Optimizer<AdamW>> engine(comm, layer);
    CHECK_THROWS_WITH_AS((void)engine.step(0.0), doctest::Contains("step() with no backward scope"), usage_error);
  });
}

namespace {
/// A module tree: blocks holding a dense weight (bf16) and a LayerNorm-typed module (float Params).
struct LayerNormLike {
  static constexpr std::string_view module_type = "LayerNorm";
  Scale<float> s;
  explicit LayerNormLike(std::string name) : s(std::move(name), 16) {}
  template <class V>
  void parameters(V&& visit) {
    s.parameters(visit);
  }
};
struct Block {
  static constexpr std::string_view module_type = "Block";
  Scale<bfloat16> dense;
  LayerNormLike norm;
  explicit Block(const std::string& p) : dense(p + ".dense", 16), norm(p + ".norm") {}
  template <class V>
  void parameters(V&& visit) {
    dense.parameters(visit);
    norm.parameters(visit);
  }
  template <class V>
  void modules(V&& visit) {
    visit(norm);
  }
};
struct Net {
  Block b0{"b0"}, b1{"b1"};
  template <class V>
  void parameters(V&& visit) {
    b0.parameters(visit);
    b1.parameters(visit);
  }
  template <class V>
  void modules(V&& visit) {
    visit(b0);
    visit(b1);
  }
};
}  // namespace

TEST_CASE("item 8: fp32_module_types keeps the parameters of modules of those types in fp32") {
  comm::run_threads(1, [](auto& comm) {
    Net net;
    for (auto* ln : {&net.b0.norm, &net.b1.norm}) ln->s.w.own.assign(16, 1.0f);
    EngineOptions o;
    o.fp32_module_types = {"LayerNorm"};
    o.optimizer.lr = 1e-4f;  // one Adam step moves each weight by ~lr: far below bf16's ulp at 1 (2^-7)
    using E = Engine<Partitioner<Stage<0>>, Optimizer<AdamW>, Precision<bf16>>;
    E engine(comm, net, o);
    CHECK(engine.flat_numel() >= 64);
    for (Block* b : {&net.b1, &net.b0}) {
      auto s1 = engine.backward(b->norm.s);
      for (std::size_t i = 0; i < 16; ++i) b->norm.s.w.grad()[i] = 1.0f;
      auto s2 = engine.backward(b->dense);
    }
    (void)engine.step(0.0);
    const float v = net.b0.norm.s.w.data()[0];
    CHECK(v < 1.0f);
    CHECK(v > 1.0f - 1e-3f);  // an fp32 value: bf16 would hold 1 or 1 - 2^-8
    CHECK(to_float(from_float<bfloat16>(v)) != v);
  });
  SUBCASE("without the option the float LayerNorm Params are refused in a bf16 model") {
    comm::run_threads(1, [](auto& comm) {
      Net net;
      using E = Engine<Partitioner<Stage<0>>, Optimizer<AdamW>, Precision<bf16>>;
      CHECK_THROWS_AS(E(comm, net), usage_error);
    });
  }
}

// ---- the two accumulation orders ------------------------------------------------------------------

namespace {
constexpr std::size_t kN = 300;
constexpr int kWorld = 2, kGas = 2;

/// Gradient of element i written by rank r in micro-step m (not bf16-representable on purpose).
float grad_value(int r, int m, std::size_t i) {
  std::mt19937 rng(static_cast<std::uint32_t>(1000 * r + 100 * m + 7));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  float v = 0;
  for (std::size_t k = 0; k <= i; ++k) v = u(rng);
  return v;
}

/// The reported grad_norm of one boundary (W = 2, GAS = 2, no clipping) for engine type E.
template <class E>
double engine_norm(std::optional<DType> accum) {
  double norm = 0;
  comm::run_threads(kWorld, [&](auto& comm) {
    Scale<bfloat16> layer("w", kN);
    EngineOptions o;
    o.gradient_accumulation_steps = kGas;
    o.grad_accum_dtype = accum;
    E engine(comm, layer, o);
    StepReport r;
    for (int m = 0; m < kGas; ++m) {
      {
        auto s = engine.backward(layer);
        for (std::size_t i = 0; i < kN; ++i) {
          layer.w.grad()[i] = from_float<bfloat16>(to_float(layer.w.grad()[i]) + grad_value(comm.rank(), m, i));
        }
      }
      r = engine.step(0.0);
    }
    if (comm.rank() == 0) norm = r.grad_norm;
  });
  return norm;
}

enum class Order { reduce_then_add_fp32, reduce_then_add_bf16, add_bf16_then_reduce };

/// The reference: the same reductions (the communicator's bf16 average), the accumulation written out
/// here element by element, the norm in long double.
double reference_norm(Order order) {
  std::vector<std::vector<float>> acc(kWorld);
  comm::run_threads(kWorld, [&](auto& comm) {
    const int r = comm.rank();
    std::vector<bfloat16> local(kN), reduced(kN);
    std::vector<float> sum32(kN, 0.0f);
    std::vector<bfloat16> sum16(kN, from_float<bfloat16>(0.0f));
    for (int m = 0; m < kGas; ++m) {
      for (std::size_t i = 0; i < kN; ++i) {
        const float prev = order == Order::add_bf16_then_reduce ? to_float(local[i]) : 0.0f;
        local[i] = from_float<bfloat16>(prev + grad_value(r, m, i));
      }
      if (order == Order::add_bf16_then_reduce) continue;
      comm.all_reduce(local.data(), reduced.data(), kN, DType::bf16, comm::ReduceOp::avg).wait();
      for (std::size_t i = 0; i < kN; ++i) {
        sum32[i] += to_float(reduced[i]);
        sum16[i] = from_float<bfloat16>(to_float(sum16[i]) + to_float(reduced[i]));
      }
    }
    std::vector<float> out(kN);
    if (order == Order::add_bf16_then_reduce) {
      comm.all_reduce(local.data(), reduced.data(), kN, DType::bf16, comm::ReduceOp::avg).wait();
      for (std::size_t i = 0; i < kN; ++i) out[i] = to_float(reduced[i]);
    } else {
      for (std::size_t i = 0; i < kN; ++i) out[i] = order == Order::reduce_then_add_fp32 ? sum32[i] : to_float(sum16[i]);
    }
    acc[static_cast<std::size_t>(r)] = out;
  });
  long double s = 0;
  for (float v : acc[0]) s += static_cast<long double>(v) * v;
  return static_cast<double>(std::sqrt(s) / kGas);
}
}  // namespace

TEST_CASE("accumulation orders: fp32 or working precision, at the boundary or every micro-step") {
  using Every0 = Partitioner<Stage<0>, when::every_micro_step>;
  const double fp32_order = reference_norm(Order::reduce_then_add_fp32);
  const double bf16_order = reference_norm(Order::reduce_then_add_bf16);
  const double local_order = reference_norm(Order::add_bf16_then_reduce);
  // The three orders differ (else this test could not tell them apart).
  CHECK(std::fabs(fp32_order - bf16_order) > 1e-6 * fp32_order);
  CHECK(std::fabs(fp32_order - local_order) > 1e-6 * fp32_order);
  auto close = [](double a, double b) { return std::fabs(a - b) <= 1e-12 * b; };
  // Stage 2 and stage 0 every micro-step: reduced gradients added in fp32 (zerotk's default) ...
  CHECK(close(engine_norm<Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Precision<bf16>>>(std::nullopt), fp32_order));
  CHECK(close(engine_norm<Engine<Every0, Optimizer<AdamW>, Precision<bf16>>>(DType::fp32), fp32_order));
  // ... or in bf16 (DeepSpeed's stage-2 order, data_types.grad_accum_dtype = bf16).
  CHECK(close(engine_norm<Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Precision<bf16>>>(DType::bf16), bf16_order));
  CHECK(close(engine_norm<Engine<Every0, Optimizer<AdamW>, Precision<bf16>>>(DType::bf16), bf16_order));
  // Stages 0 and 1 at the boundary (their default: DeepSpeed's order): local bf16 sums, one reduction.
  CHECK(close(engine_norm<Engine<Partitioner<Stage<0>>, Optimizer<AdamW>, Precision<bf16>>>(std::nullopt), local_order));
  CHECK(close(engine_norm<Engine<Partitioner<Stage<1>>, Optimizer<AdamW>, Precision<bf16>>>(DType::bf16), local_order));
  // fp32 accumulation of bf16 gradients cannot happen at the boundary: a config_error naming the key.
  comm::run_threads(1, [](auto& comm) {
    Scale<bfloat16> layer("w", 4);
    EngineOptions o;
    o.gradient_accumulation_steps = 2;
    o.grad_accum_dtype = DType::fp32;
    using E = Engine<Partitioner<Stage<0>>, Optimizer<AdamW>, Precision<bf16>>;
    CHECK_THROWS_WITH_AS(E(comm, layer, o), doctest::Contains("data_types.grad_accum_dtype"), config_error);
  });
}

TEST_CASE("state() and load_state() continue a run bitwise") {
  // Train 6 steps; or train 3, take the state, load it into a fresh engine (and a fresh model), train 3.
  RunConfig cfg;
  cfg.world = 3;
  cfg.gas = 2;
  cfg.clip = 0.05;
  cfg.steps = 6;
  cfg.poison_steps = {1};  // the scaler mid-hysteresis at the save point
  std::vector<float> straight, resumed;
  std::mutex mu;
  comm::run_threads(cfg.world, [&](auto& comm) {
    const RunResult all = train_rank<2, fp16>(comm, cfg);
    std::lock_guard lock(mu);
    if (comm.rank() == 0) straight = all.params;
  });
  comm::run_threads(cfg.world, [&](auto& comm) {
    using E = Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Precision<fp16>>;
    const EngineOptions o = engine_options(cfg);
    EngineState saved;
    {
      Mlp<half> model;
      E engine(comm, model, o);
      model.init(42);
      engine.initialize_master();
      train_steps(engine, model, comm.rank(), cfg, 0, 3, nullptr);
      saved = engine.state();
      CHECK(saved.global_steps == 3);
      CHECK(saved.skipped_steps == 1);
    }
    Mlp<half> model;
    E engine(comm, model, o);  // fresh: zeros until the state is loaded
    engine.load_state(saved);
    train_steps(engine, model, comm.rank(), cfg, 3, 6, nullptr);
    std::lock_guard lock(mu);
    if (comm.rank() == 0) resumed = model.values();
    CHECK(engine.global_steps() == 6);
  });
  CHECK(!straight.empty());
  CHECK(resumed == straight);  // bitwise
}

TEST_CASE("load_state refuses a scheduler state the engine cannot take (or lacks), changing nothing") {
  RunConfig cfg;
  cfg.world = 1;
  cfg.steps = 2;
  comm::run_threads(1, [&](auto& comm) {
    using E = Engine<Partitioner<Stage<1>>, Optimizer<AdamW>, Precision<fp32>>;
    const EngineOptions o = engine_options(cfg);
    Mlp<float> model;
    E engine(comm, model, o);
    model.init(42);
    engine.initialize_master();
    train_steps(engine, model, comm.rank(), cfg, 0, 2, nullptr);
    EngineState with = engine.state();
    with.scheduler = optim::WarmupLR(optim::WarmupLROptions{.warmup_num_steps = 4}, 1e-3).state();
    const EngineState before = engine.state();
    const std::vector<float> values = model.values();
    CHECK_THROWS_WITH_AS(engine.load_state(with), doctest::Contains("this engine has no scheduler"), usage_error);
    CHECK(engine.state().global_steps == before.global_steps);
    CHECK(engine.state().groups[0].master == before.groups[0].master);
    CHECK(model.values() == values);
    engine.set_scheduler(optim::WarmupLR(optim::WarmupLROptions{.warmup_num_steps = 4}, 1e-3));
    CHECK_THROWS_WITH_AS(engine.load_state(before), doctest::Contains("state has no scheduler's state"), usage_error);
    engine.load_state(with);  // both sides have one: fine
    CHECK(engine.global_steps() == before.global_steps);
  });
}

}  // namespace test_engine_usage
