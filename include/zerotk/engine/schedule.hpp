#pragma once
/// \file zerotk/engine/schedule.hpp
/// Schedule: the engine's parameter groups' hyper-parameters and the LR scheduler that moves them.
/// The groups here are the ones the trainer sees (Engine::lr(), StepReport::group_lr); each store's
/// optimizer holds a copy that apply() brings up to date, except while a delayed update runs on it
/// (it gets the new values at the next boundary).

#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

#include "zerotk/optim/optimizer.hpp"
#include "zerotk/optim/schedulers.hpp"

namespace zerotk::engine {

class Schedule {
 public:
  explicit Schedule(std::vector<ParamGroup> groups) : groups_(std::move(groups)) {}

  const std::vector<ParamGroup>& groups() const noexcept { return groups_; }
  /// Group g's learning rate for the next update.
  double lr(std::size_t g) const { return groups_[g].options.lr; }
  std::vector<double> lrs() const {
    std::vector<double> out;
    for (const ParamGroup& g : groups_) out.push_back(static_cast<double>(g.options.lr));
    return out;
  }

  bool has_scheduler() const noexcept { return scheduler_.has_value(); }
  void set(LrScheduler s) { scheduler_ = std::move(s); }
  /// After a non-skipped update (DeepSpeed steps its scheduler there only).
  void step() {
    if (scheduler_) scheduler_->step();
  }
  std::optional<optim::SchedulerState> state() const {
    if (!scheduler_) return std::nullopt;
    return scheduler_->state();
  }
  void load_state(const optim::SchedulerState& s) {
    if (scheduler_) scheduler_->load_state(s);
  }

  /// The scheduler's lr (and OneCycle's momentum) into the groups, and into every group's optimizer
  /// that is not running a delayed update.
  template <class Groups>
  void apply(Groups& groups) {
    if (!scheduler_) return;
    const double lr_now = scheduler_->lr();
    const std::optional<Betas> betas = scheduler_->betas();  // OneCycle with cycle_momentum: (mom, 0.99)
    auto set = [&](std::vector<ParamGroup>& gs) {
      for (auto& pg : gs) {
        pg.options.lr = lr_now;  // doubles: rounded to float only at the kernel boundary
        if (betas) {
          pg.options.beta1 = betas->beta1;
          pg.options.beta2 = betas->beta2;
        }
      }
    };
    set(groups_);
    groups.each([&](auto& g) {
      if (!g.update_running()) set(g.store().optimizer().groups());
    });
  }

 private:
  std::vector<ParamGroup> groups_;
  std::optional<LrScheduler> scheduler_;
};

}  // namespace zerotk::engine
