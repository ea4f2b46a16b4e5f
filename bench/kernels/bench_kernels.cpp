// Host kernel benchmarks (Google Benchmark). Every benchmark reports bytes/s and `vs_bound`: its speed
// divided by the speed of a bound measured inside the same benchmark, right before it, on the same
// buffers and threads (so machine noise hits both alike):
//   - optimizers: an in-place read-modify-write loop touching the same bytes with no math
//     (fp32 AdamW: read p g m v, write p m v = 28 B/param; mixed: 16-bit g in, 16-bit copy out;
//     Lion: read p g m, write p m = 20 B/param), built for every ISA the kernels run here, the
//     fastest taken (`bound_isa`);
//   - casts, flatten, unflatten: memcpy of the same bytes (the faster of one call and a 2-thread split);
//     casts also report `vs_shape_copy`: against a copy of their own shape (16-bit lanes zero-extended
//     to 32 or truncated to 16, non-temporal stores, no arithmetic), which tells a cast limited by
//     the machine's read/write asymmetry from one that is slow;
//   - sums of squares (the reproducible two-phase norm) and inf/NaN checks: a plain parallel read pass.
// Working sets are >= 1 GiB (BENCH.md). Bytes counted = bytes read + bytes written, once each.
//
//   OMP_NUM_THREADS=2 build/<dir>/bench/kernels/zerotk_bench_kernels --benchmark_repetitions=5 \
//       --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <type_traits>
#include <vector>

#include "zerotk/core/memory.hpp"
#include "zerotk/kernels/host.hpp"
#include "zerotk/kernels/host/elementwise_step.hpp"
#include "zerotk/optim/lion.hpp"

#if ZEROTK_HAS_OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__)
#include <immintrin.h>
#endif

using namespace zerotk;
namespace kh = zerotk::kernels::host;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::size_t kParams = std::size_t{64} << 20;  // 64 Mi params: p, g, m, v fp32 = 1 GiB
constexpr std::size_t kCastElems = std::size_t{256} << 20;  // 1 GiB of fp32

template <class T>
struct Buffer {  // 64-byte aligned, first touched by the threads that will use it
  explicit Buffer(std::size_t n) : n(n), p(static_cast<T*>(aligned_alloc_bytes(n * sizeof(T)))) {
#if ZEROTK_HAS_OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (std::size_t i = 0; i < n; ++i) {
      if constexpr (FloatingElement<T>) {
        p[i] = from_float<T>(0.001f * static_cast<float>(i % 1000) + 0.5f);
      } else {
        p[i] = static_cast<T>(i);
      }
    }
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { aligned_free_bytes(p); }
  std::size_t n;
  T* p;
};

double seconds(const std::function<void()>& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
double median_seconds(int reps, const std::function<void()>& f) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) t.push_back(seconds(f));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Runs `f` under manual timing and reports bytes/s, items/s and vs_bound = bound / time. Returns the
// mean seconds per iteration.
double run(benchmark::State& state, double bytes_per_iter, double items_per_iter, double bound_s,
           const std::function<void()>& f) {
  double total = 0;
  for (auto _ : state) {
    const double s = seconds(f);
    state.SetIterationTime(s);
    total += s;
  }
  const double per = total / static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes_per_iter * static_cast<double>(state.iterations())));
  state.counters["G_items_per_s"] = items_per_iter / per / 1e9;
  state.counters["GB_per_s"] = bytes_per_iter / per / 1e9;
  state.counters["bound_GB_per_s"] = bytes_per_iter / bound_s / 1e9;
  state.counters["vs_bound"] = bound_s / per;
  return per;
}

// ---- bounds --------------------------------------------------------------------------------------

// The optimizers' bounds are the same loop built for every ISA the kernels can run here (the same
// run-time dispatch, simd::dispatch, and the same split over threads, for_each_share), the fastest
// taken: a loop built for baseline x86-64 alone moves fewer bytes a second than the memory system
// can (issue 57 item 20: 0.82 of an AVX-512 loop read as 1.02 of a baseline one). Benchmarks report
// the ISA that gave the bound as `bound_isa` (0 scalar, 1 avx2, 2 avx512) beside the kernel's `isa`.

// Read p, g, m, v; write p, m, v: the bytes of fp32 Adam without the math.
struct RmwFp32 {
  template <class S>
  static ZEROTK_FORCEINLINE void run(float* p, const float* g, float* m, float* v, std::size_t n) {
    std::size_t i = 0;
    if constexpr (S::width > 1) {
      for (; i + S::width <= n; i += S::width) {
        const auto x = S::load(g + i);
        S::store(p + i, S::load(p + i) + x);
        S::store(m + i, S::load(m + i) + x);
        S::store(v + i, S::load(v + i) + x);
      }
    }
    for (; i < n; ++i) {
      const float x = g[i];
      p[i] += x;
      m[i] += x;
      v[i] += x;
    }
  }
};

// Mixed precision: read p, m, v, g16; write p, m, v, out16 (the 16-bit values converted as the
// kernels convert them).
struct RmwMixed {
  template <class S, class T16>
  static ZEROTK_FORCEINLINE void run(float* p, const T16* g, float* m, float* v, T16* out, std::size_t n) {
    std::size_t i = 0;
    if constexpr (S::width > 1) {
      for (; i + S::width <= n; i += S::width) {
        const auto x = S::load(g + i);
        S::store(p + i, S::load(p + i) + x);
        S::store(m + i, S::load(m + i) + x);
        S::store(v + i, S::load(v + i) + x);
        S::store(out + i, x);
      }
    }
    for (; i < n; ++i) {
      const float x = to_float(g[i]);
      p[i] += x;
      m[i] += x;
      v[i] += x;
      out[i] = g[i];
    }
  }
};

// Read p, g, m; write p, m: the bytes of Lion (one moment) without the math.
struct RmwPm {
  template <class S>
  static ZEROTK_FORCEINLINE void run(float* p, const float* g, float* m, std::size_t n) {
    std::size_t i = 0;
    if constexpr (S::width > 1) {
      for (; i + S::width <= n; i += S::width) {
        const auto x = S::load(g + i);
        S::store(p + i, S::load(p + i) + x);
        S::store(m + i, S::load(m + i) + x);
      }
    }
    for (; i < n; ++i) {
      p[i] += g[i];
      m[i] += g[i];
    }
  }
};

struct IsaBound {
  double seconds;
  kh::simd::Isa isa;
};

// The fastest over the ISAs up to the kernels' (simd::active_isa(), so ZEROTK_ISA caps both) of the
// median of 3 runs of `Kernel` split over the threads as the kernels split their work.
template <class Kernel, class... Ptrs>
IsaBound isa_bound(std::size_t n, Ptrs... ptrs) {
  IsaBound best{std::numeric_limits<double>::infinity(), kh::simd::Isa::scalar};
  const kh::simd::Isa top = kh::simd::active_isa();
  for (const kh::simd::Isa isa : {kh::simd::Isa::scalar, kh::simd::Isa::avx2, kh::simd::Isa::avx512}) {
    if (isa > top) break;
    const double s = median_seconds(3, [&] {
      kh::for_each_share(n, [&](std::size_t b, std::size_t e) { kh::simd::dispatch<Kernel>(isa, (ptrs + b)..., e - b); });
    });
    if (s < best.seconds) best = {s, isa};
  }
  return best;
}

IsaBound rmw_bound_fp32(float* p, const float* g, float* m, float* v, std::size_t n) {
  return isa_bound<RmwFp32>(n, p, g, m, v);
}

template <class T16>
IsaBound rmw_bound_mixed(float* p, const T16* g, float* m, float* v, T16* out, std::size_t n) {
  return isa_bound<RmwMixed>(n, p, g, m, v, out);
}

// memcpy split evenly over the OpenMP threads (64-byte aligned cuts).
void parallel_memcpy(void* dst, const void* src, std::size_t bytes) {
#if ZEROTK_HAS_OPENMP
#pragma omp parallel
  {
    const std::size_t t = static_cast<std::size_t>(omp_get_thread_num()), nt = static_cast<std::size_t>(omp_get_num_threads());
    const std::size_t b = bytes / nt * t / 64 * 64, e = t + 1 == nt ? bytes : bytes / nt * (t + 1) / 64 * 64;
    std::memcpy(static_cast<char*>(dst) + b, static_cast<const char*>(src) + b, e - b);
  }
#else
  std::memcpy(dst, src, bytes);
#endif
}

// The faster of one memcpy and an even split over threads.
double memcpy_bound_s(void* dst, const void* src, std::size_t bytes) {
  const double one = median_seconds(3, [&] { std::memcpy(dst, src, bytes); });
  const double split = median_seconds(3, [&] { parallel_memcpy(dst, src, bytes); });
  return std::min(one, split);
}

// A plain read pass (integer OR of all words).
double read_bound_s(const void* p, std::size_t bytes) {
  const auto* w = static_cast<const std::uint64_t*>(p);
  const std::size_t n = bytes / 8;
  std::uint64_t sink = 0;
  const double s = median_seconds(3, [&] {
    std::uint64_t acc = 0;
#if ZEROTK_HAS_OPENMP
#pragma omp parallel for simd reduction(| : acc) schedule(static)
#endif
    for (std::size_t i = 0; i < n; ++i) acc |= w[i];
    sink |= acc;
  });
  benchmark::DoNotOptimize(sink);
  return s;
}

// ---- optimizers ------------------------------------------------------------------------------------

kernels::AdamStepConsts adamw_consts() {
  kernels::AdamHyper h;
  h.lr = 1e-3f;
  h.weight_decay = 0.01f;
  return kernels::AdamStepConsts::make(h, 10);
}

// The kernel's ISA and the bound's, as counters.
void report_isas(benchmark::State& state, const IsaBound& bound) {
  state.counters["isa"] = static_cast<double>(kh::simd::active_isa());
  state.counters["bound_isa"] = static_cast<double>(bound.isa);
}

void BM_fused_adamw_fp32(benchmark::State& state) {
  Buffer<float> p(kParams), g(kParams), m(kParams), v(kParams);
  const auto k = adamw_consts();
  const IsaBound bound = rmw_bound_fp32(p.p, g.p, m.p, v.p, kParams);
  run(state, 28.0 * kParams, kParams, bound.seconds,
      [&] { kh::fused_adam(p.p, m.p, v.p, g.p, nullptr, kParams, k, 1.0f); });
  report_isas(state, bound);
}

// Lion (one moment, fp32 gradients, no working copy): read p g m, write p m = 20 B/param.
void BM_fused_lion_fp32(benchmark::State& state) {
  Buffer<float> p(kParams), g(kParams), m(kParams);
  OptimizerOptions o;
  o.lr = 1e-4;
  o.weight_decay = 0.01;
  const optim::LionStepConsts k = optim::LionStepConsts::make(o);
  const kernels::Segment all{0, kParams};
  const IsaBound bound = isa_bound<RmwPm>(kParams, p.p, g.p, m.p);
  run(state, 20.0 * kParams, kParams, bound.seconds, [&] {
    kh::elementwise_step<optim::LionRule, float, void>(std::span(&all, 1), std::span(&k, 1), p.p, m.p, nullptr, g.p,
                                                       nullptr, 1.0f);
  });
  report_isas(state, bound);
}

template <class T16>
void BM_fused_adamw_mixed(benchmark::State& state) {
  Buffer<float> p(kParams), m(kParams), v(kParams);
  Buffer<T16> g(kParams), out(kParams);
  const auto k = adamw_consts();
  const IsaBound bound = rmw_bound_mixed<T16>(p.p, g.p, m.p, v.p, out.p, kParams);
  run(state, 28.0 * kParams, kParams, bound.seconds, [&] { kh::fused_adam(p.p, m.p, v.p, g.p, out.p, kParams, k, 1.0f); });
  report_isas(state, bound);
}

// 1,000 tensors of mixed sizes (64 Mi params in all) in one multi-tensor call.
void BM_multi_tensor_adamw_1000(benchmark::State& state) {
  Buffer<float> p(kParams), g(kParams), m(kParams), v(kParams);
  std::vector<kh::AdamTensor<float, void>> list;
  std::size_t at = 0;
  for (std::size_t t = 0; t < 1000; ++t) {
    const std::size_t n = t + 1 < 1000 ? (kParams / 1000) * (1 + t % 3) / 2 : kParams - at;  // 0.5x .. 1.5x mean
    list.push_back({p.p + at, m.p + at, v.p + at, g.p + at, nullptr, n});
    at += n;
  }
  const auto k = adamw_consts();
  const IsaBound bound = rmw_bound_fp32(p.p, g.p, m.p, v.p, kParams);
  // The host-side overhead is measured by BM_multi_tensor_adamw_1000_overhead (here it is below noise).
  run(state, 28.0 * kParams, kParams, bound.seconds, [&] { kh::fused_adam<float, void>(list, k, 1.0f); });
  report_isas(state, bound);
}

// The host-side cost of a multi-tensor call: 1,000 tensors of 1,024 params (16 MiB in all, cache
// resident, so bandwidth noise does not hide microseconds) against the same params as one tensor,
// timed alternately (one call each per iteration) so both see the same machine; medians reported.
void BM_multi_tensor_adamw_1000_overhead(benchmark::State& state) {
  constexpr std::size_t kT = 1000, kN = 1024;
  Buffer<float> p(kT * kN), g(kT * kN), m(kT * kN), v(kT * kN);
  std::vector<kh::AdamTensor<float, void>> list;
  for (std::size_t t = 0; t < kT; ++t) list.push_back({p.p + kN * t, m.p + kN * t, v.p + kN * t, g.p + kN * t, nullptr, kN});
  const auto k = adamw_consts();
  std::vector<double> one, many;
  for (auto _ : state) {
    one.push_back(seconds([&] { kh::fused_adam(p.p, m.p, v.p, g.p, nullptr, kT * kN, k, 1.0f); }));
    const double s = seconds([&] { kh::fused_adam<float, void>(list, k, 1.0f); });
    many.push_back(s);
    state.SetIterationTime(s);
  }
  std::sort(one.begin(), one.end());
  std::sort(many.begin(), many.end());
  const double o = one[one.size() / 2], mt = many[many.size() / 2];
  state.SetBytesProcessed(static_cast<std::int64_t>(28.0 * kT * kN * static_cast<double>(state.iterations())));
  state.counters["one_tensor_us"] = o * 1e6;
  state.counters["call_us"] = mt * 1e6;
  state.counters["overhead_us"] = (mt - o) * 1e6;
  state.counters["vs_bound"] = o / mt;
}

void BM_fused_lamb_fp32(benchmark::State& state) {
  Buffer<float> p(kParams), g(kParams), m(kParams), v(kParams);
  kernels::LambHyper h;
  h.weight_decay = 0.01f;
  const auto k = kernels::LambStepConsts::make(h, 10);
  // Bound: phase 1 touches p g m v -> m v (24 B), phase 2 p m v -> p (16 B): two RMW passes.
  const IsaBound bound = rmw_bound_fp32(p.p, g.p, m.p, v.p, kParams);
  run(state, 40.0 * kParams, kParams, bound.seconds * 40.0 / 28.0,
      [&] { kh::fused_lamb(p.p, m.p, v.p, g.p, nullptr, kParams, k, 1.0f); });
  report_isas(state, bound);
}

// ---- casts -------------------------------------------------------------------------------------------

#if defined(__x86_64__)
// The cast's traffic without its arithmetic: n 16-bit values zero-extended to 32 bits (widen) or n
// 32-bit values truncated to 16 (narrow), written with non-temporal stores as the cast writes them.
__attribute__((target("avx2"))) void shape_copy_range(const std::uint16_t* in, std::uint32_t* out, std::size_t n) {
  std::size_t i = 0;
  for (; i < n && reinterpret_cast<std::uintptr_t>(out + i) % 32 != 0; ++i) out[i] = in[i];
  for (; i + 8 <= n; i += 8) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  }
  _mm_sfence();
  for (; i < n; ++i) out[i] = in[i];
}
__attribute__((target("avx2"))) void shape_copy_range(const std::uint32_t* in, std::uint16_t* out, std::size_t n) {
  std::size_t i = 0;
  for (; i < n && reinterpret_cast<std::uintptr_t>(out + i) % 16 != 0; ++i) out[i] = static_cast<std::uint16_t>(in[i]);
  const __m256i low = _mm256_set1_epi32(0xffff);
  for (; i + 8 <= n; i += 8) {
    const __m256i v = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i)), low);
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(v, v), 0x08)));
  }
  _mm_sfence();
  for (; i < n; ++i) out[i] = static_cast<std::uint16_t>(in[i]);
}
#endif

// Seconds of the cast-shaped copy of n elements over the threads, or 0 where it cannot run here.
template <class Src, class Dst>
double shape_copy_s(const void* in, void* out, std::size_t n) {
#if defined(__x86_64__)
  if (!__builtin_cpu_supports("avx2")) return 0;
  using I = std::conditional_t<sizeof(Src) == 2, std::uint16_t, std::uint32_t>;
  using O = std::conditional_t<sizeof(Dst) == 2, std::uint16_t, std::uint32_t>;
  const auto* i = static_cast<const I*>(in);
  auto* o = static_cast<O*>(out);
  return median_seconds(3, [&] {
#if ZEROTK_HAS_OPENMP
#pragma omp parallel
    {
      const std::size_t t = static_cast<std::size_t>(omp_get_thread_num()), nt = static_cast<std::size_t>(omp_get_num_threads());
      const std::size_t b = n * t / nt / 64 * 64, e = t + 1 == nt ? n : n * (t + 1) / nt / 64 * 64;
      shape_copy_range(i + b, o + b, e - b);
    }
#else
    shape_copy_range(i, o, n);
#endif
  });
#else
  (void)in, (void)out, (void)n;
  return 0;
#endif
}

template <class Src, class Dst>
void BM_cast(benchmark::State& state) {
  Buffer<Src> in(kCastElems);
  Buffer<Dst> out(kCastElems);
  const double bytes = static_cast<double>(kCastElems) * (sizeof(Src) + sizeof(Dst));
  // Bound: memcpy moving the same bytes (read + write = `bytes`) between two other buffers.
  const std::size_t copy_bytes = static_cast<std::size_t>(bytes / 2);
  Buffer<char> a(copy_bytes), b(copy_bytes);
  const double bound = memcpy_bound_s(b.p, a.p, copy_bytes);
  const double per = run(state, bytes, static_cast<double>(kCastElems), bound, [&] { kh::cast(in.p, out.p, kCastElems); });
  if constexpr (sizeof(Src) != sizeof(Dst)) {
    const double shape = shape_copy_s<Src, Dst>(in.p, out.p, kCastElems);
    if (shape > 0) state.counters["vs_shape_copy"] = shape / per;
  }
}

// ---- flatten -------------------------------------------------------------------------------------------

// 16 tensors of 64 MiB (1 GiB) into one flat buffer and back.
void BM_flatten_large(benchmark::State& state) {
  constexpr std::size_t kT = 16, kN = kCastElems / kT;
  Buffer<float> src(kCastElems), flat(kCastElems);
  std::vector<kernels::TensorRef<const float>> refs;
  std::vector<std::size_t> numels;
  for (std::size_t t = 0; t < kT; ++t) {
    refs.push_back({src.p + t * kN, kN});
    numels.push_back(kN);
  }
  const auto layout = kernels::flat_layout(numels, 16);
  const double bound = memcpy_bound_s(flat.p, src.p, kCastElems * 4);
  run(state, 8.0 * kCastElems, static_cast<double>(kCastElems), bound,
      [&] { kh::flatten<float, float>(refs, flat.p, layout); });
}

void BM_unflatten_large(benchmark::State& state) {
  constexpr std::size_t kT = 16, kN = kCastElems / kT;
  Buffer<float> dst(kCastElems), flat(kCastElems);
  std::vector<kernels::TensorRef<float>> refs;
  std::vector<std::size_t> numels;
  for (std::size_t t = 0; t < kT; ++t) {
    refs.push_back({dst.p + t * kN, kN});
    numels.push_back(kN);
  }
  const auto layout = kernels::flat_layout(numels, 16);
  const double bound = memcpy_bound_s(dst.p, flat.p, kCastElems * 4);
  run(state, 8.0 * kCastElems, static_cast<double>(kCastElems), bound,
      [&] { kh::unflatten<float, float>(flat.p, refs, layout); });
}

// 10,000 small tensors (64..1023 fp32 each, ~21 MiB): the per-tensor overhead beyond the time of one
// memcpy of the same bytes, the two timed alternately (medians).
void BM_flatten_small_10000(benchmark::State& state) {
  constexpr std::size_t kT = 10000;
  std::vector<std::size_t> numels;
  std::size_t total = 0;
  for (std::size_t t = 0; t < kT; ++t) {
    numels.push_back(64 + (t * 7919) % 960);
    total += numels.back();
  }
  Buffer<float> src(total), flat(total + 16 * kT), copy(total);
  std::vector<kernels::TensorRef<const float>> refs;
  std::size_t at = 0;
  for (std::size_t t = 0; t < kT; ++t) {
    refs.push_back({src.p + at, numels[t]});
    at += numels[t];
  }
  const auto layout = kernels::flat_layout(numels, 16);
  std::vector<double> mc, fl;
  for (auto _ : state) {
    mc.push_back(std::min(seconds([&] { std::memcpy(copy.p, src.p, total * 4); }),
                          seconds([&] { parallel_memcpy(copy.p, src.p, total * 4); })));
    const double s = seconds([&] { kh::flatten<float, float>(refs, flat.p, layout); });
    fl.push_back(s);
    state.SetIterationTime(s);
  }
  std::sort(mc.begin(), mc.end());
  std::sort(fl.begin(), fl.end());
  const double m = mc[mc.size() / 2], f = fl[fl.size() / 2];
  state.SetBytesProcessed(static_cast<std::int64_t>(8.0 * static_cast<double>(total) * static_cast<double>(state.iterations())));
  state.counters["GB_per_s"] = 8.0 * static_cast<double>(total) / f / 1e9;
  state.counters["bound_GB_per_s"] = 8.0 * static_cast<double>(total) / m / 1e9;
  state.counters["vs_bound"] = m / f;
  state.counters["overhead_us_per_tensor"] = (f - m) * 1e6 / kT;
}

// ---- norms -------------------------------------------------------------------------------------------

template <class T>
void BM_sum_squares(benchmark::State& state) {
  const std::size_t n = (std::size_t{1} << 30) / sizeof(T);
  Buffer<T> x(n);
  const double bound = read_bound_s(x.p, n * sizeof(T));
  double sink = 0;
  run(state, static_cast<double>(n * sizeof(T)), static_cast<double>(n), bound, [&] { sink += kh::sum_squares(x.p, n); });
  benchmark::DoNotOptimize(sink);
}

template <class T>
void BM_norm_and_check(benchmark::State& state) {
  const std::size_t n = (std::size_t{1} << 30) / sizeof(T);
  Buffer<T> x(n);
  const double bound = read_bound_s(x.p, n * sizeof(T));
  bool sink = false;
  run(state, static_cast<double>(n * sizeof(T)), static_cast<double>(n), bound,
      [&] { sink ^= kh::norm_and_check(x.p, n).nonfinite; });
  benchmark::DoNotOptimize(sink);
}

// A peer for the norm: one pass of plain fp64 sums of squares (OpenMP simd reduction, compiled for
// AVX2 where the CPU has it): fast, but its bits depend on the thread count and the split.
template <class T>
double plain_sum_squares_body(const T* x, std::size_t n) {
  double acc = 0;
#if ZEROTK_HAS_OPENMP
#pragma omp parallel for simd reduction(+ : acc) schedule(static)
#endif
  for (std::size_t i = 0; i < n; ++i) {
    const double d = to_float(x[i]);
    acc += d * d;
  }
  return acc;
}
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
template <class T>
__attribute__((target("avx2,fma,f16c"))) double plain_sum_squares_avx2(const T* x, std::size_t n) {
  return plain_sum_squares_body(x, n);
}
#endif
template <class T>
double plain_sum_squares(const T* x, std::size_t n) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (kh::simd::detect_isa() >= kh::simd::Isa::avx2) return plain_sum_squares_avx2(x, n);
#endif
  return plain_sum_squares_body(x, n);
}

// The reproducible two-phase norm (zero/norms.hpp) over one rank's 1 GiB: phase 1 (max square and
// inf/NaN flag), the grid, phase 2 (three exact folds per element), finish. It reads the data twice,
// so against one read pass (vs_bound) it can reach ~0.5; vs_two_reads compares it with two read
// passes, the bound of any scheme that needs the global max before summing; vs_plain_sum with the
// one-pass plain fp64 sum above (the price of reproducibility).
template <class T>
void BM_norm_two_phase(benchmark::State& state) {
  const std::size_t n = (std::size_t{1} << 30) / sizeof(T);
  Buffer<T> x(n);
  const double bound = read_bound_s(x.p, n * sizeof(T));
  double sink = 0;
  const double plain = median_seconds(3, [&] { sink += plain_sum_squares(x.p, n); });
  const double per = run(state, static_cast<double>(n * sizeof(T)), static_cast<double>(n), bound, [&] {
    const kernels::SquareBound b = kh::square_bound(x.p, n);
    kernels::FoldSums f;
    kh::add_squares(x.p, n, kernels::NormGrid::make(b.max_square, n), f);
    sink += kernels::fold_finish(f);
  });
  state.counters["vs_two_reads"] = 2.0 * bound / per;
  state.counters["vs_plain_sum"] = plain / per;
  benchmark::DoNotOptimize(sink);
}

// Phase 1 alone (an integer max over magnitude bits) against one read pass.
template <class T>
void BM_norm_phase1(benchmark::State& state) {
  const std::size_t n = (std::size_t{1} << 30) / sizeof(T);
  Buffer<T> x(n);
  const double bound = read_bound_s(x.p, n * sizeof(T));
  double sink = 0;
  run(state, static_cast<double>(n * sizeof(T)), static_cast<double>(n), bound,
      [&] { sink += kh::square_bound(x.p, n).max_square; });
  benchmark::DoNotOptimize(sink);
}

// Phase 2 alone (the fold sums on a ready grid) against one read pass.
template <class T>
void BM_norm_phase2(benchmark::State& state) {
  const std::size_t n = (std::size_t{1} << 30) / sizeof(T);
  Buffer<T> x(n);
  const double bound = read_bound_s(x.p, n * sizeof(T));
  const kernels::NormGrid grid = kernels::NormGrid::make(kh::square_bound(x.p, n).max_square, n);
  double sink = 0;
  run(state, static_cast<double>(n * sizeof(T)), static_cast<double>(n), bound, [&] {
    kernels::FoldSums f;
    kh::add_squares(x.p, n, grid, f);
    sink += f.fold[0];
  });
  benchmark::DoNotOptimize(sink);
}

template <class T>
void BM_has_nonfinite(benchmark::State& state) {
  const std::size_t n = (std::size_t{1} << 30) / sizeof(T);
  Buffer<T> x(n);
  const double bound = read_bound_s(x.p, n * sizeof(T));
  bool sink = false;
  run(state, static_cast<double>(n * sizeof(T)), static_cast<double>(n), bound,
      [&] { sink ^= kh::has_nonfinite(x.p, n); });
  benchmark::DoNotOptimize(sink);
}

}  // namespace

BENCHMARK(BM_fused_adamw_fp32)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK(BM_fused_lion_fp32)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK(BM_fused_adamw_mixed<half>)->Name("BM_fused_adamw_mixed_fp16")->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK(BM_fused_adamw_mixed<bfloat16>)->Name("BM_fused_adamw_mixed_bf16")->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK(BM_multi_tensor_adamw_1000)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK(BM_multi_tensor_adamw_1000_overhead)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(1000);
BENCHMARK(BM_fused_lamb_fp32)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK(BM_cast<float, half>)->Name("BM_cast_fp32_to_fp16")->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK(BM_cast<float, bfloat16>)->Name("BM_cast_fp32_to_bf16")->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK(BM_cast<half, float>)->Name("BM_cast_fp16_to_fp32")->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK(BM_flatten_large)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK(BM_unflatten_large)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK(BM_flatten_small_10000)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(200);
BENCHMARK(BM_sum_squares<float>)->Name("BM_sum_squares_fp32")->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK(BM_sum_squares<half>)->Name("BM_sum_squares_fp16")->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK(BM_norm_and_check<float>)->Name("BM_norm_and_check_fp32")->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK(BM_norm_two_phase<float>)->Name("BM_norm_two_phase_fp32")->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK(BM_norm_two_phase<half>)->Name("BM_norm_two_phase_fp16")->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK(BM_norm_two_phase<bfloat16>)->Name("BM_norm_two_phase_bf16")->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK(BM_norm_phase1<float>)->Name("BM_norm_phase1_fp32")->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK(BM_norm_phase2<float>)->Name("BM_norm_phase2_fp32")->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK(BM_has_nonfinite<half>)->Name("BM_has_nonfinite_fp16")->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);

BENCHMARK_MAIN();
