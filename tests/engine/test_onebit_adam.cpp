// Optimizer<OneBitAdam> in the engine (stage 0, threads communicator): DeepSpeed's phases against
// independent references, bit for bit. The first step changes nothing; the warm-up equals AdamW
// without bias correction; the whole run (warm-up, then the per-tensor compressed momentum with
// worker and server errors, frozen v, local gradients) equals a serial reference of all W ranks
// written from SEMANTICS.md section 9 (W = 1..4, tensors whose sizes nothing divides); wire bytes
// per step; clipping by each rank's own norm; errors restored by load_state (reset without them).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "../compress/onebit_reference.hpp"
#include "engine_fixture.hpp"
#include "zerotk/comm/accounting.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/engine.hpp"

namespace test_onebit_adam {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using zt_test::Mlp;
using zt_test::same_bits;
using Run = zt_test::ThreadsRun;

namespace {

using OneBitEngine = Engine<Partitioner<Stage<0>>, Optimizer<OneBitAdam>, Precision<fp32>>;

EngineOptions options(std::int64_t freeze_step, double clip = 0.0, std::size_t bucket_bytes = 256) {
  EngineOptions o;
  o.reduce_bucket_size = bucket_bytes / sizeof(float);  // fp32 elements
  o.gradient_clipping = clip;
  // A short warm-up freezes v near zero wherever the gradient was (about) zero so far, and the
  // compressed phase then divides by sqrt(v) + eps: eps = 1e-2 keeps these short runs finite, with
  // no step skipped (which the serial reference does not model). Real runs warm up for thousands of
  // steps (DeepSpeed's freeze_step default is 100000).
  o.optimizer.lr = 1e-3;
  o.optimizer.beta2 = 0.95;
  o.optimizer.eps = 1e-2;
  o.optimizer.weight_decay = 0.01;
  o.onebit.freeze_step = freeze_step;
  return o;
}

/// The serial reference of 1-bit Adam over all W ranks (SEMANTICS.md section 9, fp32, no clipping,
/// one micro-step): per tensor p, m, v; each rank's gradient from the fixture's own backward on that
/// rank's batch; the warm-up averages gradients (float sum in rank order / W, the threads
/// communicator's avg) and steps Adam without bias correction; from the step after the first
/// t >= max(2, freeze_step) each rank updates m from its own gradient, every tensor's m goes through
/// the 1-bit reference all-reduce (W > 1), v stays frozen.
std::vector<float> reference(int world, int steps, std::int64_t freeze_step, const OptimizerOptions& h) {
  zt_test::SerialMlp net;
  const auto& tensors = net.tensors;
  const std::size_t n = net.n;
  std::vector<float> vals = net.values();
  const float lr = static_cast<float>(h.lr), b1 = static_cast<float>(h.beta1), b2 = static_cast<float>(h.beta2);
  const float omb1 = static_cast<float>(1.0 - static_cast<double>(b1));
  const float omb2 = static_cast<float>(1.0 - static_cast<double>(b2));
  const float eps = static_cast<float>(h.eps), wd = static_cast<float>(h.weight_decay);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  std::vector<test::OneBitReference> exchange;
  for (const auto& t : tensors) exchange.emplace_back(t.second, world);
  auto apply = [&](std::size_t i) {
    const float u = std::fma(wd, vals[i], m[i] / (std::sqrt(v[i]) + eps));
    vals[i] = std::fma(-lr, u, vals[i]);
  };
  bool compressed = false;
  for (int s = 0; s < steps; ++s) {
    const std::int64_t t = s + 1;
    std::vector<std::vector<float>> g(static_cast<std::size_t>(world));
    for (int r = 0; r < world; ++r) g[static_cast<std::size_t>(r)] = net.gradient(s, r, vals);
    if (t == 1) continue;  // DeepSpeed's initialisation step: nothing changes
    if (!compressed) {
      for (std::size_t i = 0; i < n; ++i) {
        float a = g[0][i];
        for (int r = 1; r < world; ++r) a += g[static_cast<std::size_t>(r)][i];
        a = a / static_cast<float>(world);
        m[i] = std::fma(b1, m[i], omb1 * a);
        v[i] = std::fma(b2, v[i], (omb2 * a) * a);
        apply(i);
      }
    } else {
      for (std::size_t k = 0; k < tensors.size(); ++k) {
        const auto [o, len] = tensors[k];
        std::vector<std::vector<float>> local(static_cast<std::size_t>(world), std::vector<float>(len));
        for (int r = 0; r < world; ++r) {
          for (std::size_t j = 0; j < len; ++j) {
            local[static_cast<std::size_t>(r)][j] = std::fma(b1, m[o + j], omb1 * g[static_cast<std::size_t>(r)][o + j]);
          }
        }
        const std::vector<float> avg = world > 1 ? exchange[k].step(local) : local[0];
        for (std::size_t j = 0; j < len; ++j) m[o + j] = avg[j];
      }
      for (std::size_t i = 0; i < n; ++i) apply(i);
    }
    if (t >= std::max<std::int64_t>(2, freeze_step)) compressed = true;
  }
  return vals;
}

}  // namespace

TEST_CASE("OneBitAdam: the first step changes nothing; the warm-up equals AdamW without bias correction, bit for bit") {
  const EngineOptions o = options(/*freeze_step=*/1000);
  const Run first = zt_test::train_threads<OneBitEngine>(2, 1, o);
  CHECK(same_bits(first.finals[0], first.initial));
  CHECK(first.reports[0].boundary);
  CHECK(first.reports[0].global_steps == 1);

  const Run onebit = zt_test::train_threads<OneBitEngine>(2, 7, o);
  EngineOptions adam = o;
  adam.optimizer.bias_correction = false;
  // AdamW over batches 1..6: 1-bit Adam spent batch 0 on its initialisation step.
  const Run adamw = zt_test::train_threads<Engine<Partitioner<Stage<0>>, Optimizer<AdamW>, Precision<fp32>>>(2, 6, adam, 1);
  CHECK_FALSE(same_bits(onebit.finals[0], onebit.initial));
  for (int r = 0; r < 2; ++r) CHECK(same_bits(onebit.finals[static_cast<std::size_t>(r)], adamw.finals[0]));
}

TEST_CASE("OneBitAdam: warm-up and compressed phase equal the serial reference bit for bit, W = 1..4") {
  for (int w = 1; w <= 4; ++w) {
    for (std::int64_t freeze : {0, 3}) {
      CAPTURE(w);
      CAPTURE(freeze);
      const int steps = 9;
      EngineOptions o = options(freeze);
      const Run got = zt_test::train_threads<OneBitEngine>(w, steps, o);
      for (const StepReport& rep : got.reports) REQUIRE_FALSE(rep.skipped);
      const std::vector<float> want = reference(w, steps, freeze, o.optimizer);
      for (float x : want) REQUIRE(std::isfinite(x));
      for (int r = 0; r < w; ++r) {
        CAPTURE(r);
        CHECK(same_bits(got.finals[static_cast<std::size_t>(r)], want));
      }
      // The compressed phase really ran: a run that stays in the warm-up ends elsewhere.
      o.onebit.freeze_step = 1000;
      if (w > 1) CHECK_FALSE(same_bits(zt_test::train_threads<OneBitEngine>(w, steps, o).finals[0], want));
    }
  }
}

TEST_CASE("OneBitAdam: wire bytes per step: the gradient all-reduce in the warm-up, the 1-bit exchange after it") {
  using comm::OpKind;
  using comm::ring_wire_bytes;
  for (int w : {2, 3}) {
    CAPTURE(w);
    const std::size_t one_bucket = 1 << 20;  // the whole model in one bucket: one all-reduce per step
    const Run got = zt_test::train_threads<OneBitEngine>(w, 6, options(/*freeze_step=*/3, 0.0, one_bucket));
    // Tensors and the padded flat buffer, as the engine lays them out.
    std::vector<std::size_t> tensors;
    Mlp<float> model;
    model.parameters([&](std::string_view, auto& p) { tensors.push_back(p.numel()); });
    std::uint64_t exchange = 0;
    for (std::size_t n : tensors) {
      const compress::OneBitLayout l = compress::OneBitLayout::make(n, w);
      exchange += ring_wire_bytes(OpKind::all_to_all, l.padded / 8, w) +
                  2 * ring_wire_bytes(OpKind::all_gather, 4 * static_cast<std::uint64_t>(w), w) +
                  ring_wire_bytes(OpKind::all_gather, l.padded / 8, w);
    }
    REQUIRE(got.flat_numel > 0);
    const std::size_t padded_flat = got.flat_numel;
    constexpr std::uint64_t kFolds = std::size(kernels::FoldSums{}.fold);
    const std::uint64_t bound = ring_wire_bytes(OpKind::all_reduce, 16, w);
    const std::uint64_t grads = ring_wire_bytes(OpKind::all_reduce, 4 * padded_flat, w);
    const std::uint64_t norm_and_loss = ring_wire_bytes(OpKind::all_reduce, 8 * (kFolds + 1), w);
    const std::uint64_t loss = ring_wire_bytes(OpKind::all_reduce, 8, w);
    // Steps 1-3: warm-up (the first step all-reduces too); steps 4-6: compressed.
    for (int s = 0; s < 3; ++s) {  // step 1's report also counts the broadcast of the initial values
      CAPTURE(s);
      if (s > 0) CHECK(got.reports[s].comm_wire_bytes == grads + bound + norm_and_loss);
      CHECK(got.reports[s].comm_dense_bytes == got.reports[s].comm_wire_bytes);
      CHECK(got.reports[s].compression_ratio() == 1.0);
    }
    for (int s = 3; s < 6; ++s) {
      CAPTURE(s);
      CHECK(got.reports[s].comm_wire_bytes == exchange + bound + loss);
      CHECK(got.reports[s].comm_dense_bytes == grads + bound + loss);
      CHECK(got.reports[s].compression_ratio() > 1.0);
    }
  }
}

TEST_CASE("OneBitAdam: in the compressed phase each rank clips by its own gradients' norm; overflow still agreed") {
  // With a clip far below every norm, each rank's update uses its own clip factor (DeepSpeed's
  // local clipping): the reported norm differs by rank, and ranks still agree on the values
  // (the momentum is exchanged, the step is the same everywhere).
  std::vector<double> norms(2);
  std::vector<std::vector<float>> finals(2);
  comm::run_threads(2, [&](comm::ThreadsCommunicator& c) {
    Mlp<float> model;
    OneBitEngine engine(c, model, options(/*freeze_step=*/2, /*clip=*/1e-3));
    zt_test::init_model(engine, model, 42);
    const std::vector<StepReport> reps = zt_test::train_boundaries(engine, model, c.rank(), 0, 4);
    norms[static_cast<std::size_t>(c.rank())] = reps.back().grad_norm;
    CHECK(reps[1].grad_norm > 0);
    finals[static_cast<std::size_t>(c.rank())] = model.values();
  });
  CHECK(norms[0] > 0);
  CHECK(norms[1] > 0);
  CHECK(norms[0] != norms[1]);
  CHECK(same_bits(finals[0], finals[1]));
}

TEST_CASE("OneBitAdam: load_state restores the phase from the step count and the compression errors from the "
          "state's rank-local part; without it they start from zero") {
  // A: 8 steps straight. B: 5 steps, state(), load_state(it), 3 more. C: a fresh engine loads B's
  // state and trains the same 3 steps. A, B and C are equal (the errors travel with the state); D
  // loads the state without its rank-local part: its errors start from zero and it ends elsewhere.
  const int world = 2;
  const EngineOptions o = options(/*freeze_step=*/2);
  const zt_test::ResumeRuns runs = zt_test::resume_runs<OneBitEngine>(world, o, 5, 3);
  for (std::size_t r = 0; r < world; ++r) {
    CAPTURE(r);
    CHECK(runs.had_rank_local[r] == 1);
    CHECK(same_bits(runs.a[r], runs.b[r]));
    CHECK(same_bits(runs.b[r], runs.c[r]));
    CHECK_FALSE(same_bits(runs.a[r], runs.d[r]));
    // Step 6, the first after the load, is compressed (the state said so): its gradients stayed local.
    const StepReport& first = runs.c_reports[r].front();
    CHECK(first.comm_dense_bytes > first.comm_wire_bytes);
  }
}

TEST_CASE("OneBitAdam: freeze_step must be >= 0; bf16 runs both phases with every rank in step") {
  comm::run_threads(1, [&](comm::ThreadsCommunicator& c) {
    Mlp<float> model;
    CHECK_THROWS_AS(OneBitEngine(c, model, options(-1)), config_error);
  });
  std::vector<std::vector<float>> finals(2), initial(2);
  comm::run_threads(2, [&](comm::ThreadsCommunicator& c) {
    Mlp<bfloat16> model;
    Engine<Partitioner<Stage<0>>, Optimizer<OneBitAdam>, Precision<bf16>> e(c, model, options(3));
    zt_test::init_model(e, model, 42);
    initial[static_cast<std::size_t>(c.rank())] = model.values();
    const std::vector<StepReport> reps = zt_test::train_boundaries(e, model, c.rank(), 0, 10);
    CHECK(reps[2].comm_dense_bytes == reps[2].comm_wire_bytes);
    CHECK(reps.back().comm_dense_bytes > reps.back().comm_wire_bytes);
    finals[static_cast<std::size_t>(c.rank())] = model.values();
  });
  CHECK(same_bits(finals[0], finals[1]));
  CHECK_FALSE(same_bits(finals[0], initial[0]));
}

}  // namespace test_onebit_adam
