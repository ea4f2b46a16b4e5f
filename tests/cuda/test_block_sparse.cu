// Block-sparse attention on the GPU (context/cuda/block_sparse.cuh) against the host operator
// (context/block_sparse.hpp), which shares its per-row definitions: forward (o, lse) and backward
// (dq, dk, dv) for a unidirectional Fixed and a BigBird layout, whole and over named key blocks (a
// mask-aware ring step), equal to within a few ulp (the device's expf and logf against the host's).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "zerotk/context/block_sparse.hpp"
#include "zerotk/context/cuda/block_sparse.cuh"
#include "zerotk/context/sparsity.hpp"
#include "zerotk/core/cuda.hpp"
#include "device_copies.cuh"

using namespace zerotk;

namespace {

using zt_cuda_test::to_device;
using zt_cuda_test::to_host;

std::vector<float> random_values(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

void near(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i])) {
      CHECK(got[i] == want[i]);
    } else {
      CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5).scale(1e-4));
    }
  }
}

void gpu_equals_host(const context::SparsityConfig& cfg, bool causal, std::vector<int> key_blocks) {
  const std::size_t N = 128, d = 8, H = static_cast<std::size_t>(cfg.heads);
  const context::BlockLayout layout = context::make_layout(cfg, N);
  const context::BlockSparseAttention attn{.layout = &layout, .head_dim = d, .causal = causal};
  const std::size_t B = static_cast<std::size_t>(cfg.block), nq = N, nk = key_blocks.empty() ? N : key_blocks.size() * B;
  const auto q = random_values(nq * H * d, 1), k = random_values(nk * H * d, 2), v = random_values(nk * H * d, 3),
             d_o = random_values(nq * H * d, 4);
  const context::AttentionWindow w{.key_blocks = key_blocks};
  std::vector<float> o(nq * H * d), lse(nq * H), dq(q.size(), 0.f), dk(k.size(), 0.f), dv(v.size(), 0.f);
  attn.forward(q, k, v, o, lse, w);
  attn.backward(q, k, v, o, lse, d_o, dq, dk, dv, w);

  std::vector<std::uint8_t> mask(layout.mask_data().begin(), layout.mask_data().end());
  std::uint8_t* mask_d = to_device(mask);
  int* blocks_d = to_device(key_blocks);
  context::rows::MaskView m = attn.mask();
  m.mask = mask_d;
  context::rows::Rows r = attn.shape(q.size(), k.size(), v.size(), o.size(), lse.size(), w, "forward");
  r.key_blocks = key_blocks.empty() ? nullptr : blocks_d;
  float *q_d = to_device(q), *k_d = to_device(k), *v_d = to_device(v), *do_d = to_device(d_o);
  float *o_d = to_device(std::vector<float>(o.size())), *lse_d = to_device(std::vector<float>(lse.size()));
  float *dq_d = to_device(std::vector<float>(q.size(), 0.f)), *dk_d = to_device(std::vector<float>(k.size(), 0.f)),
        *dv_d = to_device(std::vector<float>(v.size(), 0.f));
  context::cuda::forward(m, r, q_d, k_d, v_d, o_d, lse_d, nullptr);
  context::cuda::backward(m, r, q_d, k_d, v_d, o_d, lse_d, do_d, dq_d, dk_d, dv_d, nullptr);
  ZEROTK_CUDA_CHECK(cudaDeviceSynchronize());
  near(to_host(o_d, o.size()), o, "o");
  near(to_host(lse_d, lse.size()), lse, "lse");
  near(to_host(dq_d, dq.size()), dq, "dq");
  near(to_host(dk_d, dk.size()), dk, "dk");
  near(to_host(dv_d, dv.size()), dv, "dv");
  for (void* p : {static_cast<void*>(mask_d), static_cast<void*>(blocks_d), static_cast<void*>(q_d), static_cast<void*>(k_d),
                  static_cast<void*>(v_d), static_cast<void*>(do_d), static_cast<void*>(o_d), static_cast<void*>(lse_d),
                  static_cast<void*>(dq_d), static_cast<void*>(dk_d), static_cast<void*>(dv_d)}) {
    ZEROTK_CUDA_CHECK(cudaFree(p));
  }
}

}  // namespace

TEST_CASE("block-sparse attention on the GPU equals the host operator (forward and backward)") {
  using context::SparsityMode;
  gpu_equals_host({.mode = SparsityMode::fixed, .heads = 2, .block = 16, .unidirectional = true}, true, {});
  gpu_equals_host({.mode = SparsityMode::bigbird, .heads = 3, .block = 16, .different_layout_per_head = true,
                   .num_random_blocks = 1, .seed = 7},
                  false, {});
  gpu_equals_host({.mode = SparsityMode::bigbird, .heads = 2, .block = 16, .num_random_blocks = 1, .seed = 3}, false, {1, 4, 6});
}
