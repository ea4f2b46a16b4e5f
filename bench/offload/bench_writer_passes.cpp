// The price of a failure-atomic step through a writer (offload/writer_passes.hpp;
// bench/RESULTS.md "Two-pass step through a writer").
//
//   BM_WriterPasses/<Mi elements>: Offload<None>'s store (offload/resident.hpp) built for a writer,
//     one sub-group (DeepSpeed's default sub_group_size): pass 1 (the step's bf16 values computed
//     from master, m, v without changing them, staged and written through a writer into host
//     memory) and pass 2 (the state steps in place), against, in the same iteration, the same
//     store's fused one-pass step into memory, which is the bound: the step without the failure
//     atomicity. vs_fused = two-pass time / fused time. Kernel traffic per element: fused 14 B read
//     + 14 B written; the two passes 28 B read + 14 B written (about 1.5x where memory-bound, 2x
//     where compute-bound), and each pass also copies the gradients into the sub-group's staging,
//     and pass 1 its values out of it.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <vector>

#include "zerotk/core/dtype.hpp"
#include "zerotk/device/host_ops.hpp"
#include "zerotk/offload/resident.hpp"
#include "zerotk/optim/adam.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using namespace zerotk;
using HostOps = device::Ops<Host>;
using Store = offload::Resident<Optimizer<AdamW>, HostOps>;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// A parameter home in host memory written through the writer interface (what NvmeShard's writer
/// does before its file write: a copy into staging).
struct Sink {
  using value_type = bfloat16;
  bfloat16* out;
  void write(std::size_t at, const bfloat16* host, std::size_t n) { std::memcpy(out + at, host, n * sizeof(bfloat16)); }
  void end_sub_group() {}
};

void BM_WriterPasses(benchmark::State& state) {
  const std::size_t n = static_cast<std::size_t>(state.range(0)) << 20;
  std::vector<kernels::Segment> segments;
  for (std::size_t t = 0, at = 0; t < 8; ++t, at += n / 8) {
    segments.push_back(kernels::Segment{at, t + 1 < 8 ? n / 8 : n - at, 0, static_cast<std::uint32_t>(t)});
  }
  const std::vector<ParamGroup> groups{ParamGroup{}};
  HostOps ops;
  MemoryLedger ledger;
  offload::StoreOptions so;
  so.output_writer = true;
  Store two_pass(ops, &ledger, n, groups, segments.size(), so);
  Store fused(ops, &ledger, n, groups, segments.size());
  std::vector<float> init(n);
  for (std::size_t j = 0; j < n; ++j) init[j] = 0.001f * static_cast<float>(j % 1009);
  two_pass.master_from_host(init.data());
  fused.master_from_host(init.data());
  std::vector<bfloat16> grads(n), out(n), out2(n);
  for (std::size_t j = 0; j < n; ++j) grads[j] = bfloat16(0.01f * static_cast<float>(j % 211) - 1.0f);
  Sink sink{out2.data()};
  auto no_sums = [](double*, std::size_t) {};
  auto step_two = [&] {
    const auto t0 = Clock::now();
    two_pass.step(0, segments, grads.data(), &sink, 1.0f, no_sums);
    two_pass.commit_step(segments, grads.data(), &sink, 1.0f, no_sums);
    return seconds_since(t0);
  };
  auto step_fused = [&] {
    const auto t0 = Clock::now();
    fused.step(0, segments, grads.data(), out.data(), 1.0f, no_sums);
    return seconds_since(t0);
  };
  (void)step_two();  // first touch of the scratch and stagings
  (void)step_fused();
  double t_two = 0, t_fused = 0;
  for (auto _ : state) {
    const double f = step_fused();
    const double t = step_two();
    t_fused += f;
    t_two += t;
    state.SetIterationTime(t);
  }
  if (std::memcmp(out.data(), out2.data(), n * sizeof(bfloat16)) != 0) state.SkipWithError("the two steps differ");
  const double k = static_cast<double>(state.iterations());
  state.counters["two_pass_ms"] = t_two / k * 1e3;
  state.counters["fused_ms"] = t_fused / k * 1e3;
  state.counters["vs_fused"] = t_two / t_fused;
}

}  // namespace

BENCHMARK(BM_WriterPasses)->Arg(16)->Arg(64)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(10);
BENCHMARK_MAIN();
