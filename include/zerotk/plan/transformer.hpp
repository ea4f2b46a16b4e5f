#pragma once
/// \file zerotk/plan/transformer.hpp
/// A GPT-2 shaped transformer as a ModelDescription: the parameter tensors and activation buffers
/// of examples/02_gpt/gpt.hpp, which is the model the planner is validated on.
///
/// Parameters (visitation order, d = hidden, F = d_ff, V = vocab, C = context):
///   embedding  wte [V][d], wpe [C][d]
///   block      ln1 (d, d), qkv (3d d, 3d), proj (d d, d), ln2 (d, d), fc (F d, F), fc_proj (d F, d)
///              = 12 d^2 + 13 d with F = 4d
///   head       ln_f (d, d), head.weight [V][d] (absent when tied: the head reads wte)
/// Activations (all fp32; R = micro_batch * sequence rows, H heads, T sequence):
///   embedding  forward: ids R int32, out R d
///   block      forward: xhat1, a, att, x1, xhat2, c, out (7d) + qkv (3d) + h, g (2F) + probs (H T)
///              + rstd1, rstd2 (2), per row; scratch: dx1, dc, datt, da, dx (5d) + dqkv (3d) + dg (F)
///              per row, dp [T][T] once (the bias / LayerNorm row sums, a few d, are not counted: the
///              example's activation_bytes() does not count them either)
///   head       forward: xhat, xf (2d) + logits (V) + rstd (1) per row; scratch: dxf, dx (2d) per row
///   loss       forward: probs (V) + targets (int32) per row; scratch: dlogits (V) per row
/// Tensor parallel (`tensor` = t > 1, the example's Megatron layout): one tensor rank's share. qkv,
/// mlp.fc and the two output projections' weights hold 1/t (q, k, v and MLP columns of its heads),
/// the LayerNorms, the row-parallel biases, the embedding and the head stay whole. A block keeps
/// xhat1, a, x1, xhat2, c, out (6d) + qkv (3d/t) + att (d/t) + h, g (2F/t) + probs (H/t T) + 2 per
/// row, scratch dx1, dc, da, dx (4d) + dqkv (3d/t) + datt (d/t) + dg (F/t) per row and dp. Sequence
/// parallel: the block's own rows are R/t (xhat1, a, x1, xhat2, c, out, rstd; dx1, dc, da, dx), and
/// it holds the gathered a and c, the partial sums, the gathered output gradient and the partial
/// input gradients (5d per row of R: 3d forward, 2d scratch).

#include <cstddef>
#include <cstdio>
#include <cstdint>
#include <string>
#include <vector>

#include "zerotk/core/error.hpp"
#include "zerotk/plan/model.hpp"

namespace zerotk::plan {

struct TransformerShape {
  std::size_t layers = 0;
  std::size_t hidden = 0;
  std::size_t heads = 0;
  std::size_t sequence = 0;
  std::size_t micro_batch = 1;
  std::size_t vocab = 0;
  std::size_t d_ff = 0;     ///< 0: 4 * hidden
  std::size_t context = 0;  ///< rows of the position embedding; 0: sequence
  bool tied_head = false;
  std::size_t tensor = 1;          ///< tensor-parallel size: the description is one tensor rank's
  bool sequence_parallel = false;  ///< with tensor > 1: the blocks' activations split by tokens

  std::size_t mlp_width() const noexcept { return d_ff ? d_ff : 4 * hidden; }
  std::size_t positions() const noexcept { return context ? context : sequence; }

  /// Throws config_error naming the flag of an impossible size.
  void validate() const {
    auto positive = [](std::size_t v, const char* flag) {
      if (v == 0) throw config_error("must be > 0", flag, "0");
    };
    positive(layers, "--layers");
    positive(hidden, "--hidden");
    positive(heads, "--heads");
    positive(sequence, "--seq");
    positive(micro_batch, "--micro-batch");
    positive(vocab, "--vocab");
    if (hidden % heads != 0) {
      throw config_error("hidden must be a multiple of heads", "--hidden",
                         std::to_string(hidden) + " with " + std::to_string(heads) + " heads");
    }
    positive(tensor, "--tp");
    if (tensor > 1 && (heads % tensor != 0 || mlp_width() % tensor != 0)) {
      throw config_error("the heads and the MLP width must divide by the tensor size (each tensor rank computes whole "
                         "heads and d_ff / t columns)",
                         "--tp", std::to_string(tensor) + " with " + std::to_string(heads) + " heads, d_ff " +
                                     std::to_string(mlp_width()));
    }
    if (sequence_parallel && (tensor < 2 || micro_batch * sequence % tensor != 0)) {
      throw config_error("needs a tensor size above 1 that divides micro batch x sequence (each tensor rank takes 1/t of "
                         "the tokens)",
                         "--sequence-parallel", "tensor " + std::to_string(tensor) + ", " +
                                                    std::to_string(micro_batch * sequence) + " tokens");
    }
    if (context != 0 && context < sequence) {
      throw config_error("the position embedding must cover the sequence", "--context",
                         std::to_string(context) + " < " + std::to_string(sequence));
    }
    // gpt_model multiplies the sizes in size_t: refuse a shape whose figures would wrap, before
    // any is computed. 2^53 also keeps every plan figure below 2^60 bytes (model_states.hpp).
    const auto [params, activation_bytes] = size_estimate();
    constexpr long double kLimit = 9007199254740992.0L;  // 2^53
    if (params > kLimit) {
      throw config_error("too large to plan: more than 2^53 parameters", "--layers, --hidden, --d-ff, --vocab, --context",
                         approximately(params) + " parameters");
    }
    if (activation_bytes > kLimit) {
      throw config_error("too large to plan: more than 2^53 activation bytes",
                         "--layers, --hidden, --heads, --seq, --micro-batch, --vocab, --d-ff",
                         approximately(activation_bytes) + " bytes");
    }
  }

  static std::string approximately(long double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3Lg", v);
    return buf;
  }

  struct SizeEstimate {
    long double params = 0;            ///< gpt_model's total_params()
    long double activation_bytes = 0;  ///< every layer's forward, scratch, input and output bytes, summed
  };
  /// The model's size in long double, which no shape overflows; exact (equal to gpt_model's
  /// size_t figures) wherever those are below 2^64 (tests/plan checks the two agree).
  SizeEstimate size_estimate() const {
    using R = long double;
    const R d = static_cast<R>(hidden), f = static_cast<R>(mlp_width()), V = static_cast<R>(vocab);
    const R T = static_cast<R>(sequence), H = static_cast<R>(heads), C = static_cast<R>(positions());
    const R L = static_cast<R>(layers), rows = static_cast<R>(micro_batch) * T, kF = 4, kI = 4;
    const R block = 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (f * d + f) + (d * f + d);
    SizeEstimate e;
    e.params = V * d + C * d + L * block + 2 * d + (tied_head ? 0 : V * d);
    const R embedding = (rows * kI + rows * d * kF) + rows * kI + rows * d * kF;
    const R one_block = kF * rows * (10 * d + 2 * f + H * T + 2) + kF * (rows * (8 * d + f) + T * T) + 2 * rows * d * kF;
    const R head = kF * rows * (2 * d + V + 1) + kF * rows * 2 * d + rows * d * kF + rows * V * kF;
    const R loss = (rows * V * kF + rows * kI) + rows * V * kF + rows * V * kF;
    e.activation_bytes = embedding + L * one_block + head + loss;
    return e;
  }
};

/// Parameters of one block: 12 d^2 + 13 d when d_ff = 4d (the whole block, whatever the tensor size).
inline std::size_t block_params(const TransformerShape& s) {
  const std::size_t d = s.hidden, f = s.mlp_width();
  return 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (f * d + f) + (d * f + d);
}

/// One block's parameter tensors on one tensor rank, in the model's visiting order: ln1, qkv, proj,
/// ln2, fc, fc_proj (weight, bias each); the split ones hold 1/t.
inline std::vector<std::size_t> block_tensors(const TransformerShape& s) {
  const std::size_t d = s.hidden, f = s.mlp_width(), t = s.tensor;
  return {d, d, 3 * d * d / t, 3 * d / t, d * d / t, d, d, d, f * d / t, f / t, d * f / t, d};
}

/// The GPT example's layers: embedding, blocks (checkpointable), head, and the loss (no
/// parameters; its buffers are the cross-entropy's).
inline ModelDescription gpt_model(const TransformerShape& s) {
  s.validate();
  const std::size_t d = s.hidden, f = s.mlp_width(), V = s.vocab, T = s.sequence, H = s.heads;
  const std::size_t R = s.micro_batch * T;
  constexpr std::size_t kF = sizeof(float), kI = sizeof(std::int32_t);
  ModelDescription m;

  LayerDesc emb;
  emb.name = "embedding";
  emb.params = {V * d, s.positions() * d};
  emb.activations.forward_bytes = R * kI + R * d * kF;
  emb.activations.input_bytes = R * kI;
  emb.activations.output_bytes = R * d * kF;
  m.layers.push_back(emb);

  const std::size_t t = s.tensor;
  const std::size_t own = s.sequence_parallel ? R / t : R;  // the rows a block holds of its own
  const std::size_t all = s.sequence_parallel ? R : 0;      // rows of the gathered and partial buffers
  for (std::size_t i = 0; i < s.layers; ++i) {
    LayerDesc b;
    b.name = "block" + std::to_string(i);
    b.params = block_tensors(s);
    b.activations.forward_bytes = kF * (own * (6 * d + 2) + R * (4 * d / t + 2 * f / t + H / t * T) + all * 3 * d);
    b.activations.backward_scratch_bytes = kF * (own * 4 * d + R * (4 * d / t + f / t) + all * 2 * d + T * T);
    b.activations.input_bytes = own * d * kF;
    b.activations.output_bytes = own * d * kF;
    b.checkpointable = true;
    m.layers.push_back(b);
  }

  LayerDesc head;
  head.name = "head";
  head.params = {d, d};
  if (!s.tied_head) head.params.push_back(V * d);
  head.activations.forward_bytes = kF * R * (2 * d + V + 1);
  head.activations.backward_scratch_bytes = kF * R * 2 * d;
  head.activations.input_bytes = R * d * kF;
  head.activations.output_bytes = R * V * kF;
  m.layers.push_back(head);

  LayerDesc loss;
  loss.name = "loss";
  loss.activations.forward_bytes = R * V * kF + R * kI;
  loss.activations.backward_scratch_bytes = R * V * kF;
  loss.activations.input_bytes = R * V * kF;
  m.layers.push_back(loss);
  return m;
}

}  // namespace zerotk::plan
