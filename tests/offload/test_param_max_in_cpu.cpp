// OffloadParams<Nvme> with `offload_param.max_in_cpu` (offload/nvme_shard.hpp): the blocks of the
// first buckets, as many as fit whole in max_in_cpu elements, are kept in host memory as well.
//  - NvmeShard alone: which blocks are kept and the host memory they take (in the ledger); their
//    fetches read nothing from the file (proved with every read of the file failing) through
//    writes, committed and aborted transactions and failed writes; an aborted transaction's blocks
//    are read from the file once; read-ahead skips them.
//  - The engine (W = 1..3): bitwise the parameters of max_in_cpu 0 and of OffloadParams<None>;
//    DeepSpeed's default keeps this model's whole shard in memory (no fetch reads the file), a
//    partial share serves exactly the kept buckets' fetches from memory.
//  - One budget over both groups (fp32-kept parameters form the second): the working-precision
//    group's blocks first, the fp32 group's from what is left, as DeepSpeed counts its groups.
#include <doctest/doctest.h>

#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "engine_fixture.hpp"
#include "offload_runs.hpp"
#include "shard_fixture.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/engine.hpp"

using namespace zerotk;
using namespace zt_test;
using namespace zt_test::shard;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) { return shard::scratch_dir("max_in_cpu." + name); }

/// Host bytes of blocks [0, n): each padded to the 4 KiB of O_DIRECT, as in the file.
std::size_t padded_bytes(const Fixture& f, std::size_t n) {
  std::size_t b = 0;
  for (std::size_t k = 0; k < n; ++k) b += (f.block(k) * sizeof(float) + 4095) / 4096 * 4096;
  return b;
}

/// Sets the fault hook for the life of the object: every read (and, if asked, write) of a shard
/// file fails.
struct FailingFile {
  explicit FailingFile(bool writes = false) {
    g_fail_reads = true;
    g_fail_writes = writes;
    io::set_fault_hook(&fault_hook);
  }
  ~FailingFile() {
    g_fail_reads = false;
    g_fail_writes = false;
    io::set_fault_hook(nullptr);
  }
};

}  // namespace

TEST_CASE("max_in_cpu keeps the blocks of the first buckets that fit whole; the ledger shows their host memory") {
  const fs::path dir = scratch("which");
  Fixture f;
  REQUIRE(f.buckets() == 6);
  const std::size_t b0 = f.block(0), b01 = b0 + f.block(1);
  std::size_t all = 0;
  for (std::size_t k = 0; k < f.buckets(); ++k) all += f.block(k);
  struct Case {
    std::size_t max_in_cpu, kept;
  };
  for (const Case c : {Case{0, 0}, Case{b0 - 1, 0}, Case{b0, 1}, Case{b01 - 1, 1}, Case{b01, 2}, Case{all - 1, 5},
                       Case{all, 6}, Case{1'000'000'000, 6}}) {
    CAPTURE(c.max_in_cpu);
    const std::size_t before = f.ledger.live(MemorySpace::pinned_host, MemoryCategory::params16);
    {
      Shard s(f.ops, f.layout, 0, &f.ledger, f.options(dir, 3, c.max_in_cpu));
      CHECK(s.blocks_in_cpu() == c.kept);
      CHECK(s.held_bytes() == padded_bytes(f, c.kept));
      CHECK(f.ledger.live(MemorySpace::pinned_host, MemoryCategory::params16) - before == padded_bytes(f, c.kept));
      for (std::size_t k = 0; k < f.buckets(); ++k) {
        CAPTURE(k);
        CHECK(s.reads_file(k));  // nothing is held before the first write
      }
      f.write_all(s, 1);
      for (std::size_t k = 0; k < f.buckets(); ++k) {
        CAPTURE(k);
        CHECK(s.reads_file(k) == (k >= c.kept));
      }
    }
    CHECK(f.ledger.live(MemorySpace::pinned_host, MemoryCategory::params16) == before);
  }
  fs::remove_all(dir);
}

TEST_CASE("max_in_cpu: kept blocks are fetched without reading the file, through writes, commits, aborts and failed writes") {
  const fs::path dir = scratch("values");
  Fixture f;
  const std::size_t kept = 3;
  Shard s(f.ops, f.layout, 0, &f.ledger, f.options(dir, 3, f.block(0) + f.block(1) + f.block(2)));
  REQUIRE(s.blocks_in_cpu() == kept);
  f.write_all(s, 1);
  std::vector<float> slot(f.block(3));
  {
    FailingFile no_reads;
    for (std::size_t k = 0; k < kept; ++k) CHECK(f.fetched_is(s, k, 1));
    CHECK(s.stats().in_cpu == kept);
    CHECK_THROWS_AS(s.gather_source(f.ops, 3, slot.data()), io_error);  // not kept: read, and the read fails
  }
  CHECK(f.fetched_is(s, 3, 1));
  CHECK(s.stats().unstaged == 2);  // the failed read and this one

  // write(k) of a kept block: the new values are held (and in the file).
  s.write(1, [&](float* b) {
    for (std::size_t i = 0; i < f.block(1); ++i) b[i] = f.value(1, i, 2);
  });
  {
    FailingFile no_reads;
    CHECK(f.fetched_is(s, 1, 2));
  }

  // A committed transaction: every kept block is its new values in memory.
  f.write_through_writer(s, 3);
  s.commit();
  {
    FailingFile no_reads;
    for (std::size_t k = 0; k < kept; ++k) CHECK(f.fetched_is(s, k, 3));
  }
  CHECK(f.fetched_is(s, 4, 3));

  // A block written in two parts within one transaction (two sub-groups): the second part starts
  // from the first, kept in memory, not read back from the file.
  {
    FailingFile no_reads;
    const std::size_t half = f.block(0) / 2;
    std::vector<float> v(f.block(0));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = f.value(0, i, 4);
    s.writer().write(f.layout.buckets()[0].part_offset, v.data(), half);
    s.writer().end_sub_group();
    s.writer().write(f.layout.buckets()[0].part_offset + half, v.data() + half, v.size() - half);
    s.writer().end_sub_group();
    s.commit();
    CHECK(f.fetched_is(s, 0, 4));
    CHECK(f.fetched_is(s, 1, 3));  // untouched
  }

  // An aborted transaction changes nothing; its kept blocks are read from the file once, then held.
  const std::uint64_t in_cpu = s.stats().in_cpu, unstaged = s.stats().unstaged;
  f.write_through_writer(s, 5);
  s.abort();
  for (std::size_t k = 1; k < kept; ++k) CHECK(f.fetched_is(s, k, 3));
  CHECK(s.stats().unstaged == unstaged + (kept - 1));
  CHECK(s.stats().in_cpu == in_cpu);
  {
    FailingFile no_reads;
    for (std::size_t k = 1; k < kept; ++k) CHECK(f.fetched_is(s, k, 3));
  }
  CHECK(f.fetched_is(s, 0, 4));  // block 0 was not held after the abort either: read again

  // A failed write leaves the kept block's values, still served from memory.
  {
    FailingFile no_reads_or_writes(true);
    CHECK_THROWS_AS(s.write(2, [&](float* b) {
      for (std::size_t i = 0; i < f.block(2); ++i) b[i] = f.value(2, i, 6);
    }),
                    io_error);
    CHECK(f.fetched_is(s, 2, 3));
    CHECK_THROWS_AS(f.write_through_writer(s, 7), io_error);  // the first flush fails; the engine aborts
    s.abort();
  }
  CHECK(f.fetched_is(s, 2, 3));
  CHECK(f.fetched_is(s, 5, 3));

  // Read-ahead names kept blocks only if they are stale: here 0 and 2 are held, so only 4 is read.
  const std::size_t ahead[] = {0, 2, 4};
  const std::uint64_t staged = s.stats().staged;
  s.stage_ahead(ahead);
  CHECK(f.fetched_is(s, 4, 3));
  CHECK(s.stats().staged == staged + 1);
  fs::remove_all(dir);
}

TEST_CASE("max_in_cpu: a staged copy of a block held again is dropped, so a fetch always finds a free buffer") {
  const fs::path dir = scratch("staged_then_held");
  Fixture f;
  Shard s(f.ops, f.layout, 0, &f.ledger, f.options(dir, 2, f.block(0)));  // one read-ahead buffer; block 0 kept
  REQUIRE(s.blocks_in_cpu() == 1);
  f.write_all(s, 1);
  f.write_through_writer(s, 2);
  s.abort();  // block 0's copy is of the abandoned slot: its next fetch reads the file
  CHECK(s.reads_file(0));
  const std::size_t zero[] = {0};
  s.stage_ahead(zero);
  s.read(0, [&](const float* b) { CHECK(b[0] == f.value(0, 0, 1)); });  // held again; the staged copy goes
  CHECK_FALSE(s.reads_file(0));
  const std::size_t both[] = {0, 1};
  s.stage_ahead(both);  // 0 needs no read: 1 takes the read-ahead buffer
  CHECK(f.fetched_is(s, 2, 1));  // unforeseen: read into the buffer read-ahead leaves free
  CHECK(f.fetched_is(s, 1, 1));
  CHECK(f.fetched_is(s, 0, 1));
  CHECK(s.stats().staged == 1);
  CHECK(s.stats().unstaged == 1);
  CHECK(s.stats().in_cpu == 1);
  // The same through a fetch: block 0 staged while stale, then held by a write.
  f.write_through_writer(s, 3);
  s.abort();
  s.stage_ahead(zero);
  s.write(0, [&](float* b) {
    for (std::size_t i = 0; i < f.block(0); ++i) b[i] = f.value(0, i, 4);
  });
  s.stage_ahead(both);
  CHECK(f.fetched_is(s, 3, 1));
  CHECK(f.fetched_is(s, 0, 4));
  CHECK(f.fetched_is(s, 1, 1));
  fs::remove_all(dir);
}

TEST_CASE("NvmeShard: write() inside the writer's transaction, between sub-groups too, is refused with nothing changed") {
  for (std::size_t max_in_cpu : {std::size_t{0}, std::size_t{1'000'000}}) {  // blocks in the file only; all held
    CAPTURE(max_in_cpu);
    const fs::path dir = scratch("write_in_transaction");
    Fixture f;
    Shard s(f.ops, f.layout, 0, &f.ledger, f.options(dir, 2, max_in_cpu));
    f.write_all(s, 1);
    auto write_gen = [&](std::size_t k, int g) {
      s.write(k, [&](float* b) {
        for (std::size_t i = 0; i < f.block(k); ++i) b[i] = f.value(k, i, g);
      });
    };
    // Block 0 written by the writer, its sub-group ended (nothing open, the transaction is): a
    // write() of it, or of any block, would flip a slot under the transaction.
    std::vector<float> v(f.block(0));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = f.value(0, i, 2);
    s.writer().write(f.layout.buckets()[0].part_offset, v.data(), v.size());
    CHECK_THROWS_WITH_AS(write_gen(3, 9), doctest::Contains("commit() or abort() it first"), usage_error);  // open
    s.writer().end_sub_group();
    CHECK_THROWS_WITH_AS(write_gen(0, 9), doctest::Contains("bucket 0"), usage_error);
    CHECK_THROWS_AS(write_gen(3, 9), usage_error);
    for (std::size_t k = 0; k < f.buckets(); ++k) CHECK(f.fetched_is(s, k, 1));  // nothing changed
    s.commit();
    CHECK(f.fetched_is(s, 0, 2));
    CHECK(f.fetched_is(s, 3, 1));
    write_gen(3, 4);  // closed again: allowed
    CHECK(f.fetched_is(s, 3, 4));
    f.write_through_writer(s, 5);
    s.abort();
    write_gen(0, 6);  // and after an abort
    CHECK(f.fetched_is(s, 0, 6));
    CHECK(f.fetched_is(s, 1, 1));
    fs::remove_all(dir);
  }
}

TEST_CASE("the engine with max_in_cpu: the bits of max_in_cpu 0 and OffloadParams<None>; kept buckets read nothing") {
  const fs::path dir = scratch("engine");
  for (int world : {1, 2, 3}) {
    CAPTURE(world);
    RunConfig cfg;
    cfg.world = world;
    cfg.steps = 4;
    cfg.stage3.param_persistence_threshold = 0;
    EngineOptions o = engine_options(cfg);
    o.nvme.path = dir;
    o.param_nvme.path = dir;
    struct Seen {
      offload::ParamReadStats stats;
      std::size_t pinned16 = 0;  // the ledger's params16 in pinned host memory
    };
    auto run = [&](std::size_t max_in_cpu, std::vector<Seen>& seen) {
      o.param_nvme.max_in_cpu = max_in_cpu;
      seen.assign(static_cast<std::size_t>(world), {});
      std::mutex mu;
      return train_with<3, fp16, Offload<Nvme>, OffloadParams<Nvme>>(cfg, o, [&](const auto& e) {
        std::lock_guard lock(mu);
        Seen& s = seen[static_cast<std::size_t>(e.rank())];
        s.stats = e.param_read_stats();
        s.pinned16 = e.memory().live(MemorySpace::pinned_host, MemoryCategory::params16);
        return true;
      });
    };
    // The MLP's six tensors are six buckets; 160 / world elements keep the blocks of some (three,
    // at every world size here), not all.
    std::vector<Seen> none, some, all;
    const RunResult on_disk = run(0, none);
    const RunResult partial = run(160 / static_cast<std::size_t>(world), some);
    const RunResult in_cpu = run(1'000'000'000, all);
    const RunResult ref = train_with<3, fp16, Offload<Nvme>, OffloadParams<None>>(cfg, o, [](const MemoryLedger&) { return true; });
    REQUIRE(ref.ranks_agree);
    check_same_run(on_disk, ref);
    check_same_run(partial, ref);
    check_same_run(in_cpu, ref);
    for (int r = 0; r < world; ++r) {
      CAPTURE(r);
      const Seen &n = none[static_cast<std::size_t>(r)], &p = some[static_cast<std::size_t>(r)],
                 &a = all[static_cast<std::size_t>(r)];
      const std::uint64_t fetches = n.stats.staged + n.stats.unstaged;
      CHECK(n.stats.in_cpu == 0);
      // DeepSpeed's default keeps every block: no fetch reads the file.
      CHECK(a.stats.staged + a.stats.unstaged == 0);
      CHECK(a.stats.in_cpu == fetches);
      // A partial share: the same fetches, some from memory and some from the file.
      CHECK(p.stats.in_cpu > 0);
      CHECK(p.stats.staged + p.stats.unstaged > 0);
      CHECK(p.stats.in_cpu + p.stats.staged + p.stats.unstaged == fetches);
      // The kept blocks' host memory, in the ledger: more blocks kept, more memory.
      CHECK(p.pinned16 > n.pinned16);
      CHECK(a.pinned16 > p.pinned16);
      MESSAGE("world " << world << " rank " << r << ": " << p.stats.in_cpu << " of " << fetches
                       << " fetches from memory; kept blocks " << p.pinned16 - n.pinned16 << " of " << a.pinned16 - n.pinned16
                       << " bytes");
    }
  }
  CHECK(fs::is_empty(dir));
  fs::remove_all(dir);
}

TEST_CASE("the engine with max_in_cpu: one budget over both groups, the working-precision group's blocks first") {
  const fs::path dir = scratch("two_groups");
  RunConfig cfg;
  cfg.world = 2;
  cfg.steps = 3;
  cfg.stage3.param_persistence_threshold = 0;
  EngineOptions o = engine_options(cfg);
  o.nvme.path = dir;
  o.param_nvme.path = dir;
  o.keep_fp32 = [](std::string_view name) { return name.ends_with(".bias"); };  // the second group
  struct Seen {
    offload::ParamReadStats stats;
    std::size_t bytes_in_cpu = 0;
    std::vector<std::uint64_t> owned;  // [group]: this rank's shard, the sum of its blocks
  };
  auto run = [&](std::size_t max_in_cpu) {
    o.param_nvme.max_in_cpu = max_in_cpu;
    std::vector<Seen> seen(2);
    std::mutex mu;
    const RunResult r = train_with<3, fp16, Offload<Nvme>, OffloadParams<Nvme>, Mlp<float>>(cfg, o, [&](const auto& e) {
      std::lock_guard lock(mu);
      Seen& s = seen[static_cast<std::size_t>(e.rank())];
      s.stats = e.param_read_stats();
      s.bytes_in_cpu = e.param_bytes_in_cpu();
      for (const auto& g : e.shard_table().owned_numel) s.owned.push_back(g[static_cast<std::size_t>(e.rank())]);
      return true;
    });
    REQUIRE(r.ranks_agree);
    return std::pair{r, seen};
  };
  const auto [all_run, all] = run(1'000'000'000);
  REQUIRE(all[0].owned.size() == 2);
  const std::uint64_t main_total = all[0].owned[0], f32_total = all[0].owned[1];
  REQUIRE(main_total > 0);
  REQUIRE(f32_total > 0);
  REQUIRE(f32_total <= main_total);  // a budget per group would then keep both groups whole
  // Exactly the working-precision group's blocks: the fp32 group keeps none and reads its own.
  const auto [main_run, main_only] = run(main_total);
  // Both groups' blocks: nothing is read from the file.
  const auto [both_run, both] = run(main_total + f32_total);
  check_same_run(main_run, all_run);
  check_same_run(both_run, all_run);
  for (std::size_t r = 0; r < 2; ++r) {
    CAPTURE(r);
    const std::uint64_t fetches = all[r].stats.in_cpu;
    CHECK(all[r].stats.staged + all[r].stats.unstaged == 0);
    CHECK(both[r].stats.staged + both[r].stats.unstaged == 0);
    CHECK(both[r].bytes_in_cpu == all[r].bytes_in_cpu);
    const offload::ParamReadStats& m = main_only[r].stats;
    CHECK(m.in_cpu > 0);
    CHECK(m.staged + m.unstaged > 0);
    CHECK(m.in_cpu + m.staged + m.unstaged == fetches);
    CHECK(main_only[r].bytes_in_cpu < all[r].bytes_in_cpu);
  }
  CHECK(fs::is_empty(dir));
  fs::remove_all(dir);
}
