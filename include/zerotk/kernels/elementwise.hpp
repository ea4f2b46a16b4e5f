#pragma once
/// \file zerotk/kernels/elementwise.hpp
/// The per-element math of every fused kernel, written once and shared by the host drivers
/// (kernels/host/, instantiated for `float` and for SIMD vectors of float) and the CUDA kernels
/// (kernels/cuda/, instantiated for `float`). Host tests therefore check the math the GPU runs.
///
/// Formulas (SEMANTICS.md section 3), with bc1 = 1 - beta1^t, bc2 = 1 - beta2^t, t >= 1:
///
///   Adam, L2 mode:  g += wd * p                                  (before the moments)
///   moments:        m = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g^2
///   step:           p -= lr * ( (m / bc1) / (sqrt(v / bc2) + eps) + [AdamW] wd * p )
///
/// This is the GPU-fused form (DeepSpeed's FusedAdam); the CPU form (decay p *= 1 - lr wd first, eps
/// added to sqrt(v)/sqrt(bc2), step lr/bc1) equals it in exact arithmetic and differs only in
/// rounding. zerotk uses the fused form on every back end, so host and CUDA agree.
///
///   LAMB phase 1:   moments as above;  u = m / (sqrt(v) + eps) + wd * p;  per tensor ||p||^2, ||u||^2
///   LAMB phase 2:   coeff = clamp(||p|| / ||u||, min_coeff, max_coeff), 1 if either norm is 0
///                   p -= step_size * coeff * u,  step_size = lr * sqrt(bc2) / bc1 (or lr)
///
/// Bit-exact agreement between back ends and between SIMD lanes and scalar tails. Every operation
/// below is a correctly rounded IEEE operation (add, mul, div, sqrt, fused multiply-add), and no
/// product feeds an addition directly: each `a * b + c` is written as `fma(a, b, c)`. Compilers
/// therefore have nothing to contract (neither gcc's default -ffp-contract=fast nor nvcc's --fmad),
/// and a scalar, an AVX2, an AVX-512 and a CUDA thread compute the same bits. (nvcc's --use_fast_math
/// replaces the division by an approximation and breaks this; zerotk never passes it.)
///
/// `F` is `float` or a host SIMD vector type providing + - * /, `fma` and `sqrt` (found by
/// argument-dependent lookup) and construction from a float (broadcast).

#include <cmath>
#include <cstdint>
#include <cstring>

#include "zerotk/core/dtype.hpp"
#include "zerotk/core/macros.hpp"

// Templates below are __host__ __device__ and are also instantiated with host-only SIMD vector types
// (kernels/host/simd.hpp); tell nvcc not to check the execution space of those instantiations.
#if defined(__CUDACC__)
#define ZEROTK_HD_TEMPLATE _Pragma("nv_exec_check_disable")
#else
#define ZEROTK_HD_TEMPLATE
#endif

namespace zerotk::kernels {

// ---- correctly rounded scalar primitives ----------------------------------------------------------

/// a * b + c with a single rounding (hardware FMA on the GPU and on x86-64-v3 and newer).
ZEROTK_HD ZEROTK_FORCEINLINE float fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return __builtin_fmaf(a, b, c);
#endif
}

/// Correctly rounded square root.
ZEROTK_HD ZEROTK_FORCEINLINE float sqrt(float x) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);
#else
  return __builtin_sqrtf(x);
#endif
}

// ---- inf / NaN ------------------------------------------------------------------------------------

/// True for +-inf and NaN. A test of the exponent bits, so it also works where the compiler was told
/// that no inf/NaN exist (-ffast-math, --use_fast_math), which makes std::isfinite always true.
ZEROTK_HD ZEROTK_FORCEINLINE bool is_nonfinite(float x) {
  return (detail::float_bits(x) & 0x7f800000u) == 0x7f800000u;
}
ZEROTK_HD ZEROTK_FORCEINLINE bool is_nonfinite(double x) {
#if defined(__CUDA_ARCH__)
  const auto u = static_cast<std::uint64_t>(__double_as_longlong(x));
#else
  std::uint64_t u;
  std::memcpy(&u, &x, sizeof u);
#endif
  return (u & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
}
ZEROTK_HD ZEROTK_FORCEINLINE bool is_nonfinite(half x) { return (x.bits & 0x7c00u) == 0x7c00u; }
ZEROTK_HD ZEROTK_FORCEINLINE bool is_nonfinite(bfloat16 x) { return (x.bits & 0x7f80u) == 0x7f80u; }

/// Gradients enter every fused kernel multiplied by one factor: 1 / (loss_scale * clip_coefficient).
ZEROTK_HD_TEMPLATE
template <class F>
ZEROTK_HD ZEROTK_FORCEINLINE F unscale(const F& g, float factor) {
  return g * F(factor);
}

// ---- Adam / AdamW ---------------------------------------------------------------------------------

/// Hyper-parameters of one Adam step (one parameter group).
struct AdamHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool adamw_mode = true;       ///< decoupled decay (AdamW); false: L2 decay added to the gradient
  bool bias_correction = true;  ///< divide the moments by 1 - beta^t
};

/// Constants of one Adam step, computed once per (group, step) so the per-element code has no pow().
struct AdamStepConsts {
  float lr, beta1, beta2;
  float one_minus_beta1, one_minus_beta2;  // computed in double from the float betas, then rounded
  float eps, weight_decay;
  float inv_bc1, inv_bc2;  // 1 / (1 - beta^t) rounded to float; 1 without bias correction
  bool adamw_mode;

  /// `step` is the 1-based index of the step being taken.
  static AdamStepConsts make(const AdamHyper& h, std::int64_t step) {
    AdamStepConsts k{};
    k.lr = h.lr;
    k.beta1 = h.beta1;
    k.beta2 = h.beta2;
    k.one_minus_beta1 = static_cast<float>(1.0 - static_cast<double>(h.beta1));
    k.one_minus_beta2 = static_cast<float>(1.0 - static_cast<double>(h.beta2));
    k.eps = h.eps;
    k.weight_decay = h.weight_decay;
    k.inv_bc1 = 1.0f;
    k.inv_bc2 = 1.0f;
    if (h.bias_correction) {
      const double t = static_cast<double>(step);
      k.inv_bc1 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(h.beta1), t)));
      k.inv_bc2 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(h.beta2), t)));
    }
    k.adamw_mode = h.adamw_mode;
    return k;
  }
};

/// One Adam/AdamW update of one element (or one SIMD vector of elements). `g` is already unscaled.
/// p: fp32 master value, m/v: first and second moments.
ZEROTK_HD_TEMPLATE
template <class F>
ZEROTK_HD ZEROTK_FORCEINLINE void adam_update(F& p, F& m, F& v, const F& g, const AdamStepConsts& k) {
  F grad = g;
  if (!k.adamw_mode) grad = fma(F(k.weight_decay), p, grad);
  m = fma(F(k.beta1), m, F(k.one_minus_beta1) * grad);
  v = fma(F(k.beta2), v, (F(k.one_minus_beta2) * grad) * grad);
  const F denom = sqrt(v * F(k.inv_bc2)) + F(k.eps);
  F update = (m * F(k.inv_bc1)) / denom;
  if (k.adamw_mode) update = fma(F(k.weight_decay), p, update);
  p = fma(F(-k.lr), update, p);
}

// ---- LAMB -----------------------------------------------------------------------------------------

/// Hyper-parameters of one LAMB step (one parameter group).
struct LambHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool bias_correction = true;
  float min_coeff = 0.01f;  ///< lower clamp of the trust ratio
  float max_coeff = 10.0f;  ///< upper clamp of the trust ratio
};

/// Constants of one LAMB step.
struct LambStepConsts {
  float beta1, beta2;
  float one_minus_beta1, one_minus_beta2;
  float eps, weight_decay;
  float step_size;  // lr * sqrt(bc2) / bc1 (computed in double), or lr without bias correction
  float min_coeff, max_coeff;

  static LambStepConsts make(const LambHyper& h, std::int64_t step) {
    LambStepConsts k{};
    k.beta1 = h.beta1;
    k.beta2 = h.beta2;
    k.one_minus_beta1 = static_cast<float>(1.0 - static_cast<double>(h.beta1));
    k.one_minus_beta2 = static_cast<float>(1.0 - static_cast<double>(h.beta2));
    k.eps = h.eps;
    k.weight_decay = h.weight_decay;
    double s = h.lr;
    if (h.bias_correction) {
      const double t = static_cast<double>(step);
      s = s * std::sqrt(1.0 - std::pow(static_cast<double>(h.beta2), t)) /
          (1.0 - std::pow(static_cast<double>(h.beta1), t));
    }
    k.step_size = static_cast<float>(s);
    k.min_coeff = h.min_coeff;
    k.max_coeff = h.max_coeff;
    return k;
  }
};

/// LAMB's update direction from the current moments: u = m / (sqrt(v) + eps) + wd * p.
/// Phase 2 recomputes it from the stored m, v (bit-identical to phase 1, no scratch buffer).
ZEROTK_HD_TEMPLATE
template <class F>
ZEROTK_HD ZEROTK_FORCEINLINE F lamb_direction(const F& p, const F& m, const F& v, const LambStepConsts& k) {
  return fma(F(k.weight_decay), p, m / (sqrt(v) + F(k.eps)));
}

/// LAMB phase 1 for one element: updates m, v and returns the direction u.
ZEROTK_HD_TEMPLATE
template <class F>
ZEROTK_HD ZEROTK_FORCEINLINE F lamb_moments(const F& p, F& m, F& v, const F& g, const LambStepConsts& k) {
  m = fma(F(k.beta1), m, F(k.one_minus_beta1) * g);
  v = fma(F(k.beta2), v, (F(k.one_minus_beta2) * g) * g);
  return lamb_direction(p, m, v, k);
}

/// The trust ratio from a tensor's ||p||^2 and ||u||^2 (summed over all ranks): ||p|| / ||u|| clamped
/// to [min_coeff, max_coeff], or 1 when either norm is 0. A NaN norm gives a NaN ratio (visible).
ZEROTK_HD ZEROTK_FORCEINLINE float lamb_trust_ratio(double p_sumsq, double u_sumsq, const LambStepConsts& k) {
  if (p_sumsq == 0.0 || u_sumsq == 0.0) return 1.0f;
  double r = ::sqrt(p_sumsq) / ::sqrt(u_sumsq);
  if (r < static_cast<double>(k.min_coeff)) r = k.min_coeff;
  if (r > static_cast<double>(k.max_coeff)) r = k.max_coeff;
  return static_cast<float>(r);
}

/// LAMB phase 2 for one element: p -= scaled_step * u, with scaled_step = step_size * trust ratio.
ZEROTK_HD_TEMPLATE
template <class F>
ZEROTK_HD ZEROTK_FORCEINLINE void lamb_apply(F& p, const F& u, float scaled_step) {
  p = fma(F(-scaled_step), u, p);
}

}  // namespace zerotk::kernels
