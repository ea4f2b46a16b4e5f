// Compression codecs (zerotk/compress), one thread, against peers timed in the same iteration on the
// same data (so load swings hit both alike):
//   - top-k selection (topk::select: ascending indices of the k largest |y|) against std::nth_element
//     partitioning a copy of the same values by |y| at k (the copy is restored outside the timing);
//     vs_nth_element = nth_element time / select time (issue 16's target: >= 1.0);
//   - sign and 2-bit packing (bits from fp32) and unpacking (fp32 from bits) against memcpy of the fp32
//     side's bytes (4 n bytes, one std::memcpy call); vs_memcpy = memcpy time / codec time (target:
//     >= 0.5);
//   - the full encodes with error feedback (y = x + err, scale, pack, err update) against the same
//     memcpy, for the record (they read x and err and write err: 3x memcpy's traffic and more).
// 256 Mi fp32 values = 1 GiB per buffer (BENCH.md: working sets >= 1 GiB). N(0, 1) values, seeded.
// The compress bench does not link OpenMP, so every contender runs on the calling thread.
// The same binary also runs bench_onebit_link.cpp: the 1-bit all-reduce against an fp32 all-reduce on
// a modelled link (filter OneBit).
//
//   build/default/bench/compress/zerotk_bench_compress --benchmark_repetitions=5 \
//       --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "zerotk/compress.hpp"
#include "zerotk/core/memory.hpp"

using namespace zerotk;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::size_t kN = std::size_t{256} << 20;

template <class T>
struct Buffer {  // 64-byte aligned, touched once
  explicit Buffer(std::size_t n) : n(n), p(static_cast<T*>(aligned_alloc_bytes(n * sizeof(T)))) {
    std::memset(static_cast<void*>(p), 0, n * sizeof(T));
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { aligned_free_bytes(p); }
  std::size_t n;
  T* p;
};

/// The shared data: N(0, 1) values (a cheap seeded generator: a Box-Muller pair per two values).
struct Data {
  Buffer<float> x{kN}, err{kN}, copy{kN};
  Buffer<std::uint8_t> payload{kN / 2};
  Buffer<std::uint32_t> idx{kN};
  Data() {
    std::mt19937_64 rng(42);
    const double two_pi = 6.283185307179586;
    for (std::size_t i = 0; i + 1 < kN; i += 2) {
      const double u1 = (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53, u2 = static_cast<double>(rng() >> 11) * 0x1.0p-53;
      const double r = std::sqrt(-2.0 * std::log(u1));
      x.p[i] = static_cast<float>(r * std::cos(two_pi * u2));
      x.p[i + 1] = static_cast<float>(r * std::sin(two_pi * u2));
    }
  }
};
Data& data() {
  static Data d;
  return d;
}

template <class F>
double seconds(F&& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// One memcpy of the fp32 side's bytes (x -> copy).
double memcpy_s(Data& d) { return seconds([&] { std::memcpy(d.copy.p, d.x.p, kN * sizeof(float)); }); }

void report(benchmark::State& state, double op_s, double peer_s, const char* ratio_name, double bytes) {
  state.counters["bytes_per_second"] = bytes * static_cast<double>(state.iterations()) / op_s;
  state.counters[ratio_name] = peer_s / op_s;
  state.counters["op_ms"] = 1e3 * op_s / static_cast<double>(state.iterations());
  state.counters["peer_ms"] = 1e3 * peer_s / static_cast<double>(state.iterations());
}

void BM_TopKSelect_vs_NthElement(benchmark::State& state) {
  Data& d = data();
  const double ratio = static_cast<double>(state.range(0)) / 1000.0;
  const std::size_t k = compress::topk_count(ratio, kN);
  double op = 0, peer = 0;
  for (auto _ : state) {
    std::memcpy(d.copy.p, d.x.p, kN * sizeof(float));  // untimed: nth_element reorders its input
    peer += seconds([&] {
      std::nth_element(d.copy.p, d.copy.p + (k - 1), d.copy.p + kN,
                       [](float a, float b) { return std::fabs(a) > std::fabs(b); });
    });
    benchmark::DoNotOptimize(d.copy.p[k - 1]);
    const double t = seconds([&] { compress::topk::select(d.x.p, kN, k, d.idx.p); });
    benchmark::DoNotOptimize(d.idx.p[k - 1]);
    state.SetIterationTime(t);  // the Time column: the select alone
    op += t;
  }
  report(state, op, peer, "vs_nth_element", static_cast<double>(kN * sizeof(float)));
  state.counters["k"] = static_cast<double>(k);
}

enum class Codec { sign, two_bit };
enum class Dir { pack, unpack };

template <Codec C, Dir D>
void BM_Pack_vs_Memcpy(benchmark::State& state) {
  Data& d = data();
  const float step = 3.0f;
  double op = 0, peer = 0;
  for (auto _ : state) {
    peer += memcpy_s(d);
    const double t = seconds([&] {
      if constexpr (C == Codec::sign && D == Dir::pack) compress::sign::pack(d.x.p, kN, d.payload.p);
      if constexpr (C == Codec::sign && D == Dir::unpack) compress::sign::unpack(d.payload.p, kN, 1.0f, d.copy.p);
      if constexpr (C == Codec::two_bit && D == Dir::pack) compress::two_bit::pack(d.x.p, kN, step, d.payload.p);
      if constexpr (C == Codec::two_bit && D == Dir::unpack) compress::two_bit::unpack(d.payload.p, kN, step, d.copy.p);
    });
    state.SetIterationTime(t);  // the Time column: the codec alone
    op += t;
    benchmark::DoNotOptimize(d.payload.p[0]);
    benchmark::DoNotOptimize(d.copy.p[0]);
  }
  report(state, op, peer, "vs_memcpy", static_cast<double>(kN * sizeof(float)));
}

template <class Codec>
void BM_Encode_vs_Memcpy(benchmark::State& state, Codec codec) {
  Data& d = data();
  std::memset(d.err.p, 0, kN * sizeof(float));
  double op = 0, peer = 0;
  for (auto _ : state) {
    peer += memcpy_s(d);
    const double t = seconds([&] {
      (void)codec.encode(std::span<const float>(d.x.p, kN), std::span<float>(d.err.p, kN),
                         std::span<std::uint8_t>(d.payload.p, codec.payload_bytes(kN)));
    });
    state.SetIterationTime(t);
    op += t;
    benchmark::DoNotOptimize(d.payload.p[0]);
  }
  report(state, op, peer, "vs_memcpy", static_cast<double>(kN * sizeof(float)));
}

}  // namespace

BENCHMARK(BM_TopKSelect_vs_NthElement)->Arg(1)->Arg(10)->Arg(100)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(2);
BENCHMARK(BM_Pack_vs_Memcpy<Codec::sign, Dir::pack>)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_Pack_vs_Memcpy<Codec::sign, Dir::unpack>)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_Pack_vs_Memcpy<Codec::two_bit, Dir::pack>)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_Pack_vs_Memcpy<Codec::two_bit, Dir::unpack>)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK_CAPTURE(BM_Encode_vs_Memcpy, sign, compress::SignCodec{})->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(2);
BENCHMARK_CAPTURE(BM_Encode_vs_Memcpy, two_bit, compress::TwoBitCodec{})->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(2);
BENCHMARK_CAPTURE(BM_Encode_vs_Memcpy, topk_1pct, compress::TopKCodec(compress::TopKOptions{0.01}))
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(2);

BENCHMARK_MAIN();
