// A short fp16 run replayed through TrainingLog with a hand-driven clock: the csv_monitor files
// must equal, byte for byte, what DeepSpeed's csv monitor writes for the same run (golden files
// made with Python's csv module by golden/make_short_run.py), and the printed lines must read
// like DeepSpeed's.
#include "common.hpp"

#include <algorithm>
#include <array>
#include <filesystem>
#include <sstream>
#include <string>

#include "zerotk/config/options.hpp"
#include "zerotk/engine/report.hpp"
#include "zerotk/monitor/training_log.hpp"

using namespace zerotk;
using namespace zerotk::monitor;
using zerotk_test::ManualClock;
using zerotk_test::read_bytes;
using zerotk_test::ScratchDir;

namespace {

constexpr double kTick = 1.0 / 1024;  // seconds; durations are whole ticks so milliseconds are exact
constexpr std::int64_t kTrainBatch = 4;  // micro batch 2 x 2 accumulation steps x world 1
// float32 losses (ln 10, ln 9, ... ln 4), as a torch loss.item() would give them
constexpr std::array<float, 7> kLoss{2.3025851249694824f, 2.1972246170043945f, 2.0794415473937988f,
                                     1.9459101152420044f, 1.7917594909667969f, 1.6094379425048828f,
                                     1.3862943649291992f};

struct RunState {
  double scale = 65536;
  std::int64_t skipped = 0;
};

TrainingLogOptions run_options(const std::filesystem::path& out) {
  TrainingLogOptions o;
  o.csv_monitor.enabled = true;
  o.csv_monitor.output_path = out.string();
  o.csv_monitor.job_name = "short_run";
  o.steps_per_print = 2;
  o.wall_clock_breakdown = true;
  o.scaler = config::ScalerKind::dynamic;
  o.initial_loss_scale = 65536;
  return o;
}

// The engine's calls for boundaries first..last: two micro-steps each, timed phases, an overflow
// at step 3 (the scale halves, the step and its scheduler step are skipped).
void replay(TrainingLog& log, ManualClock& clock, int first, int last, RunState& st) {
  namespace tn = timer_names;
  for (int step = first; step <= last; ++step) {
    for (int micro = 0; micro < 2; ++micro) {
      const bool boundary = micro == 1;
      {
        auto t = log.timers().scope({tn::forward_micro, tn::forward});
        clock.now += 3 * kTick;
      }
      if (boundary) log.on_boundary_loss(static_cast<double>(kLoss[step - 1]), (step - 1) * kTrainBatch);
      {
        auto t = log.timers().scope({tn::backward_micro, tn::backward});
        {
          auto inner = log.timers().scope({tn::backward_inner_micro, tn::backward_inner});
          clock.now += 4 * kTick;
        }
        auto reduce = log.timers().scope({tn::backward_allreduce_micro, tn::backward_allreduce});
        clock.now += 1 * kTick;
      }
      {
        auto t = log.timers().scope({tn::step_micro, tn::step});
        clock.now += (boundary ? 2 : 1) * kTick;
      }
      if (!boundary) {
        log.on_micro_step();
        continue;
      }
      const bool overflow = step == 3;
      if (overflow) {
        st.scale /= 2;
        ++st.skipped;
      }
      const int scheduler_steps = step - static_cast<int>(st.skipped);
      StepReport r;
      r.boundary = true;
      r.skipped = overflow;
      r.global_steps = step;
      r.skipped_steps = st.skipped;
      r.lr = 1e-4 * std::min(scheduler_steps, 4) / 4;  // group_lr left empty: the log reads {lr}
      r.loss_scale = st.scale;
      r.grad_norm = overflow ? -1 : 0.5 * step;
      r.comm_wire_bytes = 100 * static_cast<std::uint64_t>(step);  // as golden/make_short_run.py
      r.comm_dense_bytes = 1000;
      log.on_step(r, step * kTrainBatch);
    }
  }
}

}  // namespace

TEST_CASE("csv_monitor files of a short run match DeepSpeed's byte for byte") {
  ScratchDir tmp("short_run");
  ManualClock clock;
  RunState st;
  std::ostringstream out;
  {
    TrainingLog log(run_options(tmp.path()), out, clock.fn());
    replay(log, clock, 1, 5, st);
  }
  {
    TrainingLog restarted(run_options(tmp.path()), out, clock.fn());  // a resumed job appends
    replay(restarted, clock, 6, 7, st);
  }
  const auto golden = zerotk_test::golden_dir() / "short_run";
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(golden)) {
    CAPTURE(entry.path().filename().string());
    const auto mine = tmp.path() / "short_run" / entry.path().filename();
    REQUIRE(std::filesystem::exists(mine));
    CHECK(read_bytes(mine) == read_bytes(entry.path()));
    ++files;
  }
  CHECK(files == 11);  // DeepSpeed's eight and zerotk's three comm rows
  CHECK(std::distance(std::filesystem::directory_iterator(tmp.path() / "short_run"), {}) == files);
}

TEST_CASE("comm rows: a boundary's wire and dense bytes and their ratio, at every boundary, nothing else") {
  ScratchDir tmp("comm_rows");
  TrainingLogOptions o;
  o.csv_monitor.enabled = true;
  o.csv_monitor.output_path = tmp.path().string();
  o.csv_monitor.job_name = "comm";
  std::ostringstream out;
  ManualClock clock;
  {
    TrainingLog log(o, out, clock.fn());
    StepReport r;
    r.boundary = true;
    r.global_steps = 1;
    r.lr = 0.5;
    r.comm_wire_bytes = 123'456;  // top-k's payload
    r.comm_dense_bytes = 4'000'000;
    log.on_step(r, 32);
    r.global_steps = 2;
    r.comm_wire_bytes = 0;  // nothing sent (one rank): the ratio is 1
    r.comm_dense_bytes = 0;
    log.on_step(r, 64);
  }
  const auto dir = tmp.path() / "comm";
  // bf16/fp32 (no loss_scale), no wall_clock_breakdown: lr and the three comm files only.
  CHECK(std::distance(std::filesystem::directory_iterator(dir), {}) == 4);
  CHECK(read_bytes(dir / "Train_Samples_comm_wire_bytes.csv") == "step,comm_wire_bytes\r\n32,123456\r\n64,0\r\n");
  CHECK(read_bytes(dir / "Train_Samples_comm_dense_bytes.csv") == "step,comm_dense_bytes\r\n32,4000000\r\n64,0\r\n");
  // 4000000 / 123456 as a Python float repr
  CHECK(read_bytes(dir / "Train_Samples_compression_ratio.csv") ==
        "step,compression_ratio\r\n32,32.40020736132711\r\n64,1.0\r\n");
  CHECK(read_bytes(dir / "Train_Samples_lr.csv") == "step,lr\r\n32,0.5\r\n64,0.5\r\n");
}

TEST_CASE("slow-rank rows and the progress line's slow_ranks field, only while the detector is on") {
  ScratchDir tmp("slow_rows");
  TrainingLogOptions o;
  o.csv_monitor.enabled = true;
  o.csv_monitor.output_path = tmp.path().string();
  o.csv_monitor.job_name = "slow";
  o.steps_per_print = 1;
  std::ostringstream out;
  ManualClock clock;
  {
    TrainingLog log(o, out, clock.fn());
    StepReport r;
    r.boundary = true;
    r.global_steps = 1;
    r.lr = 0.5;
    log.on_step(r, 8);  // detector off: no rows, no field
    r.slow_rank_detection = true;
    r.compute_ms = 12.5;
    r.global_steps = 2;
    log.on_step(r, 16);
    r.global_steps = 3;
    r.slow_ranks = {SlowRank{3, "node1", 1.25, "backward", 3}, SlowRank{1, "node0", 1.5, "forward", 3}};
    log.on_step(r, 24);
  }
  const auto dir = tmp.path() / "slow";
  CHECK(read_bytes(dir / "Train_Samples_compute_ms.csv") == "step,compute_ms\r\n16,12.5\r\n24,12.5\r\n");
  CHECK(read_bytes(dir / "Train_Samples_slow_rank.csv") == "step,slow_rank\r\n16,-1\r\n24,1\r\n");
  CHECK(read_bytes(dir / "Train_Samples_slow_rank_factor.csv") == "step,slow_rank_factor\r\n16,1.0\r\n24,1.5\r\n");
  const std::string lines = out.str();
  CHECK(lines.find("step=2, skipped=0, lr=[0.5], grad_norm=0.0, samples/s=0.00\n") != std::string::npos);
  CHECK(lines.find(", slow_ranks=[3 (node1) 1.25x backward, 1 (node0) 1.50x forward]\n") != std::string::npos);
}

TEST_CASE("printed lines: progress every steps_per_print, micro and boundary timers like DeepSpeed") {
  ScratchDir tmp("short_run_log");
  ManualClock clock;
  RunState st;
  std::ostringstream out;
  TrainingLog log(run_options(tmp.path()), out, clock.fn());
  replay(log, clock, 1, 4, st);

  const std::string micro =
      "[Rank 0] time (ms) | fwd_microstep: 2.93 | bwd_microstep: 4.88 | bwd_inner_microstep: 3.91 | "
      "bwd_allreduce_microstep: 0.98 | step_microstep: 0.98\n";
  const std::string micro_boundary =
      "[Rank 0] time (ms) | fwd_microstep: 2.93 | bwd_microstep: 4.88 | bwd_inner_microstep: 3.91 | "
      "bwd_allreduce_microstep: 0.98 | step_microstep: 1.95\n";
  const std::string global =
      "[Rank 0] time (ms) | fwd: 5.86 | bwd: 9.77 | bwd_inner: 7.81 | bwd_allreduce: 1.95 | step: 2.93\n";
  // Two boundaries take 2 x 19 ticks; 8 samples in 38/1024 s = 215.58 samples/s.
  const std::string expected =
      micro + micro_boundary + global +
      micro + "[Rank 0] step=2, skipped=0, lr=[5e-05], loss_scale=65536, grad_norm=1.0, samples/s=215.58\n" +
      micro_boundary + global +
      micro + micro_boundary + global +
      micro + "[Rank 0] step=4, skipped=1, lr=[7.500000000000001e-05], loss_scale=32768.0, grad_norm=2.0, "
              "samples/s=215.58\n" +
      micro_boundary + global;
  CHECK(out.str() == expected);
}

TEST_CASE("without fp16 or wall_clock_breakdown: lr and loss only, no scale, no timer lines") {
  ScratchDir tmp("plain_run");
  ManualClock clock;
  TrainingLogOptions o;
  o.csv_monitor.enabled = true;
  o.csv_monitor.output_path = tmp.path().string();
  o.steps_per_print = 1;
  std::ostringstream out;
  TrainingLog log(o, out, clock.fn());
  log.on_boundary_loss(0.75, 0);
  clock.now += 0.5;
  StepReport r;
  r.boundary = true;
  r.global_steps = 1;
  r.lr = 0.001;
  r.group_lr = {0.001, 0.002};  // two parameter groups
  r.grad_norm = 0.125;
  log.on_step(r, 32);
  log.on_micro_step();  // no output without wall_clock_breakdown
  CHECK(out.str() == "[Rank 0] step=1, skipped=0, lr=[0.001, 0.002], grad_norm=0.125, samples/s=64.00\n");
  const auto dir = tmp.path() / "DeepSpeedJobName";
  CHECK(read_bytes(dir / "Train_Samples_lr.csv") == "step,lr\r\n32,0.001\r\n");
  CHECK(read_bytes(dir / "Train_Samples_train_loss.csv") == "step,train_loss\r\n0,0.75\r\n");
  CHECK_FALSE(std::filesystem::exists(dir / "Train_Samples_loss_scale.csv"));
  CHECK_FALSE(std::filesystem::exists(dir / "Train_Samples_elapsed_time_ms_forward.csv"));
}

TEST_CASE("a resumed run: samples/s counts only the samples after start_samples") {
  ManualClock clock;
  TrainingLogOptions o;
  o.steps_per_print = 2;
  o.start_samples = 150 * 32;  // loaded after step 150 of batch 32
  std::ostringstream out;
  TrainingLog log(o, out, clock.fn());
  StepReport r;
  r.boundary = true;
  r.lr = 0.001;
  r.grad_norm = 0.125;
  for (int step = 151; step <= 152; ++step) {
    clock.now += 0.5;
    r.global_steps = step;
    log.on_step(r, step * 32);
  }
  // 64 samples in 1 s; counting the loaded ones would give 4864.00.
  CHECK(out.str() == "[Rank 0] step=152, skipped=0, lr=[0.001], grad_norm=0.125, samples/s=64.00\n");
  o.start_samples = -1;
  CHECK_THROWS_AS(TrainingLog(o, out, clock.fn()), usage_error);
}

TEST_CASE("phase times measured by the engine replace the timers") {
  ScratchDir tmp("engine_times");
  ManualClock clock;
  TrainingLogOptions o;
  o.csv_monitor.enabled = true;
  o.csv_monitor.output_path = tmp.path().string();
  o.wall_clock_breakdown = true;
  std::ostringstream out;
  TrainingLog log(o, out, clock.fn());
  StepReport r;
  r.boundary = true;
  r.global_steps = 1;
  r.timings = StepTimings{12.5, 20.25, 18.0, 2.25, 3.0};
  r.timings_measured = true;
  log.on_micro_step();  // no timer was used: nothing to print
  log.on_step(r, 8);
  CHECK(out.str() == "[Rank 0] time (ms) | fwd: 12.50 | bwd: 20.25 | bwd_inner: 18.00 | bwd_allreduce: 2.25 | step: 3.00\n");
  const auto dir = tmp.path() / "DeepSpeedJobName";
  CHECK(read_bytes(dir / "Train_Samples_elapsed_time_ms_forward.csv") == "step,elapsed_time_ms_forward\r\n8,12.5\r\n");
  CHECK(read_bytes(dir / "Train_Samples_elapsed_time_ms_backward_allreduce.csv") ==
        "step,elapsed_time_ms_backward_allreduce\r\n8,2.25\r\n");
}

TEST_CASE("a static scale is a float from the start; other ranks print and write nothing") {
  ScratchDir tmp("static_run");
  config::Config c;
  c.fp16.enabled = true;
  c.fp16.static_scale = 128;  // JSON "loss_scale"
  c.csv_monitor.enabled = true;
  c.csv_monitor.output_path = tmp.path().string();
  c.csv_monitor.job_name = "s";
  ManualClock clock;
  std::ostringstream out;
  {
    TrainingLog log(TrainingLogOptions::from(c, 0), out, clock.fn());
    StepReport r;
    r.boundary = true;
    r.global_steps = 10;
    r.loss_scale = 128;
    r.grad_norm = -1;  // non-finite: DeepSpeed prints None
    log.on_step(r, 10);
  }
  CHECK(read_bytes(tmp.path() / "s" / "Train_Samples_loss_scale.csv") == "step,loss_scale\r\n10,128.0\r\n");
  CHECK(out.str().find("loss_scale=128.0, grad_norm=None") != std::string::npos);

  std::ostringstream quiet;
  ScratchDir other("static_run_rank1");
  c.csv_monitor.output_path = other.path().string();
  TrainingLog rank1(TrainingLogOptions::from(c, 1), quiet, clock.fn());
  StepReport r;
  r.boundary = true;
  r.global_steps = 10;
  rank1.on_step(r, 10);
  CHECK(quiet.str().empty());
  CHECK_FALSE(std::filesystem::exists(other.path()));
}

TEST_CASE("lr is written as DeepSpeed's Python float: 0.003, group 0 of group_lr, else lr") {
  ScratchDir tmp("lr_repr");
  ManualClock clock;
  TrainingLogOptions o;
  o.csv_monitor.enabled = true;
  o.csv_monitor.output_path = tmp.path().string();
  o.steps_per_print = 1;
  std::ostringstream out;
  TrainingLog log(o, out, clock.fn());
  StepReport r;
  r.boundary = true;
  r.global_steps = 1;
  r.lr = 0.003;  // group_lr empty: the report knows group 0 only
  r.grad_norm = 0.5;
  log.on_step(r, 8);
  r.global_steps = 2;
  r.lr = 0.0025;
  r.group_lr = {0.0025, 0.003};  // every group for the progress line; group 0 for the csv row
  log.on_step(r, 16);
  const auto lr_csv = tmp.path() / "DeepSpeedJobName" / "Train_Samples_lr.csv";
  CHECK(read_bytes(lr_csv) == "step,lr\r\n8,0.003\r\n16,0.0025\r\n");
  CHECK(out.str().find("step=1, skipped=0, lr=[0.003], grad_norm=0.5") != std::string::npos);
  CHECK(out.str().find("step=2, skipped=0, lr=[0.0025, 0.003], grad_norm=0.5") != std::string::npos);
  // What a float-rounded lr would write instead: why the engine must hand over the scheduler's double.
  CHECK(python_repr(static_cast<double>(0.003f)) == "0.003000000026077032");
}

TEST_CASE("group_lrs: the report's group_lr, or {lr} when it is empty") {
  StepReport r;
  r.lr = 0.1;
  REQUIRE(group_lrs(r).size() == 1);
  CHECK(group_lrs(r).front() == 0.1);
  CHECK(group_lrs(r).data() == &r.lr);
  r.lr = 0.2;
  r.group_lr = {0.2, 0.3, 0.4};
  REQUIRE(group_lrs(r).size() == 3);
  CHECK(group_lrs(r).data() == r.group_lr.data());
  CHECK(group_lrs(r)[0] == 0.2);
  CHECK(group_lrs(r)[2] == 0.4);
}

TEST_CASE("timings are read only when the report says it measured them") {
  ScratchDir tmp("unmeasured_times");
  ManualClock clock;
  TrainingLogOptions o;
  o.csv_monitor.enabled = true;
  o.csv_monitor.output_path = tmp.path().string();
  o.wall_clock_breakdown = true;
  std::ostringstream out;
  TrainingLog log(o, out, clock.fn());
  StepReport r;
  r.boundary = true;
  r.global_steps = 1;
  r.timings = StepTimings{12.5, 20.25, 18.0, 2.25, 3.0};  // timings_measured false: not read
  {
    auto t = log.timers().scope({timer_names::forward});
    clock.now += 0.25;
  }
  log.on_step(r, 8);
  CHECK(out.str().starts_with("[Rank 0] time (ms) | fwd: 250.00 | bwd: 0.00"));
  CHECK(out.str().find("12.50") == std::string::npos);
  const auto dir = tmp.path() / "DeepSpeedJobName";
  CHECK(read_bytes(dir / "Train_Samples_elapsed_time_ms_forward.csv") == "step,elapsed_time_ms_forward\r\n8,250.0\r\n");
  CHECK(read_bytes(dir / "Train_Samples_elapsed_time_ms_step.csv") == "step,elapsed_time_ms_step\r\n8,0\r\n");
}

TEST_CASE("on_step refuses a report that is not a boundary and writes nothing") {
  ScratchDir tmp("not_boundary");
  ManualClock clock;
  TrainingLogOptions o;
  o.csv_monitor.enabled = true;
  o.csv_monitor.output_path = tmp.path().string();
  o.steps_per_print = 1;
  std::ostringstream out;
  TrainingLog log(o, out, clock.fn());
  StepReport r;  // boundary false, as Engine::step() returns between boundaries
  r.micro_steps = 3;
  r.global_steps = 1;
  CHECK_THROWS_AS(log.on_step(r, 8), usage_error);
  CHECK(out.str().empty());
  CHECK_FALSE(std::filesystem::exists(tmp.path() / "DeepSpeedJobName" / "Train_Samples_lr.csv"));
}
