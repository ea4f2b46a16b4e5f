// Offload<Nvme> (offload/nvme.hpp, io/swap_file.hpp) with the threads communicator on Device<Host>:
//  - bitwise-identical parameters, losses, scales, skips and norms to Offload<None> at stages 1, 2
//    and 3, W = 1..3, fp32, fp16 (with an overflow step), bf16, with and without pipelined reads and
//    writes, io_uring and the pread/pwrite pool, sub-group sizes that do and do not divide the
//    partition;
//  - the ledger by space: no master or optimizer state in the compute space or pinned memory; the
//    disk holds both slots, 2 x 12 Psi / N;
//  - state() / load_state() across Offload<Nvme> and Offload<None>; checkpoints;
//  - faults: injected write and read failures (first and later sub-groups), a full file system, a
//    missing and an unwritable directory, tmpfs, a swap file truncated or removed under the run;
//  - the buffered path (aio.use_direct = false, as where a file system refuses O_DIRECT) bitwise,
//    with the path the engine reports checked against the descriptor's flags in /proc/self/fdinfo. An io_error names the file, offset and errno text; the state is the one before
//    the step; training goes on once the cause is gone.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <linux/capability.h>
#include <sys/syscall.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <string_view>
#include <cstring>
#include <thread>
#include <vector>

#include "blob_model.hpp"
#include "engine_fixture.hpp"
#include "offload_runs.hpp"
#include "zerotk/checkpoint.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/engine.hpp"

namespace test_nvme {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using namespace zt_test;
namespace fs = std::filesystem;

namespace {

template <int S>
using Part = Partitioner<zerotk::Stage<S>>;
template <int S, class Prec, class Off>
using E = OffloadEngine<S, Prec, Off>;

/// A fresh directory on the build tree's file system (a real disk: O_DIRECT works there).
fs::path scratch(const std::string& name) {
  const fs::path d = fs::path(ZEROTK_TEST_BINARY_DIR) / "scratch" / ("nvme." + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}
std::vector<fs::path> swap_files(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".swap") out.push_back(e.path());
  }
  return out;
}

struct Swap {
  std::size_t sub_group_size = 1'000'000'000;
  bool pipeline_read = false, pipeline_write = false;
  std::size_t buffer_count = 4;
  bool uring = true;
  bool direct = true;  // aio.use_direct: false forces buffered I/O
  std::size_t block_size = std::size_t{1} << 20;
};

EngineOptions options_for(const RunConfig& cfg, const Swap& s, const fs::path& dir) {
  EngineOptions o = engine_options(cfg);
  o.sub_group_size = s.sub_group_size;
  o.nvme.path = dir;
  o.nvme.pipeline_read = s.pipeline_read;
  o.nvme.pipeline_write = s.pipeline_write;
  o.nvme.buffer_count = s.buffer_count;
  o.nvme.aio.use_uring = s.uring;
  o.nvme.aio.use_direct = s.direct;
  o.nvme.aio.block_size = s.block_size;
  o.nvme.aio.queue_depth = 4;
  return o;
}

template <int S, class Prec, class Off>
RunResult train(const RunConfig& cfg, const Swap& swap, const fs::path& dir) {
  return train_with<S, Prec, Off>(cfg, options_for(cfg, swap, dir), [](const MemoryLedger& m) {
    // The store really is the swapped one: master and optimizer state on disk only.
    return !std::is_same_v<Off, Offload<Nvme>> || (m.live(MemorySpace::host, MemoryCategory::master32) == 0 &&
                                                   m.live(MemorySpace::host, MemoryCategory::optimizer_state) == 0 &&
                                                   m.live(MemorySpace::pinned_host, MemoryCategory::master32) == 0 &&
                                                   m.live(MemorySpace::disk, MemoryCategory::master32) != 0);
  });
}

template <int S, class Prec>
void check_same_as_resident(const RunConfig& cfg, bool expect_skip, const fs::path& dir) {
  const RunResult ref = train<S, Prec, Offload<None>>(cfg, Swap{}, dir);
  check_reference(ref, expect_skip);
  std::vector<Swap> swaps;
  {
    Swap s;  // odd size, both pipelines, three buffers asked for by the pipelining (1 given)
    s.sub_group_size = 7;
    s.pipeline_read = s.pipeline_write = true;
    s.buffer_count = 1;
    swaps.push_back(s);
    s.sub_group_size = 61;  // read pipelined only, the pread/pwrite pool, small blocks
    s.pipeline_write = false;
    s.buffer_count = 4;
    s.uring = false;
    s.block_size = 4096;
    swaps.push_back(s);
    s = Swap{};  // one sub-group larger than any partition, no pipelining
    s.sub_group_size = 1'000'000;
    swaps.push_back(s);
    s.sub_group_size = 64;  // a power of two, write pipelined only
    s.pipeline_write = true;
    swaps.push_back(s);
  }
  for (const Swap& s : swaps) {
    CAPTURE(s.sub_group_size);
    CAPTURE(s.pipeline_read);
    CAPTURE(s.pipeline_write);
    CAPTURE(s.uring);
    check_same_run(train<S, Prec, Offload<Nvme>>(cfg, s, dir), ref);  // bitwise
  }
  CHECK(swap_files(dir).empty());  // removed with their engines
}

template <class Prec>
void sweep(bool fp16, const std::string& name) {
  const fs::path dir = scratch(name);
  for (int world : {1, 2, 3}) {
    for (int variant = 0; variant < 2; ++variant) {
      RunConfig cfg;
      cfg.world = world;
      cfg.steps = 8;
      if (variant == 1) {
        cfg.gas = 2;
        cfg.clip = 0.5;
      }
      if (fp16) cfg.poison_steps = {3};
      cfg.stage3.param_persistence_threshold = 0;
      CAPTURE(world);
      CAPTURE(cfg.gas);
      check_same_as_resident<1, Prec>(cfg, fp16, dir);
      check_same_as_resident<2, Prec>(cfg, fp16, dir);
      check_same_as_resident<3, Prec>(cfg, fp16, dir);
    }
  }
  fs::remove_all(dir);
}

}  // namespace

TEST_CASE("Offload<Nvme> equals Offload<None> bitwise: fp32, stages 1, 2 and 3, W = 1..3, pipelining, sub-groups") {
  sweep<fp32>(false, "fp32");
}
TEST_CASE("Offload<Nvme> equals Offload<None> bitwise: fp16 with an overflow step") { sweep<fp16>(true, "fp16"); }
TEST_CASE("Offload<Nvme> equals Offload<None> bitwise: bf16") { sweep<bf16>(false, "bf16"); }

namespace {
template <int S, class Off>
void ledger_by_space(int world, std::size_t sub_group_size, const fs::path& dir) {
  using Eng = Engine<Part<S>, Optimizer<AdamW>, Precision<fp16>, Off, Bucketer<Bytes<(1 << 20)>>>;
  comm::run_threads(world, [&](auto& comm) {
    Blob model(kBlob);
    RunConfig cfg;
    Swap swap;
    swap.sub_group_size = sub_group_size;
    swap.pipeline_read = swap.pipeline_write = true;
    EngineOptions o = options_for(cfg, swap, dir);
    o.reduce_bucket_size = (1 << 20) / 2;  // fp16 elements
    Eng engine(comm, model, o);
    engine.initialize_master();
    for (auto it = model.ps.rbegin(); it != model.ps.rend(); ++it) {
      OneParam one{&*it};
      auto s = engine.backward(one);
    }
    (void)engine.step(0.0);
    if (comm.rank() != 0) return;
    const double pad = static_cast<double>(engine.flat_numel()), N = world, part = pad / N;
    const MemoryLedger& m = engine.memory();
    auto at = [&](MemorySpace sp, MemoryCategory c) { return static_cast<double>(m.live(sp, c)); };
    const double compute = at(MemorySpace::host, MemoryCategory::params16) + at(MemorySpace::host, MemoryCategory::grads) +
                           at(MemorySpace::host, MemoryCategory::master32) +
                           at(MemorySpace::host, MemoryCategory::optimizer_state);
    const double disk = at(MemorySpace::disk, MemoryCategory::master32) + at(MemorySpace::disk, MemoryCategory::optimizer_state);
    const double pinned_state =
        at(MemorySpace::pinned_host, MemoryCategory::master32) + at(MemorySpace::pinned_host, MemoryCategory::optimizer_state);
    const double staging =
        at(MemorySpace::pinned_host, MemoryCategory::grads) + at(MemorySpace::pinned_host, MemoryCategory::params16);
    const double swap_buffers = at(MemorySpace::pinned_host, MemoryCategory::other);
    const double full = S == 1 ? 4 * pad + 12 * part : 2 * pad + 14 * part;
    const double sub = std::min<double>(part, static_cast<double>(sub_group_size));
    const double region = 3 * std::ceil(sub * 4 / 4096) * 4096;  // master | m | v, each padded to 4096 B
    const double sub_groups = std::ceil(part / static_cast<double>(sub_group_size));
    const double buffers = std::min(4.0, sub_groups);  // buffer_count 4 (pipelining needs 3), at most one per sub-group
    std::printf("offload nvme stage %d W=%d sub_group %zu  padded Psi %.0f  compute %.0f B (formula %.0f)  disk %.0f B "
                "(2 x 12 Psi/N = %.0f)  pinned staging %.0f B + swap buffers %.0f B\n",
                S, world, sub_group_size, pad, compute, full - 12 * part, disk, 24 * part, staging, swap_buffers);
    CHECK(compute == full - 12 * part);  // stage 2: 2 Psi + 2 Psi / N
    CHECK(pinned_state == 0);
    CHECK(disk == 24 * part);
    CHECK(staging == 2.0 * 4.0 * sub);
    CHECK(swap_buffers == buffers * region);
  });
}
}  // namespace

TEST_CASE("ledger by space: Offload<Nvme> keeps master and optimizer state on disk (two slots)") {
  const fs::path dir = scratch("ledger");
  for (int world : {2, 4}) {
    CAPTURE(world);
    ledger_by_space<1, Offload<Nvme>>(world, 1'000'000'000, dir);
    ledger_by_space<2, Offload<Nvme>>(world, 1'000'000'000, dir);
    ledger_by_space<2, Offload<Nvme>>(world, 4096, dir);
  }
  fs::remove_all(dir);
}

namespace {
/// K steps, state(); then M more steps, or a fresh engine of store Off2 that loads the state and
/// runs the same M steps: the same parameters.
template <int S, class Off1, class Off2>
void round_trip(int world, const Swap& swap, const fs::path& dir) {
  RunConfig cfg;
  cfg.world = world;
  cfg.gas = 2;
  cfg.clip = 0.5;
  cfg.poison_steps = {2};
  std::vector<float> straight, resumed;
  std::vector<EngineState> states(static_cast<std::size_t>(world)), again(static_cast<std::size_t>(world));
  comm::run_threads(world, [&](auto& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    const EngineOptions o = options_for(cfg, swap, dir);
    Mlp<half> model;
    E<S, fp16, Off1> engine(comm, model, o);
    {
      auto g = engine.gather(model, 0);  // stage 3: parameters are written inside a gather
      model.init(42);
    }
    engine.initialize_master();
    train_steps(engine, model, comm.rank(), cfg, 0, 5, nullptr);
    states[r] = engine.state();
    train_steps(engine, model, comm.rank(), cfg, 5, 10, nullptr);
    {
      auto g = engine.gather(model);
      if (r == 0) straight = model.values();
    }

    Mlp<half> model2;
    E<S, fp16, Off2> other(comm, model2, o);
    {
      auto g = other.gather(model2, 0);
      model2.init(7);
    }
    other.initialize_master();
    other.load_state(states[r]);
    again[r] = other.state();
    train_steps(other, model2, comm.rank(), cfg, 5, 10, nullptr);
    {
      auto g = other.gather(model2);
      if (r == 0) resumed = model2.values();
    }
  });
  check_same_states(states, again);
  CHECK(!straight.empty());
  CHECK(resumed == straight);
}
}  // namespace

TEST_CASE("state() / load_state() with Offload<Nvme>, and across Offload<Nvme> and Offload<None>") {
  const fs::path dir = scratch("state");
  Swap s;
  s.sub_group_size = 7;
  s.pipeline_read = s.pipeline_write = true;
  for (int world : {1, 2, 3}) {
    CAPTURE(world);
    round_trip<2, Offload<Nvme>, Offload<Nvme>>(world, s, dir);
    round_trip<3, Offload<Nvme>, Offload<Nvme>>(world, s, dir);
    round_trip<2, Offload<Nvme>, Offload<None>>(world, s, dir);
    round_trip<1, Offload<None>, Offload<Nvme>>(world, s, dir);
  }
  fs::remove_all(dir);
}

TEST_CASE("an Offload<Nvme> checkpoint resumes bitwise, into Offload<Nvme> and Offload<None>") {
  const fs::path dir = scratch("ckpt"), ckpt = scratch("ckpt.out");
  for (int world : {1, 2}) {
    CAPTURE(world);
    RunConfig cfg;
    cfg.world = world;
    cfg.gas = 2;
    cfg.clip = 0.5;
    Swap swap;
    swap.sub_group_size = 7;
    swap.pipeline_read = true;
    std::vector<float> straight, resumed, resumed_none;
    comm::run_threads(world, [&](auto& comm) {
      const EngineOptions o = options_for(cfg, swap, dir);
      Mlp<half> model;
      E<2, fp16, Offload<Nvme>> engine(comm, model, o);
      model.init(42);
      engine.initialize_master();
      train_steps(engine, model, comm.rank(), cfg, 0, 4, nullptr);
      (void)checkpoint::save(engine, comm, ckpt);
      train_steps(engine, model, comm.rank(), cfg, 4, 8, nullptr);
      engine.synchronize();
      if (comm.rank() == 0) straight = model.values();

      Mlp<half> model2;
      E<2, fp16, Offload<Nvme>> other(comm, model2, o);
      (void)checkpoint::load(other, comm, ckpt);
      train_steps(other, model2, comm.rank(), cfg, 4, 8, nullptr);
      other.synchronize();
      if (comm.rank() == 0) resumed = model2.values();

      Mlp<half> model3;
      E<2, fp16, Offload<None>> none(comm, model3, o);
      (void)checkpoint::load(none, comm, ckpt);
      train_steps(none, model3, comm.rank(), cfg, 4, 8, nullptr);
      none.synchronize();
      if (comm.rank() == 0) resumed_none = model3.values();
    });
    CHECK(!straight.empty());
    CHECK(resumed == straight);
    CHECK(resumed_none == straight);
  }
  fs::remove_all(dir);
  fs::remove_all(ckpt);
}

// ---- faults ----------------------------------------------------------------------------------------

namespace {

std::atomic<int> g_fail_errno{0};
std::atomic<int> g_fail_after{0};      // this many requests of the kind succeed first
std::atomic<int> g_fail_count{0};      // then this many fail (the rest succeed again)
std::atomic<bool> g_fail_reads{false};  // the kind: reads or writes
std::atomic<bool> g_fail_fp32_group{false};  // only the fp32-kept group's swap files (names end in ".fp32")
int fault_hook(const io::FaultSite& s) {
  if (s.write == g_fail_reads.load()) return 0;
  if (g_fail_fp32_group.load() && std::strstr(s.path, ".fp32") == nullptr) return 0;
  if (g_fail_after.fetch_sub(1) > 0) return 0;
  return g_fail_count.fetch_sub(1) > 0 ? g_fail_errno.load() : 0;
}
/// Requests of one kind fail with `err`: `count` of them, after `after` succeeded.
void arm_faults(int err, bool reads, int after, int count = 1) {
  g_fail_errno = err;
  g_fail_reads = reads;
  g_fail_after = after;
  g_fail_count = count;
  io::set_fault_hook(&fault_hook);
}

/// Trains 3 steps; at step 3 `fault` is armed (and `after_fault` runs once it failed); checks the
/// io_error text, that parameters and state are those before the step; then `fix` runs, and 3 more
/// steps give what an Offload<None> engine loaded with the state before the fault gives.
/// `Model` Mlp<float> (float Params over fp16 storage): the biases are kept in fp32, a second group
/// that steps after the first.
template <int S, class Model = Mlp<half>>
void fault_case(int world, const Swap& swap, const fs::path& dir, auto&& arm, auto&& fix, const std::string& expect_text) {
  constexpr bool kTwoGroups = std::is_same_v<Model, Mlp<float>>;
  RunConfig cfg;
  cfg.world = world;
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  std::vector<char> unchanged(static_cast<std::size_t>(world), 0);
  std::vector<float> continued, reference;
  std::vector<EngineState> before(static_cast<std::size_t>(world));
  comm::run_threads(world, [&](auto& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    EngineOptions o = options_for(cfg, swap, dir);
    if (kTwoGroups) o.keep_fp32 = [](std::string_view name) { return name.ends_with(".bias"); };
    Model model;
    E<S, fp16, Offload<Nvme>> engine(comm, model, o);
    {
      auto g = engine.gather(model, 0);
      model.init(42);
    }
    engine.initialize_master();
    train_steps(engine, model, comm.rank(), cfg, 0, 3, nullptr);
    before[r] = engine.state();
    std::vector<float> params_before;
    {
      auto g = engine.gather(model);
      params_before = model.values();
    }
    comm.barrier().wait();
    if (r == 0) arm();
    comm.barrier().wait();
    try {
      train_steps(engine, model, comm.rank(), cfg, 3, 4, nullptr);
    } catch (const io_error& e) {
      errors[r] = e.what();
    }
    comm.barrier().wait();
    if (r == 0) fix();
    comm.barrier().wait();
    std::vector<float> params_after;
    {
      auto g = engine.gather(model);
      params_after = model.values();
    }
    if (errors[r].find("truncated") != std::string::npos) {
      // The state on disk is lost (state() would fail too); the parameters are untouched, and loading
      // a state (or a checkpoint) rewrites the file.
      unchanged[r] = params_after == params_before;
      engine.load_state(before[r]);
    } else {
      unchanged[r] = params_after == params_before && same_state(engine.state(), before[r]);
    }
    train_steps(engine, model, comm.rank(), cfg, 4, 7, nullptr);
    {
      auto g = engine.gather(model);
      if (r == 0) continued = model.values();
    }
    Model model2;
    E<S, fp16, Offload<None>> ref(comm, model2, o);
    ref.load_state(before[r]);
    train_steps(ref, model2, comm.rank(), cfg, 4, 7, nullptr);
    {
      auto g = ref.gather(model2);
      if (r == 0) reference = model2.values();
    }
  });
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    const std::string& e = errors[static_cast<std::size_t>(r)];
    CAPTURE(e);
    CHECK(e.find("zerotk io error at ") != std::string::npos);
    CHECK(e.find(dir.string()) != std::string::npos);  // the file
    CHECK(e.find(".swap:") != std::string::npos);      // ... and the offset
    CHECK(e.find(expect_text) != std::string::npos);   // the errno text
    CHECK(unchanged[static_cast<std::size_t>(r)]);
  }
  CHECK(!continued.empty());
  CHECK(continued == reference);
}

}  // namespace

TEST_CASE("Offload<Nvme> faults: injected write and read failures abandon the step; training goes on") {
  const fs::path dir = scratch("inject");
  Swap swap;
  swap.sub_group_size = 61;
  swap.pipeline_read = swap.pipeline_write = true;
  for (bool uring : {true, false}) {
    swap.uring = uring;
    CAPTURE(uring);
    const auto off = [] { io::set_fault_hook(nullptr); };
    // Every write of the step (disk full), on every rank (a rank that succeeded would go on to publish).
    fault_case<2>(2, swap, dir, [] { arm_faults(ENOSPC, false, 0, 1'000'000); }, off, "No space left on device");
    // A later write or read: earlier sub-groups' values must be put back (stage 1: they are the
    // parameters themselves; stage 3: the shard).
    fault_case<2>(1, swap, dir, [] { arm_faults(EIO, false, 3); }, off, "Input/output error");
    fault_case<3>(1, swap, dir, [] { arm_faults(EIO, false, 2); }, off, "Input/output error");
    fault_case<1>(1, swap, dir, [] { arm_faults(EIO, false, 4); }, off, "write failed");
    fault_case<1>(1, swap, dir, [] { arm_faults(EIO, true, 3); }, off, "read failed");
    fault_case<1>(2, swap, dir, [] { arm_faults(EIO, true, 0, 1'000'000); }, off, "read failed");
  }
  fs::remove_all(dir);
}

// Two groups: the working-precision group's step is prepared (its new state in the other slot) when
// the fp32 group's write fails; the engine takes it back (engine/group.hpp abort_update): state and
// step count as before, and the next steps equal Offload<None>'s from the state before. (Its 16-bit
// values written at stages 1 and 2 are put back from the current slot as abandon() does; with float
// Params over fp16 storage the model reads its float copies, which only a publish refreshes, so this
// test does not see that put-back: the single-group cases above, on half Params, check it.)
TEST_CASE("Offload<Nvme> faults with two groups: a write failing in the fp32 group leaves the first group untaken") {
  const fs::path dir = scratch("inject_two_groups");
  Swap swap;
  swap.sub_group_size = 61;
  const auto off = [] {
    io::set_fault_hook(nullptr);
    g_fail_fp32_group = false;
  };
  for (int world : {1, 2}) {
    CAPTURE(world);
    const auto arm = [] {
      g_fail_fp32_group = true;
      arm_faults(EIO, false, 0, 1'000'000);
    };
    fault_case<1, Mlp<float>>(world, swap, dir, arm, off, "Input/output error");
    fault_case<2, Mlp<float>>(world, swap, dir, arm, off, "Input/output error");
    fault_case<3, Mlp<float>>(world, swap, dir, arm, off, "Input/output error");
  }
  fs::remove_all(dir);
}

TEST_CASE("Offload<Nvme> faults: when putting the previous values back fails too, the error says so") {
  const fs::path dir = scratch("inject2");
  RunConfig cfg;
  cfg.world = 1;
  Swap swap;
  swap.sub_group_size = 61;
  std::string what;
  comm::run_threads(1, [&](auto& comm) {
    Mlp<half> model;
    E<1, fp16, Offload<Nvme>> engine(comm, model, options_for(cfg, swap, dir));
    model.init(42);
    engine.initialize_master();
    train_steps(engine, model, comm.rank(), cfg, 0, 2, nullptr);
    arm_faults(EIO, true, 3, 1'000'000);  // every read after the third fails
    try {
      train_steps(engine, model, comm.rank(), cfg, 2, 3, nullptr);
    } catch (const io_error& e) {
      what = e.what();
    }
    io::set_fault_hook(nullptr);
  });
  CAPTURE(what);
  CHECK(what.find("putting back the parameters' previous values failed too") != std::string::npos);
  CHECK(what.find("load a checkpoint") != std::string::npos);
  CHECK(what.find("read failed") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("Offload<Nvme> faults: a swap file truncated under the run; one removed under the run") {
  const fs::path dir = scratch("truncate");
  Swap swap;
  swap.sub_group_size = 61;
  swap.pipeline_read = true;
  fault_case<2>(1, swap, dir,
                [&] {
                  for (const fs::path& p : swap_files(dir)) fs::resize_file(p, 4096);
                },
                [] {}, "truncated");
  // Removed: the open descriptor keeps the data; training goes on as if nothing happened.
  RunConfig cfg;
  cfg.world = 2;
  cfg.steps = 6;
  std::vector<float> a, b;
  for (int removed = 0; removed < 2; ++removed) {
    comm::run_threads(2, [&](auto& comm) {
      Mlp<half> model;
      E<2, fp16, Offload<Nvme>> engine(comm, model, options_for(cfg, swap, dir));
      model.init(42);
      engine.initialize_master();
      train_steps(engine, model, comm.rank(), cfg, 0, 3, nullptr);
      comm.barrier().wait();
      if (removed && comm.rank() == 0) {
        for (const fs::path& p : swap_files(dir)) fs::remove(p);
      }
      comm.barrier().wait();
      train_steps(engine, model, comm.rank(), cfg, 3, 6, nullptr);
      engine.synchronize();
      if (comm.rank() == 0) (removed ? b : a) = model.values();
    });
  }
  CHECK(!a.empty());
  CHECK(a == b);
  fs::remove_all(dir);
}

namespace {
std::string construct_error(const fs::path& dir, const Swap& swap = Swap{}) {
  std::string what;
  comm::run_threads(1, [&](auto& comm) {
    Mlp<half> model;
    try {
      E<2, fp16, Offload<Nvme>> engine(comm, model, options_for(RunConfig{}, swap, dir));
    } catch (const io_error& e) {
      what = e.what();
    }
  });
  return what;
}
}  // namespace

TEST_CASE("Offload<Nvme> faults: a missing or unwritable directory is an io_error naming it") {
  const fs::path missing = fs::path(ZEROTK_TEST_BINARY_DIR) / "scratch" / "nvme.no.such.dir";
  fs::remove_all(missing);
  const std::string m = construct_error(missing);
  CAPTURE(m);
  CHECK(m.find("does not exist") != std::string::npos);
  CHECK(m.find(missing.string()) != std::string::npos);

  const fs::path ro = scratch("readonly");
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
  std::string what;
  bool could = true;
  std::thread t([&] {  // root writes anywhere: drop CAP_DAC_OVERRIDE in this thread first
    if (::geteuid() == 0 && !drop_capability(CAP_DAC_OVERRIDE)) could = false;
    if (could) what = construct_error(ro);
  });
  t.join();
  fs::permissions(ro, fs::perms::owner_all);
  fs::remove_all(ro);
  if (!could) {
    MESSAGE("cannot drop CAP_DAC_OVERRIDE here; EACCES is not exercised");
    return;
  }
  CAPTURE(what);
  CHECK(what.find("cannot create the swap file") != std::string::npos);
  CHECK(what.find("Permission denied") != std::string::npos);
  CHECK(what.find(ro.string()) != std::string::npos);
}

namespace {
/// A tmpfs of `size` mounted at a fresh directory; empty path where mounting is not allowed.
struct Tmpfs {
  fs::path dir;
  explicit Tmpfs(const std::string& name, const std::string& size) {
    const fs::path d = scratch(name);
    if (::mount("tmpfs", d.c_str(), "tmpfs", 0, ("size=" + size).c_str()) == 0) dir = d;
  }
  ~Tmpfs() {
    if (!dir.empty()) ::umount(dir.c_str());
  }
};
}  // namespace

TEST_CASE("Offload<Nvme> faults: a full file system (small tmpfs); on tmpfs it trains bitwise") {
  {
    Tmpfs small("tiny", "16k");
    if (small.dir.empty()) {
      MESSAGE("cannot mount a tmpfs here (not root?); ENOSPC from a real file system is not exercised");
    } else {
      const std::string e = construct_error(small.dir);
      CAPTURE(e);
      CHECK(e.find("No space left on device") != std::string::npos);
      CHECK(e.find(small.dir.string()) != std::string::npos);
      CHECK(swap_files(small.dir).empty());  // nothing left behind
    }
  }
  Tmpfs big("tmpfs", "64m");
  if (big.dir.empty()) return;
  RunConfig cfg;
  cfg.world = 2;
  cfg.steps = 5;
  Swap s;
  s.sub_group_size = 61;
  s.pipeline_read = s.pipeline_write = true;
  const RunResult ref = train<2, fp16, Offload<None>>(cfg, s, big.dir);
  const RunResult off = train<2, fp16, Offload<Nvme>>(cfg, s, big.dir);
  CHECK(off.params == ref.params);
}

// ---- the buffered path -----------------------------------------------------------------------------

namespace {
/// Whether this process's open descriptor of `path` has O_DIRECT set, as the kernel says
/// (/proc/self/fdinfo/<fd>, "flags:" in octal): a check of the engine's own report. nullopt when no
/// descriptor of this process is open on that file.
std::optional<bool> kernel_says_direct(const fs::path& path) {
  std::error_code ec;
  for (fs::directory_iterator it("/proc/self/fd", ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code ec2;
    const fs::path target = fs::read_symlink(it->path(), ec2);
    if (ec2 || !fs::equivalent(target, path, ec2) || ec2) continue;
    std::ifstream info("/proc/self/fdinfo/" + it->path().filename().string());
    for (std::string key; info >> key;) {
      if (key == "flags:") {
        std::string octal;
        info >> octal;
        return (std::stoul(octal, nullptr, 8) & static_cast<unsigned long>(O_DIRECT)) != 0;
      }
    }
  }
  return std::nullopt;
}
}  // namespace

TEST_CASE("Offload<Nvme> through buffered I/O (aio.use_direct = false) equals Offload<None> bitwise; the path is reported") {
  // The build tree's disk accepts O_DIRECT (and so does tmpfs on recent kernels), so without the
  // option nothing runs the buffered path a file system refusing O_DIRECT gets.
  const fs::path dir = scratch("buffered");
  for (int world : {1, 2}) {
    RunConfig cfg;
    cfg.world = world;
    cfg.steps = 8;
    cfg.gas = 2;
    cfg.clip = 0.5;
    cfg.poison_steps = {3};
    cfg.stage3.param_persistence_threshold = 0;
    const RunResult ref = train<3, fp16, Offload<None>>(cfg, Swap{}, dir);
    check_reference(ref, true);
    for (bool direct : {false, true}) {  // true: the control, the same check on the O_DIRECT path
      for (bool uring : {true, false}) {
        CAPTURE(world);
        CAPTURE(direct);
        CAPTURE(uring);
        Swap s;
        s.sub_group_size = 61;
        s.pipeline_read = s.pipeline_write = true;
        s.uring = uring;
        s.direct = direct;
        std::mutex mu;
        std::vector<io::SwapFileInfo> reported;
        std::vector<std::optional<bool>> kernel;
        const RunResult off =
            train_with<3, fp16, Offload<Nvme>>(cfg, options_for(cfg, s, dir), [&](const auto& engine) {
              std::lock_guard lock(mu);
              for (const io::SwapFileInfo& f : engine.swap_files()) {
                reported.push_back(f);
                kernel.push_back(kernel_says_direct(f.path));
              }
              return true;
            });
        check_same_run(off, ref);  // bitwise
        REQUIRE(reported.size() == static_cast<std::size_t>(world));  // one group: one file per rank
        for (std::size_t r = 0; r < reported.size(); ++r) {
          CAPTURE(reported[r].path);
          CHECK(reported[r].direct == direct);
          REQUIRE(kernel[r].has_value());  // the file is open in this process
          CHECK(*kernel[r] == direct);     // ... with the flags the engine reports
          if (!uring) CHECK(reported[r].backend == "pread/pwrite thread pool");
#if ZEROTK_HAS_URING
          if (uring && reported[r].backend != "io_uring") MESSAGE("io_uring refused by the kernel here");
#else
          CHECK(reported[r].backend == "pread/pwrite thread pool");
#endif
        }
        CHECK(swap_files(dir).empty());  // removed with their engines
      }
    }
  }
  fs::remove_all(dir);
}

}  // namespace test_nvme
