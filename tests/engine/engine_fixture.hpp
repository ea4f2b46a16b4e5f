#pragma once
// A small MLP with hand-written forward/backward, deterministic data, and a serial fp64 reference
// trainer, shared by the engine tests (threads) and the MPI engine test.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "zerotk/comm/threads.hpp"
#include "zerotk/core/concepts.hpp"
#include "zerotk/core/param.hpp"
#include "zerotk/engines.hpp"  // the compiled engine set, when the suite links zerotk::engines
#include "zerotk/optim/optimizer.hpp"

namespace zt_test {

using zerotk::from_float;
using zerotk::to_float;

/// Dense layer y = act(x W^T + b) over a batch, row-major [batch][features]. T is the Param element
/// type (float, half or bfloat16); arithmetic in float, gradients accumulated into T storage.
template <class T>
struct Dense {
  using input_type = std::vector<float>;
  using output_type = std::vector<float>;
  int in = 0, out = 0;
  bool relu = false;
  zerotk::Param<T> w, b;
  std::vector<float> x_, z_;  // saved input and pre-activation
  int batch_ = 0;
  // Test hook: poison this layer's weight gradient with +inf on this backward.
  bool poison_next_backward = false;

  Dense(std::string name, int in_, int out_, bool relu_)
      : in(in_), out(out_), relu(relu_),
        w(name + ".weight", {static_cast<std::size_t>(out_), static_cast<std::size_t>(in_)}),
        b(name + ".bias", {static_cast<std::size_t>(out_)}) {}

  template <class V>
  void parameters(V&& visit) {
    visit(w.name(), w);
    visit(b.name(), b);
  }

  output_type forward(const input_type& x) {
    batch_ = static_cast<int>(x.size()) / in;
    x_ = x;
    z_.assign(static_cast<std::size_t>(batch_ * out), 0.0f);
    std::vector<float> y(z_.size());
    for (int n = 0; n < batch_; ++n) {
      for (int o = 0; o < out; ++o) {
        float s = to_float(b.data()[o]);
        for (int i = 0; i < in; ++i) s += x[n * in + i] * to_float(w.data()[o * in + i]);
        z_[n * out + o] = s;
        y[n * out + o] = relu && s < 0 ? 0.0f : s;
      }
    }
    return y;
  }

  input_type backward(const output_type& dy) {
    std::vector<float> dz(dy.size()), dx(static_cast<std::size_t>(batch_ * in), 0.0f);
    for (std::size_t k = 0; k < dy.size(); ++k) dz[k] = relu && z_[k] < 0 ? 0.0f : dy[k];
    for (int o = 0; o < out; ++o) {
      float gb = 0;
      for (int n = 0; n < batch_; ++n) gb += dz[n * out + o];
      b.grad()[o] = from_float<T>(to_float(b.grad()[o]) + gb);
      for (int i = 0; i < in; ++i) {
        float gw = 0;
        for (int n = 0; n < batch_; ++n) gw += dz[n * out + o] * x_[n * in + i];
        w.grad()[o * in + i] = from_float<T>(to_float(w.grad()[o * in + i]) + gw);
      }
    }
    if (poison_next_backward) {
      w.grad()[0] = from_float<T>(INFINITY);
      poison_next_backward = false;
    }
    for (int n = 0; n < batch_; ++n)
      for (int o = 0; o < out; ++o)
        for (int i = 0; i < in; ++i) dx[n * in + i] += dz[n * out + o] * to_float(w.data()[o * in + i]);
    return dx;
  }
};

/// Uneven sizes on purpose: nothing divides by 2, 3 or 4.
inline const std::vector<int> kWidths = {13, 17, 11, 5};

template <class T>
struct Mlp {
  std::vector<Dense<T>> layers;
  Mlp() {
    for (std::size_t l = 0; l + 1 < kWidths.size(); ++l) {
      layers.emplace_back("fc" + std::to_string(l), kWidths[l], kWidths[l + 1], l + 2 < kWidths.size());
    }
  }
  template <class V>
  void parameters(V&& visit) {
    for (auto& l : layers) l.parameters(visit);
  }
  /// Same initial values on every rank, independent of precision (rounded by the storage type).
  void init(std::uint32_t seed) {
    std::mt19937 rng(seed);
    for (auto& l : layers) {
      std::normal_distribution<float> nd(0.0f, 1.0f / std::sqrt(static_cast<float>(l.in)));
      for (std::size_t i = 0; i < l.w.numel(); ++i) l.w.data()[i] = from_float<T>(nd(rng));
      for (std::size_t i = 0; i < l.b.numel(); ++i) l.b.data()[i] = from_float<T>(0.01f * static_cast<float>(i));
    }
  }
  std::vector<float> values() const {
    std::vector<float> v;
    for (const auto& l : layers) {
      for (std::size_t i = 0; i < l.w.numel(); ++i) v.push_back(to_float(l.w.data()[i]));
      for (std::size_t i = 0; i < l.b.numel(); ++i) v.push_back(to_float(l.b.data()[i]));
    }
    return v;
  }
};

/// The micro-batch rank `rank` sees at global step `step`, micro-step `micro`: inputs and targets.
struct Batch {
  std::vector<float> x, t;
};
inline constexpr int kBatch = 4;
inline Batch make_batch(int step, int micro, int rank) {
  std::mt19937 rng(static_cast<std::uint32_t>(1000003 * step + 7919 * micro + 31 * rank + 1));
  std::normal_distribution<float> nd;
  Batch b;
  b.x.resize(static_cast<std::size_t>(kBatch * kWidths.front()));
  b.t.resize(static_cast<std::size_t>(kBatch * kWidths.back()));
  for (auto& v : b.x) v = nd(rng);
  for (auto& v : b.t) v = 0.5f * nd(rng);
  return b;
}

/// Loss 0.5 * mean over the batch of ||y - t||^2; returns loss and dL/dy * seed.
inline float mse(const std::vector<float>& y, const std::vector<float>& t, float seed, std::vector<float>& dy) {
  dy.resize(y.size());
  double loss = 0;
  for (std::size_t k = 0; k < y.size(); ++k) {
    const float d = y[k] - t[k];
    loss += 0.5 * d * d;
    dy[k] = d / kBatch * seed;
  }
  return static_cast<float>(loss / kBatch);
}

/// Serial fp64 AdamW (the fused GPU form of SEMANTICS section 3) over the union of every rank's
/// micro-batches: the gradient is the mean over ranks and micro-steps, clipped as DeepSpeed does.
inline std::vector<float> reference(int world, int gas, double clip, int steps, const zerotk::OptimizerOptions& opt) {
  Mlp<float> model;
  std::vector<float> vals(4096), grads(4096);
  std::size_t off = 0;
  model.parameters([&](std::string_view, auto& p) {
    p.bind(vals.data() + off, grads.data() + off);
    off += p.numel();
  });
  const std::size_t n = off;
  model.init(42);
  std::vector<double> master(vals.begin(), vals.begin() + static_cast<long>(n)), m(n, 0.0), v(n, 0.0), g(n);
  for (int s = 0; s < steps; ++s) {
    std::fill(g.begin(), g.end(), 0.0);
    for (int r = 0; r < world; ++r) {
      for (int mi = 0; mi < gas; ++mi) {
        std::fill(grads.begin(), grads.end(), 0.0f);
        const Batch b = make_batch(s, mi, r);
        std::vector<float> x = b.x, dy;
        for (auto& l : model.layers) x = l.forward(x);
        mse(x, b.t, 1.0f, dy);
        for (auto it = model.layers.rbegin(); it != model.layers.rend(); ++it) dy = it->backward(dy);
        for (std::size_t i = 0; i < n; ++i) g[i] += grads[i];
      }
    }
    double sumsq = 0;
    for (auto& x : g) {
      x /= world * gas;
      sumsq += x * x;
    }
    double factor = 1.0;
    if (clip > 0) {
      const double k = (std::sqrt(sumsq) + 1e-6) / clip;
      if (k > 1) factor = 1.0 / k;
    }
    const double t = s + 1, bc1 = 1 - std::pow(opt.beta1, t), bc2 = 1 - std::pow(opt.beta2, t);
    for (std::size_t i = 0; i < n; ++i) {
      const double gi = g[i] * factor;
      m[i] = opt.beta1 * m[i] + (1 - opt.beta1) * gi;
      v[i] = opt.beta2 * v[i] + (1 - opt.beta2) * gi * gi;
      master[i] -= opt.lr * ((m[i] / bc1) / (std::sqrt(v[i] / bc2) + opt.eps) + opt.weight_decay * master[i]);
      vals[i] = static_cast<float>(master[i]);
    }
  }
  return model.values();
}

struct RunConfig {
  int world = 2;
  int steps = 30;
  int gas = 1;
  double clip = 0.0;
  std::set<int> poison_steps;  // global steps whose micro-step 0 gets an inf on rank (step % world)
  std::size_t bucket_bytes = 256;  // small: many buckets, params straddling nothing, overlap exercised
  /// Stages 0/1: Partitioner<Stage<S>, when::every_micro_step> (true), when::at_boundary (false), or
  /// the policy's default (DeepSpeed's order: at the boundary). Stage 2 always reduces every micro-step.
  std::optional<bool> reduce_every_micro_step;
  bool overlap = true;
  bool overlap_gather = false;  // EngineOptions::overlap_param_gather
  void* stream = nullptr;  // Device<Cuda>: the compute stream (EngineOptions::stream)
  zerotk::Stage3Options stage3;  // Partitioner<Stage<3>> only
  zerotk::offload::NvmeOptions nvme;  // Offload<Nvme> only (its swap directory, buffers, aio)
  zerotk::offload::ParamNvmeOptions param_nvme;  // OffloadParams<Nvme> only (its shard directory, buffers)
  std::size_t sub_group_size = 1'000'000'000;  // Offload<Cpu> and Offload<Nvme>: elements stepped at once
  zerotk::CommunicationOptions communication;  // the data group's topology, the slow-rank detector
  bool take_state = false;  // RunResult::state: engine.state() after the last step
  bool delayed_update = false;  // EngineOptions::delayed_param_update (Offload<Cpu>)
  /// >= 0: engine.state() after this many steps, two more steps, then load_state of what was taken
  /// and training on from there (train_rank only).
  int reload_after = -1;
};

struct RunResult {
  std::vector<float> params;          // rank 0's final values
  std::vector<double> losses;         // per boundary
  std::vector<double> scales;         // per boundary
  std::vector<char> skipped;          // per boundary
  std::vector<double> norms;          // per boundary (unscaled; -1 when skipped)
  std::vector<float> initial;         // rank 0's values before training
  bool ranks_agree = true;            // every rank ended with the same values
  zerotk::ReportGroups groups;        // the last report's: the grid's group sizes
  std::vector<float> state;           // with RunConfig::take_state: rank 0's master and moments, every group
};

/// The model of a run: Model() or, for models that live on a device, Model(cfg.stream).
template <class Model>
Model make_model(const RunConfig& cfg) {
  if constexpr (std::is_constructible_v<Model, void*>) {
    return Model(cfg.stream);
  } else {
    (void)cfg;
    return Model();
  }
}

/// The EngineOptions of every run of these tests.
inline zerotk::EngineOptions engine_options(const RunConfig& cfg) {
  zerotk::EngineOptions o;
  o.stream = cfg.stream;
  // The deprecated byte count, kept here on purpose: every engine test also checks that it still
  // gives the working-precision group bucket_bytes / sizeof(S) elements (EngineOptions::bucket_numel).
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
  o.bucket_bytes = cfg.bucket_bytes;
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
  o.gradient_accumulation_steps = cfg.gas;
  o.gradient_clipping = cfg.clip;
  o.optimizer.lr = 1e-2f;
  o.optimizer.weight_decay = 0.01f;
  o.loss_scaler.initial_scale_power = 8;
  o.loss_scaler.loss_scale_window = 5;
  o.overlap_comm = cfg.overlap;
  o.overlap_param_gather = cfg.overlap_gather;
  o.stage3 = cfg.stage3;
  o.nvme = cfg.nvme;
  o.param_nvme = cfg.param_nvme;
  o.sub_group_size = cfg.sub_group_size;
  o.communication = cfg.communication;
  o.delayed_param_update = cfg.delayed_update;
  return o;
}

/// One micro-step of batch `b` (forward, MSE loss, backward); returns the loss for engine.step.
/// `poison`: layer 1's next backward writes an inf (an overflow on this rank).
template <class E, class Model>
float micro_step(E& engine, Model& model, const Batch& b, bool poison = false) {
  std::vector<float> x = b.x;
  for (auto& l : model.layers) {
    auto scope = engine.forward(l);
    x = l.forward(x);
  }
  std::vector<float> dy;
  const float loss = mse(x, b.t, static_cast<float>(engine.loss_scale()), dy);
  if (poison) model.layers[1].poison_next_backward = true;
  for (auto it = model.layers.rbegin(); it != model.layers.rend(); ++it) {
    auto scope = engine.backward(*it);
    dy = it->backward(dy);
  }
  return loss;
}

/// Global steps [from, to) of a run on this rank's data; each boundary's report goes into `result`.
template <class E, class Model>
void train_steps(E& engine, Model& model, int rank, const RunConfig& cfg, int from, int to, RunResult* result) {
  for (int s = from; s < to; ++s) {
    zerotk::StepReport rep;
    for (int m = 0; m < cfg.gas; ++m) {
      const bool poison = m == 0 && cfg.poison_steps.count(s) && rank == s % cfg.world;
      rep = engine.step(micro_step(engine, model, make_batch(s, m, rank), poison));
      if (rep.boundary != (m + 1 == cfg.gas)) throw std::logic_error("boundary flag wrong");
    }
    if (result) {
      result->losses.push_back(rep.loss);
      result->scales.push_back(rep.loss_scale);
      result->skipped.push_back(rep.skipped);
      result->norms.push_back(rep.grad_norm);
      result->groups = rep.groups;
    }
  }
}

/// One micro-step per boundary of batches first_batch, first_batch + 1, ... on this rank's data
/// (one micro-step each, MSE loss); the reports of every step.
template <class E, class Model>
std::vector<zerotk::StepReport> train_boundaries(E& engine, Model& model, int rank, int first_batch, int steps) {
  std::vector<zerotk::StepReport> reports;
  for (int s = first_batch; s < first_batch + steps; ++s) reports.push_back(engine.step(micro_step(engine, model, make_batch(s, 0, rank))));
  return reports;
}

/// Parameters have storage once the engine binds them: rank 0 writes the initial values.
template <class E, class Model>
void init_model(E& engine, Model& model, std::uint32_t seed) {
  {
    auto g = engine.gather(model, 0);
    model.init(seed);
  }
  engine.initialize_master();
}

/// The serial references' model: Mlp<float> (init seed 42) bound to one flat fp32 buffer, its
/// tensors (offset, numel) in the engine's order, and the gradient of one rank's batch at given
/// values (the fixture's own forward/backward, one micro-step, loss scale 1).
struct SerialMlp {
  Mlp<float> model;
  std::vector<float> vals = std::vector<float>(4096), grads = std::vector<float>(4096);
  std::vector<std::pair<std::size_t, std::size_t>> tensors;  // offset, numel
  std::size_t n = 0;

  SerialMlp() {
    model.parameters([&](std::string_view, auto& p) {
      p.bind(vals.data() + n, grads.data() + n);
      tensors.emplace_back(n, p.numel());
      n += p.numel();
    });
    model.init(42);
  }
  SerialMlp(const SerialMlp&) = delete;
  SerialMlp& operator=(const SerialMlp&) = delete;

  /// The initial values, n of them.
  std::vector<float> values() const { return {vals.begin(), vals.begin() + static_cast<long>(n)}; }
  /// The gradient of batch (step, micro-step 0, rank) at `at` (n values).
  std::vector<float> gradient(int step, int rank, const std::vector<float>& at) {
    std::copy(at.begin(), at.end(), vals.begin());
    std::fill(grads.begin(), grads.end(), 0.0f);
    const Batch b = make_batch(step, 0, rank);
    std::vector<float> x = b.x, dy;
    for (auto& l : model.layers) x = l.forward(x);
    (void)mse(x, b.t, 1.0f, dy);
    for (auto it = model.layers.rbegin(); it != model.layers.rend(); ++it) dy = it->backward(dy);
    return {grads.begin(), grads.begin() + static_cast<long>(n)};
  }
};

/// `steps` boundaries of engine E on `world` threads with Mlp<float> (init seed 42), from batch
/// `first_batch`: every rank's final parameters, and rank 0's reports, initial values and padded
/// flat buffer length.
struct ThreadsRun {
  std::vector<std::vector<float>> finals;  // per rank
  std::vector<zerotk::StepReport> reports;  // rank 0's
  std::vector<float> initial;               // rank 0's
  std::size_t flat_numel = 0;
};
template <class E>
ThreadsRun train_threads(int world, int steps, const zerotk::EngineOptions& o, int first_batch = 0) {
  ThreadsRun r;
  r.finals.resize(static_cast<std::size_t>(world));
  std::mutex mu;
  zerotk::comm::run_threads(world, [&](zerotk::comm::ThreadsCommunicator& c) {
    Mlp<float> model;
    E engine(c, model, o);
    init_model(engine, model, 42);
    std::vector<float> initial = model.values();
    std::vector<zerotk::StepReport> reports = train_boundaries(engine, model, c.rank(), first_batch, steps);
    std::lock_guard lock(mu);
    r.finals[static_cast<std::size_t>(c.rank())] = model.values();
    if (c.rank() == 0) {
      r.flat_numel = engine.flat_numel();
      r.reports = std::move(reports);
      r.initial = std::move(initial);
    }
  });
  return r;
}

/// Equal sizes and equal bits.
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

/// The runs of a resume test, on `world` threads with Mlp<float> and one micro-step per boundary
/// (init seed 42), every rank's final parameters of each:
/// A: before + after steps straight. B: `before` steps, state(), load_state(it), `after` more. C: a
/// fresh engine (initial values from seed 7, which the load replaces) loads B's state and trains the
/// same `after` steps; its reports are kept. D: as C, from the state with its
/// rank-local part cleared (what a resharded load gives, and DeepSpeed's every load: compression
/// errors from zero). `had_rank_local`: whether the saved state had a rank-local part on each rank.
struct ResumeRuns {
  std::vector<std::vector<float>> a, b, c, d;
  std::vector<std::vector<zerotk::StepReport>> c_reports;
  std::vector<int> had_rank_local;
};
template <class E>
ResumeRuns resume_runs(int world, const zerotk::EngineOptions& o, int before, int after) {
  const auto w = static_cast<std::size_t>(world);
  ResumeRuns out{std::vector<std::vector<float>>(w), std::vector<std::vector<float>>(w),
                 std::vector<std::vector<float>>(w), std::vector<std::vector<float>>(w),
                 std::vector<std::vector<zerotk::StepReport>>(w), std::vector<int>(w, 0)};
  zerotk::comm::run_threads(world, [&](zerotk::comm::ThreadsCommunicator& c) {
    const auto r = static_cast<std::size_t>(c.rank());
    {
      Mlp<float> model;
      E e(c, model, o);
      init_model(e, model, 42);
      (void)train_boundaries(e, model, c.rank(), 0, before + after);
      out.a[r] = model.values();
    }
    zerotk::EngineState saved;
    {
      Mlp<float> model;
      E e(c, model, o);
      init_model(e, model, 42);
      (void)train_boundaries(e, model, c.rank(), 0, before);
      saved = e.state();
      e.load_state(saved);
      (void)train_boundaries(e, model, c.rank(), before, after);
      out.b[r] = model.values();
    }
    {
      Mlp<float> model;
      E e(c, model, o);
      init_model(e, model, 7);
      e.load_state(saved);
      out.c_reports[r] = train_boundaries(e, model, c.rank(), before, after);
      out.c[r] = model.values();
    }
    out.had_rank_local[r] = 0;
    for (zerotk::EngineGroupState& g : saved.groups) {
      out.had_rank_local[r] |= g.rank_local.empty() ? 0 : 1;
      g.rank_local = {};
    }
    {
      Mlp<float> model;
      E e(c, model, o);
      init_model(e, model, 7);
      e.load_state(saved);
      (void)train_boundaries(e, model, c.rank(), before, after);
      out.d[r] = model.values();
    }
  });
  return out;
}


/// Engine<Part, Precision<Prec>, Policies...> with Optimizer<AdamW> unless Policies name the
/// optimizer. A specialisation, not std::conditional_t: naming Engine<...> resolves its pack
/// (engine/resolve.hpp), so the branch not taken must not be named.
template <bool NamesOptimizer, class Part, class Prec, class... Policies>
struct EngineWithOptimizer {
  using type = zerotk::Engine<Part, zerotk::Optimizer<zerotk::AdamW>, zerotk::Precision<Prec>, Policies...>;
};
template <class Part, class Prec, class... Policies>
struct EngineWithOptimizer<true, Part, Prec, Policies...> {
  using type = zerotk::Engine<Part, zerotk::Precision<Prec>, Policies...>;
};

template <class Part, class Prec, class Comm, class Model, class... Policies>
RunResult train_rank_with(Comm& comm, const RunConfig& cfg, zerotk::MemoryLedger* ledger_out) {
  using namespace zerotk;
  using E = typename EngineWithOptimizer<(policy_count_v<policy::optimizer, Policies...> > 0), Part, Prec,
                                         Policies...>::type;
  RunResult result;
  {
    Model model = make_model<Model>(cfg);
    E engine(comm, model, engine_options(cfg));
    {  // rank 0's writes become every rank's (stage 3: written into the shards)
      auto g = engine.gather(model, 0);
      model.init(42);
      result.initial = model.values();
    }
    engine.initialize_master();
    if (cfg.reload_after >= 0) {  // a state taken, two steps past it, the state loaded back
      train_steps(engine, model, comm.rank(), cfg, 0, cfg.reload_after, &result);
      if (cfg.delayed_update) engine.settle();
      const EngineState saved = engine.state();
      train_steps(engine, model, comm.rank(), cfg, cfg.reload_after, cfg.reload_after + 2, &result);
      if (cfg.delayed_update) engine.settle();
      engine.load_state(saved);
      train_steps(engine, model, comm.rank(), cfg, cfg.reload_after, cfg.steps, &result);
    } else {
      train_steps(engine, model, comm.rank(), cfg, 0, cfg.steps, &result);
    }
    if (cfg.take_state) {
      if (cfg.delayed_update) engine.settle();  // the update in flight published first
      for (const EngineGroupState& g : engine.state().groups) {
        result.state.insert(result.state.end(), g.master.begin(), g.master.end());
        result.state.insert(result.state.end(), g.optimizer.m.begin(), g.optimizer.m.end());
        result.state.insert(result.state.end(), g.optimizer.v.begin(), g.optimizer.v.end());
      }
    }
    {
      auto g = engine.gather(model);  // values() reads parameters outside the layers' scopes
      result.params = model.values();
    }
    if (ledger_out) {  // by space and category
      for (std::size_t sp = 0; sp < kMemorySpaceCount; ++sp) {
        for (std::size_t c = 0; c < kMemoryCategoryCount; ++c) {
          const auto space = static_cast<MemorySpace>(sp);
          const auto cat = static_cast<MemoryCategory>(c);
          ledger_out->add(space, cat, engine.memory().live(space, cat));
        }
      }
    }
  }
  return result;
}

/// One rank's run at stage S on `source`: a communicator, or a process grid whose data group is what
/// ZeRO sees. The batches and the injected overflows follow `data_rank`, the rank in the data group
/// (cfg.world is that group's size). `Opt` and `Policies` complete the Engine.
template <int S, class Prec, class Source, class Opt = zerotk::Optimizer<zerotk::AdamW>, class... Policies>
RunResult train_on(Source& source, int data_rank, const RunConfig& cfg) {
  using namespace zerotk;
  using E = Engine<Partitioner<Stage<S>>, Opt, Precision<Prec>, Policies...>;
  RunResult result;
  Mlp<typename Prec::storage> model;
  E engine(source, model, engine_options(cfg));
  {
    auto g = engine.gather(model, 0);
    model.init(42);
    result.initial = model.values();
  }
  engine.initialize_master();
  train_steps(engine, model, data_rank, cfg, 0, cfg.steps, &result);
  {
    auto g = engine.gather(model);
    result.params = model.values();
  }
  return result;
}

/// One rank's training run: `cfg.steps` boundaries of `cfg.gas` micro-steps on this rank's data.
/// Returns this rank's final values and (rank 0 or not) the per-boundary reports. Model has Mlp's
/// interface (layers with poison_next_backward, init, values); Policies are the Engine's further
/// policies (Device, Offload, OffloadParams, an Optimizer instead of AdamW; none: the Engine's
/// defaults, Device<Host>).
template <int Stage, class Prec, class Comm, class Model = Mlp<typename Prec::storage>, class... Policies>
RunResult train_rank(Comm& comm, const RunConfig& cfg, zerotk::MemoryLedger* ledger_out = nullptr) {
  using zerotk::Partitioner;
  if constexpr (Stage < 2) {
    if (cfg.reduce_every_micro_step.has_value()) {
      if (*cfg.reduce_every_micro_step) {
        return train_rank_with<Partitioner<zerotk::Stage<Stage>, zerotk::when::every_micro_step>, Prec, Comm, Model,
                               Policies...>(comm, cfg, ledger_out);
      }
      return train_rank_with<Partitioner<zerotk::Stage<Stage>, zerotk::when::at_boundary>, Prec, Comm, Model,
                             Policies...>(comm, cfg, ledger_out);
    }
  }
  return train_rank_with<Partitioner<zerotk::Stage<Stage>>, Prec, Comm, Model, Policies...>(comm, cfg, ledger_out);
}

}  // namespace zt_test
