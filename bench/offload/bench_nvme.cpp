// Offload<Nvme> benchmarks (bench/RESULTS.md "Offload<Nvme>").
//
//   BM_Swap/<write>/<block KiB>/<queue depth>/<io_uring>: the whole swap region (ZEROTK_SWAP_MIB,
//     default 256 MiB) read or written through io::SwapFile, and in the same iteration through a
//     plain loop of `queue depth` threads doing O_DIRECT pread/pwrite of the same block size on
//     their share of the blocks (what fio's psync engine with numjobs = queue depth does).
//     vs_bound = loop time / SwapFile time (>= 0.9 is the target).
//   BM_NvmeStep/<pipelined>/<io_uring>: one optimizer step of an Offload<Nvme> engine (stage 1, fp32, one rank),
//     and in the same iteration the bounds it is measured against: the same step with Offload<Cpu>
//     (the optimizer compute, the state already in memory) and the I/O alone (read, then write, the
//     state's 12 bytes per element through the same SwapFile settings). vs_bound =
//     step time / max(compute, I/O) (<= 1.15 is the target). pattern_ms: the store's own I/O
//     sequence (sub-group reads and writes to alternating slots, pipelined) without the compute;
//     vs_pattern = step time / max(compute, pattern).
//   BM_ParamReadAhead/<passes>: stage 3 with OffloadParams<Nvme> (fp32, one rank, 8 layers of one
//     4 MiB parameter each, no gather prefetch): the forward pass (each layer's scope, then `passes`
//     sweeps over its values standing in for its compute) with offload_param.buffer_count 5 and 1
//     (no read-ahead), interleaved in the same iteration, and the bounds measured there too: the
//     compute alone, and the 8 blocks read one by one through a SwapFile of the same settings.
//     vs_bound = forward(5) / max(compute, read); serial = forward(1) / (compute + read), which
//     read-ahead replaces; speedup = forward(1) / forward(5).
//
// ZEROTK_SWAP_DIR picks the directory (default: the build tree). Say which file system it is on.
#include <benchmark/benchmark.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "zerotk/comm/threads.hpp"
#include "zerotk/core/param.hpp"
#include "zerotk/engine.hpp"
#include "zerotk/io/swap_file.hpp"

namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

fs::path swap_dir() {
  if (const char* d = std::getenv("ZEROTK_SWAP_DIR")) return d;
  return fs::path(ZEROTK_BENCH_BINARY_DIR);
}
std::size_t swap_bytes() {
  const char* m = std::getenv("ZEROTK_SWAP_MIB");
  return (m ? std::strtoull(m, nullptr, 10) : 256) << 20;
}
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Aligned {
  std::byte* p;
  explicit Aligned(std::size_t n) : p(static_cast<std::byte*>(std::aligned_alloc(zerotk::io::kDirectAlign, n))) {
    std::memset(p, 1, n);
  }
  ~Aligned() { std::free(p); }
};

/// The baseline: `threads` threads, O_DIRECT pread/pwrite of `block` bytes, block k by thread k mod threads.
double plain_loop(int fd, bool write, std::byte* buf, std::size_t bytes, std::size_t block, int threads) {
  const auto t0 = Clock::now();
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([=] {
      for (std::size_t k = static_cast<std::size_t>(t); k * block < bytes; k += static_cast<std::size_t>(threads)) {
        const std::size_t at = k * block, n = std::min(block, bytes - at);
        const ssize_t r = write ? ::pwrite(fd, buf + at, n, static_cast<off_t>(at)) : ::pread(fd, buf + at, n, static_cast<off_t>(at));
        if (r != static_cast<ssize_t>(n)) std::abort();
      }
    });
  }
  for (auto& t : ts) t.join();
  return seconds_since(t0);
}

void BM_Swap(benchmark::State& state) {
  const bool write = state.range(0) != 0;
  const std::size_t block = static_cast<std::size_t>(state.range(1)) << 10;
  const int qd = static_cast<int>(state.range(2));
  const std::size_t bytes = swap_bytes();
  zerotk::io::AioOptions aio;
  aio.block_size = block;
  aio.queue_depth = qd;
  aio.use_uring = state.range(3) != 0;
  zerotk::io::SwapFile f(swap_dir(), "bench", bytes, aio);
  const fs::path base_path = swap_dir() / "bench.baseline.swap";
  const int fd = ::open(base_path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0600);
  if (fd < 0 || ::fallocate(fd, 0, 0, static_cast<off_t>(bytes)) != 0) {
    state.SkipWithError("cannot create the baseline file with O_DIRECT");
    return;
  }
  Aligned buf(bytes);
  // Written once first, so reads read data (not unwritten extents).
  f.wait(f.write(0, buf.p, bytes));
  plain_loop(fd, true, buf.p, bytes, block, qd);
  double zt = 0, base = 0;
  for (auto _ : state) {
    base += plain_loop(fd, write, buf.p, bytes, block, qd);
    const auto t0 = Clock::now();
    f.wait(write ? f.write(0, buf.p, bytes) : f.read(0, buf.p, bytes));
    const double s = seconds_since(t0);
    zt += s;
    state.SetIterationTime(s);
  }
  ::close(fd);
  fs::remove(base_path);
  const double n = static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes) * state.iterations());
  state.counters["zerotk_GBps"] = bytes * n / zt / 1e9;
  state.counters["loop_GBps"] = bytes * n / base / 1e9;
  state.counters["vs_bound"] = base / zt;
  state.SetLabel(f.backend());
}

struct Model {
  std::vector<zerotk::Param<float>> ps;
  template <class V>
  void parameters(V&& visit) {
    for (auto& p : ps) visit(p.name(), p);
  }
};
struct One {
  zerotk::Param<float>* p;
  template <class V>
  void parameters(V&& v) {
    v(p->name(), *p);
  }
};

template <class E>
double timed_step(E& engine, Model& model) {
  const auto t0 = Clock::now();
  for (auto it = model.ps.rbegin(); it != model.ps.rend(); ++it) {
    One one{&*it};
    auto s = engine.backward(one);
  }
  (void)engine.step(0.0);
  return seconds_since(t0);
}

void BM_NvmeStep(benchmark::State& state) {
  const bool pipelined = state.range(0) != 0;
  constexpr std::size_t kParams = 16u << 20, kSub = 2u << 20;  // 16 Mi fp32 elements, 8 sub-groups
  zerotk::comm::run_threads(1, [&](auto& comm) {
    using namespace zerotk;
    zerotk::EngineOptions o;
    o.sub_group_size = kSub;
    o.nvme.path = swap_dir();
    o.nvme.pipeline_read = o.nvme.pipeline_write = pipelined;
    o.nvme.buffer_count = 4;
    o.nvme.aio.queue_depth = static_cast<int>(state.range(2));
    o.nvme.aio.use_uring = state.range(1) != 0;
    Model m1, m2;
    for (int i = 0; i < 4; ++i) {
      m1.ps.emplace_back("p" + std::to_string(i), std::initializer_list<std::size_t>{kParams / 4});
      m2.ps.emplace_back("p" + std::to_string(i), std::initializer_list<std::size_t>{kParams / 4});
    }
    Engine<Partitioner<Stage<1>>, Optimizer<AdamW>, Precision<fp32>, Offload<Nvme>> nvme(comm, m1, o);
    Engine<Partitioner<Stage<1>>, Optimizer<AdamW>, Precision<fp32>, Offload<Cpu>> cpu(comm, m2, o);
    io::SwapFile io(swap_dir(), "bench.io", 2 * 12 * kParams, o.nvme.aio);
    Aligned buf(12 * kParams);
    // The store's access pattern without the compute: per sub-group, read i + 1 issued, read i
    // waited, write i to the other slot; all writes waited at the end (two slots, as the store).
    constexpr std::size_t kRegion = 12 * kSub, kGroups = kParams / kSub;
    int slot = 0;
    auto pattern = [&] {
      std::vector<io::SwapFile::Ticket> reads(kGroups), writes(kGroups);
      auto at = [&](int s, std::size_t i) { return (static_cast<std::uint64_t>(s) * kGroups + i) * kRegion; };
      auto buffer = [&](std::size_t i) { return buf.p + (i % 4) * kRegion; };
      reads[0] = io.read(at(slot, 0), buffer(0), kRegion);
      for (std::size_t i = 0; i < kGroups; ++i) {
        if (i + 1 < kGroups) {
          if (i + 1 >= 4) io.wait(writes[i + 1 - 4]);
          reads[i + 1] = io.read(at(slot, i + 1), buffer(i + 1), kRegion);
        }
        io.wait(reads[i]);
        writes[i] = io.write(at(1 - slot, i), buffer(i), kRegion);
      }
      for (std::size_t i = kGroups >= 4 ? kGroups - 4 : 0; i < kGroups; ++i) io.wait(writes[i]);
      slot = 1 - slot;
    };
    (void)timed_step(nvme, m1);  // warm: first-touch of the buffers
    (void)timed_step(cpu, m2);
    double t_nvme = 0, t_cpu = 0, t_io = 0, t_pattern = 0;
    for (auto _ : state) {
      const double c = timed_step(cpu, m2);
      const auto t0 = Clock::now();
      io.wait(io.read(0, buf.p, 12 * kParams));
      io.wait(io.write(0, buf.p, 12 * kParams));
      const double i = seconds_since(t0);
      const auto t1 = Clock::now();
      pattern();
      t_pattern += seconds_since(t1);
      const double s = timed_step(nvme, m1);
      t_cpu += c;
      t_io += i;
      t_nvme += s;
      state.SetIterationTime(s);
    }
    const double n = static_cast<double>(state.iterations());
    state.counters["step_ms"] = t_nvme / n * 1e3;
    state.counters["compute_ms"] = t_cpu / n * 1e3;
    state.counters["io_ms"] = t_io / n * 1e3;
    state.counters["pattern_ms"] = t_pattern / n * 1e3;
    state.counters["vs_bound"] = t_nvme / std::max(t_cpu, t_io);
    state.counters["vs_pattern"] = t_nvme / std::max(t_cpu, t_pattern);
    state.counters["params_per_s"] = benchmark::Counter(kParams * n / t_nvme);
  });
}

/// A layer's compute: `passes` sweeps over its values (a serial dependency, not vectorised away).
float burn(const float* x, std::size_t n, int passes) {
  float acc = 0.0f;
  for (int p = 0; p < passes; ++p) {
    for (std::size_t i = 0; i < n; ++i) acc = acc * 0.999f + x[i];
  }
  return acc;
}

constexpr std::size_t kLayers = 8, kNumel = 1u << 20;  // BM_ParamReadAhead: 4 MiB fp32 blocks

void BM_ParamReadAhead(benchmark::State& state) {
  const int passes = static_cast<int>(state.range(0));
  zerotk::comm::run_threads(1, [&](auto& comm) {
    using namespace zerotk;
    using Eng = Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, Precision<fp32>, Offload<Nvme>, OffloadParams<Nvme>>;
    EngineOptions o;
    o.nvme.path = o.param_nvme.path = swap_dir();
    o.param_nvme.max_in_cpu = 0;  // every block read from the file
    o.stage3.param_persistence_threshold = 0;
    o.stage3.prefetch_bucket_size = 0;
    o.stage3.max_reuse_distance = 0;
    auto make_model = [] {
      Model m;
      for (std::size_t i = 0; i < kLayers; ++i) m.ps.emplace_back("layer" + std::to_string(i), std::initializer_list<std::size_t>{kNumel});
      return m;
    };
    Model m5 = make_model(), m1 = make_model();
    o.param_nvme.buffer_count = 5;
    Eng ahead(comm, m5, o);
    o.param_nvme.buffer_count = 1;
    Eng serial(comm, m1, o);
    float sink = 0.0f;
    // One micro-step; returns the forward's seconds (the backward and the step are not timed).
    auto micro_step = [&](Eng& e, Model& m) {
      const auto t0 = Clock::now();
      for (auto& p : m.ps) {
        One one{&p};
        auto s = e.forward(one);
        sink += burn(p.data(), kNumel, passes);
      }
      const double t = seconds_since(t0);
      for (auto it = m.ps.rbegin(); it != m.ps.rend(); ++it) {
        One one{&*it};
        auto s = e.backward(one);
      }
      (void)e.step(0.0);
      return t;
    };
    for (int i = 0; i < 2; ++i) {  // records the order; first touch of every buffer
      (void)micro_step(ahead, m5);
      (void)micro_step(serial, m1);
    }
    io::SwapFile io(swap_dir(), "bench.read", kLayers * kNumel * 4, o.nvme.aio);
    Aligned buf(kNumel * 4);
    for (std::size_t l = 0; l < kLayers; ++l) io.wait(io.write(l * kNumel * 4, buf.p, kNumel * 4));  // not a hole
    std::vector<float> values(kNumel, 1.0f);
    double t5 = 0, t1 = 0, t_compute = 0, t_read = 0;
    bool ahead_first = true;  // alternates: each engine's forward follows the other's step as often
    for (auto _ : state) {
      double a, b;
      if (ahead_first) {
        a = micro_step(ahead, m5);
        b = micro_step(serial, m1);
      } else {
        b = micro_step(serial, m1);
        a = micro_step(ahead, m5);
      }
      ahead_first = !ahead_first;
      auto t0 = Clock::now();
      for (std::size_t l = 0; l < kLayers; ++l) sink += burn(values.data(), kNumel, passes);
      t_compute += seconds_since(t0);
      t0 = Clock::now();
      for (std::size_t l = 0; l < kLayers; ++l) io.wait(io.read(l * kNumel * 4, buf.p, kNumel * 4));
      t_read += seconds_since(t0);
      t5 += a;
      t1 += b;
      state.SetIterationTime(a);
    }
    benchmark::DoNotOptimize(sink);
    const double n = static_cast<double>(state.iterations());
    state.counters["fwd_ms"] = t5 / n * 1e3;
    state.counters["fwd_no_ahead_ms"] = t1 / n * 1e3;
    state.counters["compute_ms"] = t_compute / n * 1e3;
    state.counters["read_ms"] = t_read / n * 1e3;
    state.counters["vs_bound"] = t5 / std::max(t_compute, t_read);
    state.counters["serial"] = t1 / (t_compute + t_read);
    state.counters["speedup"] = t1 / t5;
    const auto st = ahead.param_read_stats();
    state.counters["read_ahead_share"] = static_cast<double>(st.staged) / static_cast<double>(st.staged + st.unstaged);
  });
}

}  // namespace

BENCHMARK(BM_Swap)
    ->ArgsProduct({{1, 0}, {256, 1024, 4096}, {4, 16}, {1}})
    ->Args({1, 1024, 8, 0})
    ->Args({0, 1024, 8, 0})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(2);
BENCHMARK(BM_NvmeStep)->Args({1, 1, 32})->Args({1, 1, 8})->Args({0, 1, 32})->Args({1, 0, 32})->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);

BENCHMARK(BM_ParamReadAhead)->Arg(1)->Arg(4)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(6);

BENCHMARK_MAIN();
