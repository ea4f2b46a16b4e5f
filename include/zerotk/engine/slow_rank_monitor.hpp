#pragma once
/// \file zerotk/engine/slow_rank_monitor.hpp
/// SlowRankMonitor: the engine's side of slow-rank detection (monitor/slow_ranks.hpp). It clocks the
/// trainer's compute between the engine's calls (each public entry point holds a `Busy` guard: the
/// time since the previous call ended goes to the phase the trainer was in), less the time the
/// thread spent blocked in zerotk's Work::wait() meanwhile (comm::WaitClock: a rank waiting for a
/// slow pipeline peer or in the trainer's own collectives is not computing), exchanges every rank's
/// times at each optimizer boundary (one all-reduce of 4 W doubles on a communicator of its own,
/// split from the world, so the data group's byte counters are untouched), runs the detector, and
/// acts: report (StepReport::slow_ranks), abort (slow_rank_error on every rank), rebalance (new
/// sample shares from the next step on, Engine::batch_share()). Disabled, it does nothing and
/// communicates nothing.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/engine/comms.hpp"
#include "zerotk/engine/report.hpp"
#include "zerotk/monitor/slow_ranks.hpp"

namespace zerotk::engine {

/// Holds the calling thread's comm::WaitClock installed with a clock while alive (the first
/// holder's clock is used; the last one to go uninstalls it).
class InstalledWaitClock {
 public:
  InstalledWaitClock() = default;
  explicit InstalledWaitClock(std::function<double()> clock) : c_(&comm::thread_wait_clock()) {
    if (c_->installs++ == 0) c_->now_ms = std::move(clock);
  }
  InstalledWaitClock(InstalledWaitClock&& o) noexcept : c_(std::exchange(o.c_, nullptr)) {}
  InstalledWaitClock& operator=(InstalledWaitClock&& o) noexcept {
    if (this != &o) {
      release();
      c_ = std::exchange(o.c_, nullptr);
    }
    return *this;
  }
  InstalledWaitClock(const InstalledWaitClock&) = delete;
  InstalledWaitClock& operator=(const InstalledWaitClock&) = delete;
  ~InstalledWaitClock() { release(); }

  /// Milliseconds this thread has spent in Work::wait() on the installed clock (0 when not installed).
  double waited_ms() const noexcept { return c_ ? c_->waited_ms : 0.0; }

 private:
  void release() noexcept {
    if (c_ && --c_->installs == 0) c_->now_ms = nullptr;
    c_ = nullptr;
  }
  comm::WaitClock* c_ = nullptr;
};

/// Where the trainer is between two engine calls.
enum class ComputePhase : std::uint8_t { forward, backward, other };

template <class Comm>
class SlowRankMonitor {
 public:
  /// Disabled.
  SlowRankMonitor() = default;

  /// Collective over `world` when `o.enabled` (every rank builds its engine): splits the
  /// monitor's communicator and exchanges the host names.
  SlowRankMonitor(const SlowRankOptions& o, Comm& world, const GridPlace& place)
      : o_(o), data_size_(place.data_size), data_index_(place.data_index) {
    if (!o.enabled) return;  // rebalance on a grid beyond the data group: refused by the checker (engine/checks.hpp)
    comm_.emplace(world.split(0, world.rank()));
    detector_.emplace(o, comm_->size());
    detector_->set_hosts(exchange_hosts());
    if (o.micro_batch_size > 0) {
      samples_.assign(static_cast<std::size_t>(data_size_), o.micro_batch_size);
    }
    // This thread's waits, on this monitor's clock (the first monitor's on a thread holding several:
    // a rank's engines share one configuration). Built and destroyed on the rank's thread.
    waits_ = InstalledWaitClock([clock = o.clock_ms] { return clock ? clock() : steady_ms(); });
    last_ = now();
    last_waited_ = waits_.waited_ms();
  }

  bool enabled() const noexcept { return detector_.has_value(); }

  /// Held for the length of an engine call: the time since the previous call ended goes to the
  /// phase the trainer was in; when the call ends the trainer is in `next`.
  class Busy {
   public:
    Busy(SlowRankMonitor* m, ComputePhase next) : m_(m->enabled() ? m : nullptr), next_(next) {
      if (m_) m_->enter();
    }
    ~Busy() {
      if (m_) m_->leave(next_);
    }
    Busy(const Busy&) = delete;
    Busy& operator=(const Busy&) = delete;

   private:
    SlowRankMonitor* m_;
    ComputePhase next_;
  };
  Busy busy(ComputePhase next) { return Busy(this, next); }

  /// A micro-step ended (inside step()): its samples count towards this optimizer step.
  void end_micro_step() {
    if (enabled()) step_samples_ += o_.micro_batch_size > 0 ? static_cast<double>(share().samples) : 1.0;
  }

  /// At an optimizer boundary, inside step() (collective over the world when enabled): exchange,
  /// detect, act. Throws slow_rank_error on every rank under abort once a rank is flagged.
  void at_boundary(StepReport& r, std::int64_t global_step) {
    if (!enabled()) return;
    const int w = comm_->size(), me = comm_->rank();
    std::vector<double> all(4 * static_cast<std::size_t>(w), 0.0);  // [rank][forward, backward, other, samples]
    const std::size_t at = 4 * static_cast<std::size_t>(me);
    all[at] = acc_[0];
    all[at + 1] = acc_[1];
    all[at + 2] = acc_[2];
    all[at + 3] = step_samples_;
    comm_->all_reduce_host(all.data(), all.data(), all.size(), comm::ReduceOp::sum);
    std::vector<ComputeTimes> step(static_cast<std::size_t>(w));
    for (std::size_t q = 0; q < step.size(); ++q) step[q] = {all[4 * q], all[4 * q + 1], all[4 * q + 2], all[4 * q + 3]};
    r.slow_rank_detection = true;
    r.compute_ms = acc_[0] + acc_[1] + acc_[2];
    acc_[0] = acc_[1] = acc_[2] = 0;
    step_samples_ = 0;
    if (detector_->add(step, global_step) && o_.action == SlowRankAction::rebalance) rebalance();
    r.slow_ranks.assign(detector_->slow().begin(), detector_->slow().end());
    if (o_.action == SlowRankAction::abort && !r.slow_ranks.empty()) throw slow_rank_error(r.slow_ranks.front(), o_);
  }

  /// This rank's part of the data group's micro-batch (monitor/slow_ranks.hpp, BatchShare). Without
  /// a micro_batch_size: samples 0 and weight 1 (the trainer keeps its own batch and mean loss).
  BatchShare share() const {
    if (o_.micro_batch_size <= 0) return {};
    BatchShare s;
    s.global = o_.micro_batch_size * data_size_;
    const std::vector<std::int64_t>& n =
        samples_.empty() ? std::vector<std::int64_t>(static_cast<std::size_t>(data_size_), o_.micro_batch_size) : samples_;
    for (int q = 0; q < data_index_; ++q) s.first += n[static_cast<std::size_t>(q)];
    s.samples = n[static_cast<std::size_t>(data_index_)];
    s.sample_weight = static_cast<double>(data_size_) / static_cast<double>(s.global);
    return s;
  }

  /// Bytes the monitor's exchanges sent from this rank (ring convention).
  std::uint64_t wire_bytes() const noexcept { return comm_ ? comm_->stats().total_wire_bytes() : 0; }

 private:
  static double steady_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  double now() const { return o_.clock_ms ? o_.clock_ms() : steady_ms(); }
  double waited() const noexcept { return waits_.waited_ms(); }
  // The trainer's time since the last call, less what it spent blocked in zerotk's waits.
  void enter() {
    const double t = now(), w = waited();
    acc_[static_cast<std::size_t>(phase_)] += std::max(0.0, (t - last_) - (w - last_waited_));
  }
  void leave(ComputePhase next) {
    last_ = now();
    last_waited_ = waited();
    phase_ = next;
  }

  /// Every rank's host name (at most 63 bytes each), in world rank order.
  std::vector<std::string> exchange_hosts() {
    constexpr std::size_t kLen = 64;
    char host[kLen] = {};
    if (gethostname(host, kLen - 1) != 0) host[0] = '\0';
    const auto w = static_cast<std::size_t>(comm_->size());
    std::vector<double> bytes(w * kLen, 0.0);
    for (std::size_t i = 0; i < kLen; ++i) {
      bytes[static_cast<std::size_t>(comm_->rank()) * kLen + i] = static_cast<unsigned char>(host[i]);
    }
    comm_->all_reduce_host(bytes.data(), bytes.data(), bytes.size(), comm::ReduceOp::sum);
    std::vector<std::string> out(w);
    for (std::size_t q = 0; q < w; ++q) {
      for (std::size_t i = 0; i < kLen && bytes[q * kLen + i] != 0; ++i) out[q] += static_cast<char>(bytes[q * kLen + i]);
    }
    return out;
  }

  /// Shares in proportion to 1 / factor for the flagged ranks (1 for the others); equal again when
  /// nobody is flagged. The same on every rank.
  void rebalance() {
    std::vector<double> weight(static_cast<std::size_t>(data_size_), 1.0);
    for (const SlowRank& s : detector_->slow()) weight[static_cast<std::size_t>(s.rank)] = 1.0 / s.factor;
    samples_ = split_samples(o_.micro_batch_size * data_size_, weight);
  }

  SlowRankOptions o_;
  int data_size_ = 1, data_index_ = 0;
  std::optional<Comm> comm_;
  std::optional<SlowRankDetector> detector_;
  double acc_[3] = {0, 0, 0};  // ms by ComputePhase since the last boundary
  double last_ = 0;
  InstalledWaitClock waits_;  // this thread's, installed while enabled
  double last_waited_ = 0;
  ComputePhase phase_ = ComputePhase::other;
  double step_samples_ = 0;
  std::vector<std::int64_t> samples_;  // [data rank] per micro-step, when rebalancing
};

}  // namespace zerotk::engine
