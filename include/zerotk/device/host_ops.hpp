#pragma once
/// \file zerotk/device/host_ops.hpp
/// Ops<Host>: the engine's data operations on host memory (the OpenMP/SIMD kernels). The engine and
/// its parts keep every piece of bookkeeping on the host and touch parameter, gradient and optimizer
/// memory only through an Ops object, so each part is written once for every device.
///
/// An Ops provides:
///   Space, Buffer<T>                          where its memory lives, its storage
///   create(comm, stream)                      built by the Engine from its communicator
///   allocate<T>(n, category, ledger)          zero-initialised, recorded in the ledger under Space
///   zero, accumulate, cast                    elementwise work, ordered after the trainer's compute
///   square_bound(blocks), add_squares(blocks, grid)   the two phases of the reproducible norm
///   fence()                                   the communicator sees everything written so far
///                                             (device/ordered.hpp calls it inside every collective)
///   all_reduce(comm, host doubles, op)        small fp64 all-reduce of host values
///   step(opt, ...)                            one optimizer step, optim::Run<Opt, Space> (kernels by space)

#include <algorithm>
#include <cstddef>
#include <span>
#include <type_traits>
#include <utility>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/comm/detail/reduce.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/kernels/host/accumulate.hpp"
#include "zerotk/kernels/host/cast.hpp"
#include "zerotk/kernels/host/reduce.hpp"
#include "zerotk/kernels/tensor_list.hpp"
#include "zerotk/optim/run.hpp"
#include "zerotk/policies.hpp"

namespace zerotk::device {

template <class DeviceTag>
struct Ops {
  static_assert(!std::is_same_v<DeviceTag, HostAsync>,
                "Engine: Device<HostAsync> needs its Ops: #include \"zerotk/device/host_async_ops.hpp\" before "
                "instantiating this Engine (see docs/device.md)");
  static_assert(!std::is_same_v<DeviceTag, Cuda>,
                "Engine: Device<Cuda> needs the CUDA backend: instantiate this Engine in a .cu file compiled by nvcc "
                "and link zerotk::cuda (see docs/engine.md, Devices)");
  static_assert(std::is_same_v<DeviceTag, HostAsync> || std::is_same_v<DeviceTag, Cuda>,
                "Engine: this Device tag has no Ops: specialise zerotk::device::Ops<Tag> with the members "
                "device/concepts.hpp's EngineOps lists (device/host_ops.hpp's Ops<Host> is one to start from)");
};

template <>
class Ops<Host> {
 public:
  using Space = HostSpace;
  template <class T>
  using Buffer = TrackedBuffer<T>;
  template <class C>
  static Ops create(C&, void* /*stream: Device<Cuda> only*/) {
    return {};
  }

  template <class T>
  Buffer<T> allocate(std::size_t n, MemoryCategory category, MemoryLedger* ledger) {
    return Buffer<T>(n, category, ledger);
  }

  template <class T>
  void zero(T* p, std::size_t n) {
    std::fill_n(p, n, T{});
  }

  /// acc[i] = A(float(acc[i]) + float(x[i])) (kernels/host/accumulate.hpp).
  template <class A, class X>
  void accumulate(A* acc, const X* x, std::size_t n) {
    kernels::host::accumulate(acc, x, n);
  }

  template <class Src, class Dst>
  void cast(const Src* in, Dst* out, std::size_t n) {
    kernels::host::cast(in, out, n);
  }

  /// buf[i] = buf[i] / divisor for n elements of `dt`, in the accumulator type and rounded once
  /// (comm::detail::divide_in_place: an average after a sum, OrderedCommunicator::mean_over).
  void divide(void* buf, std::size_t n, DType dt, int divisor) { comm::detail::divide_in_place(buf, n, dt, divisor); }

  /// Phase 1 of the norm: the largest square and whether any element is inf/NaN, over all blocks.
  template <class T>
  kernels::SquareBound square_bound(std::span<const kernels::TensorRef<const T>> blocks) {
    return kernels::host::square_bound<T>(blocks);
  }

  /// Phase 2: the blocks' squares added into `sums` on the grid (exact, so any order is the same).
  template <class T>
  void add_squares(std::span<const kernels::TensorRef<const T>> blocks, const kernels::NormGrid& grid,
                   kernels::FoldSums& sums) {
    kernels::host::add_squares<T>(blocks, grid, sums);
  }

  void fence() noexcept {}

  /// Host memory this space copies to and from directly: nothing to register.
  void register_host(void*, std::size_t) const noexcept {}
  void unregister_host(void*) const noexcept {}

  /// Copies between this space and host memory (state snapshots).
  template <class T>
  void copy_to_host(const T* src, T* dst, std::size_t n) const {
    std::copy_n(src, n, dst);
  }
  template <class T>
  void copy_from_host(const T* src, T* dst, std::size_t n) const {
    std::copy_n(src, n, dst);
  }
  /// Within this space (a gathered bucket's block back into the stage-3 shard).
  template <class T>
  void copy(const T* src, T* dst, std::size_t n) {
    std::copy_n(src, n, dst);
  }

  /// out = op over ranks of in (n host doubles).
  template <class C>
  void all_reduce(C& c, const double* in, double* out, std::size_t n, comm::ReduceOp op) {
    c.all_reduce(in, out, n, DType::fp64, op).wait();
  }

  /// One fused optimizer step over this rank's partition (optim/run.hpp); `reduce(double* sums, n)`
  /// sums LAMB's per-tensor partials over ranks.
  template <class Opt, class G, class P, class Reduce>
  void step(Opt& opt, std::span<const kernels::Segment> segments, float* master, const optim::Moments& moments,
            const G* grads, P* out, float grad_scale, Reduce&& reduce) {
    optim::Run<Opt, Space>::template step<G, P>(opt, segments, master, moments, grads, out, grad_scale,
                                                [&](std::span<double> s) { reduce(s.data(), s.size()); });
  }
};

}  // namespace zerotk::device
