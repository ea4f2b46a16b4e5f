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

#include "zerotk/interop/torch/checkpoint.hpp"       // activation checkpointing's autograd function
#include "zerotk/interop/torch/gather_function.hpp"  // stage 3's autograd function, a call's record
#include "zerotk/interop/torch/gradients.hpp"        // TorchGradients
#include "zerotk/interop/torch/libtorch.hpp"         // the libtorch headers, and the check that they are there
#include "zerotk/interop/torch/model.hpp"            // TorchModel
#include "zerotk/interop/torch/param.hpp"            // TorchParam
#include "zerotk/interop/torch/rng.hpp"              // the CPU generator's replay
