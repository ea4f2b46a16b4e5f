#pragma once
/// \file zerotk/interop/torch/checkpoint.hpp
/// The libtorch adapter's activation checkpointing: the autograd function that keeps only a child's
/// input and recomputes its forward in backward (zerotk/interop/torch.hpp).
#include "zerotk/interop/torch/libtorch.hpp"

#include "zerotk/interop/torch/gather_function.hpp"

namespace zerotk::interop {

namespace detail {

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

}  // namespace detail

}  // namespace zerotk::interop
