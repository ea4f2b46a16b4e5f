// Device<Cuda> with an optimizer offload (Offload<Cpu>, Offload<Nvme>) against the same GPU run without
// offload: the store steps on the host sub-group by sub-group through Ops<Cuda>'s copies, so the results
// must be bitwise those of Offload<None> on the GPU, with no master or moments left in device memory.
// Its own file so the CUDA build compiles it beside test_engine.cu.
#include "engine_gpu_fixture.cuh"

TEST_CASE("Device<Cuda> with Offload<Cpu> equals the same run without offload bit for bit (stages 1-3)") {
  gpu_count();
  RunConfig cfg;
  cfg.steps = 12;
  cfg.sub_group_size = 97;  // several sub-groups, not aligned to tensors
  check_offload_on_gpu<1, fp32, Offload<Cpu>>(cfg);
  check_offload_on_gpu<2, bf16, Offload<Cpu>>(cfg);
  cfg.poison_steps = {3, 4};
  check_offload_on_gpu<2, fp16, Offload<Cpu>>(cfg);
  RunConfig fetched = cfg;
  fetched.stage3.param_persistence_threshold = 0;
  check_offload_on_gpu<3, fp16, Offload<Cpu>>(fetched);
  fetched.gas = 2;
  fetched.clip = 0.5f;
  check_offload_on_gpu<3, fp32, Offload<Cpu>>(fetched);
}

TEST_CASE("Device<Cuda> with Offload<Nvme> equals the same run without offload bit for bit") {
  gpu_count();
  const auto dir = std::filesystem::temp_directory_path() / ("zerotk_cuda_nvme_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  RunConfig cfg;
  cfg.steps = 12;
  cfg.sub_group_size = 97;
  cfg.nvme.path = dir.string();
  check_offload_on_gpu<1, bf16, Offload<Nvme>>(cfg);
  cfg.poison_steps = {3, 4};
  RunConfig fetched = cfg;
  fetched.stage3.param_persistence_threshold = 0;
  check_offload_on_gpu<3, fp16, Offload<Nvme>>(fetched);
  fetched.nvme.pipeline_read = fetched.nvme.pipeline_write = true;
  check_offload_on_gpu<3, fp16, Offload<Nvme>>(fetched);
  CHECK(std::filesystem::is_empty(dir));  // swap files removed with their engines
  std::filesystem::remove_all(dir);
}

TEST_CASE("Device<Cuda> with Offload<Cpu> and the delayed parameter update equals the host engine bit for bit") {
  // Written against the same Ops as Device<HostAsync>, where tests/device proves it; this runs it on
  // a GPU (scripts/gpu-run.sh).
  gpu_count();
  RunConfig cfg;
  cfg.steps = 12;
  cfg.sub_group_size = 97;
  cfg.delayed_update = true;
  cfg.take_state = true;
  check_one_gpu_equals_host<2, bf16, typename bf16::storage, Offload<Cpu>>(cfg);
}
