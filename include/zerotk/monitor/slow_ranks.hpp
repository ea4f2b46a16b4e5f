#pragma once
/// \file zerotk/monitor/slow_ranks.hpp
/// Slow ranks (stragglers): the options, the detector, and what the trainer is told when the data
/// group rebalances its batch. Pure logic over per-rank times; engine/slow_rank_monitor.hpp measures
/// the times and exchanges them.
///
/// Each rank's compute time per optimizer step is the time the trainer spends outside the engine's
/// calls between two step() calls (its forward and backward math, its loss, its data), split by
/// phase: inside forward scopes, inside backward scopes, elsewhere. Time blocked in communication
/// (gathers, reductions, the boundary) happens inside the engine's calls and is not counted. The
/// time is divided by the samples the rank processed, so a rank that rebalancing gave fewer samples
/// is still measured per sample.
///
/// Detection (SlowRankDetector): the steps are cut into windows of `window` steps. At the end of a
/// window, each rank's window median m_r is compared with M, the median of all ranks' medians; the
/// window is slow for rank r when m_r > (1 + tolerance) M. A rank is flagged slow after `count`
/// slow windows in a row and stays flagged until a window is not slow. Every rank sees the same
/// times (exchanged at each boundary), so every rank reaches the same verdict at the same step.
/// Its factor is m_r / M; its phase the one whose median exceeds the others' by the most time.
/// Medians make a single slow step (a page fault, a checkpoint write) harmless; the tolerance and
/// the run of windows make jitter harmless: +-5% uniform jitter on every rank gives window medians
/// within about 2% of each other at window 20 (tests/engine/test_communication.cpp: none flagged in
/// 1,000 steps), while a rank 30% slower is flagged at the `window x count`-th step.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zerotk/core/error.hpp"

namespace zerotk {

/// What to do about a rank flagged slow (config: communication.slow_node_action).
enum class SlowRankAction : std::uint8_t {
  report,     ///< StepReport::slow_ranks, the monitor's csv rows and the progress line
  abort,      ///< every rank throws slow_rank_error at the boundary that flags it
  rebalance,  ///< fewer samples for the slow rank, the loss weighted so the gradient stays the global mean
};

constexpr std::string_view to_string(SlowRankAction a) noexcept {
  switch (a) {
    case SlowRankAction::report: return "report";
    case SlowRankAction::abort: return "abort";
    case SlowRankAction::rebalance: return "rebalance";
  }
  return "unknown";
}

/// The slow-rank detector's settings (EngineOptions::communication.slow_ranks; config keys in the
/// `communication` block, docs/config.md).
struct SlowRankOptions {
  /// Off by default: detection costs one small all-reduce per optimizer step. The config turns it on
  /// when the communication block has any of the keys below.
  bool enabled = false;
  /// `slow_node_tolerance`: slow when a rank's window median exceeds (1 + tolerance) x the median
  /// of all ranks' medians.
  double tolerance = 0.1;
  /// `slow_node_window`: optimizer steps per window.
  int window = 20;
  /// `slow_node_count`: slow windows in a row before a rank is flagged.
  int count = 3;
  /// `slow_node_action`.
  SlowRankAction action = SlowRankAction::report;
  /// Samples each rank of the data group processes per micro-step when nobody is slow (the config's
  /// train_micro_batch_size_per_gpu): what Engine::batch_share() splits. Needed by rebalance.
  std::int64_t micro_batch_size = 0;
  /// Milliseconds on the clock compute time is measured with; empty: std::chrono::steady_clock.
  /// Tests pass a virtual clock that their trainer advances.
  std::function<double()> clock_ms;

  void check(std::vector<config_error>& out) const {
    if (!enabled) return;
    if (!(tolerance >= 0) || !std::isfinite(tolerance)) {
      out.emplace_back("must be finite and >= 0", "communication.slow_node_tolerance", std::to_string(tolerance));
    }
    if (window < 1) out.emplace_back("must be >= 1", "communication.slow_node_window", std::to_string(window));
    if (count < 1) out.emplace_back("must be >= 1", "communication.slow_node_count", std::to_string(count));
    if (action == SlowRankAction::rebalance && micro_batch_size < 1) {
      out.emplace_back("rebalance splits the data group's micro-batch: give the samples per rank "
                       "(train_micro_batch_size_per_gpu; SlowRankOptions::micro_batch_size)",
                       "communication.slow_node_action", "rebalance with micro_batch_size " + std::to_string(micro_batch_size));
    }
  }
};

/// One rank's compute in one optimizer step (ms by phase) and the samples it processed.
struct ComputeTimes {
  double forward_ms = 0, backward_ms = 0, other_ms = 0;
  double samples = 1;
  double total_ms() const noexcept { return forward_ms + backward_ms + other_ms; }
};

/// A rank flagged slow.
struct SlowRank {
  int rank = 0;              ///< in the communicator the times were exchanged over (the world)
  std::string host;          ///< its host name
  double factor = 1;         ///< its window median over the median of all ranks' (per sample)
  std::string phase;         ///< "forward", "backward" or "other": where its extra time goes
  std::int64_t since_step = 0;  ///< the global step at which it was flagged
  friend bool operator==(const SlowRank&, const SlowRank&) = default;
};

/// Thrown on every rank by the boundary that flags a rank under SlowRankAction::abort.
class slow_rank_error : public comm_error {
 public:
  slow_rank_error(const SlowRank& r, const SlowRankOptions& o)
      : comm_error("rank " + std::to_string(r.rank) + " (" + r.host + ") computes " + factor_text(r.factor) +
                       "x the median rank's time per sample (mostly in " + r.phase + ") for " +
                       std::to_string(o.count) + " windows of " + std::to_string(o.window) +
                       " steps in a row; communication.slow_node_action is abort",
                   "step " + std::to_string(r.since_step), factor_text(r.factor)),
        slow_(r) {}
  const SlowRank& slow() const noexcept { return slow_; }

  static std::string factor_text(double f) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f", f);
    return buf;
  }

 private:
  SlowRank slow_;
};

/// The window medians and the flags (see the file comment). Every rank runs one over the same
/// inputs; nothing in it communicates.
class SlowRankDetector {
 public:
  SlowRankDetector(const SlowRankOptions& o, int ranks)
      : o_(o), ranks_(ranks), times_(static_cast<std::size_t>(ranks)), streak_(static_cast<std::size_t>(ranks), 0),
        ratio_(static_cast<std::size_t>(ranks), 1.0), hosts_(static_cast<std::size_t>(ranks)) {}

  void set_hosts(std::vector<std::string> hosts) { hosts_ = std::move(hosts); }

  /// One optimizer step of every rank's times ([rank]). Returns true when it closed a window (the
  /// flags were re-evaluated).
  bool add(std::span<const ComputeTimes> step, std::int64_t global_step) {
    for (int r = 0; r < ranks_; ++r) times_[static_cast<std::size_t>(r)].push_back(step[static_cast<std::size_t>(r)]);
    if (static_cast<int>(times_[0].size()) < o_.window) return false;
    close_window(global_step);
    for (auto& t : times_) t.clear();
    return true;
  }

  /// The ranks flagged as of the last closed window, by rank.
  std::span<const SlowRank> slow() const noexcept { return slow_; }
  /// Each rank's factor in the last closed window (1 before the first).
  std::span<const double> ratios() const noexcept { return ratio_; }
  const SlowRankOptions& options() const noexcept { return o_; }

 private:
  static constexpr std::string_view kPhases[3] = {"forward", "backward", "other"};

  static double median(std::vector<double> v) {
    if (v.empty()) return 0;
    const std::size_t n = v.size(), mid = n / 2;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
    const double hi = v[mid];
    if (n % 2 == 1) return hi;
    const double lo = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid));
    return 0.5 * (lo + hi);
  }

  /// Rank r's window median of `part` (total or one phase) per sample.
  template <class F>
  double rank_median(int r, F&& part) const {
    std::vector<double> v;
    for (const ComputeTimes& t : times_[static_cast<std::size_t>(r)]) v.push_back(t.samples > 0 ? part(t) / t.samples : 0.0);
    return median(std::move(v));
  }

  template <class F>
  std::vector<double> medians(F&& part) const {
    std::vector<double> m(static_cast<std::size_t>(ranks_));
    for (int r = 0; r < ranks_; ++r) m[static_cast<std::size_t>(r)] = rank_median(r, part);
    return m;
  }

  void close_window(std::int64_t global_step) {
    const std::vector<double> m = medians([](const ComputeTimes& t) { return t.total_ms(); });
    const double all = median(m);
    const std::vector<double> phase[3] = {medians([](const ComputeTimes& t) { return t.forward_ms; }),
                                          medians([](const ComputeTimes& t) { return t.backward_ms; }),
                                          medians([](const ComputeTimes& t) { return t.other_ms; })};
    const double phase_all[3] = {median(phase[0]), median(phase[1]), median(phase[2])};
    std::vector<SlowRank> flagged;
    for (int r = 0; r < ranks_; ++r) {
      const auto i = static_cast<std::size_t>(r);
      ratio_[i] = all > 0 ? m[i] / all : 1.0;
      streak_[i] = ratio_[i] > 1.0 + o_.tolerance ? streak_[i] + 1 : 0;
      if (streak_[i] < o_.count) continue;
      SlowRank s;
      s.rank = r;
      s.host = hosts_[i];
      s.factor = ratio_[i];
      int worst = 0;
      for (int p = 1; p < 3; ++p) {
        if (phase[p][i] - phase_all[p] > phase[worst][i] - phase_all[worst]) worst = p;
      }
      s.phase = std::string(kPhases[worst]);
      s.since_step = global_step;
      for (const SlowRank& before : slow_) {
        if (before.rank == r) s.since_step = before.since_step;  // still the same episode
      }
      flagged.push_back(std::move(s));
    }
    slow_ = std::move(flagged);
  }

  SlowRankOptions o_;
  int ranks_;
  std::vector<std::vector<ComputeTimes>> times_;  // [rank][step of the open window]
  std::vector<int> streak_;                       // [rank] slow windows in a row
  std::vector<double> ratio_;                     // [rank] last window's factor
  std::vector<std::string> hosts_;
  std::vector<SlowRank> slow_;
};

/// The part of the data group's micro-batch this rank processes (Engine::batch_share()). Samples
/// are numbered 0 .. global-1 in one micro-batch of the whole data group; rank r takes [first,
/// first + samples). The trainer multiplies each sample's loss by `sample_weight` (= data ranks /
/// global) and sums over its samples: the engine's average over ranks is then the mean over the
/// global micro-batch, whatever the split, which is how rebalancing keeps the gradient exact.
struct BatchShare {
  std::int64_t first = 0;
  std::int64_t samples = 0;
  std::int64_t global = 0;
  double sample_weight = 1;
  friend bool operator==(const BatchShare&, const BatchShare&) = default;
};

/// Splits `global` samples over ranks in proportion to `weight` (largest remainder, every rank at
/// least one sample; ties to the lower rank): the same on every rank.
inline std::vector<std::int64_t> split_samples(std::int64_t global, std::span<const double> weight) {
  const auto n = static_cast<std::int64_t>(weight.size());
  std::vector<std::int64_t> out(weight.size(), 1);
  double sum = 0;
  for (double w : weight) sum += w;
  const std::int64_t spare = global - n;  // beyond the one sample each
  std::vector<std::pair<double, std::size_t>> rest;
  std::int64_t given = 0;
  for (std::size_t r = 0; r < weight.size(); ++r) {
    const double exact = static_cast<double>(spare) * weight[r] / sum;
    const auto whole = static_cast<std::int64_t>(std::floor(exact));
    out[r] += whole;
    given += whole;
    rest.emplace_back(exact - static_cast<double>(whole), r);
  }
  // Largest remainder first, ties by rank (std::sort with the rank as tie-break: std::stable_sort's
  // temporary buffer is deprecated API in libstdc++, which clang reports from here).
  std::sort(rest.begin(), rest.end(),
            [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  for (std::int64_t k = 0; k < spare - given; ++k) ++out[rest[static_cast<std::size_t>(k)].second];
  return out;
}

}  // namespace zerotk
