#pragma once
/// \file zerotk/optim/clip.hpp
/// Global-norm gradient clipping fused with unscaling (SEMANTICS.md section 2).
///
/// Each rank sums the squares of the gradients it owns (its ZeRO partition, still multiplied by the
/// loss scale) in fp64; `global_sum_squares` all-reduces that sum; `clip_factor` turns it into ONE
/// factor that both unscales and clips, so the optimizer pass reads each gradient once:
///
///   double local = kernels::host::sum_squares(grad_partition, n);          // fp64, scaled grads
///   auto c = zerotk::clip_factor(zerotk::global_sum_squares(comm, local), scale_used, 1.0);
///   // optimizer: g = grad[i] * c.grad_factor
///
/// `scale_used` is the loss scale the gradients were produced with, i.e. scaler.scale() read
/// BEFORE scaler.update(). (DeepSpeed's ZeRO 1/2 path divides by the post-update scale, which on
/// a growth step unscales by twice the scale the gradients carry; zerotk does not copy that.)

#include <cmath>
#include <cstdint>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"

namespace zerotk::optim {

/// DeepSpeed's guard added to the unscaled norm before dividing by the clip threshold.
inline constexpr double kClipEpsilon = 1e-6;

/// The outcome of clip_factor.
struct ClipResult {
  double total_norm = 0;      ///< L2 norm of the scaled gradients over all ranks; -1 if it was inf/NaN
  double reported_norm = 0;   ///< total_norm / loss_scale (the unscaled norm to log); -1 if inf/NaN
  float combined_scale = 1;   ///< k * loss_scale, with k = max(1, (norm/scale + 1e-6) / clip)
  float grad_factor = 1;      ///< 1 / (k * loss_scale), rounded once from double: multiply gradients by it
  bool finite = true;         ///< false when the norm was inf/NaN (then no clipping, only unscaling)
  bool clipped = false;       ///< true when k > 1
};

/// Combines unscaling and clipping into one factor (SEMANTICS.md section 2):
/// `k = ((total_norm / scale) + 1e-6) / clip; k = max(k, 1); combined = k * scale`.
/// An inf/NaN norm counts as -1, i.e. no clipping. `gradient_clipping` = 0 disables clipping.
/// Computed in double; combined_scale and grad_factor are each rounded to float once.
/// \throws config_error at "/gradient_clipping" if `gradient_clipping` is negative or not finite;
///   usage_error if `loss_scale` is not positive and finite, or `global_sum_squares` is negative.
inline ClipResult clip_factor(double global_sum_squares, double loss_scale, double gradient_clipping) {
  if (!(gradient_clipping >= 0) || !std::isfinite(gradient_clipping))
    throw config_error("must be >= 0 and finite (0 disables clipping)", "/gradient_clipping",
                       to_text(gradient_clipping));
  if (!(loss_scale > 0) || !std::isfinite(loss_scale))
    throw usage_error("loss scale must be positive and finite", "clip_factor", to_text(loss_scale));
  if (global_sum_squares < 0)  // NaN compares false and is handled below as a non-finite norm
    throw usage_error("a sum of squares cannot be negative", "clip_factor", to_text(global_sum_squares));

  ClipResult r;
  r.total_norm = std::sqrt(global_sum_squares);
  r.finite = std::isfinite(r.total_norm);
  if (!r.finite) r.total_norm = -1.0;
  double combined = loss_scale;
  // DeepSpeed plugs -1 into the formula, which means no clipping for every sane clip threshold;
  // zerotk states it directly.
  if (gradient_clipping > 0 && r.finite) {
    const double k = ((r.total_norm / loss_scale) + kClipEpsilon) / gradient_clipping;
    if (k > 1.0) {
      combined = k * loss_scale;
      r.clipped = true;
    }
  }
  r.reported_norm = r.finite ? r.total_norm / loss_scale : -1.0;
  r.combined_scale = static_cast<float>(combined);
  r.grad_factor = static_cast<float>(1.0 / combined);
  return r;
}

/// Starts the fp64 sum over `comm` of `*sum_squares` in place (rank r passes the sum of squares
/// of the gradients it owns). `sum_squares` must stay valid until the Work is waited on.
template <comm::Communicator C>
[[nodiscard]] comm::Work global_sum_squares_async(C& comm, double* sum_squares) {
  return comm.all_reduce(sum_squares, sum_squares, 1, DType::fp64, comm::ReduceOp::sum);
}

/// The sum over all ranks of each rank's `local_sum_squares`, accumulated in fp64. Collective.
/// sqrt of the result is the global L2 norm.
template <comm::Communicator C>
double global_sum_squares(C& comm, double local_sum_squares) {
  double s = local_sum_squares;
  global_sum_squares_async(comm, &s).wait();
  return s;
}

}  // namespace zerotk::optim

namespace zerotk {
using optim::clip_factor;
using optim::ClipResult;
using optim::global_sum_squares;
using optim::global_sum_squares_async;
}  // namespace zerotk
