#pragma once
/// \file zerotk/activation/checkpointing.hpp
/// Checkpointing: the state the checkpointed layers of one model share (one per rank):
/// - the options (activation/options.hpp) and the Meter that reports activation bytes to a ledger;
/// - the layers holding a saved input, in forward order, so that when one begins its backward the
///   next one down can start bringing its input back from pinned host memory;
/// - the last layer to finish a forward and a backward, so that a checkpointed layer fed directly by
///   another takes over that layer's output as its saved input instead of copying it, and frees the
///   gradient it was given once it has used it;
/// - the contiguous arena and the copy thread, made when the options first need them;
/// - the per-layer recompute times when `profile` is on.
///
///   zerotk::activation::Meter meter(&engine.memory());
///   zerotk::activation::Checkpointing ckpt(zerotk::activation::Options::from(cfg), &meter);
///   zerotk::Recompute<Block> r(block, ckpt, "blocks.3");   // forward/backward through r
///
/// Not thread-safe: one per rank, used by that rank's thread (the copy thread is internal).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "zerotk/activation/arena.hpp"
#include "zerotk/activation/copy_worker.hpp"
#include "zerotk/activation/meter.hpp"
#include "zerotk/activation/options.hpp"

namespace zerotk::activation {

class Checkpointing;

/// What Checkpointing needs of every Recompute<L>, whatever L is.
class RecomputeBase {
 public:
  RecomputeBase() = default;
  RecomputeBase(const RecomputeBase&) = delete;
  RecomputeBase& operator=(const RecomputeBase&) = delete;
  virtual ~RecomputeBase() = default;
  virtual const std::string& name() const noexcept = 0;

 protected:
  friend class Checkpointing;
  template <class L>
  friend class Recompute;
  /// Starts bringing the saved input back (cpu_checkpointing); a no-op otherwise.
  virtual void prefetch() = 0;
  /// The output object of the last forward (nullptr once handed over or freed).
  virtual const void* output_address() const noexcept = 0;
  /// Hands the output object over (the next checkpointed layer keeps it as its saved input).
  virtual std::shared_ptr<void> take_output() = 0;
  /// Frees the output object (its consumer no longer needs it).
  virtual void drop_output() = 0;
  /// The input gradient returned by the last backward (nullptr once freed).
  virtual const void* grad_address() const noexcept = 0;
  virtual void drop_grad() = 0;
};

class Checkpointing {
 public:
  struct ProfileRow {
    std::string name;
    std::int64_t recomputes = 0;
    double total_ms = 0;
  };

  explicit Checkpointing(Options options = {}, Meter* meter = nullptr) : options_(options), meter_(meter) {
    if (options_.contiguous_memory && options_.number_checkpoints <= 0) {
      throw config_error("contiguous_memory_optimization needs number_checkpoints (the number of checkpointed layers)",
                         "activation_checkpointing.number_checkpoints", std::to_string(options_.number_checkpoints));
    }
  }
  Checkpointing(const Checkpointing&) = delete;
  Checkpointing& operator=(const Checkpointing&) = delete;

  const Options& options() const noexcept { return options_; }
  Meter* meter() const noexcept { return meter_; }
  MemoryLedger* ledger() const noexcept { return meter_ != nullptr ? meter_->ledger() : nullptr; }

  /// What synchronize_checkpoint_boundary calls (e.g. a device synchronise); empty: nothing.
  void set_synchronize(std::function<void()> f) { synchronize_ = std::move(f); }
  /// Each checkpointed layer's forward and backward call this on entry and exit.
  void boundary() {
    if (!options_.synchronize_boundary) return;
    ++synchronized_;
    if (synchronize_) synchronize_();
  }
  /// Boundaries synchronised so far (synchronize_checkpoint_boundary).
  std::int64_t synchronized() const noexcept { return synchronized_; }

  /// Layers holding a saved input now.
  std::size_t saved_count() const noexcept { return stack_.size(); }

  /// Recompute times per layer, in the order the layers were made (profile).
  std::span<const ProfileRow> profile() const noexcept { return profile_; }
  void clear_profile() noexcept {
    for (auto& r : profile_) r = ProfileRow{r.name, 0, 0};
  }
  /// "recompute ms per call: blocks.0 0.412, blocks.1 0.398 (12 recomputes)" for the log.
  std::string profile_report() const {
    std::string out = "recompute ms per call:";
    std::int64_t calls = 0;
    char buf[64];
    for (const auto& r : profile_) {
      if (r.recomputes == 0) continue;
      std::snprintf(buf, sizeof buf, " %.3f", r.total_ms / static_cast<double>(r.recomputes));
      out += " " + r.name + buf + ",";
      calls += r.recomputes;
    }
    if (out.back() == ',') out.pop_back();
    return out + " (" + std::to_string(calls) + " recomputes)";
  }

 private:
  template <class L>
  friend class Recompute;

  std::size_t enroll(std::string name) {
    profile_.push_back(ProfileRow{std::move(name), 0, 0});
    return profile_.size() - 1;
  }
  void record(std::size_t id, double ms) {
    if (!options_.profile) return;
    profile_[id].recomputes += 1;
    profile_[id].total_ms += ms;
  }

  void push(RecomputeBase* r) {
    pop(r, false);
    stack_.push_back(r);
  }
  /// Removes r; when it was the top and `prefetch_next`, the new top starts bringing its input back.
  void pop(RecomputeBase* r, bool prefetch_next) {
    const auto it = std::find(stack_.begin(), stack_.end(), r);
    if (it == stack_.end()) return;
    const bool top = it + 1 == stack_.end();
    stack_.erase(it);
    if (top && prefetch_next && !stack_.empty()) stack_.back()->prefetch();
  }
  void forget(RecomputeBase* r) noexcept {
    stack_.erase(std::remove(stack_.begin(), stack_.end(), r), stack_.end());
    if (last_forward_ == r) last_forward_ = nullptr;
    if (last_backward_ == r) last_backward_ = nullptr;
  }

  Arena& arena() {
    if (!arena_) arena_ = std::make_unique<Arena>(options_.number_checkpoints, options_.cpu_checkpointing, ledger());
    return *arena_;
  }
  CopyWorker& worker() {
    if (!worker_) worker_ = std::make_unique<CopyWorker>();
    return *worker_;
  }

  Options options_;
  Meter* meter_;
  std::function<void()> synchronize_;
  std::int64_t synchronized_ = 0;
  std::vector<ProfileRow> profile_;
  std::vector<RecomputeBase*> stack_;
  RecomputeBase* last_forward_ = nullptr;
  RecomputeBase* last_backward_ = nullptr;
  std::unique_ptr<Arena> arena_;
  std::unique_ptr<CopyWorker> worker_;  // last: joined first, before the arena it copies into goes
};

}  // namespace zerotk::activation
