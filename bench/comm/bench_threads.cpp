// Threads communicator: all_reduce, reduce_scatter and all_gather from 4 KiB to 256 MiB on 2 and 4
// ranks (threads of this process). Reports bytes/s (algorithm bandwidth), bus bandwidth (NCCL's
// convention) and vs_bound: the time the op's minimal memory traffic takes at the memcpy rate
// (all cores copying 256 MiB each, measured in rounds between the op's iterations), divided by the
// op's time. glibc's memcpy streams copies above its non-temporal threshold (3/4 of the shared
// cache it detects: `ld.so --list-diagnostics`), so the bound is a streaming copy.
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

constexpr std::size_t kBoundBytes = std::size_t{256} << 20;  // per core: far past the last-level cache

std::size_t cores() { return std::max(1u, std::thread::hardware_concurrency()); }

/// The bound's buffers, allocated and touched once: every core copies its own 256 MiB.
struct CopyBuffers {
  std::vector<std::vector<char>> src, dst;
  CopyBuffers() : src(cores(), std::vector<char>(kBoundBytes, 1)), dst(cores(), std::vector<char>(kBoundBytes, 0)) {}
};
CopyBuffers& copy_buffers() {
  static CopyBuffers b;
  return b;
}

/// One round of the bound: every core memcpy's its own 256 MiB at once; returns the seconds taken.
double copy_round() {
  CopyBuffers& b = copy_buffers();
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> ts;
  for (std::size_t i = 1; i < b.src.size(); ++i) {
    ts.emplace_back([&, i] { std::memcpy(b.dst[i].data(), b.src[i].data(), kBoundBytes); });
  }
  std::memcpy(b.dst[0].data(), b.src[0].data(), kBoundBytes);
  for (auto& th : ts) th.join();
  benchmark::DoNotOptimize(b.dst[0].data());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
double copy_round_bytes() { return static_cast<double>(kBoundBytes * cores()); }

/// The bound alone: bytes copied per second by all cores.
void BM_memcpy_bound(benchmark::State& state) {
  double seconds = 0;
  for (auto _ : state) seconds += copy_round();
  const double copied = copy_round_bytes() * static_cast<double>(state.iterations());
  state.counters["bytes_per_second"] = copied / seconds;
  state.counters["vs_bound"] = 1.0;
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
  // The bound is measured in rounds between the op's iterations, so load swings of this shared
  // machine hit both alike: kRounds rounds, each one memcpy round then iterations/kRounds ops.
  constexpr std::size_t kRounds = 4;
  const std::size_t per_round = std::max<std::size_t>(1, iters / kRounds);
  double op_seconds = 0, copy_seconds = 0, copied = 0;
  std::size_t i = 0;
  for (auto _ : state) {
    if (i++ % per_round == 0) {
      state.PauseTiming();
      copy_seconds += copy_round();
      copied += copy_round_bytes();
      state.ResumeTiming();
    }
    const auto start = std::chrono::steady_clock::now();
    issue(op, comms[0], bufs[0]).wait();
    op_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  for (auto& t : helpers) t.join();

  const double size = static_cast<double>(bytes);
  const double per_op_s = op_seconds / static_cast<double>(state.iterations());
  state.counters["bytes_per_second"] = benchmark::Counter(size * static_cast<double>(state.iterations()),
                                                          benchmark::Counter::kIsRate);
  state.counters["bus_GBps"] = size * bus_factor(op, w) / per_op_s / 1e9;
  // bound time / op time, the bound being the op's minimal memory traffic at the memcpy rate
  state.counters["copy_GBps"] = copied / copy_seconds / 1e9;
  state.counters["vs_bound"] = bound_copy_bytes(op, size, w) / (copied / copy_seconds) / per_op_s;
}

std::int64_t iterations_for(std::int64_t bytes) {
  return std::clamp<std::int64_t>((std::int64_t{1} << 30) / bytes, 3, 2000);
}

void register_all() {
  benchmark::RegisterBenchmark("memcpy_bound", BM_memcpy_bound)->Iterations(4)->UseRealTime()->Unit(benchmark::kMillisecond);
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
