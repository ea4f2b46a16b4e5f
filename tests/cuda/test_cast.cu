// GPU casts agree bit for bit with the host conversions over all 65,536 16-bit patterns.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "zerotk/kernels/cuda/cast.cuh"

using namespace zerotk;

TEST_CASE("cuda cast: fp16 and bf16 round trips match the host bit for bit") {
  REQUIRE_MESSAGE(zerotk::cuda::device_usable(), "this test binary needs a usable CUDA device");
  constexpr std::size_t n = 65536;
  std::vector<half> h(n);
  for (std::size_t i = 0; i < n; ++i) h[i] = half::from_bits(static_cast<std::uint16_t>(i));
  half* dh = nullptr;
  float* df = nullptr;
  bfloat16* db = nullptr;
  ZEROTK_CUDA_CHECK(cudaMalloc(&dh, n * sizeof(half)));
  ZEROTK_CUDA_CHECK(cudaMalloc(&df, n * sizeof(float)));
  ZEROTK_CUDA_CHECK(cudaMalloc(&db, n * sizeof(bfloat16)));
  ZEROTK_CUDA_CHECK(cudaMemcpy(dh, h.data(), n * sizeof(half), cudaMemcpyHostToDevice));
  kernels::cuda::cast(dh, df, n);
  kernels::cuda::cast(df, db, n);
  std::vector<float> f(n);
  std::vector<bfloat16> b(n);
  ZEROTK_CUDA_CHECK(cudaMemcpy(f.data(), df, n * sizeof(float), cudaMemcpyDeviceToHost));
  ZEROTK_CUDA_CHECK(cudaMemcpy(b.data(), db, n * sizeof(bfloat16), cudaMemcpyDeviceToHost));
  for (std::size_t i = 0; i < n; ++i) {
    const float ref = half_bits_to_float(static_cast<std::uint16_t>(i));
    REQUIRE(std::memcmp(&f[i], &ref, 4) == 0);
    REQUIRE(b[i].bits == float_to_bf16_bits(ref));
  }
  cudaFree(dh);
  cudaFree(df);
  cudaFree(db);
}
