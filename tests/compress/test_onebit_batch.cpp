// compress::OneBitBatch (several tensors' 1-bit all-reduces sharing four collectives) against each
// tensor's own OneBitAllReduce::run on the same inputs: outputs and both error buffers bit for bit,
// several calls, W = 1..4, sizes not divisible by W and an empty tensor; the same wire bytes in 4
// operations instead of 4 per tensor; misuse.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "data.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/compress/onebit_batch.hpp"

namespace test_onebit_batch {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using compress::OneBitAllReduce;
using compress::OneBitBatch;

namespace {

const std::vector<std::size_t> kNumels{1000, 0, 37, 4099, 3};
constexpr int kCalls = 3;

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

/// Rank r's tensor i at call s.
std::vector<float> input(int r, std::size_t i, int s) {
  return test::normal(1000 * static_cast<std::uint64_t>(s) + 10 * i + static_cast<std::uint64_t>(r), kNumels[i]);
}

struct RankResult {
  std::vector<std::vector<float>> out, worker, server;  // [tensor], after the last call
  comm::CommStats stats;
};

/// kCalls calls on every rank, batched or one OneBitAllReduce per tensor.
std::vector<RankResult> run(int world, bool batched) {
  return comm::run_threads(world, [&](comm::ThreadsCommunicator& c) {
    RankResult res;
    OneBitBatch batch(kNumels, c.size());
    std::vector<OneBitAllReduce> single;
    for (std::size_t n : kNumels) single.emplace_back(n, c.size());
    std::vector<std::vector<float>> x(kNumels.size());
    for (int s = 0; s < kCalls; ++s) {
      for (std::size_t i = 0; i < kNumels.size(); ++i) x[i] = input(c.rank(), i, s);
      if (batched) {
        std::vector<std::span<float>> views;
        for (auto& v : x) views.emplace_back(v);
        batch.run(c, std::span<const std::span<float>>(views));
      } else {
        for (std::size_t i = 0; i < kNumels.size(); ++i) single[i].run(c, std::span<float>(x[i]));
      }
    }
    res.out = x;
    for (std::size_t i = 0; i < kNumels.size(); ++i) {
      const OneBitAllReduce& r = batched ? batch[i] : single[i];
      res.worker.emplace_back(r.worker_error().begin(), r.worker_error().end());
      res.server.emplace_back(r.server_error().begin(), r.server_error().end());
    }
    res.stats = c.stats();
    return res;
  });
}

}  // namespace

TEST_CASE("onebit batch: equals each tensor's own all-reduce bit for bit, in 4 operations per call, same bytes") {
  for (int w = 1; w <= 4; ++w) {
    CAPTURE(w);
    const std::vector<RankResult> want = run(w, false), got = run(w, true);
    for (int r = 0; r < w; ++r) {
      CAPTURE(r);
      const RankResult &a = want[static_cast<std::size_t>(r)], &b = got[static_cast<std::size_t>(r)];
      std::size_t bad = 0;
      for (std::size_t i = 0; i < kNumels.size(); ++i) {
        bad += !same_bits(a.out[i], b.out[i]) + !same_bits(a.worker[i], b.worker[i]) + !same_bits(a.server[i], b.server[i]);
      }
      CHECK(bad == 0);
      CHECK(b.stats.total_wire_bytes() == a.stats.total_wire_bytes());
      using comm::OpKind;
      CHECK(b.stats[OpKind::all_to_all].calls == kCalls);
      CHECK(b.stats[OpKind::all_gather].calls == 3 * kCalls);
      CHECK(a.stats[OpKind::all_to_all].calls == kCalls * 4);  // the four non-empty tensors, one each
    }
    // The averages are every rank's: the outputs agree across ranks.
    for (int r = 1; r < w; ++r) {
      for (std::size_t i = 0; i < kNumels.size(); ++i) CHECK(same_bits(got[0].out[i], got[static_cast<std::size_t>(r)].out[i]));
    }
  }
}

TEST_CASE("onebit batch: no values sends nothing; the wrong number of inputs or world is a usage error") {
  const auto sent = comm::run_threads(2, [](comm::ThreadsCommunicator& c) {
    const std::vector<std::size_t> empty{0, 0};
    OneBitBatch batch(empty, c.size());
    std::vector<float> none;
    std::vector<std::span<float>> views{std::span<float>(none), std::span<float>(none)};
    batch.run(c, std::span<const std::span<float>>(views));
    return c.stats().total_payload_bytes();
  });
  CHECK(sent == std::vector<std::uint64_t>{0, 0});

  const auto what = comm::run_threads(2, [](comm::ThreadsCommunicator& c) {
    std::vector<std::string> w;
    const std::vector<std::size_t> numels{10, 20};
    std::vector<float> x(10), y(20);
    std::vector<std::span<float>> one{std::span<float>(x)}, two{std::span<float>(x), std::span<float>(y)};
    try {
      OneBitBatch batch(numels, c.size());
      batch.run(c, std::span<const std::span<float>>(one));
    } catch (const usage_error& e) {
      w.push_back(e.what());
    }
    try {
      OneBitBatch batch(numels, 3);  // built for 3 ranks, run on 2
      batch.run(c, std::span<const std::span<float>>(two));
    } catch (const usage_error& e) {
      w.push_back(e.what());
    }
    return w;
  });
  for (const auto& w : what) {
    REQUIRE(w.size() == 2);
    CHECK(w[0].find("(got 1)") != std::string::npos);
    CHECK(w[1].find("(got 2)") != std::string::npos);
  }
}

}  // namespace test_onebit_batch
