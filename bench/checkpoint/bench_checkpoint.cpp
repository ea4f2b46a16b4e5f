// Checkpoint save and load against bounds measured in the same run (bench/RESULTS.md, "Checkpoints").
//
//   Save/world:W        checkpoint::save of W ranks (threads communicator) against an O_DIRECT write
//                       of the same byte count by W writers (aligned 8 MiB writes, then fsync), run in
//                       the same iteration. vs_bound = save bytes/s / baseline bytes/s.
//   SaveAsync/world:W   save_async() -> (wait until this rank's file is written) -> commit(), each part
//                       timed: the stall (what training waits for) against a memcpy of the rank's
//                       master + m + v into a fresh allocation in the same iteration, and the commit
//                       (all-gather of the file records + rank 0's publish: client state, manifest,
//                       renames, latest, fsyncs) as a fraction of the whole save.
//   Load/cold:C         checkpoint::load into 1 rank of a checkpoint saved on 2 ranks (resharded) and of
//                       one saved on 1 rank (same layout), both in every iteration, alternating which
//                       goes first; cold:1 drops the page cache before each load (needs root).
//
// The model: kTensors fp32 parameters (default 48 Mi parameters, 576 MiB of master + m + v on one rank;
// ZEROTK_BENCH_CKPT_MPARAMS=<millions> changes it). A summary table with medians over repetitions and the
// best-of-all-repetitions O_DIRECT baseline is printed at the end.
//
//   build-b/bench/checkpoint/zerotk_bench_checkpoint --benchmark_repetitions=5 [--dir=/path/on/the/disk]
#include <benchmark/benchmark.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "zerotk/checkpoint.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/engine.hpp"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Comm = zerotk::comm::ThreadsCommunicator;
using E = zerotk::Engine<zerotk::Partitioner<zerotk::Stage<1>>, zerotk::Optimizer<zerotk::AdamW>,
                         zerotk::Precision<zerotk::fp32>>;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

fs::path g_dir = fs::path(ZEROTK_BENCH_BINARY_DIR) / "scratch";
bool g_drop_caches = true;

std::size_t total_params() {
  if (const char* s = std::getenv("ZEROTK_BENCH_CKPT_MPARAMS")) return static_cast<std::size_t>(std::atoll(s)) << 20;
  return std::size_t{48} << 20;
}
constexpr std::size_t kTensors = 4;

struct Model {
  std::vector<std::unique_ptr<zerotk::Param<float>>> params;
  Model() {
    for (std::size_t i = 0; i < kTensors; ++i) {
      params.push_back(std::make_unique<zerotk::Param<float>>("w" + std::to_string(i), std::initializer_list<std::size_t>{total_params() / kTensors}));
    }
  }
  template <class V>
  void parameters(V&& v) {
    for (auto& p : params) v(p->name(), *p);
  }
};

/// Drops the page cache (sync first); false when not allowed (then loads read from the cache).
bool drop_caches() {
  ::sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  if (!f) return false;
  f << "3\n";
  f.flush();
  return static_cast<bool>(f);
}

void remove_children(const fs::path& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) fs::remove_all(e.path(), ec);
}

std::uint64_t bytes_under(const fs::path& dir) {
  std::uint64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) n += e.file_size();
  }
  return n;
}

// ---------------------------------------------------------------------------------------------------
// The bound: W writers, each writes bytes/W to its own file with O_DIRECT (aligned buffer, 8 MiB writes),
// then fsync. Returns the seconds from the start until the last writer's fsync returned.

constexpr std::size_t kChunk = std::size_t{8} << 20;

double direct_write(const fs::path& dir, std::uint64_t bytes, int writers) {
  void* raw = nullptr;
  if (posix_memalign(&raw, 4096, kChunk) != 0) throw std::bad_alloc();
  std::unique_ptr<void, decltype(&std::free)> buf(raw, &std::free);
  for (std::size_t i = 0; i < kChunk; ++i) static_cast<unsigned char*>(raw)[i] = static_cast<unsigned char>(i * 131 + 7);
  const std::uint64_t per = ((bytes / writers) + 4095) / 4096 * 4096;
  std::vector<fs::path> paths;
  for (int w = 0; w < writers; ++w) paths.push_back(dir / ("direct" + std::to_string(w) + ".bin"));
  ::sync();
  std::atomic<bool> failed{false};
  const auto t0 = Clock::now();
  std::vector<std::thread> ts;
  for (int w = 0; w < writers; ++w) {
    ts.emplace_back([&, w] {
      const int fd = ::open(paths[w].c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
      if (fd < 0) {
        failed = true;
        return;
      }
      for (std::uint64_t done = 0; done < per;) {
        const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, per - done));
        const ::ssize_t r = ::write(fd, raw, n);
        if (r <= 0) {
          if (r < 0 && errno == EINTR) continue;
          failed = true;
          break;
        }
        done += static_cast<std::uint64_t>(r);
      }
      if (::fsync(fd) != 0) failed = true;
      ::close(fd);
    });
  }
  for (auto& t : ts) t.join();
  const double s = seconds_since(t0);
  for (const auto& p : paths) fs::remove(p);
  if (failed) throw std::runtime_error("O_DIRECT write failed under " + dir.string());
  return s;
}

// ---------------------------------------------------------------------------------------------------
// A world of W ranks (threads communicator) that stays up across benchmark iterations: each rank builds
// its engine once, fills master, m and v with data (every page touched, no zero pages), then runs the
// tasks given to run() until the world is destroyed.

struct RankCtx {
  Comm* comm = nullptr;
  E* engine = nullptr;
  std::vector<std::vector<float>> ref;  // this rank's master, m, v (the memcpy bound's source)
  std::uint64_t state_bytes = 0;        // master + m + v of this rank
};

class World {
 public:
  explicit World(int w) : world_(w), ranks_(static_cast<std::size_t>(w)) {
    runner_ = std::thread([this] {
      zerotk::comm::ThreadsOptions opts;
      opts.timeout_ms = 600'000;
      zerotk::comm::run_threads(
          world_, [this](Comm& c) { rank_main(c); }, opts);
    });
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return ready_ == world_; });
  }
  ~World() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
      ++generation_;
    }
    cv_.notify_all();
    runner_.join();
  }
  int size() const { return world_; }
  RankCtx& rank(int r) { return ranks_[static_cast<std::size_t>(r)]; }

  /// Runs fn on every rank; returns when all returned.
  void run(std::function<void(RankCtx&)> fn) {
    std::unique_lock lk(mu_);
    task_ = std::move(fn);
    done_ = 0;
    ++generation_;
    cv_.notify_all();
    cv_.wait(lk, [&] { return done_ == world_; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void rank_main(Comm& c) {
    Model model;
    E engine(c, model);
    engine.initialize_master();
    zerotk::EngineState s = engine.state();
    RankCtx& ctx = ranks_[static_cast<std::size_t>(c.rank())];
    for (auto& g : s.groups) {
      for (std::vector<float>* v : {&g.master, &g.optimizer.m, &g.optimizer.v}) {
        for (std::size_t i = 0; i < v->size(); ++i) (*v)[i] = static_cast<float>((i * 2654435761u + c.rank()) % 4093) * 1e-3f + 1e-4f;
        ctx.state_bytes += v->size() * sizeof(float);
        ctx.ref.push_back(*v);
      }
    }
    engine.load_state(s);
    s = {};
    ctx.comm = &c;
    ctx.engine = &engine;
    std::uint64_t seen = 0;
    {
      std::lock_guard lk(mu_);
      ++ready_;
      seen = generation_;
    }
    cv_.notify_all();
    for (;;) {
      std::function<void(RankCtx&)> task;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return generation_ != seen; });
        seen = generation_;
        if (stop_) break;
        task = task_;
      }
      try {
        task(ctx);
      } catch (...) {
        std::lock_guard lk(mu_);
        if (!error_) error_ = std::current_exception();
      }
      {
        std::lock_guard lk(mu_);
        ++done_;
      }
      cv_.notify_all();
    }
  }

  int world_;
  std::vector<RankCtx> ranks_;
  std::thread runner_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void(RankCtx&)> task_;
  std::uint64_t generation_ = 0;
  int ready_ = 0, done_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

World& world(int w) {
  static std::map<int, std::unique_ptr<World>> worlds;
  auto& p = worlds[w];
  if (!p) p = std::make_unique<World>(w);
  return *p;
}

std::vector<fs::path> g_created;  // removed at exit (only what this binary made under --dir)

fs::path fresh_dir(const std::string& name) {
  const fs::path d = g_dir / name;
  g_created.push_back(d);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Everything the summary needs, per benchmark and world, over repetitions.
struct Samples {
  std::vector<double> save_s, save_bytes, direct_s;
  std::vector<double> stall_s, memcpy_s, memcpy_warm_s, write_s, commit_s, total_s;
  std::vector<double> load_same_s, load_reshard_s, load_bytes;
};
std::map<std::string, Samples> g_samples;
std::map<std::string, std::vector<double>> g_parts;  // BM_Parts: step -> ms per repetition

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
double best(const std::vector<double>& v) { return v.empty() ? 0 : *std::min_element(v.begin(), v.end()); }

// ---------------------------------------------------------------------------------------------------

void BM_Save(benchmark::State& state) {
  const int w = static_cast<int>(state.range(0));
  World& wd = world(w);
  const fs::path dir = fresh_dir("save_w" + std::to_string(w));
  Samples& smp = g_samples["save_w" + std::to_string(w)];
  int it = 0;
  for (auto _ : state) {
    remove_children(dir);
    ::sync();
    double s = 0;
    const std::string tag = "s" + std::to_string(it++);
    wd.run([&](RankCtx& r) {
      r.comm->barrier().wait();
      const auto t0 = Clock::now();
      zerotk::checkpoint::save(*r.engine, *r.comm, dir, {.tag = tag});
      if (r.comm->rank() == 0) s = seconds_since(t0);
    });
    std::uint64_t bytes = 0;
    for (int k = 0; k < w; ++k) bytes += fs::file_size(dir / tag / zerotk::checkpoint::rank_file_name(k));
    remove_children(dir);
    const double d = direct_write(dir, bytes, w);
    state.SetIterationTime(s);
    smp.save_s.push_back(s);
    smp.save_bytes.push_back(static_cast<double>(bytes));
    smp.direct_s.push_back(d);
    state.counters["bytes_per_second"] = static_cast<double>(bytes) / s;
    state.counters["bound_bytes_per_second"] = static_cast<double>(bytes) / d;
    state.counters["vs_bound"] = d / s;  // same bytes: throughput ratio = time ratio
  }
  remove_children(dir);
}

void BM_SaveAsync(benchmark::State& state) {
  const int w = static_cast<int>(state.range(0));
  World& wd = world(w);
  const fs::path dir = fresh_dir("async_w" + std::to_string(w));
  Samples& smp = g_samples["async_w" + std::to_string(w)];
  int it = 0;
  for (auto _ : state) {
    remove_children(dir);
    ::sync();
    // The bound: every rank copies its master + m + v at once, into fresh allocations (as a snapshot
    // that hands out new buffers must) and, for reference, into buffers already touched.
    double mc = 0, mc_warm = 0;
    wd.run([&](RankCtx& r) {
      std::vector<std::unique_ptr<float[]>> dst;
      r.comm->barrier().wait();
      auto t0 = Clock::now();
      for (const auto& v : r.ref) {
        dst.emplace_back(new float[v.size()]);  // uninitialized: the copy pays the page faults
        std::memcpy(dst.back().get(), v.data(), v.size() * sizeof(float));
      }
      r.comm->barrier().wait();
      if (r.comm->rank() == 0) mc = seconds_since(t0);
      t0 = Clock::now();
      for (std::size_t i = 0; i < r.ref.size(); ++i) std::memcpy(dst[i].get(), r.ref[i].data(), r.ref[i].size() * sizeof(float));
      r.comm->barrier().wait();
      if (r.comm->rank() == 0) mc_warm = seconds_since(t0);
      benchmark::DoNotOptimize(dst.front().get());
    });
    double stall = 0, write = 0, commit = 0, total = 0;
    const std::string tag = "a" + std::to_string(it++);
    wd.run([&](RankCtx& r) {
      r.comm->barrier().wait();
      const auto t0 = Clock::now();
      auto pending = zerotk::checkpoint::save_async(*r.engine, *r.comm, dir, {.tag = tag});
      const double t_stall = seconds_since(t0);
      while (!pending->written()) std::this_thread::sleep_for(std::chrono::microseconds(200));
      r.comm->barrier().wait();  // every rank's file is written: commit() waits for nothing but itself
      const double t_written = seconds_since(t0);
      pending->commit();
      const double t_total = seconds_since(t0);
      if (r.comm->rank() == 0) {
        stall = t_stall;
        write = t_written - t_stall;
        commit = t_total - t_written;
        total = t_total;
      }
    });
    state.SetIterationTime(stall);
    smp.stall_s.push_back(stall);
    smp.memcpy_s.push_back(mc);
    smp.memcpy_warm_s.push_back(mc_warm);
    smp.write_s.push_back(write);
    smp.commit_s.push_back(commit);
    smp.total_s.push_back(total);
    const double bytes = static_cast<double>(wd.rank(0).state_bytes);
    state.counters["bytes_per_second"] = bytes / stall;  // rank 0's state snapshotted per second
    state.counters["bound_bytes_per_second"] = bytes / mc;
    state.counters["vs_bound"] = mc / stall;
    state.counters["stall_ms"] = stall * 1e3;
    state.counters["memcpy_ms"] = mc * 1e3;
    state.counters["memcpy_warm_ms"] = mc_warm * 1e3;
    state.counters["commit_ms"] = commit * 1e3;
    state.counters["commit_fraction"] = commit / total;
  }
  remove_children(dir);
}

/// Saved once: the same model saved on 1 rank and on 2 ranks.
struct LoadSetup {
  fs::path one, two;
  std::uint64_t bytes_one = 0, bytes_two = 0;
  LoadSetup() {
    one = fresh_dir("load_saved_w1");
    two = fresh_dir("load_saved_w2");
    world(1).run([&](RankCtx& r) { zerotk::checkpoint::save(*r.engine, *r.comm, one, {.tag = "saved"}); });
    world(2).run([&](RankCtx& r) { zerotk::checkpoint::save(*r.engine, *r.comm, two, {.tag = "saved"}); });
    bytes_one = bytes_under(one / "saved");
    bytes_two = bytes_under(two / "saved");
  }
};

LoadSetup& load_setup() {
  static LoadSetup setup;  // saved once, for BM_Load and BM_Export
  return setup;
}

void BM_Load(benchmark::State& state) {
  const bool cold = state.range(0) != 0;
  LoadSetup& setup = load_setup();
  World& w1 = world(1);
  Samples& smp = g_samples[cold ? "load_cold" : "load_warm"];
  int it = 0;
  bool dropped = true;
  for (auto _ : state) {
    double same = 0, reshard = 0;
    bool resharded = false, same_resharded = true;
    const auto load = [&](const fs::path& dir, double& out, bool& was_resharded) {
      if (cold) dropped = g_drop_caches && drop_caches() && dropped;
      w1.run([&](RankCtx& r) {
        const auto t0 = Clock::now();
        const auto res = zerotk::checkpoint::load(*r.engine, *r.comm, dir, {.tag = "saved"});
        out = seconds_since(t0);
        was_resharded = res.resharded;
      });
    };
    if (it++ % 2 == 0) {
      load(setup.one, same, same_resharded);
      load(setup.two, reshard, resharded);
    } else {
      load(setup.two, reshard, resharded);
      load(setup.one, same, same_resharded);
    }
    if (!resharded || same_resharded) state.SkipWithError("expected exactly the 2-rank checkpoint to be resharded");
    state.SetIterationTime(reshard);
    smp.load_same_s.push_back(same);
    smp.load_reshard_s.push_back(reshard);
    smp.load_bytes.push_back(static_cast<double>(setup.bytes_two));
    state.counters["bytes_per_second"] = static_cast<double>(setup.bytes_two) / reshard;
    state.counters["bound_bytes_per_second"] = static_cast<double>(setup.bytes_one) / same;
    state.counters["same_world_ms"] = same * 1e3;
    state.counters["reshard_vs_same"] = reshard / same;
    state.counters["vs_bound"] = same / reshard;
  }
  if (cold && !dropped) state.SetLabel("page cache NOT dropped (no permission): warm loads");
}


/// Where a save's and a load's time goes (world 1): the library's own steps, called one by one as
/// save()/load() call them, each timed. Diagnostic rows for bench/RESULTS.md; no bound of their own
/// beyond the memcpy/O_DIRECT rows above.
void BM_Parts(benchmark::State& state) {
  namespace ck = zerotk::checkpoint;
  World& wd = world(1);
  const fs::path dir = fresh_dir("parts");
  for (auto _ : state) {
    remove_children(dir);
    ::sync();
    std::map<std::string, double> ms;
    wd.run([&](RankCtx& r) {
      auto t0 = Clock::now();
      const auto lap = [&](const char* k) {
        ms[k] = seconds_since(t0) * 1e3;
        t0 = Clock::now();
      };
      {
        const std::vector<zerotk::EngineGroupView> views = r.engine->state_views();  // what save() writes from
        lap("save.1_views");
        const ck::FileRecord rec = ck::write_rank_file(dir, views, 0, 1);
        benchmark::DoNotOptimize(rec.checksum);
        lap("save.2_stream_write_fsync");
      }
      if (g_drop_caches) drop_caches();
      t0 = Clock::now();
      {
        ck::Manifest m;  // what check_rank_file needs: one group of this engine's size
        m.world_size = 1;
        const zerotk::EngineState cur = r.engine->state();
        m.shards.owned_numel = {{cur.groups[0].master.size()}};
        m.optimizer_steps = {cur.groups[0].optimizer.step};
        t0 = Clock::now();
        const ck::DataFileReader f(dir / "rank0.bin");
        lap("load.1_open_and_checksum_cold");
        std::vector<zerotk::EngineGroupState> groups = ck::read_rank_file(f, m, 0);
        lap("load.2_sections_into_state");
        zerotk::EngineState st = cur;
        st.groups = std::move(groups);
        t0 = Clock::now();
        r.engine->load_state(st);
        lap("load.3_engine_load_state");
      }
    });
    double total = 0;
    for (const auto& [k, v] : ms) {
      state.counters[k] = v;
      if (k.starts_with("save.")) total += v;
    }
    state.SetIterationTime(total / 1e3);
    for (const auto& [k, v] : ms) g_parts[k].push_back(v);
  }
  remove_children(dir);
}

struct ExportSample {
  double seconds = 0, peak_mib = 0, base_mib = 0, bound_mib = 0, bytes = 0;
};
std::vector<ExportSample> g_export;

/// Runs `args` as a child process with its standard output in `out`; false if it could not run or
/// failed. `seconds`: its wall time.
bool run_child(std::vector<std::string> args, const fs::path& out, double& seconds) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  ::posix_spawn_file_actions_init(&fa);
  ::posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const auto t0 = Clock::now();
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  ::posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return false;
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return false;
  seconds = seconds_since(t0);
  return true;
}

/// `zerotk-ckpt export` of the 2-rank checkpoint (fp32), in its own process so its peak resident
/// memory is its own (it prints its VmHWM): against the bound, one output tensor + 2x the
/// largest tensor + buffers (here 3 x largest + 8 MiB for the export chunk and staging), above the
/// tool's resident memory at start.
void BM_Export(benchmark::State& state) {
#ifndef ZEROTK_CKPT_TOOL
  state.SkipWithError("zerotk-ckpt was not built (ZEROTK_BUILD_TOOLS=OFF)");
  for (auto _ : state) {
  }
#else
  LoadSetup& setup = load_setup();  // the same checkpoints as BM_Load
  const fs::path out = fresh_dir("export") / "model.safetensors";
  const double largest_mib = static_cast<double>(total_params() / kTensors) * 4 / (1 << 20);
  for (auto _ : state) {
    fs::remove(out);
    double s = 0, peak = 0, base = 0;
    const fs::path log = out.parent_path() / "export.log";
    if (!run_child({ZEROTK_CKPT_TOOL, "export", setup.two.string(), "--tag", "saved", "--out", out.string()}, log, s)) {
      state.SkipWithError("zerotk-ckpt export failed");
      break;
    }
    // "...; peak resident memory P MiB (B at start)": the tool's own VmHWM (per process image).
    std::ifstream f(log);
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const std::size_t at = text.find("peak resident memory ");
    if (at == std::string::npos || std::sscanf(text.c_str() + at, "peak resident memory %lf MiB (%lf at start)", &peak, &base) != 2) {
      state.SkipWithError("zerotk-ckpt printed no peak memory");
      break;
    }
    const double bound = base + 3 * largest_mib + 8;
    state.SetIterationTime(s);
    g_export.push_back({s, peak, base, bound, static_cast<double>(fs::file_size(out))});
    state.counters["peak_mib"] = peak;
    state.counters["bound_mib"] = bound;
    state.counters["vs_bound"] = peak / bound;
    state.counters["bytes_per_second"] = static_cast<double>(fs::file_size(out)) / s;
  }
  fs::remove(out);
#endif
}

void print_summary() {
  std::printf("\n== Checkpoint summary (medians over repetitions; O_DIRECT bound: best of all repetitions) ==\n");
  for (int w : {1, 2}) {
    const auto it = g_samples.find("save_w" + std::to_string(w));
    if (it == g_samples.end() || it->second.save_s.empty()) continue;
    const Samples& s = it->second;
    const double bytes = median(s.save_bytes);
    const double save_bps = bytes / median(s.save_s), best_bps = bytes / best(s.direct_s), med_bps = bytes / median(s.direct_s);
    std::vector<double> paired;  // the same iteration's O_DIRECT time over the save's
    for (std::size_t i = 0; i < s.save_s.size() && i < s.direct_s.size(); ++i) paired.push_back(s.direct_s[i] / s.save_s[i]);
    std::printf("save  world %d: %7.1f MiB in %7.1f ms = %6.3f GB/s | O_DIRECT best %6.3f GB/s (median %6.3f) | "
                "vs best %.3f, vs median %.3f, median of paired ratios %.3f (target >= 0.9), n=%zu\n",
                w, bytes / (1 << 20), median(s.save_s) * 1e3, save_bps / 1e9, best_bps / 1e9, med_bps / 1e9,
                save_bps / best_bps, save_bps / med_bps, median(paired), s.save_s.size());
  }
  for (int w : {1, 2}) {
    const auto it = g_samples.find("async_w" + std::to_string(w));
    if (it == g_samples.end() || it->second.stall_s.empty()) continue;
    const Samples& s = it->second;
    std::vector<double> frac;
    for (std::size_t i = 0; i < s.commit_s.size(); ++i) frac.push_back(s.commit_s[i] / s.total_s[i]);
    std::printf("async world %d: stall %7.1f ms | memcpy fresh %7.1f ms, warm %7.1f ms | stall/memcpy %.2f (target <= 1.2), "
                "stall/warm %.2f | write %7.1f ms, commit %6.2f ms = %.2f%% of %7.1f ms (target <= 2%%), n=%zu\n",
                w, median(s.stall_s) * 1e3, median(s.memcpy_s) * 1e3, median(s.memcpy_warm_s) * 1e3,
                median(s.stall_s) / median(s.memcpy_s), median(s.stall_s) / median(s.memcpy_warm_s), median(s.write_s) * 1e3,
                median(s.commit_s) * 1e3, 100.0 * median(frac), median(s.total_s) * 1e3, s.stall_s.size());
  }
  if (!g_export.empty()) {
    std::vector<double> peak, secs, bytes;
    for (const auto& e : g_export) {
      peak.push_back(e.peak_mib);
      secs.push_back(e.seconds);
      bytes.push_back(e.bytes);
    }
    std::printf("export (zerotk-ckpt, 2-rank checkpoint -> fp32 safetensors): %7.1f MiB in %7.1f ms | peak RSS %6.1f MiB "
                "(the tool alone %4.1f) vs bound (tool + 1 output tensor + 2x largest + 8 MiB buffers) %6.1f MiB: %.3f "
                "(target <= 1), n=%zu\n",
                median(bytes) / (1 << 20), median(secs) * 1e3, median(peak), g_export.front().base_mib,
                g_export.front().bound_mib, median(peak) / g_export.front().bound_mib, g_export.size());
  }
  if (!g_parts.empty()) {
    std::printf("parts (world 1, ms, median):");
    for (const auto& [k, v] : g_parts) std::printf(" %s %.0f |", k.c_str(), median(v));
    std::printf("\n");
  }
  for (const char* k : {"load_cold", "load_warm"}) {
    const auto it = g_samples.find(k);
    if (it == g_samples.end() || it->second.load_same_s.empty()) continue;
    const Samples& s = it->second;
    std::vector<double> ratio;
    for (std::size_t i = 0; i < s.load_same_s.size(); ++i) ratio.push_back(s.load_reshard_s[i] / s.load_same_s[i]);
    std::printf("%s: saved on 2 -> 1 rank %7.1f ms (%6.3f GB/s) | saved on 1 -> 1 rank %7.1f ms | ratio of medians %.3f, "
                "median of paired ratios %.3f (target <= 1.25), n=%zu\n",
                k, median(s.load_reshard_s) * 1e3, median(s.load_bytes) / median(s.load_reshard_s) / 1e9,
                median(s.load_same_s) * 1e3, median(s.load_reshard_s) / median(s.load_same_s), median(ratio),
                s.load_same_s.size());
  }
}

}  // namespace

BENCHMARK(BM_Save)->ArgName("world")->Arg(1)->Arg(2)->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SaveAsync)->ArgName("world")->Arg(1)->Arg(2)->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Parts)->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Load)->ArgName("cold")->Arg(1)->Arg(0)->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Export)->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);

int main(int argc, char** argv) {
  // Own flags first: --dir=<scratch directory>, --no_drop_caches.
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.starts_with("--dir=")) {
      g_dir = a.substr(6);
    } else if (a == "--no_drop_caches") {
      g_drop_caches = false;
    } else {
      rest.push_back(argv[i]);
    }
  }
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  if (benchmark::ReportUnrecognizedArguments(n, rest.data())) return 1;
  fs::create_directories(g_dir);
  benchmark::AddCustomContext("scratch_dir", g_dir.string());
  benchmark::AddCustomContext("mparams", std::to_string(total_params() >> 20));
  benchmark::RunSpecifiedBenchmarks();
  print_summary();
  benchmark::Shutdown();
  std::error_code ec;
  for (const auto& d : g_created) fs::remove_all(d, ec);
  return 0;
}
