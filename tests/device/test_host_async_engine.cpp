// Engine<..., Device<HostAsync>> (device/host_async_ops.hpp) over comm::StreamCommunicator against
// Engine<..., Device<Host>> over the threads communicator, on the MLP of tests/engine whose layers
// compute on the host from copies queued on the engine's compute stream (device_mlp.hpp), as the GPU
// tests do (tests/cuda/test_engine.cu). The reductions are the threads communicator's in both, so
// at the same world size the results are bitwise equal, whatever the draws of held and delayed
// operations: 20 seeds at stages 0-3, fp32 at gas 2; then 4 seeds of fp16 with overflow steps and
// clipping, bf16 with Lion, LAMB, Offload<Cpu> (immediate and delayed update; stage 3 with overflow
// steps), Offload<Nvme>, stage 3's parameter shard offloaded (OffloadParams<Cpu> with overflow steps,
// with the delayed update; OffloadParams<Nvme>), reduction every micro-step, stage 3 prefetching with
// persistent buckets, hpZ.
// Then the mutation test: with every operation held until waited for, removing any one kind of wait
// (host_async::Drop) makes at least one of these runs differ from the host's or fail, so the
// emulation catches a missing wait.
#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <mutex>
#include <string>
#include <vector>

#include "../engine/device_mlp.hpp"
#include "../engine/engine_fixture.hpp"
#include "zerotk/comm/stream_communicator.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/device/host_async_ops.hpp"
#include "zerotk/engine.hpp"

#include <unistd.h>

using namespace zerotk;
using namespace zt_test;

namespace {

/// The device of DeviceMlp: copies queued on the compute stream (a host_async::Stream*).
struct AsyncCopies {
  host_async::Stream* stream;
  explicit AsyncCopies(void* s) : stream(static_cast<host_async::Stream*>(s)) {}
  void to_host(void* dst, const void* src, std::size_t bytes) {
    stream->enqueue([=] { std::memcpy(dst, src, bytes); });
  }
  void to_device(void* dst, const void* src, std::size_t bytes) {
    stream->enqueue([=] { std::memcpy(dst, src, bytes); });
  }
  void sync() { stream->synchronize(); }
};
template <class T>
using AsyncMlp = DeviceMlp<T, AsyncCopies>;

// On a device the pinned shard is read and written by block (FetchOnDemand stages it through the
// device), its optimizer output a writer into memory; on the host it stays addressable.
using AsyncOps = device::Ops<HostAsync>;
static_assert(!zero::FetchOnDemand<float, AsyncOps, offload::PinnedShard<float, AsyncOps>>::kAddressable);
static_assert(zero::MemoryWriter<offload::PinnedShard<float, AsyncOps>::Writer>);
using HostOps = device::Ops<Host>;
static_assert(zero::FetchOnDemand<float, HostOps, offload::PinnedShard<float, HostOps>>::kAddressable);
static_assert(zero::FileWriter<offload::NvmeShard<float, AsyncOps>::Writer>);

using Threads = comm::ThreadsCommunicator;
using AsyncComm = comm::StreamCommunicator<Threads>;

struct AsyncRun {
  RunResult result;
  host_async::StreamStats stats;  // summed over ranks
  std::string failure;            // the first rank's exception, if any
};

/// Trains on `world` thread ranks, each with its own host_async device (seed drawn from `opts`'s
/// and the rank) and a StreamCommunicator over a split of the threads communicator.
template <int Stage, class Prec, class... Extra>
AsyncRun train_async(int world, RunConfig cfg, const host_async::Options& opts, MemoryLedger* ledger = nullptr) {
  using T = typename Prec::storage;
  cfg.world = world;
  AsyncRun run;
  std::vector<std::vector<float>> finals(static_cast<std::size_t>(world));
  std::mutex mu;
  try {
    comm::run_threads(world, [&](Threads& c) {
      host_async::Options o = opts;
      o.seed = opts.seed * 1000 + static_cast<std::uint64_t>(c.rank());
      host_async::Device dev(o);
      host_async::CurrentDevice current(dev);
      host_async::Stream compute = dev.make_stream();
      RunResult mine;
      {
        AsyncComm sc(c.split(0, c.rank()), dev);
        RunConfig rc = cfg;
        rc.stream = &compute;
        mine = train_rank<Stage, Prec, AsyncComm, AsyncMlp<T>, Device<HostAsync>, Extra...>(
            sc, rc, c.rank() == 0 ? ledger : nullptr);
      }
      dev.synchronize();
      const host_async::StreamStats st = dev.stats();
      std::lock_guard lock(mu);
      finals[static_cast<std::size_t>(c.rank())] = mine.params;
      run.stats.operations += st.operations;
      run.stats.held += st.held;
      run.stats.released_unwaited += st.released_unwaited;
      if (c.rank() == 0) run.result = std::move(mine);
    });
  } catch (const std::exception& e) {
    run.failure = e.what();
    return run;
  }
  for (const auto& f : finals) run.result.ranks_agree = run.result.ranks_agree && f == finals[0];
  return run;
}

template <int Stage, class Prec, class... Extra>
RunResult train_host(int world, RunConfig cfg, MemoryLedger* ledger = nullptr) {
  cfg.world = world;
  RunResult result;
  comm::run_threads(world, [&](Threads& c) {
    RunResult mine = train_rank<Stage, Prec, Threads, Mlp<typename Prec::storage>, Extra...>(
        c, cfg, c.rank() == 0 ? ledger : nullptr);
    if (c.rank() == 0) result = std::move(mine);
  });
  return result;
}

/// Whether two runs gave the same bits (parameters, losses, scales, skips, norms).
bool same_bits(const RunResult& a, const RunResult& b) {
  return a.params == b.params && a.losses == b.losses && a.scales == b.scales && a.skipped == b.skipped &&
         a.norms == b.norms && a.initial == b.initial && a.state == b.state;
}

/// A run's configuration and its host result, computed once.
struct Case {
  std::string name;
  RunConfig cfg;
  RunResult host;
  std::function<AsyncRun(const host_async::Options&)> async;
};

template <int Stage, class Prec, class... Extra>
Case make_case(std::string name, RunConfig cfg, int world = 2) {
  Case c{std::move(name), cfg, train_host<Stage, Prec, Extra...>(world, cfg), {}};
  c.async = [cfg, world](const host_async::Options& o) { return train_async<Stage, Prec, Extra...>(world, cfg, o); };
  return c;
}

/// A directory for Offload<Nvme>'s swap files, removed at exit.
std::string swap_dir() {
  struct Dir {
    std::filesystem::path path =
        std::filesystem::temp_directory_path() / ("zerotk_host_async_" + std::to_string(::getpid()));
    Dir() { std::filesystem::create_directories(path); }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static Dir dir;
  return dir.path.string();
}

/// The cases: each wait of the orchestration matters to at least one (checked below).
std::vector<Case>& cases() {
  static std::vector<Case> all = [] {
    std::vector<Case> v;
    RunConfig base;
    base.steps = 8;
    base.gas = 2;
    base.take_state = true;  // engine.state(): the master and moments, copied to the host
    RunConfig fetched = base;
    fetched.stage3.param_persistence_threshold = 0;  // stage 3 fetches every parameter
    v.push_back(make_case<0, fp32>("stage 0 fp32", base));
    v.push_back(make_case<1, fp32>("stage 1 fp32", base));
    v.push_back(make_case<2, fp32>("stage 2 fp32", base));
    v.push_back(make_case<3, fp32>("stage 3 fp32", fetched));
    RunConfig overflow = base;
    overflow.poison_steps = {2, 5};
    overflow.clip = 0.05;
    v.push_back(make_case<2, fp16>("stage 2 fp16, overflow steps, clipping", overflow));
    RunConfig overflow3 = overflow;
    overflow3.stage3.param_persistence_threshold = 0;
    v.push_back(make_case<3, fp16>("stage 3 fp16, overflow steps, clipping", overflow3));
    v.push_back(make_case<3, bf16, Optimizer<Lion>>("stage 3 bf16 Lion", fetched));
    v.push_back(make_case<1, fp32, Optimizer<Lamb>>("stage 1 fp32 LAMB", base));
    RunConfig offload = base;
    offload.sub_group_size = 100;
    v.push_back(make_case<2, bf16, Offload<Cpu>>("stage 2 bf16 Offload<Cpu>", offload));
    RunConfig delayed = offload;
    delayed.delayed_update = true;  // the update on a host thread, its values put a step later
    v.push_back(make_case<2, bf16, Offload<Cpu>>("stage 2 bf16 Offload<Cpu>, delayed update", delayed));
    RunConfig offload3 = overflow3;  // the shards' values written back through the device's copies
    offload3.sub_group_size = 100;
    v.push_back(make_case<3, fp16, Offload<Cpu>>("stage 3 fp16 Offload<Cpu>, overflow steps, clipping", offload3));
    RunConfig nvme = offload;
    nvme.nvme.path = swap_dir();
    v.push_back(make_case<2, fp32, Offload<Nvme>>("stage 2 fp32 Offload<Nvme>", nvme));
    // OffloadParams: stage 3's shard in host memory, fetched through the device's copies, written by
    // the host step (a zero::MemoryWriter for the pinned shard), staged through the device for the
    // initial values and the state's master.
    RunConfig params = offload3;
    params.reload_after = 4;  // load_state: the master's values back into the host shard
    v.push_back(make_case<3, fp16, Offload<Cpu>, OffloadParams<Cpu>>(
        "stage 3 fp16 Offload<Cpu> OffloadParams<Cpu>, overflow steps, clipping", params));
    RunConfig params_delayed = delayed;
    params_delayed.stage3.param_persistence_threshold = 16;  // persistent buckets regathered at publish
    v.push_back(make_case<3, bf16, Offload<Cpu>, OffloadParams<Cpu>>(
        "stage 3 bf16 Offload<Cpu> OffloadParams<Cpu>, delayed update, persistent buckets", params_delayed));
    RunConfig params_nvme = fetched;  // the shard file's writer: the store's two passes
    params_nvme.sub_group_size = 100;
    params_nvme.reload_after = 3;
    params_nvme.param_nvme.path = swap_dir();
    params_nvme.param_nvme.max_in_cpu = 64;  // the first blocks kept in host memory, the rest read from the file
    v.push_back(make_case<3, fp32, Offload<Cpu>, OffloadParams<Nvme>>(
        "stage 3 fp32 Offload<Cpu> OffloadParams<Nvme>", params_nvme));
    RunConfig micro = base;
    micro.reduce_every_micro_step = true;
    v.push_back(make_case<1, fp32>("stage 1 fp32, reduced every micro-step", micro));
    RunConfig prefetch = base;  // small buckets persistent, the rest prefetched ahead of their layer
    prefetch.stage3.param_persistence_threshold = 16;
    prefetch.stage3.prefetch_bucket_size = 64;
    prefetch.overlap_gather = true;
    v.push_back(make_case<3, bf16>("stage 3 bf16, prefetch and persistent buckets", prefetch));
    RunConfig hpz = fetched;  // ZeRO++ hpZ: the backward gathers from a secondary shard in pairs
    hpz.stage3.reshard_after_forward = ReshardAfterForward::group(2);
    v.push_back(make_case<3, fp32>("stage 3 fp32, hpZ groups of 2 on 4 ranks", hpz, 4));
    return v;
  }();
  return all;
}

/// Options of the equality runs: a held operation nobody waits for would run after 30 s (and be
/// counted), far beyond any wait a loaded machine or a sanitizer imposes on correct code.
host_async::Options equality_options() {
  host_async::Options o;
  o.release_after = std::chrono::seconds(30);
  return o;
}

void check_equal(const Case& c, const AsyncRun& a, const host_async::Options& o) {
  CAPTURE(c.name);
  REQUIRE_MESSAGE(a.failure.empty(), a.failure);
  CHECK(a.result.initial == c.host.initial);
  CHECK(a.result.params == c.host.params);  // bitwise
  CHECK(a.result.losses == c.host.losses);
  CHECK(a.result.scales == c.host.scales);
  CHECK(a.result.skipped == c.host.skipped);
  CHECK(a.result.norms == c.host.norms);
  CHECK(a.result.state == c.host.state);
  CHECK_FALSE(a.result.state.empty());
  CHECK(a.result.ranks_agree);
  CHECK(a.result.params != a.result.initial);  // it trained
  CHECK((a.stats.held > 0) == (o.hold > 0));
  CHECK(a.stats.held <= a.stats.operations);
  CHECK(a.stats.released_unwaited == 0);  // everything it needed, it waited for (release_after: 30 s)
}

}  // namespace

TEST_CASE("Device<HostAsync> engine equals the host engine bit for bit over 20 seeds of held and delayed operations") {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    CAPTURE(seed);
    host_async::Options o = equality_options();
    o.seed = seed;
    o.hold = static_cast<double>(seed % 5) / 4.0;  // 0, 0.25, ..., 1: from nothing held to everything
    for (std::size_t i = 0; i < 4; ++i) check_equal(cases()[i], cases()[i].async(o), o);  // stages 0-3 fp32
  }
}

TEST_CASE("Device<HostAsync> engine equals the host engine: fp16 overflow, clipping, Lion, LAMB, offload, delay") {
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    CAPTURE(seed);
    host_async::Options o = equality_options();
    o.seed = seed;
    o.hold = seed == 4 ? 1.0 : 0.5;
    for (std::size_t i = 4; i < cases().size(); ++i) check_equal(cases()[i], cases()[i].async(o), o);
  }
}

TEST_CASE("Device<HostAsync> memory: the host engine's bytes by category, counted as device memory") {
  RunConfig cfg;
  cfg.steps = 2;
  MemoryLedger host_mem, async_mem;
  (void)train_host<2, bf16>(2, cfg, &host_mem);
  const AsyncRun a = train_async<2, bf16>(2, cfg, host_async::Options{}, &async_mem);
  REQUIRE_MESSAGE(a.failure.empty(), a.failure);
  for (std::size_t c = 0; c < kMemoryCategoryCount; ++c) {
    const auto cat = static_cast<MemoryCategory>(c);
    CAPTURE(to_string(cat));
    CHECK(async_mem.live(cat) == host_mem.live(cat));
  }
  CHECK(async_mem.live(MemorySpace::device, MemoryCategory::master32) > 0);
  CHECK(async_mem.live(MemorySpace::host, MemoryCategory::master32) == 0);
}

TEST_CASE("Device<HostAsync> with OffloadParams<Cpu>: the shard in pinned host memory, none of it on the device") {
  RunConfig cfg;
  cfg.steps = 2;
  cfg.sub_group_size = 100;
  cfg.stage3.param_persistence_threshold = 16;
  MemoryLedger host_mem, async_mem;
  (void)train_host<3, bf16, Offload<Cpu>, OffloadParams<Cpu>>(2, cfg, &host_mem);
  const AsyncRun a = train_async<3, bf16, Offload<Cpu>, OffloadParams<Cpu>>(2, cfg, host_async::Options{}, &async_mem);
  REQUIRE_MESSAGE(a.failure.empty(), a.failure);
  const auto pinned = [](const MemoryLedger& l, MemoryCategory c) { return l.live(MemorySpace::pinned_host, c); };
  CHECK(pinned(async_mem, MemoryCategory::params16) > 0);
  CHECK(pinned(async_mem, MemoryCategory::params16) == pinned(host_mem, MemoryCategory::params16));
  CHECK(pinned(async_mem, MemoryCategory::master32) == pinned(host_mem, MemoryCategory::master32));
  CHECK(async_mem.live(MemorySpace::device, MemoryCategory::params16) == 0);
  CHECK(async_mem.live(MemorySpace::device, MemoryCategory::master32) == 0);
  CHECK(async_mem.live(MemorySpace::device, MemoryCategory::gathered) == host_mem.live(MemoryCategory::gathered));
  // One block's staging on the device (the initial values and the master's start crossed it), kept
  // for later writes: more than nothing, less than the whole shard.
  const std::size_t other = async_mem.live(MemorySpace::device, MemoryCategory::other);
  REQUIRE(other > host_mem.live(MemoryCategory::other));
  CHECK(other - host_mem.live(MemoryCategory::other) < pinned(async_mem, MemoryCategory::params16));
}

TEST_CASE("mutation: removing any one kind of wait from the orchestration makes a HostAsync run differ or fail") {
#if defined(__SANITIZE_THREAD__)
  MESSAGE("not run under ThreadSanitizer: each mutation is a data race by design (the equality tests run)");
  return;
#endif
  const host_async::Drop drops[] = {host_async::Drop::fence, host_async::Drop::result_sync, host_async::Drop::copy_sync,
                                    host_async::Drop::work_wait};
  for (const host_async::Drop drop : drops) {
    CAPTURE(static_cast<int>(drop));
    host_async::Options o;
    o.hold = 1.0;  // every operation waits to be waited for: a missing wait reads the old bits
    o.drop = drop;
    o.release_after = std::chrono::milliseconds(200);  // what nobody waits for still runs (a dropped wait)
    int caught = 0;
    std::string names, failure;
    for (const Case& c : cases()) {
      const AsyncRun a = c.async(o);
      if (!a.failure.empty() || !same_bits(a.result, c.host)) {
        ++caught;
        names += (names.empty() ? "" : ", ") + c.name;
        if (failure.empty()) failure = a.failure;
      }
    }
    const std::string report = "caught by: " + names + (failure.empty() ? "" : "; first failure: " + failure);
    MESSAGE(report);
    CHECK(caught >= 1);
  }
}

TEST_CASE("Device<HostAsync> refuses a missing stream, a device not current and host memory in a kernel, naming them") {
  comm::run_threads(1, [](Threads& c) {
    host_async::Device dev;
    AsyncComm sc(c.split(0, 0), dev);
    host_async::Stream compute = dev.make_stream();
    using E = Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Device<HostAsync>>;
    {
      host_async::CurrentDevice current(dev);
      AsyncMlp<float> model(&compute);
      CHECK_THROWS_WITH_AS((void)E(sc, model), doctest::Contains("EngineOptions::stream = nullptr"), usage_error);
    }
    {  // Ops<HostAsync> refuses a kernel on host memory, as a GPU would fault on it
      host_async::CurrentDevice current(dev);
      auto ops = device::Ops<HostAsync>::create(sc, &compute);
      std::vector<float> host(4);
      auto buf = ops.allocate<float>(4, MemoryCategory::other, nullptr);
      CHECK_THROWS_WITH_AS(ops.cast(host.data(), buf.data(), 4), doctest::Contains("not the device's"), usage_error);
      CHECK_NOTHROW(ops.cast(static_cast<const float*>(buf.data()), buf.data(), 4));
      CHECK_NOTHROW(ops.copy_from_host(host.data(), buf.data(), 4));
      CHECK_THROWS_AS(ops.copy_to_host(host.data(), buf.data(), 4), usage_error);  // its source is the host's
    }
    host_async::Device other;
    host_async::CurrentDevice current(other);
    AsyncMlp<float> model(&compute);
    EngineOptions opts;
    opts.stream = &compute;
    CHECK_THROWS_WITH_AS((void)E(sc, model, opts), doctest::Contains("not the calling thread's current one"),
                         usage_error);
  });
}
