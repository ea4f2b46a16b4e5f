#pragma once
// examples/02_gpt/gpt.hpp: a decoder-only transformer (GPT-2 shape) with hand-written forward and
// backward on the host, Eigen for the matrix products. This is user code: it touches zerotk only
// through `zerotk::Param<float>` and the Module/Layer concepts (with experts, also zerotk::moe's router
// and dispatcher), so any engine that binds parameter storage can train it.
//
//   tokens [B][T] -> Embedding (wte[tok] + wpe[t])            -> x [B*T][d]
//                 -> Block x L (x += attn(ln1(x)); x += mlp(ln2(x)); mlp dense, or a mixture of
//                    experts when Config::experts > 0: moe_mlp.hpp)
//                 -> Head (ln_f, logits = ln_f(x) W^T)         -> logits [B*T][V]
//                 -> CrossEntropy over the positions that have a target
//
// Rules the engine relies on:
// - The model never allocates parameter or gradient storage: every tensor is a Param<float> that the
//   engine binds (one flat buffer, shards, anything). Backward ACCUMULATES into p.grad() (+=).
// - Layers run in forward order embedding, blocks..., head and backward in reverse; `train_step`
//   calls `scope.forward(layer)` / `scope.backward(layer)` right before each and destroys the returned
//   guard right after, which is where an engine gathers parameters or launches gradient buckets.
// - Activations needed for backward live inside each layer (one micro-batch at a time); their buffers
//   are sized on the first step and reused, so later steps of the same shape allocate nothing of ours
//   (Eigen's GEMM may still take packing buffers from the heap per product).
// - Eigen must not spawn threads here (ranks are threads already): targets that include this header
//   define EIGEN_DONT_PARALLELIZE (see CMakeLists.txt).
//
// Tensor parallelism (Megatron-LM's layout, `TensorParallel`): each block's attention heads and MLP
// columns split across T tensor ranks. qkv and mlp.fc are column-parallel (this rank's output rows:
// q, k and v of its heads; its MLP columns), attn.proj and mlp.proj row-parallel (its input columns,
// partial sums added over the tensor group, the replicated bias after the sum). The embedding, the
// LayerNorms and the head are replicated: every tensor rank computes them on the same values. Per
// block that is one all-reduce after each row-parallel linear forward and one after each
// column-parallel linear's input gradient: 2 forward and 2 backward. With sequence parallelism the
// activations between the regions are split by tokens instead: each all-reduce becomes an all-gather
// entering a region and a reduce-scatter leaving it, and the LayerNorms' gradients (from this rank's
// tokens only) are summed over the tensor group. Each Linear's weight and bias declare their split
// (SplitParam::tensor_split(), which the engine reads): Megatron-LM's layout, set by Block.
//
// Context parallelism (`ContextParallel`, context_attention.hpp): with --cp each rank of a context
// group holds a chunk of every sequence (the trainer feeds it context_share's rows, positions from
// the chunk's first); everything but attention is per token and runs on the chunk alone, and the
// blocks' attention (ContextAttention) reaches the other chunks' keys and values by Ulysses' all-to-all,
// the ring, or both, optionally block-sparse. The weights' gradients then sum over the data group the
// context ranks belong to, and each rank's loss carries its share's factor (Batch::loss_factor).
//
// Tied head: with `Config::tied_head` the head multiplies by the embedding's wte. The Param belongs to
// the embedding layer alone (only it visits wte); the head reaches it through `external_parameters`.
// Backward runs the head before the embedding, so the head adds its part of d(wte) first and the
// embedding adds its own afterwards; both use +=, so the sum is right, and wte's gradient is complete
// when the embedding's backward guard ends (the engine may reduce it then, not after the head).
#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <zerotk/activation/checkpointing.hpp>
#include <zerotk/activation/meter.hpp>
#include <zerotk/activation/recompute.hpp>
#include <zerotk/activation/select.hpp>
#include <zerotk/core/concepts.hpp>
#include <zerotk/core/error.hpp>
#include <zerotk/core/param.hpp>
#include <zerotk/parallel/split.hpp>
#include <zerotk/parallel/split_param.hpp>

#include "context_attention.hpp"
#include "layers.hpp"
#include "moe_mlp.hpp"

namespace gpt {


/// Token plus position embedding: x[b*T + t] = wte[tokens[b][t]] + wpe[t].
class Embedding {
 public:
  Param wte;  // [vocab][d]
  Param wpe;  // [context][d]

  explicit Embedding(const Config& c)
      : wte{"wte.weight", {detail::dim(c.vocab_size), detail::dim(c.d_model)}},
        wpe{"wpe.weight", {detail::dim(c.context), detail::dim(c.d_model)}} {}

  template <class Visit>
  void parameters(Visit&& visit) {
    visit(wte.name(), wte);
    visit(wpe.name(), wpe);
  }

  /// tokens [B][T] -> x [B*T][d]. Throws zerotk::usage_error for a token outside the vocabulary or a
  /// sequence longer than the context, before touching any state.
  const Matrix& forward(const TokenView& tokens) {
    const auto vocab = static_cast<std::int32_t>(wte.dim(0));
    const auto n = static_cast<std::size_t>(tokens.batch) * static_cast<std::size_t>(tokens.seq);
    if (tokens.batch <= 0 || tokens.seq <= 0 || tokens.ids.size() != n) {
      throw zerotk::usage_error("token view must hold batch * seq > 0 ids", "gpt::Embedding::forward",
                                std::to_string(tokens.ids.size()) + " ids for " + std::to_string(tokens.batch) +
                                    " x " + std::to_string(tokens.seq));
    }
    if (tokens.first_position < 0 || static_cast<std::size_t>(tokens.first_position) + static_cast<std::size_t>(tokens.seq) > wpe.dim(0)) {
      throw zerotk::usage_error("sequence longer than the model's context", "gpt::Embedding::forward",
                                std::to_string(tokens.first_position) + " + " + std::to_string(tokens.seq) + " > " +
                                    std::to_string(wpe.dim(0)));
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (tokens.ids[i] < 0 || tokens.ids[i] >= vocab) {
        throw zerotk::usage_error("token id outside the vocabulary", "tokens[" + std::to_string(i) + "]",
                                  std::to_string(tokens.ids[i]));
      }
    }
    ids_.assign(tokens.ids.begin(), tokens.ids.end());
    seq_ = tokens.seq;
    first_ = tokens.first_position;
    const auto rows = static_cast<Eigen::Index>(n);
    detail::ensure_shape(out_, rows, static_cast<Eigen::Index>(wte.dim(1)));
    const auto te = detail::value_matrix(wte);
    const auto pe = detail::value_matrix(wpe);
    for (Eigen::Index r = 0; r < rows; ++r) out_.row(r) = te.row(ids_[static_cast<std::size_t>(r)]) + pe.row(first_ + r % seq_);
    return out_;
  }

  /// Activation memory held now (its output; the token ids are counted too).
  std::size_t activation_bytes() const noexcept { return detail::bytes_of(out_) + ids_.size() * sizeof(std::int32_t); }

  /// dx [B*T][d]: scatter-adds into d(wte) rows of the tokens seen and d(wpe) rows of their positions.
  void backward(const Matrix& dx) {
    if (defer != nullptr) {  // all of it is weight gradient
      defer->add([this, dx = Matrix(dx), ids = ids_, seq = seq_, first = first_] { scatter(dx, ids, seq, first); });
    } else {
      scatter(dx, ids_, seq_, first_);
    }
  }

  /// Set: the gradients wait there (DeferredWeights).
  DeferredWeights* defer = nullptr;

 private:
  void scatter(const Matrix& dx, const std::vector<std::int32_t>& ids, int seq, int first) {
    auto dte = detail::grad_matrix(wte);
    auto dpe = detail::grad_matrix(wpe);
    for (Eigen::Index r = 0; r < dx.rows(); ++r) {
      dte.row(ids[static_cast<std::size_t>(r)]) += dx.row(r);
      dpe.row(first + r % seq) += dx.row(r);
    }
  }

  std::vector<std::int32_t> ids_;  // [B*T] the micro-batch's tokens, for backward
  int seq_ = 0, first_ = 0;  // tokens per row, and the position of each row's first
  Matrix out_;
};

/// One pre-LayerNorm transformer block: x1 = x + proj(attn(ln1(x))), out = x1 + mlp(ln2(x1)), with
/// causal multi-head self-attention and a GELU (tanh form, as GPT-2) MLP.
class Block {
 public:
  using input_type = Matrix;
  using output_type = Matrix;

  LayerNorm ln1;
  Linear qkv;   // [3d/T][d]: q, k, v rows of this rank's heads (rows(3)); head h uses columns h*hd.. of each
  Linear proj;  // [d][d/T]: this rank's input columns (cols), the bias [d] replicated
  LayerNorm ln2;
  Linear fc;       // [d_ff/T][d] (rows)
  Linear fc_proj;  // [d][d_ff/T] (cols), the bias [d] replicated
  std::unique_ptr<MoeMlp> moe;  // Config::experts > 0: the MLP (moe_mlp.hpp); fc and fc_proj unused

  /// Block `index` of a model shaped `c`, split across `tp` (nullptr or size 1: whole; `tp` must
  /// outlive the block and have passed TensorParallel::check(c)). With c.experts > 0 the MLP is a
  /// mixture of experts over `ep` (which must have passed ExpertParallel::check): fc and fc_proj stay
  /// unused, never visited. With `cp` on, the attention is ContextAttention's (context_attention.hpp:
  /// over the context group, block-sparse with a layout; `cp` must outlive the block).
  Block(const Config& c, int index, const TensorParallel* tp = nullptr, const ExpertParallel* ep = nullptr,
        const ContextParallel* cp = nullptr)
      : ln1(prefix(index) + "ln1", c.d_model),
        qkv(prefix(index) + "attn.qkv", c.d_model, 3 * c.d_model / parts(tp), column_split(tp, 3)),
        proj(prefix(index) + "attn.proj", c.d_model / parts(tp), c.d_model, row_split(tp)),
        ln2(prefix(index) + "ln2", c.d_model),
        fc(prefix(index) + "mlp.fc", c.d_model, c.mlp_width() / parts(tp), column_split(tp, 1)),
        fc_proj(prefix(index) + "mlp.proj", c.mlp_width() / parts(tp), c.d_model, row_split(tp)),
        tp_(tp != nullptr && tp->split() ? tp : nullptr),
        n_heads_(c.n_heads / parts(tp)) {
    if (tp_ != nullptr && tp_->sequence_parallel) ln1.token_sum = ln2.token_sum = tp_->all_reduce;
    if (cp != nullptr && cp->on) {
      const int rank = tp_ != nullptr ? tp_->rank : 0;
      context_ = std::make_unique<ContextAttention>(*cp, n_heads_, c.head_dim(), rank * n_heads_, c.n_heads);
    }
    if (c.experts > 0) {
      if (ep == nullptr) throw zerotk::usage_error("a block with experts needs the expert-parallel group", "gpt::Block", prefix(index));
      moe = std::make_unique<MoeMlp>(c, index, *ep);
    }
  }

  template <class Visit>
  void parameters(Visit&& visit) {
    ln1.parameters(visit);
    qkv.parameters(visit);
    proj.parameters(visit);
    ln2.parameters(visit);
    if (moe) {
      moe->parameters(visit);
      return;
    }
    fc.parameters(visit);
    fc_proj.parameters(visit);
  }

  /// Every weight gradient of the block's backward waits in `d` (null: computed at once).
  void set_deferred(DeferredWeights* d) noexcept { ln1.defer = qkv.defer = proj.defer = ln2.defer = fc.defer = fc_proj.defer = d; }

  /// Sequence length of the micro-batch; the layer needs it to split the B*T rows into sequences.
  /// Gpt sets it before forward; a caller driving blocks directly sets it too.
  void set_sequence_length(int seq) noexcept { seq_ = seq; }

  /// Under context parallelism: false runs each sequence whole on this rank (evaluation), true again
  /// splits it over the context group. Without: nothing.
  void set_context_split(bool on) noexcept {
    if (context_) context_->set_split(on);
  }

  /// x [B*T][d] -> out [B*T][d] (sequence parallel: this rank's [B*T / tp][d] in and out).
  const Matrix& forward(const Matrix& x) {
    if (tp_ != nullptr) return forward_split(x);
    ln1.forward(x, a_, xhat1_, rstd1_);
    qkv.forward(a_, qkv_);
    attention_forward();
    proj.forward(att_, x1_);
    x1_ += x;
    ln2.forward(x1_, c_, xhat2_, rstd2_);
    if (moe) {
      moe->forward(c_, out_);
    } else {
      fc.forward(c_, h_);
      gelu_forward();
      fc_proj.forward(g_, out_);
    }
    out_ += x1_;
    return out_;
  }

  /// Activation memory held now: what forward keeps for backward and backward's scratch.
  std::size_t activation_bytes() const noexcept {
    return detail::bytes_of(xhat1_, a_, qkv_, probs_, att_, x1_, xhat2_, c_, h_, g_, out_, rstd1_, rstd2_) +
           detail::bytes_of(dx1_, dg_, dc_, datt_, dqkv_, da_, dx_, dp_) +
           detail::bytes_of(a_full_, c_full_, partial_, dy_full_, dpartial_) + (moe ? moe->activation_bytes() : 0) +
           (context_ ? context_->activation_bytes() : 0);
  }

  /// Drops every activation and scratch buffer (zerotk::Recomputable): the next forward allocates
  /// them again. A checkpointed block (zerotk::Recompute<Block>) calls this after its forward and
  /// after its backward.
  void release_activations() noexcept {
    detail::free_all(xhat1_, a_, qkv_, probs_, att_, x1_, xhat2_, c_, h_, g_, out_);
    detail::free_all(dx1_, dg_, dc_, datt_, dqkv_, da_, dx_, dp_);
    detail::free_all(a_full_, c_full_, partial_, dy_full_, dpartial_);
    detail::free_vector(rstd1_);
    detail::free_vector(rstd2_);
    if (moe) moe->release_activations();
    if (context_) context_->release();
  }

  /// dout [B*T][d] -> dx [B*T][d]; parameter gradients accumulate.
  const Matrix& backward(const Matrix& dout) {
    if (tp_ != nullptr) return backward_split(dout);
    dx1_ = dout;  // the residual path
    if (moe) {
      moe->backward(c_, dout, dc_);
    } else {
      fc_proj.backward(g_, dout, &dg_);
      gelu_backward();  // dg_ becomes d(h)
      fc.backward(c_, dg_, &dc_);
    }
    ln2.backward(dc_, xhat2_, rstd2_, dx1_);
    proj.backward(att_, dx1_, &datt_);
    attention_backward();
    qkv.backward(a_, dqkv_, &da_);
    dx_ = dx1_;
    ln1.backward(da_, xhat1_, rstd1_, dx_);
    return dx_;
  }

 private:
  static std::string prefix(int index) { return "blocks." + std::to_string(index) + "."; }
  static int parts(const TensorParallel* tp) noexcept { return tp != nullptr ? tp->size : 1; }
  // Megatron-LM's layout: a column-parallel linear keeps its rows of the output (qkv: in its `stacked`
  // parts q, k and v, so each rank has its heads' rows of each), weight and bias alike; a row-parallel
  // one its columns of the input, the bias (added after the sum) replicated. Whole without a split.
  static LinearSplit column_split(const TensorParallel* tp, int stacked) noexcept {
    if (tp == nullptr || !tp->split()) return {};
    return {zerotk::parallel::TensorSplit::rows(stacked), zerotk::parallel::TensorSplit::rows(stacked)};
  }
  static LinearSplit row_split(const TensorParallel* tp) noexcept {
    if (tp == nullptr || !tp->split()) return {};
    return {zerotk::parallel::TensorSplit::cols(), zerotk::parallel::TensorSplit::replicated()};
  }

  // ---- the split block: the same math, with the region operators around the tensor regions ----
  // f enters a region (identity, or an all-gather of the token rows under sequence parallel); g leaves
  // it (an all-reduce of the partial sums, or a reduce-scatter to this rank's token rows). Backward,
  // f's gradient is an all-reduce (reduce-scatter) of the partial input gradients and g's an
  // identity (all-gather). Without sequence parallel the buffers are the whole block's, narrower
  // where the block is split; with it, the gathered rows and partial sums have buffers of their own.
  const Matrix& enter(const Matrix& mine, Matrix& all) {  // f; also g's backward
    if (!tp_->sequence_parallel) return mine;
    detail::ensure_shape(all, mine.rows() * tp_->size, mine.cols());
    tp_->all_gather_rows(span_of(mine), span_of(all));
    return all;
  }
  // g after row-parallel `l`: out = sum over the tensor group of in * W_r^T (this rank's token rows
  // of it under sequence parallel), then the replicated bias.
  void row_parallel(Linear& l, const Matrix& in, Matrix& out) {
    if (!tp_->sequence_parallel) {
      l.forward_partial(in, out);
      tp_->all_reduce(span_of(out));
    } else {
      l.forward_partial(in, partial_);
      detail::ensure_shape(out, partial_.rows() / tp_->size, partial_.cols());
      tp_->reduce_scatter_rows(span_of(partial_), span_of(out));
    }
    l.add_bias(out);
  }
  // f's backward after column-parallel `l`: d(in) = sum over the tensor group of dy_r W_r (this
  // rank's token rows of it under sequence parallel) into `din`.
  void column_parallel_backward(Linear& l, const Matrix& in, const Matrix& dy, Matrix& din) {
    if (!tp_->sequence_parallel) {
      l.backward(in, dy, &din);
      tp_->all_reduce(span_of(din));
      return;
    }
    l.backward(in, dy, &dpartial_);
    detail::ensure_shape(din, dpartial_.rows() / tp_->size, dpartial_.cols());
    tp_->reduce_scatter_rows(span_of(dpartial_), span_of(din));
  }
  static std::span<float> span_of(Matrix& m) { return {m.data(), static_cast<std::size_t>(m.size())}; }
  static std::span<const float> span_of(const Matrix& m) { return {m.data(), static_cast<std::size_t>(m.size())}; }

  const Matrix& forward_split(const Matrix& x) {
    ln1.forward(x, a_, xhat1_, rstd1_);
    qkv.forward(enter(a_, a_full_), qkv_);  // column-parallel: this rank's heads
    attention_forward();
    row_parallel(proj, att_, x1_);
    x1_ += x;
    ln2.forward(x1_, c_, xhat2_, rstd2_);
    if (moe) {  // whole experts on every tensor rank, over every token row (no sequence parallel)
      moe->forward(c_, out_);
    } else {
      fc.forward(enter(c_, c_full_), h_);
      gelu_forward();
      row_parallel(fc_proj, g_, out_);
    }
    out_ += x1_;
    return out_;
  }

  // The row-parallel biases take their gradient from every token (dy gathered), the same on every
  // tensor rank; the LayerNorms' come from this rank's tokens under sequence parallel and are summed
  // over the tensor group (LayerNorm::token_sum).
  const Matrix& backward_split(const Matrix& dout) {
    const bool sp = tp_->sequence_parallel;
    dx1_ = dout;
    if (moe) {  // the experts' input gradient is whole on every tensor rank: no sum over the group
      moe->backward(c_, dout, dc_);
    } else {
      fc_proj.backward(g_, enter(dout, dy_full_), &dg_);
      gelu_backward();
      column_parallel_backward(fc, sp ? c_full_ : c_, dg_, dc_);
    }
    ln2.backward(dc_, xhat2_, rstd2_, dx1_);
    proj.backward(att_, enter(dx1_, dy_full_), &datt_);
    attention_backward();
    column_parallel_backward(qkv, sp ? a_full_ : a_, dqkv_, da_);
    dx_ = dx1_;
    ln1.backward(da_, xhat1_, rstd1_, dx_);
    return dx_;
  }

  // Per sequence b and head h, with Q, K, V [T][hd] column blocks of qkv_:
  //   P = causal_softmax(Q K^T / sqrt(hd)) [T][T], kept in probs_ rows (b*H + h)*T ...
  //   att[b, h] = P V
  void attention_forward() {
    if (context_) {
      context_->forward(qkv_, seq_, att_);
      return;
    }
    const Eigen::Index rows = qkv_.rows(), d = qkv_.cols() / 3, T = seq_, H = n_heads_, hd = d / H;
    const Eigen::Index B = rows / T;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    detail::ensure_shape(att_, rows, d);
    detail::ensure_shape(probs_, B * H * T, T);
    for (Eigen::Index b = 0; b < B; ++b) {
      for (Eigen::Index h = 0; h < H; ++h) {
        const auto q = qkv_.block(b * T, h * hd, T, hd);
        const auto k = qkv_.block(b * T, d + h * hd, T, hd);
        const auto v = qkv_.block(b * T, 2 * d + h * hd, T, hd);
        auto p = probs_.block((b * H + h) * T, 0, T, T);
        p.noalias() = scale * (q * k.transpose());
        for (Eigen::Index i = 0; i < T; ++i) {  // row i attends to positions 0..i
          auto live = p.row(i).head(i + 1).array();
          live = (live - live.maxCoeff()).exp();
          live /= live.sum();
          p.row(i).tail(T - i - 1).setZero();
        }
        att_.block(b * T, h * hd, T, hd).noalias() = p * v;
      }
    }
  }

  // With dO = d(att) for (b, h):  dV = P^T dO;  dP = dO V^T;  dS = P * (dP - rowsum(P * dP));
  // dQ = dS K / sqrt(hd);  dK = dS^T Q / sqrt(hd). Masked entries have P = 0, hence dS = 0.
  void attention_backward() {
    if (context_) {
      context_->backward(datt_, dqkv_);
      return;
    }
    const Eigen::Index rows = qkv_.rows(), d = qkv_.cols() / 3, T = seq_, H = n_heads_, hd = d / H;
    const Eigen::Index B = rows / T;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    detail::ensure_shape(dqkv_, rows, 3 * d);
    detail::ensure_shape(dp_, T, T);
    for (Eigen::Index b = 0; b < B; ++b) {
      for (Eigen::Index h = 0; h < H; ++h) {
        const auto q = qkv_.block(b * T, h * hd, T, hd);
        const auto k = qkv_.block(b * T, d + h * hd, T, hd);
        const auto v = qkv_.block(b * T, 2 * d + h * hd, T, hd);
        const auto p = probs_.block((b * H + h) * T, 0, T, T);
        const auto d_o = datt_.block(b * T, h * hd, T, hd);
        dqkv_.block(b * T, 2 * d + h * hd, T, hd).noalias() = p.transpose() * d_o;
        dp_.noalias() = d_o * v.transpose();
        for (Eigen::Index i = 0; i < T; ++i) {
          auto ds = dp_.row(i).array();
          const auto pi = p.row(i).array();
          ds = pi * (ds - (pi * ds).sum());
        }
        dqkv_.block(b * T, h * hd, T, hd).noalias() = scale * (dp_ * k);
        dqkv_.block(b * T, d + h * hd, T, hd).noalias() = scale * (dp_.transpose() * q);
      }
    }
  }

  void gelu_forward() { detail::gelu(h_, g_); }
  void gelu_backward() { detail::gelu_backward(h_, dg_); }

  const TensorParallel* tp_;  // null: the whole block
  int n_heads_;              // this rank's heads
  std::unique_ptr<ContextAttention> context_;  // ContextParallel::on: the attention (no probs_ kept)
  int seq_ = 0;
  // forward activations, [B*T][...] unless noted
  Matrix xhat1_, a_, qkv_, probs_ /* [B*H*T][T] */, att_, x1_, xhat2_, c_, h_, g_, out_;
  Vector rstd1_, rstd2_;
  // backward scratch
  Matrix dx1_, dg_, dc_, datt_, dqkv_, da_, dx_, dp_ /* [T][T] */;
  // sequence parallel: gathered token rows and partial sums, [B*T][d]
  Matrix a_full_, c_full_, partial_, dy_full_, dpartial_;
};

/// Final LayerNorm and the vocabulary projection (no bias, as GPT-2). Untied: owns head.weight
/// [vocab][d]. Tied: multiplies by the embedding's wte, which it does NOT visit in parameters();
/// external_parameters() names it so an engine that gathers per layer (ZeRO-3) fetches it here too.
class Head {
 public:
  using input_type = Matrix;
  using output_type = Matrix;

  LayerNorm ln_f;
  Param weight;  // [vocab][d]; unused (never bound) when tied

  Head(const Config& c, Embedding& embedding)
      : ln_f("ln_f", c.d_model),
        weight{"head.weight", {detail::dim(c.vocab_size), detail::dim(c.d_model)}},
        tied_(c.tied_head ? &embedding.wte : nullptr) {}

  bool tied() const noexcept { return tied_ != nullptr; }

  template <class Visit>
  void parameters(Visit&& visit) {
    ln_f.parameters(visit);
    if (!tied()) visit(weight.name(), weight);
  }

  /// Parameters this layer reads but another layer owns: the embedding's wte when tied.
  template <class Visit>
  void external_parameters(Visit&& visit) {
    if (tied()) visit(tied_->name(), *tied_);
  }

  /// x [B*T][d] -> logits [B*T][vocab].
  const Matrix& forward(const Matrix& x) {
    ln_f.forward(x, xf_, xhat_, rstd_);
    detail::ensure_shape(logits_, x.rows(), static_cast<Eigen::Index>(projection().dim(0)));
    logits_.noalias() = xf_ * detail::value_matrix(projection()).transpose();
    return logits_;
  }

  /// Activation memory held now.
  std::size_t activation_bytes() const noexcept { return detail::bytes_of(xhat_, xf_, logits_, dxf_, dx_, rstd_); }

  /// The logits of the last forward, [B*T][vocab].
  const Matrix& output() const noexcept { return logits_; }

  /// Set: the projection's gradient waits there (DeferredWeights; ln_f has its own `defer`).
  DeferredWeights* defer = nullptr;

  /// dlogits [B*T][vocab] -> dx [B*T][d].
  const Matrix& backward(const Matrix& dlogits) {
    if (defer != nullptr) {
      defer->add([this, dlogits = Matrix(dlogits), xf = Matrix(xf_)] { detail::grad_matrix(projection()).noalias() += dlogits.transpose() * xf; });
    } else {
      detail::grad_matrix(projection()).noalias() += dlogits.transpose() * xf_;
    }
    detail::ensure_shape(dxf_, dlogits.rows(), xf_.cols());
    dxf_.noalias() = dlogits * detail::value_matrix(projection());
    detail::ensure_shape(dx_, dxf_.rows(), dxf_.cols());
    dx_.setZero();
    ln_f.backward(dxf_, xhat_, rstd_, dx_);
    return dx_;
  }

 private:
  Param& projection() noexcept { return tied_ != nullptr ? *tied_ : weight; }

  Param* tied_;
  Matrix xhat_, xf_, logits_, dxf_, dx_;
  Vector rstd_;
};

/// Mean cross-entropy over the positions whose target is not Batch::kIgnore. Not a layer: it has no
/// parameters. Keeps the softmax for backward.
class CrossEntropy {
 public:
  /// logits [N][V], targets [N] -> mean of -log softmax(logits)[target] over targeted rows (0 if none).
  float forward(const Matrix& logits, std::span<const std::int32_t> targets) {
    detail::ensure_shape(probs_, logits.rows(), logits.cols());
    targets_.assign(targets.begin(), targets.end());
    double total = 0.0;  // sum of up to B*T terms: accumulate in double
    count_ = 0;
    for (Eigen::Index r = 0; r < logits.rows(); ++r) {
      const std::int32_t t = targets_[static_cast<std::size_t>(r)];
      if (t == Batch::kIgnore) continue;
      if (t < 0 || t >= logits.cols()) {
        throw zerotk::usage_error("target id outside the vocabulary", "targets[" + std::to_string(r) + "]",
                                  std::to_string(t));
      }
      const float m = logits.row(r).maxCoeff();
      auto p = probs_.row(r).array();
      p = (logits.row(r).array() - m).exp();
      const float sum = p.sum();
      p /= sum;
      total += static_cast<double>(m) + std::log(static_cast<double>(sum)) - static_cast<double>(logits(r, t));
      ++count_;
    }
    return count_ == 0 ? 0.0f : static_cast<float>(total / static_cast<double>(count_));
  }

  /// d(loss * scale)/d(logits) [N][V] = scale / count * (softmax - onehot) on targeted rows, 0 elsewhere.
  const Matrix& backward(float scale) {
    detail::ensure_shape(dlogits_, probs_.rows(), probs_.cols());
    const float k = count_ == 0 ? 0.0f : scale / static_cast<float>(count_);
    for (Eigen::Index r = 0; r < probs_.rows(); ++r) {
      const std::int32_t t = targets_[static_cast<std::size_t>(r)];
      if (t == Batch::kIgnore) {
        dlogits_.row(r).setZero();
        continue;
      }
      dlogits_.row(r) = k * probs_.row(r);
      dlogits_(r, t) -= k;
    }
    return dlogits_;
  }

  /// Number of targeted positions in the last forward.
  std::size_t count() const noexcept { return count_; }

  /// Activation memory held now (the softmax and its gradient).
  std::size_t activation_bytes() const noexcept {
    return detail::bytes_of(probs_, dlogits_) + targets_.size() * sizeof(std::int32_t);
  }

 private:
  Matrix probs_, dlogits_;
  std::vector<std::int32_t> targets_;
  std::size_t count_ = 0;
};

/// The scope an engine passes to Gpt: `forward(layer)` / `backward(layer)` return a guard that lives
/// exactly as long as that layer's forward / backward.
template <class S>
concept LayerScope = requires(S& s, Embedding& e, Block& b, Head& h) {
  s.forward(e);
  s.forward(b);
  s.forward(h);
  s.backward(e);
  s.backward(b);
  s.backward(h);
};

/// A scope that does nothing (single process, tests).
struct NoScope {
  struct Guard {};
  template <class L>
  Guard forward(L&) const noexcept {
    return {};
  }
  template <class L>
  Guard backward(L&) const noexcept {
    return {};
  }
};

/// The decoder-only transformer. Not copyable or movable: the head of a tied model points at the
/// embedding's Param (hold a Gpt by unique_ptr to move it around).
struct Gpt {
  Config config;
  TensorParallel tensor;  ///< how the blocks split (size 1: not at all); the embedding and head are replicated
  ExpertParallel experts;  ///< Config::experts > 0: the group the blocks' experts dispatch over
  ContextParallel context;  ///< on: the blocks' attention is ContextAttention's (--cp, --sparse-attention)
  Embedding embedding;
  std::vector<Block> blocks;
  Head head;

  explicit Gpt(const Config& c, TensorParallel tp = {}, ExpertParallel ep = {}, ContextParallel cp = {})
      : config(validated(c)),
        tensor(checked(std::move(tp), config)),
        experts(checked(std::move(ep), config, tensor)),
        context(checked(std::move(cp))),
        embedding(config),
        blocks(make_blocks(config, &tensor, &experts, &context)),
        head(config, embedding) {}
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;
  Gpt(Gpt&&) = delete;
  Gpt& operator=(Gpt&&) = delete;
  ~Gpt() = default;

  /// Every parameter once, in forward order, named as in GPT-2 checkpoints with this model's layer
  /// names ("wte.weight", "blocks.3.attn.qkv.weight", "ln_f.bias", ...). The name equals Param::name().
  template <class Visit>
  void parameters(Visit&& visit) {
    embedding.parameters(visit);
    for (auto& b : blocks) b.parameters(visit);
    head.parameters(visit);
  }

  /// The layers, for the engine: at ZeRO stage 3 each one's parameters form a fetch unit.
  template <class Visit>
  void modules(Visit&& visit) {
    visit(embedding);
    for (auto& b : blocks) visit(b);
    visit(head);
  }

  /// Calls f(layer) for embedding, each block, head: the order of forward.
  template <class F>
  void for_each_layer(F&& f) {
    f(embedding);
    for (auto& b : blocks) f(b);
    f(head);
  }

  /// Activation checkpointing (zerotk::Recompute<Block>) of the blocks `select` picks by index, which
  /// share `ckpt` (it must outlive their use); Select::none() turns it off. Only blocks are offered:
  /// the embedding's input is the token ids and the head's activations are needed by the loss.
  void checkpoint_blocks(zerotk::activation::Checkpointing& ckpt, const zerotk::activation::Select& select) {
    recompute_.clear();
    recompute_.resize(blocks.size());
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      if (select(i)) recompute_[i] = std::make_unique<zerotk::Recompute<Block>>(blocks[i], ckpt, "blocks." + std::to_string(i));
    }
  }
  std::size_t checkpointed_blocks() const noexcept {
    std::size_t n = 0;
    for (const auto& r : recompute_) n += r ? 1 : 0;
    return n;
  }

  /// Each layer's activation bytes go to `meter` after each of its forwards and backwards (nullptr:
  /// not reported). The checkpointed blocks report through their Checkpointing's meter.
  void set_meter(zerotk::activation::Meter* meter) noexcept { meter_ = meter; }

  /// Mixture of experts: slots kept per expert and dropped over this rank's training backward passes,
  /// summed over its blocks (empty without experts).
  ExpertLoad expert_load() const {
    ExpertLoad l;
    for (const auto& b : blocks) {
      if (b.moe) l.add(b.moe->load());
    }
    return l;
  }

  std::size_t num_parameters() {
    std::size_t n = 0;
    parameters([&](std::string_view, Param& p) { n += p.numel(); });
    return n;
  }

  /// Forward only: tokens [B][T] -> logits [B*T][vocab] (a reference into the head, valid until its
  /// next forward).
  template <class Scope = NoScope>
    requires LayerScope<std::remove_cvref_t<Scope>>
  const Matrix& logits(const TokenView& tokens, Scope&& scope = {}) {
    return forward_layers(0, layer_count(), &tokens, nullptr, tokens.seq, scope);
  }

  /// The layers in forward order: 0 the embedding, 1 .. n_layers the blocks, n_layers + 1 the head.
  int layer_count() const noexcept { return static_cast<int>(blocks.size()) + 2; }
  /// f(layer) for layer `i` of that list.
  template <class F>
  decltype(auto) with_layer(int i, F&& f) {
    if (i == 0) return f(embedding);
    if (i == layer_count() - 1) return f(head);
    return f(blocks[static_cast<std::size_t>(i - 1)]);
  }

  /// Forward of layers [first, last) (a pipeline stage's): from `tokens` when first is 0, else from
  /// `x`, the activation entering layer `first`; sequences of `seq` tokens. Returns what leaves layer
  /// last - 1: the logits when the range ends with the head. Activations between layers are the
  /// blocks' (under sequence parallel, this rank's token rows), whatever the range.
  template <class Scope = NoScope>
    requires LayerScope<std::remove_cvref_t<Scope>>
  const Matrix& forward_layers(int first, int last, const TokenView* tokens, const Matrix* x, int seq, Scope&& scope = {}) {
    const int n = static_cast<int>(blocks.size());
    for (int i = first; i < last; ++i) {
      if (i == 0) {
        {
          [[maybe_unused]] auto guard = scope.forward(embedding);
          x = &embedding.forward(*tokens);
          report(embedding);
        }
        x = &to_blocks(*x);
      } else if (i == n + 1) {
        x = &from_blocks(*x);
        [[maybe_unused]] auto guard = scope.forward(head);
        x = &head.forward(*x);
        report(head);
      } else {
        const auto k = static_cast<std::size_t>(i - 1);
        Block& b = blocks[k];
        [[maybe_unused]] auto guard = scope.forward(b);
        b.set_sequence_length(seq);
        x = checkpointed(k) ? &recompute_[k]->forward(*x) : &b.forward(*x);
        report(b);
      }
    }
    return *x;
  }

  /// With `d`, backward computes the input gradients only and leaves every layer's weight gradients
  /// in `d`, by layer (run them inside that layer's backward scope: d->run(i)); null: at once.
  void set_deferred(DeferredWeights* d) noexcept {
    deferred_ = d;
    embedding.defer = head.defer = head.ln_f.defer = d;
    for (Block& b : blocks) b.set_deferred(d);
  }

  /// Backward of layers [first, last) after their forward, from d(what left layer last - 1) (the
  /// logits' gradient when the range ends with the head); gradients accumulate. Returns d(what
  /// entered layer `first`), or null when the range starts with the embedding.
  template <class Scope = NoScope>
    requires LayerScope<std::remove_cvref_t<Scope>>
  const Matrix* backward_layers(int first, int last, const Matrix& dy, Scope&& scope = {}) {
    const int n = static_cast<int>(blocks.size());
    const Matrix* dx = &dy;
    for (int i = last; i-- > first;) {
      if (deferred_ != nullptr) deferred_->set_layer(i);
      if (i == n + 1) {
        {
          [[maybe_unused]] auto guard = scope.backward(head);
          dx = &head.backward(*dx);
          report(head);
        }
        dx = &to_blocks(*dx);  // the head ran on every token alike: this rank's rows of its gradient
      } else if (i == 0) {
        dx = &from_blocks(*dx);
        [[maybe_unused]] auto guard = scope.backward(embedding);
        embedding.backward(*dx);
        return nullptr;
      } else {
        const auto k = static_cast<std::size_t>(i - 1);
        Block& b = blocks[k];
        [[maybe_unused]] auto guard = scope.backward(b);  // at ZeRO-3 this gathers for the recompute too
        dx = checkpointed(k) ? &recompute_[k]->backward(*dx) : &b.backward(*dx);
        report(b);
      }
    }
    return dx;
  }

  /// Whether the blocks run sequence parallel (TensorParallel::sequence_parallel). Evaluation may turn
  /// it off (set_sequence_parallel(false)): the blocks then see every token, so any batch fits; the
  /// math is the same up to rounding.
  bool sequence_parallel() const noexcept { return tensor.split() && tensor.sequence_parallel && sequence_parallel_on_; }
  void set_sequence_parallel(bool on) noexcept { sequence_parallel_on_ = on; }

  /// Whether the blocks split each sequence over the context group (ContextParallel::split()), which
  /// then feeds them context ranks' shares (context_share). Evaluation turns it off
  /// (set_context_split(false)): each sequence whole on every rank, the same kernel.
  bool context_split() const noexcept { return context.split() && context_split_on_; }
  void set_context_split(bool on) noexcept {
    context_split_on_ = on;
    for (Block& b : blocks) b.set_context_split(on);
  }

  /// Forward and loss: returns the mean cross-entropy over the batch's targeted positions, times the
  /// batch's loss_factor (1, or a context rank's share's: context_share).
  template <class Scope = NoScope>
    requires LayerScope<std::remove_cvref_t<Scope>>
  float forward(const Batch& batch, Scope&& scope = {}) {
    if (batch.targets.size() != batch.tokens.size()) {
      throw zerotk::usage_error("targets and tokens differ in length", "gpt::Gpt::forward",
                                std::to_string(batch.targets.size()) + " vs " + std::to_string(batch.tokens.size()));
    }
    const Matrix& out = logits(batch.inputs(), scope);
    loss_factor_ = batch.loss_factor;
    const float loss = loss_.forward(out, batch.targets) * loss_factor_;
    report(loss_);
    return loss;
  }

  /// Backward of the last forward, seeded with d(loss)/d(logits) * loss_scale; gradients accumulate.
  template <class Scope = NoScope>
    requires LayerScope<std::remove_cvref_t<Scope>>
  void backward(Scope&& scope = {}, float loss_scale = 1.0f) {
    const Matrix& dlogits = loss_.backward(loss_scale * loss_factor_);
    report(loss_);
    backward_layers(0, layer_count(), dlogits, scope);
  }

  /// One micro-step: forward, loss, backward. Returns the (unscaled) mean loss.
  template <class Scope = NoScope>
    requires LayerScope<std::remove_cvref_t<Scope>>
  float train_step(const Batch& batch, Scope&& scope = {}, float loss_scale = 1.0f) {
    const float loss = forward(batch, scope);
    backward(scope, loss_scale);
    return loss;
  }

  /// Positions that carried a target in the last forward (the loss's denominator).
  std::size_t targeted_positions() const noexcept { return loss_.count(); }

 private:
  static const Config& validated(const Config& c) {
    c.validate();
    return c;
  }
  static TensorParallel checked(TensorParallel tp, const Config& c) {
    tp.check(c);
    return tp;
  }
  static ExpertParallel checked(ExpertParallel ep, const Config& c, const TensorParallel& tp) {
    ep.check(c, tp);
    return ep;
  }
  static ContextParallel checked(ContextParallel cp) {
    cp.check();
    return cp;
  }
  static std::vector<Block> make_blocks(const Config& c, const TensorParallel* tp, const ExpertParallel* ep,
                                        const ContextParallel* cp) {
    std::vector<Block> out;
    out.reserve(static_cast<std::size_t>(c.n_layers));
    for (int i = 0; i < c.n_layers; ++i) out.emplace_back(c, i, tp, ep, cp);
    return out;
  }

  // Sequence parallel: the embedding and the head are replicated, so every tensor rank holds all
  // token rows before the blocks and needs all of them after. Into the blocks each rank takes its
  // rows (their gradient, coming back, is gathered); out of them the rows are gathered (their
  // gradient, the head's, is the same on every rank, so each takes its rows). Otherwise: identity.
  const Matrix& to_blocks(const Matrix& all) {
    if (!sequence_parallel()) return all;
    const auto t = static_cast<Eigen::Index>(tensor.size);
    if (all.rows() % t != 0) {
      throw zerotk::usage_error("under sequence parallel the token rows (micro batch x sequence length) must divide by "
                                "the tensor size",
                                "gpt::Gpt", std::to_string(all.rows()) + " rows, tensor " + std::to_string(tensor.size));
    }
    const Eigen::Index rows = all.rows() / t;
    detail::ensure_shape(local_, rows, all.cols());
    local_ = all.middleRows(rows * tensor.rank, rows);
    return local_;
  }
  const Matrix& from_blocks(const Matrix& mine) {
    if (!sequence_parallel()) return mine;
    detail::ensure_shape(gathered_, mine.rows() * tensor.size, mine.cols());
    tensor.all_gather_rows(std::span<const float>(mine.data(), static_cast<std::size_t>(mine.size())),
                           std::span<float>(gathered_.data(), static_cast<std::size_t>(gathered_.size())));
    return gathered_;
  }

  bool checkpointed(std::size_t i) const noexcept { return i < recompute_.size() && recompute_[i] != nullptr; }
  template <class L>
  void report(const L& layer) {
    if (meter_ != nullptr) meter_->set(&layer, layer.activation_bytes());
  }

  CrossEntropy loss_;
  float loss_factor_ = 1.0f;  // the last forward's batch's
  DeferredWeights* deferred_ = nullptr;
  bool sequence_parallel_on_ = true;
  bool context_split_on_ = true;
  Matrix local_, gathered_;  // sequence parallel: this rank's token rows, and every rank's
  std::vector<std::unique_ptr<zerotk::Recompute<Block>>> recompute_;  // [block]: null = not checkpointed
  zerotk::activation::Meter* meter_ = nullptr;
};

static_assert(zerotk::Module<Embedding>);
static_assert(zerotk::Layer<Block>);
static_assert(zerotk::Layer<Head>);
static_assert(zerotk::Recomputable<Block>);
static_assert(zerotk::Module<Gpt>);
static_assert(LayerScope<NoScope>);

// ---- initialisation ------------------------------------------------------------------------------

namespace detail {

inline std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline std::uint64_t hash_name(std::string_view s) noexcept {  // FNV-1a
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

// Uniform in (0, 1) from 24 random bits: never 0, so log() below is finite.
inline double unit_open(std::uint64_t bits) noexcept {
  return (static_cast<double>(bits >> 40) + 0.5) * (1.0 / 16777216.0);
}

// Element i of a standard normal stream keyed by `key` (Box-Muller on a counter-based generator).
inline float standard_normal(std::uint64_t key, std::uint64_t i) noexcept {
  constexpr double kTwoPi = 6.283185307179586;
  const double u1 = unit_open(splitmix64(key ^ splitmix64(2 * i)));
  const double u2 = unit_open(splitmix64(key ^ splitmix64(2 * i + 1)));
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2));
}

// Element i of a tensor rank's shard takes the value of its element in the whole parameter
// (parallel::full_index, by the split the parameter declares), so a split model starts where the
// whole one does.
inline void fill_normal(Param& p, std::uint64_t seed, float stddev, const TensorParallel& tp = {},
                        zerotk::parallel::TensorSplit split = {}) {
  if (p.data() == nullptr) return;  // another pipeline stage's: not bound on this rank
  const std::uint64_t key = splitmix64(seed) ^ hash_name(p.name());
  const std::size_t rows = p.dim(0), cols = p.numel() / std::max<std::size_t>(rows, 1);
  const auto t = static_cast<std::size_t>(tp.size);
  const zerotk::parallel::MatrixShape full =
      split.dim == zerotk::parallel::SplitDim::rows   ? zerotk::parallel::MatrixShape{rows * t, cols}
      : split.dim == zerotk::parallel::SplitDim::cols ? zerotk::parallel::MatrixShape{rows, cols * t}
                                                      : zerotk::parallel::MatrixShape{rows, cols};
  for (std::size_t i = 0; i < p.numel(); ++i) {
    p.data()[i] = stddev * standard_normal(key, zerotk::parallel::full_index(i, full, split, tp.rank, tp.size));
  }
}

inline void fill_constant(Param& p, float v) {
  if (p.data() != nullptr) std::fill_n(p.data(), p.numel(), v);
}

}  // namespace detail

/// Writes GPT-2 style initial values into the bound parameters: weights and embeddings normal(0, 0.02),
/// the two residual projections of each block normal(0, 0.02 / sqrt(2 L)), biases 0, LayerNorm gain 1.
/// Element i of a parameter depends only on (seed, parameter name, i): the result is the same for any
/// binding layout, visiting order, thread count or rank, and a tensor rank's shard holds its elements
/// of the whole parameter's values. Parameters without storage (another pipeline stage's, which this
/// rank's engine did not bind) are skipped.
inline void init_parameters(Gpt& model, std::uint64_t seed) {
  constexpr float kStd = 0.02f;
  const float residual_std = kStd / std::sqrt(2.0f * static_cast<float>(model.config.n_layers));
  auto layer_norm = [](LayerNorm& ln) {
    detail::fill_constant(ln.weight, 1.0f);
    detail::fill_constant(ln.bias, 0.0f);
  };
  auto linear = [&](Linear& l, float stddev) {
    detail::fill_normal(l.weight, seed, stddev, model.tensor, l.weight.tensor_split());
    detail::fill_constant(l.bias, 0.0f);
  };
  detail::fill_normal(model.embedding.wte, seed, kStd);
  detail::fill_normal(model.embedding.wpe, seed, kStd);
  for (auto& b : model.blocks) {
    layer_norm(b.ln1);
    linear(b.qkv, kStd);
    linear(b.proj, residual_std);
    layer_norm(b.ln2);
    if (b.moe) {
      linear(b.moe->router, kStd);
      for (auto& l : b.moe->fc) linear(l, kStd);
      for (auto& l : b.moe->proj) linear(l, residual_std);
      continue;
    }
    linear(b.fc, kStd);
    linear(b.fc_proj, residual_std);
  }
  layer_norm(model.head.ln_f);
  if (!model.head.tied()) detail::fill_normal(model.head.weight, seed, kStd);
}

}  // namespace gpt
