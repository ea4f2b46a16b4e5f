// Threads communicator: all_reduce, reduce_scatter and all_gather from 4 KiB to 256 MiB on 2 and 4
// ranks (threads of this process). Reports bytes/s (algorithm bandwidth), bus bandwidth (NCCL's
// convention) and vs_bound: the time the op's minimal memory traffic takes at the memcpy rate
// measured first in this run (all cores copying), divided by the op's time.
//
//   build/default/bench/comm/zerotk_bench_comm_threads --benchmark_repetitions=5 \
//       --benchmark_report_aggregates_only=true
//
// Sizes follow nccl-tests: all_reduce moves a buffer of `size` bytes per rank; reduce_scatter reads
// `size` bytes per rank and writes size/W; all_gather writes `size` bytes per rank from size/W.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "zerotk/comm/threads.hpp"

namespace {

using zerotk::DType;
using zerotk::comm::ReduceOp;
using zerotk::comm::ThreadsCommunicator;

enum class Op { all_reduce, reduce_scatter, all_gather };

double g_memcpy_bytes_per_s = 0;  // aggregate copy rate of all cores, from BM_memcpy_bound

std::size_t cores() { return std::max(1u, std::thread::hardware_concurrency()); }

/// The bound: every core copies its own 256 MiB buffer (bytes copied per second, all cores).
void BM_memcpy_bound(benchmark::State& state) {
  const std::size_t bytes = static_cast<std::size_t>(state.range(0));
  const std::size_t t = cores();
  std::vector<std::vector<char>> src(t, std::vector<char>(bytes, 1)), dst(t, std::vector<char>(bytes, 0));
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    std::vector<std::thread> ts;
    for (std::size_t i = 1; i < t; ++i) ts.emplace_back([&, i] { std::memcpy(dst[i].data(), src[i].data(), bytes); });
    std::memcpy(dst[0].data(), src[0].data(), bytes);
    for (auto& th : ts) th.join();
    benchmark::DoNotOptimize(dst[0].data());
  }
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  const double copied = static_cast<double>(bytes * t) * static_cast<double>(state.iterations());
  state.counters["bytes_per_second"] = benchmark::Counter(copied, benchmark::Counter::kIsRate);
  state.counters["vs_bound"] = 1.0;
  g_memcpy_bytes_per_s = std::max(g_memcpy_bytes_per_s, copied / elapsed.count());  // best repetition
}

/// One rank's buffers for `op` on a world of `w` with a size of `bytes`.
struct Buffers {
  std::vector<float> send, recv;
  Buffers(Op op, std::size_t bytes, int w) {
    const std::size_t n = bytes / sizeof(float), block = n / static_cast<std::size_t>(w);
    switch (op) {
      case Op::all_reduce: send.assign(n, 1.f), recv.assign(n, 0.f); break;
      case Op::reduce_scatter: send.assign(block * static_cast<std::size_t>(w), 1.f), recv.assign(block, 0.f); break;
      case Op::all_gather: send.assign(block, 1.f), recv.assign(block * static_cast<std::size_t>(w), 0.f); break;
    }
  }
};

zerotk::comm::Work issue(Op op, ThreadsCommunicator& c, Buffers& b) {
  switch (op) {
    case Op::all_reduce: return c.all_reduce(b.send.data(), b.recv.data(), b.send.size(), DType::fp32, ReduceOp::sum);
    case Op::reduce_scatter:
      return c.reduce_scatter(b.send.data(), b.recv.data(), b.recv.size(), DType::fp32, ReduceOp::sum);
    case Op::all_gather: return c.all_gather(b.send.data(), b.recv.data(), b.send.size(), DType::fp32);
  }
  return {};
}

/// Bus bandwidth factor and minimal memory traffic (in copy-equivalent bytes) of one op.
double bus_factor(Op op, int w) {
  return op == Op::all_reduce ? 2.0 * (w - 1) / w : static_cast<double>(w - 1) / w;
}
double bound_copy_bytes(Op op, double size, int w) {
  // all_reduce reads W inputs and writes W outputs of `size`; reduce_scatter reads W*size and
  // writes size; all_gather reads size and writes W*size. A copy of B bytes reads B and writes B.
  return op == Op::all_reduce ? w * size : (w + 1) * size / 2.0;
}

void BM_threads(benchmark::State& state, Op op, int w) {
  const std::size_t bytes = static_cast<std::size_t>(state.range(0));
  auto comms = zerotk::comm::make_threads_communicators(w);
  std::vector<Buffers> bufs;
  for (int r = 0; r < w; ++r) bufs.emplace_back(op, bytes, w);
  const auto iters = static_cast<std::size_t>(state.max_iterations);
  std::vector<std::thread> helpers;  // ranks 1..W-1 run the same sequence: one warm-up, then `iters`
  for (int r = 1; r < w; ++r) {
    helpers.emplace_back([&, r] {
      for (std::size_t i = 0; i <= iters; ++i) issue(op, comms[static_cast<std::size_t>(r)], bufs[static_cast<std::size_t>(r)]).wait();
    });
  }
  issue(op, comms[0], bufs[0]).wait();  // warm-up: first touch, thread start
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) issue(op, comms[0], bufs[0]).wait();
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  for (auto& t : helpers) t.join();

  const double size = static_cast<double>(bytes);
  const double per_op_s = elapsed.count() / static_cast<double>(state.iterations());
  state.counters["bytes_per_second"] = benchmark::Counter(size * static_cast<double>(state.iterations()),
                                                          benchmark::Counter::kIsRate);
  state.counters["bus_GBps"] = size * bus_factor(op, w) / per_op_s / 1e9;
  // bound time / op time, the bound being the op's minimal memory traffic at the memcpy rate
  state.counters["vs_bound"] =
      g_memcpy_bytes_per_s > 0 ? bound_copy_bytes(op, size, w) / g_memcpy_bytes_per_s / per_op_s : 0.0;
}

std::int64_t iterations_for(std::int64_t bytes) {
  return std::clamp<std::int64_t>((std::int64_t{1} << 30) / bytes, 3, 2000);
}

void register_all() {
  benchmark::RegisterBenchmark("memcpy_bound", BM_memcpy_bound)->Arg(256 << 20)->Iterations(4)->UseRealTime()->Unit(benchmark::kMillisecond);
  const std::pair<const char*, Op> ops[] = {
      {"all_reduce", Op::all_reduce}, {"reduce_scatter", Op::reduce_scatter}, {"all_gather", Op::all_gather}};
  for (int w : {2, 4}) {
    for (const auto& [name, op] : ops) {
      for (std::int64_t bytes : {std::int64_t{4} << 10, std::int64_t{64} << 10, std::int64_t{1} << 20, std::int64_t{16} << 20,
                                 std::int64_t{256} << 20}) {
        benchmark::RegisterBenchmark(("threads/" + std::string(name) + "/W" + std::to_string(w)).c_str(),
                                     [op = op, w](benchmark::State& s) { BM_threads(s, op, w); })
            ->Arg(bytes)
            ->Iterations(iterations_for(bytes))
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
