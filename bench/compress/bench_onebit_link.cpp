// The 1-bit compressed all-reduce (compress/onebit_allreduce.hpp: encode with worker error feedback,
// all_to_all of packed signs, server decode + re-encode, all_gather, decode) against an uncompressed
// fp32 all_reduce of the same tensor, on the threads communicator slowed to a modelled link
// (bench/common/modelled_link.hpp: each operation completes no sooner than latency + wire bytes /
// bandwidth after the rank's link is free; 20 us latency as in bench/engine).
//
// Each iteration is one run_threads session of W ranks. Per rank: N(0, 1) inputs (seeded by rank,
// generated once), one untimed warm-up of each operation on the inner communicator, then, timed back
// to back on the same input (restored by an untimed copy, ranks lined up by an untimed barrier of the
// inner communicator):
//   fp32    link.all_reduce(x, x, n, fp32, sum) and its wait;
//   onebit  OneBitAllReduce::run(link, x) (its second call: the error buffers are in steady use).
// Times are the slowest rank's. Counters: fp32_ms, onebit_ms, speedup = fp32 / onebit (paired in the
// same iteration, so load swings hit both); wire bytes per rank of each, from the communicator's byte
// counters (the ring convention; the link model charges exactly these), and fp32 / onebit;
// *_link_ms = what the model charged the rank's link (latency + bytes / bandwidth per operation,
// queueing aside): the time each would take on that link with free compute; *_cpu_ms = the largest
// CPU time of one rank's thread during the operation (CLOCK_THREAD_CPUTIME_ID: its encode, decode and
// its share of the threads back end's copies; time spent waiting asleep is not counted). MBps = 0: no
// link model (the threads back end at memory speed, i.e. the compute and copies alone).
//
// The host has 2 cores: W = 4 runs 4 rank threads on them, and the 1-bit path's encode and decode
// (single-threaded per rank; this bench links no OpenMP) compete for the same 2 cores, as do the
// threads back end's copies and sums. A real W-node job has each rank's compute to itself.
//
//   build/default/bench/compress/zerotk_bench_compress --benchmark_filter=OneBit \
//       --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "common/modelled_link.hpp"
#include "common/thread_cpu.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/compress.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using zerotk::bench::ModelledLink;
using zerotk::bench::thread_cpu_ms;
using zerotk::comm::ThreadsCommunicator;

constexpr int kMaxWorld = 4;
constexpr std::chrono::microseconds kLatency{20};

/// kMaxWorld inputs of n N(0, 1) values, rank r's seeded by r; made once per n.
const std::vector<std::vector<float>>& inputs(std::size_t n) {
  static std::map<std::size_t, std::vector<std::vector<float>>> cache;
  auto& v = cache[n];
  if (v.empty()) {
    v.resize(kMaxWorld);
    const double two_pi = 6.283185307179586;
    for (int r = 0; r < kMaxWorld; ++r) {
      std::mt19937_64 rng(1000 + static_cast<std::uint64_t>(r));
      auto& x = v[static_cast<std::size_t>(r)];
      x.resize(n);
      for (std::size_t i = 0; i + 1 < n; i += 2) {
        const double u1 = (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53, u2 = static_cast<double>(rng() >> 11) * 0x1.0p-53;
        const double rad = std::sqrt(-2.0 * std::log(u1));
        x[i] = static_cast<float>(rad * std::cos(two_pi * u2));
        x[i + 1] = static_cast<float>(rad * std::sin(two_pi * u2));
      }
    }
  }
  return v;
}

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

/// args: W ranks, n in Mi fp32 values, link MB/s (0: no link model).
void BM_OneBitAllReduce_vs_Fp32(benchmark::State& state) {
  const int world = static_cast<int>(state.range(0));
  const std::size_t n = static_cast<std::size_t>(state.range(1)) << 20;
  const double gbps = static_cast<double>(state.range(2)) / 1000.0;
  const auto& in = inputs(n);
  struct PerRank {
    double fp32_ms = 0, onebit_ms = 0, fp32_cpu_ms = 0, onebit_cpu_ms = 0, fp32_link_ms = 0, onebit_link_ms = 0;
    std::uint64_t fp32_wire = 0, onebit_wire = 0;
  };
  std::vector<PerRank> per(static_cast<std::size_t>(world));
  for (auto _ : state) {
    zerotk::comm::run_threads(world, [&](ThreadsCommunicator& threads) {
      const auto r = static_cast<std::size_t>(threads.rank());
      ModelledLink<ThreadsCommunicator> link(threads, gbps > 0 ? gbps : 1e9,
                                             gbps > 0 ? kLatency : std::chrono::microseconds(0));
      const std::vector<float>& src = in[r];
      std::vector<float> x(n);
      zerotk::compress::OneBitAllReduce onebit(n, world);
      auto restore = [&] { std::memcpy(x.data(), src.data(), n * sizeof(float)); };
      auto line_up = [&] { threads.barrier().wait(); };  // the inner communicator: no modelled latency
      auto fp32 = [&] { link.all_reduce(x.data(), x.data(), n, zerotk::DType::fp32, zerotk::comm::ReduceOp::sum).wait(); };
      // Warm-up, on the inner communicator (no link time): first touch of the threads back end's and
      // the all-reduce's buffers.
      restore();
      threads.all_reduce(x.data(), x.data(), n, zerotk::DType::fp32, zerotk::comm::ReduceOp::sum).wait();
      restore();
      onebit.run(threads, std::span<float>(x));

      PerRank& p = per[r];
      restore();
      line_up();
      std::uint64_t w0 = threads.stats().total_wire_bytes();
      auto b0 = link.busy();
      double c0 = thread_cpu_ms();
      auto t0 = Clock::now();
      fp32();
      p.fp32_ms = ms(Clock::now() - t0);
      p.fp32_cpu_ms = thread_cpu_ms() - c0;
      p.fp32_wire = threads.stats().total_wire_bytes() - w0;
      p.fp32_link_ms = std::chrono::duration<double, std::milli>(link.busy() - b0).count();
      benchmark::DoNotOptimize(x.data());

      restore();
      line_up();
      w0 = threads.stats().total_wire_bytes();
      b0 = link.busy();
      c0 = thread_cpu_ms();
      t0 = Clock::now();
      onebit.run(link, std::span<float>(x));
      p.onebit_ms = ms(Clock::now() - t0);
      p.onebit_cpu_ms = thread_cpu_ms() - c0;
      p.onebit_wire = threads.stats().total_wire_bytes() - w0;
      p.onebit_link_ms = std::chrono::duration<double, std::milli>(link.busy() - b0).count();
      benchmark::DoNotOptimize(x.data());
      line_up();
    });
    PerRank slowest;
    for (const PerRank& p : per) {
      slowest.fp32_ms = std::max(slowest.fp32_ms, p.fp32_ms);
      slowest.onebit_ms = std::max(slowest.onebit_ms, p.onebit_ms);
      slowest.fp32_cpu_ms = std::max(slowest.fp32_cpu_ms, p.fp32_cpu_ms);
      slowest.onebit_cpu_ms = std::max(slowest.onebit_cpu_ms, p.onebit_cpu_ms);
    }
    state.SetIterationTime(slowest.onebit_ms / 1e3);  // the Time column: the 1-bit all-reduce
    state.counters["fp32_ms"] = slowest.fp32_ms;
    state.counters["onebit_ms"] = slowest.onebit_ms;
    state.counters["speedup"] = slowest.fp32_ms / slowest.onebit_ms;
    state.counters["fp32_cpu_ms"] = slowest.fp32_cpu_ms;
    state.counters["onebit_cpu_ms"] = slowest.onebit_cpu_ms;
  }
  // Identical on every rank (checked on the last iteration; they depend on W and n only): rank 0's.
  for (const PerRank& p : per) {
    if (p.fp32_wire != per[0].fp32_wire || p.onebit_wire != per[0].onebit_wire) {
      state.SkipWithError("wire bytes differ between ranks");
    }
  }
  state.counters["fp32_wire_B"] = static_cast<double>(per[0].fp32_wire);
  state.counters["onebit_wire_B"] = static_cast<double>(per[0].onebit_wire);
  state.counters["wire_ratio"] = static_cast<double>(per[0].fp32_wire) / static_cast<double>(per[0].onebit_wire);
  state.counters["fp32_link_ms"] = gbps > 0 ? per[0].fp32_link_ms : 0.0;
  state.counters["onebit_link_ms"] = gbps > 0 ? per[0].onebit_link_ms : 0.0;
}

}  // namespace

// W = 2 and 4, n = 4 Mi and 32 Mi fp32 (16 and 128 MiB), no link model / 10 GB/s / 1 GB/s / 100 MB/s.
// fp32 wire bytes per rank: 2 (W-1)/W x 4n (16 MiB at W = 2, n = 4 Mi: 16.8 ms at 1 GB/s);
// 1-bit: (W-1)/W x (N/8 + N/8 + 8 W), about 32x less.
BENCHMARK(BM_OneBitAllReduce_vs_Fp32)
    ->ArgNames({"W", "n_Mi", "MBps"})
    ->ArgsProduct({{2, 4}, {4, 32}, {0, 10000, 1000, 100}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);
