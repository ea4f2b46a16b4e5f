#pragma once
// Host <-> device copies for the CUDA tests that compare GPU kernels with their host drivers
// (test_compress.cu, test_quantize.cu).
#include <cstddef>
#include <cstring>
#include <vector>

#include "zerotk/core/cuda.hpp"

namespace zt_cuda_test {

/// A device copy of `v` (one spare byte, so an empty vector still gets a valid pointer); cudaFree it.
template <class T>
T* to_device(const std::vector<T>& v) {
  T* d = nullptr;
  ZEROTK_CUDA_CHECK(cudaMalloc(&d, v.size() * sizeof(T) + 1));
  if (!v.empty()) ZEROTK_CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}
template <class T>
std::vector<T> to_host(const T* d, std::size_t n) {
  std::vector<T> v(n);
  if (n != 0) ZEROTK_CUDA_CHECK(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}
template <class T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

}  // namespace zt_cuda_test
