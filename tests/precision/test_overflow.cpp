#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "fake_comm.hpp"
#include "overflow_patterns.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/precision.hpp"

using namespace zerotk;
using zerotk_test::BoardComm;
using zerotk_test::FakeGroup;
using zerotk_test::overflow_pattern;
using zerotk_test::run_board;

TEST_CASE("agree_overflow: one byte, max-reduced in place") {
  FakeGroup quiet(1, {0, 0, 0});
  CHECK_FALSE(agree_overflow(quiet, false));
  CHECK(agree_overflow(quiet, true));
  FakeGroup noisy(2, {0, 1, 0});  // rank 1 overflowed
  CHECK(agree_overflow(noisy, false));
  REQUIRE(noisy.calls.size() == 1);
  CHECK(noisy.calls[0].count == 1);
  CHECK(noisy.calls[0].dtype == DType::uint8);
  CHECK(noisy.calls[0].op == comm::ReduceOp::max);
  CHECK(noisy.calls[0].in_place);
  FakeGroup alone(0, {});
  CHECK(agree_overflow(alone, true));
  CHECK_FALSE(agree_overflow(alone, false));
}

TEST_CASE("agree_overflow_async leaves the verdict in the flag") {
  FakeGroup g(0, {1});
  std::uint8_t flag = 0;
  comm::Work w = agree_overflow_async(g, &flag);
  w.wait();
  CHECK(flag == 1);
}

TEST_CASE("update_agreed: ranks that see different overflows still skip together (threads)") {
  constexpr int kSteps = 400;
  for (int world : {1, 2, 3, 5}) {
    CAPTURE(world);
    // Each rank overflows on its own seeded pattern; together they overflow on the union.
    std::vector<std::vector<bool>> local(static_cast<std::size_t>(world));
    for (int r = 0; r < world; ++r)
      local[static_cast<std::size_t>(r)] = overflow_pattern(100 + static_cast<std::uint64_t>(r), kSteps, 0.01, 0.3);
    const LossScalerOptions o{.loss_scale_window = 6, .hysteresis = 2, .raise_error_at_min_scale = false};

    std::vector<std::vector<bool>> skips(static_cast<std::size_t>(world));
    std::vector<LossScalerState> agreed(static_cast<std::size_t>(world)), alone(static_cast<std::size_t>(world));
    run_board(world, [&](BoardComm& c) {
      const auto r = static_cast<std::size_t>(c.rank());
      LossScaler<Dynamic> s(o), local_only(o);
      for (int i = 0; i < kSteps; ++i) {
        const bool mine = local[r][static_cast<std::size_t>(i)];
        skips[r].push_back(update_agreed(c, s, mine));
        local_only.update(mine);
      }
      agreed[r] = s.state();
      alone[r] = local_only.state();
    });

    LossScaler<Dynamic> serial(o);
    std::vector<bool> want;
    for (int i = 0; i < kSteps; ++i) {
      bool any = false;
      for (const auto& l : local) any = any || l[static_cast<std::size_t>(i)];
      want.push_back(serial.update(any));
    }
    for (int r = 0; r < world; ++r) {
      CAPTURE(r);
      CHECK(skips[static_cast<std::size_t>(r)] == want);
      CHECK(agreed[static_cast<std::size_t>(r)] == serial.state());
    }
    if (world > 1) {
      // Without the agreement the ranks' scalers do drift apart: the test above is not vacuous.
      bool diverged = false;
      for (int r = 1; r < world; ++r) diverged = diverged || !(alone[static_cast<std::size_t>(r)] == alone[0]);
      CHECK(diverged);
    }
  }
}

TEST_CASE("agree_overflow and global sums on the real threads communicator") {
  constexpr int kSteps = 200;
  for (int world : {1, 3, 4}) {
    CAPTURE(world);
    std::vector<std::vector<bool>> local(static_cast<std::size_t>(world));
    for (int r = 0; r < world; ++r)
      local[static_cast<std::size_t>(r)] = overflow_pattern(500 + static_cast<std::uint64_t>(r), kSteps, 0.02, 0.4);
    std::vector<LossScalerState> states(static_cast<std::size_t>(world));
    std::vector<int> skipped(static_cast<std::size_t>(world));
    comm::run_threads(world, [&](comm::ThreadsCommunicator& c) {
      const auto r = static_cast<std::size_t>(c.rank());
      LossScaler<Dynamic> s({.loss_scale_window = 5, .raise_error_at_min_scale = false});
      for (int i = 0; i < kSteps; ++i) skipped[r] += update_agreed(c, s, local[r][static_cast<std::size_t>(i)]) ? 1 : 0;
      states[r] = s.state();
    });
    LossScaler<Dynamic> serial({.loss_scale_window = 5, .raise_error_at_min_scale = false});
    int want_skipped = 0;
    for (int i = 0; i < kSteps; ++i) {
      bool any = false;
      for (const auto& l : local) any = any || l[static_cast<std::size_t>(i)];
      want_skipped += serial.update(any) ? 1 : 0;
    }
    for (int r = 0; r < world; ++r) {
      CHECK(states[static_cast<std::size_t>(r)] == serial.state());
      CHECK(skipped[static_cast<std::size_t>(r)] == want_skipped);
    }
  }
}
