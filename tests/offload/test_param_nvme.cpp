// OffloadParams<Nvme> (offload/nvme_shard.hpp): stage 3's parameter shards in a file, read before
// each bucket's all-gather, written by the optimizer block by block into each block's other slot.
// Threads communicator on Device<Host>, with Offload<Nvme> and (where said) Offload<Cpu> or Offload<None>:
//  - bitwise-identical parameters, losses, scales, skips and norms to OffloadParams<None>, W = 1..4,
//    fp32, fp16 (with overflow steps), bf16; GAS 2 with clipping; persistent buckets on and off;
//    sub-groups smaller than a block (blocks assembled across sub-groups) and larger; hpZ (g = 2);
//    emulated bf16; rank 0's writes in a GatherScope;
//  - the ledger by space: no parameter shard in the compute space or in pinned memory, two slots of
//    it on disk; the files are gone once the engine is;
//  - faults: an injected write failure of the shard file (first and later blocks) or of the
//    optimizer's swap file abandons the step with an io_error naming the file and offset; parameters
//    and state are those before the step, and training goes on bitwise once the cause is fixed; a
//    failed shard read fails the fetch, and the step runs again once it is fixed;
//  - state() / load_state() across OffloadParams<Nvme> and OffloadParams<None>, and across the stores;
//  - a missing nvme path or directory is an error naming it;
//  - Offload<Cpu> and Offload<None> (their two-pass step, offload/writer_passes.hpp): bitwise equal to
//    OffloadParams<None> with the same store (Offload<None>'s in one fused step), W = 1..3, fp32,
//    fp16, bf16, sub-groups; a failed shard write at the first, a later or the last blocks leaves
//    parameters and state as they were, and training goes on;
//  - two groups (fp32-kept biases): a failed write in the second group's step leaves the first
//    group's step untaken too (Offload<Nvme> shard and state files, Offload<Cpu> and Offload<None> shard).
#include <doctest/doctest.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "blob_model.hpp"
#include "engine_fixture.hpp"
#include "offload_runs.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/engine.hpp"

namespace test_param_nvme {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using namespace zt_test;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) {
  const fs::path d = fs::path(ZEROTK_TEST_BINARY_DIR) / "scratch" / ("param_nvme." + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}
std::size_t files_in(const fs::path& dir) {
  std::size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.path().extension() == ".swap";
  return n;
}

EngineOptions options_in(const RunConfig& cfg, const fs::path& dir, std::size_t sub_group_size) {
  EngineOptions o = engine_options(cfg);
  o.sub_group_size = sub_group_size;
  o.nvme.path = dir;
  o.param_nvme.path = dir;
  o.param_nvme.max_in_cpu = 0;  // every block on NVMe only (test_param_max_in_cpu.cpp keeps some in memory)
  return o;
}

/// W ranks of `cfg` at stage 3 with `Store` (Offload<Nvme>, <Cpu> or <None>); with OffloadParams<Nvme>
/// every rank's ledger must show the shard on disk and nowhere in memory but the output staging.
template <class Prec, class ParamOff, class Model = Mlp<typename Precision<Prec>::storage>, class Store = Offload<Nvme>>
RunResult train3(const RunConfig& cfg, const fs::path& dir, std::size_t sub_group_size = 1'000'000'000) {
  return train_with<3, Prec, Store, ParamOff, Model>(cfg, options_in(cfg, dir, sub_group_size), [](const MemoryLedger& m) {
    if constexpr (std::is_same_v<ParamOff, OffloadParams<Nvme>>) {
      return m.live(MemorySpace::host, MemoryCategory::params16) == 0 && m.live(MemorySpace::disk, MemoryCategory::params16) != 0;
    }
    return m.live(MemorySpace::disk, MemoryCategory::params16) == 0;
  });
}

template <class Prec, class Store = Offload<Nvme>>
void sweep(bool fp16, const std::string& name, int max_world = 4) {
  using Model = Mlp<typename Precision<Prec>::storage>;
  const fs::path dir = scratch(name);
  for (int world = 1; world <= max_world; ++world) {
    for (int variant = 0; variant < 3; ++variant) {
      RunConfig cfg;
      cfg.world = world;
      cfg.steps = 8;
      if (variant >= 1) {
        cfg.gas = 2;
        cfg.clip = 0.5;
      }
      // variant 2: the defaults (the biases persistent, prefetch and reuse); else every parameter fetched
      if (variant < 2) cfg.stage3.param_persistence_threshold = 0;
      if (fp16) cfg.poison_steps = {3, 6};
      CAPTURE(world);
      CAPTURE(variant);
      const RunResult ref = train3<Prec, OffloadParams<None>, Model, Store>(cfg, dir);
      REQUIRE(ref.ranks_agree);
      CHECK(ref.params != ref.initial);  // it trained
      check_same_run(train3<Prec, OffloadParams<Nvme>, Model, Store>(cfg, dir), ref);
      // 7 elements per sub-group: most blocks are assembled from two or more sub-groups
      check_same_run(train3<Prec, OffloadParams<Nvme>, Model, Store>(cfg, dir, 7), ref);
      CHECK(files_in(dir) == 0);  // every engine removed its files
    }
  }
  fs::remove_all(dir);
}

}  // namespace

TEST_CASE("OffloadParams<Nvme> equals OffloadParams<None> bitwise at stage 3: fp32, W = 1..4, sub-groups") {
  sweep<fp32>(false, "fp32");
}
TEST_CASE("OffloadParams<Nvme> equals OffloadParams<None> bitwise at stage 3: fp16 with overflow steps") {
  sweep<fp16>(true, "fp16");
}
TEST_CASE("OffloadParams<Nvme> equals OffloadParams<None> bitwise at stage 3: bf16") { sweep<bf16>(false, "bf16"); }

// Offload<Cpu> writes each sub-group's values first and steps the state in place after every shard
// write (offload/host_pinned.hpp): the same bits as OffloadParams<None> under Offload<Cpu>.
TEST_CASE("Offload<Cpu> with OffloadParams<Nvme> equals OffloadParams<None> bitwise: fp32, fp16, bf16, W = 1..3") {
  sweep<fp32, Offload<Cpu>>(false, "cpu_fp32", 3);
  sweep<fp16, Offload<Cpu>>(true, "cpu_fp16", 3);
  sweep<bf16, Offload<Cpu>>(false, "cpu_bf16", 3);
}
// Offload<None> steps the same way sub-group by sub-group (offload/resident.hpp), against its own one
// fused step over the whole partition with OffloadParams<None>.
TEST_CASE("Offload<None> with OffloadParams<Nvme> equals OffloadParams<None> bitwise: fp32, fp16, bf16, W = 1..3") {
  sweep<fp32, Offload<None>>(false, "none_fp32", 3);
  sweep<fp16, Offload<None>>(true, "none_fp16", 3);
  sweep<bf16, Offload<None>>(false, "none_bf16", 3);
}

TEST_CASE("OffloadParams<Nvme> with hpZ (g = 2, W = 4) and with emulated bf16 keeps the bits") {
  const fs::path dir = scratch("hpz");
  RunConfig cfg;
  cfg.world = 4;
  cfg.steps = 6;
  cfg.gas = 2;
  cfg.clip = 0.05;
  cfg.stage3.param_persistence_threshold = 0;
  cfg.stage3.prefetch_bucket_size = 0;
  cfg.stage3.max_reuse_distance = 0;  // every backward gathers again: from the secondary shard
  cfg.stage3.reshard_after_forward = ReshardAfterForward::group(2);
  {
    const RunResult ref = train3<fp16, OffloadParams<None>>(cfg, dir);
    REQUIRE(ref.ranks_agree);
    check_same_run(train3<fp16, OffloadParams<Nvme>>(cfg, dir, 11), ref);
  }
  cfg.stage3.reshard_after_forward = true;
  {  // float Params over bf16 storage: the shard is bf16, on disk; float copies of gathered buckets
    const RunResult ref = train3<bf16, OffloadParams<None>, Mlp<float>>(cfg, dir);
    REQUIRE(ref.ranks_agree);
    check_same_run(train3<bf16, OffloadParams<Nvme>, Mlp<float>>(cfg, dir), ref);
  }
  fs::remove_all(dir);
}

namespace {
/// One step of Blob at stage 3 with every parameter fetched; rank 0 checks the ledger by space.
template <class Prec, class ParamOff>
void ledger_by_space(int world, const fs::path& dir) {
  using S = typename Precision<Prec>::storage;
  using Eng = Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, Precision<Prec>, Offload<Nvme>, ParamOff,
                     Bucketer<Bytes<(1 << 20)>>>;
  comm::run_threads(world, [&](auto& comm) {
    BasicBlob<S> model(kBlob);
    EngineOptions o;
    o.stage3.param_persistence_threshold = 0;
    o.nvme.path = dir;
    o.param_nvme.path = dir;
    o.param_nvme.max_in_cpu = 0;
    Eng engine(comm, model, o);
    engine.initialize_master();
    for (auto it = model.ps.rbegin(); it != model.ps.rend(); ++it) {
      BasicOneParam<S> one{&*it};
      auto s = engine.backward(one);
    }
    (void)engine.step(0.0);
    comm.barrier().wait();
    if (comm.rank() == 0) {
      const double part = static_cast<double>(engine.flat_numel()) / world, s = sizeof(S);
      const MemoryLedger& m = engine.memory();
      auto at = [&](MemorySpace sp, MemoryCategory c) { return static_cast<double>(m.live(sp, c)); };
      constexpr bool params_off = std::is_same_v<ParamOff, OffloadParams<Nvme>>;
      CHECK(at(MemorySpace::host, MemoryCategory::params16) == (params_off ? 0 : s * part));
      // Pinned params16 is the optimizer's output staging (one sub-group of fp32-sized slots) either way.
      CHECK(at(MemorySpace::pinned_host, MemoryCategory::params16) == 4 * part);
      // On disk: two slots of the shard, every block padded to 4096 bytes (at most a page per bucket more).
      const double disk = at(MemorySpace::disk, MemoryCategory::params16);
      if (params_off) {
        CHECK(disk >= 2 * s * part);
        CHECK(disk <= 2 * (s * part + 4096.0 * static_cast<double>(model.ps.size())));
        CHECK(static_cast<std::uint64_t>(disk) % 4096 == 0);
      } else {
        CHECK(disk == 0);
      }
      // No master or optimizer state in memory (Offload<Nvme>), two slots of both on disk.
      CHECK(at(MemorySpace::host, MemoryCategory::master32) + at(MemorySpace::host, MemoryCategory::optimizer_state) == 0);
      CHECK(at(MemorySpace::disk, MemoryCategory::master32) == 2 * 4 * part);
      CHECK(files_in(dir) == static_cast<std::size_t>(world) * (params_off ? 2 : 1));  // a shard file and a state file per rank
      MESSAGE("stage 3 W=" << world << " " << to_string(dtype_of_v<S>) << " offload_param " << (params_off ? "nvme" : "none")
                           << ": compute space params16 " << at(MemorySpace::host, MemoryCategory::params16)
                           << " B, gathered " << at(MemorySpace::host, MemoryCategory::gathered) << " B; disk params16 "
                           << disk << " B (shard " << s * part << " B)");
    }
    comm.barrier().wait();
  });
  CHECK(files_in(dir) == 0);
}
}  // namespace

TEST_CASE("ledger by space: OffloadParams<Nvme> moves the parameter shards to disk (two slots)") {
  const fs::path dir = scratch("ledger");
  for (int world : {1, 2, 4}) {
    CAPTURE(world);
    ledger_by_space<fp16, OffloadParams<None>>(world, dir);
    ledger_by_space<fp16, OffloadParams<Nvme>>(world, dir);
    ledger_by_space<bf16, OffloadParams<Nvme>>(world, dir);
    ledger_by_space<fp32, OffloadParams<Nvme>>(world, dir);
  }
  fs::remove_all(dir);
}

// ---- faults ----------------------------------------------------------------------------------------

namespace {

std::atomic<int> g_after{0};   // this many writes to the chosen file succeed first
std::atomic<int> g_count{0};   // then this many fail
std::atomic<bool> g_params_file{true};  // the chosen file: the shard's, or the optimizer state's
std::atomic<bool> g_second_group{false};  // only the fp32-kept group's files (names end in ".fp32")
int fault_hook(const io::FaultSite& s) {
  if (!s.write) return 0;
  const bool params = std::strstr(s.path, "zerotk_params.") != nullptr;
  if (params != g_params_file.load()) return 0;
  if (g_second_group.load() && std::strstr(s.path, ".fp32") == nullptr) return 0;
  if (g_after.fetch_sub(1) > 0) return 0;
  return g_count.fetch_sub(1) > 0 ? EIO : 0;
}

/// Trains 3 steps; the 4th step's writes to the chosen file fail (`after` succeed first); checks the
/// io_error, that parameters and state are those before the step; then 3 more steps equal what an
/// OffloadParams<None> engine loaded with the state before the fault gives.
/// `two_groups`: the biases are kept in fp32 (a second group, stepped after the first), and only
/// that group's writes fail.
/// `Model`: Mlp<float> for two groups (float Params over fp16 storage: fp32-kept parameters must hold float).
template <class Store = Offload<Nvme>, class Model = Mlp<half>>
void fault_case(int world, bool params_file, int after, const fs::path& dir, bool two_groups = false) {
  RunConfig cfg;
  cfg.world = world;
  cfg.stage3.param_persistence_threshold = 0;
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  std::vector<char> unchanged(static_cast<std::size_t>(world), 0);
  std::vector<float> continued, reference;
  comm::run_threads(world, [&](auto& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    EngineOptions o = options_in(cfg, dir, 13);
    if (two_groups) o.keep_fp32 = [](std::string_view name) { return name.ends_with(".bias"); };
    Model model;
    OffloadEngine<3, fp16, Store, OffloadParams<Nvme>> engine(comm, model, o);
    {
      auto g = engine.gather(model, 0);
      model.init(42);
    }
    engine.initialize_master();
    train_steps(engine, model, comm.rank(), cfg, 0, 3, nullptr);
    const EngineState before = engine.state();
    std::vector<float> params_before, params_after;
    {
      auto g = engine.gather(model);
      params_before = model.values();
    }
    comm.barrier().wait();
    if (r == 0) {
      g_params_file = params_file;
      g_second_group = two_groups;
      g_after = after;
      g_count = 1'000'000;
      io::set_fault_hook(&fault_hook);
    }
    comm.barrier().wait();
    try {
      train_steps(engine, model, comm.rank(), cfg, 3, 4, nullptr);
    } catch (const io_error& e) {
      errors[r] = e.what();
    }
    comm.barrier().wait();
    if (r == 0) io::set_fault_hook(nullptr);
    comm.barrier().wait();
    {
      auto g = engine.gather(model);
      params_after = model.values();
    }
    unchanged[r] = params_after == params_before && same_state(engine.state(), before);
    train_steps(engine, model, comm.rank(), cfg, 4, 7, nullptr);
    {
      auto g = engine.gather(model);
      if (r == 0) continued = model.values();
    }
    Model model2;
    OffloadEngine<3, fp16, Store, OffloadParams<None>> ref(comm, model2, o);
    ref.load_state(before);
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
    CHECK(e.find(params_file ? "zerotk_params." : "zerotk_optim.") != std::string::npos);
    CHECK(e.find(".swap:") != std::string::npos);      // ... and the offset
    CHECK(e.find("Input/output error") != std::string::npos);  // the errno text
    CHECK(unchanged[static_cast<std::size_t>(r)]);
  }
  CHECK(!continued.empty());
  CHECK(continued == reference);
}

}  // namespace

// Under Offload<Nvme>, and under Offload<Cpu> and Offload<None> (their two passes: the state untouched
// until commit).
TEST_CASE("OffloadParams<Nvme> faults: a failed shard or state write abandons the step; training goes on") {
  const fs::path dir = scratch("faults");
  for (int world : {1, 2}) {
    CAPTURE(world);
    for (int after : {0, 2, 5}) {  // the first block's write, later ones (ranks fail at different points)
      CAPTURE(after);
      fault_case(world, true, after, dir);
      fault_case<Offload<Cpu>>(world, true, after, dir);
      fault_case<Offload<None>>(world, true, after, dir);
    }
    fault_case(world, false, 1, dir);  // the optimizer state's swap file: the shard's transaction is dropped
  }
  CHECK(files_in(dir) == 0);
  fs::remove_all(dir);
}

// The engine prepares every group's step before it makes any current (engine/group.hpp): before,
// the working-precision group's step stayed taken when the fp32-kept group's failed.
TEST_CASE("two groups (fp32-kept biases): a failed write in the second group's step leaves neither group's taken") {
  const fs::path dir = scratch("two_group_faults");
  for (int world : {1, 2}) {
    CAPTURE(world);
    for (int after : {0, 1}) {
      CAPTURE(after);
      fault_case<Offload<Nvme>, Mlp<float>>(world, true, after, dir, true);   // the second group's shard file
      fault_case<Offload<Nvme>, Mlp<float>>(world, false, after, dir, true);  // its optimizer state's swap file
      fault_case<Offload<Cpu>, Mlp<float>>(world, true, after, dir, true);    // its shard, under Offload<Cpu>
      fault_case<Offload<None>, Mlp<float>>(world, true, after, dir, true);   // and under Offload<None>
    }
  }
  g_second_group = false;
  CHECK(files_in(dir) == 0);
  fs::remove_all(dir);
}

namespace {
std::atomic<bool> g_fail_reads{false};
int read_hook(const io::FaultSite& s) {
  return !s.write && g_fail_reads.load() && std::strstr(s.path, "zerotk_params.") != nullptr ? EIO : 0;
}
}  // namespace

TEST_CASE("OffloadParams<Nvme> faults: a failed shard read fails the fetch; the step runs again once fixed") {
  const fs::path dir = scratch("read");
  // buffer_count 1: no read-ahead, so every rank's first fetch of the step reads, and fails, before
  // any rank gathers. With read-ahead (one rank: the failing fetch is a later one, whose read was
  // started by read-ahead after the fault was set; the first blocks were read ahead at the end of
  // the step before).
  struct Case {
    int world;
    std::size_t buffer_count;
  };
  for (const Case c : {Case{1, 1}, Case{2, 1}, Case{1, 5}}) {
    const int world = c.world;
    CAPTURE(world);
    CAPTURE(c.buffer_count);
    RunConfig cfg;
    cfg.world = world;
    cfg.stage3.param_persistence_threshold = 0;
    std::vector<std::string> errors(static_cast<std::size_t>(world));
    std::vector<float> retried, reference;
    comm::run_threads(world, [&](auto& comm) {
      const auto r = static_cast<std::size_t>(comm.rank());
      EngineOptions o = options_in(cfg, dir, 13);
      o.param_nvme.buffer_count = c.buffer_count;
      Mlp<half> model;
      OffloadEngine<3, fp16, Offload<Nvme>, OffloadParams<Nvme>> engine(comm, model, o);
      {
        auto g = engine.gather(model, 0);
        model.init(42);
      }
      engine.initialize_master();
      train_steps(engine, model, comm.rank(), cfg, 0, 3, nullptr);
      comm.barrier().wait();
      if (r == 0) {
        g_fail_reads = true;
        io::set_fault_hook(&read_hook);
      }
      comm.barrier().wait();
      try {
        train_steps(engine, model, comm.rank(), cfg, 3, 4, nullptr);
      } catch (const io_error& e) {
        errors[r] = e.what();
      }
      comm.barrier().wait();
      if (r == 0) {
        g_fail_reads = false;
        io::set_fault_hook(nullptr);
      }
      comm.barrier().wait();
      train_steps(engine, model, comm.rank(), cfg, 3, 6, nullptr);  // step 3 again, then on
      {
        auto g = engine.gather(model);
        if (r == 0) retried = model.values();
      }
      Mlp<half> model2;
      OffloadEngine<3, fp16, Offload<Nvme>, OffloadParams<None>> ref(comm, model2, o);
      {
        auto g = ref.gather(model2, 0);
        model2.init(42);
      }
      ref.initialize_master();
      train_steps(ref, model2, comm.rank(), cfg, 0, 6, nullptr);
      {
        auto g = ref.gather(model2);
        if (r == 0) reference = model2.values();
      }
    });
    for (const std::string& e : errors) {
      CAPTURE(e);
      CHECK(e.find("zerotk_params.") != std::string::npos);
      CHECK(e.find("Input/output error") != std::string::npos);
    }
    CHECK(!retried.empty());
    CHECK(retried == reference);
  }
  CHECK(files_in(dir) == 0);
  fs::remove_all(dir);
}

TEST_CASE("state() / load_state() across OffloadParams<Nvme> and OffloadParams<None>, Offload<Nvme>, <Cpu> and <None>") {
  const fs::path dir = scratch("state");
  for (int world : {1, 3}) {
    CAPTURE(world);
    RunConfig cfg;
    cfg.world = world;
    cfg.gas = 2;
    cfg.clip = 0.5;
    cfg.poison_steps = {2};
    cfg.stage3.param_persistence_threshold = 0;
    const EngineOptions o = options_in(cfg, dir, 17);
    using Nv = OffloadEngine<3, fp16, Offload<Nvme>, OffloadParams<Nvme>>;
    using None3 = OffloadEngine<3, fp16, Offload<Nvme>, OffloadParams<None>>;
    check_resume_across<Nv, Nv>(cfg, o);
    check_resume_across<Nv, None3>(cfg, o);
    check_resume_across<None3, Nv>(cfg, o);
    // Offload<Cpu> with the shard on NVMe, into and out of the all-NVMe engine.
    using CpuNv = OffloadEngine<3, fp16, Offload<Cpu>, OffloadParams<Nvme>>;
    check_resume_across<CpuNv, Nv>(cfg, o);
    check_resume_across<Nv, CpuNv>(cfg, o);
    // Offload<None> with the shard on NVMe (its state in the compute space, stepped in two passes).
    using NoneNv = OffloadEngine<3, fp16, Offload<None>, OffloadParams<Nvme>>;
    check_resume_across<NoneNv, Nv>(cfg, o);
    check_resume_across<Nv, NoneNv>(cfg, o);
  }
  fs::remove_all(dir);
}

TEST_CASE("OffloadParams<Nvme>: a missing nvme path or directory is an error naming it") {
  const fs::path dir = scratch("refuse");
  RunConfig cfg;
  cfg.world = 1;
  comm::run_threads(1, [&](auto& comm) {
    Mlp<half> model;
    EngineOptions o = options_in(cfg, dir, 1'000'000);
    o.param_nvme.path.clear();
    using Eng = OffloadEngine<3, fp16, Offload<Nvme>, OffloadParams<Nvme>>;
    CHECK_THROWS_WITH_AS(Eng(comm, model, o), doctest::Contains("zero_optimization.offload_param.nvme_path"), config_error);
    o.param_nvme.path = dir / "no_such_dir";
    CHECK_THROWS_WITH_AS(Eng(comm, model, o), doctest::Contains("no_such_dir"), io_error);
  });
  CHECK(files_in(dir) == 0);  // the state file of the refused engines is gone too
  fs::remove_all(dir);
}

}  // namespace test_param_nvme
