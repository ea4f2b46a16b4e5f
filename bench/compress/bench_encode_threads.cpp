// The sign, 2-bit and top-k 1% encodes, the sign decode and the 1-bit all-reduce's server step on all
// OpenMP threads against the same call on one thread, timed alternately in each iteration on the same
// buffers (so load swings hit both): speedup = one thread's time / all threads' time. The drivers
// split their element passes over kernels/host/parallel.hpp's threads; the sum of squares of the sign
// scale already did. A second binary because bench_compress links no OpenMP (its codec figures are
// single-threaded by design). 64 Mi fp32 values (256 MiB input, 256 MiB error buffer); the server step
// is rank 0's of a 4-rank all-reduce of 64 Mi values (a 16 Mi chunk, 4 ranks' signs summed).
//
//   OMP_NUM_THREADS=2 build/default/bench/compress/zerotk_bench_compress_threads \
//       --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "zerotk/compress/onebit_allreduce.hpp"
#include "zerotk/compress/sign.hpp"
#include "zerotk/compress/topk.hpp"
#include "zerotk/compress/two_bit.hpp"
#include "zerotk/kernels/host/parallel.hpp"

#if ZEROTK_HAS_OPENMP
#include <omp.h>
#endif

namespace {
using namespace zerotk;
using Clock = std::chrono::steady_clock;
constexpr std::size_t kN = std::size_t{64} << 20;

template <class F>
double seconds(F&& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Data {
  std::vector<float> x, err, out;
  std::vector<std::uint8_t> payload;
  Data()
      : x(kN), err(kN, 0.0f), out(kN),
        payload(std::max(compress::SignCodec::payload_bytes(kN) + compress::TwoBitCodec::payload_bytes(kN),
                         compress::TopKCodec{}.payload_bytes(kN))) {
    std::uint32_t s = 12345;
    for (float& v : x) {
      s = s * 1664525u + 1013904223u;
      v = static_cast<float>(static_cast<std::int32_t>(s)) * 0x1p-31f;
    }
  }
};
Data& data() {
  static Data d;
  return d;
}

/// Runs f on `threads` OpenMP threads (1 without OpenMP).
template <class F>
double on_threads(int threads, F&& f) {
#if ZEROTK_HAS_OPENMP
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  const double t = seconds(f);
  omp_set_num_threads(saved);
  return t;
#else
  (void)threads;
  return seconds(f);
#endif
}

enum class Op { sign_encode, two_bit_encode, topk_encode, sign_decode, onebit_serve };

/// Rank 0 of a 4-rank 1-bit all-reduce of kN values, its received signs and scales filled in.
compress::OneBitAllReduce& server() {
  static compress::OneBitAllReduce ar = [] {
    compress::OneBitAllReduce a(kN, 4);
    std::uint32_t s = 777;
    for (std::uint8_t& b : a.recv_bits()) {
      s = s * 1664525u + 1013904223u;
      b = static_cast<std::uint8_t>(s >> 24);
    }
    for (std::size_t k = 0; k < a.scales().size(); ++k) a.scales()[k] = 0.5f + 0.25f * static_cast<float>(k);
    return a;
  }();
  return ar;
}

template <Op O>
void BM_Threads(benchmark::State& state) {
  Data& d = data();
  const int all = kernels::host::max_threads();
  auto op = [&] {
    if constexpr (O == Op::sign_encode) {
      (void)compress::SignCodec{}.encode(d.x, d.err, std::span(d.payload.data(), compress::SignCodec::payload_bytes(kN)));
    } else if constexpr (O == Op::two_bit_encode) {
      (void)compress::TwoBitCodec{}.encode(d.x, d.err, std::span(d.payload.data(), compress::TwoBitCodec::payload_bytes(kN)));
    } else if constexpr (O == Op::topk_encode) {
      const compress::TopKCodec topk;
      (void)topk.encode(d.x, d.err, std::span(d.payload.data(), topk.payload_bytes(kN)));
    } else if constexpr (O == Op::onebit_serve) {
      benchmark::DoNotOptimize(server().serve());
    } else {
      compress::SignCodec{}.decode(std::span<const std::uint8_t>(d.payload.data(), compress::SignCodec::payload_bytes(kN)), d.out);
    }
  };
  if constexpr (O == Op::sign_decode) (void)compress::SignCodec{}.encode(d.x, d.err, std::span(d.payload.data(), compress::SignCodec::payload_bytes(kN)));
  double one = 0, many = 0;
  for (auto _ : state) {
    // The server step starts from zero server error each call: its cost depends on that state.
    if constexpr (O == Op::onebit_serve) server().reset();
    one += on_threads(1, op);
    if constexpr (O == Op::onebit_serve) server().reset();
    const double t = on_threads(all, op);
    state.SetIterationTime(t);
    many += t;
    benchmark::DoNotOptimize(d.payload.data());
    benchmark::DoNotOptimize(d.out.data());
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["threads"] = all;
  state.counters["one_thread_ms"] = 1e3 * one / iters;
  state.counters["all_threads_ms"] = 1e3 * many / iters;
  state.counters["ns_per_value"] = 1e9 * many / iters / static_cast<double>(kN);
  state.counters["speedup"] = one / many;
}

}  // namespace

BENCHMARK(BM_Threads<Op::sign_encode>)->Name("BM_Threads/sign_encode")->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_Threads<Op::two_bit_encode>)->Name("BM_Threads/two_bit_encode")->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_Threads<Op::topk_encode>)->Name("BM_Threads/topk_encode")->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_Threads<Op::onebit_serve>)->Name("BM_Threads/onebit_serve")->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_Threads<Op::sign_decode>)->Name("BM_Threads/sign_decode")->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK_MAIN();
