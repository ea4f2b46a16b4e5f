// GPU kernel benchmarks: each kernel's bandwidth against the device's own copy bandwidth, measured in
// the same run on the same buffers' sizes (BENCH.md: a ratio against a bound, never an absolute).
//
//   zerotk_bench_kernels_cuda [--reps N] [--gib G]
//
// Bytes = bytes read + bytes written once each. Bound: cudaMemcpyAsync device-to-device of a buffer of
// the benchmark's working-set size (read + written). Each figure is the median of N timed launches
// (CUDA events around one launch, after 3 untimed warm-ups). Prints one table row per benchmark and
// exits non-zero only on a CUDA error: the targets are judged in bench/RESULTS.md, not here.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "zerotk/kernels/cuda.cuh"
#include "zerotk/optim/optimizer.hpp"

namespace kc = zerotk::kernels::cuda;
using zerotk::bfloat16;
using half16 = zerotk::half;  // not CUDA's ::half
using zerotk::kernels::AdamHyper;
using zerotk::kernels::AdamStepConsts;
using zerotk::kernels::Segment;
using zerotk::kernels::TensorRef;

namespace {

int g_reps = 20;

/// Median milliseconds of one call of fn, timed with events on the default stream.
double median_ms(const std::function<void()>& fn) {
  for (int i = 0; i < 3; ++i) fn();
  ZEROTK_CUDA_CHECK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  ZEROTK_CUDA_CHECK(cudaEventCreate(&a));
  ZEROTK_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> t;
  for (int i = 0; i < g_reps; ++i) {
    ZEROTK_CUDA_CHECK(cudaEventRecord(a));
    fn();
    ZEROTK_CUDA_CHECK(cudaEventRecord(b));
    ZEROTK_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    ZEROTK_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

/// Device bytes, filled with a small finite pattern so no kernel meets inf/NaN.
struct Buf {
  void* p = nullptr;
  explicit Buf(std::size_t bytes) {
    ZEROTK_CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 1));
    ZEROTK_CUDA_CHECK(cudaMemset(p, 0x11, bytes));  // 0x11111111 fp32 ~1.1e-28, 0x1111 fp16/bf16 finite
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  ~Buf() { cudaFree(p); }
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

/// GB/s of a device-to-device copy of `bytes` (counting read + written).
double copy_bound(std::size_t bytes) {
  Buf a(bytes), b(bytes);
  const double ms = median_ms([&] { ZEROTK_CUDA_CHECK(cudaMemcpyAsync(b.p, a.p, bytes, cudaMemcpyDeviceToDevice)); });
  return 2.0 * static_cast<double>(bytes) / (ms * 1e6);
}

void row(const char* name, double bytes, double ms, double bound_gbs, const char* extra = "") {
  const double gbs = bytes / (ms * 1e6);
  std::printf("| %-52s | %8.3f ms | %7.0f GB/s | %7.0f GB/s | %5.2f | %s\n", name, ms, gbs, bound_gbs, gbs / bound_gbs,
              extra);
}

template <class G, class P>
void bench_adam(const char* name, std::size_t n) {
  Buf p(n * 4), m(n * 4), v(n * 4), g(n * sizeof(G)), out(std::is_void_v<P> ? 0 : n * sizeof(std::conditional_t<std::is_void_v<P>, char, P>));
  AdamHyper h;
  h.lr = 1e-3f;
  h.weight_decay = 0.01f;
  const auto k = AdamStepConsts::make(h, 1);
  P* o = nullptr;
  if constexpr (!std::is_void_v<P>) o = out.as<P>();
  const std::size_t bytes = n * (24 + sizeof(G)) + (std::is_void_v<P> ? 0 : n * sizeof(std::conditional_t<std::is_void_v<P>, char, P>));
  const double bound = copy_bound(bytes / 2);
  const double ms = median_ms([&] { kc::fused_adam<G, P>(p.as<float>(), m.as<float>(), v.as<float>(), g.as<G>(), o, n, k, 1.0f); });
  char extra[64];
  std::snprintf(extra, sizeof extra, "%.2f G params/s", static_cast<double>(n) / (ms * 1e6));
  row(name, static_cast<double>(bytes), ms, bound, extra);
}

/// AdamW over `tensors` segments of one flat partition in one launch (the engine's form).
void bench_adam_segments(std::size_t tensors, std::size_t per) {
  const std::size_t n = tensors * per;
  Buf p(n * 4), m(n * 4), v(n * 4), g(n * 4);
  std::vector<Segment> segs;
  for (std::size_t t = 0; t < tensors; ++t) segs.push_back({t * per, per});
  AdamHyper h;
  const AdamStepConsts k[1] = {AdamStepConsts::make(h, 1)};
  kc::Workspace ws;
  const double bytes = 28.0 * static_cast<double>(n);
  const double bound = copy_bound(static_cast<std::size_t>(bytes / 2));
  const double ms = median_ms([&] {
    kc::fused_adam<float, void>(segs, k, p.as<float>(), m.as<float>(), v.as<float>(), g.as<float>(), nullptr, 1.0f, ws);
  });
  char name[80], extra[64];
  std::snprintf(name, sizeof name, "fused AdamW fp32, %zu segments x %zu, one launch", tensors, per);
  std::snprintf(extra, sizeof extra, "%.2f G params/s", static_cast<double>(n) / (ms * 1e6));
  row(name, bytes, ms, bound, extra);
}

template <class S, class D>
void bench_cast(const char* name, std::size_t n) {
  Buf a(n * sizeof(S)), b(n * sizeof(D));
  const double bytes = static_cast<double>(n) * (sizeof(S) + sizeof(D));
  const double bound = copy_bound(static_cast<std::size_t>(bytes / 2));
  row(name, bytes, median_ms([&] { kc::cast(a.as<S>(), b.as<D>(), n); }), bound);
}

void bench_flatten(const char* name, const std::vector<std::size_t>& numels) {
  std::size_t total = 0;
  for (auto n : numels) total += n;
  Buf pool(total * 4);
  std::vector<TensorRef<const float>> src;
  std::size_t at = 0;
  for (auto n : numels) {
    src.push_back({pool.as<float>() + at, n});
    at += n;
  }
  const auto layout = zerotk::kernels::flat_layout(numels, 1, 1);
  Buf flat(layout.numel * 4);
  kc::Workspace ws;
  const double bytes = 8.0 * static_cast<double>(total);
  const double bound = copy_bound(total * 4);
  row(name, bytes, median_ms([&] { kc::flatten<float, float>(src, flat.as<float>(), layout, ws); }), bound);
}

template <class T>
void bench_norm(const char* name, std::size_t n) {
  Buf x(n * sizeof(T));
  Buf out(sizeof(double));
  kc::Workspace ws;
  const double bytes = static_cast<double>(n * sizeof(T));
  const double bound = copy_bound(n * sizeof(T) / 2);  // one read pass of the same bytes
  row(name, bytes, median_ms([&] { kc::sum_squares(x.as<T>(), n, out.as<double>(), ws); }), bound,
      "bound: one read pass; the norm reads twice");
}

template <class T>
void bench_nonfinite(const char* name, std::size_t n) {
  Buf x(n * sizeof(T));
  Buf flag(sizeof(int));
  const double bytes = static_cast<double>(n * sizeof(T));
  const double bound = copy_bound(n * sizeof(T) / 2);
  row(name, bytes, median_ms([&] { kc::has_nonfinite(x.as<T>(), n, flag.as<int>()); }), bound);
}

}  // namespace

int main(int argc, char** argv) {
  double gib = 1.0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) g_reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--gib") && i + 1 < argc) gib = std::atof(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--reps N] [--gib G]   (got '%s')\n", argv[0], argv[i]);
      return 2;
    }
  }
  if (g_reps < 1 || gib <= 0) {
    std::fprintf(stderr, "--reps must be >= 1 and --gib > 0\n");
    return 2;
  }
  if (!zerotk::cuda::device_usable()) {
    std::fprintf(stderr, "zerotk_bench_kernels_cuda: no usable CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop{};
  ZEROTK_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs; working sets ~%.2f GiB; median of %d launches\n\n", prop.name,
              prop.multiProcessorCount, gib, g_reps);
  const std::size_t ws_bytes = static_cast<std::size_t>(gib * 1024 * 1024 * 1024);
  const std::size_t n_adam = ws_bytes / 28;  // fp32 AdamW touches 28 B / param
  std::printf("| %-52s | %11s | %12s | %12s | %5s |\n", "benchmark", "median", "achieved", "copy bound", "ratio");
  std::printf("|%s|%s|%s|%s|%s|\n", std::string(54, '-').c_str(), std::string(13, '-').c_str(),
              std::string(14, '-').c_str(), std::string(14, '-').c_str(), std::string(7, '-').c_str());
  bench_adam<float, void>("fused AdamW fp32", n_adam);
  bench_adam<half16, half16>("fused AdamW, fp16 grad in, fp16 copy out", n_adam);
  bench_adam<bfloat16, bfloat16>("fused AdamW, bf16 grad in, bf16 copy out", n_adam);
  bench_adam_segments(1000, n_adam / 1000);
  bench_adam_segments(100000, 1024);
  const std::size_t n_cast = ws_bytes / 6;
  bench_cast<float, half16>("cast fp32 -> fp16", n_cast);
  bench_cast<float, bfloat16>("cast fp32 -> bf16", n_cast);
  bench_cast<half16, float>("cast fp16 -> fp32", n_cast);
  bench_flatten("flatten 16 tensors (fp32)", std::vector<std::size_t>(16, ws_bytes / 8 / 16));
  std::vector<std::size_t> small;
  for (std::size_t t = 0; t < 10000; ++t) small.push_back(64 + (t * 37) % 960);
  bench_flatten("flatten 10,000 tensors of 64-1023 fp32", small);
  bench_norm<float>("sum of squares fp32 (two-phase norm)", ws_bytes / 4);
  bench_norm<bfloat16>("sum of squares bf16 (two-phase norm)", ws_bytes / 2);
  bench_nonfinite<half16>("has_nonfinite fp16", ws_bytes / 2);
  return 0;
}
