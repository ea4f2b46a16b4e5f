// Shard layouts (parallel/split.hpp) and the region operators (parallel/region.hpp) on 2 and 4
// thread ranks: every result against the full tensor computed on one rank.
#include "common.hpp"

#include <string>
#include <utility>
#include <vector>

#include "zerotk/comm/threads.hpp"
#include "zerotk/parallel/region.hpp"
#include "zerotk/parallel/split.hpp"

using namespace zerotk;
using namespace zerotk::parallel;
using comm::OpKind;
using comm::ThreadsCommunicator;
using zt_parallel_test::same_bits;
using zt_parallel_test::values;

TEST_CASE("fused QKV rows: each rank gets its q, k and v rows, in that order; a merge puts every shard back") {
  // [q0; q1; k0; k1; v0; v1], one row each, 2 columns: row r of the full matrix holds (10 r, 10 r + 1).
  const MatrixShape shape{6, 2};
  std::vector<float> full(12);
  for (std::size_t i = 0; i < full.size(); ++i) full[i] = static_cast<float>(10 * (i / 2) + i % 2);
  std::vector<float> s0(6), s1(6);
  take_shard<float>(full, shape, TensorSplit::rows(3), 0, 2, s0);
  take_shard<float>(full, shape, TensorSplit::rows(3), 1, 2, s1);
  CHECK(s0 == std::vector<float>{0, 1, 20, 21, 40, 41});   // q0, k0, v0
  CHECK(s1 == std::vector<float>{10, 11, 30, 31, 50, 51});  // q1, k1, v1
  std::vector<float> merged(12, -1.0f);
  put_shard<float>(s0, shape, TensorSplit::rows(3), 0, 2, merged);
  put_shard<float>(s1, shape, TensorSplit::rows(3), 1, 2, merged);
  CHECK(merged == full);
}

TEST_CASE("column blocks with fused parts; round trips for every split and tensor size") {
  const MatrixShape shape{2, 4};  // columns [a0 a1 | b0 b1] in 2 parts
  const std::vector<float> full{0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<float> s1(4);
  take_shard<float>(full, shape, TensorSplit::cols(2), 1, 2, s1);
  CHECK(s1 == std::vector<float>{1, 3, 5, 7});  // a1 b1 of each row
  take_shard<float>(full, shape, TensorSplit::cols(), 1, 2, s1);
  CHECK(s1 == std::vector<float>{2, 3, 6, 7});
  for (TensorSplit split : {TensorSplit::rows(), TensorSplit::rows(2), TensorSplit::cols(), TensorSplit::cols(3),
                            TensorSplit::replicated()}) {
    for (int t : {1, 2, 4}) {
      const MatrixShape big{24, 12};
      const auto src = values(big.numel(), 7);
      std::vector<float> back(big.numel(), 0.0f);
      for (int r = 0; r < (split.is_split() ? t : 1); ++r) {
        std::vector<float> shard(shard_shape(big, split, t).numel());
        take_shard<float>(src, big, split, r, split.is_split() ? t : 1, shard);
        put_shard<float>(shard, big, split, r, split.is_split() ? t : 1, back);
      }
      CAPTURE(to_text(split));
      CAPTURE(t);
      CHECK(same_bits(back, src));
    }
  }
}

TEST_CASE("for_each_run: contiguous stretches of a shard in the full parameter, element for element full_index") {
  const MatrixShape big{24, 12};
  for (TensorSplit split : {TensorSplit::rows(), TensorSplit::rows(3), TensorSplit::cols(), TensorSplit::cols(2),
                            TensorSplit::replicated()}) {
    for (int t : {1, 2, 4}) {
      const int ranks = split.is_split() ? t : 1;
      if (!split_problem(big, split, ranks).empty()) continue;  // cols(2) at 4: 6 columns a part do not split 4 ways
      for (int r = 0; r < ranks; ++r) {
        const std::size_t n = shard_shape(big, split, ranks).numel();
        CHECK(full_shape(shard_shape(big, split, ranks), split, ranks) == big);
        // Whole shards and ranges that start and end inside stretches.
        for (const auto& [begin, count] : {std::pair<std::size_t, std::size_t>{0, n}, {5, n - 11}, {n / 3, 1}, {0, 0}}) {
          CAPTURE(to_text(split));
          CAPTURE(t);
          CAPTURE(r);
          CAPTURE(begin);
          std::size_t next = begin, runs = 0;
          bool mapped = true;
          for_each_run(big, split, r, ranks, begin, count, [&](std::size_t at, std::size_t full_at, std::size_t len) {
            mapped = mapped && at == next && len > 0;  // in order, no gaps, no empty runs
            for (std::size_t k = 0; k < len; ++k) mapped = mapped && full_index(at + k, big, split, r, ranks) == full_at + k;
            next = at + len;
            ++runs;
          });
          CHECK(mapped);
          CHECK(next == begin + count);
          // Maximal stretches: rows give one per fused part, cols one per row and part.
          if (begin == 0 && count == n && ranks > 1) {
            const auto parts = static_cast<std::size_t>(split.parts);
            CHECK(runs == (split.dim == SplitDim::rows ? parts : big.rows * parts));
          }
          if (!split.is_split() && count > 0) CHECK(runs == 1);
        }
      }
    }
  }
}

TEST_CASE("a split that does not divide, or heads that do not, is an error naming the parameter, dimension and sizes") {
  try {
    check_split("block0.qkv.weight", {3 * 10, 8}, TensorSplit::rows(3), 4);
    FAIL("no error");
  } catch (const usage_error& e) {
    CHECK(e.where() == "block0.qkv.weight");
    CHECK(std::string(e.message()).find("dim 0 (rows) = 30 (3 parts of 10) is not divisible by the tensor size 4") !=
          std::string::npos);
    CHECK(e.value() == "[30, 8] split rows (dim 0) in 3 fused parts");
  }
  CHECK_THROWS_WITH_AS(check_split("fc2.weight", {8, 6}, TensorSplit::cols(), 4),
                       doctest::Contains("dim 1 (cols) = 6 is not divisible by the tensor size 4"), usage_error);
  CHECK_NOTHROW(check_split("ln.weight", {7, 1}, TensorSplit::replicated(), 4));
  CHECK_THROWS_WITH_AS(check_heads("block0.attn", 6, 4), doctest::Contains("6 heads"), usage_error);
  CHECK_NOTHROW(check_heads("block0.attn", 8, 4));
}

TEST_CASE("f and g: identity one way, one all-reduce (sum, rank order) the other") {
  comm::run_threads(4, [](ThreadsCommunicator& tp) {
    const int r = tp.rank();
    std::vector<float> g = values(10, static_cast<std::uint32_t>(r));
    const std::vector<float> mine = g;
    CopyToRegion::forward(tp, std::span<float>(g));
    CHECK(g == mine);
    CHECK(tp.stats()[OpKind::all_reduce].calls == 0);
    CopyToRegion::backward(tp, std::span<float>(g));
    std::vector<float> expect(10);
    for (int k = 0; k < 4; ++k) {
      const auto v = values(10, static_cast<std::uint32_t>(k));
      for (std::size_t i = 0; i < 10; ++i) expect[i] = k == 0 ? v[i] : expect[i] + v[i];
    }
    CHECK(same_bits(g, expect));
    CHECK(tp.stats()[OpKind::all_reduce].calls == 1);
    CHECK(tp.stats()[OpKind::all_reduce].payload_bytes == 40);
    std::vector<float> y = mine;
    ReduceFromRegion::forward(tp, std::span<float>(y));
    CHECK(same_bits(y, expect));
    ReduceFromRegion::backward(tp, std::span<float>(y));
    CHECK(tp.stats()[OpKind::all_reduce].calls == 2);
  });
}

TEST_CASE("split / gather along the last dim: the pieces of the full matrix, and back, bit for bit") {
  for (int t : {2, 4}) {
    const std::size_t rows = 3, cols = 8;
    const auto full = values(rows * cols, 3);
    comm::run_threads(t, [&](ThreadsCommunicator& tp) {
      std::vector<float> local(rows * cols / static_cast<std::size_t>(t));
      SplitLastDim::forward(tp, std::span<const float>(full), rows, std::span<float>(local));
      const std::size_t lc = cols / static_cast<std::size_t>(t);
      for (std::size_t i = 0; i < rows; ++i) {
        for (std::size_t j = 0; j < lc; ++j) {
          CHECK(local[i * lc + j] == full[i * cols + static_cast<std::size_t>(tp.rank()) * lc + j]);
        }
      }
      std::vector<float> back(full.size());
      GatherLastDim::forward(tp, std::span<const float>(local), rows, std::span<float>(back));
      CHECK(same_bits(back, full));
      CHECK(tp.stats()[OpKind::all_gather].calls == 1);
      std::vector<float> again(local.size());
      GatherLastDim::backward(tp, std::span<const float>(back), rows, std::span<float>(again));
      CHECK(again == local);
      SplitLastDim::backward(tp, std::span<const float>(local), rows, std::span<float>(back));
      CHECK(same_bits(back, full));
      CHECK(tp.stats()[OpKind::all_gather].calls == 2);
      std::vector<float> wrong(full.size() + 1);
      CHECK_THROWS_AS(GatherLastDim::forward(tp, std::span<const float>(local), rows, std::span<float>(wrong)), usage_error);
    });
  }
}

TEST_CASE("sequence parallel: all-gather of token rows forward, reduce-scatter (rank-order sum) backward") {
  const std::size_t tokens = 8, d = 3;
  comm::run_threads(2, [&](ThreadsCommunicator& tp) {
    const int r = tp.rank();
    const auto all = values(tokens * d, 11);
    const std::size_t mine = tokens / 2 * d;
    std::vector<float> local(all.begin() + static_cast<std::ptrdiff_t>(mine) * r,
                             all.begin() + static_cast<std::ptrdiff_t>(mine) * (r + 1));
    std::vector<float> full(all.size());
    GatherFirstDim::forward(tp, std::span<const float>(local), std::span<float>(full));
    CHECK(same_bits(full, all));
    const auto grad = values(tokens * d, 20 + static_cast<std::uint32_t>(r));  // each rank's full-size partial
    std::vector<float> out(mine);
    GatherFirstDim::backward(tp, std::span<const float>(grad), std::span<float>(out));
    const auto g0 = values(tokens * d, 20), g1 = values(tokens * d, 21);
    for (std::size_t i = 0; i < mine; ++i) CHECK(out[i] == g0[mine * r + i] + g1[mine * r + i]);
    std::vector<float> out2(mine);
    ReduceScatterFirstDim::forward(tp, std::span<const float>(grad), std::span<float>(out2));
    CHECK(out2 == out);
    CHECK(tp.stats()[OpKind::reduce_scatter].calls == 2);
    CHECK(tp.stats()[OpKind::all_gather].calls == 1);
  });
}
