// The GPU block quantization (compress/cuda/quantize.cuh) agrees with the host drivers
// (compress/quantize.hpp): records byte for byte, dequantized values bit for bit, for qwZ's and qgZ's
// formats and the asymmetric scheme, fp32 / bf16 / fp16 inputs, short last groups and NaN.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "zerotk/compress/cuda/quantize.cuh"
#include "zerotk/compress/quantize.hpp"
#include "zerotk/compress/quantized_collectives.hpp"
#include "zerotk/core/cuda.hpp"
#include "device_copies.cuh"

using namespace zerotk;
namespace zc = zerotk::compress;

namespace {

using zt_cuda_test::same_bytes;
using zt_cuda_test::to_device;
using zt_cuda_test::to_host;

template <class T>
void gpu_equals_host(std::size_t n, const zc::quant::Format& f) {
  std::mt19937 rng(static_cast<std::uint32_t>(n));
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::vector<T> x(n);
  for (auto& v : x) v = from_float<T>(d(rng));
  if (n > 10) x[7] = from_float<T>(NAN);
  std::vector<std::uint8_t> host(f.record_bytes(n));
  zc::quant::quantize(x.data(), n, f, host.data());
  std::vector<T> host_out(n);
  zc::quant::dequantize(host.data(), n, f, host_out.data());
  std::vector<float> host_acc(n, 0.5f);
  zc::quant::dequantize_add(host.data(), n, f, host_acc.data());

  T* dx = to_device(x);
  std::uint8_t* drec = nullptr;
  ZEROTK_CUDA_CHECK(cudaMalloc(&drec, host.size()));
  ZEROTK_CUDA_CHECK(cudaMemset(drec, 0xab, host.size()));  // the kernel must write every byte
  zc::cuda::quantize(dx, n, f, drec);
  T* dout = to_device(std::vector<T>(n));
  zc::cuda::dequantize(drec, n, f, dout);
  float* dacc = to_device(std::vector<float>(n, 0.5f));
  zc::cuda::dequantize_add(drec, n, f, dacc);
  ZEROTK_CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(same_bytes(to_host(drec, host.size()), host));
  CHECK(same_bytes(to_host(dout, n), host_out));
  CHECK(same_bytes(to_host(dacc, n), host_acc));
  ZEROTK_CUDA_CHECK(cudaFree(dx));
  ZEROTK_CUDA_CHECK(cudaFree(drec));
  ZEROTK_CUDA_CHECK(cudaFree(dout));
  ZEROTK_CUDA_CHECK(cudaFree(dacc));
}

}  // namespace

TEST_CASE("cuda quantize: records and values match the host bit for bit") {
  REQUIRE_MESSAGE(zerotk::cuda::device_usable(), "this test binary needs a usable CUDA device");
  for (std::size_t n : {std::size_t{1}, std::size_t{513}, std::size_t{4096}, (std::size_t{1} << 20) + 13}) {
    CAPTURE(n);
    gpu_equals_host<float>(n, zc::kWeightFormat);
    gpu_equals_host<bfloat16>(n, zc::kWeightFormat);
    gpu_equals_host<half>(n, zc::kGradientFormat);
    gpu_equals_host<float>(n, zc::kGradientFormat);
    gpu_equals_host<float>(n, zc::quant::Format{8, zc::quant::Scheme::asymmetric, 1000});
    gpu_equals_host<bfloat16>(n, zc::quant::Format{4, zc::quant::Scheme::asymmetric, 64});
  }
}
