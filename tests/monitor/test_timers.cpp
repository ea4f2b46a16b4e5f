// Wall-clock timers with a hand-driven clock: DeepSpeed's accumulate/read/reset semantics and
// its "time (ms) | name: x.xx" report.
#include "common.hpp"

#include <string>

#include "zerotk/monitor/timers.hpp"

using namespace zerotk;
using namespace zerotk::monitor;
using zerotk_test::ManualClock;

TEST_CASE("a timer sums its intervals in milliseconds until reset") {
  ManualClock clock;
  WallClockTimers t(clock.fn());
  t.start("fwd");
  clock.now += 0.25;
  t.stop("fwd");
  clock.now += 10;  // not timed
  t.start("fwd");
  clock.now += 0.125;
  t.stop("fwd");
  CHECK(t.elapsed_ms("fwd", /*reset=*/false) == 375.0);
  CHECK(t.elapsed_ms("fwd") == 375.0);  // reset after reading
  CHECK(t.elapsed_ms("fwd") == 0.0);
}

TEST_CASE("reading a running timer includes the running interval and keeps it running") {
  ManualClock clock;
  WallClockTimers t(clock.fn());
  t.start("step");
  clock.now += 0.5;
  CHECK(t.elapsed_ms("step") == 500.0);  // reset restarts it at now
  CHECK(t("step").running());
  clock.now += 0.25;
  t.stop("step");
  CHECK(t.elapsed_ms("step") == 250.0);
}

TEST_CASE("misuse is a usage_error naming the timer") {
  WallClockTimers t;
  t.start("bwd");
  try {
    t.start("bwd");
    FAIL("double start must throw");
  } catch (const usage_error& e) {
    CHECK(e.where() == "bwd");
  }
  CHECK_THROWS_AS(t.stop("fwd"), usage_error);
  CHECK_THROWS_AS(t.log({"bwd"}, true, 0.0), usage_error);
}

TEST_CASE("log() reports like DeepSpeed, leaving out timers that never existed") {
  ManualClock clock;
  WallClockTimers t(clock.fn());
  {
    auto s = t.scope({timer_names::forward_micro, timer_names::forward});
    clock.now += 3.0 / 1024;
  }
  {
    auto s = t.scope({timer_names::step_micro});
    clock.now += 0.0123456;
  }
  CHECK(t.log(timer_names::micro) == "time (ms) | fwd_microstep: 2.93 | step_microstep: 12.35");
  CHECK(t.log({timer_names::forward}, /*reset=*/false, /*normalizer=*/2.0) == "time (ms) | fwd: 1.46");
  CHECK(t.log(timer_names::micro) == "time (ms) | fwd_microstep: 0.00 | step_microstep: 0.00");  // were reset
}

TEST_CASE("elapsed_value: float milliseconds, or integer 0 for a timer that never ran") {
  ManualClock clock;
  WallClockTimers t(clock.fn());
  CHECK(t.elapsed_value("bwd_allreduce").str() == "0");
  t.start("fwd");
  clock.now += 1.0 / 1024;
  t.stop("fwd");
  CHECK(t.elapsed_value("fwd").str() == "0.9765625");
  CHECK(t.elapsed_value("fwd").str() == "0.9765625");  // not reset by default
}
