#pragma once
/// \file zerotk/compress/cuda/packing.cuh
/// The codecs' packing on the GPU (nvcc only): sign and 2-bit packing with error feedback, their
/// unpacking, and the 1-bit all-reduce's server sum. Each kernel is a grid-stride loop over the
/// ZEROTK_HD per-element definitions the host drivers use (compress/sign.hpp, two_bit.hpp,
/// onebit_allreduce.hpp), so a GPU result equals the host's bit for bit (tests/cuda/test_compress.cu).
/// Pointers are device pointers; every launcher takes a stream and returns without waiting.
///
///   compress::cuda::sign_pack_with_feedback(y, n, scale, bits, stream);  // bits: ceil(n / 8) bytes
///   compress::cuda::sign_unpack(bits, n, scale, out, stream);
///
/// The scales (sign::scale_of's reproducible sum of squares, two_bit::step_of_max) are the caller's:
/// kernels/cuda/reduce.cuh has the same sum of squares on the device.

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "zerotk/compress/onebit_allreduce.hpp"
#include "zerotk/compress/sign.hpp"
#include "zerotk/compress/two_bit.hpp"
#include "zerotk/core/cuda.hpp"
#include "zerotk/kernels/cuda/cast.cuh"

namespace zerotk::compress::cuda {

namespace kernel {

/// Byte b of the packed signs of y[8b, 8b + 8), then y := y - scale sign(y) there.
__global__ void sign_pack_with_feedback(float* __restrict__ y, std::size_t n, float scale, std::uint8_t* __restrict__ bits) {
  const std::size_t bytes = (n + 7) / 8, stride = static_cast<std::size_t>(blockDim.x) * gridDim.x;
  for (std::size_t b = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < bytes; b += stride) {
    const unsigned count = n - 8 * b < 8 ? static_cast<unsigned>(n - 8 * b) : 8u;
    bits[b] = sign::pack_byte(y + 8 * b, count);
    for (unsigned j = 0; j < count; ++j) y[8 * b + j] = sign::residual(y[8 * b + j], scale);
  }
}

/// Byte b of the 2-bit codes of y[4b, 4b + 4), then y := y - level(code) there.
__global__ void two_bit_pack_with_feedback(float* __restrict__ y, std::size_t n, float step,
                                           std::uint8_t* __restrict__ codes) {
  const std::size_t bytes = (n + 3) / 4, stride = static_cast<std::size_t>(blockDim.x) * gridDim.x;
  for (std::size_t b = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < bytes; b += stride) {
    const unsigned count = n - 4 * b < 4 ? static_cast<unsigned>(n - 4 * b) : 4u;
    codes[b] = two_bit::pack_byte(y + 4 * b, count, step);
    for (unsigned j = 0; j < count; ++j) {
      float& v = y[4 * b + j];
      v = v - two_bit::level(two_bit::code_of(v, step), step);
    }
  }
}

__global__ void sign_unpack(const std::uint8_t* __restrict__ bits, std::size_t n, float scale, float* __restrict__ out) {
  const std::size_t stride = static_cast<std::size_t>(blockDim.x) * gridDim.x;
  for (std::size_t j = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += stride) {
    out[j] = sign::value(bits, j, scale);
  }
}

__global__ void two_bit_unpack(const std::uint8_t* __restrict__ codes, std::size_t n, float step, float* __restrict__ out) {
  const std::size_t stride = static_cast<std::size_t>(blockDim.x) * gridDim.x;
  for (std::size_t j = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += stride) {
    out[j] = two_bit::level(two_bit::code_at(codes, j), step);
  }
}

/// server_error[j] := the rank-ordered sum over k of sign_k(j) * terms[k], plus server_error[j].
__global__ void server_sum(const std::uint8_t* __restrict__ received, std::size_t chunk_bytes,
                           const float* __restrict__ terms, int world, float* __restrict__ server_error) {
  const std::size_t n = 8 * chunk_bytes, stride = static_cast<std::size_t>(blockDim.x) * gridDim.x;
  for (std::size_t j = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += stride) {
    server_error[j] = onebit::server_value(received, chunk_bytes, terms, world, j, server_error[j]);
  }
}

}  // namespace kernel

/// y[0, n) -> packed signs `bits` (ceil(n / 8) bytes; the unused bits of the last byte 0) and the
/// worker's error y - scale sign(y) in place (sign::pack_with_feedback on the host).
inline void sign_pack_with_feedback(float* y, std::size_t n, float scale, std::uint8_t* bits,
                                    cudaStream_t stream = nullptr) {
  if (n == 0) return;
  kernel::sign_pack_with_feedback<<<kernels::cuda::detail::elementwise_blocks((n + 7) / 8), 256, 0, stream>>>(
      y, n, scale, bits);
  ZEROTK_CUDA_CHECK_LAUNCH();
}

/// y[0, n) -> 2-bit codes (ceil(n / 4) bytes) and y - level(code) in place (two_bit::pack_with_feedback).
inline void two_bit_pack_with_feedback(float* y, std::size_t n, float step, std::uint8_t* codes,
                                       cudaStream_t stream = nullptr) {
  if (n == 0) return;
  kernel::two_bit_pack_with_feedback<<<kernels::cuda::detail::elementwise_blocks((n + 3) / 4), 256, 0, stream>>>(
      y, n, step, codes);
  ZEROTK_CUDA_CHECK_LAUNCH();
}

/// out[j] = scale sign_j for j < n (sign::unpack).
inline void sign_unpack(const std::uint8_t* bits, std::size_t n, float scale, float* out, cudaStream_t stream = nullptr) {
  if (n == 0) return;
  kernel::sign_unpack<<<kernels::cuda::detail::elementwise_blocks(n), 256, 0, stream>>>(bits, n, scale, out);
  ZEROTK_CUDA_CHECK_LAUNCH();
}

/// out[j] = the 2-bit level of code j for j < n (two_bit::unpack).
inline void two_bit_unpack(const std::uint8_t* codes, std::size_t n, float step, float* out,
                           cudaStream_t stream = nullptr) {
  if (n == 0) return;
  kernel::two_bit_unpack<<<kernels::cuda::detail::elementwise_blocks(n), 256, 0, stream>>>(codes, n, step, out);
  ZEROTK_CUDA_CHECK_LAUNCH();
}

/// The server's sum over its chunk (8 chunk_bytes values): `received` holds every rank's packed signs
/// of this chunk, rank after rank (chunk_bytes each), `terms` the W scales already divided by W; the
/// result is added to server_error in place (onebit::server_value per element, as the host's
/// onebit::server_chunk).
inline void server_sum(const std::uint8_t* received, std::size_t chunk_bytes, const float* terms, int world,
                       float* server_error, cudaStream_t stream = nullptr) {
  if (chunk_bytes == 0) return;
  kernel::server_sum<<<kernels::cuda::detail::elementwise_blocks(8 * chunk_bytes), 256, 0, stream>>>(
      received, chunk_bytes, terms, world, server_error);
  ZEROTK_CUDA_CHECK_LAUNCH();
}

}  // namespace zerotk::compress::cuda
