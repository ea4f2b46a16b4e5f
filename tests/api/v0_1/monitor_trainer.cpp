// A trainer's monitoring code as written against zerotk 0.1 (before StepStats and PhaseTimesMs gave
// way to zerotk::StepReport). Kept as it was: tests/api/CMakeLists.txt compiles it with deprecation
// warnings allowed and every other warning an error, runs it, and checks that the warnings name the
// replacements. Do not modernise this file; a new API version gets a folder of its own.
//
//   monitor_trainer <empty scratch dir>   -> exit 0, or the first mismatch on stderr and exit 1
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>

#include "zerotk/monitor.hpp"

namespace {

int failures = 0;

void expect_equal(const std::string& what, const std::string& got, const std::string& want) {
  if (got == want) return;
  ++failures;
  std::cerr << what << ":\n  got:  " << got << "\n  want: " << want << '\n';
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: monitor_trainer <scratch dir>\n";
    return 2;
  }
  const std::filesystem::path dir = argv[1];

  double now = 1000.0;  // seconds, advanced by hand so samples/s is exact
  zerotk::monitor::TrainingLogOptions o;
  o.csv_monitor.enabled = true;
  o.csv_monitor.output_path = dir.string();
  o.csv_monitor.job_name = "v0_1";
  o.steps_per_print = 1;
  o.wall_clock_breakdown = true;
  std::ostringstream out;
  zerotk::monitor::TrainingLog log(o, out, [&now] { return now; });

  // Step 1: two parameter groups, the trainer's own phase times.
  log.on_boundary_loss(0.75, 0);
  now += 0.5;
  const std::array<double, 2> lr{0.001, 0.002};
  zerotk::monitor::StepStats s;
  s.global_steps = 1;
  s.global_samples = 32;
  s.lr = lr;
  s.grad_norm = 0.125;
  zerotk::monitor::PhaseTimesMs times;  // (GCC 12 warns about the type here, not at PhaseTimesMs{...})
  times.forward = 12.5;
  times.backward = 20.25;
  times.backward_inner = 18.0;
  times.backward_allreduce = 2.25;
  times.step = 3.0;
  s.phase_times = times;
  log.on_step(s);

  // Step 2: an overflow (no norm), read back through progress_line as 0.1 allowed.
  zerotk::monitor::StepStats overflow;
  overflow.global_steps = 2;
  overflow.global_samples = 64;
  overflow.skipped_steps = 1;
  overflow.lr = lr;
  expect_equal("progress_line(StepStats)", log.progress_line(overflow, 1.5),
               "step=2, skipped=1, lr=[0.001, 0.002], grad_norm=None, samples/s=1.50");

  expect_equal("printed lines", out.str(),
               "[Rank 0] step=1, skipped=0, lr=[0.001, 0.002], grad_norm=0.125, samples/s=64.00\n"
               "[Rank 0] time (ms) | fwd: 12.50 | bwd: 20.25 | bwd_inner: 18.00 | bwd_allreduce: 2.25 | step: 3.00\n");
  const auto job = dir / "v0_1";
  expect_equal("Train_Samples_lr.csv", read_file(job / "Train_Samples_lr.csv"), "step,lr\r\n32,0.001\r\n");
  expect_equal("Train_Samples_train_loss.csv", read_file(job / "Train_Samples_train_loss.csv"),
               "step,train_loss\r\n0,0.75\r\n");
  expect_equal("Train_Samples_elapsed_time_ms_forward.csv",
               read_file(job / "Train_Samples_elapsed_time_ms_forward.csv"),
               "step,elapsed_time_ms_forward\r\n32,12.5\r\n");
  if (failures == 0) std::cout << "0.1 monitor API: compiled and wrote what 0.1 wrote\n";
  return failures == 0 ? 0 : 1;
}
