#pragma once
/// \file zerotk/optim/device.cuh
/// DeviceOptimizer<Opt>: `Optimizer<Adam>`, `Optimizer<AdamW>` or `Optimizer<Lamb>` with its state
/// (m, v) in device memory, stepped by the CUDA kernels (kernels/cuda/). Groups, validation, step
/// constants and the step count are the host optimizer's; the per-element math is shared with the
/// host kernels, so Adam steps are bit-identical to the host's and LAMB's agree to one rounding of
/// the trust ratio. The Engine's CUDA backend uses it; it also works alone (nvcc):
///
///   zerotk::optim::DeviceOptimizer<zerotk::Optimizer<zerotk::AdamW>> opt({zerotk::ParamGroup{{.lr = 1e-3}}});
///   opt.init_state(n, &ledger);                                   // device m, v (zeros)
///   opt.step(segments, d_master, d_grads, d_params16, 1.0f / scale, no_reduce, stream, workspace);

#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <cuda_runtime.h>

#include "zerotk/core/cuda.hpp"
#include "zerotk/core/cuda_memory.hpp"
#include "zerotk/kernels/cuda/adam.cuh"
#include "zerotk/kernels/cuda/lamb.cuh"
#include "zerotk/kernels/cuda/multi_tensor.cuh"
#include "zerotk/optim/optimizer.hpp"

namespace zerotk::optim {

/// Reduces LAMB's per-tensor partial sums over ranks: (device doubles, count), ordered after the
/// work queued on the stream the optimizer steps on. Adam never calls it.
template <class F>
concept DeviceSumReducer = std::invocable<F&, double*, std::size_t>;

template <class Opt>
class DeviceOptimizer : public Opt {
  using Base = Opt;

 public:
  using policy_kind = typename Opt::policy_kind;
  using tag = typename Opt::tag;
  using Base::Base;

  /// Allocates device m and v (zeros) for `partition_numel` fp32 elements (ledger: optimizer_state)
  /// and resets the step count.
  void init_state(std::size_t partition_numel, MemoryLedger* ledger = nullptr) {
    dm_ = TrackedDeviceBuffer<float>(partition_numel, MemoryCategory::optimizer_state, ledger);
    dv_ = TrackedDeviceBuffer<float>(partition_numel, MemoryCategory::optimizer_state, ledger);
    this->numel_ = partition_numel;
    this->step_ = 0;
    this->initialized_ = true;
  }

  /// One fused step over this rank's partition (device pointers; the contract of the host
  /// optimizer's step). Kernels are queued on `stream`; nothing waits for them here except LAMB's
  /// reducer, which runs between its two phases.
  template <FloatingElement G, class P, DeviceSumReducer ReduceFn>
  void step(std::span<const Segment> segments, float* master, const G* grads, P* param_out, float grad_scale,
            ReduceFn&& reduce_tensor_sums, cudaStream_t stream, kernels::cuda::Workspace& ws) {
    std::size_t tensors = this->check_step(segments, master, grads);
    const auto consts = this->step_consts();
    ++this->step_;
    if constexpr (std::is_same_v<tag, Lamb>) {
      if (this->tensor_count_ > tensors) tensors = this->tensor_count_;
      std::vector<kernels::cuda::LambTensor<G, P>> items;
      items.reserve(segments.size());
      for (const Segment& s : segments) {
        P* out = nullptr;
        if constexpr (!std::is_void_v<P>) out = param_out ? param_out + s.out_at() : nullptr;
        items.push_back({master + s.offset, dm_.data() + s.offset, dv_.data() + s.offset, grads + s.grad_at(), out,
                         s.numel, s.group, s.tensor});
      }
      kernels::cuda::fused_lamb<G, P>(std::span<const kernels::cuda::LambTensor<G, P>>(items),
                                      std::span<const kernels::LambStepConsts>(consts), grad_scale, tensors, ws, stream,
                                      [&](double* sums, std::size_t n, cudaStream_t) { reduce_tensor_sums(sums, n); });
    } else if constexpr (std::is_same_v<tag, Adam> || std::is_same_v<tag, AdamW>) {
      (void)tensors;
      kernels::cuda::fused_adam<G, P>(segments, std::span<const kernels::AdamStepConsts>(consts), master, dm_.data(),
                                      dv_.data(), grads, param_out, grad_scale, ws, stream);
    } else {
      static_assert(dependent_false<tag>,
                    "Device<Cuda>: this optimizer has no CUDA kernels (kernels/cuda/ has Adam, AdamW and Lamb); add "
                    "them, or train it with Device<Host>");
    }
  }

  /// The moments, [partition_numel] fp32 each, in device memory.
  std::span<float> device_exp_avg() noexcept { return {dm_.data(), dm_.size()}; }
  std::span<float> device_exp_avg_sq() noexcept { return {dv_.data(), dv_.size()}; }

  /// The exact state, copied to the host (synchronizes the device).
  OptimizerState state() const {
    OptimizerState s{this->step_, std::vector<float>(dm_.size()), std::vector<float>(dv_.size())};
    ZEROTK_CUDA_CHECK(cudaDeviceSynchronize());
    ZEROTK_CUDA_CHECK(cudaMemcpy(s.m.data(), dm_.data(), dm_.bytes(), cudaMemcpyDeviceToHost));
    ZEROTK_CUDA_CHECK(cudaMemcpy(s.v.data(), dv_.data(), dv_.bytes(), cudaMemcpyDeviceToHost));
    return s;
  }
  /// Restores a state taken from an optimizer over a partition of the same size (bit-exact).
  void load_state(const OptimizerState& s) {
    this->require_state("load_state");
    if (s.m.size() != this->numel_ || s.v.size() != this->numel_ || s.step < 0) {
      throw usage_error("optimizer state is for a partition of another size (or has a negative step)",
                        "DeviceOptimizer::load_state",
                        "m " + std::to_string(s.m.size()) + ", v " + std::to_string(s.v.size()) + ", step " +
                            std::to_string(s.step) + " for " + std::to_string(this->numel_) + " elements");
    }
    ZEROTK_CUDA_CHECK(cudaMemcpy(dm_.data(), s.m.data(), dm_.bytes(), cudaMemcpyHostToDevice));
    ZEROTK_CUDA_CHECK(cudaMemcpy(dv_.data(), s.v.data(), dv_.bytes(), cudaMemcpyHostToDevice));
    this->step_ = s.step;
  }

  // The host optimizer's host-memory views do not apply here.
  std::span<float> exp_avg() = delete;
  std::span<float> exp_avg_sq() = delete;

 private:
  TrackedDeviceBuffer<float> dm_, dv_;
};

}  // namespace zerotk::optim
