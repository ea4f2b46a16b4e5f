#pragma once
/// \file zerotk/interop/torch/gradients.hpp
/// The libtorch adapter's TorchGradients: autograd connected to an engine built over a TorchModel
/// (hooks on the gradient accumulators, stage 3's per-child gathers, errors agreed across ranks).
#include "zerotk/interop/torch/libtorch.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zerotk/comm/agree.hpp"
#include "zerotk/comm/any.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/engine/api.hpp"
#include "zerotk/interop/torch/checkpoint.hpp"
#include "zerotk/interop/torch/gather_function.hpp"
#include "zerotk/interop/torch/model.hpp"
#include "zerotk/interop/torch/param.hpp"
#include "zerotk/interop/torch/rng.hpp"

namespace zerotk::interop {

namespace detail {

/// Runs after autograd accumulated one parameter's gradient (a post hook of its AccumulateGrad).
template <class Owner>
struct AccumulatedHook final : torch::autograd::FunctionPostHook {
  AccumulatedHook(Owner* owner, std::size_t index) : owner_(owner), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    owner_->accumulated(index_);
    return outputs;
  }
  Owner* owner_;
  std::size_t index_;
};

}  // namespace detail

/// Connects autograd to an engine built over a TorchModel: hooks on every parameter's gradient
/// accumulator (stages 0-2), for as long as this object lives. Build it after the engine; destroy it
/// before the engine. At stages 0-2 its destructor gives the tensors their own copies of the values,
/// so the module stays usable after the engine is gone; at stage 3 call release_module() on every
/// rank for that (it gathers).
///
/// Errors inside backward: an exception raised in a hook, a child's backward or a recompute (a
/// refused gradient, a tensor re-allocated behind the engine, the user's recomputed forward
/// throwing, an autograd node of a child throwing), or one that
/// stops `grads.backward(loss)` early, is kept, and this rank carries on with zero gradients for
/// what it could not take, so it issues the reductions its peers wait for. step() then agrees
/// across ranks (comm::agree_on_failure, one int32 all-reduce per micro-step): the failed rank
/// rethrows its error, every other rank throws an error of the same kind naming the failed rank
/// and quoting its reason, at once instead of at the communicator's timeout. That micro-step is
/// lost: end training there (destroy this object and the engine on every rank) or build anew.
/// Engine: a typed engine (its stage is a compile-time constant: the autograd paths of stage 3 and of
/// stages 0-2 are different code); AnyEngine is refused for that reason.
template <TrainingEngine Engine>
  requires requires { Engine::kStage; }
class TorchGradients {
  static constexpr bool kSharded = Engine::kStage == 3;

 public:
  TorchGradients(Engine& engine, TorchModel& model)
      : engine_(&engine), model_(&model), got_(model.size(), 0) {
    if (kSharded && !model.cross_unit_aliases().empty()) {
      throw usage_error("stage 3 gathers one child module's parameters at a time; a tensor tied across two children "
                        "is not supported there (use stages 0-2, or keep the tied modules in one child)",
                        model.cross_unit_aliases().front().first, model.cross_unit_aliases().front().second);
    }
    if (!kSharded && engine.options().overlap_param_gather) {
      // Its forward scopes would wait for the updated parameters' all-gather; a torch module's
      // forward reads them without any scope, possibly before the gather has finished.
      throw usage_error("overlap_param_gather cannot be used with a torch module: its forward reads the parameters "
                        "outside zerotk's scopes, before the all-gather of the update may have finished",
                        "EngineOptions::overlap_param_gather", "true");
    }
    units_.reserve(model.size());
    hooks_.reserve(model.size());
    for (std::size_t i = 0; i < model.size(); ++i) {
      units_.push_back(detail::OneTorchParam{&model[i]});
      model[i].require_bound();
      // Stage 3 takes the gradients in each child's backward instead (torch::autograd::grad), and
      // must not hold the accumulators: one made while the tensor is empty would keep that shape
      // as its metadata.
      if constexpr (kSharded) continue;
      std::shared_ptr<torch::autograd::Node> acc = torch::autograd::impl::grad_accumulator(model[i].tensor());
      if (!acc) throw usage_error("torch parameter has no gradient accumulator (not a leaf?)", model[i].name());
      const std::uintptr_t key = acc->add_post_hook(std::make_unique<detail::AccumulatedHook<TorchGradients>>(this, i));
      hooks_.push_back({std::move(acc), key});
    }
  }
  TorchGradients(const TorchGradients&) = delete;
  TorchGradients& operator=(const TorchGradients&) = delete;
  /// Stages 0-2: the tensors get their own copies of the last values (the module outlives the
  /// engine). Stage 3: call release_module() on every rank first, or the tensors stay empty.
  ~TorchGradients() {
    for (Hook& h : hooks_) h.accumulator->del_post_hook(h.key);
    if constexpr (!kSharded) model_->unbind();
  }

  /// The module's tensors get their own copies of the current values and stop following the engine
  /// (the end of training). Stage 3: collective (it gathers every parameter).
  void release_module() {
    if constexpr (kSharded) {
      auto all = engine_->gather(*model_);
      model_->unbind();
    } else {
      model_->unbind();
    }
  }

  /// Runs `fn(x)`, the forward of the module's child `unit` (a name from named_children()). Stages
  /// 0-2: just fn(x). Stage 3: an autograd function gathers the child's parameters, runs fn with
  /// autograd on and releases them; the child's graph is kept, and its backward gathers them again
  /// and runs that graph (detail::SavedGraphCall): the views of the parameters it saved read the
  /// values gathered again, never the released ones. It is kept until step(). Under
  /// torch::NoGradGuard (evaluation) fn just runs gathered, keeping nothing.
  template <class F>
  torch::Tensor forward(std::string_view unit, F&& fn, const torch::Tensor& x) {
    require_child(unit, "TorchGradients::forward");
    if constexpr (!kSharded) {
      return fn(x);
    } else {
      TorchModel::Unit* u = model_->unit(unit);
      if (u == nullptr) return fn(x);  // no trainable parameter: nothing to gather
      if (!torch::GradMode::is_enabled()) {
        auto scope = engine_->forward(*u);
        return in_unit(*u, "TorchGradients::forward", [&] { return not_a_view_of(*u, fn(x)); });
      }
      calls_.push_back(detail::TorchCall{std::forward<F>(fn), u});
      return detail::SavedGraphCall<TorchGradients>::apply(x, anchor_, this, &calls_.back());
    }
  }

  /// Activation checkpointing of the child `unit`: the forward keeps no activations of fn (only its
  /// input), the backward runs fn again (replaying torch's CPU generator, so dropout draws the
  /// forward's mask; fn must otherwise compute the same output from the same input) and takes the
  /// gradients from that graph, handing the child's parameter gradients to the engine
  /// (detail::GatheredCall). Stage 3 gathers the child around the forward and again around the
  /// recompute: less activation memory than forward(), one more forward of the child.
  template <class F>
  torch::Tensor checkpoint(std::string_view unit, F&& fn, const torch::Tensor& x) {
    require_child(unit, "TorchGradients::checkpoint");
    if (!torch::GradMode::is_enabled()) return forward(unit, std::forward<F>(fn), x);  // nothing to recompute
    calls_.push_back(detail::TorchCall{std::forward<F>(fn), model_->unit(unit)});
    return detail::GatheredCall<TorchGradients>::apply(x, anchor_, this, &calls_.back());
  }

  /// Runs a Sequential child by child through forward(name, ...).
  torch::Tensor forward(torch::nn::Sequential& seq, torch::Tensor x) {
    std::size_t i = 0;
    for (auto it = seq->begin(); it != seq->end(); ++it, ++i) {
      torch::nn::AnyModule* m = &*it;
      x = forward(std::to_string(i), [m](const torch::Tensor& in) { return m->forward(in); }, x);
    }
    return x;
  }

  /// `loss * engine.loss_scale()` (as is, when the scale is 1), then one backward through autograd.
  /// An exception that stops autograd on this rank is kept for step() (see the class comment), and
  /// the backward scopes autograd did not reach are completed with zero gradients.
  void backward(const torch::Tensor& loss) {
    try {
      const double scale = engine_->loss_scale();
      if (scale == 1.0) {
        loss.backward();
      } else {
        (loss * scale).backward();
      }
    } catch (...) {
      record(std::current_exception());
      complete_after_abort();
    }
  }

  /// Checks that no tensor was re-allocated behind the engine's back, gives every parameter that got
  /// no gradient in this micro-step (unused in the forward) a zero one, agrees with the other ranks
  /// on whether any rank's backward failed (throwing on every rank if one did), then
  /// engine.step(loss).
  auto step(double loss = 0.0) {
    try {
      model_->require_bound();
    } catch (...) {
      record(std::current_exception());
    }
    for (std::size_t i = 0; i < got_.size(); ++i) {
      if (!got_[i]) complete(i);  // an empty scope: this parameter's gradient is zero
    }
    std::fill(got_.begin(), got_.end(), 0);
    calls_.clear();  // with the children's graphs that no backward reached
    ++micro_step_;
    const std::exception_ptr mine = std::exchange(failure_, nullptr);
    comm::AnyCommunicator& world = engine_->step_communicator();
    if (const std::optional<comm::Failure> f = comm::agree_on_failure(world, mine)) {
      if (mine) std::rethrow_exception(mine);
      throw_error(f->kind.value_or(ErrorKind::usage), "backward failed on rank " + std::to_string(f->rank) + ": " + f->reason,
                  "rank " + std::to_string(world.rank()));
    }
    return engine_->step(loss);
  }

  /// A name that is no direct child of the module is a usage error at every stage (issue 57 item 14:
  /// stages 0-2 trained on, and stage 3 failed inside torch with a shape error).
  void require_child(std::string_view unit, const char* where) const {
    if (model_->has_child(unit)) return;
    std::string names;
    for (const std::string& c : model_->children()) names += (names.empty() ? "" : ", ") + c;
    throw usage_error("the module has no direct child of this name (its children: " + (names.empty() ? "none" : names) + ")",
                      where, std::string(unit));
  }

  /// Stage 3: runs a child's forward inside its gather. A torch error there, while the parameters
  /// of other children are released (empty tensors), becomes a usage_error naming those children:
  /// a function that reads another child's parameters would otherwise fail with a shape error from
  /// inside torch (issue 57 item 14). Other errors, and torch's when no other child is released,
  /// pass as they are. (Outside every zerotk call the parameters are empty too; torch's error there
  /// never passes through the adapter: docs/interop.md.)
  template <class Run>
  torch::Tensor in_unit(const TorchModel::Unit& unit, const char* where, Run&& run) {
    try {
      return run();
    } catch (const c10::Error& e) {
      std::string released;
      model_->modules([&](const TorchModel::Unit& u) {
        if (&u == &unit || u.params.empty() || u.params.front()->has_values()) return;
        released += (released.empty() ? "\"" : ", \"") + u.name + "\"";
      });
      if (released.empty()) throw;
      std::string said = e.what_without_backtrace();
      if (const auto nl = said.find('\n'); nl != std::string::npos) said.resize(nl);
      throw usage_error("torch failed in the forward of child \"" + unit.name + "\" at stage 3 (torch: " + said +
                            "); only that child's parameters are gathered there, and the parameters of " + released +
                            " are released (empty tensors): a function that uses another child's parameters must "
                            "run them in that child's own forward(name, fn, x)",
                        where, unit.name);
    }
  }

  /// GatheredCall's forward: fn without a graph (stage 3: inside the unit's gather); an output that
  /// is a view of the parameters is copied. Records torch's CPU generator state for the recompute.
  torch::Tensor gathered_forward(detail::TorchCall& call, const torch::Tensor& x) {
    call.rng_state = detail::cpu_rng_state();
    auto* unit = static_cast<TorchModel::Unit*>(call.unit);
    if (unit == nullptr) return call.fn(x);  // a checkpointed child without trainable parameters
    if constexpr (kSharded) {
      auto scope = engine_->forward(*unit);
      return in_unit(*unit, "TorchGradients::checkpoint", [&] { return not_a_view_of(*unit, call.fn(x)); });
    } else {
      return not_a_view_of(*unit, call.fn(x));
    }
  }

  /// GatheredCall's backward: (stage 3: gather,) recompute, the parameters' gradients into the
  /// engine, dL/dx back. A failure is kept for step(); then dL/dx is zero (autograd and this rank's
  /// collectives go on) and the unit's parameters get zero gradients.
  torch::Tensor gathered_backward(detail::TorchCall& call, const torch::Tensor& x, const torch::Tensor& dy) {
    static TorchModel::Unit no_params;
    TorchModel::Unit& unit = call.unit != nullptr ? *static_cast<TorchModel::Unit*>(call.unit) : no_params;
    return in_backward_scope(unit, x, [&] { return recompute(unit, call, x, dy); });
  }

  /// SavedGraphCall's forward (stage 3): inside the unit's gather, fn with autograd on from a
  /// detached copy of x; the child's graph stays with the call, the caller's graph gets a detached
  /// alias of the output (an output that is a view of the parameters is copied first).
  torch::Tensor saved_graph_forward(detail::TorchCall& call, const torch::Tensor& x) {
    auto& unit = *static_cast<TorchModel::Unit*>(call.unit);
    torch::AutoGradMode grad_on(true);
    torch::Tensor in = x.detach();
    if (x.requires_grad()) in.requires_grad_(true);
    torch::Tensor y;
    {
      auto scope = engine_->forward(unit);
      y = in_unit(unit, "TorchGradients::forward", [&] { return not_a_view_of(unit, call.fn(in)); });
    }
    call.in = in;
    call.out = y;
    return y.detach();
  }

  /// SavedGraphCall's backward (stage 3): inside the unit's backward scope (gathered again, the
  /// gradient storage bound), the child's graph from the output to the parameters and the input;
  /// the graph goes with it. A failure is kept for step(), as in gathered_backward.
  torch::Tensor saved_graph_backward(detail::TorchCall& call, const torch::Tensor& dy) {
    auto& unit = *static_cast<TorchModel::Unit*>(call.unit);
    const torch::Tensor in = std::exchange(call.in, torch::Tensor());
    const torch::Tensor out = std::exchange(call.out, torch::Tensor());
    return in_backward_scope(unit, in, [&] { return hand_over(unit, out, in, dy); });
  }

  /// The micro-step the adapter is in (step() ends one): a child's autograd node records it.
  std::int64_t micro_step() const noexcept { return micro_step_; }
  /// A child's autograd node runs in the micro-step of its forward, or a usage_error says why not.
  void require_micro_step(std::int64_t forward_micro_step) const {
    if (forward_micro_step == micro_step_) return;
    throw usage_error("backward through a graph whose forward ran before the last grads.step(): step() ended that "
                      "micro-step and dropped what its children's backward needed",
                      "TorchGradients", "forward in micro-step " + std::to_string(forward_micro_step) + ", now " +
                                            std::to_string(micro_step_));
  }

  /// How many gradients the hooks handed to the engine since the last step().
  std::size_t gradients_received() const noexcept {
    std::size_t n = 0;
    for (char g : got_) n += g != 0;
    return n;
  }

  /// The hook: autograd accumulated parameter i's gradient into its `.grad()`. An error is kept for
  /// step(); the parameter's gradient is then zero.
  void accumulated(std::size_t i) {
    try {
      take_gradient(i);
    } catch (...) {
      record(std::current_exception());
      if (!got_[i]) complete(i);
    }
    try {
      (*model_)[i].tensor().mutable_grad().reset();  // the engine holds the gradient now; autograd's copy is dropped
    } catch (...) {
      record(std::current_exception());
    }
  }

 private:
  void take_gradient(std::size_t i) {
    TorchParam& p = (*model_)[i];
    p.require_bound();
    const torch::Tensor g = p.tensor().grad();
    if (!g.defined()) return;
    if (g.is_sparse() || g.layout() != torch::kStrided) {
      throw usage_error("torch parameter got a sparse gradient (e.g. Embedding with sparse=true); the engine reduces "
                        "dense gradients only",
                        p.name());
    }
    if (kSharded) {
      throw usage_error("at stage 3 every parameter must be used inside its child module's forward(name, fn, x) "
                        "(its values are gathered only there); this one got a gradient outside",
                        p.name());
    }
    if (got_[i]) {
      throw usage_error("torch parameter received a second gradient in one micro-step (two backward() calls "
                        "before step()?)",
                        p.name());
    }
    auto scope = engine_->backward(units_[i]);
    got_[i] = 1;
    try {
      add_into(p, g);
    } catch (...) {  // kept inside the scope, so that it closes as after a backward
      record(std::current_exception());
    }
  }

  /// Parameter i's backward scope with nothing added (a zero gradient): what an unused parameter
  /// gets, and what keeps a failed rank issuing the reductions its peers wait for.
  void complete(std::size_t i) noexcept {
    got_[i] = 1;
    try {
      auto scope = engine_->backward(units_[i]);
    } catch (...) {
      record(std::current_exception());
    }
  }

  /// After an exception stopped autograd on this rank: the backward scopes it did not reach, with
  /// zero gradients, in the order autograd opens them (stage 3: the units' calls latest first;
  /// stages 0-2: the parameters latest first). The peers' order can still differ (e.g. unused
  /// parameters, which they complete in step()): then their reductions meet mismatched calls, a
  /// comm_error, not a hang.
  void complete_after_abort() {
    if constexpr (kSharded) {
      for (auto it = calls_.rbegin(); it != calls_.rend(); ++it) {
        auto* unit = static_cast<TorchModel::Unit*>(it->unit);
        if (unit == nullptr || unit->params.empty() || got_[index_of(*unit->params.front())]) continue;
        for (TorchParam* p : unit->params) got_[index_of(*p)] = 1;
        try {
          auto scope = engine_->backward(*unit);
        } catch (...) {
          record(std::current_exception());
        }
      }
    } else {
      for (std::size_t i = got_.size(); i-- > 0;) {
        if (!got_[i]) complete(i);
      }
    }
  }

  /// Keeps the first error of this micro-step (later ones are mostly its consequences).
  void record(std::exception_ptr e) noexcept {
    if (!failure_) failure_ = std::move(e);
  }

  std::size_t index_of(const TorchParam& p) const noexcept { return static_cast<std::size_t>(&p - &(*model_)[0]); }

  /// `y` itself, or a copy of it when it is a view of one of the unit's parameters (stage 3 releases
  /// those: the caller would read nothing).
  static torch::Tensor not_a_view_of(TorchModel::Unit& unit, torch::Tensor y) {
    for (TorchParam* p : unit.params) {
      if (y.is_alias_of(p->tensor())) return y.clone();
    }
    return y;
  }

  /// Runs `take()` (which hands the unit's gradients over and returns dL/dx) inside the unit's
  /// backward scope at stage 3 (gathered again; gradient storage bound). A failure is kept for
  /// step(); then dL/dx is zero (autograd and this rank's collectives go on) and the unit's
  /// parameters get zero gradients.
  template <class Take>
  torch::Tensor in_backward_scope(TorchModel::Unit& unit, const torch::Tensor& x, Take&& take) {
    std::optional<torch::Tensor> dx;
    const auto attempt = [&] {  // inside the scope, so that it closes as after a backward
      try {
        dx = take();
      } catch (...) {
        record(std::current_exception());
      }
    };
    try {
      if constexpr (kSharded) {
        if (!unit.params.empty()) {
          auto scope = engine_->backward(unit);
          attempt();
        } else {
          attempt();
        }
      } else {
        attempt();
      }
    } catch (...) {  // the scope itself
      record(std::current_exception());
    }
    if (dx) return *dx;
    for (TorchParam* p : unit.params) {
      const std::size_t i = index_of(*p);
      if constexpr (kSharded) {
        got_[i] = 1;  // its scope (if it opened) closed with what had been added: discarded
      } else if (!got_[i]) {
        complete(i);
      }
    }
    return x.defined() && x.requires_grad() ? torch::zeros_like(x) : torch::Tensor();
  }

  torch::Tensor recompute(TorchModel::Unit& unit, detail::TorchCall& call, const torch::Tensor& x,
                          const torch::Tensor& dy) {
    torch::AutoGradMode grad_on(true);
    torch::Tensor in = x.detach();
    if (x.requires_grad()) in.requires_grad_(true);
    torch::Tensor y;
    {
      detail::ReplayCpuRng replay(call.rng_state);
      y = call.fn(in);
    }
    return hand_over(unit, y, in, dy);
  }

  /// The unit's graph from `y` back to its parameters and `in`, seeded with dy: the parameters'
  /// gradients go into the engine (stage 3: inside the unit's backward scope; stages 0-2: one
  /// scope per parameter, as the hooks open), dL/d(in) is returned.
  torch::Tensor hand_over(TorchModel::Unit& unit, const torch::Tensor& y, const torch::Tensor& in,
                          const torch::Tensor& dy) {
    const bool want_dx = in.defined() && in.requires_grad();
    std::vector<torch::Tensor> g(unit.params.size() + (want_dx ? 1 : 0));
    std::vector<torch::Tensor> inputs;
    for (TorchParam* p : unit.params) inputs.push_back(p->tensor());
    if (want_dx) inputs.push_back(in);
    if (!inputs.empty() && y.defined() && y.requires_grad()) {  // else nothing reached the output
      g = torch::autograd::grad({y}, inputs, {dy}, /*retain_graph=*/false, /*create_graph=*/false, /*allow_unused=*/true);
    }
    for (std::size_t k = 0; k < unit.params.size(); ++k) {
      TorchParam& p = *unit.params[k];
      const std::size_t i = index_of(p);
      if (got_[i]) throw usage_error("torch parameter received a second gradient in one micro-step", p.name());
      got_[i] = 1;
      if constexpr (kSharded) {
        if (g[k].defined()) add_into(p, g[k]);  // inside the unit's backward scope
      } else {
        auto one = engine_->backward(units_[i]);  // an empty scope gives a zero gradient when undefined
        if (g[k].defined()) add_into(p, g[k]);
      }
    }
    return want_dx ? g.back() : torch::Tensor();
  }

  /// p.grad() += g (inside p's backward scope: the engine's gradient storage is bound).
  static void add_into(TorchParam& p, const torch::Tensor& g) {
    const torch::Tensor src = g.scalar_type() == torch::kFloat32 ? g.contiguous() : g.to(torch::kFloat32).contiguous();
    if (static_cast<std::size_t>(src.numel()) != p.numel()) {
      throw usage_error("torch gradient has the wrong number of elements", p.name(), std::to_string(src.numel()));
    }
    float* dst = p.grad();
    const float* s = src.data_ptr<float>();
    for (std::size_t k = 0; k < p.numel(); ++k) dst[k] += s[k];
  }

  struct Hook {
    std::shared_ptr<torch::autograd::Node> accumulator;  // kept alive: a tensor holds it only weakly
    std::uintptr_t key;
  };
  Engine* engine_;
  TorchModel* model_;
  std::vector<detail::OneTorchParam> units_;  // [parameter]: stable addresses (the engine's module keys)
  std::vector<Hook> hooks_;
  std::vector<char> got_;  // [parameter] its gradient arrived (or was completed) in this micro-step
  std::deque<detail::TorchCall> calls_;  // this micro-step's children's calls (stable addresses)
  std::int64_t micro_step_ = 0;          // step() calls so far
  std::exception_ptr failure_;           // the first error inside this micro-step's backward, for step()
  torch::Tensor anchor_ = torch::zeros({}, torch::TensorOptions().requires_grad(true));  // makes every
      // GatheredCall's output require grad, also when its input does not (the first layer)
};

}  // namespace zerotk::interop
