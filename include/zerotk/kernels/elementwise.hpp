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
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>

#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"
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

/// `if_positive` where c > 0, else `otherwise` (c = +-0 and NaN take `otherwise`): a sign-dependent
/// choice that the SIMD types make with one compare and blend (kernels/host/simd.hpp).
ZEROTK_HD ZEROTK_FORCEINLINE float where_positive(float c, float if_positive, float otherwise) {
  return c > 0.0f ? if_positive : otherwise;
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

/// Adam's first moment: m = beta1 m + (1 - beta1) g. (1-bit Adam's compressed phase runs it alone,
/// before the momentum is exchanged.)
ZEROTK_HD_TEMPLATE
template <class F>
ZEROTK_HD ZEROTK_FORCEINLINE void adam_momentum(F& m, const F& g, const AdamStepConsts& k) {
  m = fma(F(k.beta1), m, F(k.one_minus_beta1) * g);
}

/// Adam's denominator sqrt(v / bc2) + eps (0/1 Adam's sync weights its accumulator by it).
ZEROTK_HD_TEMPLATE
template <class F>
ZEROTK_HD ZEROTK_FORCEINLINE F adam_denom(const F& v, const AdamStepConsts& k) {
  return sqrt(v * F(k.inv_bc2)) + F(k.eps);
}
/// The step direction before the learning rate: (m / bc1) / (sqrt(v / bc2) + eps) [+ AdamW wd * p].
ZEROTK_HD_TEMPLATE
template <class F>
ZEROTK_HD ZEROTK_FORCEINLINE F adam_direction(const F& p, const F& m, const F& v, const AdamStepConsts& k) {
  F update = (m * F(k.inv_bc1)) / adam_denom(v, k);
  if (k.adamw_mode) update = fma(F(k.weight_decay), p, update);
  return update;
}
/// Adam's parameter step from the moments: p -= lr * ((m / bc1) / (sqrt(v / bc2) + eps) + [AdamW] wd * p).
/// (1-bit Adam's compressed phase runs it alone, with the second moment frozen.)
ZEROTK_HD_TEMPLATE
template <class F>
ZEROTK_HD ZEROTK_FORCEINLINE void adam_apply(F& p, const F& m, const F& v, const AdamStepConsts& k) {
  p = fma(F(-k.lr), adam_direction(p, m, v, k), p);
}

/// One Adam/AdamW update of one element (or one SIMD vector of elements). `g` is already unscaled.
/// p: fp32 master value, m/v: first and second moments.
ZEROTK_HD_TEMPLATE
template <class F>
ZEROTK_HD ZEROTK_FORCEINLINE void adam_update(F& p, F& m, F& v, const F& g, const AdamStepConsts& k) {
  F grad = g;
  if (!k.adamw_mode) grad = fma(F(k.weight_decay), p, grad);
  adam_momentum(m, grad, k);
  v = fma(F(k.beta2), v, (F(k.one_minus_beta2) * grad) * grad);
  adam_apply(p, m, v, k);
}

/// Adam/AdamW as an elementwise rule (kernels/host/elementwise_step.hpp says what a rule is): the GPU
/// runs Adam through the same multi-tensor driver as every other rule (kernels/cuda/adam.cuh).
struct AdamRule {
  using Consts = AdamStepConsts;
  static constexpr int kMoments = 2;

  ZEROTK_HD_TEMPLATE
  template <class F>
  ZEROTK_HD ZEROTK_FORCEINLINE static void update(F& p, F& m, F& v, const F& g, const Consts& k) {
    adam_update(p, m, v, g, k);
  }
};

// ---- 0/1 Adam's frozen phase (optim/zero_one_adam.hpp) -------------------------------------------

/// A local step of 0/1 Adam's frozen phase: m = b1 m + (1 - b1) g; d = (-lr) (m / (sqrt(v) + eps)
/// [+ wd p]), rounded once; p += d and the accumulator u += d (the same d in both, as DeepSpeed).
/// Bias correction and adamw_mode as in adam_apply (the constants carry none and true).
ZEROTK_HD_TEMPLATE
template <class F>
ZEROTK_HD ZEROTK_FORCEINLINE void zero_one_local(F& p, F& m, F& u, const F& v, const F& g, const AdamStepConsts& k) {
  adam_momentum(m, g, k);
  const F d = F(-k.lr) * adam_direction(p, m, v, k);
  p = p + d;
  u = u + d;
}

/// The first half of a sync, before u is all-reduced: the local steps since the last sync are taken
/// back (p -= u, exact only up to rounding, as DeepSpeed) and u is weighted by sqrt(v) + eps.
ZEROTK_HD_TEMPLATE
template <class F>
ZEROTK_HD ZEROTK_FORCEINLINE void zero_one_sync_out(F& p, F& u, const F& v, const AdamStepConsts& k) {
  p = p - u;
  u = u * adam_denom(v, k);
}

/// The second half, after the all-reduce: m = -(u / L) (L: the sum of lr over the interval, rounded
/// to float), p += u / (sqrt(v) + eps), u = 0. With `lr_sum_zero` (L == 0: every lr of the interval
/// was 0, so no rank moved and u holds only the compression's residual) m keeps its value, where
/// DeepSpeed divides by zero and m, then p, become NaN.
ZEROTK_HD_TEMPLATE
template <class F>
ZEROTK_HD ZEROTK_FORCEINLINE void zero_one_sync_in(F& p, F& m, F& u, const F& v, const F& lr_sum,
                                                   const AdamStepConsts& k, bool lr_sum_zero) {
  if (!lr_sum_zero) m = -(u / lr_sum);
  p = p + u / adam_denom(v, k);
  u = F(0.0f);
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

// ---- 1-bit LAMB's compression phase (optim/onebit_lamb.hpp) ---------------------------------------

/// Before the exchange: m = b1 m + (1 - b1) g from the local gradient, then m *= the tensor's scaling
/// coefficient (rounded to float once per tensor), so every tensor enters the 1-bit all-reduce at
/// about the same magnitude.
ZEROTK_HD_TEMPLATE
template <class F>
ZEROTK_HD ZEROTK_FORCEINLINE void onebit_lamb_momentum(F& m, const F& g, const F& scaling, const LambStepConsts& k) {
  m = fma(F(k.beta1), m, F(k.one_minus_beta1) * g);
  m = m * scaling;
}

/// After the exchange: m /= the scaling coefficient; the gradient the averaged momentum implies,
/// gh = (m - b1 m_prev) / (1 - b1), feeds the fresh second moment v_f = b2 v_f + (1 - b2) gh^2
/// (v stays frozen). Sets u0 = m / (sqrt(v) + eps) and upd = u0 [+ wd p] (= lamb_direction's bits)
/// and returns (sqrt(v) + eps) / (sqrt(v_f) + eps), whose maximum over the tensor is its factor.
ZEROTK_HD_TEMPLATE
template <class F>
ZEROTK_HD ZEROTK_FORCEINLINE F onebit_lamb_fresh(const F& p, F& m, F& vf, const F& m_prev, const F& v, const F& scaling,
                                                 const LambStepConsts& k, F& u0, F& upd) {
  m = m / scaling;
  const F gh = (m - m_prev * F(k.beta1)) / F(k.one_minus_beta1);
  vf = fma(F(k.beta2), vf, (F(k.one_minus_beta2) * gh) * gh);
  const F den = sqrt(v) + F(k.eps);
  u0 = m / den;
  upd = fma(F(k.weight_decay), p, u0);
  return den / (sqrt(vf) + F(k.eps));
}

// ---- reproducible sum of squares (the global gradient norm) --------------------------------------
//
// One fp64 sum of squares whose bits depend only on the multiset of values: not on their order, on how
// they are split into blocks, buckets, shards or ranks, on the thread count, the ISA, or host vs CUDA.
// It is a binned sum in the spirit of Demmel and Nguyen's pre-rounding (ReproBLAS), specialised to
// squares of float, half and bfloat16 values:
//
//   square    s = double(x)^2            exact: a 24-bit significand squares into 48 bits; the smallest
//                                        float subnormal squared (2^-298) and the largest float squared
//                                        (~2^256) are normal fp64 numbers
//   phase 1   M = max s, and whether any element is inf/NaN   (local; the caller all-reduces with max)
//   grid      from the GLOBAL M and a global element count bound N (equal on every rank): fold k has a
//             power-of-two unit u_k and the extractor C_k = 1.5 * 2^52 * u_k (so ulp(C_k) = u_k)
//   phase 2   per element, for k = 0, 1, 2:  h_k = (r + C_k) - C_k  (r = s at k = 0: r rounded to a
//             multiple of u_k, ties to even; exact),  r = r - h_k  (exact),  fold_k += h_k
//             (local; the caller all-reduces the three fold sums with a plain fp64 sum)
//   finish    fold_0 + (fold_1 + fold_2): the small folds first, then one last rounding
//
// The grid. n = ceil(log2(max(N, 2))), m = the smallest integer with M <= 2^m (clamped to >= -300),
// W = 53 - n bits per fold, u_k = 2^(m + n - 52 - k W). Every h_0 lies in [0, 2^m] and every |h_k|,
// k > 0, in [0, u_(k-1) / 2], so a sum of at most N parts of fold k is a multiple of u_k of magnitude
// <= 2^52 u_k: representable. Every addition of fold parts is therefore exact (phase 2's lanes,
// threads, CUDA blocks and atomics, and the caller's all-reduce alike) and the order cannot matter.
// Each extraction input stays within its extractor's binade (|r| <= 2^51 u_k), so it is exact too.
//
// Error bound (tests/zero/test_norms.cpp checks it against an exact big-integer sum). With S the
// exact sum of squares of the (at most N) elements:
//   |finish - S| <= 2^-53 S + N (u_2 / 2 + 2^-54 (u_0 + u_1))         (NormGrid::error_bound)
//                <= 2^-53 S + N M (N 2^-103 + N^3 2^-155)
// e.g. N <= 2^30: one rounding of S plus at most 2^-64 N M; N <= 2^40: plus 2^-34 N M. N <= 2^44.
//
// Compilers. (s + C) - C must not be simplified to s. No compiler does that without -ffast-math (or
// -fassociative-math); so that a user's -ffast-math build stays correct too, the host code passes both
// intermediate results through fp_opaque (an empty asm statement: no instruction, but the optimizer no
// longer knows the value), and the device code uses __dadd_rn / __dsub_rn, which nvcc never
// reassociates or contracts. Contraction into an fma is harmless anyway (s = d * d is exact, so
// fma(d, d, C) rounds the same value as s + C), and so is reordering the accumulation (exact sums).
// What -ffast-math still changes: an x86 executable linked with it runs with denormals-are-zero, so
// subnormal float and bfloat16 inputs read as 0 on the host; results then agree among such builds,
// not with the GPU's.

/// A double the optimizer must treat as unknown: an empty asm statement, no instruction. Keeps
/// `(s + C) - C` intact even under -ffast-math. The device code does not need it (see above).
ZEROTK_HD ZEROTK_FORCEINLINE double fp_opaque(double v) {
#if defined(__CUDA_ARCH__)
  return v;
#elif (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
  __asm__("" : "+x"(v));
  return v;
#elif (defined(__GNUC__) || defined(__clang__)) && defined(__aarch64__)
  __asm__("" : "+w"(v));
  return v;
#else
  volatile double t = v;
  return t;
#endif
}

}  // namespace zerotk::kernels

// fp64 siblings of core/dtype.hpp's float_bits / bits_float.
namespace zerotk::detail {

ZEROTK_HD ZEROTK_FORCEINLINE std::uint64_t double_bits(double x) {
#if defined(__CUDA_ARCH__)
  return static_cast<std::uint64_t>(__double_as_longlong(x));
#else
  std::uint64_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

ZEROTK_HD ZEROTK_FORCEINLINE double bits_double(std::uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(u));
#else
  double x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

/// 2^e for -1022 <= e <= 1023 (exact, no libm).
ZEROTK_HD ZEROTK_FORCEINLINE double pow2(int e) {
  return bits_double(static_cast<std::uint64_t>(e + 1023) << 52);
}

}  // namespace zerotk::detail

namespace zerotk::kernels {

/// x^2 in fp64; exact for every float, half and bfloat16 value.
ZEROTK_HD ZEROTK_FORCEINLINE double exact_square(float x) {
  const double d = x;
  return d * d;
}
ZEROTK_HD ZEROTK_FORCEINLINE double exact_square(half x) { return exact_square(to_float(x)); }
ZEROTK_HD ZEROTK_FORCEINLINE double exact_square(bfloat16 x) { return exact_square(to_float(x)); }

/// |x| as an unsigned integer that orders like |x|, with inf above every finite value and NaN above
/// inf: the max of the keys gives both the largest square and the inf/NaN flag (phase 1), in integer
/// arithmetic (vectorizes everywhere, unaffected by -ffast-math).
ZEROTK_HD ZEROTK_FORCEINLINE std::uint32_t magnitude_key(float x) {
  return zerotk::detail::float_bits(x) & 0x7fffffffu;
}
ZEROTK_HD ZEROTK_FORCEINLINE std::uint16_t magnitude_key(half x) {
  return static_cast<std::uint16_t>(x.bits & 0x7fffu);
}
ZEROTK_HD ZEROTK_FORCEINLINE std::uint16_t magnitude_key(bfloat16 x) {
  return static_cast<std::uint16_t>(x.bits & 0x7fffu);
}

/// Phase 1 of the reproducible sum of squares: the largest square and whether any element is inf or
/// NaN (then max_square is +inf, so an all-reduce with max of max_square alone also carries the flag).
struct SquareBound {
  double max_square = 0.0;
  bool nonfinite = false;
};

/// The bound of the union of two sets of elements.
ZEROTK_HD ZEROTK_FORCEINLINE SquareBound combine(const SquareBound& a, const SquareBound& b) {
  SquareBound r;
  r.max_square = a.max_square > b.max_square ? a.max_square : b.max_square;
  r.nonfinite = a.nonfinite || b.nonfinite;
  return r;
}

/// The SquareBound of elements of type T whose largest magnitude_key is `key`.
template <class T>
ZEROTK_HD ZEROTK_FORCEINLINE SquareBound square_bound_of_key(std::uint32_t key) {
  SquareBound r;
  float v = 0.0f;
  if constexpr (std::is_same_v<T, float>) {
    r.nonfinite = key >= 0x7f800000u;
    v = zerotk::detail::bits_float(key);
  } else if constexpr (std::is_same_v<T, half>) {
    r.nonfinite = key >= 0x7c00u;
    v = half_bits_to_float(static_cast<std::uint16_t>(key));
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    r.nonfinite = key >= 0x7f80u;
    v = bf16_bits_to_float(static_cast<std::uint16_t>(key));
  } else {
    static_assert(dependent_false<T>, "square_bound_of_key: T must be float, zerotk::half or zerotk::bfloat16");
  }
  r.max_square = r.nonfinite ? zerotk::detail::bits_double(0x7ff0000000000000ull) : exact_square(v);
  return r;
}

/// Phase 2 accumulator: one sum per fold. Every value is an exact multiple of its fold's unit, so
/// FoldSums of disjoint sets of elements add exactly, in any order.
struct FoldSums {
  double fold[3] = {0.0, 0.0, 0.0};
};

/// The fold sums of the union of two disjoint sets of elements (exact).
ZEROTK_HD ZEROTK_FORCEINLINE FoldSums combine(const FoldSums& a, const FoldSums& b) {
  FoldSums r;
  for (int k = 0; k < 3; ++k) r.fold[k] = a.fold[k] + b.fold[k];
  return r;
}

/// The grid of the three folds: built from the GLOBAL max square and a global element count bound, so
/// that every rank (and the GPU) rounds every element the same way. See the section comment above.
struct NormGrid {
  static constexpr int kFolds = 3;
  /// m is clamped to at least this: 2^-300 is below the smallest square of any float (2^-298).
  static constexpr int kMinExponent = -300;
  /// The largest supported log2 of the count bound (W = 53 - n >= 9 bits per fold).
  static constexpr int kMaxCountLog2 = 44;
  /// The largest supported m (the extractors stay finite: m + n <= 1000; fp32 squares need m <= 256).
  static constexpr int kMaxExponent = 1000 - kMaxCountLog2;

  double unit[3] = {0, 0, 0};       ///< u_k, powers of two
  double extractor[3] = {0, 0, 0};  ///< C_k = 1.5 * 2^52 * u_k
  std::uint64_t count = 0;          ///< N, the count bound the grid is valid for
  int max_exponent = 0;             ///< m: the global max square is <= 2^m
  int count_log2 = 1;               ///< n = ceil(log2(max(N, 2)))

  /// The grid for a global max square M and count bound N, unchecked (also in device code).
  /// Requires 0 <= M <= 2^kMaxExponent (finite) and N <= 2^kMaxCountLog2; `make` checks both.
  ZEROTK_HD static NormGrid build(double max_square, std::uint64_t count) {
    NormGrid g;
    g.count = count;
    int n = 1;
    while (n < 63 && (std::uint64_t{1} << n) < count) ++n;
    int m = kMinExponent;
    if (max_square > zerotk::detail::pow2(kMinExponent)) {  // normal: read the exponent; M <= 2^m, m minimal
      const std::uint64_t b = zerotk::detail::double_bits(max_square);
      const int e = static_cast<int>((b >> 52) & 0x7ffu) - 1023;
      m = (b & 0x000fffffffffffffull) == 0 ? e : e + 1;
    }
    g.max_exponent = m;
    g.count_log2 = n;
    for (int k = 0; k < kFolds; ++k) {
      const int e = m + n - 52 - k * (53 - n);
      g.unit[k] = zerotk::detail::pow2(e);
      g.extractor[k] = 1.5 * zerotk::detail::pow2(e + 52);
    }
    return g;
  }

  /// The grid for `global_max_square` (the max over every rank's SquareBound) and `global_count`
  /// (a bound on the number of elements summed over all ranks, the same on every rank).
  /// Throws usage_error for a non-finite or negative max square (check SquareBound::nonfinite first:
  /// then the norm is not needed), a max square above 2^956, or a count above 2^44.
  static NormGrid make(double global_max_square, std::uint64_t global_count) {
    // Bit tests, not comparisons: a -ffast-math build may assume that no NaN reaches a comparison.
    if (is_nonfinite(global_max_square) || global_max_square < 0.0 ||
        global_max_square > zerotk::detail::pow2(kMaxExponent)) {
      char text[32];
      std::snprintf(text, sizeof text, "%.17g", global_max_square);
      throw usage_error("the max square must be finite, >= 0 and <= 2^" + std::to_string(kMaxExponent) +
                            " (an inf/NaN element makes the norm unnecessary: check SquareBound::nonfinite)",
                        "kernels::NormGrid::make", text);
    }
    if (global_count > (std::uint64_t{1} << kMaxCountLog2)) {
      throw usage_error("the global element count must be <= 2^" + std::to_string(kMaxCountLog2),
                        "kernels::NormGrid::make", std::to_string(global_count));
    }
    return build(global_max_square, global_count);
  }

  /// A bound on |finish - S| for S, the exact sum of squares of at most `count` elements whose
  /// squares are <= 2^max_exponent (see the section comment; includes the finishing roundings).
  double error_bound(double exact_sum) const {
    const double n = static_cast<double>(count);
    return (0x1p-53 * exact_sum + n * (0.5 * unit[2] + 0x1p-54 * (unit[0] + unit[1]))) * (1.0 + 0x1p-40);
  }
};

/// s rounded to a multiple of the unit of the extractor c (= 1.5 * 2^52 * unit, |s| <= 2^51 unit),
/// ties to even: (s + c) - c, exact, kept intact under -ffast-math.
ZEROTK_HD ZEROTK_FORCEINLINE double round_to_unit(double s, double c) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(__dadd_rn(s, c), c);
#else
  return fp_opaque(fp_opaque(s + c) - c);
#endif
}
/// The same for a host vector of doubles (`fp_opaque` for it is found by argument-dependent lookup).
template <class F>
ZEROTK_FORCEINLINE F round_to_unit(const F& s, const F& c) {
  return fp_opaque(fp_opaque(s + c) - c);
}

/// Phase 2 for one square s (or one vector of squares): adds its parts on the three folds of the grid
/// whose extractors are c0, c1, c2 to a0, a1, a2. Every operation is exact.
ZEROTK_HD_TEMPLATE
template <class F>
ZEROTK_HD ZEROTK_FORCEINLINE void fold_deposit(const F& s, const F& c0, const F& c1, const F& c2, F& a0, F& a1,
                                               F& a2) {
  const F h0 = round_to_unit(s, c0);
  const F r0 = s - h0;
  const F h1 = round_to_unit(r0, c1);
  const F r1 = r0 - h1;
  const F h2 = round_to_unit(r1, c2);
  a0 = a0 + h0;
  a1 = a1 + h1;
  a2 = a2 + h2;
}

/// The sum of squares from the GLOBAL fold sums: fold_0 + (fold_1 + fold_2), in this order everywhere.
/// Non-finite when an element was inf or NaN.
ZEROTK_HD ZEROTK_FORCEINLINE double fold_finish(const FoldSums& f) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(f.fold[0], __dadd_rn(f.fold[1], f.fold[2]));
#else
  return f.fold[0] + fp_opaque(f.fold[1] + f.fold[2]);
#endif
}

}  // namespace zerotk::kernels
