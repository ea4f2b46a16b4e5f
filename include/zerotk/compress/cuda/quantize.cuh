#pragma once
/// \file zerotk/compress/cuda/quantize.cuh
/// Block quantization on the GPU (nvcc only): qwZ's int8 and qgZ's int4 records from the same
/// ZEROTK_HD rules as the host drivers (compress/quantize.hpp), so a record made here equals the
/// host's byte for byte and a dequantized value bit for bit (tests/cuda/test_quantize.cu). One
/// thread block per group: its threads find the group's absmax (or min and max: exact in any
/// order), one stores the params, then each writes its codes (int4: one byte, two elements, per
/// thread). Pointers are device pointers; every launcher takes a stream and returns without
/// waiting. Compiled here; the engine's quantized exchanges run on host memory for now.
///
///   compress::cuda::quantize(x, n, compress::kWeightFormat, record, stream);   // f.record_bytes(n) bytes
///   compress::cuda::dequantize(record, n, compress::kWeightFormat, out, stream);

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "zerotk/compress/quantize.hpp"
#include "zerotk/core/cuda.hpp"
#include "zerotk/kernels/cuda/cast.cuh"

namespace zerotk::compress::cuda {

namespace kernel {

inline constexpr int kQuantThreads = 256;

/// Block g: the params and codes of group g of x[0, n).
template <class T>
__global__ void quantize_groups(const T* __restrict__ x, std::size_t n, quant::Format f, std::uint8_t* __restrict__ record) {
  __shared__ float lo_s[kQuantThreads], hi_s[kQuantThreads];
  __shared__ quant::GroupParams params;
  const std::size_t g = blockIdx.x, at = g * f.group, len = n - at < f.group ? n - at : f.group;
  // (blockDim.x must be kQuantThreads, a power of two: the reduction halves it)
  const bool sym = f.scheme == quant::Scheme::symmetric;
  float lo = quant::kFloatMax, hi = sym ? 0.0f : -quant::kFloatMax;  // as quant::params_of: NaN ignored
  for (std::size_t i = threadIdx.x; i < len; i += blockDim.x) {
    const float v = quant::load(x[at + i]);
    const float a = sym ? (v < 0 ? -v : v) : v;
    lo = a < lo ? a : lo;
    hi = a > hi ? a : hi;
  }
  lo_s[threadIdx.x] = lo;
  hi_s[threadIdx.x] = hi;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) {
      lo_s[threadIdx.x] = lo_s[threadIdx.x + s] < lo_s[threadIdx.x] ? lo_s[threadIdx.x + s] : lo_s[threadIdx.x];
      hi_s[threadIdx.x] = hi_s[threadIdx.x + s] > hi_s[threadIdx.x] ? hi_s[threadIdx.x + s] : hi_s[threadIdx.x];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    params = f.scheme == quant::Scheme::symmetric ? quant::symmetric_params(hi_s[0], f.bits)
                                                  : quant::asymmetric_params(lo_s[0], hi_s[0], f.bits);
    quant::store_params(record, n, f, g, params);
  }
  __syncthreads();
  const quant::GroupParams p = params;
  if (f.bits == 8) {
    for (std::size_t i = threadIdx.x; i < len; i += blockDim.x) {
      record[at + i] = static_cast<std::uint8_t>(static_cast<std::int8_t>(quant::quantize_value(quant::load(x[at + i]), p, 8)));
    }
  } else {
    for (std::size_t j = threadIdx.x; 2 * j < len; j += blockDim.x) {  // a byte per thread: elements 2j, 2j + 1
      const int q0 = quant::quantize_value(quant::load(x[at + 2 * j]), p, 4);
      const int q1 = 2 * j + 1 < len ? quant::quantize_value(quant::load(x[at + 2 * j + 1]), p, 4) : 0;
      record[(at + 2 * j) / 2] = quant::pack4(q0, q1);
    }
  }
  // The codes' padding to 4 bytes is zero, as the host writes it.
  if (g == 0) {
    const std::size_t raw = f.bits == 8 ? n : (n + 1) / 2;
    for (std::size_t b = raw + threadIdx.x; b < f.code_bytes(n); b += blockDim.x) record[b] = 0;
  }
}

template <class T>
__global__ void dequantize(const std::uint8_t* __restrict__ record, std::size_t n, quant::Format f, T* __restrict__ out) {
  const std::size_t stride = static_cast<std::size_t>(blockDim.x) * gridDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const quant::GroupParams p = quant::load_params(record, n, f, i / f.group);
    out[i] = from_float<T>(quant::dequantize_value(quant::code_at(record, i, f.bits), p));
  }
}

__global__ void dequantize_add(const std::uint8_t* __restrict__ record, std::size_t n, quant::Format f,
                               float* __restrict__ acc) {
  const std::size_t stride = static_cast<std::size_t>(blockDim.x) * gridDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const quant::GroupParams p = quant::load_params(record, n, f, i / f.group);
    acc[i] += quant::dequantize_value(quant::code_at(record, i, f.bits), p);
  }
}

}  // namespace kernel

/// x[0, n) -> its record (f.record_bytes(n) bytes), as quant::quantize on the host.
template <class T>
void quantize(const T* x, std::size_t n, const quant::Format& f, std::uint8_t* record, cudaStream_t stream = nullptr) {
  f.check("zerotk::compress::cuda::quantize");
  if (n == 0) return;
  kernel::quantize_groups<T><<<static_cast<unsigned>(f.groups(n)), kernel::kQuantThreads, 0, stream>>>(x, n, f, record);
  ZEROTK_CUDA_CHECK_LAUNCH();
}

/// out[0, n) = the record's values, as quant::dequantize.
template <class T>
void dequantize(const std::uint8_t* record, std::size_t n, const quant::Format& f, T* out, cudaStream_t stream = nullptr) {
  f.check("zerotk::compress::cuda::dequantize");
  if (n == 0) return;
  kernel::dequantize<T><<<kernels::cuda::detail::elementwise_blocks(n), 256, 0, stream>>>(record, n, f, out);
  ZEROTK_CUDA_CHECK_LAUNCH();
}

/// acc[0, n) += the record's values (fp32), as quant::dequantize_add.
inline void dequantize_add(const std::uint8_t* record, std::size_t n, const quant::Format& f, float* acc,
                           cudaStream_t stream = nullptr) {
  f.check("zerotk::compress::cuda::dequantize_add");
  if (n == 0) return;
  kernel::dequantize_add<<<kernels::cuda::detail::elementwise_blocks(n), 256, 0, stream>>>(record, n, f, acc);
  ZEROTK_CUDA_CHECK_LAUNCH();
}

}  // namespace zerotk::compress::cuda
