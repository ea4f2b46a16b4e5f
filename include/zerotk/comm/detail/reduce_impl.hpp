#pragma once
// zerotk/comm/detail/reduce_impl.hpp (internal)
// The host reduction loops behind reduce.hpp's type-erased entry points, and those entry points:
// included by reduce.hpp in header-only mode, compiled once in zerotk::runtime with
// ZEROTK_COMPILED_RUNTIME=1 (zerotk/core/runtime.hpp). The templates here are instantiated for the
// whole dtype x reduce-op matrix by reduce_rows(DType, ReduceOp, ...) alone.

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "zerotk/comm/detail/reduce.hpp"
#include "zerotk/comm/detail/stream_store.hpp"

namespace zerotk::comm::detail {

// result[0..V) = elements i .. i+V-1 of the reduction of `in`, in rank order (the order and
// arithmetic of reduce_rows).
template <class T, ReduceOp Op, std::size_t V>
ZEROTK_FORCEINLINE void reduce_group(const std::byte* const* in, std::size_t nin, std::size_t i, int divisor,
                                     T* result) noexcept {
  using A = typename Arith<T>::acc;
  A acc[V];
  const T* x0 = reinterpret_cast<const T*>(in[0]) + i;
  for (std::size_t j = 0; j < V; ++j) acc[j] = Arith<T>::load(x0[j]);
  for (std::size_t r = 1; r < nin; ++r) {
    const T* x = reinterpret_cast<const T*>(in[r]) + i;
    for (std::size_t j = 0; j < V; ++j) acc[j] = combine<Op>(acc[j], Arith<T>::load(x[j]));
  }
  if constexpr (Op == ReduceOp::avg) {
    for (std::size_t j = 0; j < V; ++j) acc[j] = divide(acc[j], divisor);
  }
  for (std::size_t j = 0; j < V; ++j) result[j] = Arith<T>::store(acc[j]);
}

// reduce_rows with streaming stores when every output has the same offset from a 16-byte boundary
// (in particular when there is one output): each 16-byte group of results is computed in registers
// and streamed to every output, one pass over the inputs. A tile of results in L1 and a copy from it
// cost about a third of the bandwidth (measured: 0.65 of memcpy against 1.0 for this loop, fp32 sum
// of 2 x 128 MiB per thread on 2 threads). Returns false, doing nothing, when the offsets differ.
template <class T, ReduceOp Op>
bool reduce_rows_streaming(const std::byte* const* in, std::size_t nin, std::byte* const* out, std::size_t nout,
                           std::size_t offset, std::size_t n, int divisor) noexcept {
  constexpr std::size_t V = kStreamBytes / sizeof(T);
  const std::uintptr_t misalign = reinterpret_cast<std::uintptr_t>(out[0] + offset * sizeof(T)) % kStreamBytes;
  if (misalign % sizeof(T) != 0) return false;
  for (std::size_t k = 1; k < nout; ++k) {
    if (reinterpret_cast<std::uintptr_t>(out[k] + offset * sizeof(T)) % kStreamBytes != misalign) return false;
  }
  const std::size_t head = std::min(n, (kStreamBytes - misalign) % kStreamBytes / sizeof(T));
  const std::size_t body_end = offset + head + (n - head) / V * V;
  const auto store_plain = [&](std::size_t i) {
    T result;
    reduce_group<T, Op, 1>(in, nin, i, divisor, &result);
    for (std::size_t k = 0; k < nout; ++k) reinterpret_cast<T*>(out[k])[i] = result;
  };
  for (std::size_t i = offset; i < offset + head; ++i) store_plain(i);
  if (nout == 1) {
    T result[V];
    for (std::size_t i = offset + head; i < body_end; i += V) {
      reduce_group<T, Op, V>(in, nin, i, divisor, result);
      stream_16(out[0] + i * sizeof(T), result);
    }
  } else {
    // Several outputs (all_reduce): a block of results, then the block to each output in turn.
    // Streaming 16 bytes to each output in turn measured 5x slower: W partly filled lines at once
    // exceed the write-combining buffers.
    constexpr std::size_t kBlock = 1024 / sizeof(T);  // elements; a multiple of V
    T block[kBlock];
    for (std::size_t base = offset + head; base < body_end; base += kBlock) {
      const std::size_t m = std::min(kBlock, body_end - base);
      for (std::size_t j = 0; j < m; j += V) reduce_group<T, Op, V>(in, nin, base + j, divisor, block + j);
      for (std::size_t k = 0; k < nout; ++k) {
        std::byte* y = out[k] + base * sizeof(T);
        for (std::size_t j = 0; j < m; j += V) stream_16(y + j * sizeof(T), block + j);
      }
    }
  }
  for (std::size_t i = body_end; i < offset + n; ++i) store_plain(i);
  return true;
}

// out[k][i] = in[0][i] op in[1][i] op ... op in[nin-1][i] for every k < nout and i in
// [offset, offset + n). Buffers are byte pointers to arrays of T. An output may alias an input
// element for element (in place): each tile is read completely before it is written.
// Stream: outputs are written with streaming stores (stream_store.hpp; the caller fences); the
// values, and so the bits, are the same either way.
template <class T, ReduceOp Op, bool Stream = false>
void reduce_rows(const std::byte* const* in, std::size_t nin, std::byte* const* out, std::size_t nout,
                 std::size_t offset, std::size_t n, int divisor) noexcept {
  if constexpr (Stream) {
    if (reduce_rows_streaming<T, Op>(in, nin, out, nout, offset, n, divisor)) return;
  }
  using A = typename Arith<T>::acc;
  constexpr std::size_t kTile = 1024;  // 4 KiB of fp32 accumulators: stays in L1
  A acc[kTile];
  [[maybe_unused]] T result[Stream ? kTile : 1];
  for (std::size_t base = offset; base < offset + n; base += kTile) {
    const std::size_t m = std::min(kTile, offset + n - base);
    const T* x0 = reinterpret_cast<const T*>(in[0]) + base;
    for (std::size_t j = 0; j < m; ++j) acc[j] = Arith<T>::load(x0[j]);
    for (std::size_t r = 1; r < nin; ++r) {
      const T* x = reinterpret_cast<const T*>(in[r]) + base;
      for (std::size_t j = 0; j < m; ++j) acc[j] = combine<Op>(acc[j], Arith<T>::load(x[j]));
    }
    if constexpr (Op == ReduceOp::avg) {
      for (std::size_t j = 0; j < m; ++j) acc[j] = divide(acc[j], divisor);
    }
    if constexpr (Stream) {
      for (std::size_t j = 0; j < m; ++j) result[j] = Arith<T>::store(acc[j]);
      for (std::size_t k = 0; k < nout; ++k) {
        stream_copy(out[k] + base * sizeof(T), reinterpret_cast<const std::byte*>(result), m * sizeof(T));
      }
    } else {
      for (std::size_t k = 0; k < nout; ++k) {
        T* y = reinterpret_cast<T*>(out[k]) + base;
        for (std::size_t j = 0; j < m; ++j) y[j] = Arith<T>::store(acc[j]);
      }
    }
  }
}

// Type-erased `reduce_rows`: the caller has validated (dtype, op) with `check_reduce`.
ZEROTK_RUNTIME_INLINE void reduce_rows(DType dt, ReduceOp op, const std::byte* const* in, std::size_t nin,
                                       std::byte* const* out, std::size_t nout, std::size_t offset, std::size_t n,
                                       int divisor, bool stream) {
  visit_dtype(dt, [&](auto t) {
    visit_op(op, [&](auto o) {
      if (stream) {
        reduce_rows<decltype(t), decltype(o)::value, true>(in, nin, out, nout, offset, n, divisor);
      } else {
        reduce_rows<decltype(t), decltype(o)::value, false>(in, nin, out, nout, offset, n, divisor);
      }
    });
  });
}

// buf[i] = buf[i] / divisor, computed in the accumulator type and rounded once (avg after a sum).
ZEROTK_RUNTIME_INLINE void divide_in_place(void* buf, std::size_t n, DType dt, int divisor) {
  visit_dtype(dt, [&](auto t) {
    using T = decltype(t);
    T* p = static_cast<T*>(buf);
    for (std::size_t i = 0; i < n; ++i) p[i] = Arith<T>::store(divide(Arith<T>::load(p[i]), divisor));
  });
}

}  // namespace zerotk::comm::detail
