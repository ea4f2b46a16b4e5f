#pragma once
// The GPU engine tests' fixture: the device-bound MLP (GpuDense, GpuMlp), training on GPUs over NCCL
// (train_gpu) and on the host (train_host), and the comparisons the test files share
// (test_engine.cu, test_engine_offload.cu).
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <unistd.h>

#include "../engine/engine_fixture.hpp"
#include "zerotk/comm/nccl.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/core/cuda.hpp"
#include "zerotk/engine.hpp"

using namespace zerotk;
using namespace zt_test;

namespace {

/// A Dense layer whose Params the engine binds to device memory. forward/backward copy the device
/// values into a host Dense<T>, run it, and add its gradients into the device gradient storage,
/// all ordered on the engine's compute stream.
template <class T>
struct GpuDense {
  using input_type = std::vector<float>;
  using output_type = std::vector<float>;
  Dense<T> host;
  Param<T> w, b;
  std::vector<T> values, grads;  // host storage of host.w, host.b
  cudaStream_t stream;
  bool poison_next_backward = false;

  GpuDense(const Dense<T>& shape, cudaStream_t s)
      : host(shape.w.name().substr(0, shape.w.name().find('.')), shape.in, shape.out, shape.relu),
        w(host.w.name(), {host.w.dim(0), host.w.dim(1)}),
        b(host.b.name(), {host.b.dim(0)}),
        values(host.w.numel() + host.b.numel()),
        grads(values.size()),
        stream(s) {}

  void bind_host() {
    host.w.bind(values.data(), grads.data());
    host.b.bind(values.data() + host.w.numel(), grads.data() + host.w.numel());
  }

  template <class V>
  void parameters(V&& visit) {
    visit(w.name(), w);
    visit(b.name(), b);
  }

  void copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
    ZEROTK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream));
  }

  output_type forward(const input_type& x) {
    bind_host();
    copy(values.data(), w.data(), w.numel() * sizeof(T), cudaMemcpyDeviceToHost);
    copy(values.data() + w.numel(), b.data(), b.numel() * sizeof(T), cudaMemcpyDeviceToHost);
    ZEROTK_CUDA_CHECK(cudaStreamSynchronize(stream));
    return host.forward(x);
  }

  input_type backward(const output_type& dy) {
    bind_host();
    copy(grads.data(), w.grad(), w.numel() * sizeof(T), cudaMemcpyDeviceToHost);
    copy(grads.data() + w.numel(), b.grad(), b.numel() * sizeof(T), cudaMemcpyDeviceToHost);
    ZEROTK_CUDA_CHECK(cudaStreamSynchronize(stream));
    host.poison_next_backward = std::exchange(poison_next_backward, false);
    input_type dx = host.backward(dy);
    copy(w.grad(), grads.data(), w.numel() * sizeof(T), cudaMemcpyHostToDevice);
    copy(b.grad(), grads.data() + w.numel(), b.numel() * sizeof(T), cudaMemcpyHostToDevice);
    ZEROTK_CUDA_CHECK(cudaStreamSynchronize(stream));
    return dx;
  }
};

/// Mlp's interface (layers, parameters, init, values) over device parameters.
template <class T>
struct GpuMlp {
  std::vector<GpuDense<T>> layers;
  cudaStream_t stream;

  explicit GpuMlp(void* s) : stream(static_cast<cudaStream_t>(s)) {
    const Mlp<T> shape;
    layers.reserve(shape.layers.size());
    for (const auto& l : shape.layers) layers.emplace_back(l, stream);
  }
  template <class V>
  void parameters(V&& visit) {
    for (auto& l : layers) l.parameters(visit);
  }
  /// Mlp::init's values (same seed, same rounding), copied into the bound device parameters.
  void init(std::uint32_t seed) {
    Mlp<T> ref;
    std::vector<T> storage(4096), unused(4096);
    std::size_t off = 0;
    ref.parameters([&](std::string_view, auto& p) {
      p.bind(storage.data() + off, unused.data() + off);
      off += p.numel();
    });
    ref.init(seed);
    off = 0;
    parameters([&](std::string_view, Param<T>& p) {
      ZEROTK_CUDA_CHECK(cudaMemcpyAsync(p.data(), storage.data() + off, p.numel() * sizeof(T), cudaMemcpyHostToDevice, stream));
      off += p.numel();
    });
    ZEROTK_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  std::vector<float> values() {
    std::vector<float> v;
    parameters([&](std::string_view, Param<T>& p) {
      std::vector<T> h(p.numel());
      ZEROTK_CUDA_CHECK(cudaMemcpyAsync(h.data(), p.data(), h.size() * sizeof(T), cudaMemcpyDeviceToHost, stream));
      ZEROTK_CUDA_CHECK(cudaStreamSynchronize(stream));
      for (const T& x : h) v.push_back(to_float(x));
    });
    return v;
  }
};

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
