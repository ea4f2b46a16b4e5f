// BucketLayout: buckets, padding and partitions, checked against a direct element-by-element model.
#include <doctest/doctest.h>

#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "zerotk/zero/layout.hpp"
#include "zerotk/kernels/host/reduce.hpp"

using namespace zerotk;
using zero::BucketLayout;

namespace {
BucketLayout make(const std::vector<std::size_t>& numels, int world, std::size_t bucket) {
  std::vector<std::uint32_t> groups(numels.size(), 0);
  return BucketLayout(numels, groups, world, bucket);
}
}  // namespace

TEST_CASE("layout invariants over random models, worlds and bucket sizes") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int world = 1 + static_cast<int>(rng() % 8);
    std::vector<std::size_t> numels(1 + rng() % 12);
    for (auto& n : numels) n = rng() % 5 == 0 ? 0 : 1 + rng() % 300;
    const std::size_t bucket = 1 + rng() % 700;
    const BucketLayout L = make(numels, world, bucket);
    CAPTURE(trial);

    // Parameters are laid out in visitation order, do not overlap, and fit inside their bucket.
    std::size_t prev_end = 0;
    for (std::size_t i = 0; i < numels.size(); ++i) {
      const auto& p = L.param(i);
      CHECK(p.numel == numels[i]);
      CHECK(p.flat_offset >= prev_end);
      prev_end = p.flat_offset + p.numel;
      const auto& b = L.buckets()[p.bucket];
      CHECK(p.flat_offset >= b.flat_offset);
      CHECK(p.flat_offset + p.numel <= b.flat_offset + b.used);
    }
    // Buckets: padded to 2W, W equal blocks, capacity respected unless a single parameter is larger,
    // and bucket 0 holds the LAST parameter (it fills first in backward).
    std::size_t total = 0, part = 0;
    for (const auto& b : L.buckets()) {
      CHECK(b.numel % (2 * static_cast<std::size_t>(world)) == 0);
      CHECK(b.block * static_cast<std::size_t>(world) == b.numel);
      CHECK(b.used <= b.numel);
      CHECK(b.numel - b.used <= 2 * static_cast<std::size_t>(world));
      std::size_t nonempty = 0;
      for (auto i : b.params) nonempty += numels[i] > 0;
      if (nonempty > 1) CHECK(b.used <= bucket);  // only a lone parameter may exceed the capacity
      total += b.numel;
      part += b.block;
    }
    CHECK(L.buckets()[0].params.back() == numels.size() - 1);
    CHECK(total == L.flat_numel());
    CHECK(part == L.partition_numel());
    CHECK(L.partition_numel() * static_cast<std::size_t>(world) == L.flat_numel());

    // Every parameter element is owned by exactly one rank, and partition segments map back to it.
    std::vector<int> owner(L.flat_numel(), -1);
    for (int r = 0; r < world; ++r) {
      std::vector<char> seen(L.partition_numel(), 0);
      for (const auto& s : L.partition_segments(r)) {
        const auto& p = L.param(s.tensor);
        const auto& b = L.buckets()[p.bucket];
        REQUIRE(s.offset + s.numel <= L.partition_numel());
        const std::size_t flat = L.block_flat_offset(p.bucket, r) + (s.offset - b.part_offset);
        for (std::size_t e = 0; e < s.numel; ++e) {
          CHECK(owner[flat + e] == -1);
          owner[flat + e] = r;
          CHECK(flat + e >= p.flat_offset);
          CHECK(flat + e < p.flat_offset + p.numel);
          CHECK(seen[s.offset + e] == 0);
          seen[s.offset + e] = 1;
        }
      }
    }
    std::size_t owned = 0;
    for (std::size_t i = 0; i < numels.size(); ++i) {
      const auto& p = L.param(i);
      for (std::size_t e = 0; e < p.numel; ++e) owned += owner[p.flat_offset + e] >= 0;
    }
    CHECK(owned == std::accumulate(numels.begin(), numels.end(), std::size_t{0}));
  }
}

TEST_CASE("one bucket covering the model is DeepSpeed's layout: W contiguous partitions, padded to 2W") {
  const BucketLayout L = make({10, 7, 5}, 4, 1000);
  REQUIRE(L.buckets().size() == 1);
  CHECK(L.flat_numel() == 24);  // 22 -> next multiple of 8
  CHECK(L.partition_numel() == 6);
  CHECK(L.param(0).flat_offset == 0);
  CHECK(L.param(1).flat_offset == 10);
  CHECK(L.param(2).flat_offset == 17);
  // rank 1 owns flat [6, 12): param 0 elements 6..9 and param 1 elements 0..1
  auto segs = L.partition_segments(1);
  REQUIRE(segs.size() == 2);
  CHECK(segs[0].tensor == 0);
  CHECK(segs[0].offset == 0);
  CHECK(segs[0].numel == 4);
  CHECK(segs[1].tensor == 1);
  CHECK(segs[1].offset == 4);
  CHECK(segs[1].numel == 2);
}

TEST_CASE("a parameter larger than the bucket goes alone; small ones share") {
  const BucketLayout L = make({3, 100, 4, 5}, 2, 10);
  // backwards: [5, 4] share (9 <= 10), [100] alone, [3] alone
  REQUIRE(L.buckets().size() == 3);
  CHECK(L.buckets()[0].params == std::vector<std::uint32_t>{2, 3});
  CHECK(L.buckets()[1].params == std::vector<std::uint32_t>{1});
  CHECK(L.buckets()[2].params == std::vector<std::uint32_t>{0});
  CHECK_THROWS_AS(make({1}, 0, 10), usage_error);
  CHECK_THROWS_AS(make({1}, 1, 0), usage_error);
}

TEST_CASE("deterministic sum of squares: independent of position in memory, exact for small integers") {
  std::vector<float> x(10000);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (auto& v : x) v = nd(rng);
  std::vector<float> shifted(x.size() + 3);
  std::copy(x.begin(), x.end(), shifted.begin() + 3);
  const double a = kernels::host::sum_squares(x.data(), x.size());
  const double b = kernels::host::sum_squares(shifted.data() + 3, x.size());
  CHECK(a == b);  // bitwise: alignment does not change the order of additions
  double ref = 0;
  for (float v : x) ref += static_cast<double>(v) * v;
  CHECK(a == doctest::Approx(ref).epsilon(1e-12));
  std::vector<half> h(4099, half(2.0f));
  CHECK(kernels::host::sum_squares(h.data(), h.size()) == 4.0 * 4099);
  h[4000] = half(INFINITY);
  CHECK(!std::isfinite(kernels::host::sum_squares(h.data(), h.size())));
  CHECK(kernels::host::sum_squares(h.data(), 0) == 0.0);
}
