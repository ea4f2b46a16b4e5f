// The GPU packing of zerotk/compress (compress/cuda/packing.cuh) agrees with the host drivers bit for
// bit: sign and 2-bit packing with error feedback, unpacking, and the 1-bit all-reduce's server sum;
// both sides are grid-stride loops over the same ZEROTK_HD per-element definitions.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "zerotk/compress/cuda/packing.cuh"
#include "zerotk/compress/onebit_allreduce.hpp"
#include "zerotk/compress/sign.hpp"
#include "zerotk/compress/two_bit.hpp"
#include "zerotk/core/cuda.hpp"
#include "device_copies.cuh"

using namespace zerotk;
namespace zc = zerotk::compress;

namespace {

using zt_cuda_test::same_bytes;
using zt_cuda_test::to_device;
using zt_cuda_test::to_host;

}  // namespace

TEST_CASE("cuda compress: packing, feedback, unpacking and the server sum match the host bit for bit") {
  REQUIRE_MESSAGE(zerotk::cuda::device_usable(), "this test binary needs a usable CUDA device");
  for (std::size_t n : {std::size_t{1}, std::size_t{13}, (std::size_t{1} << 20) + 13}) {
    CAPTURE(n);
    std::mt19937_64 rng(n);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> y(n);
    for (auto& v : y) v = d(rng);
    const float scale = zc::sign::scale_of(y.data(), n), step = zc::two_bit::step_of_max(2.5f);
    const float special[] = {0.0f, -0.0f, step, -step, 1.5f * step, -1.5f * step};
    for (std::size_t i = 0; i < n; i += 7) y[i] = special[(i / 7) % 6];

    std::vector<float> host_sign = y, host_two = y;
    std::vector<std::uint8_t> host_bits(zc::sign::packed_bytes(n)), host_codes(zc::two_bit::packed_bytes(n));
    zc::sign::pack_with_feedback(host_sign.data(), n, scale, host_bits.data());
    zc::two_bit::pack_with_feedback(host_two.data(), n, step, host_codes.data());
    std::vector<float> host_out_sign(n), host_out_two(n);
    zc::sign::unpack(host_bits.data(), n, scale, host_out_sign.data());
    zc::two_bit::unpack(host_codes.data(), n, step, host_out_two.data());

    float* dy1 = to_device(y);
    float* dy2 = to_device(y);
    std::uint8_t* dbits = to_device(std::vector<std::uint8_t>(host_bits.size()));
    std::uint8_t* dcodes = to_device(std::vector<std::uint8_t>(host_codes.size()));
    float* dout1 = to_device(std::vector<float>(n));
    float* dout2 = to_device(std::vector<float>(n));
    zc::cuda::sign_pack_with_feedback(dy1, n, scale, dbits);
    zc::cuda::two_bit_pack_with_feedback(dy2, n, step, dcodes);
    zc::cuda::sign_unpack(dbits, n, scale, dout1);
    zc::cuda::two_bit_unpack(dcodes, n, step, dout2);
    ZEROTK_CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(same_bytes(to_host(dbits, host_bits.size()), host_bits));
    CHECK(same_bytes(to_host(dcodes, host_codes.size()), host_codes));
    CHECK(same_bytes(to_host(dy1, n), host_sign));
    CHECK(same_bytes(to_host(dy2, n), host_two));
    CHECK(same_bytes(to_host(dout1, n), host_out_sign));
    CHECK(same_bytes(to_host(dout2, n), host_out_two));
    for (void* p : {static_cast<void*>(dy1), static_cast<void*>(dy2), static_cast<void*>(dbits),
                    static_cast<void*>(dcodes), static_cast<void*>(dout1), static_cast<void*>(dout2)}) {
      cudaFree(p);
    }
  }

  // The server's rank-ordered sum of +-s_k / W plus its error, W = 3, 4,096 elements.
  const int world = 3;
  const std::size_t chunk_bytes = 512;
  std::mt19937_64 rng(7);
  std::vector<std::uint8_t> received(world * chunk_bytes);
  for (auto& b : received) b = static_cast<std::uint8_t>(rng());
  const std::vector<float> terms = {0.3f / 3.0f, 1.7f / 3.0f, 0.01f / 3.0f};
  std::normal_distribution<float> d(0.0f, 0.1f);
  std::vector<float> err(8 * chunk_bytes);
  for (auto& e : err) e = d(rng);
  std::vector<float> host = err;
  for (std::size_t j = 0; j < host.size(); ++j) {
    host[j] = zc::onebit::server_value(received.data(), chunk_bytes, terms.data(), world, j, host[j]);
  }
  std::uint8_t* drecv = to_device(received);
  float* dterms = to_device(terms);
  float* derr = to_device(err);
  zc::cuda::server_sum(drecv, chunk_bytes, dterms, world, derr);
  ZEROTK_CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(same_bytes(to_host(derr, err.size()), host));
  cudaFree(drecv);
  cudaFree(dterms);
  cudaFree(derr);
}
