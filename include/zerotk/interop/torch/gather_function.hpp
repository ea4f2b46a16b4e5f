#pragma once
/// \file zerotk/interop/torch/gather_function.hpp
/// The libtorch adapter's autograd functions around one child's forward: what a call keeps for its
/// backward, and stage 3's function that gathers the child and keeps its graph (zerotk/interop/torch.hpp).
#include "zerotk/interop/torch/libtorch.hpp"

#include <cstdint>
#include <functional>
#include <utility>

#include "zerotk/interop/torch/param.hpp"

namespace zerotk::interop {

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

}  // namespace detail

}  // namespace zerotk::interop
