// Pipeline parallelism with the real engine: an 8-layer MLP split over pipeline stages, each
// stage's layers trained by a zerotk::Engine on the process grid (pipeline/engine_hooks.hpp),
// stepping once per micro-batch with the boundary at the last.
//
// - Pipeline alone (pp 2 and 4, data 1): final parameters, losses and gradient norms bit for bit
//   those of one engine over the whole model on one rank with the same micro-batches, fp32 and
//   bf16, for GPipe, 1F1B, interleaved 1F1B and ZB-H1 (gradient clipping on, except interleaved,
//   which refuses it: one engine per chunk).
// - ZeRO stages 0-3 over the data group of pp 2 x data 2 (1F1B, ZB-H1, interleaved 1F1B): the same
//   parameters at every stage, and those of the data group of 2 alone over the whole model.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "zerotk/comm/grid.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/engines.hpp"  // the compiled engine set, when the suite links zerotk::engines
#include "zerotk/pipeline.hpp"

using namespace zerotk;
using namespace zerotk::pipeline;

namespace {

constexpr int kBatch = 4;
const std::vector<int> kWidths = {13, 11, 9, 7, 9, 11, 7, 6, 5};  // 8 layers
int layer_count() { return static_cast<int>(kWidths.size()) - 1; }

/// A dense layer y = act(x W^T + b) whose saved tensors are kept per micro-batch, with the backward
/// split into its input gradient (BI: dz and dx) and its weight gradient (BW: from dz and x). The
/// arithmetic is tests/engine/engine_fixture.hpp's Dense, in the same order.
template <class T>
struct PipeDense {
  int in = 0, out = 0;
  bool relu = false;
  Param<T> w, b;
  std::map<int, std::vector<float>> x_, z_, dz_;

  PipeDense(int layer, int in_, int out_, bool relu_)
      : in(in_), out(out_), relu(relu_),
        w("fc" + std::to_string(layer) + ".weight", {static_cast<std::size_t>(out_), static_cast<std::size_t>(in_)}),
        b("fc" + std::to_string(layer) + ".bias", {static_cast<std::size_t>(out_)}) {}

  template <class V>
  void parameters(V&& visit) {
    visit(w.name(), w);
    visit(b.name(), b);
  }

  std::vector<float> forward(int mb, const std::vector<float>& x) {
    std::vector<float> z(static_cast<std::size_t>(kBatch * out)), y(z.size());
    for (int n = 0; n < kBatch; ++n) {
      for (int o = 0; o < out; ++o) {
        float s = to_float(b.data()[o]);
        for (int i = 0; i < in; ++i) s += x[static_cast<std::size_t>(n * in + i)] * to_float(w.data()[o * in + i]);
        z[static_cast<std::size_t>(n * out + o)] = s;
        y[static_cast<std::size_t>(n * out + o)] = relu && s < 0 ? 0.0f : s;
      }
    }
    x_[mb] = x;
    z_[mb] = std::move(z);
    return y;
  }

  std::vector<float> backward_input(int mb, const std::vector<float>& dy) {
    const std::vector<float>& z = z_[mb];
    std::vector<float> dz(dy.size()), dx(static_cast<std::size_t>(kBatch * in), 0.0f);
    for (std::size_t k = 0; k < dy.size(); ++k) dz[k] = relu && z[k] < 0 ? 0.0f : dy[k];
    for (int n = 0; n < kBatch; ++n)
      for (int o = 0; o < out; ++o)
        for (int i = 0; i < in; ++i) dx[static_cast<std::size_t>(n * in + i)] += dz[static_cast<std::size_t>(n * out + o)] * to_float(w.data()[o * in + i]);
    dz_[mb] = std::move(dz);
    z_.erase(mb);
    return dx;
  }

  void backward_weight(int mb) {
    const std::vector<float>& dz = dz_[mb];
    const std::vector<float>& x = x_[mb];
    for (int o = 0; o < out; ++o) {
      float gb = 0;
      for (int n = 0; n < kBatch; ++n) gb += dz[static_cast<std::size_t>(n * out + o)];
      b.grad()[o] = from_float<T>(to_float(b.grad()[o]) + gb);
      for (int i = 0; i < in; ++i) {
        float gw = 0;
        for (int n = 0; n < kBatch; ++n) gw += dz[static_cast<std::size_t>(n * out + o)] * x[static_cast<std::size_t>(n * in + i)];
        w.grad()[o * in + i] = from_float<T>(to_float(w.grad()[o * in + i]) + gw);
      }
    }
    dz_.erase(mb);
    x_.erase(mb);
  }

  /// The same initial values wherever the layer lives (rounded by the storage type).
  void init(int layer) {
    std::mt19937 rng(static_cast<std::uint32_t>(42 + layer));
    std::normal_distribution<float> nd(0.0f, 1.0f / std::sqrt(static_cast<float>(in)));
    for (std::size_t i = 0; i < w.numel(); ++i) w.data()[i] = from_float<T>(nd(rng));
    for (std::size_t i = 0; i < b.numel(); ++i) b.data()[i] = from_float<T>(0.01f * static_cast<float>(i));
  }
  std::vector<float> values() const {
    std::vector<float> v;
    for (std::size_t i = 0; i < w.numel(); ++i) v.push_back(to_float(w.data()[i]));
    for (std::size_t i = 0; i < b.numel(); ++i) v.push_back(to_float(b.data()[i]));
    return v;
  }
};

/// Some of the model's layers: what one engine trains (the whole model, a stage, a chunk).
template <class T>
struct Layers {
  std::vector<std::unique_ptr<PipeDense<T>>> layers;
  int first = 0;  // the model's index of layers[0]

  Layers(int first_, int last) : first(first_) {
    for (int l = first_; l < last; ++l) {
      layers.push_back(std::make_unique<PipeDense<T>>(l, kWidths[static_cast<std::size_t>(l)],
                                                      kWidths[static_cast<std::size_t>(l) + 1], l + 1 < layer_count()));
    }
  }
  template <class V>
  void parameters(V&& visit) {
    for (auto& l : layers) l->parameters(visit);
  }
  void init() {
    for (std::size_t i = 0; i < layers.size(); ++i) layers[i]->init(first + static_cast<int>(i));
  }
};

struct Batch {
  std::vector<float> x, t;
};
Batch make_batch(int step, int micro, int data_rank) {
  std::mt19937 rng(static_cast<std::uint32_t>(1000003 * step + 7919 * micro + 31 * data_rank + 1));
  std::normal_distribution<float> nd;
  Batch b;
  b.x.resize(static_cast<std::size_t>(kBatch * kWidths.front()));
  b.t.resize(static_cast<std::size_t>(kBatch * kWidths.back()));
  for (auto& v : b.x) v = nd(rng);
  for (auto& v : b.t) v = 0.5f * nd(rng);
  return b;
}

/// 0.5 * mean over the batch of ||y - t||^2; dy = dL/dy * seed.
double mse(const std::vector<float>& y, const std::vector<float>& t, float seed, std::vector<float>& dy) {
  dy.resize(y.size());
  double loss = 0;
  for (std::size_t k = 0; k < y.size(); ++k) {
    const float d = y[k] - t[k];
    loss += 0.5 * d * d;
    dy[k] = d / kBatch * seed;
  }
  return loss / kBatch;
}

struct Config {
  int steps = 3;
  int micro = 4;        // m: micro-batches per step = the engine's gradient accumulation steps
  double clip = 0.2;    // small enough to clip every step: the norm is used, not only reported
  Stage3Options stage3;
};

EngineOptions options(const Config& cfg) {
  EngineOptions o;
  o.gradient_accumulation_steps = cfg.micro;
  o.gradient_clipping = cfg.clip;
  o.reduce_bucket_size = 64;  // several buckets per stage
  o.optimizer.lr = 1e-2f;
  o.optimizer.weight_decay = 0.01f;
  o.stage3 = cfg.stage3;
  return o;
}

template <class E, class M>
void init_weights(E& engine, M& model) {
  {
    auto g = engine.gather(model, 0);
    model.init();
  }
  engine.initialize_master();
}

template <class E, class M>
std::vector<std::vector<float>> layer_values(E& engine, M& model) {
  auto g = engine.gather(model);
  std::vector<std::vector<float>> out;
  for (auto& l : model.layers) out.push_back(l->values());
  return out;
}

struct Run {
  std::vector<std::vector<float>> initial, layers;  // [layer] values before and after training
  std::vector<double> losses, norms;       // per step, as the last stage's engine reports them
};

/// One engine over the whole model on the data group `comm`, the micro-batches one after another.
template <class E, comm::Communicator C>
Run whole_model(C& comm, int data_rank, const Config& cfg) {
  Layers<typename E::storage_type> model(0, layer_count());
  E engine(comm, model, options(cfg));
  init_weights(engine, model);
  Run r;
  r.initial = layer_values(engine, model);
  for (int s = 0; s < cfg.steps; ++s) {
    StepReport rep;
    for (int mb = 0; mb < cfg.micro; ++mb) {
      const Batch b = make_batch(s, mb, data_rank);
      std::vector<float> x = b.x, dy;
      for (auto& l : model.layers) {
        auto scope = engine.forward(*l);
        x = l->forward(mb, x);
      }
      const double loss = mse(x, b.t, static_cast<float>(engine.loss_scale()), dy);
      for (auto it = model.layers.rbegin(); it != model.layers.rend(); ++it) {
        auto scope = engine.backward(**it);
        dy = (*it)->backward_input(mb, dy);
        (*it)->backward_weight(mb);
      }
      rep = engine.step(loss);
    }
    REQUIRE(rep.boundary);
    r.losses.push_back(rep.loss);
    r.norms.push_back(rep.grad_norm);
  }
  r.layers = layer_values(engine, model);
  return r;
}

/// The stage functions of one chunk (its layers, its engine) for data rank `data_rank`, at `*step`.
template <class E>
void stage_functions(StageFunctions& f, std::vector<Layers<typename E::storage_type>*> chunks, std::vector<E*> engines,
                     const int* step, int data_rank) {
  using T = typename E::storage_type;
  const auto layers_of = [chunks](int c) -> Layers<T>& { return *chunks[static_cast<std::size_t>(c)]; };
  const auto engine_of = [engines](int c) -> E& { return *engines[static_cast<std::size_t>(c)]; };
  f.forward = [=](const MicroBatch& mb, const Activation* in, Activation& out) {
    std::vector<float> x = in ? std::vector<float>(in->as<float>().begin(), in->as<float>().end())
                              : make_batch(*step, mb.micro, data_rank).x;
    E& engine = engine_of(mb.chunk);
    for (auto& l : layers_of(mb.chunk).layers) {
      auto scope = engine.forward(*l);
      x = l->forward(mb.micro, x);
    }
    out.reset(Shape{{kBatch, static_cast<std::int64_t>(x.size()) / kBatch}, DType::fp32});
    std::copy(x.begin(), x.end(), out.as<float>().begin());
  };
  f.loss = [=](const MicroBatch& mb, const Activation& out, Activation& grad) {
    std::vector<float> dy;
    const std::vector<float> y(out.as<float>().begin(), out.as<float>().end());
    const double loss = mse(y, make_batch(*step, mb.micro, data_rank).t, static_cast<float>(engine_of(mb.chunk).loss_scale()), dy);
    std::copy(dy.begin(), dy.end(), grad.as<float>().begin());
    return loss;
  };
  const auto run_back = [=](const MicroBatch& mb, const Activation& gy, Activation* gx, bool weights) {
    std::vector<float> dy(gy.as<float>().begin(), gy.as<float>().end());
    E& engine = engine_of(mb.chunk);
    auto& ls = layers_of(mb.chunk).layers;
    for (auto it = ls.rbegin(); it != ls.rend(); ++it) {
      if (weights) {  // the full backward: as the whole-model run, in the layer's backward scope
        auto scope = engine.backward(**it);
        dy = (*it)->backward_input(mb.micro, dy);
        (*it)->backward_weight(mb.micro);
      } else {  // the input gradient reads the weights: a forward scope holds them (gathered at stage 3)
        auto scope = engine.forward(**it);
        dy = (*it)->backward_input(mb.micro, dy);
      }
    }
    if (gx) std::copy(dy.begin(), dy.end(), gx->as<float>().begin());
  };
  f.backward = [=](const MicroBatch& mb, const Activation& gy, Activation* gx) { run_back(mb, gy, gx, true); };
  f.backward_input = [=](const MicroBatch& mb, const Activation& gy, Activation* gx) { run_back(mb, gy, gx, false); };
  f.backward_weight = [=](const MicroBatch& mb) {
    E& engine = engine_of(mb.chunk);
    auto& ls = layers_of(mb.chunk).layers;
    for (auto it = ls.rbegin(); it != ls.rend(); ++it) {
      auto scope = engine.backward(**it);
      (*it)->backward_weight(mb.micro);
    }
  };
}

/// This rank's part of a pipelined run on `grid`: one engine per chunk, the layers of virtual stage
/// k from the uniform partition of the model over the schedule's virtual stages.
template <class E, comm::Communicator C>
Run pipelined(comm::ProcessGrid<C>& grid, const Schedule& s, const Config& cfg) {
  using T = typename E::storage_type;
  const auto bounds = partition_uniform(static_cast<std::size_t>(layer_count()), s.virtual_stages());
  std::vector<std::unique_ptr<Layers<T>>> chunks;
  std::vector<std::unique_ptr<E>> engines;
  for (int c = 0; c < s.chunks; ++c) {
    const LayerRange r = layers_of(bounds, s.virtual_stage(grid.pipeline_index(), c));
    chunks.push_back(std::make_unique<Layers<T>>(static_cast<int>(r.first), static_cast<int>(r.last)));
    engines.push_back(std::make_unique<E>(grid, *chunks.back(), options(cfg)));
    init_weights(*engines.back(), *chunks.back());
  }
  std::vector<Layers<T>*> chunk_ptrs;
  std::vector<E*> engine_ptrs;
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    chunk_ptrs.push_back(chunks[c].get());
    engine_ptrs.push_back(engines[c].get());
  }
  Executor exec(grid, s);
  EngineHooks<E> hooks(s, engine_ptrs);
  StageFunctions f;
  int step = 0;
  stage_functions<E>(f, chunk_ptrs, engine_ptrs, &step, grid.data_index());
  hooks.attach(f);
  Run r;
  for (step = 0; step < cfg.steps; ++step) {
    const StepResult res = exec.run(f);
    CHECK(res.figures.total_messages() == 2 * cfg.micro * (s.virtual_stages() - 1));
    const auto& last = hooks.report(s.chunks - 1);  // the chunk that may hold the last stage: its loss is the model's
    r.losses.push_back(last.loss);
    r.norms.push_back(hooks.report(0).grad_norm);
  }
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    for (auto& v : layer_values(*engines[c], *chunks[c])) r.layers.push_back(std::move(v));
  }
  return r;
}

/// Every rank's layers put back in model order: virtual stage k's come from rank k % p's chunk k / p.
std::vector<std::vector<float>> model_layers(const Schedule& s, const std::vector<Run>& per_rank) {
  const auto bounds = partition_uniform(static_cast<std::size_t>(layer_count()), s.virtual_stages());
  std::vector<std::vector<float>> out;
  for (int k = 0; k < s.virtual_stages(); ++k) {
    const Run& r = per_rank[static_cast<std::size_t>(s.rank_of(k))];
    std::size_t at = 0;  // the chunk's layers start after the earlier chunks' on that rank
    for (int c = 0; c < s.chunk_of(k); ++c) at += layers_of(bounds, s.virtual_stage(s.rank_of(k), c)).size();
    const LayerRange lr = layers_of(bounds, k);
    for (std::size_t l = 0; l < lr.size(); ++l) out.push_back(r.layers[at + l]);
  }
  return out;
}

template <class E>
void pipeline_alone_matches_one_rank(std::string_view spec, int p) {
  CAPTURE(spec);
  CAPTURE(p);
  Config cfg;
  const ScheduleSpec sp = ScheduleSpec::parse(spec);
  if (sp.kind == ScheduleKind::interleaved) cfg.clip = 0;  // refused there (one engine per chunk)
  Run one;
  comm::run_threads(1, [&](comm::ThreadsCommunicator& c) { one = whole_model<E>(c, 0, cfg); });
  const Schedule s = make_schedule(sp, p, cfg.micro);
  std::vector<Run> runs(static_cast<std::size_t>(p));
  std::mutex mu;
  comm::run_threads(p, [&](comm::ThreadsCommunicator& world) {
    comm::ProcessGrid grid(world, {.pipeline = p});
    Run r = pipelined<E>(grid, s, cfg);
    std::lock_guard lk(mu);
    runs[static_cast<std::size_t>(grid.pipeline_index())] = std::move(r);
  });
  CHECK(model_layers(s, runs) == one.layers);
  if (sp.kind == ScheduleKind::interleaved) {
    CHECK(runs[static_cast<std::size_t>(p - 1)].losses == one.losses);  // the last chunk's engines hold the loss
  } else {
    for (const Run& r : runs) {  // every rank's engine reports the model's loss and norm
      CHECK(r.losses == one.losses);
      CHECK(r.norms == one.norms);
    }
  }
  CHECK(one.layers.size() == static_cast<std::size_t>(layer_count()));
  CHECK(one.layers != one.initial);  // it trained
  if (cfg.clip > 0) {
    for (double n : one.norms) CHECK(n > cfg.clip);  // and clipped: the global norm decided the update
  }
}

using Fp32 = Engine<Partitioner<Stage<0>>, Optimizer<AdamW>>;
using Bf16 = Engine<Partitioner<Stage<0>>, Optimizer<AdamW>, Precision<bf16>>;

}  // namespace

TEST_CASE("pipeline alone (pp 2 and 4, data 1): every schedule trains as one rank does, bit for bit (fp32, bf16)") {
  for (std::string_view spec : {"gpipe", "1f1b", "interleaved:2", "zbh1"}) {
    for (int p : {2, 4}) {
      pipeline_alone_matches_one_rank<Fp32>(spec, p);
      pipeline_alone_matches_one_rank<Bf16>(spec, p);
    }
  }
}

namespace {

// Stages 0 and 1 reduce every micro-step too, as 2 and 3 must: then every stage accumulates the
// same reduced gradients in the same order (tests/engine/test_grid.cpp does the same).
template <int S>
using ZeroEngine = Engine<Partitioner<Stage<S>, when::every_micro_step>, Optimizer<AdamW>, Precision<bf16>>;

template <int S>
Run pp2_data2(const Schedule& s, const Config& cfg) {
  std::vector<Run> runs(4);
  std::mutex mu;
  comm::run_threads(4, [&](comm::ThreadsCommunicator& world) {
    comm::ProcessGrid grid(world, {.pipeline = 2});
    Run r = pipelined<ZeroEngine<S>>(grid, s, cfg);
    std::lock_guard lk(mu);
    runs[static_cast<std::size_t>(world.rank())] = std::move(r);
  });
  // Megatron's order: world rank = pipeline * 2 + data. Both data ranks of a stage hold the same values.
  CHECK(runs[0].layers == runs[1].layers);
  CHECK(runs[2].layers == runs[3].layers);
  CHECK(runs[0].losses == runs[3].losses);
  CHECK(runs[0].norms == runs[3].norms);
  Run out = runs[0];
  out.layers = model_layers(s, {runs[0], runs[2]});
  return out;
}

template <int S>
Run data2_alone(const Config& cfg) {
  std::vector<Run> runs(2);
  comm::run_threads(2, [&](comm::ThreadsCommunicator& c) { runs[static_cast<std::size_t>(c.rank())] = whole_model<ZeroEngine<S>>(c, c.rank(), cfg); });
  CHECK(runs[0].layers == runs[1].layers);
  return runs[0];
}

}  // namespace

TEST_CASE("ZeRO 0-3 over the data group of pp 2 x data 2: the same parameters at every stage, and the data group's alone") {
  for (std::string_view spec : {"1f1b", "zbh1", "interleaved:2"}) {
    CAPTURE(spec);
    Config cfg;
    cfg.stage3.param_persistence_threshold = 0;  // stage 3 gathers every layer in its scopes
    const Schedule s = make_schedule(ScheduleSpec::parse(spec), 2, cfg.micro);
    if (s.chunks > 1) cfg.clip = 0;  // one engine per chunk: refused there
    const Run s0 = pp2_data2<0>(s, cfg), alone = data2_alone<0>(cfg);
    CHECK(s0.layers == alone.layers);
    CHECK(s0.losses == alone.losses);
    if (s.chunks == 1) CHECK(s0.norms == alone.norms);  // a chunk's engine reports its chunk's norm
    CHECK(alone.layers != alone.initial);
    CHECK(pp2_data2<1>(s, cfg).layers == s0.layers);
    CHECK(pp2_data2<2>(s, cfg).layers == s0.layers);
    const Run s3 = pp2_data2<3>(s, cfg);
    CHECK(s3.layers == s0.layers);
    CHECK(s3.losses == s0.losses);
    CHECK(s3.norms == s0.norms);
  }
}

TEST_CASE("EngineHooks: the engine's accumulation must match the schedule, and interleaving refuses a per-chunk norm") {
  comm::run_threads(1, [](comm::ThreadsCommunicator& c) {
    Layers<float> model(0, 2);
    Config cfg;
    cfg.micro = 2;
    Fp32 engine(c, model, options(cfg));
    const Schedule four = make_schedule(ScheduleSpec::parse("1f1b"), 1, 4);
    CHECK_THROWS_WITH_AS(EngineHooks<Fp32>(four, engine),
                         doctest::Contains("gradient_accumulation_steps must equal the schedule's micro-batches per step (4)"),
                         usage_error);
    const Schedule two = make_schedule(ScheduleSpec::parse("interleaved:2"), 2, 2);
    CHECK_THROWS_WITH_AS(EngineHooks<Fp32>(two, std::vector<Fp32*>{&engine, &engine}),
                         doctest::Contains("gradient clipping under an interleaved schedule"), usage_error);
    CHECK_THROWS_WITH_AS(EngineHooks<Fp32>(two, engine), doctest::Contains("needs one engine per model chunk of the schedule (2)"),
                         usage_error);
  });
}
