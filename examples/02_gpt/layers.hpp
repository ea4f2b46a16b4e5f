#pragma once
// examples/02_gpt/layers.hpp: the model's shape (Config), its tensor-parallel group (TensorParallel),
// its micro-batches, and the building blocks every layer of gpt.hpp and moe_mlp.hpp is made of:
// Linear and LayerNorm with hand-written backward over Eigen, the GELU, and the deferred weight
// gradients of zero-bubble schedules. User code: zerotk appears only as Param, SplitParam and the
// split a parameter declares.
#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <zerotk/core/error.hpp>
#include <zerotk/core/param.hpp>
#include <zerotk/parallel/split.hpp>
#include <zerotk/parallel/split_param.hpp>

namespace gpt {

/// Row-major float matrix: activations are [rows = B*T positions][features].
using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Vector = Eigen::VectorXf;
using Param = zerotk::Param<float>;
/// A Param that declares how it is split across the tensor group (the engine reads its
/// tensor_split(): the layer that cuts the shard says so once).
using SplitParam = zerotk::parallel::SplitParam<float>;

/// How a parameter of the model is split across the tensor group: what it declares, replicated when
/// it declares nothing (LayerNorms, embeddings, the head).
template <class P>
zerotk::parallel::TensorSplit tensor_split_of(const P& p) {
  if constexpr (zerotk::parallel::DeclaresTensorSplit<P>) {
    return p.tensor_split();
  } else {
    return zerotk::parallel::TensorSplit::replicated();
  }
}

/// Model shape. All sizes are positive; d_model must divide by n_heads.
struct Config {
  int vocab_size = 16;
  int context = 32;  ///< longest sequence the position embedding covers
  int d_model = 64;
  int n_heads = 4;
  int n_layers = 2;
  int d_ff = 0;  ///< MLP width; 0 means 4 * d_model
  bool tied_head = false;
  int experts = 0;  ///< > 0: each block's MLP is a mixture of this many experts (moe_mlp.hpp)
  int top_k = 1;    ///< with experts: the experts each token is routed to

  int mlp_width() const noexcept { return d_ff > 0 ? d_ff : 4 * d_model; }
  int head_dim() const noexcept { return d_model / n_heads; }

  /// Throws zerotk::config_error naming the field when a size is impossible.
  void validate() const {
    auto positive = [](int v, const char* where) {
      if (v <= 0) throw zerotk::config_error("must be > 0", where, std::to_string(v));
    };
    positive(vocab_size, "gpt.vocab_size");
    positive(context, "gpt.context");
    positive(d_model, "gpt.d_model");
    positive(n_heads, "gpt.n_heads");
    positive(n_layers, "gpt.n_layers");
    if (experts < 0) throw zerotk::config_error("must be >= 0 (0: a dense MLP)", "gpt.experts", std::to_string(experts));
    if (experts > 0 && (top_k < 1 || top_k > experts)) {
      throw zerotk::config_error("must be in [1, experts]", "gpt.top_k",
                                 std::to_string(top_k) + " with " + std::to_string(experts) + " experts");
    }
    if (d_ff < 0) throw zerotk::config_error("must be >= 0 (0 means 4 * d_model)", "gpt.d_ff", std::to_string(d_ff));
    if (d_model % n_heads != 0) {
      throw zerotk::config_error("d_model must be a multiple of n_heads", "gpt.d_model",
                                 std::to_string(d_model) + " with " + std::to_string(n_heads) + " heads");
    }
  }
};

/// The tensor-parallel group the model's blocks split across, and the collectives their region
/// operators need over float buffers. Size 1 (the default) splits nothing and calls nothing. A
/// trainer fills the functions from zerotk::parallel's region operators over its process grid's
/// tensor group (examples/02_gpt/train.cpp does).
struct TensorParallel {
  int size = 1;
  int rank = 0;
  /// Activations outside the tensor regions split by tokens (rank r holds rows [r N/T, (r+1) N/T)).
  bool sequence_parallel = false;
  /// Sum over the tensor group, in place: "g" after a row-parallel linear, "f"'s backward.
  std::function<void(std::span<float>)> all_reduce;
  /// Sequence parallel: every rank's [rows / T][cols] side by side -> [rows][cols] ("f" forward).
  std::function<void(std::span<const float>, std::span<float>)> all_gather_rows;
  /// Sequence parallel: [rows][cols] partial sums -> this rank's [rows / T][cols] of their sum ("g").
  std::function<void(std::span<const float>, std::span<float>)> reduce_scatter_rows;

  bool split() const noexcept { return size > 1; }

  /// Throws zerotk::usage_error naming the size when `c` cannot be split this way.
  void check(const Config& c) const {
    if (size < 1 || rank < 0 || rank >= size) {
      throw zerotk::usage_error("the tensor rank is outside the tensor group", "gpt::TensorParallel",
                                std::to_string(rank) + " of " + std::to_string(size));
    }
    if (!split()) return;
    zerotk::parallel::check_heads("gpt.n_heads", c.n_heads, size);
    if (c.mlp_width() % size != 0) {
      throw zerotk::usage_error("the MLP width is not divisible by the tensor size " + std::to_string(size) +
                                    " (each tensor rank computes d_ff / T columns)",
                                "gpt.d_ff", std::to_string(c.mlp_width()));
    }
    if (!all_reduce || (sequence_parallel && (!all_gather_rows || !reduce_scatter_rows))) {
      throw zerotk::usage_error("a split model needs the tensor group's collectives", "gpt::TensorParallel",
                                sequence_parallel ? "all_reduce, all_gather_rows, reduce_scatter_rows" : "all_reduce");
    }
  }
};


/// Token ids of one micro-batch, [batch][seq] row-major; the embedding layer's input.
struct TokenView {
  std::span<const std::int32_t> ids;
  int batch = 0;
  int seq = 0;
  int first_position = 0;  ///< the position of each row's first token (a context rank's chunk starts later)
};

/// One micro-batch: inputs and next-token targets, both [batch][seq] row-major. A target of kIgnore
/// takes no loss (the prompt half of a synthetic task, for example).
struct Batch {
  static constexpr std::int32_t kIgnore = -1;
  int batch = 0;
  int seq = 0;
  std::vector<std::int32_t> tokens;
  std::vector<std::int32_t> targets;
  /// A context rank's share of a batch (context_attention.hpp's context_share): its chunk's first
  /// position, and what its mean loss is multiplied by so that the mean over the data group is the
  /// replicas' mean loss (P x its targets / the whole sequences' targets). 0 and 1 for a whole batch.
  int first_position = 0;
  float loss_factor = 1.0f;

  void resize(int batch_size, int seq_len) {
    batch = batch_size;
    seq = seq_len;
    first_position = 0;
    loss_factor = 1.0f;
    const auto n = static_cast<std::size_t>(batch_size) * static_cast<std::size_t>(seq_len);
    tokens.assign(n, 0);
    targets.assign(n, kIgnore);
  }
  TokenView inputs() const noexcept { return {tokens, batch, seq, first_position}; }
};

namespace detail {

inline std::size_t dim(int v) { return static_cast<std::size_t>(v); }

// Views of a bound Param as Eigen objects. Maps are unaligned: a Param may start at any float inside
// the engine's flat buffer.
inline Eigen::Map<Matrix> value_matrix(Param& p) {
  return {p.data(), static_cast<Eigen::Index>(p.dim(0)), static_cast<Eigen::Index>(p.dim(1))};
}
inline Eigen::Map<Matrix> grad_matrix(Param& p) {
  return {p.grad(), static_cast<Eigen::Index>(p.dim(0)), static_cast<Eigen::Index>(p.dim(1))};
}
inline Eigen::Map<Eigen::RowVectorXf> value_row(Param& p) {
  return {p.data(), static_cast<Eigen::Index>(p.numel())};
}
inline Eigen::Map<Eigen::RowVectorXf> grad_row(Param& p) {
  return {p.grad(), static_cast<Eigen::Index>(p.numel())};
}

// Bytes held by Eigen matrices and vectors (activation accounting).
template <class... M>
std::size_t bytes_of(const M&... m) {
  return ((static_cast<std::size_t>(m.size()) * sizeof(float)) + ... + 0);
}
// Gives the storage of each back (release_activations).
template <class... M>
void free_all(M&... m) {
  ((m.resize(0, 0)), ...);
}
inline void free_vector(Vector& v) { v.resize(0); }

// Resizes only when the shape changes, so steady-state steps reuse the same storage.
inline void ensure_shape(Matrix& m, Eigen::Index rows, Eigen::Index cols) {
  if (m.rows() != rows || m.cols() != cols) m.resize(rows, cols);
}

// dst += sum over rows of `rows_of(n)`, n = 0 .. count-1, summed in row order in `acc` first. Eigen's own
// colwise().sum() picks its summation order by the destination's alignment, which would make gradients
// depend on where the engine placed a parameter; this order never does.
// `across`, when set, sums the row sum over other ranks (sequence parallel: each holds some tokens)
// before it is added, so that a gradient accumulating over micro-steps is summed once per micro-step.
template <class RowAt>
void add_row_sum(Eigen::Index count, RowAt&& rows_of, Eigen::RowVectorXf& acc, Eigen::Map<Eigen::RowVectorXf> dst,
                 const std::function<void(std::span<float>)>* across = nullptr) {
  acc.setZero(dst.size());
  for (Eigen::Index n = 0; n < count; ++n) acc += rows_of(n);
  if (across != nullptr && *across) (*across)(std::span<float>(acc.data(), static_cast<std::size_t>(acc.size())));
  dst += acc;
}

// GELU, tanh form (GPT-2's): g = 0.5 h (1 + tanh(u)), u = sqrt(2/pi) (h + 0.044715 h^3).
inline constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)
inline constexpr float kGeluA = 0.044715f;

inline void gelu(const Matrix& h, Matrix& g) {
  ensure_shape(g, h.rows(), h.cols());
  const auto a = h.array();
  g.array() = 0.5f * a * (1.0f + (kGeluC * (a + kGeluA * a.cube())).tanh());
}

// dg *= d gelu / dh = 0.5 (1 + t) + 0.5 h (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 h^2), t = tanh(u):
// the gradient with respect to g becomes the one with respect to h.
inline void gelu_backward(const Matrix& h, Matrix& dg) {
  const auto a = h.array();
  const auto t = (kGeluC * (a + kGeluA * a.cube())).tanh();
  dg.array() *= 0.5f * (1.0f + t) + 0.5f * a * (1.0f - t.square()) * kGeluC * (1.0f + 3.0f * kGeluA * a.square());
}

}  // namespace detail

/// Weight gradients set aside for later: a zero-bubble pipeline schedule (ZB-H1) runs a backward's
/// input-gradient half first and its weight half later. While a layer's `defer` points here, its
/// backward computes the input gradient only and records, per layer of the model's list (set_layer),
/// a work item that adds its weight gradients from copies of what they need; run(i) does layer i's.
class DeferredWeights {
 public:
  void set_layer(int i) noexcept { layer_ = i; }
  template <class F>
  void add(F&& f) {
    items_.push_back(Item{layer_, std::function<void()>(std::forward<F>(f))});
  }
  /// Layer `i`'s items, in the order they were recorded; then they are gone.
  void run(int i) {
    for (Item& it : items_) {
      if (it.layer == i && it.fn) {
        it.fn();
        it.fn = nullptr;
      }
    }
  }
  bool empty() const noexcept {
    for (const Item& it : items_) {
      if (it.fn) return false;
    }
    return true;
  }

 private:
  struct Item {
    int layer;
    std::function<void()> fn;
  };
  std::vector<Item> items_;
  int layer_ = -1;
};

/// How a Linear's weight and bias are split across the tensor group (both replicated: a whole layer).
struct LinearSplit {
  zerotk::parallel::TensorSplit weight{}, bias{};
};

/// y = x W^T + b with W [out][in] (PyTorch layout) and b [out]. Keeps no activations: the owning
/// layer keeps x for backward. `in` and `out` are this rank's shard's; `split` says how it was cut.
class Linear {
 public:
  SplitParam weight;
  SplitParam bias;

  Linear(const std::string& name, int in, int out, LinearSplit split = {})
      : weight{name + ".weight", {detail::dim(out), detail::dim(in)}, split.weight},
        bias{name + ".bias", {detail::dim(out)}, split.bias} {}

  template <class Visit>
  void parameters(Visit&& visit) {
    visit(weight.name(), weight);
    visit(bias.name(), bias);
  }

  // x [N][in] -> y [N][out]
  void forward(const Matrix& x, Matrix& y) {
    detail::ensure_shape(y, x.rows(), static_cast<Eigen::Index>(weight.dim(0)));
    y.noalias() = x * detail::value_matrix(weight).transpose();
    y.rowwise() += detail::value_row(bias);
  }

  // Row-parallel: y = x W^T, a partial sum over the tensor group; the bias goes on after the sum.
  void forward_partial(const Matrix& x, Matrix& y) {
    detail::ensure_shape(y, x.rows(), static_cast<Eigen::Index>(weight.dim(0)));
    y.noalias() = x * detail::value_matrix(weight).transpose();
  }
  void add_bias(Matrix& y) { y.rowwise() += detail::value_row(bias); }

  // dW += dy^T x, db += sum over rows of dy; dx = dy W when dx is given. dy [N][out], x [N][in].
  void backward(const Matrix& x, const Matrix& dy, Matrix* dx) {
    if (defer != nullptr) {
      defer->add([this, x = Matrix(x), dy = Matrix(dy)] { weight_grads(x, dy); });
    } else {
      weight_grads(x, dy);
    }
    if (dx != nullptr) {
      detail::ensure_shape(*dx, dy.rows(), x.cols());
      dx->noalias() = dy * detail::value_matrix(weight);
    }
  }

  /// Set: the weight gradients wait there (DeferredWeights).
  DeferredWeights* defer = nullptr;

 private:
  void weight_grads(const Matrix& x, const Matrix& dy) {
    detail::grad_matrix(weight).noalias() += dy.transpose() * x;
    detail::add_row_sum(dy.rows(), [&](Eigen::Index n) { return dy.row(n); }, acc_, detail::grad_row(bias));
  }

  Eigen::RowVectorXf acc_;  // [out] scratch for the bias gradient
};

/// y = (x - mean) / sqrt(var + eps) * gain + shift over the last dimension (biased variance, as
/// PyTorch). Keeps no activations: the caller keeps xhat [N][d] and rstd [N].
class LayerNorm {
 public:
  static constexpr float kEps = 1e-5f;
  Param weight;  // gain [d]
  Param bias;    // shift [d]

  LayerNorm(const std::string& name, int d)
      : weight{name + ".weight", {detail::dim(d)}}, bias{name + ".bias", {detail::dim(d)}} {}

  template <class Visit>
  void parameters(Visit&& visit) {
    visit(weight.name(), weight);
    visit(bias.name(), bias);
  }

  void forward(const Matrix& x, Matrix& y, Matrix& xhat, Vector& rstd) {
    const Eigen::Index rows = x.rows(), d = x.cols();
    detail::ensure_shape(y, rows, d);
    detail::ensure_shape(xhat, rows, d);
    if (rstd.size() != rows) rstd.resize(rows);
    const auto gain = detail::value_row(weight).array();
    const auto shift = detail::value_row(bias).array();
    for (Eigen::Index n = 0; n < rows; ++n) {  // rows are contiguous: each line below vectorizes
      auto xh = xhat.row(n).array();
      xh = x.row(n).array() - x.row(n).mean();
      const float r = 1.0f / std::sqrt(xh.square().mean() + kEps);
      xh *= r;
      rstd[n] = r;
      y.row(n).array() = xh * gain + shift;
    }
  }

  // dx += d(LN)/dx^T dy (added, because every LayerNorm here feeds a residual sum or a fresh zero).
  // With g = dy * gain: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
  void backward(const Matrix& dy, const Matrix& xhat, const Vector& rstd, Matrix& dx) {
    const Eigen::Index rows = dy.rows();
    const auto gain = detail::value_row(weight).array();
    for (Eigen::Index n = 0; n < rows; ++n) {
      const auto g = dy.row(n).array() * gain;
      const auto xh = xhat.row(n).array();
      const float mean_g = g.mean();
      const float mean_gx = (g * xh).mean();
      dx.row(n).array() += rstd[n] * (g - mean_g - xh * mean_gx);
    }
    if (defer != nullptr) {
      defer->add([this, dy = Matrix(dy), xhat = Matrix(xhat)] { weight_grads(dy, xhat); });
    } else {
      weight_grads(dy, xhat);
    }
  }

  /// Set: the gain and shift gradients wait there (DeferredWeights).
  DeferredWeights* defer = nullptr;

  /// Sequence parallel: the gain and shift gradients of this rank's tokens are summed over the
  /// tensor group through this (each micro-step's own contribution, before it accumulates).
  std::function<void(std::span<float>)> token_sum;

 private:
  void weight_grads(const Matrix& dy, const Matrix& xhat) {
    const Eigen::Index rows = dy.rows();
    detail::add_row_sum(rows, [&](Eigen::Index n) { return dy.row(n).cwiseProduct(xhat.row(n)); }, acc_,
                        detail::grad_row(weight), &token_sum);
    detail::add_row_sum(rows, [&](Eigen::Index n) { return dy.row(n); }, acc_, detail::grad_row(bias), &token_sum);
  }

  Eigen::RowVectorXf acc_;  // [d] scratch for the gain and shift gradients
};

}  // namespace gpt
