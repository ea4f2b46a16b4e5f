// Engine-composition issue, item 6: the learning rate an engine reports is the double the trainer
// (or its config, or its schedule) set, and csv_monitor writes it as DeepSpeed does: `8,0.003`, not
// `8,0.003000000026077032` (0.003 rounded to float and widened back).
#include <doctest/doctest.h>

#include <sstream>
#include <string>
#include <vector>

#include "../monitor/common.hpp"
#include "engine_fixture.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/engine.hpp"
#include "zerotk/monitor/training_log.hpp"

namespace test_step_report {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using namespace zt_test;

namespace {

/// One boundary of a tiny engine with `lr`, optionally under a schedule; returns the report.
template <class Prec>
StepReport one_step(double lr, std::optional<LrScheduler> schedule, double* engine_lr_after = nullptr) {
  StepReport report;
  comm::run_threads(1, [&](auto& comm) {
    Mlp<typename Prec::storage> model;
    EngineOptions o;
    o.optimizer.lr = lr;
    o.loss_scaler.initial_scale_power = 8;
    Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Precision<Prec>> engine(comm, model, o);
    model.init(3);
    engine.initialize_master();
    if (schedule) engine.set_scheduler(*schedule);
    CHECK(engine.lr() == (schedule ? schedule->lr() : lr));
    const Batch b = make_batch(0, 0, 0);
    std::vector<float> x = b.x, dy;
    for (auto& l : model.layers) {
      auto scope = engine.forward(l);
      x = l.forward(x);
    }
    const float loss = mse(x, b.t, static_cast<float>(engine.loss_scale()), dy);
    for (auto it = model.layers.rbegin(); it != model.layers.rend(); ++it) {
      auto scope = engine.backward(*it);
      dy = it->backward(dy);
    }
    report = engine.step(loss);
    if (engine_lr_after) *engine_lr_after = engine.lr();
  });
  return report;
}

}  // namespace

TEST_CASE_TEMPLATE("an engine with lr 0.003 reports exactly 0.003", Prec, fp32, fp16) {
  const StepReport r = one_step<Prec>(0.003, std::nullopt);
  REQUIRE(r.boundary);
  REQUIRE_FALSE(r.skipped);
  CHECK(r.lr == 0.003);
  CHECK(r.lr != static_cast<double>(0.003f));  // what a float on the way used to give
}

TEST_CASE("a scheduled lr is reported as the schedule's double") {
  optim::WarmupLROptions w;
  w.warmup_min_lr = 0.003;  // it = -1 (the first step) runs with warmup_min_lr
  w.warmup_max_lr = 0.01;
  w.warmup_num_steps = 4;
  double after = 0;
  const StepReport r = one_step<fp32>(1e-3, LrScheduler(optim::WarmupLR(w)), &after);
  CHECK(r.lr == 0.003);
  CHECK(after == optim::WarmupLR(w).lr_at(0));  // the next step's lr, written into the groups as a double
  REQUIRE(r.group_lr.size() == 1);
  CHECK(r.group_lr[0] == after);  // what DeepSpeed's get_lr() reports after the step (csv_monitor writes it)
}

TEST_CASE("csv_monitor's lr file reads 0.003, as DeepSpeed writes it") {
  const StepReport r = one_step<fp32>(0.003, std::nullopt);
  zerotk_test::ScratchDir tmp("engine_lr");
  monitor::TrainingLogOptions lo;
  lo.csv_monitor.enabled = true;
  lo.csv_monitor.output_path = tmp.path().string();
  lo.csv_monitor.job_name = "lr";
  std::ostringstream out;
  {
    monitor::TrainingLog log(lo, out);
    log.on_step(r, 8);  // the monitor reads the engine's report itself
  }
  CHECK(zerotk_test::read_bytes(tmp.path() / "lr" / "Train_Samples_lr.csv") == "step,lr\r\n8,0.003\r\n");
}

}  // namespace test_step_report
