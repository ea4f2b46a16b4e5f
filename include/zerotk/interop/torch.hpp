#pragma once
/// \file zerotk/interop/torch.hpp
/// libtorch adapter: a `torch::nn::Module`'s parameters become zerotk Parameters in place, and one
/// `loss.backward()` hands each gradient to the engine as autograd produces it. Requires libtorch
/// (target zerotk::torch; Debian 12: libtorch-dev 1.13). Stages 0-3; fp32, bf16, fp16 (float32
/// tensors); `Device<Host>`.
///
///   zerotk::interop::TorchModel model(*net);             // named_parameters(), frozen ones left out
///   Engine engine(comm, model, options);                 // adopts the values, re-points the tensors
///   zerotk::interop::TorchGradients grads(engine, model);  // hooks on the gradient accumulators
///   for (...) {
///     torch::Tensor out = grads.forward(net, x);         // a Sequential child by child (stage 3
///                                                        // gathers each; stages 0-2: net->forward(x))
///     torch::Tensor loss = criterion(out, y);
///     grads.backward(loss);                              // loss * loss_scale, then loss.backward()
///     zerotk::StepReport r = grads.step(loss.item<double>());
///   }
///   grads.release_module();                              // the module keeps its values (collective at 3)
///
/// How it binds: after the engine is built every parameter tensor's data is `from_blob` over the
/// engine's storage (`set_data`, same TensorImpl, so the module's own fields and every alias of the
/// tensor keep working). Each parameter's gradient accumulator (autograd's AccumulateGrad node) gets
/// a post hook: when autograd has accumulated the parameter's gradient, the hook opens the engine's
/// backward scope for that parameter alone, adds the gradient into the engine's gradient storage,
/// drops the tensor's `.grad()`, and closes the scope; a bucket whose last parameter closes starts
/// reducing while autograd continues with the earlier layers.
///
/// Stage 3: libtorch modules have no forward hooks in C++, so each direct child's forward runs
/// through `grads.forward(name, fn, x)` (or `grads.forward(sequential, x)`): an autograd function
/// gathers the child's parameters, runs fn with autograd on (the child's graph is kept), releases
/// them; its backward gathers again, runs the child's graph with torch::autograd::grad and releases.
/// The graph's saved tensors that view a parameter (a Linear's `weight.t()`) share the parameter's
/// Storage, which the adapter re-points at every gather and nulls at every release
/// (TorchParam): they read the values gathered for the backward, never released memory, and keep
/// no gathered memory alive. Outside these calls the parameter tensors are empty.
/// `grads.checkpoint(name, fn, x)` keeps only the child's input instead and recomputes fn in
/// backward (activation checkpointing, at every stage), replaying torch's CPU generator, so dropout
/// inside fn draws the forward's mask again (one rank per process: thread ranks share the
/// generator); otherwise fn must compute the same output from the same input.
///
/// Errors inside backward (a refused gradient, a child's backward or recompute that throws, any
/// exception out of grads.backward) are kept on the failing rank, which carries on with zero
/// gradients; step() agrees across ranks, and every rank throws: the failed one its own error, the
/// others one naming it and its reason (TorchGradients' class comment).
///
/// Tied weights: the same tensor registered in two modules (`lm_head->weight = emb->weight` through
/// register_parameter) is one parameter, named by its first name in named_parameters() order; the
/// other names are listed by aliases(). Two distinct tensors that share storage (a view of another
/// parameter) are refused, naming both.

#include "zerotk/core/macros.hpp"

#if !ZEROTK_HAS_TORCH
#error "zerotk/interop/torch.hpp needs libtorch: link the CMake target zerotk::torch (it defines ZEROTK_HAS_TORCH=1), or, in a vendored copy, define ZEROTK_HAS_TORCH=1 and put libtorch (Debian: libtorch-dev) on the include path"
#endif

#include <torch/torch.h>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "zerotk/comm/agree.hpp"
#include "zerotk/comm/any.hpp"
#include "zerotk/core/concepts.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/engine/api.hpp"

namespace zerotk::interop {

/// One trainable tensor of a torch module, as a zerotk Parameter. The tensor stays the module's
/// (same TensorImpl); bind() re-points its data at engine storage.
///
/// The tensor reads the engine's memory through one torch Storage that this object owns for its
/// whole life and re-points on every bind (a non-owning pointer; null while stage 3 has the values
/// released). Every view of the tensor shares that Storage: a `weight.t()` autograd saved in a
/// child's forward reads what the tensor reads now, the values gathered again for the child's
/// backward, never the pool buffer the forward read (which may hold another child's values by
/// then); between the two it reads nothing (torch's checked accessors refuse a null storage).
class TorchParam {
 public:
  using value_type = float;

  /// Refuses what cannot live in a flat fp32 buffer in place, naming the parameter.
  TorchParam(std::string name, torch::Tensor tensor) : name_(std::move(name)), tensor_(std::move(tensor)) {
    if (tensor_.layout() != torch::kStrided) {
      throw usage_error("torch parameter is not a dense (strided) tensor; sparse parameters cannot be bound", name_);
    }
    if (tensor_.scalar_type() != torch::kFloat32) {
      throw usage_error("torch parameter must be float32 (the engine's Precision<> decides the stored type; "
                        "convert the module with module->to(torch::kFloat32) before wrapping)",
                        name_, std::string(c10::toString(tensor_.scalar_type())));
    }
    if (!tensor_.device().is_cpu()) {
      throw usage_error("torch parameter must be on the CPU (the adapter supports Device<Host> only)", name_,
                        tensor_.device().str());
    }
    if (!tensor_.is_contiguous()) {
      throw usage_error("torch parameter is not contiguous; make it contiguous before wrapping", name_);
    }
    for (std::int64_t d : tensor_.sizes()) sizes_.push_back(d);
    for (std::int64_t d : tensor_.sizes()) shape_.push_back(static_cast<std::size_t>(d));
    numel_ = static_cast<std::size_t>(tensor_.numel());
    // Not resizable: a resize_ of the bound tensor is refused by torch instead of re-allocating
    // behind the engine.
    storage_ = c10::Storage(c10::Storage::use_byte_size_t(), 0, at::DataPtr(nullptr, at::Device(at::kCPU)), nullptr,
                            /*resizable=*/false);
  }
  TorchParam(const TorchParam&) = delete;
  TorchParam& operator=(const TorchParam&) = delete;
  TorchParam(TorchParam&&) = default;
  TorchParam& operator=(TorchParam&&) = default;

  const std::string& name() const noexcept { return name_; }
  std::size_t numel() const noexcept { return numel_; }
  const std::vector<std::size_t>& shape() const noexcept { return shape_; }
  torch::Tensor& tensor() noexcept { return tensor_; }
  const torch::Tensor& tensor() const noexcept { return tensor_; }

  /// Before the engine binds: the tensor's own values (the engine adopts them). After: engine storage.
  float* data() noexcept { return bound_ ? data_ : static_cast<float*>(tensor_.data_ptr()); }
  float* grad() noexcept { return grad_; }

  /// Points the tensor at `data` (numel floats of engine storage) when it moved; `grad` is where
  /// the engine wants this parameter's gradient now.
  void bind(float* data, float* grad) {
    if (detached_) return;
    grad_ = grad;
    if (bound_ && data == data_) return;
    data_ = data;
    bound_ = true;
    torch::NoGradGuard no_grad;
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
    if (data == nullptr) {  // stage 3 released the values: an empty tensor, as DeepSpeed's
      tensor_.set_data(torch::empty({0}, f32));
      point_storage_at(nullptr);  // and the views autograd saved read nothing
    } else {
      point_storage_at(data);  // the views autograd saved read the values from here on
      tensor_.set_data(torch::empty({0}, f32).set_(storage_, 0, sizes_));
    }
  }

  /// Stage 3: whether the values are gathered now (outside scopes the tensor is empty).
  bool has_values() const noexcept { return !bound_ || data_ != nullptr; }

  /// Whether the tensor still reads the engine's storage (not re-allocated by module->to(...),
  /// set_data or an assignment behind the engine's back).
  bool still_bound() const {
    if (!bound_) return true;
    if (tensor_.scalar_type() != torch::kFloat32) return false;
    if (data_ == nullptr) return tensor_.numel() == 0;
    return tensor_.data_ptr() == static_cast<void*>(data_) && tensor_.numel() == static_cast<std::int64_t>(numel_) &&
           tensor_.is_contiguous();
  }
  void require_bound() const {
    if (still_bound()) return;
    throw usage_error("torch parameter no longer points at the engine's storage: the module re-allocated it after "
                      "wrapping (module->to(...), set_data, or assigning a new tensor); convert the module before "
                      "building the engine",
                      name_,
                      std::string(c10::toString(tensor_.scalar_type())) + " tensor of " +
                          std::to_string(tensor_.numel()) + " elements");
  }

  /// Gives the tensor its own copy of the current values again and stops following the engine
  /// (its storage is about to go away). Stage 3: call it while the values are gathered.
  void unbind() {
    if (!bound_) return;
    if (data_ != nullptr && still_bound()) {
      torch::NoGradGuard no_grad;
      tensor_.set_data(tensor_.detach().clone());
    }
    point_storage_at(nullptr);  // views made while bound read nothing, not the engine's freed memory
    bound_ = false;
    detached_ = true;
    data_ = nullptr;
    grad_ = nullptr;
  }

 private:
  void point_storage_at(float* data) {
    storage_.set_data_ptr_noswap(at::DataPtr(data, at::Device(at::kCPU)));  // not owning: the engine's memory
    storage_.set_nbytes(data != nullptr ? numel_ * sizeof(float) : 0);
  }

  std::string name_;
  torch::Tensor tensor_;
  c10::Storage storage_;  // [numel] float over engine storage while bound (null when released)
  std::vector<std::int64_t> sizes_;
  std::vector<std::size_t> shape_;
  std::size_t numel_ = 0;
  float* data_ = nullptr;  // [numel] engine storage the tensor reads, once bound
  float* grad_ = nullptr;  // [numel] where the engine wants the gradient now
  bool bound_ = false;
  bool detached_ = false;  // unbind() ran: later binds are ignored
};

static_assert(Parameter<TorchParam>);

/// A torch module's trainable parameters as a zerotk Module, in named_parameters() order.
/// Neither copyable nor movable: the engine keeps the addresses of its parameters.
class TorchModel {
 public:
  explicit TorchModel(torch::nn::Module& module) {
    std::unordered_map<const void*, std::size_t> by_impl;    // TensorImpl -> index into params_
    std::unordered_map<const void*, std::string> by_storage;  // StorageImpl -> the first name using it
    std::vector<std::pair<std::string, torch::Tensor>> keep;
    for (const auto& item : module.named_parameters(/*recurse=*/true)) {
      const torch::Tensor& t = item.value();
      const void* impl = t.unsafeGetTensorImpl();
      if (auto it = by_impl.find(impl); it != by_impl.end()) {
        aliases_.emplace_back(item.key(), keep[it->second].first);
        continue;
      }
      if (!t.requires_grad()) {
        frozen_.push_back(item.key());
        continue;
      }
      if (t.layout() == torch::kStrided && t.has_storage()) {
        const void* storage = t.storage().unsafeGetStorageImpl();
        if (auto it = by_storage.find(storage); it != by_storage.end()) {
          throw usage_error("two torch parameters share storage (one is a view of the other); tie weights by "
                            "registering the same tensor in both modules instead",
                            item.key(), it->second);
        }
        by_storage.emplace(storage, item.key());
      }
      by_impl.emplace(impl, keep.size());
      keep.emplace_back(item.key(), t);
    }
    params_.reserve(keep.size());
    for (auto& [name, t] : keep) params_.emplace_back(name, t);
    // Stage 3's fetch units: the module's direct children, each with the parameters under its name.
    for (const auto& child : module.named_children()) {
      children_.push_back(child.key());
      Unit u{child.key(), {}};
      for (TorchParam& p : params_) {
        if (first_segment(p.name()) == child.key()) u.params.push_back(&p);
      }
      if (!u.params.empty()) units_.push_back(std::move(u));
    }
    for (const auto& [alias, name] : aliases_) {
      if (first_segment(alias) != first_segment(name)) cross_unit_aliases_.emplace_back(alias, name);
    }
  }

  /// A direct child of the module with the parameters under its name: one fetch unit at stage 3.
  struct Unit {
    std::string name;
    std::vector<TorchParam*> params;
    template <class Visit>
    void parameters(Visit&& visit) {
      for (TorchParam* p : params) visit(p->name(), *p);
    }
  };
  /// The units, for the engine (stage 3 gathers one unit's parameters together).
  template <class Visit>
  void modules(Visit&& visit) {
    for (Unit& u : units_) visit(u);
  }
  /// The unit of the child `name`, or null if that child has no trainable parameter.
  Unit* unit(std::string_view name) noexcept {
    for (Unit& u : units_) {
      if (u.name == name) return &u;
    }
    return nullptr;
  }
  std::size_t unit_count() const noexcept { return units_.size(); }
  /// Whether the module has a direct child named `name` (with or without trainable parameters).
  bool has_child(std::string_view name) const noexcept {
    return std::find(children_.begin(), children_.end(), name) != children_.end();
  }
  /// The direct children's names, in named_children() order.
  const std::vector<std::string>& children() const noexcept { return children_; }
  /// Tied tensors whose names sit under two different children (stage 3 refuses them).
  const std::vector<std::pair<std::string, std::string>>& cross_unit_aliases() const noexcept {
    return cross_unit_aliases_;
  }
  TorchModel(const TorchModel&) = delete;
  TorchModel& operator=(const TorchModel&) = delete;

  template <class Visit>
  void parameters(Visit&& visit) {
    for (TorchParam& p : params_) visit(p.name(), p);
  }

  std::size_t size() const noexcept { return params_.size(); }
  TorchParam& operator[](std::size_t i) noexcept { return params_[i]; }
  const TorchParam& operator[](std::size_t i) const noexcept { return params_[i]; }
  /// (alias, parameter): a tensor met again under another name (tied weights).
  const std::vector<std::pair<std::string, std::string>>& aliases() const noexcept { return aliases_; }
  /// Parameters with requires_grad false: left to the module, not trained.
  const std::vector<std::string>& frozen() const noexcept { return frozen_; }

  /// Every bound tensor still reads the engine's storage, or a usage_error naming the first that does not.
  void require_bound() const {
    for (const TorchParam& p : params_) p.require_bound();
  }
  /// Every tensor gets its own copy of its current values (before the engine goes away).
  void unbind() {
    for (TorchParam& p : params_) p.unbind();
  }

 private:
  static std::string_view first_segment(std::string_view name) noexcept { return name.substr(0, name.find('.')); }

  std::vector<TorchParam> params_;
  std::vector<Unit> units_;
  std::vector<std::pair<std::string, std::string>> aliases_, cross_unit_aliases_;
  std::vector<std::string> children_;  // every direct child, parameters or not
  std::vector<std::string> frozen_;
};

static_assert(Module<TorchModel>);

namespace detail {
/// The engine's backward scope is opened per parameter: each is its own "layer" of one parameter.
struct OneTorchParam {
  TorchParam* p;
  template <class Visit>
  void parameters(Visit&& visit) {
    visit(p->name(), *p);
  }
};

/// One call of a unit's forward through TorchGradients::forward at stage 3 or checkpoint: what its
/// backward needs. Kept by TorchGradients until the next step().
struct TorchCall {
  std::function<torch::Tensor(const torch::Tensor&)> fn;
  void* unit;                // TorchModel::Unit
  torch::Tensor rng_state{};  // checkpoint: torch's CPU generator as the forward found it (the recompute replays it)
  torch::Tensor in{}, out{};  // stage 3's forward: fn's input (detached from the caller's graph) and output,
                              // with the child's own autograd graph between them until its backward
};

/// The autograd context's record of which TorchGradients call a node belongs to, and of which
/// micro-step (a node of an earlier one must not reach its call: step() dropped them).
template <class Owner>
void remember(torch::autograd::AutogradContext* ctx, Owner* owner, TorchCall* call) {
  ctx->saved_data["owner"] = static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(owner));
  ctx->saved_data["call"] = static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(call));
  ctx->saved_data["micro_step"] = owner->micro_step();
}
template <class Owner>
std::pair<Owner*, TorchCall*> recall(torch::autograd::AutogradContext* ctx) {
  auto* owner = reinterpret_cast<Owner*>(static_cast<std::intptr_t>(ctx->saved_data["owner"].toInt()));
  owner->require_micro_step(ctx->saved_data["micro_step"].toInt());
  return {owner, reinterpret_cast<TorchCall*>(static_cast<std::intptr_t>(ctx->saved_data["call"].toInt()))};
}

/// torch's default CPU generator's state now.
inline torch::Tensor cpu_rng_state() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

/// For a recompute: torch's default CPU generator set to the state the forward found, so the
/// recomputed forward draws what the first one drew (the same dropout mask), and put back when the
/// guard ends, so the stream goes on as if no recompute had run (torch.utils.checkpoint's
/// preserve_rng_state, for the CPU generator). The generator is one per process: on several thread
/// ranks their draws interleave, and neither the forward's masks nor this replay are reproducible.
class ReplayCpuRng {
 public:
  explicit ReplayCpuRng(const torch::Tensor& state) : gen_(at::detail::getDefaultCPUGenerator()) {
    if (!state.defined()) return;
    std::lock_guard<std::mutex> lock(gen_.mutex());
    saved_ = gen_.get_state();
    gen_.set_state(state);
  }
  ~ReplayCpuRng() {
    if (!saved_.defined()) return;
    try {
      std::lock_guard<std::mutex> lock(gen_.mutex());
      gen_.set_state(saved_);
    } catch (...) {  // a state this generator produced itself: cannot be refused
    }
  }
  ReplayCpuRng(const ReplayCpuRng&) = delete;
  ReplayCpuRng& operator=(const ReplayCpuRng&) = delete;

 private:
  at::Generator gen_;
  torch::Tensor saved_;
};

/// Activation checkpointing's autograd function around one unit's forward (TorchGradients::
/// checkpoint). Forward: (stage 3: gather,) run without recording, (release); only the input is
/// kept. Backward: (gather again,) run the forward again with autograd on, take the parameters' and
/// the input's gradients with torch::autograd::grad, hand the parameters' to the engine, (release).
template <class Owner>
struct GatheredCall : torch::autograd::Function<GatheredCall<Owner>> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& /*anchor*/, Owner* owner, TorchCall* call) {
    remember(ctx, owner, call);
    ctx->save_for_backward({x});
    return owner->gathered_forward(*call, x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto [owner, call] = recall<Owner>(ctx);
    const torch::Tensor x = ctx->get_saved_variables()[0];
    return {owner->gathered_backward(*call, x, grad_outputs[0]), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

/// Stage 3's autograd function around one unit's forward (TorchGradients::forward). Forward: gather,
/// run fn with autograd on from a detached copy of the input (the child's own graph, kept in the
/// call), release. Backward: gather again, run the child's graph with torch::autograd::grad, hand
/// the parameters' gradients to the engine, release. The graph's saved views of the parameters
/// read the values gathered for the backward (TorchParam's Storage), so nothing is recomputed.
template <class Owner>
struct SavedGraphCall : torch::autograd::Function<SavedGraphCall<Owner>> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& /*anchor*/, Owner* owner, TorchCall* call) {
    remember(ctx, owner, call);
    return owner->saved_graph_forward(*call, x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto [owner, call] = recall<Owner>(ctx);
    return {owner->saved_graph_backward(*call, grad_outputs[0]), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

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
