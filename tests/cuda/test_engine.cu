// Engine<..., Device<Cuda>> over NCCL against Engine<..., Device<Host>> over the threads
// communicator, on the MLP of tests/engine (engine_fixture.hpp).
//
// The layers compute on the host from copies of the device parameters and add their gradients back
// into the engine's device buffers (DeviceDense, tests/engine/device_mlp.hpp), so both engines see bit-identical gradients and
// every difference comes from the engine's own device path: buffers, bucket reductions, the fused
// optimizer, casts, accumulation folds. With one GPU the reductions are exact, the CUDA kernels share
// their per-element math with the host kernels, and so:
//  - fp32, fp16 (dynamic scaling, injected overflow steps) and bf16, stages 0/1/2, GAS 1 and 2: final
//    parameters, losses, scales and skip decisions are bitwise equal to the host engine's; the grad
//    norms agree to fp64 rounding (the GPU sums squares in another order);
//  - the same in emulated mode (float Params over bf16 storage: float compute copies on the GPU),
//    and with Optimizer<Lion> (the generic elementwise kernels, stages 2 and 3);
//  - with clipping, the clip factor inherits that rounding: parameters agree to 1e-6;
//  - per-GPU memory by category equals the host engine's ledger (the ZeRO formulas of tests/engine).
// With two or more GPUs (one thread each) NCCL sums in its own order: fp32 results agree with the
// host engine at the same world size to 1e-4 and every rank ends with the same parameters.
#include "engine_gpu_fixture.cuh"

namespace zt_cuda_test {

/// A model that visits its parameter twice (refused by every engine).
struct Twice {
  Param<float> p{"p", {4}};
  template <class V>
  void parameters(V&& visit) {
    visit(p.name(), p);
    visit(p.name(), p);
  }
};

}  // namespace zt_cuda_test

TEST_CASE("Device<Cuda> engine on one GPU equals the host engine bit for bit (fp32)") {
  gpu_count();
  RunConfig cfg;
  cfg.steps = 20;
  check_all_stages<fp32>(cfg);
  cfg.gas = 2;
  check_all_stages<fp32>(cfg);
}

TEST_CASE("Device<Cuda> engine on one GPU equals the host engine bit for bit (fp16, overflow steps)") {
  gpu_count();
  RunConfig cfg;
  cfg.steps = 20;
  cfg.poison_steps = {3, 4, 11};
  check_all_stages<fp16>(cfg);
  cfg.gas = 2;
  check_all_stages<fp16>(cfg);
}

TEST_CASE("Device<Cuda> engine on one GPU equals the host engine bit for bit (bf16)") {
  gpu_count();
  RunConfig cfg;
  cfg.steps = 20;
  check_all_stages<bf16>(cfg);
}

TEST_CASE("Device<Cuda> engine with Optimizer<Lion> (the generic elementwise kernels) equals the host engine") {
  gpu_count();
  RunConfig cfg;
  cfg.steps = 20;
  cfg.gas = 2;
  cfg.poison_steps = {5};
  check_one_gpu_equals_host<2, fp16, typename fp16::storage, Optimizer<Lion>>(cfg);
  RunConfig fetched = cfg;
  fetched.stage3.param_persistence_threshold = 0;
  check_one_gpu_equals_host<3, bf16, typename bf16::storage, Optimizer<Lion>>(fetched);
}

TEST_CASE("Device<Cuda> engine in emulated mode (float Params over bf16 storage) equals the host engine") {
  gpu_count();
  RunConfig cfg;
  cfg.steps = 20;
  cfg.gas = 2;
  check_one_gpu_equals_host<0, bf16, float>(cfg);
  check_one_gpu_equals_host<2, bf16, float>(cfg);
}

TEST_CASE("Device<Cuda> engine with clipping agrees with the host engine to the norm's rounding") {
  gpu_count();
  RunConfig cfg;
  cfg.steps = 20;
  cfg.clip = 0.05;  // active on most steps
  const RunResult g = train_gpu<2, fp32>(1, cfg);
  const RunResult h = train_host<2, fp32>(1, cfg);
  REQUIRE(g.params.size() == h.params.size());
  for (std::size_t i = 0; i < g.params.size(); ++i) CHECK(g.params[i] == doctest::Approx(h.params[i]).epsilon(1e-6));
  check_norms_close(g, h);
}

TEST_CASE("Device<Cuda> engine on every GPU (NCCL) agrees with the host engine at the same world size") {
  const int world = std::min(gpu_count(), 4);
  CAPTURE(world);
  RunConfig cfg;
  cfg.steps = 20;
  const RunResult h = train_host<0, fp32>(world, cfg);
  const RunResult g0 = train_gpu<0, fp32>(world, cfg);
  const RunResult g2 = train_gpu<2, fp32>(world, cfg);
  CHECK(g0.ranks_agree);
  CHECK(g2.ranks_agree);
  REQUIRE(g0.params.size() == h.params.size());
  for (std::size_t i = 0; i < h.params.size(); ++i) {
    CHECK(g0.params[i] == doctest::Approx(h.params[i]).epsilon(1e-4).scale(1.0));
    CHECK(g2.params[i] == doctest::Approx(h.params[i]).epsilon(1e-4).scale(1.0));
  }
}

TEST_CASE("Device<Cuda> engine refuses bad set-ups with the offending value") {
  const int n = gpu_count();
  comm::run_threads(1, [&](auto& boot) {
    ZEROTK_CUDA_CHECK(cudaSetDevice(0));
    auto gpu = comm::NcclCommunicator::bootstrap(boot, 0);
    using E = Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Device<Cuda>>;
    // A model whose parameter is visited twice, as on the host path.
    zt_cuda_test::Twice twice;
    CHECK_THROWS_WITH_AS((void)E(gpu, twice), doctest::Contains("visited twice"), usage_error);
    // The calling thread on another device than the communicator's (needs a second GPU).
    if (n >= 2) {
      ZEROTK_CUDA_CHECK(cudaSetDevice(1));
      GpuMlp<float> model(nullptr);
      CHECK_THROWS_WITH_AS((void)E(gpu, model), doctest::Contains("current CUDA device"), usage_error);
      ZEROTK_CUDA_CHECK(cudaSetDevice(0));
    } else {
      MESSAGE("one GPU: the current-device mismatch check needs a second GPU and was not exercised");
    }
  });
}
