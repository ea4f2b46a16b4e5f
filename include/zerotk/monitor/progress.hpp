#pragma once
/// \file zerotk/monitor/progress.hpp
/// A progress line for long runs: steps done/total, rate, ETA and the latest loss. On a terminal
/// it redraws one line in place ("\r"); into a file or pipe (a batch job's log) it writes plain
/// newline-terminated lines, at most one every `plain_interval_s`, so logs stay readable.
///
///   zerotk::monitor::ProgressLine progress(total_steps, std::cerr, {.tty = zerotk::monitor::is_terminal(stderr)});
///   for (...) { ...; progress.update(step + 1, loss); }
///   progress.finish();
///
/// A run resumed from a checkpoint passes the step it loaded as `start_step`: the line counts from
/// there (step 151/300), while the rate and ETA count only the steps this process has run.

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <ostream>
#include <string>

#if __has_include(<unistd.h>)
#include <unistd.h>
#endif

#include "zerotk/core/error.hpp"
#include "zerotk/monitor/timers.hpp"

namespace zerotk::monitor {

/// True when `f` is an interactive terminal (false where that cannot be known).
inline bool is_terminal(std::FILE* f) {
#if __has_include(<unistd.h>)
  return f != nullptr && ::isatty(::fileno(f)) == 1;
#else
  (void)f;
  return false;
#endif
}

struct ProgressOptions {
  bool tty = false;                ///< redraw in place with "\r"; else plain lines
  double plain_interval_s = 30;    ///< plain lines: at most one per interval (first and last always)
  double tty_interval_s = 0.1;     ///< terminal: at most this many redraws per second
  int bar_width = 20;              ///< terminal: width of the [####....] bar, 0 for none
  /// Steps done before this line was made (a resumed run's loaded step): shown in "step N/total",
  /// left out of the rate and ETA, which count only the steps done since.
  std::int64_t start_step = 0;
};

class ProgressLine {
 public:
  ProgressLine(std::int64_t total_steps, std::ostream& out, ProgressOptions options = {}, Clock clock = steady_seconds)
      : total_(total_steps),
        out_(out),
        options_(options),
        clock_(std::move(clock)),
        start_(clock_()),
        done_(options.start_step) {
    if (total_steps < 0) throw usage_error("total steps must be >= 0", "ProgressLine", std::to_string(total_steps));
    if (options.start_step < 0) {
      throw usage_error("start_step must be >= 0", "ProgressLine", std::to_string(options.start_step));
    }
  }

  /// Reports `steps_done` (of total). Prints when the interval has passed, at the first update,
  /// and when the total is reached.
  void update(std::int64_t steps_done, std::optional<double> loss = {}) {
    done_ = steps_done;
    if (loss) loss_ = loss;
    const double now = clock_();
    const double interval = options_.tty ? options_.tty_interval_s : options_.plain_interval_s;
    if (printed_once_ && now - last_print_ < interval && steps_done < total_) return;
    print(now);
  }

  /// Prints the final state and ends the line. Idempotent.
  void finish() {
    if (finished_) return;
    finished_ = true;
    const double now = clock_();
    if (!printed_once_ || last_printed_done_ != done_) print(now);
    if (options_.tty) out_ << '\n';
    out_.flush();
  }

  /// The text of the line for the current state at time `now` (no "\r", no newline).
  std::string render(double now) const {
    const double elapsed = now - start_;
    // Steps per second of this process: a resumed run's loaded steps took no time here.
    const double ran = static_cast<double>(done_ - options_.start_step);
    const double rate = elapsed > 0 && ran > 0 ? ran / elapsed : 0;
    std::string s;
    char buf[96];
    if (options_.tty && options_.bar_width > 0 && total_ > 0) {
      const int filled = static_cast<int>(static_cast<double>(options_.bar_width) * static_cast<double>(done_) /
                                          static_cast<double>(total_));
      s += '[';
      for (int i = 0; i < options_.bar_width; ++i) s += i < filled ? '#' : '.';
      s += "] ";
    }
    const double pct = total_ > 0 ? 100.0 * static_cast<double>(done_) / static_cast<double>(total_) : 100.0;
    std::snprintf(buf, sizeof buf, "step %lld/%lld (%.1f%%)", static_cast<long long>(done_),
                  static_cast<long long>(total_), pct);
    s += buf;
    if (rate > 0) {
      if (rate >= 1) {
        std::snprintf(buf, sizeof buf, " | %.2f it/s", rate);
      } else {
        std::snprintf(buf, sizeof buf, " | %.2f s/it", 1.0 / rate);
      }
      s += buf;
      const double remaining = static_cast<double>(total_ - done_) / rate;
      s += " | ETA ";
      s += clock_text(remaining > 0 ? remaining : 0);
    } else {
      s += " | ETA --:--";
    }
    if (loss_) {
      std::snprintf(buf, sizeof buf, " | loss %.4f", *loss_);
      s += buf;
    }
    return s;
  }

  /// "MM:SS", or "H:MM:SS" from an hour on.
  static std::string clock_text(double seconds) {
    if (!std::isfinite(seconds) || seconds > 359999999) return "--:--";
    const auto t = static_cast<long long>(std::llround(seconds));
    char buf[32];
    if (t >= 3600) {
      std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", t / 3600, (t / 60) % 60, t % 60);
    } else {
      std::snprintf(buf, sizeof buf, "%02lld:%02lld", t / 60, t % 60);
    }
    return buf;
  }

 private:
  void print(double now) {
    std::string line = render(now);
    if (options_.tty) {
      // Pad over a longer previous line instead of relying on terminal escape codes.
      const std::size_t width = line.size();
      if (line.size() < last_width_) line.append(last_width_ - line.size(), ' ');
      last_width_ = width;
      out_ << '\r' << line;
    } else {
      out_ << line << '\n';
    }
    out_.flush();
    printed_once_ = true;
    last_print_ = now;
    last_printed_done_ = done_;
  }

  std::int64_t total_;
  std::ostream& out_;
  ProgressOptions options_;
  Clock clock_;
  double start_;
  std::int64_t done_;
  std::optional<double> loss_;
  bool printed_once_ = false;
  bool finished_ = false;
  double last_print_ = 0;
  std::int64_t last_printed_done_ = -1;
  std::size_t last_width_ = 0;
};

}  // namespace zerotk::monitor
