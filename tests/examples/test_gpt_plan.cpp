// zerotk-plan against the GPT example's ledger (issue 15's proof): the model trained under the
// engine, its activation bytes reported through the Meter, over a grid of stage x optimizer offload x
// parameter offload (stage 3) x
// activation checkpointing x world size x precision. Model states must equal the plan exactly; the
// activation peak and the per-rank total peak must be within 5% (the plan sums per-category peaks
// that the ledger may see at different moments).
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "gpt.hpp"
#include "gpt_test_util.hpp"
#include "zerotk/activation.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/engines.hpp"  // the compiled engine set, when the suite links zerotk::engines
#include "zerotk/plan/search.hpp"
#include "zerotk/plan/transformer.hpp"

namespace test_gpt_plan {  // the file's own names, apart from its suite's other files in a unity build

namespace {

namespace act = zerotk::activation;
namespace plan = zerotk::plan;
using zerotk::MemoryCategory;

constexpr int kLayers = 4, kHidden = 16, kHeads = 2, kSeq = 8, kBatch = 4, kVocab = 11;

struct Measured {
  std::array<std::size_t, zerotk::kMemoryCategoryCount> live{};
  std::size_t activation_peak = 0, total_peak = 0;
};

plan::CheckpointChoice plan_choice(const std::string& sel) {
  if (sel == "all") return plan::CheckpointChoice::all();
  if (sel == "every:2") return plan::CheckpointChoice::every(2);
  return plan::CheckpointChoice::none();
}

int rows_checked = 0;

template <class Prec>
zerotk::DType dtype_of() {
  return std::is_same_v<Prec, zerotk::fp32> ? zerotk::DType::fp32
         : std::is_same_v<Prec, zerotk::bf16> ? zerotk::DType::bf16
                                                : zerotk::DType::fp16;
}

template <int S, class Prec, class Off, class OffP = zerotk::OffloadParams<zerotk::None>>
void check_plan(int world, const std::string& sel) {
  CAPTURE(S);
  CAPTURE(world);
  CAPTURE(sel);
  const bool offload = std::is_same_v<Off, zerotk::Offload<zerotk::Cpu>>;
  const bool offload_params = std::is_same_v<OffP, zerotk::OffloadParams<zerotk::Cpu>>;
  CAPTURE(offload_params);
  CAPTURE(std::string(zerotk::to_string(dtype_of<Prec>())));
  CAPTURE(offload);
  gpt::Config c;
  c.vocab_size = kVocab;
  c.context = kSeq;
  c.d_model = kHidden;
  c.n_heads = kHeads;
  c.n_layers = kLayers;
  std::vector<Measured> got(static_cast<std::size_t>(world));
  zerotk::comm::run_threads(world, [&](zerotk::comm::ThreadsCommunicator& comm) {
    gpt::Gpt model(c);
    zerotk::EngineOptions o;
    o.reduce_bucket_size = 4096 / sizeof(typename zerotk::Precision<Prec>::storage);
    o.stage3.param_persistence_threshold = 0;
    zerotk::Engine<zerotk::Partitioner<zerotk::Stage<S>>, zerotk::Optimizer<zerotk::AdamW>, zerotk::Precision<Prec>, Off,
                   OffP>
        engine(comm, model, o);
    {
      auto g = engine.gather(model, 0);
      gpt::init_parameters(model, 3);
    }
    engine.initialize_master();
    act::Meter meter(&engine.memory());
    act::Checkpointing ckpt({}, &meter);
    model.set_meter(&meter);
    model.checkpoint_blocks(ckpt, act::Select::parse(sel, "test"));
    engine.memory().reset_peaks();  // the steps, not the set-up
    for (std::uint32_t s = 0; s < 3; ++s) {
      const gpt::Batch b = gpt_test::random_batch(kBatch, kSeq, kVocab, 100 * s + static_cast<std::uint32_t>(comm.rank()));
      const float loss = model.train_step(b, engine, static_cast<float>(engine.loss_scale()));
      engine.step(loss);
    }
    Measured& m = got[static_cast<std::size_t>(comm.rank())];
    for (std::size_t k = 0; k < zerotk::kMemoryCategoryCount; ++k) m.live[k] = engine.memory().live(static_cast<MemoryCategory>(k));
    m.activation_peak = engine.memory().peak(MemoryCategory::activations);
    m.total_peak = engine.memory().peak_total();
    model.checkpoint_blocks(ckpt, act::Select::none());
    model.set_meter(nullptr);
  });

  plan::TransformerShape shape;
  shape.layers = kLayers;
  shape.hidden = kHidden;
  shape.heads = kHeads;
  shape.sequence = kSeq;
  shape.micro_batch = kBatch;
  shape.vocab = kVocab;
  plan::Choice choice;
  choice.stage = S;
  choice.precision = dtype_of<Prec>();
  choice.optimizer = offload ? plan::OffloadTarget::cpu : plan::OffloadTarget::none;
  choice.param = offload_params ? plan::OffloadTarget::cpu : plan::OffloadTarget::none;
  choice.checkpointing = plan_choice(sel);
  plan::EngineSettings s;
  s.reduce_bucket_size = 4096 / sizeof(typename zerotk::Precision<Prec>::storage);
  s.param_persistence_threshold = 0;
  s.compute_space = zerotk::MemorySpace::host;
  s.emulated = !std::is_same_v<Prec, zerotk::fp32>;  // float Params over 16-bit storage
  plan::Budget unlimited;
  unlimited.device_bytes = unlimited.host_bytes = std::numeric_limits<std::size_t>::max() / 4;
  const plan::Evaluation e = plan::evaluate(plan::gpt_model(shape), world, choice, s, unlimited);
  std::size_t planned_total = 0;
  for (std::size_t sp = 0; sp < zerotk::kMemorySpaceCount; ++sp) planned_total += e.memory.space_total(static_cast<zerotk::MemorySpace>(sp));
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    const Measured& m = got[static_cast<std::size_t>(r)];
    for (MemoryCategory k : {MemoryCategory::params16, MemoryCategory::grads, MemoryCategory::master32,
                             MemoryCategory::optimizer_state}) {
      CAPTURE(std::string(zerotk::to_string(k)));
      CHECK(m.live[static_cast<std::size_t>(k)] == e.memory.category_total(k));  // exact
    }
    CHECK(m.activation_peak == e.activations.peak());
    const double ratio = static_cast<double>(planned_total) / static_cast<double>(m.total_peak);
    CAPTURE(planned_total);
    CAPTURE(m.total_peak);
    CHECK(std::abs(ratio - 1.0) <= 0.05);
    if (r == 0) {
      std::printf("plan vs ledger: stage %d%s %-5s %-4s W=%d %-8s activations %8zu / %8zu  total %9zu / %9zu  (%.3f)\n", S,
                  offload_params ? " (params offloaded)" : "",
                  std::string(zerotk::to_string(choice.precision)).c_str(), std::string(plan::to_string(choice.optimizer)).c_str(),
                  world, sel.c_str(), e.activations.peak(), m.activation_peak, planned_total, m.total_peak, ratio);
    }
  }
  ++rows_checked;
}

template <class Prec>
void grid() {
  for (int world : {1, 2, 4}) {
    for (const char* sel : {"none", "all", "every:2"}) {
      check_plan<0, Prec, zerotk::Offload<zerotk::None>>(world, sel);
      check_plan<1, Prec, zerotk::Offload<zerotk::None>>(world, sel);
      check_plan<2, Prec, zerotk::Offload<zerotk::None>>(world, sel);
      check_plan<3, Prec, zerotk::Offload<zerotk::None>>(world, sel);
      check_plan<2, Prec, zerotk::Offload<zerotk::Cpu>>(world, sel);
      check_plan<3, Prec, zerotk::Offload<zerotk::Cpu>>(world, sel);
      check_plan<3, Prec, zerotk::Offload<zerotk::Cpu>, zerotk::OffloadParams<zerotk::Cpu>>(world, sel);
    }
  }
}

}  // namespace

TEST_CASE("zerotk-plan predicts the GPT example's ledger: model states exact, peaks within 5%") {
  grid<zerotk::fp32>();
  grid<zerotk::bf16>();
  CHECK(rows_checked == 2 * 3 * 3 * 7);
}

}  // namespace test_gpt_plan
