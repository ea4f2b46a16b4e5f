#pragma once
/// \file zerotk/kernels/host/simd.hpp
/// Host SIMD without user compiler flags: runtime ISA dispatch over three builds of each kernel.
///
/// A kernel is a struct with `template <class S, class... Args> static ZEROTK_FORCEINLINE void run(Args...)`
/// written once against an ISA tag `S` (`Scalar`, `Avx2`, `Avx512`). `S::F32` is the vector type
/// (`float` for Scalar), `S::width` its lane count, `S::load(p)` reads `width` elements of
/// float/half/bfloat16 as floats, `S::store(p, x)` writes them back rounding to nearest even (`stream`
/// without polluting the cache). The per-element formulas of kernels/elementwise.hpp accept `S::F32`,
/// so the vector loop and its scalar tail run the same code. `run` is always inlined, also at -O0, so
/// vector values never cross a call between code built for different ISAs (their calling conventions
/// differ).
///
/// `dispatch<Kernel>(isa, args...)` calls `Kernel::run<S>` through a function compiled with the
/// matching `target` attribute and `flatten`, so everything inside is inlined and compiled for that
/// ISA, whatever -march the user's build passes (Release is plain -O3: x86-64 baseline). This is why
/// sqrt vectorizes without -fno-math-errno: the vector types call vsqrtps directly.
///
/// Only Scalar exists off x86-64 (and with compilers lacking the attributes); it is correct
/// everywhere but not vectorized where the math needs sqrt.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/core/macros.hpp"
#include "zerotk/kernels/elementwise.hpp"

// nvcc's device pass (__CUDA_ARCH__) never runs host drivers; hiding the vector types from it keeps the
// __host__ __device__ formulas from being compiled for them.
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDA_ARCH__)
#define ZEROTK_HOST_X86_SIMD 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define ZEROTK_HOST_X86_SIMD 0
#endif

namespace zerotk::kernels::host::simd {

/// Instruction sets the host drivers are built for, in increasing order.
enum class Isa : std::uint8_t {
  scalar,  ///< portable C++; the compiler may vectorize parts of it
  avx2,    ///< x86-64-v3: AVX2 + FMA + F16C, 8 floats per vector
  avx512,  ///< x86-64-v4: AVX-512 F/BW/DQ/VL, 16 floats per vector
};

constexpr std::string_view to_string(Isa isa) noexcept {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
  }
  return "unknown";
}

// ---- Scalar ---------------------------------------------------------------------------------------

/// The portable tag: one float per "vector". Also every vector kernel's tail.
struct Scalar {
  using F32 = float;
  static constexpr std::size_t width = 1;
  static constexpr Isa isa = Isa::scalar;

  template <class T>
  static ZEROTK_FORCEINLINE float load(const T* p) {
    return to_float(*p);
  }
  template <class T>
  static ZEROTK_FORCEINLINE void store(T* p, float x) {
    *p = from_float<T>(x);
  }
  /// Non-temporal store (bypasses the cache; p aligned to width * sizeof(T)); plain store here.
  template <class T>
  static ZEROTK_FORCEINLINE void stream(T* p, float x) {
    *p = from_float<T>(x);
  }
  /// Orders non-temporal stores before later stores (call once after a streaming loop).
  static ZEROTK_FORCEINLINE void fence() {}
  /// Hint: the cache line at p will be read soon (no-op here).
  static ZEROTK_FORCEINLINE void prefetch(const void*) {}
  /// Sums of squares in fp64 in 32 fixed lanes: lane j takes elements j, j + 32, j + 64, ...
  /// Every ISA uses the same lanes and the same final order, so all builds give the same bits.
  struct SumSq {
    double lane[32];
  };
  static ZEROTK_FORCEINLINE SumSq sumsq_zero() { return SumSq{}; }
  /// Adds the squares of vector number h (lanes h*width .. h*width + width - 1) of a 32-element group.
  static ZEROTK_FORCEINLINE void sumsq_add(SumSq& acc, float x, int h) {
    const double d = x;
    acc.lane[h] = d * d + acc.lane[h];  // d*d is exact in fp64: fused or not, the same bits
  }
  static ZEROTK_FORCEINLINE void sumsq_lanes(const SumSq& acc, double* out) {
    for (int j = 0; j < 32; ++j) out[j] = acc.lane[j];
  }
};

#if ZEROTK_HOST_X86_SIMD

#define ZEROTK_TARGET_AVX2 __attribute__((target("avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt")))
#define ZEROTK_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt")))

// ---- AVX2 -----------------------------------------------------------------------------------------

/// 8 floats in a ymm register. Operations are `inline` (not always_inline): they are only ever
/// inlined into AVX2-targeted functions through `flatten`, never called from baseline code.
struct F32x8 {
  __m256 v;
  F32x8() = default;
  ZEROTK_TARGET_AVX2 explicit F32x8(__m256 x) : v(x) {}
  ZEROTK_TARGET_AVX2 explicit F32x8(float x) : v(_mm256_set1_ps(x)) {}
};
ZEROTK_TARGET_AVX2 inline F32x8 operator+(const F32x8& a, const F32x8& b) { return F32x8(_mm256_add_ps(a.v, b.v)); }
ZEROTK_TARGET_AVX2 inline F32x8 operator-(const F32x8& a, const F32x8& b) { return F32x8(_mm256_sub_ps(a.v, b.v)); }
ZEROTK_TARGET_AVX2 inline F32x8 operator*(const F32x8& a, const F32x8& b) { return F32x8(_mm256_mul_ps(a.v, b.v)); }
ZEROTK_TARGET_AVX2 inline F32x8 operator/(const F32x8& a, const F32x8& b) { return F32x8(_mm256_div_ps(a.v, b.v)); }
ZEROTK_TARGET_AVX2 inline F32x8 fma(const F32x8& a, const F32x8& b, const F32x8& c) {
  return F32x8(_mm256_fmadd_ps(a.v, b.v, c.v));
}
ZEROTK_TARGET_AVX2 inline F32x8 sqrt(const F32x8& a) { return F32x8(_mm256_sqrt_ps(a.v)); }
/// Lane-wise c > 0 ? if_positive : otherwise (kernels/elementwise.hpp's scalar form; NaN takes otherwise).
ZEROTK_TARGET_AVX2 inline F32x8 where_positive(const F32x8& c, const F32x8& if_positive, const F32x8& otherwise) {
  return F32x8(_mm256_blendv_ps(otherwise.v, if_positive.v, _mm256_cmp_ps(c.v, _mm256_setzero_ps(), _CMP_GT_OQ)));
}

struct Avx2 {
  using F32 = F32x8;
  static constexpr std::size_t width = 8;
  static constexpr Isa isa = Isa::avx2;

  ZEROTK_TARGET_AVX2 static inline F32x8 load(const float* p) { return F32x8(_mm256_loadu_ps(p)); }
  ZEROTK_TARGET_AVX2 static inline F32x8 load(const half* p) {
    // vcvtph2ps is exact except that it quiets signalling NaNs; half_bits_to_float keeps their
    // payload as is, so clear the quiet bit again where the input was a signalling NaN.
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m256i w = _mm256_cvtepu16_epi32(h);
    const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x7fff)), _mm256_set1_epi32(0x7c00));
    const __m256i quiet = _mm256_cmpeq_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x0200)), _mm256_set1_epi32(0x0200));
    const __m256i fix = _mm256_and_si256(_mm256_andnot_si256(quiet, is_nan), _mm256_set1_epi32(0x00400000));
    return F32x8(_mm256_castsi256_ps(_mm256_andnot_si256(fix, _mm256_castps_si256(_mm256_cvtph_ps(h)))));
  }
  ZEROTK_TARGET_AVX2 static inline F32x8 load(const bfloat16* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return F32x8(_mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
  }
  ZEROTK_TARGET_AVX2 static inline void store(float* p, const F32x8& x) { _mm256_storeu_ps(p, x.v); }
  ZEROTK_TARGET_AVX2 static inline void store(half* p, const F32x8& x) {
    // vcvtps2ph rounds to nearest even and quiets NaN keeping the top payload bits: the same bits as
    // float_to_half_bits (tests compare them over all special classes and a dense sample).
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(x.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  /// float_to_bf16_bits, eight lanes at a time: (x + 0x7fff + lsb) >> 16, NaN -> (x >> 16) | 0x40.
  ZEROTK_TARGET_AVX2 static inline __m128i to_bf16(const F32x8& x) {
    const __m256i bits = _mm256_castps_si256(x.v);
    const __m256i hi = _mm256_srli_epi32(bits, 16);
    const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i nan = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    const __m256i mag = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
    const __m256i is_nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7f800000));
    const __m256i r = _mm256_blendv_epi8(rounded, nan, is_nan);  // lanes hold 0..0xffff
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08));
  }
  ZEROTK_TARGET_AVX2 static inline void store(bfloat16* p, const F32x8& x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), to_bf16(x));
  }
  ZEROTK_TARGET_AVX2 static inline void stream(float* p, const F32x8& x) { _mm256_stream_ps(p, x.v); }
  ZEROTK_TARGET_AVX2 static inline void stream(half* p, const F32x8& x) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(x.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  ZEROTK_TARGET_AVX2 static inline void stream(bfloat16* p, const F32x8& x) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(p), to_bf16(x));
  }
  ZEROTK_TARGET_AVX2 static inline void fence() { _mm_sfence(); }
  // Inline asm, not __builtin_prefetch: gcc's IPA marks a small function wrapping the builtin as
  // const and then deletes the (result-less) calls before inlining reaches them.
  ZEROTK_TARGET_AVX2 static inline void prefetch(const void* p) { __asm__ volatile("prefetcht0 (%0)" : : "r"(p)); }

  struct SumSq {
    __m256d q[8];  // q[k] holds lanes 4k .. 4k+3
  };
  ZEROTK_TARGET_AVX2 static inline SumSq sumsq_zero() {
    SumSq acc;
    for (auto& q : acc.q) q = _mm256_setzero_pd();
    return acc;
  }
  ZEROTK_TARGET_AVX2 static inline void sumsq_add(SumSq& acc, const F32x8& x, int h) {
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x.v));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x.v, 1));
    acc.q[2 * h] = _mm256_fmadd_pd(lo, lo, acc.q[2 * h]);
    acc.q[2 * h + 1] = _mm256_fmadd_pd(hi, hi, acc.q[2 * h + 1]);
  }
  ZEROTK_TARGET_AVX2 static inline void sumsq_lanes(const SumSq& acc, double* out) {
    for (int k = 0; k < 8; ++k) _mm256_storeu_pd(out + 4 * k, acc.q[k]);
  }
};

// ---- AVX-512 --------------------------------------------------------------------------------------

/// 16 floats in a zmm register.
struct F32x16 {
  __m512 v;
  F32x16() = default;
  ZEROTK_TARGET_AVX512 explicit F32x16(__m512 x) : v(x) {}
  ZEROTK_TARGET_AVX512 explicit F32x16(float x) : v(_mm512_set1_ps(x)) {}
};
ZEROTK_TARGET_AVX512 inline F32x16 operator+(const F32x16& a, const F32x16& b) { return F32x16(_mm512_add_ps(a.v, b.v)); }
ZEROTK_TARGET_AVX512 inline F32x16 operator-(const F32x16& a, const F32x16& b) { return F32x16(_mm512_sub_ps(a.v, b.v)); }
ZEROTK_TARGET_AVX512 inline F32x16 operator*(const F32x16& a, const F32x16& b) { return F32x16(_mm512_mul_ps(a.v, b.v)); }
ZEROTK_TARGET_AVX512 inline F32x16 operator/(const F32x16& a, const F32x16& b) { return F32x16(_mm512_div_ps(a.v, b.v)); }
ZEROTK_TARGET_AVX512 inline F32x16 fma(const F32x16& a, const F32x16& b, const F32x16& c) {
  return F32x16(_mm512_fmadd_ps(a.v, b.v, c.v));
}
// Avx512 uses the maskz (all lanes) forms of intrinsics: gcc 12 reports a false -Wmaybe-uninitialized
// inside the plain forms, which are built on _mm512_undefined_*; the compiler drops the full mask.
ZEROTK_TARGET_AVX512 inline F32x16 sqrt(const F32x16& a) { return F32x16(_mm512_maskz_sqrt_ps(0xffff, a.v)); }
/// Lane-wise c > 0 ? if_positive : otherwise (NaN takes otherwise).
ZEROTK_TARGET_AVX512 inline F32x16 where_positive(const F32x16& c, const F32x16& if_positive, const F32x16& otherwise) {
  return F32x16(_mm512_mask_blend_ps(_mm512_cmp_ps_mask(c.v, _mm512_setzero_ps(), _CMP_GT_OQ), otherwise.v, if_positive.v));
}

struct Avx512 {
  using F32 = F32x16;
  static constexpr std::size_t width = 16;
  static constexpr Isa isa = Isa::avx512;

  ZEROTK_TARGET_AVX512 static inline F32x16 load(const float* p) { return F32x16(_mm512_loadu_ps(p)); }
  ZEROTK_TARGET_AVX512 static inline F32x16 load(const half* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m512i w = _mm512_maskz_cvtepu16_epi32(0xffff, h);
    const __mmask16 snan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(w, _mm512_set1_epi32(0x7fff)), _mm512_set1_epi32(0x7c00)) &
                           _mm512_testn_epi32_mask(w, _mm512_set1_epi32(0x0200));  // see Avx2::load(const half*)
    const __m512i f = _mm512_castps_si512(_mm512_maskz_cvtph_ps(0xffff, h));
    return F32x16(_mm512_castsi512_ps(_mm512_mask_and_epi32(f, snan, f, _mm512_set1_epi32(~0x00400000))));
  }
  ZEROTK_TARGET_AVX512 static inline F32x16 load(const bfloat16* p) {
    const __m512i w = _mm512_maskz_cvtepu16_epi32(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return F32x16(_mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, w, 16)));
  }
  ZEROTK_TARGET_AVX512 static inline void store(float* p, const F32x16& x) { _mm512_storeu_ps(p, x.v); }
  ZEROTK_TARGET_AVX512 static inline void store(half* p, const F32x16& x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_maskz_cvtps_ph(0xffff, x.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  /// float_to_bf16_bits, sixteen lanes at a time (see Avx2::to_bf16).
  ZEROTK_TARGET_AVX512 static inline __m256i to_bf16(const F32x16& x) {
    const __m512i bits = _mm512_castps_si512(x.v);
    const __m512i hi = _mm512_maskz_srli_epi32(0xffff, bits, 16);
    const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_maskz_srli_epi32(0xffff, _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __m512i nan = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
    const __m512i mag = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff));
    const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(mag, _mm512_set1_epi32(0x7f800000));
    return _mm512_maskz_cvtepi32_epi16(0xffff, _mm512_mask_blend_epi32(is_nan, rounded, nan));
  }
  ZEROTK_TARGET_AVX512 static inline void store(bfloat16* p, const F32x16& x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_bf16(x));
  }
  ZEROTK_TARGET_AVX512 static inline void stream(float* p, const F32x16& x) { _mm512_stream_ps(p, x.v); }
  ZEROTK_TARGET_AVX512 static inline void stream(half* p, const F32x16& x) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_maskz_cvtps_ph(0xffff, x.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  ZEROTK_TARGET_AVX512 static inline void stream(bfloat16* p, const F32x16& x) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), to_bf16(x));
  }
  ZEROTK_TARGET_AVX512 static inline void fence() { _mm_sfence(); }
  ZEROTK_TARGET_AVX512 static inline void prefetch(const void* p) { __asm__ volatile("prefetcht0 (%0)" : : "r"(p)); }

  struct SumSq {
    __m512d q[4];  // q[k] holds lanes 8k .. 8k+7
  };
  ZEROTK_TARGET_AVX512 static inline SumSq sumsq_zero() {
    SumSq acc;
    for (auto& q : acc.q) q = _mm512_setzero_pd();
    return acc;
  }
  ZEROTK_TARGET_AVX512 static inline void sumsq_add(SumSq& acc, const F32x16& x, int h) {
    const __m512d lo = _mm512_maskz_cvtps_pd(0xff, _mm512_maskz_extractf32x8_ps(0xff, x.v, 0));
    const __m512d hi = _mm512_maskz_cvtps_pd(0xff, _mm512_maskz_extractf32x8_ps(0xff, x.v, 1));
    acc.q[2 * h] = _mm512_fmadd_pd(lo, lo, acc.q[2 * h]);
    acc.q[2 * h + 1] = _mm512_fmadd_pd(hi, hi, acc.q[2 * h + 1]);
  }
  ZEROTK_TARGET_AVX512 static inline void sumsq_lanes(const SumSq& acc, double* out) {
    for (int k = 0; k < 4; ++k) _mm512_storeu_pd(out + 8 * k, acc.q[k]);
  }
};

namespace detail {

inline Isa detect_isa_uncached() noexcept {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return Isa::scalar;
  const bool fma = c & (1u << 12), osxsave = c & (1u << 27), avx = c & (1u << 28), f16c = c & (1u << 29);
  if (!(osxsave && avx && fma && f16c)) return Isa::scalar;
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  (void)xcr0_hi;
  if ((xcr0_lo & 0x6u) != 0x6u) return Isa::scalar;  // the OS saves xmm and ymm state
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return Isa::scalar;
  const bool avx2 = b & (1u << 5), bmi1 = b & (1u << 3), bmi2 = b & (1u << 8);
  if (!(avx2 && bmi1 && bmi2)) return Isa::scalar;
  const bool avx512 = (b & (1u << 16)) && (b & (1u << 17)) && (b & (1u << 30)) && (b & (1u << 31));  // F DQ BW VL
  if (avx512 && (xcr0_lo & 0xe0u) == 0xe0u) return Isa::avx512;  // opmask and zmm state saved
  return Isa::avx2;
}

}  // namespace detail

#endif  // ZEROTK_HOST_X86_SIMD

/// The best ISA this CPU and OS support (cached).
inline Isa detect_isa() noexcept {
#if ZEROTK_HOST_X86_SIMD
  static const Isa isa = detail::detect_isa_uncached();
  return isa;
#else
  return Isa::scalar;
#endif
}

namespace detail {
inline Isa& isa_override() noexcept {
  thread_local Isa value = Isa::avx512;  // no override: min(detect, this)
  return value;
}
// The environment variable ZEROTK_HOST_ISA=scalar|avx2|avx512 caps the ISA for the whole process.
inline Isa env_isa_cap() {
  static const Isa cap = [] {
    const char* s = std::getenv("ZEROTK_HOST_ISA");
    if (s == nullptr || *s == '\0') return Isa::avx512;
    const std::string_view v(s);
    if (v == "scalar") return Isa::scalar;
    if (v == "avx2") return Isa::avx2;
    if (v == "avx512") return Isa::avx512;
    throw usage_error("unknown host ISA (use scalar, avx2 or avx512)", "ZEROTK_HOST_ISA", std::string(v));
  }();
  return cap;
}
}  // namespace detail

/// The ISA host drivers use on this thread: the best supported one, capped by ZEROTK_HOST_ISA and by
/// an active IsaCap on this thread.
inline Isa active_isa() {
  Isa isa = detect_isa();
  if (detail::env_isa_cap() < isa) isa = detail::env_isa_cap();
  if (detail::isa_override() < isa) isa = detail::isa_override();
  return isa;
}

/// Caps the ISA of host drivers called from this thread while alive (tests compare the builds).
class IsaCap {
 public:
  explicit IsaCap(Isa cap) noexcept : saved_(detail::isa_override()) { detail::isa_override() = cap; }
  IsaCap(const IsaCap&) = delete;
  IsaCap& operator=(const IsaCap&) = delete;
  ~IsaCap() { detail::isa_override() = saved_; }

 private:
  Isa saved_;
};

// ---- dispatch -------------------------------------------------------------------------------------

namespace detail {
template <class Kernel, class... Args>
void run_scalar(Args... args) {
  Kernel::template run<Scalar>(args...);
}
#if ZEROTK_HOST_X86_SIMD
template <class Kernel, class... Args>
ZEROTK_TARGET_AVX2 __attribute__((flatten)) void run_avx2(Args... args) {
  Kernel::template run<Avx2>(args...);
}
template <class Kernel, class... Args>
ZEROTK_TARGET_AVX512 __attribute__((flatten)) void run_avx512(Args... args) {
  Kernel::template run<Avx512>(args...);
}
#endif
}  // namespace detail

/// Runs `Kernel::run<S>(args...)` built for `isa`. Arguments are passed by value (pointers, sizes
/// and small constant structs).
template <class Kernel, class... Args>
void dispatch(Isa isa, Args... args) {
#if ZEROTK_HOST_X86_SIMD
  if (isa == Isa::avx512) return detail::run_avx512<Kernel>(args...);
  if (isa == Isa::avx2) return detail::run_avx2<Kernel>(args...);
#endif
  (void)isa;
  detail::run_scalar<Kernel>(args...);
}

}  // namespace zerotk::kernels::host::simd
