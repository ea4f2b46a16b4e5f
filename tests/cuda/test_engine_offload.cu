// Device<Cuda> with an optimizer offload (Offload<Cpu>, Offload<Nvme>) against the same GPU run without
// offload: the store steps on the host sub-group by sub-group through Ops<Cuda>'s copies, so the results
// must be bitwise those of Offload<None> on the GPU, with no master or moments left in device memory.
// Then the delayed update and stage 3's parameter shard offloaded, against the host engine.
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

TEST_CASE("Device<Cuda> with stage 3's parameter shard offloaded (OffloadParams<Cpu>, <Nvme>) equals the host engine") {
  // Proven on Device<HostAsync> (tests/device); this runs the same orchestration on a GPU
  // (scripts/gpu-run.sh): the shard in host memory, fetched by copies, written by the host step.
  gpu_count();
  const auto dir = std::filesystem::temp_directory_path() / ("zerotk_cuda_params_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  RunConfig cfg;
  cfg.steps = 12;
  cfg.gas = 2;
  cfg.sub_group_size = 97;
  cfg.take_state = true;
  cfg.poison_steps = {3, 4};
  cfg.stage3.param_persistence_threshold = 0;
  cfg.reload_after = 5;  // load_state: the master's values back into the host shard
  check_param_offload_gpu_equals_host<fp16, Offload<Cpu>, OffloadParams<Cpu>>(cfg);
  RunConfig delayed = cfg;  // the update on a host thread, persistent buckets regathered at publish
  delayed.poison_steps.clear();
  delayed.reload_after = -1;
  delayed.delayed_update = true;
  delayed.stage3.param_persistence_threshold = 16;
  check_param_offload_gpu_equals_host<bf16, Offload<Cpu>, OffloadParams<Cpu>>(delayed);
  cfg.param_nvme.path = dir.string();
  cfg.param_nvme.max_in_cpu = 64;  // the first blocks kept in host memory, the rest read from the file
  check_param_offload_gpu_equals_host<fp32, Offload<Cpu>, OffloadParams<Nvme>>(cfg);
  CHECK(std::filesystem::is_empty(dir));  // shard files removed with their engines
  std::filesystem::remove_all(dir);
}
