// 1-bit Adam's momentum exchange for a model of many tensors: one OneBitAllReduce::run per tensor
// (4 collectives each) against compress::OneBitBatch (the same reducers, 4 collectives in all), on
// the threads communicator slowed to the modelled link (bench/common/modelled_link.hpp: 20 us per
// operation + wire bytes / bandwidth). Both give bitwise the same results and send the same bytes
// (tests/compress/test_onebit_batch.cpp); the batch pays the per-operation latency 4 times instead
// of 4 T times.
//
// Each iteration is one run_threads session of W ranks; per rank T tensors of n N(0, 1) values
// (seeded per rank and tensor), an untimed warm-up of both forms on the inner communicator, then,
// timed back to back on the same inputs (restored by untimed copies, ranks lined up by an untimed
// barrier): per_tensor = T runs; batch = one OneBitBatch::run. Times are the slowest rank's;
// speedup = per_tensor / batch in the same iteration.
//
//   build/default/bench/compress/zerotk_bench_compress --benchmark_filter=OneBitBatch \
//       --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "common/modelled_link.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/compress/onebit_batch.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using zerotk::bench::ModelledLink;
using zerotk::comm::ThreadsCommunicator;

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

/// args: W ranks, T tensors, n values per tensor in Ki, link MB/s.
void BM_OneBitBatch_vs_PerTensor(benchmark::State& state) {
  const int world = static_cast<int>(state.range(0));
  const auto tensors = static_cast<std::size_t>(state.range(1));
  const std::size_t n = static_cast<std::size_t>(state.range(2)) << 10;
  const double gbps = static_cast<double>(state.range(3)) / 1000.0;
  std::vector<std::vector<std::vector<float>>> in(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    std::mt19937_64 rng(3000 + static_cast<std::uint64_t>(r));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (std::size_t i = 0; i < tensors; ++i) {
      std::vector<float> v(n);
      for (float& x : v) x = nd(rng);
      in[static_cast<std::size_t>(r)].push_back(std::move(v));
    }
  }
  std::vector<double> per_ms(static_cast<std::size_t>(world)), batch_ms(static_cast<std::size_t>(world));
  for (auto _ : state) {
    zerotk::comm::run_threads(world, [&](ThreadsCommunicator& threads) {
      const auto r = static_cast<std::size_t>(threads.rank());
      ModelledLink<ThreadsCommunicator> link(threads, gbps, std::chrono::microseconds(20));
      const std::vector<std::size_t> numels(tensors, n);
      std::vector<zerotk::compress::OneBitAllReduce> single;
      for (std::size_t i = 0; i < tensors; ++i) single.emplace_back(n, world);
      zerotk::compress::OneBitBatch batch(numels, world);
      std::vector<std::vector<float>> x = in[r];
      std::vector<std::span<float>> views;
      for (auto& v : x) views.emplace_back(v);
      auto restore = [&] {
        for (std::size_t i = 0; i < tensors; ++i) std::copy(in[r][i].begin(), in[r][i].end(), x[i].begin());
      };
      auto line_up = [&] { threads.barrier().wait(); };
      // Warm-up on the inner communicator.
      for (std::size_t i = 0; i < tensors; ++i) single[i].run(threads, views[i]);
      restore();
      batch.run(threads, std::span<const std::span<float>>(views));

      restore();
      line_up();
      auto t0 = Clock::now();
      for (std::size_t i = 0; i < tensors; ++i) single[i].run(link, views[i]);
      per_ms[r] = ms(Clock::now() - t0);
      benchmark::DoNotOptimize(x.data());
      restore();
      line_up();
      t0 = Clock::now();
      batch.run(link, std::span<const std::span<float>>(views));
      batch_ms[r] = ms(Clock::now() - t0);
      benchmark::DoNotOptimize(x.data());
      line_up();
    });
    const double per = *std::max_element(per_ms.begin(), per_ms.end());
    const double bat = *std::max_element(batch_ms.begin(), batch_ms.end());
    state.SetIterationTime(bat / 1e3);
    state.counters["per_tensor_ms"] = per;
    state.counters["batch_ms"] = bat;
    state.counters["speedup"] = per / bat;
  }
}

}  // namespace

// W = 2 and 4; 64 tensors of 16 Ki values (a small transformer's parameter count per tensor) and
// 8 tensors of 128 Ki (the same 1 Mi values); 10 GB/s and 1 GB/s.
BENCHMARK(BM_OneBitBatch_vs_PerTensor)
    ->ArgNames({"W", "T", "n_Ki", "MBps"})
    ->ArgsProduct({{2, 4}, {64}, {16}, {10000, 1000}})
    ->Args({2, 8, 128, 1000})
    ->Args({4, 8, 128, 1000})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);
