#pragma once
/// \file zerotk/engine/host_backend.hpp
/// The Engine's data operations for `Device<Host>`: buffers in host memory, the OpenMP/SIMD kernels,
/// collectives straight on those buffers. The Engine does all its bookkeeping (buckets, partitions,
/// the boundary step) on the host and touches gradient, parameter and optimizer memory only through
/// a backend, so one Engine serves every device. The CUDA backend (engine/cuda_backend.cuh) has the
/// same members; see docs/engine.md ("Devices").
///
/// A backend provides:
///   create(comm, stream)                      built by the Engine from its communicator
///   Buffer<T>, optimizer_type<Opt>           storage and the optimizer that steps it
///   allocate<T>(n, category, ledger)          zero-initialised, recorded in the ledger
///   zero, accumulate, add_rounded, cast       elementwise work, ordered after the trainer's compute
///   sum_squares(blocks, out)                  fp64 sum of squares per block, results on the host
///   before_collective()                       the communicator sees everything written so far
///   all_reduce_sum(comm, host doubles)        small fp64 all-reduce of host values
///   init_optimizer / step                     the fused optimizer over this rank's partition

#include <algorithm>
#include <cstddef>
#include <span>
#include <utility>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/core/macros.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/kernels/host/cast.hpp"
#include "zerotk/kernels/tensor_list.hpp"
#include "zerotk/policies.hpp"
#include "zerotk/zero/norms.hpp"

namespace zerotk::backends {

class HostBackend {
 public:
  template <class C>
  static HostBackend create(C&, void* /*stream: Device<Cuda> only*/) {
    return {};
  }

  template <class T>
  using Buffer = TrackedBuffer<T>;
  template <class Opt>
  using optimizer_type = Opt;

  template <class T>
  Buffer<T> allocate(std::size_t n, MemoryCategory category, MemoryLedger* ledger) {
    return Buffer<T>(n, category, ledger);
  }

  template <class T>
  void zero(T* p, std::size_t n) {
    std::fill_n(p, n, T{});
  }

  /// acc[i] += float(x[i])
  template <class T>
  void accumulate(float* ZEROTK_RESTRICT acc, const T* ZEROTK_RESTRICT x, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) acc[i] += to_float(x[i]);
  }

  /// slot[i] = T(float(slot[i]) + g[i]): 16-bit gradient storage filled from float compute.
  template <class T>
  void add_rounded(T* ZEROTK_RESTRICT slot, const float* ZEROTK_RESTRICT g, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) slot[i] = from_float<T>(to_float(slot[i]) + g[i]);
  }

  template <class Src, class Dst>
  void cast(const Src* in, Dst* out, std::size_t n) {
    kernels::host::cast(in, out, n);
  }

  /// out[i] = sum of squares of blocks[i] (zero::sum_squares: depends only on the values).
  template <class T>
  void sum_squares(std::span<const kernels::TensorRef<const T>> blocks, std::span<double> out) {
    for (std::size_t i = 0; i < blocks.size(); ++i) out[i] = zero::sum_squares(blocks[i].data, blocks[i].numel);
  }

  void before_collective() noexcept {}

  /// out = sum over ranks of in (n host doubles).
  template <comm::Communicator C>
  void all_reduce_sum(C& c, const double* in, double* out, std::size_t n) {
    c.all_reduce(in, out, n, DType::fp64, comm::ReduceOp::sum).wait();
  }

  template <class Opt>
  void init_optimizer(Opt& opt, std::size_t numel, MemoryLedger* ledger) {
    opt.init_state(numel, ledger);
  }

  /// One fused optimizer step; `reduce(double* sums, n)` sums LAMB's per-tensor partials over ranks.
  template <class Opt, class G, class P, class Reduce>
  void step(Opt& opt, std::span<const kernels::Segment> segments, float* master, const G* grads, P* out,
            float grad_scale, Reduce&& reduce) {
    opt.step(segments, master, grads, out, grad_scale, [&](std::span<double> s) { reduce(s.data(), s.size()); });
  }
};

/// The backend of a Device tag. Device<Cuda>'s is defined by engine/cuda_backend.cuh, which
/// zerotk/engine.hpp includes when nvcc compiles it.
template <class DeviceTag>
struct select {
  static_assert(dependent_false<DeviceTag>,
                "Engine: Device<Cuda> needs the CUDA backend: instantiate this Engine in a .cu file compiled by nvcc "
                "and link zerotk::cuda (see docs/engine.md, Devices)");
};
template <>
struct select<Host> {
  using type = HostBackend;
};

}  // namespace zerotk::backends
