// N:M sparsity's rule and its masks over ZeRO shards (include/zerotk/sparsity): the rule keeps the N
// largest magnitudes of each group of M (ties to the earlier element, NaN above every number), and
// ShardMasks over the blocks of 1-4 thread ranks gives each rank the flags a serial pass over the
// whole parameters gives, also where a block boundary cuts a group (its edges exchanged).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <numeric>
#include <vector>

#include "../comm/reference.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/sparsity/nm.hpp"
#include "zerotk/sparsity/shard_masks.hpp"
#include "zerotk/zero/layout.hpp"
#include "zerotk/zero/ownership.hpp"

namespace test_nm {

using namespace zerotk;

namespace {

/// The rule written another way: order the group's indices by (magnitude descending, index
/// ascending) with a stable sort, keep the first n.
std::vector<std::uint8_t> serial_keep(const std::vector<float>& v, int n, int m) {
  std::vector<std::uint8_t> keep(v.size(), 0);
  for (std::size_t g = 0; g < v.size(); g += static_cast<std::size_t>(m)) {
    std::vector<std::size_t> idx(static_cast<std::size_t>(m));
    std::iota(idx.begin(), idx.end(), g);
    const auto mag = [&](std::size_t i) { return std::isnan(v[i]) ? INFINITY : std::fabs(v[i]); };
    std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return mag(a) > mag(b); });
    for (int k = 0; k < n; ++k) keep[idx[static_cast<std::size_t>(k)]] = 1;
  }
  return keep;
}

}  // namespace

TEST_CASE("keep_bits: the N largest magnitudes of M, ties to the earlier, NaN largest, exactly N always") {
  const float a[4] = {0.5f, -2.0f, 1.0f, 0.25f};
  CHECK(sparsity::keep_bits(a, 2, 4) == 0b0110u);  // -2 and 1
  const float tie[4] = {1.0f, -1.0f, 1.0f, 1.0f};
  CHECK(sparsity::keep_bits(tie, 2, 4) == 0b0011u);  // equal magnitudes: the first two
  const float zeros[4] = {0.0f, 0.0f, -0.0f, 0.0f};
  CHECK(sparsity::keep_bits(zeros, 2, 4) == 0b0011u);
  const float nan[4] = {1.0f, NAN, 3.0f, 2.0f};
  CHECK(sparsity::keep_bits(nan, 2, 4) == 0b0110u);  // NaN and 3
  const float one_of_8[8] = {1, 2, 3, 9, 4, 5, 6, 7};
  CHECK(sparsity::keep_bits(one_of_8, 1, 8) == 0b1000u);
  // Against the serial form over many random groups, for 2:4, 1:4, 4:8 and 3:5.
  for (const auto& [n, m] : {std::pair{2, 4}, {1, 4}, {4, 8}, {3, 5}}) {
    std::vector<float> v = test::lcg_values(static_cast<std::size_t>(m) * 500, 7, 1.0f, static_cast<std::uint32_t>(n * 31 + m));
    for (std::size_t i = 0; i < v.size(); i += 7) v[i] = v[i + 1 < v.size() ? i + 1 : i];  // some ties
    std::vector<std::uint8_t> keep(v.size());
    sparsity::choose(v.data(), keep.data(), v.size(), n, m);
    CHECK(keep == serial_keep(v, n, m));
    std::vector<float> pruned = v;
    for (std::size_t i = 0; i < v.size(); ++i) pruned[i] = keep[i] ? v[i] : 0.0f;
    CHECK(sparsity::count_kept_violations(pruned.data(), pruned.size(), n, m, [](float x) { return x; }) == 0);
    CHECK(sparsity::count_kept_violations(v.data(), v.size(), n, m, [](float x) { return x; }) > 0);
  }
}

TEST_CASE("ShardMasks over ZeRO blocks: every rank's flags are the serial pass's, groups cut by blocks included") {
  // Parameters of 12, 6 (not sparse), 20, 8 and 16 elements in buckets of <= 24: blocks of 1-4 ranks
  // cut the sparse parameters' groups of 4 in many places.
  const std::vector<std::size_t> numels = {12, 6, 20, 8, 16};
  const std::vector<char> sparse = {1, 0, 1, 1, 1};
  const std::vector<std::uint32_t> groups(numels.size(), 0);
  std::vector<std::vector<float>> whole;
  for (std::size_t i = 0; i < numels.size(); ++i) whole.push_back(test::lcg_values(numels[i], 11, 1.0f, static_cast<std::uint32_t>(i)));
  whole[2][5] = whole[2][6];  // a tie inside a cut group
  for (int world : {1, 2, 3, 4}) {
    CAPTURE(world);
    const zero::BucketLayout layout(numels, groups, world, 24);
    std::vector<std::vector<std::uint8_t>> got(numels.size());
    for (std::size_t i = 0; i < numels.size(); ++i) got[i].assign(numels[i], 9);
    std::mutex mu;
    std::size_t exchanged = 0;
    comm::run_threads(world, [&](comm::ThreadsCommunicator& c) {
      const std::vector<zero::Fragment> frags = zero::OwnsBlocks::fragments(layout, c.rank());
      std::vector<float> master(zero::OwnsBlocks::numel(layout), 0.0f);
      for (const zero::Fragment& f : frags) {
        for (std::size_t j = 0; j < f.numel; ++j) master[f.owned_offset + j] = whole[f.param][f.param_offset + j];
      }
      MemoryLedger ledger;
      sparsity::ShardMasks masks(2, 4, layout, frags, sparse, master.size(), c.rank(), false, &ledger);
      CHECK(ledger.live(MemorySpace::host, MemoryCategory::other) == master.size());  // one byte per owned element
      CHECK_FALSE(masks.chosen());
      masks.choose(master.data(), c);
      CHECK(masks.chosen());
      std::lock_guard lock(mu);
      exchanged = c.stats()[comm::OpKind::all_gather].payload_bytes;
      for (const zero::Fragment& f : frags) {
        for (std::size_t j = 0; j < f.numel; ++j) got[f.param][f.param_offset + j] = masks.keep()[f.owned_offset + j];
      }
    });
    for (std::size_t i = 0; i < numels.size(); ++i) {
      CAPTURE(i);
      CHECK(got[i] == (sparse[i] ? serial_keep(whole[i], 2, 4) : std::vector<std::uint8_t>(numels[i], 1)));
    }
    // One all-gather of every rank's block edges: 2 (M - 1) floats per bucket per rank.
    CHECK(exchanged == static_cast<std::size_t>(world) * layout.buckets().size() * 2 * 3 * sizeof(float));
  }
}

TEST_CASE("ShardMasks over blocks shorter than M - 1: a group spans three or more blocks, every rank still agrees") {
  // Buckets of 8 elements over 4 ranks: blocks of 2, so a group of 4 covers two blocks, and with
  // 4:8 a group of 8 covers four; parameters of 8 and 16 (not sparse: 6).
  const std::vector<std::size_t> numels = {8, 6, 16};
  const std::vector<char> sparse = {1, 0, 1};
  const std::vector<std::uint32_t> groups(numels.size(), 0);
  std::vector<std::vector<float>> whole;
  for (std::size_t i = 0; i < numels.size(); ++i) whole.push_back(test::lcg_values(numels[i], 13, 1.0f, static_cast<std::uint32_t>(i)));
  for (const auto& [n, m] : {std::pair{2, 4}, {4, 8}, {3, 8}}) {
    CAPTURE(m);
    const zero::BucketLayout layout(numels, groups, 4, 8);
    std::vector<std::vector<std::uint8_t>> got(numels.size());
    for (std::size_t i = 0; i < numels.size(); ++i) got[i].assign(numels[i], 9);
    std::mutex mu;
    comm::run_threads(4, [&](comm::ThreadsCommunicator& c) {
      const std::vector<zero::Fragment> frags = zero::OwnsBlocks::fragments(layout, c.rank());
      std::vector<float> master(zero::OwnsBlocks::numel(layout), 0.0f);
      for (const zero::Fragment& f : frags) {
        for (std::size_t j = 0; j < f.numel; ++j) master[f.owned_offset + j] = whole[f.param][f.param_offset + j];
      }
      sparsity::ShardMasks masks(n, m, layout, frags, sparse, master.size(), c.rank(), false, nullptr);
      masks.choose(master.data(), c);
      std::lock_guard lock(mu);
      for (const zero::Fragment& f : frags) {
        for (std::size_t j = 0; j < f.numel; ++j) got[f.param][f.param_offset + j] = masks.keep()[f.owned_offset + j];
      }
    });
    CHECK(std::any_of(layout.buckets().begin(), layout.buckets().end(),
                      [&](const zero::Bucket& b) { return b.block < static_cast<std::size_t>(m - 1); }));
    for (std::size_t i = 0; i < numels.size(); ++i) {
      CAPTURE(i);
      CHECK(got[i] == (sparse[i] ? serial_keep(whole[i], n, m) : std::vector<std::uint8_t>(numels[i], 1)));
    }
  }
}

TEST_CASE("ShardMasks: zero_pruned writes zeros where the masks prune, through the segments' places; load and reset") {
  const std::vector<std::size_t> numels = {8, 4};
  const std::vector<std::uint32_t> groups = {0, 0};
  const zero::BucketLayout layout(numels, groups, 1, 100);
  std::vector<float> master = {4, 1, 3, 2, -5, 6, 0.5f, 0.25f, 9, 9, 9, 9};
  master.resize(layout.flat_numel(), 0.0f);
  comm::run_threads(1, [&](comm::ThreadsCommunicator& c) {
    sparsity::ShardMasks masks(2, 4, layout, zero::OwnsAll::fragments(layout, 0), {1, 0}, master.size(), 0, true, nullptr);
    const auto segments = zero::OwnsAll::segments(layout, 0, {});
    std::vector<float> values = master;
    masks.zero_pruned(values.data(), segments, [](const kernels::Segment& s) { return s.offset; });
    CHECK(values == master);  // nothing pruned before the masks are chosen
    masks.choose(master.data(), c);
    CHECK(masks.pruned() == 4);
    masks.zero_pruned(values.data(), segments, [](const kernels::Segment& s) { return s.offset; });
    CHECK(std::vector<float>(values.begin(), values.begin() + 12) ==
          std::vector<float>{4, 0, 3, 0, -5, 6, 0, 0, 9, 9, 9, 9});  // the second parameter is not sparse
    std::vector<bfloat16> half(master.size());
    for (std::size_t i = 0; i < half.size(); ++i) half[i] = from_float<bfloat16>(master[i]);
    masks.zero_pruned(half.data(), segments, [](const kernels::Segment& s) { return s.offset; });
    CHECK(to_float(half[1]) == 0.0f);
    CHECK(to_float(half[0]) == 4.0f);
    const std::vector<std::uint8_t> saved(masks.keep().begin(), masks.keep().end());
    masks.reset();
    CHECK_FALSE(masks.chosen());
    CHECK(masks.pruned() == 0);
    masks.load(saved);
    CHECK(masks.pruned() == 4);
    CHECK_THROWS_AS(masks.load(std::vector<std::uint8_t>(3, 1)), usage_error);
  });
  CHECK_THROWS_AS(sparsity::ShardMasks(2, 4, zero::BucketLayout(std::vector<std::size_t>{6}, std::vector<std::uint32_t>{0}, 1, 100),
                                       {}, {1}, 8, 0, true, nullptr),
                  usage_error);  // 6 elements: not whole groups of 4
}

}  // namespace test_nm
