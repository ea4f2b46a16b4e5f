#pragma once
/// \file zerotk/parallel/linear.hpp
/// Column- and row-parallel linear layers (Megatron-LM's), on the host, over the user's buffers.
/// y = x W^T + b with x [tokens, in], W [out, in], b [out]:
///
/// - **Column-parallel**: each tensor rank holds rows of W and b (TensorSplit::rows(parts); fused QKV
///   or [gate; up] with parts 3 or 2, parallel/split.hpp) and computes its output features
///   [tokens, out / T] from the whole input. Backward sums the input's gradient over the tensor group
///   (CopyToRegion), or reduce-scatters it by tokens under sequence parallel. Each output element is
///   the same dot product as at tensor size 1, so its values equal tensor size 1's bit for bit.
/// - **Row-parallel**: each rank holds columns of W (TensorSplit::cols()) and the input features that
///   match (a column-parallel layer's output, [tokens, in / T]), computes a partial product, and the
///   partial products are summed over the tensor group (ReduceFromRegion), or reduce-scattered by
///   tokens under sequence parallel; b (replicated) is added after the sum. The sum is the
///   communicator's: rank order on threads, so the result equals
///   `row_parallel_reference` (partials summed p0 + p1 + ... in rank order) bit for bit.
///
/// Under sequence parallel a replicated parameter used on this rank's tokens only (the row-parallel
/// bias, LayerNorm) gets a gradient from those tokens only: sum it over the tensor group
/// (`sum_replicated_grads`) before the optimizer, or every rank steps with a different gradient.
///
/// dense_forward / dense_backward are the deterministic reference products these helpers use (each
/// output element sums over k in order, fp32); a trainer with its own GEMM composes region.hpp's
/// operators around it the same way.

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/comm/typed.hpp"
#include "zerotk/parallel/region.hpp"
#include "zerotk/parallel/split.hpp"
#include "zerotk/parallel/split_param.hpp"

namespace zerotk::parallel {

/// y [n, out] = x [n, in] W^T [in, out] + b (b may be empty). Sums over k = 0..in-1 in order.
inline void dense_forward(std::span<const float> x, std::span<const float> w, std::span<const float> b,
                          std::span<float> y, std::size_t n, std::size_t in, std::size_t out) {
  detail::expect(x.size() == n * in && w.size() == out * in && (b.empty() || b.size() == out) && y.size() == n * out,
                 "zerotk::parallel::dense_forward",
                 "x " + std::to_string(x.size()) + ", w " + std::to_string(w.size()) + ", b " + std::to_string(b.size()) +
                     ", y " + std::to_string(y.size()) + " for n " + std::to_string(n) + ", in " + std::to_string(in) +
                     ", out " + std::to_string(out));
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t o = 0; o < out; ++o) {
      float s = 0.0f;
      for (std::size_t k = 0; k < in; ++k) s += x[i * in + k] * w[o * in + k];
      y[i * out + o] = b.empty() ? s : s + b[o];
    }
  }
}

/// dx [n, in] = dy W (overwritten; may be empty), dw [out, in] += dy^T x, db [out] += column sums of
/// dy (may be empty). Each sum runs in index order.
inline void dense_backward(std::span<const float> x, std::span<const float> w, std::span<const float> dy,
                           std::span<float> dx, std::span<float> dw, std::span<float> db, std::size_t n, std::size_t in,
                           std::size_t out) {
  detail::expect(x.size() == n * in && w.size() == out * in && dy.size() == n * out &&
                     (dx.empty() || dx.size() == n * in) && dw.size() == out * in && (db.empty() || db.size() == out),
                 "zerotk::parallel::dense_backward",
                 "x " + std::to_string(x.size()) + ", w " + std::to_string(w.size()) + ", dy " + std::to_string(dy.size()) +
                     " for n " + std::to_string(n) + ", in " + std::to_string(in) + ", out " + std::to_string(out));
  if (!dx.empty()) {
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t k = 0; k < in; ++k) {
        float s = 0.0f;
        for (std::size_t o = 0; o < out; ++o) s += dy[i * out + o] * w[o * in + k];
        dx[i * in + k] = s;
      }
    }
  }
  for (std::size_t o = 0; o < out; ++o) {
    for (std::size_t k = 0; k < in; ++k) {
      float s = 0.0f;
      for (std::size_t i = 0; i < n; ++i) s += dy[i * out + o] * x[i * in + k];
      dw[o * in + k] += s;
    }
    if (!db.empty()) {
      float s = 0.0f;
      for (std::size_t i = 0; i < n; ++i) s += dy[i * out + o];
      db[o] += s;
    }
  }
}

/// The sizes of one linear layer split across `tensor_size` ranks; the constructor checks that the
/// split divides (usage_error naming `name`, the dimension and the sizes).
struct ParallelLinearShape {
  std::string name;
  std::size_t in = 0, out = 0;  ///< the full layer's features
  int tensor_size = 1;
  int parts = 1;                ///< fused parts of a column-parallel weight (QKV 3, [gate; up] 2)
  bool sequence_parallel = false;
};

class ColumnParallelLinear {
 public:
  explicit ColumnParallelLinear(ParallelLinearShape s) : s_(std::move(s)) {
    check_split(s_.name + ".weight", weight_shape(), weight_split(), s_.tensor_size);
  }
  TensorSplit weight_split() const noexcept { return TensorSplit::rows(s_.parts); }
  TensorSplit bias_split() const noexcept { return TensorSplit::rows(s_.parts); }
  MatrixShape weight_shape() const noexcept { return {s_.out, s_.in}; }
  MatrixShape bias_shape() const noexcept { return {s_.out, 1}; }
  std::size_t local_out() const noexcept { return s_.out / static_cast<std::size_t>(s_.tensor_size); }
  const ParallelLinearShape& shape() const noexcept { return s_; }
  /// This rank's weight and bias as parameters that declare their split (the engine reads it):
  /// "<name>.weight" [out / T, in] and "<name>.bias" [out / T], both rows(parts).
  SplitParam<float> weight_param() const { return {s_.name + ".weight", {local_out(), s_.in}, weight_split()}; }
  SplitParam<float> bias_param() const { return {s_.name + ".bias", {local_out()}, bias_split()}; }

  /// y_local [tokens, out / T] = x W_r^T + b_r. `x` holds every token ([tokens, in]; under sequence
  /// parallel gather it first: GatherFirstDim::forward).
  void forward(std::span<const float> x, std::size_t tokens, std::span<const float> w_r, std::span<const float> b_r,
               std::span<float> y_local) const {
    dense_forward(x, w_r, b_r, y_local, tokens, s_.in, local_out());
  }

  /// dw_r += dy^T x, db_r += sums of dy; the input's gradient summed over the tensor group: into `dx`
  /// ([tokens, in]), or under sequence parallel this rank's tokens of it into `dx_local`
  /// ([tokens / T, in]; `dx` is then scratch).
  template <comm::Communicator C>
  void backward(C& tp, std::span<const float> x, std::size_t tokens, std::span<const float> w_r,
                std::span<const float> dy_local, std::span<float> dx, std::span<float> dw_r, std::span<float> db_r,
                std::span<float> dx_local = {}) const {
    dense_backward(x, w_r, dy_local, dx, dw_r, db_r, tokens, s_.in, local_out());
    if (s_.sequence_parallel) {
      GatherFirstDim::backward(tp, std::span<const float>(dx), dx_local);
    } else {
      CopyToRegion::backward(tp, dx);
    }
  }

 private:
  ParallelLinearShape s_;
};

class RowParallelLinear {
 public:
  explicit RowParallelLinear(ParallelLinearShape s) : s_(std::move(s)) {
    check_split(s_.name + ".weight", weight_shape(), weight_split(), s_.tensor_size);
  }
  TensorSplit weight_split() const noexcept { return TensorSplit::cols(); }
  TensorSplit bias_split() const noexcept { return TensorSplit::replicated(); }
  MatrixShape weight_shape() const noexcept { return {s_.out, s_.in}; }
  std::size_t local_in() const noexcept { return s_.in / static_cast<std::size_t>(s_.tensor_size); }
  const ParallelLinearShape& shape() const noexcept { return s_; }
  /// This rank's weight and the bias as parameters that declare their split (the engine reads it):
  /// "<name>.weight" [out, in / T] cols(), "<name>.bias" [out] replicated (every rank holds it whole).
  SplitParam<float> weight_param() const { return {s_.name + ".weight", {s_.out, local_in()}, weight_split()}; }
  SplitParam<float> bias_param() const { return {s_.name + ".bias", {s_.out}, bias_split()}; }

  /// y = sum over tensor ranks of x_local W_r^T, then + b: into `y` ([tokens, out]); under sequence
  /// parallel this rank's tokens into `y_local` ([tokens / T, out]; `y` is then scratch for the
  /// partial product).
  template <comm::Communicator C>
  void forward(C& tp, std::span<const float> x_local, std::size_t tokens, std::span<const float> w_r,
               std::span<const float> b, std::span<float> y, std::span<float> y_local = {}) const {
    dense_forward(x_local, w_r, {}, y, tokens, local_in(), s_.out);
    std::span<float> out = y;
    if (s_.sequence_parallel) {
      ReduceScatterFirstDim::forward(tp, std::span<const float>(y), y_local);
      out = y_local;
    } else {
      ReduceFromRegion::forward(tp, y);
    }
    if (!b.empty()) {
      for (std::size_t i = 0; i < out.size(); ++i) out[i] += b[i % s_.out];
    }
  }

  /// dx_local = dy W_r, dw_r += dy^T x_local, db += sums of dy. `dy` holds every token's gradient
  /// ([tokens, out]; under sequence parallel gather it first: ReduceScatterFirstDim::backward). `db`
  /// is the replicated bias's gradient: without sequence parallel every tensor rank computes the same
  /// one; under it pass this rank's tokens as `dy_bias` and sum db with sum_replicated_grads.
  void backward(std::span<const float> x_local, std::size_t tokens, std::span<const float> w_r, std::span<const float> dy,
                std::span<float> dx_local, std::span<float> dw_r, std::span<float> db,
                std::span<const float> dy_bias = {}) const {
    dense_backward(x_local, w_r, dy, dx_local, dw_r, {}, tokens, local_in(), s_.out);
    const std::span<const float> src = dy_bias.empty() ? dy : dy_bias;
    if (!db.empty()) {
      for (std::size_t i = 0; i < src.size(); ++i) db[i % s_.out] += src[i];
    }
  }

 private:
  ParallelLinearShape s_;
};

/// Under sequence parallel: the gradient of a replicated parameter used on this rank's tokens only
/// (LayerNorm, a row-parallel bias) summed over the tensor group, so every rank steps the same value.
template <comm::Communicator C>
void sum_replicated_grads(C& tp, std::span<float> grad) {
  comm::all_reduce(tp, grad, comm::ReduceOp::sum).wait();
}

/// The serial reference of a row-parallel product: every rank's partial x_r W_r^T summed in rank
/// order (p0 + p1 + ... + p_{T-1}, each element), then + b. `x` [tokens, in], `w` [out, in] full.
inline std::vector<float> row_parallel_reference(std::span<const float> x, std::span<const float> w,
                                                 std::span<const float> b, std::size_t tokens, std::size_t in,
                                                 std::size_t out, int tensor_size) {
  const std::size_t local = in / static_cast<std::size_t>(tensor_size);
  std::vector<float> y(tokens * out, 0.0f), xr(tokens * local), wr(out * local), p(tokens * out);
  for (int r = 0; r < tensor_size; ++r) {
    take_shard<float>(x, {tokens, in}, TensorSplit::cols(), r, tensor_size, xr);
    take_shard<float>(w, {out, in}, TensorSplit::cols(), r, tensor_size, wr);
    dense_forward(xr, wr, {}, p, tokens, local, out);
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = r == 0 ? p[i] : y[i] + p[i];
  }
  if (!b.empty()) {
    for (std::size_t i = 0; i < y.size(); ++i) y[i] += b[i % out];
  }
  return y;
}

}  // namespace zerotk::parallel
