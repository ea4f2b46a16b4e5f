// The progress line: "\r" redraws on a terminal, throttled plain lines elsewhere; rate and ETA
// from an injected clock.
#include "common.hpp"

#include <sstream>
#include <string>

#include "zerotk/monitor/progress.hpp"

using namespace zerotk;
using namespace zerotk::monitor;
using zerotk_test::ManualClock;

TEST_CASE("plain output: first update, then at most one line per interval, and the last") {
  ManualClock clock;
  std::ostringstream out;
  ProgressLine p(1000, out, {.tty = false, .plain_interval_s = 30}, clock.fn());
  clock.now += 1;
  p.update(10, 2.5);  // printed: first
  for (int s = 11; s <= 100; ++s) {
    clock.now += 0.1;  // 10 steps/s
    p.update(s, 2.0);
  }
  clock.now += 20;
  p.update(101, 1.9);  // 29 s after the first line: not yet
  clock.now += 5;
  p.update(101, 1.9);  // 34 s: printed; 101 steps in 35 s, 899 to go
  CHECK(out.str() ==
        "step 10/1000 (1.0%) | 10.00 it/s | ETA 01:39 | loss 2.5000\n"
        "step 101/1000 (10.1%) | 2.89 it/s | ETA 05:12 | loss 1.9000\n");
  out.str("");
  clock.now += 1;
  p.update(1000, 1.5);  // the total is always printed
  p.finish();
  p.finish();
  CHECK(out.str() == "step 1000/1000 (100.0%) | 27.78 it/s | ETA 00:00 | loss 1.5000\n");
}

TEST_CASE("terminal output redraws one line in place and ends it on finish") {
  ManualClock clock;
  std::ostringstream out;
  ProgressLine p(4, out, {.tty = true, .tty_interval_s = 0.1, .bar_width = 4}, clock.fn());
  clock.now += 2;
  p.update(1);
  clock.now += 0.01;
  p.update(2, 0.25);  // within 0.1 s of the last redraw: skipped
  clock.now += 2;
  p.update(2, 0.25);
  p.finish();
  CHECK(out.str() ==
        "\r[#...] step 1/4 (25.0%) | 2.00 s/it | ETA 00:06"
        "\r[##..] step 2/4 (50.0%) | 2.00 s/it | ETA 00:04 | loss 0.2500\n");
}

TEST_CASE("a shorter redraw pads over the previous line") {
  ManualClock clock;
  std::ostringstream out;
  ProgressLine p(100, out, {.tty = true, .tty_interval_s = 0, .bar_width = 0}, clock.fn());
  clock.now += 100;
  p.update(1);
  const std::string first = out.str().substr(1);
  CHECK(first == "step 1/100 (1.0%) | 100.00 s/it | ETA 2:45:00");
  out.str("");
  clock.now += 100;
  p.update(99);  // "step 99/100 (99.0%) | 2.02 s/it | ETA 00:02" is 2 characters shorter
  CHECK(out.str().size() == first.size() + 1);  // "\r" + padded text
  CHECK(out.str().back() == ' ');
}

TEST_CASE("edge cases: no steps, no elapsed time, long ETAs") {
  ManualClock clock;
  std::ostringstream out;
  ProgressLine p(0, out, {}, clock.fn());
  p.update(0);
  CHECK(out.str() == "step 0/0 (100.0%) | ETA --:--\n");
  CHECK(ProgressLine::clock_text(3725) == "1:02:05");
  CHECK(ProgressLine::clock_text(59.6) == "01:00");
  CHECK(ProgressLine::clock_text(1e300) == "--:--");
  CHECK_THROWS_AS(ProgressLine(-1, out), usage_error);
}

TEST_CASE("a resumed run: the line counts from start_step, the rate and ETA only the steps run since") {
  ManualClock clock;
  std::ostringstream out;
  // Loaded at step 150 of 300; the first step of this process takes 0.5 s. Counting the loaded steps
  // as run would print 302.00 it/s and an ETA of 00:00.
  ProgressLine p(300, out, {.tty = false, .plain_interval_s = 30, .start_step = 150}, clock.fn());
  clock.now += 0.5;
  p.update(151, 0.5);
  CHECK(out.str() == "step 151/300 (50.3%) | 2.00 it/s | ETA 01:15 | loss 0.5000\n");
  out.str("");
  clock.now += 74.5;  // 150 steps in 75 s
  p.update(300, 0.25);
  CHECK(out.str() == "step 300/300 (100.0%) | 2.00 it/s | ETA 00:00 | loss 0.2500\n");
}

TEST_CASE("a resumed run that has not stepped yet shows its start step and no rate") {
  ManualClock clock;
  std::ostringstream out;
  ProgressLine p(300, out, {.start_step = 300}, clock.fn());
  clock.now += 2;
  p.finish();  // loaded at the last step: nothing to run
  CHECK(out.str() == "step 300/300 (100.0%) | ETA --:--\n");
  CHECK_THROWS_AS(ProgressLine(300, out, {.start_step = -1}), usage_error);
}
