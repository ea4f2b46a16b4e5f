#pragma once
// The GPU engine tests' fixture: the device-bound MLP (GpuMlp: device_mlp.hpp over CUDA copies),
// training on GPUs over NCCL (train_gpu) and on the host (train_host), and the comparisons the test
// files share (test_engine.cu, test_engine_offload.cu).
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <unistd.h>

#include "../engine/device_mlp.hpp"
#include "../engine/engine_fixture.hpp"
#include "zerotk/comm/nccl.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/core/cuda.hpp"
#include "zerotk/engine.hpp"

using namespace zerotk;
using namespace zt_test;

namespace {

/// The device of DeviceMlp (device_mlp.hpp): copies on the engine's compute stream.
struct CudaCopies {
  cudaStream_t stream;
  explicit CudaCopies(void* s) : stream(static_cast<cudaStream_t>(s)) {}
  void to_host(void* dst, const void* src, std::size_t bytes) {
    ZEROTK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
  }
  void to_device(void* dst, const void* src, std::size_t bytes) {
    ZEROTK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
  }
  void sync() { ZEROTK_CUDA_CHECK(cudaStreamSynchronize(stream)); }
};

/// The MLP over device parameters, computing on the host from copies (device_mlp.hpp).
template <class T>
using GpuMlp = DeviceMlp<T, CudaCopies>;

inline int gpu_count() {
  int n = 0;
  REQUIRE_MESSAGE(cudaGetDeviceCount(&n) == cudaSuccess, "this test binary needs a usable CUDA device");
  REQUIRE(n >= 1);
  return n;
}

/// Trains on `world` GPUs (one thread each, NCCL bootstrapped through the threads communicator).
template <int Stage, class Prec, class T = typename Prec::storage, class... Extra>
RunResult train_gpu(int world, RunConfig cfg, MemoryLedger* ledger = nullptr) {
  cfg.world = world;
  RunResult result;
  std::vector<std::vector<float>> finals(static_cast<std::size_t>(world));
  std::mutex mu;
  comm::run_threads(world, [&](auto& boot) {
    ZEROTK_CUDA_CHECK(cudaSetDevice(boot.rank()));
    cudaStream_t stream = nullptr;
    ZEROTK_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    RunResult mine;
    {
      auto gpu = comm::NcclCommunicator::bootstrap(boot, boot.rank());
      RunConfig c = cfg;
      c.stream = stream;
      mine = train_rank<Stage, Prec, comm::NcclCommunicator, GpuMlp<T>, Device<Cuda>, Extra...>(
          gpu, c, boot.rank() == 0 ? ledger : nullptr);
    }
    ZEROTK_CUDA_CHECK(cudaStreamDestroy(stream));
    std::lock_guard lock(mu);
    finals[static_cast<std::size_t>(boot.rank())] = mine.params;
    if (boot.rank() == 0) result = std::move(mine);
  });
  for (const auto& f : finals) result.ranks_agree = result.ranks_agree && f == finals[0];
  return result;
}

template <int Stage, class Prec, class T = typename Prec::storage, class... Extra>
RunResult train_host(int world, RunConfig cfg, MemoryLedger* ledger = nullptr) {
  cfg.world = world;
  RunResult result;
  comm::run_threads(world, [&](auto& c) {
    RunResult mine =
        train_rank<Stage, Prec, comm::ThreadsCommunicator, Mlp<T>, Extra...>(c, cfg, c.rank() == 0 ? ledger : nullptr);
    if (c.rank() == 0) result = std::move(mine);
  });
  return result;
}

inline void check_norms_close(const RunResult& a, const RunResult& b) {
  REQUIRE(a.norms.size() == b.norms.size());
  for (std::size_t i = 0; i < a.norms.size(); ++i) {
    CAPTURE(i);
    if (b.norms[i] < 0) {
      CHECK(a.norms[i] == b.norms[i]);  // both skipped
    } else {
      CHECK(a.norms[i] == doctest::Approx(b.norms[i]).epsilon(1e-12));
    }
  }
}

/// Extra: further policies of both engines (e.g. Optimizer<Lion> instead of AdamW).
template <int Stage, class Prec, class T = typename Prec::storage, class... Extra>
void check_one_gpu_equals_host(const RunConfig& cfg) {
  CAPTURE(Stage);
  CAPTURE(cfg.gas);
  CAPTURE(cfg.poison_steps.size());
  MemoryLedger gpu_mem, host_mem;
  const RunResult g = train_gpu<Stage, Prec, T, Extra...>(1, cfg, &gpu_mem);
  const RunResult h = train_host<Stage, Prec, T, Extra...>(1, cfg, &host_mem);
  CHECK(g.initial == h.initial);
  CHECK(g.params == h.params);  // bitwise
  CHECK(g.losses == h.losses);
  CHECK(g.scales == h.scales);
  CHECK(g.skipped == h.skipped);
  CHECK(g.state == h.state);  // with RunConfig::take_state: the master and moments
  check_norms_close(g, h);
  CHECK(g.params != g.initial);  // it trained
  for (std::size_t c = 0; c < kMemoryCategoryCount; ++c) {
    const auto cat = static_cast<MemoryCategory>(c);
    CAPTURE(to_string(cat));
    CHECK(gpu_mem.live(cat) == host_mem.live(cat));
  }
}

template <class Prec>
void check_all_stages(const RunConfig& cfg) {
  check_one_gpu_equals_host<0, Prec>(cfg);
  check_one_gpu_equals_host<1, Prec>(cfg);
  check_one_gpu_equals_host<2, Prec>(cfg);
  RunConfig fetched = cfg;  // stage 3 fetching every parameter
  fetched.stage3.param_persistence_threshold = 0;
  check_one_gpu_equals_host<3, Prec>(fetched);
}

/// Stage 3 with its parameter shard offloaded (Extra: Offload<Cpu|Nvme>, OffloadParams<Cpu|Nvme>) on one
/// GPU against the host engine with the same policies: bitwise, and neither the shard nor the master in
/// device memory.
template <class Prec, class... Extra>
void check_param_offload_gpu_equals_host(const RunConfig& cfg) {
  CAPTURE(cfg.poison_steps.size());
  MemoryLedger gpu_mem;
  const RunResult g = train_gpu<3, Prec, typename Prec::storage, Extra...>(1, cfg, &gpu_mem);
  const RunResult h = train_host<3, Prec, typename Prec::storage, Extra...>(1, cfg);
  CHECK(g.initial == h.initial);
  CHECK(g.params == h.params);  // bitwise
  CHECK(g.losses == h.losses);
  CHECK(g.scales == h.scales);
  CHECK(g.skipped == h.skipped);
  CHECK(g.state == h.state);
  check_norms_close(g, h);
  CHECK(g.params != g.initial);  // it trained
  CHECK(gpu_mem.live(MemorySpace::device, MemoryCategory::params16) == 0);
  CHECK(gpu_mem.live(MemorySpace::device, MemoryCategory::master32) == 0);
  CHECK(gpu_mem.live(MemorySpace::device, MemoryCategory::gathered) > 0);
}

/// Device<Cuda> with an optimizer offload (Extra: Offload<Cpu> or Offload<Nvme>) against the same run
/// without: bitwise, and the master and moments are out of device memory.
template <int Stage, class Prec, class... Extra>
void check_offload_on_gpu(RunConfig cfg) {
  CAPTURE(Stage);
  CAPTURE(cfg.sub_group_size);
  MemoryLedger plain_mem, off_mem;
  const RunResult plain = train_gpu<Stage, Prec>(1, cfg, &plain_mem);
  const RunResult off = train_gpu<Stage, Prec, typename Prec::storage, Extra...>(1, cfg, &off_mem);
  CHECK(off.initial == plain.initial);
  CHECK(off.params == plain.params);  // bitwise
  CHECK(off.losses == plain.losses);
  CHECK(off.scales == plain.scales);
  CHECK(off.skipped == plain.skipped);
  CHECK(off.norms == plain.norms);
  CHECK(off.params != off.initial);  // it trained
  CHECK(plain_mem.live(MemorySpace::device, MemoryCategory::master32) > 0);
  CHECK(off_mem.live(MemorySpace::device, MemoryCategory::master32) == 0);
  CHECK(off_mem.live(MemorySpace::device, MemoryCategory::optimizer_state) == 0);
}

}  // namespace
