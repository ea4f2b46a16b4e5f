// Stage 0's gradient reduction at an optimizer boundary: the compressed path
// (zero/grads/compressed_all_reduce.hpp: GradientCompression<TopK|TwoBit|Sign>, optional Huffman)
// against the dense path (zero/grads/flat_all_reduce.hpp: one all-reduce per bucket) on the same
// gradients, on the threads communicator slowed to a modelled link (bench/common/modelled_link.hpp:
// 20 us latency + wire bytes / bandwidth per operation, as in bench_onebit_link.cpp).
//
// Each iteration is one run_threads session of W ranks. Per rank: n N(0, 1) gradient values (seeded
// by rank) in buckets of 4 Mi elements; one untimed warm-up of each path on the inner communicator,
// then, timed back to back (gradients restored by an untimed copy, ranks lined up by an untimed
// barrier): dense = end_micro_step(boundary) of the dense path; compressed = the same call of the
// compressed path (its error buffers in steady use). Times are the slowest rank's; speedup = dense /
// compressed in the same iteration; compressed_cpu_ms = the largest CPU time of one rank's thread
// during the compressed call (bench/common/thread_cpu.hpp). Wire bytes per rank from the
// communicator's counters (checked equal on every rank without Huffman).
//
// The host has 2 cores and W = 4 rank threads share them, with the compressed path's encode and
// decode (single-threaded per rank) and the threads back end's copies and sums.
//
//   build/default/bench/compress/zerotk_bench_compress --benchmark_filter=Gradient \
//       --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/modelled_link.hpp"
#include "common/thread_cpu.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/device/host_ops.hpp"
#include "zerotk/device/ordered.hpp"
#include "zerotk/zero/grads/compressed_all_reduce.hpp"
#include "zerotk/zero/grads/flat_all_reduce.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using HostOps = zerotk::device::Ops<zerotk::Host>;
using Link = zerotk::bench::ModelledLink<zerotk::comm::ThreadsCommunicator>;

constexpr std::size_t kBucket = std::size_t{4} << 20;

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

std::vector<float> gradient(std::size_t n, int rank) {
  std::mt19937_64 rng(2000 + static_cast<std::uint64_t>(rank));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> g(n);
  for (float& v : g) v = nd(rng);
  return g;
}

/// Writes `src` into the path's buckets (the untimed part of a micro-step).
template <class Path>
void fill(Path& p, const zerotk::zero::BucketLayout& l, const std::vector<float>& src) {
  for (std::size_t k = 0; k < l.buckets().size(); ++k) {
    p.open(k, true);
    const zerotk::zero::Bucket& b = l.buckets()[k];
    std::memcpy(p.bucket_grads(k), src.data() + b.flat_offset, b.numel * sizeof(float));
  }
}

/// args: W, n in Mi fp32 values, link MB/s (0: no link model). Top-k keeps 1%.
template <class Tag>
void run(benchmark::State& state, bool huffman) {
  const int world = static_cast<int>(state.range(0));
  const std::size_t n = static_cast<std::size_t>(state.range(1)) << 20;
  const double gbps = static_cast<double>(state.range(2)) / 1000.0;
  std::vector<std::vector<float>> in;
  for (int r = 0; r < world; ++r) in.push_back(gradient(n, r));
  struct PerRank {
    double dense_ms = 0, comp_ms = 0, comp_cpu_ms = 0;
    std::uint64_t dense_wire = 0, comp_wire = 0;
  };
  std::vector<PerRank> per(static_cast<std::size_t>(world));
  for (auto _ : state) {
    zerotk::comm::run_threads(world, [&](zerotk::comm::ThreadsCommunicator& threads) {
      const auto r = static_cast<std::size_t>(threads.rank());
      Link link(threads, gbps > 0 ? gbps : 1e9, std::chrono::microseconds(gbps > 0 ? 20 : 0));
      HostOps ops;
      zerotk::MemoryLedger ledger;
      zerotk::device::OrderedCommunicator<HostOps> fast(threads, ops), slow(link, ops);
      const std::vector<std::size_t> numels{n};
      const std::vector<std::uint32_t> groups{0};
      const zerotk::zero::BucketLayout layout(numels, groups, world, kBucket);
      zerotk::compress::GradientCompressionOptions o{.topk_ratio = 0.01, .huffman_coding = huffman};
      auto context = [&](zerotk::device::OrderedCommunicator<HostOps>& c) {
        zerotk::zero::PathContext<HostOps> ctx;
        ctx.layout = &layout;
        ctx.ops = &ops;
        ctx.comm = &c;
        ctx.ledger = &ledger;
        ctx.compression = &o;
        return ctx;
      };
      auto line_up = [&] { threads.barrier().wait(); };
      PerRank& p = per[r];
      {  // dense
        zerotk::zero::FlatAllReduce<float, HostOps, zerotk::when::at_boundary> warm(context(fast)), path(context(slow));
        fill(warm, layout, in[r]);
        warm.end_micro_step(true);
        fill(path, layout, in[r]);
        line_up();
        const std::uint64_t w0 = threads.stats().total_wire_bytes();
        const auto t0 = Clock::now();
        path.end_micro_step(true);
        p.dense_ms = ms(Clock::now() - t0);
        p.dense_wire = threads.stats().total_wire_bytes() - w0;
      }
      {  // compressed: the timed call is the path's second (errors in use)
        zerotk::zero::CompressedAllReduce<float, HostOps, Tag> warm(context(fast)), path(context(slow));
        fill(warm, layout, in[r]);
        warm.end_micro_step(true);
        fill(path, layout, in[r]);
        path.end_micro_step(true);
        fill(path, layout, in[r]);
        line_up();
        const std::uint64_t w0 = threads.stats().total_wire_bytes();
        const double c0 = zerotk::bench::thread_cpu_ms();
        const auto t0 = Clock::now();
        path.end_micro_step(true);
        p.comp_ms = ms(Clock::now() - t0);
        p.comp_cpu_ms = zerotk::bench::thread_cpu_ms() - c0;
        p.comp_wire = threads.stats().total_wire_bytes() - w0;
        benchmark::DoNotOptimize(path.owned().working);
      }
      line_up();
    });
    PerRank slowest;
    for (const PerRank& p : per) {
      slowest.dense_ms = std::max(slowest.dense_ms, p.dense_ms);
      slowest.comp_ms = std::max(slowest.comp_ms, p.comp_ms);
      slowest.comp_cpu_ms = std::max(slowest.comp_cpu_ms, p.comp_cpu_ms);
    }
    state.SetIterationTime(slowest.comp_ms / 1e3);
    state.counters["dense_ms"] = slowest.dense_ms;
    state.counters["compressed_ms"] = slowest.comp_ms;
    state.counters["compressed_cpu_ms"] = slowest.comp_cpu_ms;
    state.counters["speedup"] = slowest.dense_ms / slowest.comp_ms;
  }
  for (const PerRank& p : per) {
    if (p.dense_wire != per[0].dense_wire || (!huffman && p.comp_wire != per[0].comp_wire)) {
      state.SkipWithError("wire bytes differ between ranks");
    }
  }
  state.counters["dense_wire_B"] = static_cast<double>(per[0].dense_wire);
  state.counters["compressed_wire_B"] = static_cast<double>(per[0].comp_wire);
  state.counters["wire_ratio"] = static_cast<double>(per[0].dense_wire) / static_cast<double>(per[0].comp_wire);
}

void BM_GradientTopK(benchmark::State& s) { run<zerotk::TopK>(s, false); }
void BM_GradientTopKHuffman(benchmark::State& s) { run<zerotk::TopK>(s, true); }
void BM_GradientTwoBit(benchmark::State& s) { run<zerotk::TwoBit>(s, false); }
void BM_GradientSign(benchmark::State& s) { run<zerotk::Sign>(s, false); }

}  // namespace

// W = 2 and 4, n = 16 Mi fp32 (64 MiB, 4 buckets), no link model / 1 GB/s / 100 MB/s.
#define ZT_GRADIENT_ARGS                        \
  ->ArgNames({"W", "n_Mi", "MBps"})             \
      ->ArgsProduct({{2, 4}, {16}, {0, 1000, 100}}) \
      ->UseManualTime()                         \
      ->Unit(benchmark::kMillisecond)           \
      ->Iterations(1)
BENCHMARK(BM_GradientTopK) ZT_GRADIENT_ARGS;
BENCHMARK(BM_GradientTopKHuffman) ZT_GRADIENT_ARGS;
BENCHMARK(BM_GradientTwoBit) ZT_GRADIENT_ARGS;
BENCHMARK(BM_GradientSign) ZT_GRADIENT_ARGS;
