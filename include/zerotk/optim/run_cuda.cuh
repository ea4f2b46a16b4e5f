#pragma once
/// \file zerotk/optim/run_cuda.cuh
/// `optim::Run<Opt, CudaSpace>`: the CUDA kernels (kernels/cuda/) that step an optimizer whose fp32
/// master, moments and gradients live in device memory (nvcc only). Groups, validation, step constants
/// and the step count are the optimizer's, as on the host (optim/run.hpp); the per-element math is
/// shared with the host kernels, so Adam steps are bit-identical to the host's and LAMB's agree to one
/// rounding of the trust ratio. An optimizer without CUDA kernels is a compile error (run.hpp's
/// primary template), so a new optimizer can never silently run Adam's kernels on the GPU.
///
///   Run<Opt, CudaSpace>::step(opt, segments, d_master, d_moments, d_grads, d_params16, 1.0f / scale,
///                             reduce, stream, workspace);
///
/// Kernels are queued on `stream`; nothing waits for them here except LAMB's reducer, which runs
/// between its two phases: `reduce(double* device_sums, n)`, ordered after the work queued on `stream`.

#include <cstddef>
#include <span>
#include <type_traits>
#include <vector>

#include <cuda_runtime.h>

#include "zerotk/core/cuda_memory.hpp"
#include "zerotk/kernels/cuda/adam.cuh"
#include "zerotk/kernels/cuda/elementwise_step.cuh"
#include "zerotk/kernels/cuda/lamb.cuh"
#include "zerotk/kernels/cuda/multi_tensor.cuh"
#include "zerotk/optim/run.hpp"

namespace zerotk::optim {

/// Reduces LAMB's per-tensor partial sums over ranks: (device doubles, count).
template <class F>
concept DeviceSumReducer = std::invocable<F&, double*, std::size_t>;

/// Adam and AdamW on device memory: one multi-tensor launch over the segments.
template <class Tag>
  requires std::is_same_v<Tag, Adam> || std::is_same_v<Tag, AdamW>
struct Run<Optimizer<Tag>, CudaSpace> {
  template <FloatingElement G, class P, DeviceSumReducer ReduceFn>
  static void step(Optimizer<Tag>& opt, std::span<const Segment> segments, float* master, const Moments& st,
                   const G* grads, P* param_out, float grad_scale, ReduceFn&& /*reduce: Adam needs no sums*/,
                   cudaStream_t stream, kernels::cuda::Workspace& ws) {
    opt.check_step(segments, master, st, grads);
    const std::vector<kernels::AdamStepConsts> consts = opt.step_consts();
    opt.advance();
    kernels::cuda::fused_adam<G, P>(segments, std::span<const kernels::AdamStepConsts>(consts), master, st.m, st.v,
                                    grads, param_out, grad_scale, ws, stream);
  }
};

/// Any elementwise optimizer on device memory: its rule through the generic multi-tensor kernel
/// (kernels/cuda/elementwise_step.cuh), the same bits as on the host.
template <ElementwiseOptimizer Opt>
struct Run<Opt, CudaSpace> {
  using Rule = typename Opt::rule;
  template <FloatingElement G, class P, DeviceSumReducer ReduceFn>
  static void step(Opt& opt, std::span<const Segment> segments, float* master, const Moments& st, const G* grads,
                   P* param_out, float grad_scale, ReduceFn&& /*reduce: elementwise, no sums*/, cudaStream_t stream,
                   kernels::cuda::Workspace& ws) {
    opt.check_step(segments, master, st, grads);
    const std::vector<typename Rule::Consts> consts = opt.step_consts();
    opt.advance();
    kernels::cuda::elementwise_step<Rule, G, P>(segments, std::span<const typename Rule::Consts>(consts), master, st.m,
                                                st.v, grads, param_out, grad_scale, ws, stream);
  }
};

/// LAMB on device memory: phase 1, the reducer on the device sums, phase 2 (kernels::cuda::fused_lamb).
template <>
struct Run<Optimizer<Lamb>, CudaSpace> {
  template <FloatingElement G, class P, DeviceSumReducer ReduceFn>
  static void step(Optimizer<Lamb>& opt, std::span<const Segment> segments, float* master, const Moments& st,
                   const G* grads, P* param_out, float grad_scale, ReduceFn&& reduce, cudaStream_t stream,
                   kernels::cuda::Workspace& ws) {
    const std::size_t tensors = opt.check_step(segments, master, st, grads);
    const std::vector<kernels::LambStepConsts> consts = opt.step_consts();
    opt.advance();
    std::vector<kernels::cuda::LambTensor<G, P>> items;
    items.reserve(segments.size());
    for (const Segment& s : segments) {
      P* out = nullptr;
      if constexpr (!std::is_void_v<P>) out = param_out ? param_out + s.out_at() : nullptr;
      items.push_back({master + s.offset, st.m + s.offset, st.v + s.offset, grads + s.grad_at(), out, s.numel, s.group,
                       s.tensor});
    }
    kernels::cuda::fused_lamb<G, P>(std::span<const kernels::cuda::LambTensor<G, P>>(items),
                                    std::span<const kernels::LambStepConsts>(consts), grad_scale, tensors, ws, stream,
                                    [&](double* sums, std::size_t n, cudaStream_t) { reduce(sums, n); });
  }
};

}  // namespace zerotk::optim
