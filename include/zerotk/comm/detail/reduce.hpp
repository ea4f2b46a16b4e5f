#pragma once
// zerotk/comm/detail/reduce.hpp (internal)
// Host element-wise reduction used by the communicators: the threads back end's rank-order
// reduction, the MPI back end's user-defined ops for 16-bit types and its avg post-division.
//
// Arithmetic rules (the same in every back end that computes on the host):
// - fp32, fp16, bf16 accumulate in fp32; 16-bit results are rounded once at the end; fp64 in fp64.
// - int32 and uint8 sums wrap around (two's complement), like MPI_SUM does in practice.
// - max/min of floats propagate NaN: the first NaN in combining order wins.
// - avg = sum / W (integer division truncating toward zero for int32); not defined for uint8.
//
// The loops of the type-erased entry points (reduce_rows, divide_in_place) are in reduce_impl.hpp:
// compiled in every TU by default, once in zerotk::runtime with ZEROTK_COMPILED_RUNTIME=1.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/comm/detail/stream_store.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/core/runtime.hpp"

namespace zerotk::comm::detail {

// Accumulator type, load and store for each element type.
template <class T>
struct Arith;

template <>
struct Arith<float> {
  using acc = float;
  static acc load(float x) noexcept { return x; }
  static float store(acc a) noexcept { return a; }
};
template <>
struct Arith<half> {
  using acc = float;
  static acc load(half x) noexcept { return half_bits_to_float(x.bits); }
  static half store(acc a) noexcept { return half::from_bits(float_to_half_bits(a)); }
};
template <>
struct Arith<bfloat16> {
  using acc = float;
  static acc load(bfloat16 x) noexcept { return bf16_bits_to_float(x.bits); }
  static bfloat16 store(acc a) noexcept { return bfloat16::from_bits(float_to_bf16_bits(a)); }
};
template <>
struct Arith<double> {
  using acc = double;  // fp64 carries exact small reductions (global norms); it accumulates in fp64
  static acc load(double x) noexcept { return x; }
  static double store(acc a) noexcept { return a; }
};
template <>
struct Arith<std::int32_t> {
  using acc = std::int32_t;
  static acc load(std::int32_t x) noexcept { return x; }
  static std::int32_t store(acc a) noexcept { return a; }
};
template <>
struct Arith<std::uint8_t> {
  using acc = std::uint32_t;  // sums wrap modulo 2^32, truncated to modulo 2^8 on store: same as wrapping each step
  static acc load(std::uint8_t x) noexcept { return x; }
  static std::uint8_t store(acc a) noexcept { return static_cast<std::uint8_t>(a); }
};

// `a op b` where `a` comes first in combining order.
template <ReduceOp Op, class A>
ZEROTK_FORCEINLINE A combine(A a, A b) noexcept {
  if constexpr (Op == ReduceOp::sum || Op == ReduceOp::avg) {
    if constexpr (std::is_same_v<A, std::int32_t>) {
      // Wrap instead of signed-overflow UB; the conversion back is modular since C++20.
      return static_cast<std::int32_t>(static_cast<std::uint32_t>(a) + static_cast<std::uint32_t>(b));
    } else {
      return a + b;
    }
  } else if constexpr (Op == ReduceOp::max) {
    if constexpr (std::is_floating_point_v<A>) {
      return a != a ? a : (b != b ? b : (b > a ? b : a));
    } else {
      return b > a ? b : a;
    }
  } else {
    if constexpr (std::is_floating_point_v<A>) {
      return a != a ? a : (b != b ? b : (b < a ? b : a));
    } else {
      return b < a ? b : a;
    }
  }
}

template <class A>
ZEROTK_FORCEINLINE A divide(A a, int divisor) noexcept {
  if constexpr (std::is_floating_point_v<A>) {
    return a / static_cast<A>(divisor);
  } else {
    return static_cast<A>(a / static_cast<A>(divisor));
  }
}

// Calls `f(T{})` with the element type of `dt`.
template <class F>
decltype(auto) visit_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::fp32: return f(float{});
    case DType::fp16: return f(half{});
    case DType::bf16: return f(bfloat16{});
    case DType::int32: return f(std::int32_t{});
    case DType::uint8: return f(std::uint8_t{});
    case DType::fp64: return f(double{});
  }
  throw usage_error("unknown dtype", "zerotk::comm", to_text(static_cast<int>(dt)));
}

// Calls `f(std::integral_constant<ReduceOp, op>{})`.
template <class F>
decltype(auto) visit_op(ReduceOp op, F&& f) {
  switch (op) {
    case ReduceOp::sum: return f(std::integral_constant<ReduceOp, ReduceOp::sum>{});
    case ReduceOp::avg: return f(std::integral_constant<ReduceOp, ReduceOp::avg>{});
    case ReduceOp::max: return f(std::integral_constant<ReduceOp, ReduceOp::max>{});
    case ReduceOp::min: return f(std::integral_constant<ReduceOp, ReduceOp::min>{});
  }
  throw usage_error("unknown reduce op", "zerotk::comm", to_text(static_cast<int>(op)));
}

// out[k][i] = in[0][i] op ... op in[nin-1][i] for every k < nout and i in [offset, offset + n), for
// the element type `dt` (reduce_impl.hpp: the rank-order reduction, optionally with streaming
// stores). The caller has validated (dtype, op) with `check_reduce`.
ZEROTK_RUNTIME_INLINE void reduce_rows(DType dt, ReduceOp op, const std::byte* const* in, std::size_t nin,
                                       std::byte* const* out, std::size_t nout, std::size_t offset, std::size_t n,
                                       int divisor, bool stream = false);

// inout[i] = in[i] op inout[i] (MPI user-op convention: `in` comes first in combining order).
// 16-bit results are rounded after every combine, as MPI's pairwise reduction requires.
template <class T, ReduceOp Op>
void combine_into(const void* in, void* inout, std::size_t n) noexcept {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (std::size_t i = 0; i < n; ++i) b[i] = Arith<T>::store(combine<Op>(Arith<T>::load(a[i]), Arith<T>::load(b[i])));
}

// buf[i] = buf[i] / divisor, computed in the accumulator type and rounded once (avg after a sum).
ZEROTK_RUNTIME_INLINE void divide_in_place(void* buf, std::size_t n, DType dt, int divisor);

}  // namespace zerotk::comm::detail

#if !ZEROTK_COMPILED_RUNTIME
#include "zerotk/comm/detail/reduce_impl.hpp"
#endif
