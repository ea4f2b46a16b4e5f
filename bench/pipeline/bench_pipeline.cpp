// The pipeline executor's measured bubble against its schedule's, on the threads back end.
//
// Each compute action spins a calibrated number of loop iterations (not a sleep): a forward, an
// input gradient and a weight gradient one unit each, a full backward two; with v chunks per rank
// each chunk's actions cost 1/v of that, so every schedule does the same work (the unit is
// calibrated before each benchmark to 5 ms of CPU time of this machine's loop). The executor measures, per rank, the time
// its stage functions took and the step's span; measured bubble = idle / (p x span). The
// schedule's bubble comes from the simulator on the same unit costs (exact; the closed forms of
// SEMANTICS.md 14 for GPipe, 1F1B and interleaved 1F1B), and `vs_formula` = measured / predicted,
// in the same run; `span_vs_sim` = the measured step / the simulated makespan in calibrated
// milliseconds (a lower bound: preemption and transfers only add). p = 2 ranks on a 2-core machine: one core per rank; more ranks would share cores
// and measure the scheduler, not the pipeline.
//
//   build/default/bench/pipeline/zerotk_bench_pipeline --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/thread_cpu.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/pipeline.hpp"

namespace {

using namespace zerotk::pipeline;
using Clock = std::chrono::steady_clock;

std::uint64_t spin(std::uint64_t iterations) {
  volatile std::uint64_t acc = 0;
  for (std::uint64_t i = 0; i < iterations; ++i) acc = acc + i;
  return acc;
}

constexpr double kUnitMs = 5.0;

// Loop iterations per unit of compute (kUnitMs of this thread's CPU time, which preemption on a
// shared machine does not stretch): the best of 5 spins. Measured again by every benchmark.
std::uint64_t unit_iterations() {
  constexpr std::uint64_t probe = 20'000'000;
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    const double t0 = zerotk::bench::thread_cpu_ms();
    spin(probe);
    best = std::min(best, zerotk::bench::thread_cpu_ms() - t0);
  }
  return static_cast<std::uint64_t>(static_cast<double>(probe) / best * kUnitMs);
}

const char* kSpecs[] = {"gpipe", "1f1b", "interleaved:2", "zbh1"};

StageFunctions spinning_stage(std::uint64_t unit_loops, int chunks) {
  StageFunctions f;
  const std::uint64_t unit = unit_loops / static_cast<std::uint64_t>(chunks);
  const Shape shape{{256}, zerotk::DType::fp32};  // 1 KiB activations: transfers cost next to nothing
  f.forward = [=](const MicroBatch&, const Activation*, Activation& out) {
    spin(unit);
    out.reset(shape);
  };
  f.loss = [](const MicroBatch&, const Activation&, Activation&) { return 0.0; };
  f.backward = [=](const MicroBatch&, const Activation&, Activation*) { spin(2 * unit); };
  f.backward_input = [=](const MicroBatch&, const Activation&, Activation*) { spin(unit); };
  f.backward_weight = [=](const MicroBatch&) { spin(unit); };
  return f;
}

/// args: schedule (index into kSpecs), micro-batches m. p = 2.
void BM_PipelineBubble(benchmark::State& state) {
  constexpr int p = 2;
  const std::string spec = kSpecs[state.range(0)];
  const int m = static_cast<int>(state.range(1));
  const Schedule s = make_schedule(ScheduleSpec::parse(spec), p, m);
  // Unit costs per chunk scaled by v leave the bubble fraction unchanged: the simulator's is exact.
  const SimulationReport sim = simulate(s);
  const Fraction predicted = sim.bubble();
  const double predicted_ms = static_cast<double>(sim.makespan) * kUnitMs / s.chunks;  // unit costs, 1/v per chunk
  const std::uint64_t unit_loops = unit_iterations();
  double measured = 0, span_ms = 0;
  int steps = 0;
  for (auto _ : state) {
    std::vector<Figures> figs(p);
    zerotk::comm::run_threads(p, [&](zerotk::comm::ThreadsCommunicator& c) {
      Executor exec(c, s);
      StageFunctions f = spinning_stage(unit_loops, s.chunks);
      (void)exec.run(f);  // warm-up: shapes, buffers, threads
      figs[static_cast<std::size_t>(c.rank())] = exec.run(f).figures;
    });
    measured += figs[0].bubble().value();
    span_ms += static_cast<double>(figs[0].makespan) * 1e-6;
    ++steps;
  }
  state.SetLabel(spec + " p2 m" + std::to_string(m));
  state.counters["bubble"] = measured / steps;
  state.counters["formula"] = predicted.value();
  state.counters["vs_formula"] = measured / steps / predicted.value();
  state.counters["step_ms"] = span_ms / steps;
  state.counters["span_vs_sim"] = span_ms / steps / predicted_ms;  // >= 1: the simulated span is the bound
}

}  // namespace

BENCHMARK(BM_PipelineBubble)
    ->ArgsProduct({{0, 1, 2, 3}, {2, 4, 8}})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);
BENCHMARK_MAIN();
