// OffloadParams<Nvme>'s read-ahead (offload/nvme_shard.hpp, `offload_param.buffer_count`): the
// fetch schedule names the buckets it fetches next and their blocks are read before the fetch.
//  - NvmeShard alone: a staged block gives the fetch the current values; writes, commits and
//    abandoned transactions leave no stale block behind; at most buffer_count - 1 blocks are staged;
//    a failed read-ahead is the io_error of the fetch that needs the block, drops the other staged
//    reads, and the next fetch reads again; buffer_count 0 and a buffer_size smaller than the largest block are config errors.
//  - The engine: once the order is recorded, every forward fetch past those of the first layer (and
//    of the gathers prefetched with it) is served from a read-ahead buffer; the fetches are the same
//    as with buffer_count 1 (no read-ahead), and the parameters bitwise those of buffer_count 1 and
//    of OffloadParams<None>. The end of each step reads the first layers' blocks ahead, so past the
//    first micro-step no fetch reads its own block, with and without gradient accumulation.
#include <doctest/doctest.h>

#include <filesystem>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "engine_fixture.hpp"
#include "offload_runs.hpp"
#include "shard_fixture.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/engine.hpp"

namespace test_param_read_ahead {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using namespace zt_test;
using namespace zt_test::shard;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) { return shard::scratch_dir("read_ahead." + name); }

/// cfg's run at stage 3 in fp16 with OffloadParams<Nvme> and options o; each rank's read statistics
/// land in stats[rank].
RunResult run_reading(const RunConfig& cfg, const EngineOptions& o, std::vector<offload::ParamReadStats>& stats) {
  stats.assign(static_cast<std::size_t>(cfg.world), {});
  std::mutex mu;
  return train_with<3, fp16, Offload<Nvme>, OffloadParams<Nvme>>(cfg, o, [&](const auto& e) {
    std::lock_guard lock(mu);
    stats[static_cast<std::size_t>(e.rank())] = e.param_read_stats();
    return true;
  });
}
}  // namespace

TEST_CASE("NvmeShard read-ahead: staged blocks hold the current values; writes and commits drop them") {
  const fs::path dir = scratch("unit");
  Fixture f;
  REQUIRE(f.buckets() == 6);
  {
    Shard s(f.ops, f.layout, 0, &f.ledger, f.options(dir, 3));
    CHECK(s.stage_capacity() == 2);
    f.write_all(s, 1);

    const std::size_t ahead[] = {3, 1, 4, 5};
    s.stage_ahead(ahead);  // only the first two: 3 and 1
    CHECK(f.fetched_is(s, 3, 1));
    CHECK(f.fetched_is(s, 1, 1));
    CHECK(f.fetched_is(s, 4, 1));
    CHECK(s.stats().staged == 2);
    CHECK(s.stats().unstaged == 1);

    // write(k) makes the other slot current: the staged copy of k is dropped, k's fetch reads anew.
    const std::size_t two[] = {2, 0};
    s.stage_ahead(two);
    s.write(2, [&](float* b) {
      for (std::size_t i = 0; i < f.block(2); ++i) b[i] = f.value(2, i, 2);
    });
    CHECK(f.fetched_is(s, 2, 2));
    CHECK(f.fetched_is(s, 0, 1));
    CHECK(s.stats().staged == 3);  // 0 was staged; 2 was dropped
    CHECK(s.stats().unstaged == 2);

    // A committed transaction drops every block it wrote.
    const std::size_t five[] = {5, 3};
    s.stage_ahead(five);
    f.write_through_writer(s, 3);
    s.commit();
    CHECK(f.fetched_is(s, 5, 3));
    CHECK(f.fetched_is(s, 3, 3));
    CHECK(s.stats().staged == 3);

    // An abandoned one changes nothing: the staged blocks stay good and are used.
    s.stage_ahead(five);
    f.write_through_writer(s, 4);
    s.abort();
    CHECK(f.fetched_is(s, 5, 3));
    CHECK(f.fetched_is(s, 3, 3));
    CHECK(s.stats().staged == 5);

    // A block no longer named is dropped; naming the staged ones again reads nothing twice.
    s.stage_ahead(two);
    s.stage_ahead(five);
    s.stage_ahead(five);
    CHECK(f.fetched_is(s, 3, 3));
    CHECK(f.fetched_is(s, 2, 3));  // dropped by the second call: read by the fetch
    CHECK(s.stats().staged == 6);
    CHECK(s.stats().unstaged == 5);
    s.stage_ahead(five);  // left staged: the destructor waits for it
  }
  {  // buffer_count 1: nothing is read ahead, every fetch reads
    Shard s(f.ops, f.layout, 0, &f.ledger, f.options(dir, 1));
    CHECK(s.stage_capacity() == 0);
    f.write_all(s, 1);
    const std::size_t ahead[] = {1, 2};
    s.stage_ahead(ahead);
    CHECK(f.fetched_is(s, 1, 1));
    CHECK(f.fetched_is(s, 2, 1));
    CHECK(s.stats().staged == 0);
    CHECK(s.stats().unstaged == 2);
  }
  CHECK(f.ledger.live(MemorySpace::disk, MemoryCategory::params16) == 0);
  fs::remove_all(dir);
}

TEST_CASE("NvmeShard read-ahead: a failed read is the fetch's io_error and drops the other staged reads; the next fetch reads again") {
  const fs::path dir = scratch("fault");
  Fixture f;
  {
    Shard s(f.ops, f.layout, 0, &f.ledger, f.options(dir, 5));
    f.write_all(s, 1);
    // The hook stays on until the failed reads have been waited for: the I/O threads ask it when
    // they take a request, which may be after stage_ahead returns.
    g_fail_reads = true;
    io::set_fault_hook(&fault_hook);
    const std::size_t ahead[] = {4, 0};
    s.stage_ahead(ahead);  // both reads fail in the background: nothing is thrown here
    std::vector<float> slot(f.block(4));
    CHECK_THROWS_WITH_AS(s.gather_source(f.ops, 4, slot.data()), doctest::Contains("zerotk_params."), io_error);
    // The failure dropped block 0's read-ahead too (read under the same fault): its fetch reads
    // the block itself (an unstaged fetch), and fails while the fault lasts.
    CHECK(s.stats().unstaged == 0);
    CHECK_THROWS_AS(s.gather_source(f.ops, 0, slot.data()), io_error);
    CHECK(s.stats().unstaged == 1);
    g_fail_reads = false;
    io::set_fault_hook(nullptr);
    CHECK(f.fetched_is(s, 4, 1));  // the cause is gone: read again, right
    CHECK(f.fetched_is(s, 0, 1));
    CHECK(s.stats().staged == 0);
    CHECK(s.stats().unstaged == 3);
    // A failed read-ahead that no fetch needs is dropped without a word.
    g_fail_reads = true;
    io::set_fault_hook(&fault_hook);
    s.stage_ahead(ahead);
    s.stage_ahead({});  // drops both: waits for their (failed) reads
    g_fail_reads = false;
    io::set_fault_hook(nullptr);
    const std::size_t other[] = {1};
    s.stage_ahead(other);
    CHECK(f.fetched_is(s, 4, 1));
    CHECK(f.fetched_is(s, 1, 1));
    CHECK(s.stats().staged == 1);
    CHECK(s.stats().unstaged == 4);
  }
  fs::remove_all(dir);
}

TEST_CASE("NvmeShard: buffer_count 0 and a buffer_size below the largest block are config errors naming the key") {
  const fs::path dir = scratch("refuse");
  Fixture f;
  offload::ShardFileOptions o = f.options(dir, 0);
  CHECK_THROWS_WITH_AS(Shard(f.ops, f.layout, 0, &f.ledger, o), doctest::Contains("offload_param.buffer_count"), config_error);
  o.nvme.buffer_count = 2;
  std::size_t largest = 0;
  for (std::size_t k = 0; k < f.buckets(); ++k) largest = std::max(largest, f.block(k));
  o.nvme.buffer_size = largest - 1;
  CHECK_THROWS_WITH_AS(Shard(f.ops, f.layout, 0, &f.ledger, o), doctest::Contains("offload_param.buffer_size"), config_error);
  CHECK_THROWS_WITH_AS(Shard(f.ops, f.layout, 0, &f.ledger, o), doctest::Contains((std::to_string(largest) + " elements").c_str()),
                       config_error);
  o.nvme.buffer_size = largest;
  CHECK_NOTHROW(Shard(f.ops, f.layout, 0, &f.ledger, o));
  fs::remove_all(dir);
}

TEST_CASE("the engine reads ahead on the recorded order; the bits equal buffer_count 1 and OffloadParams<None>") {
  const fs::path dir = scratch("engine");
  for (int world : {1, 2, 3}) {
    // prefetch 0: every gather starts at its layer's fetch; 250 elements: the next layer's gathers
    // start one layer early (the MLP's layers hold 238, 198 and 60 elements, a weight and a bias each).
    for (std::size_t prefetch : {std::size_t{0}, std::size_t{250}}) {
      CAPTURE(world);
      CAPTURE(prefetch);
      RunConfig cfg;
      cfg.world = world;
      cfg.steps = 5;
      cfg.stage3.param_persistence_threshold = 0;
      cfg.stage3.prefetch_bucket_size = prefetch;
      EngineOptions o = engine_options(cfg);
      o.nvme.path = dir;
      o.param_nvme.path = dir;
      o.param_nvme.max_in_cpu = 0;
      auto run = [&](std::size_t buffer_count, std::vector<offload::ParamReadStats>& stats) {
        o.param_nvme.buffer_count = buffer_count;
        return run_reading(cfg, o, stats);
      };
      std::vector<offload::ParamReadStats> ahead, none;
      const RunResult with = run(5, ahead);
      const RunResult without = run(1, none);
      const RunResult ref = train_with<3, fp16, Offload<Nvme>, OffloadParams<None>>(cfg, o, [](const MemoryLedger&) { return true; });
      REQUIRE(ref.ranks_agree);
      check_same_run(with, ref);
      check_same_run(without, ref);
      for (int r = 0; r < world; ++r) {
        const auto& a = ahead[static_cast<std::size_t>(r)];
        const auto& n = none[static_cast<std::size_t>(r)];
        CAPTURE(r);
        // Same fetches either way; without read-ahead every one reads.
        CHECK(n.staged == 0);
        CHECK(a.staged + a.unstaged == n.unstaged);
        // Step 0 has no recorded order. On it, each step's forward reads only the blocks fetched at
        // its first layer (2 buckets, or 4 with the second layer's prefetched gathers) at the fetch:
        // the other forward buckets, at least, come from read-ahead buffers.
        const std::uint64_t forward_ahead = prefetch == 0 ? 4 : 2;
        MESSAGE("world " << world << " rank " << r << ": " << a.staged << " fetches read ahead, " << a.unstaged
                         << " read at the fetch (" << n.unstaged << " without read-ahead)");
        CHECK(a.staged >= static_cast<std::uint64_t>(cfg.steps - 1) * forward_ahead);
      }
    }
  }
  CHECK(fs::is_empty(dir));
  fs::remove_all(dir);
}

TEST_CASE("read-ahead goes on across micro-steps and updates: past the first micro-step no fetch reads its own block") {
  const fs::path dir = scratch("across");
  for (int world : {1, 2}) {
    for (int gas : {1, 2}) {
      for (std::size_t prefetch : {std::size_t{0}, std::size_t{250}}) {
        CAPTURE(world);
        CAPTURE(gas);
        CAPTURE(prefetch);
        RunConfig cfg;
        cfg.world = world;
        cfg.gas = gas;
        cfg.stage3.param_persistence_threshold = 0;
        cfg.stage3.prefetch_bucket_size = prefetch;
        EngineOptions o = engine_options(cfg);
        o.nvme.path = dir;
        o.param_nvme.path = dir;
        o.param_nvme.max_in_cpu = 0;
        o.param_nvme.buffer_count = 5;
        auto run = [&](int steps, std::vector<offload::ParamReadStats>& stats) {
          cfg.steps = steps;
          return run_reading(cfg, o, stats);
        };
        // One step, then four: the fetches the first micro-step reads itself (it has no recorded
        // order yet) and those of the gather after training are in both; every other fetch of the
        // longer run is served from a read-ahead buffer.
        std::vector<offload::ParamReadStats> one, four;
        const RunResult r1 = run(1, one);
        const RunResult r4 = run(4, four);
        REQUIRE(r1.ranks_agree);
        REQUIRE(r4.ranks_agree);
        for (std::size_t r = 0; r < static_cast<std::size_t>(world); ++r) {
          CAPTURE(r);
          CHECK(four[r].unstaged == one[r].unstaged);
          CHECK(four[r].staged > one[r].staged);
          MESSAGE("world " << world << " gas " << gas << " prefetch " << prefetch << " rank " << r << ": "
                           << four[r].staged << " fetches read ahead, " << four[r].unstaged << " read at the fetch");
        }
      }
    }
  }
  CHECK(fs::is_empty(dir));
  fs::remove_all(dir);
}

}  // namespace test_param_read_ahead
