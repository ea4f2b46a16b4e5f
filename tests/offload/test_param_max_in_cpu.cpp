// OffloadParams<Nvme> with `offload_param.max_in_cpu` (offload/nvme_shard.hpp): the blocks of the
// first buckets, as many as fit whole in max_in_cpu elements, live in host memory (two copies)
// instead of the file.
//  - NvmeShard alone: which blocks are kept, the host memory they take (in the ledger) and the file
//    the others take; the kept blocks ask the file for no read and no write (every request counted
//    and failing) through writes, committed and aborted transactions and a transaction whose file
//    block fails to write, and keep their values through those; read-ahead skips them.
//  - The engine (W = 1..3): bitwise the parameters of max_in_cpu 0 and of OffloadParams<None>;
//    DeepSpeed's default keeps this model's whole shard in memory (a run with every request to the
//    shard files failing trains the same bits: none is made), a partial share serves exactly the
//    kept buckets' fetches from memory.
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

namespace test_param_max_in_cpu {  // the file's own names, apart from its suite's other files in a unity build

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

TEST_CASE("max_in_cpu keeps the blocks of the first buckets that fit whole in memory, two copies each, and the file the rest") {
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
    std::size_t kept_bytes = 0;
    for (std::size_t k = 0; k < c.kept; ++k) kept_bytes += f.block(k) * sizeof(float);
    // The file: two slots of the other blocks, each padded to 4 KiB; at least one page a slot.
    const std::size_t file_bytes = 2 * std::max<std::size_t>(padded_bytes(f, f.buckets()) - padded_bytes(f, c.kept), 4096);
    const std::size_t before = f.ledger.live(MemorySpace::pinned_host, MemoryCategory::params16);
    {
      Shard s(f.ops, f.layout, 0, &f.ledger, f.options(dir, 3, c.max_in_cpu));
      CHECK(s.blocks_in_cpu() == c.kept);
      CHECK(s.held_bytes() == 2 * kept_bytes);
      CHECK(f.ledger.live(MemorySpace::pinned_host, MemoryCategory::params16) - before == 2 * kept_bytes);
      CHECK(s.disk_bytes() == file_bytes);
      std::uintmax_t on_disk = 0;
      for (const fs::directory_entry& e : fs::directory_iterator(dir)) on_disk += e.file_size();
      CHECK(on_disk == file_bytes);
      for (std::size_t k = 0; k < f.buckets(); ++k) {
        CAPTURE(k);
        CHECK(s.reads_file(k) == (k >= c.kept));
      }
      f.write_all(s, 1);
      for (std::size_t k = 0; k < f.buckets(); ++k) CHECK(f.fetched_is(s, k, 1));
    }
    CHECK(f.ledger.live(MemorySpace::pinned_host, MemoryCategory::params16) == before);
  }
  fs::remove_all(dir);
}

TEST_CASE("max_in_cpu: kept blocks never touch the file, through writes, commits, aborts and failed writes") {
  const fs::path dir = scratch("values");
  Fixture f;
  const std::size_t kept = 3;
  Shard s(f.ops, f.layout, 0, &f.ledger, f.options(dir, 3, f.block(0) + f.block(1) + f.block(2)));
  REQUIRE(s.blocks_in_cpu() == kept);
  f.write_all(s, 1);
  std::vector<float> slot(f.block(3));
  auto write_gen = [&](std::size_t k, int g) {
    s.write(k, [&](float* b) {
      for (std::size_t i = 0; i < f.block(k); ++i) b[i] = f.value(k, i, g);
    });
  };
  // The writer's output for blocks [0, n): generation g, one sub-group.
  auto write_leading = [&](std::size_t n, int g) {
    for (std::size_t k = 0; k < n; ++k) {
      std::vector<float> v(f.block(k));
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = f.value(k, i, g);
      s.writer().write(f.layout.buckets()[k].part_offset, v.data(), v.size());
    }
    s.writer().end_sub_group();
  };
  {
    // Every read and write of the file fails, and each is counted: the kept blocks ask for none.
    FailingFile no_io(true);
    g_reads = 0;
    g_writes = 0;
    for (std::size_t k = 0; k < kept; ++k) CHECK(f.fetched_is(s, k, 1));
    CHECK(s.stats().in_cpu == kept);
    write_gen(1, 2);  // write(k) of a kept block
    CHECK(f.fetched_is(s, 1, 2));
    s.read(1, [&](const float* b) { CHECK(b[f.block(1) - 1] == f.value(1, f.block(1) - 1, 2)); });
    write_leading(kept, 3);  // a transaction over the kept blocks only, committed
    s.commit();
    for (std::size_t k = 0; k < kept; ++k) CHECK(f.fetched_is(s, k, 3));
    // A block written in two parts within one transaction (two sub-groups): the second part
    // starts from the first, in the other copy.
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
    // An aborted transaction leaves the kept blocks as they were, served from memory.
    write_leading(kept, 5);
    s.abort();
    CHECK(f.fetched_is(s, 0, 4));
    for (std::size_t k = 1; k < kept; ++k) CHECK(f.fetched_is(s, k, 3));
    CHECK(g_reads == 0);
    CHECK(g_writes == 0);
    // Not kept: read, and the read fails.
    CHECK_THROWS_AS(s.gather_source(f.ops, 3, slot.data()), io_error);
    CHECK(g_reads == 1);
  }
  CHECK(f.fetched_is(s, 3, 1));
  CHECK(s.stats().unstaged == 2);  // the failed read and this one

  // A committed transaction over every block.
  f.write_through_writer(s, 6);
  s.commit();
  for (std::size_t k = 0; k < f.buckets(); ++k) CHECK(f.fetched_is(s, k, 6));

  // A transaction whose first file block fails to write, after the kept blocks' new values are in
  // their other copies: aborted, every block keeps its values.
  {
    FailingFile no_io(true);
    CHECK_THROWS_AS(f.write_through_writer(s, 7), io_error);
    s.abort();
    for (std::size_t k = 0; k < kept; ++k) CHECK(f.fetched_is(s, k, 6));
    CHECK_THROWS_AS(write_gen(4, 8), io_error);  // write() of a file block
    CHECK_NOTHROW(write_gen(2, 8));              // of a kept block: no I/O to fail
  }
  CHECK(f.fetched_is(s, 2, 8));
  for (std::size_t k : {0, 1, 3, 4, 5}) CHECK(f.fetched_is(s, k, 6));
  // After the abort block 0's other copy holds generation 7; the next transaction starts the block
  // afresh (zeros where it writes nothing, as for a file block), not from those.
  {
    const std::size_t half = f.block(0) / 2;
    std::vector<float> v(half);
    for (std::size_t i = 0; i < half; ++i) v[i] = f.value(0, i, 9);
    s.writer().write(f.layout.buckets()[0].part_offset, v.data(), half);
    s.writer().end_sub_group();
    s.commit();
    s.read(0, [&](const float* b) {
      CHECK(b[half - 1] == f.value(0, half - 1, 9));
      CHECK(b[half] == 0.0f);
      CHECK(b[f.block(0) - 1] == 0.0f);
    });
  }
  f.write_through_writer(s, 9);
  s.commit();
  for (std::size_t k = 0; k < f.buckets(); ++k) CHECK(f.fetched_is(s, k, 9));

  // Read-ahead names kept blocks, but reads only the others: here only 4.
  const std::size_t ahead[] = {0, 2, 4};
  const std::uint64_t staged = s.stats().staged;
  s.stage_ahead(ahead);
  CHECK(f.fetched_is(s, 4, 9));
  CHECK(s.stats().staged == staged + 1);
  fs::remove_all(dir);
}

TEST_CASE("max_in_cpu: a kept block never takes a read-ahead buffer, so a fetch always finds a free one") {
  const fs::path dir = scratch("staged_and_kept");
  Fixture f;
  Shard s(f.ops, f.layout, 0, &f.ledger, f.options(dir, 2, f.block(0)));  // one read-ahead buffer; block 0 kept
  REQUIRE(s.blocks_in_cpu() == 1);
  f.write_all(s, 1);
  const std::size_t both[] = {0, 1};
  s.stage_ahead(both);  // 0 needs no read: 1 takes the read-ahead buffer
  CHECK(f.fetched_is(s, 2, 1));  // unforeseen: read into the buffer read-ahead leaves free
  CHECK(f.fetched_is(s, 1, 1));
  CHECK(f.fetched_is(s, 0, 1));
  CHECK(s.stats().staged == 1);
  CHECK(s.stats().unstaged == 1);
  CHECK(s.stats().in_cpu == 1);
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
    // DeepSpeed's default: this model's whole shard in memory. Every request to the shard files
    // fails and is counted: none is made, and the run trains the same bits.
    const RunResult in_cpu = [&] {
      FailingFile no_io(true);
      g_reads = 0;
      g_writes = 0;
      RunResult r = run(1'000'000'000, all);
      CHECK(g_reads == 0);
      CHECK(g_writes == 0);
      return r;
    }();
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

}  // namespace test_param_max_in_cpu
