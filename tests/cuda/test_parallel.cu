// The tensor-parallel kernels (parallel/cuda/kernels.cuh) against the host loops they share their
// per-element definitions with: shards, the all-gather reordering and split dropout bit for bit,
// the cross-entropy gradient to a few float ulps (device expf differs from the host's).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "../parallel/common.hpp"  // the host tests' inputs
#include "zerotk/parallel/cuda/kernels.cuh"

using namespace zerotk;
using namespace zerotk::parallel;

namespace {
template <class T>
T* to_device(const std::vector<T>& h) {
  T* d = nullptr;
  ZEROTK_CUDA_CHECK(cudaMalloc(&d, h.size() * sizeof(T) + 1));
  ZEROTK_CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}
template <class T>
std::vector<T> to_host(const T* d, std::size_t n) {
  std::vector<T> h(n);
  ZEROTK_CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}
using zt_parallel_test::values;
}  // namespace

TEST_CASE("cuda parallel: shards, the last-dim reordering and split dropout equal the host's bit for bit") {
  REQUIRE_MESSAGE(zerotk::cuda::device_usable(), "this test binary needs a usable CUDA device");
  const MatrixShape shape{48, 36};
  const auto full = values(shape.numel(), 1);
  float* dfull = to_device(full);
  for (TensorSplit split : {TensorSplit::rows(3), TensorSplit::cols(), TensorSplit::cols(2)}) {
    for (int r = 0; r < 2; ++r) {
      std::vector<float> host(shard_shape(shape, split, 2).numel());
      take_shard<float>(full, shape, split, r, 2, host);
      float* dshard = nullptr;
      ZEROTK_CUDA_CHECK(cudaMalloc(&dshard, host.size() * sizeof(float)));
      parallel::cuda::take_shard(dfull, shape, split, r, 2, dshard);
      CHECK(to_host(dshard, host.size()) == host);
      cudaFree(dshard);
    }
  }
  // The all-gathered column blocks of 4 ranks back into [rows, cols].
  std::vector<float> gathered;
  for (int r = 0; r < 4; ++r) {
    std::vector<float> part(shard_shape(shape, TensorSplit::cols(), 4).numel());
    take_shard<float>(full, shape, TensorSplit::cols(), r, 4, part);
    gathered.insert(gathered.end(), part.begin(), part.end());
  }
  float* dg = to_device(gathered);
  float* dout = nullptr;
  ZEROTK_CUDA_CHECK(cudaMalloc(&dout, full.size() * sizeof(float)));
  parallel::cuda::ungather_last_dim(dg, dout, shape.rows, shape.cols, 4);
  const auto back = to_host(dout, full.size());
  CHECK(std::memcmp(back.data(), full.data(), full.size() * sizeof(float)) == 0);
  // Split dropout: the host's mask and values.
  const RngStream s = TensorParallelRng(5, 0).shared().at(3);
  std::vector<float> part(shard_shape(shape, TensorSplit::cols(), 4).numel());
  take_shard<float>(full, shape, TensorSplit::cols(), 2, 4, part);
  float* dp = to_device(part);
  parallel::cuda::dropout_split_cols(s, dp, part.size(), 0.3f, shape.cols, 2, 4);
  dropout_split_cols(s, part, 0.3f, shape.cols, 2, 4);
  const auto dropped = to_host(dp, part.size());
  CHECK(std::memcmp(dropped.data(), part.data(), part.size() * sizeof(float)) == 0);
  cudaFree(dfull);
  cudaFree(dg);
  cudaFree(dout);
  cudaFree(dp);
}

TEST_CASE("cuda parallel: the vocab-parallel cross-entropy gradient equals the host's to 4 ulps") {
  REQUIRE_MESSAGE(zerotk::cuda::device_usable(), "this test binary needs a usable CUDA device");
  const std::size_t n = 9, v = 32;
  const VocabRange range{32, 64};  // rank 1 of a vocabulary of 64 split 2 ways
  auto logits = values(n * v, 7);
  const std::vector<std::int32_t> targets{0, 33, 40, 63, 5, 32, 50, 1, 60};
  const auto max = values(n, 8), dloss = values(n, 9);
  std::vector<float> sum(n);
  for (std::size_t i = 0; i < n; ++i) sum[i] = 40.0f + static_cast<float>(i);
  std::vector<float> host(n * v);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < v; ++j) {
      const bool t = range.owns(targets[i]) && static_cast<std::int64_t>(j) == targets[i] - range.begin;
      host[i * v + j] = xent_grad(logits[i * v + j], max[i], sum[i], t, dloss[i]);
    }
  }
  float *dl = to_device(logits), *dm = to_device(max), *ds = to_device(sum), *dd = to_device(dloss), *dgrad = nullptr;
  std::int32_t* dt = to_device(targets);
  ZEROTK_CUDA_CHECK(cudaMalloc(&dgrad, host.size() * sizeof(float)));
  parallel::cuda::xent_grad(dl, dt, range, dm, ds, dd, dgrad, n);
  const auto dev = to_host(dgrad, host.size());
  for (std::size_t e = 0; e < host.size(); ++e) {
    CHECK(std::abs(dev[e] - host[e]) <= 4.0f * std::nextafter(std::abs(host[e]), 1e30f) - 4.0f * std::abs(host[e]) + 1e-12f);
  }
  for (void* p : {static_cast<void*>(dl), static_cast<void*>(dm), static_cast<void*>(ds), static_cast<void*>(dd),
                  static_cast<void*>(dgrad), static_cast<void*>(dt)}) {
    cudaFree(p);
  }
}
